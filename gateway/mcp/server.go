// Package mcp is nexus's MCP server (`nexus mcp`): the sandbox lifecycle, exec, logs, ports,
// egress audit and worktree delegation as MCP tools over stdio (mark3labs/mcp-go).
//
// Like the CLI it is a thin client of the gateway's bus API (pkg/api/gateway), connected as the
// bus user cli; it never reaches a service directly. Tool failures are MCP tool errors (a result
// with isError set and a one-line message), never a protocol failure, so an agent can read
// them and act. Stdout carries only the protocol; logs go to the injected logger (stderr).
package mcp

import (
	"bufio"
	"context"
	"errors"
	"io"
	"log"
	"strings"
	"sync"
	"time"

	mcpgo "github.com/mark3labs/mcp-go/mcp"
	"github.com/mark3labs/mcp-go/server"
	"github.com/nats-io/nats.go"
	"github.com/rs/zerolog"

	api "github.com/IniZio/nexus/pkg/api/gateway"
	"github.com/IniZio/nexus/pkg/errdefs"
)

// Config configures the MCP server.
type Config struct {
	// Dial connects to the bus as user cli. It is called lazily, on the first tool call that
	// needs the gateway, and again after a connection is lost, so `nexus mcp` starts (and
	// lists its tools) even when the stack is not up yet.
	Dial func(ctx context.Context) (*nats.Conn, error)
	Log  zerolog.Logger
	// Version is reported to clients in the initialize handshake.
	Version string
	// Authorize, when set, is asked before every tool call (the HTTP API checks the caller's
	// token scope); its error is the tool's error.
	Authorize func(ctx context.Context, tool string, req mcpgo.CallToolRequest) error
	// AdjustCreate, when set, may change every create a tool sends (the HTTP API sets
	// NoStoredSecrets for a caller below admin).
	AdjustCreate func(ctx context.Context, r *api.CreateRequest)
	// ValidateOutput checks each structured result against its tool's outputSchema (a result
	// that does not match becomes a tool error); tests set it.
	ValidateOutput bool
}

// instructions are what the server tells a client in the initialize handshake.
const instructions = "nexus runs each task in its own Linux microVM with default-deny egress. " +
	"Use sandbox_run for one-shot commands, sandbox_create with start: true then sandbox_exec for longer work, and the " +
	"delegate_* tools to hand a git worktree of a host repo to an in-guest agent. A refused connection shows in egress_audit " +
	"with the rule that refused it."

// Server is the MCP server.
type Server struct {
	cfg Config
	log zerolog.Logger
	mcp *server.MCPServer

	mu sync.Mutex
	nc *nats.Conn
	// onExit holds sandboxes created with remove_on_exit; Close removes them.
	onExit map[string]bool
}

// New builds the server and registers every tool.
func New(cfg Config) (*Server, error) {
	if cfg.Dial == nil {
		return nil, errors.New("mcp: Config.Dial is required")
	}
	if cfg.Version == "" {
		cfg.Version = "dev"
	}
	s := &Server{cfg: cfg, log: cfg.Log, onExit: map[string]bool{}}
	opts := []server.ServerOption{server.WithToolCapabilities(false), server.WithRecovery(),
		server.WithInstructions(instructions)}
	if cfg.ValidateOutput {
		opts = append(opts, server.WithOutputSchemaValidation())
	}
	s.mcp = server.NewMCPServer("nexus", cfg.Version, opts...)
	for _, t := range append(append(s.tools(), s.snapshotTools()...), s.egressTools()...) {
		s.mcp.AddTool(t.tool, s.wrap(t))
	}
	return s, nil
}

// MCPServer is the underlying mcp-go server (for in-process clients).
func (s *Server) MCPServer() *server.MCPServer { return s.mcp }

// Serve speaks MCP over in/out (stdin/stdout for `nexus mcp`) until in ends (and every request
// read has been answered) or ctx is done, then runs Close.
func (s *Server) Serve(ctx context.Context, in io.Reader, out io.Writer) error {
	defer s.Close()
	std := server.NewStdioServer(s.mcp)
	std.SetErrorLogger(log.New(zerologWriter{s.log}, "", 0))
	f := newInflight()
	aw := &answerWriter{w: out, f: f}
	err := std.Listen(ctx, &drainReader{r: bufio.NewReader(in), f: f, refuse: aw}, aw)
	if err == nil || errors.Is(err, io.EOF) || errors.Is(err, context.Canceled) {
		return nil
	}
	return err
}

// Close removes the sandboxes created with remove_on_exit and drops the bus connection.
func (s *Server) Close() {
	s.mu.Lock()
	names := make([]string, 0, len(s.onExit))
	for n := range s.onExit {
		names = append(names, n)
	}
	s.onExit = map[string]bool{}
	s.mu.Unlock()
	if len(names) > 0 {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		if c, err := s.client(ctx); err == nil {
			res, err := c.Apply(ctx, api.Remove, api.NamesRequest{Names: names, Force: true})
			if err != nil {
				s.log.Warn().Err(err).Strs("sandboxes", names).Msg("remove_on_exit: remove failed")
			}
			for _, r := range res {
				if r.Error != "" && r.Code != errdefs.CodeNotFound {
					s.log.Warn().Str("sandbox", r.Name).Str("error", r.Error).Msg("remove_on_exit: remove failed")
				}
			}
		}
		cancel()
	}
	s.mu.Lock()
	if s.nc != nil {
		s.nc.Close()
		s.nc = nil
	}
	s.mu.Unlock()
}

// client returns a gateway client, dialling the bus when there is no live connection.
func (s *Server) client(ctx context.Context) (*api.Client, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.nc != nil && !s.nc.IsClosed() {
		return api.NewClient(s.nc), nil
	}
	nc, err := s.cfg.Dial(ctx)
	if err != nil {
		return nil, err
	}
	s.nc = nc
	return api.NewClient(nc), nil
}

// handlerFunc is a tool body: it returns a JSON object for structuredContent or an error that
// becomes a tool error.
type handlerFunc func(ctx context.Context, req mcpgo.CallToolRequest) (any, error)

type toolDef struct {
	tool    mcpgo.Tool
	handler handlerFunc
	// refuse maps an argument some caller may expect to the sentence refusing it.
	refuse map[string]string
}

// toolError is an error with structured details for the client (e.g. the changed files of a
// dirty worktree).
type toolError struct {
	msg     string
	details map[string]any
}

func (e *toolError) Error() string { return e.msg }

// wrap turns a handlerFunc into an mcp-go handler: results become structured content with a
// JSON text fallback, errors become tool errors with one readable line.
func (s *Server) wrap(t toolDef) server.ToolHandlerFunc {
	name := t.tool.Name
	return func(ctx context.Context, req mcpgo.CallToolRequest) (*mcpgo.CallToolResult, error) {
		start := time.Now()
		// The arguments are checked first, so the authorizer sees exactly what the handler will.
		args, err := checkArgs(t.tool, t.refuse, req.GetRawArguments())
		var out any
		if err == nil {
			req.Params.Arguments, req.Params.RawArguments = args, nil
			if s.cfg.Authorize != nil {
				err = s.cfg.Authorize(ctx, name, req)
			}
		}
		if err == nil {
			out, err = t.handler(ctx, req)
		}
		if err != nil {
			msg := userTerms(oneLine(err.Error()))
			s.log.Info().Str("tool", name).Str("error", msg).Dur("took", time.Since(start)).Msg("tool failed")
			res := mcpgo.NewToolResultError(msg)
			var te *toolError
			if errors.As(err, &te) && te.details != nil {
				details := map[string]any{"error": msg}
				for k, v := range te.details {
					details[k] = v
				}
				res.StructuredContent = details
			}
			return res, nil
		}
		s.log.Debug().Str("tool", name).Dur("took", time.Since(start)).Msg("tool done")
		return mcpgo.NewToolResultStructuredOnly(out), nil
	}
}

// oneLine makes an error message fit one line.
func oneLine(s string) string {
	s = strings.TrimSpace(s)
	s = strings.TrimPrefix(s, "nexus: ")
	return strings.Join(strings.Fields(s), " ")
}

// zerologWriter adapts the logger for mcp-go's *log.Logger.
type zerologWriter struct{ log zerolog.Logger }

func (w zerologWriter) Write(p []byte) (int, error) {
	w.log.Warn().Str("component", "mcp-stdio").Msg(strings.TrimSpace(string(p)))
	return len(p), nil
}

// adjustCreate is r as Config.AdjustCreate leaves it.
func (s *Server) adjustCreate(ctx context.Context, r api.CreateRequest) api.CreateRequest {
	if s.cfg.AdjustCreate != nil {
		s.cfg.AdjustCreate(ctx, &r)
	}
	return r
}
