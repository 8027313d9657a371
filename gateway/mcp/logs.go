package mcp

import (
	"context"
	portfwd "github.com/IniZio/nexus/pkg/api/portfwd"
	"strconv"
	"unicode/utf8"

	mcpgo "github.com/mark3labs/mcp-go/mcp"

	api "github.com/IniZio/nexus/pkg/api/gateway"
	"github.com/IniZio/nexus/pkg/errdefs"
)

// LogChunk is the most sandbox_logs returns per call.
const LogChunk = 64 << 10

type logsArgs struct {
	Name     string `json:"name"`
	Cursor   string `json:"cursor"`
	MaxBytes int    `json:"max_bytes"`
}

// LogsResult is a chunk of console log and the cursor to continue from. An empty data with
// the same cursor means nothing new yet: call again later to follow the log.
type LogsResult struct {
	Data       string `json:"data"`
	NextCursor string `json:"next_cursor"`
}

func (s *Server) sandboxLogs(ctx context.Context, req mcpgo.CallToolRequest) (any, error) {
	var a logsArgs
	if err := bind(req, &a); err != nil {
		return nil, err
	}
	if a.Name == "" {
		return nil, errdefs.Invalid("name is required")
	}
	var off int64
	if a.Cursor != "" {
		var err error
		if off, err = strconv.ParseInt(a.Cursor, 10, 64); err != nil || off < 0 {
			return nil, errdefs.Invalid("invalid cursor %q: pass the next_cursor of the previous sandbox_logs call", a.Cursor)
		}
	}
	max := a.MaxBytes
	if max <= 0 || max > LogChunk {
		max = LogChunk
	}
	c, err := s.client(ctx)
	if err != nil {
		return nil, err
	}
	resp, err := c.Logs(ctx, api.LogsRequest{Name: a.Name, Offset: off, Max: max})
	if err != nil {
		return nil, err
	}
	data := resp.Data
	next := resp.NextOffset
	// Do not split a UTF-8 sequence between two calls: leave a partial one for the next.
	if n := partialTail(data); n > 0 && n < len(data) {
		data = data[:len(data)-n]
		next -= int64(n)
	}
	return LogsResult{Data: string(data), NextCursor: strconv.FormatInt(next, 10)}, nil
}

// partialTail is the length of an incomplete UTF-8 sequence at the end of b (0 if none).
func partialTail(b []byte) int {
	for i := 1; i <= utf8.UTFMax && i <= len(b); i++ {
		if utf8.RuneStart(b[len(b)-i]) {
			if utf8.FullRune(b[len(b)-i:]) {
				return 0
			}
			return i
		}
	}
	return 0
}

// PortsResult lists a sandbox's forwarded ports: guest listener → 127.0.0.1:<same port>.
type PortsResult struct {
	Sandbox string            `json:"sandbox"`
	Ports   []portfwd.Forward `json:"ports"`
}

// sandboxPorts reports the sandbox's forwarded ports, conflicts included.
func (s *Server) sandboxPorts(ctx context.Context, req mcpgo.CallToolRequest) (any, error) {
	var a nameArgs
	if err := bind(req, &a); err != nil {
		return nil, err
	}
	if a.Name == "" {
		return nil, errdefs.Invalid("name is required")
	}
	c, err := s.client(ctx)
	if err != nil {
		return nil, err
	}
	sb, err := c.Get(ctx, a.Name)
	if err != nil {
		return nil, err
	}
	if sb.NoPortForward {
		return nil, errdefs.Conflict("sandbox %s was created with port forwarding off", sb.Name)
	}
	fwds, err := c.Ports(ctx, sb.Name)
	if err != nil {
		return nil, err
	}
	if fwds == nil {
		fwds = []portfwd.Forward{}
	}
	return PortsResult{Sandbox: sb.Name, Ports: fwds}, nil
}
