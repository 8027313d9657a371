package agent

import (
	"bufio"
	"bytes"
	"testing"

	"github.com/IniZio/nexus/pkg/agentproto"
)

func TestStaleHello(t *testing.T) {
	for _, tc := range []struct {
		name string
		read []byte
		want string
	}{
		{"hello", agentproto.Hello("0123456789abcdef"), "0123456789abcdef"},
		{"after yamux bytes", append([]byte{0, 1, 0, 0, 0, 0, 0, 1, 0, 0, 0, 4, 'x', 'y'}, agentproto.Hello("00112233aabbccdd")...), "00112233aabbccdd"},
		{"last of two", append(agentproto.Hello("aaaaaaaa"), agentproto.Hello("bbbbbbbb")...), "bbbbbbbb"},
		{"cut short", agentproto.Hello("0123456789abcdef")[:20], ""},
		{"no hello", []byte("NEXUS-AGENT-READY 0123456789abcdef\n"), ""},
		{"bad nonce", []byte("NEXUS-AGENT-HELLO not-hex\n"), ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			pc := &portConn{r: bufio.NewReader(bytes.NewReader(append(bytes.Repeat([]byte{7}, 300), tc.read...)))}
			buf := make([]byte, 50)
			for {
				if _, err := pc.Read(buf); err != nil {
					break
				}
			}
			if len(pc.tail) > tailSize {
				t.Fatalf("tail grew to %d", len(pc.tail))
			}
			if got := pc.staleHello(); got != tc.want {
				t.Fatalf("staleHello = %q, want %q", got, tc.want)
			}
		})
	}
}
