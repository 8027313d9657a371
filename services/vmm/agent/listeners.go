package agent

import (
	"fmt"
	"io"
	"os"
	"path/filepath"

	"github.com/IniZio/nexus/pkg/agentproto"
)

// maxProcNetBytes bounds how much of /proc/net/tcp{,6} is read.
const maxProcNetBytes = 8 << 20

func (s *Server) listeners() ([]agentproto.Listener, error) {
	var out []agentproto.Listener
	for _, proto := range []string{"tcp", "tcp6"} {
		f, err := os.Open(filepath.Join(s.cfg.ProcRoot, "net", proto))
		if err != nil {
			if proto == "tcp6" && os.IsNotExist(err) {
				continue // no IPv6 in this kernel
			}
			return nil, fmt.Errorf("listeners: %w", err)
		}
		data, err := io.ReadAll(io.LimitReader(f, maxProcNetBytes))
		f.Close()
		if err != nil {
			return nil, fmt.Errorf("listeners: %w", err)
		}
		ls, err := agentproto.ParseProcNetTCP(data, proto)
		if err != nil {
			return nil, fmt.Errorf("listeners: %w", err)
		}
		out = append(out, ls...)
	}
	return out, nil
}
