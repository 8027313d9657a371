package vmm

import (
	"slices"
	"testing"

	"github.com/IniZio/nexus/pkg/agentproto"
	portfwdapi "github.com/IniZio/nexus/pkg/api/portfwd"
)

func TestForwardable(t *testing.T) {
	got := forwardable([]agentproto.Listener{
		{Proto: "tcp", IP: "127.0.0.1", Port: 5173},
		{Proto: "tcp6", IP: "::", Port: 5173}, // same port twice: once
		{Proto: "tcp", IP: "0.0.0.0", Port: 3000},
		{Proto: "tcp6", IP: "::1", Port: 8080},
		{Proto: "tcp", IP: "0.0.0.0", Port: 22},             // below the range
		{Proto: "tcp", IP: "0.0.0.0", Port: 11024},          // above the range
		{Proto: "tcp", IP: "0.0.0.0", Port: 1023},           // below
		{Proto: "tcp", IP: "192.168.127.2", Port: 4000},     // not reachable by the loopback dial
		{Proto: "udp", IP: "0.0.0.0", Port: 5353},           // not TCP
		{Proto: "tcp", IP: "garbage", Port: 5000},           // bad address
		{Proto: "tcp", IP: "0.0.0.0", Port: 1024},           // lowest
		{Proto: "tcp", IP: "::ffff:127.0.0.1", Port: 11023}, // highest, v4-mapped loopback
	})
	want := []portfwdapi.Port{{Port: 1024, Addr: "0.0.0.0"}, {Port: 3000, Addr: "0.0.0.0"}, {Port: 5173, Addr: "127.0.0.1"},
		{Port: 8080, Addr: "::1"}, {Port: 11023, Addr: "::ffff:127.0.0.1"}}
	if !slices.Equal(got, want) {
		t.Fatalf("forwardable:\n got %+v\nwant %+v", got, want)
	}
}
