package mcp

import (
	"bytes"
	"context"
	"strings"
	"testing"
	"time"

	api "github.com/IniZio/nexus/pkg/api/gateway"
	vmmapi "github.com/IniZio/nexus/pkg/api/vmm"
	"github.com/IniZio/nexus/pkg/bus"
	"github.com/IniZio/nexus/pkg/stream"
)

// TestExecHearsOnlyTheSandboxHost (issue 25): a vmm on another host that learned an exec's
// session id and speaks on it first, on its own host's subjects, neither receives the exec's
// stdin nor gets its forged output and exit status to the caller. The gateway names the
// sandbox's host in its reply and the caller's stream keeps to it: the exec either fails
// naming both hosts (the impostor was heard before the reply) or runs on the sandbox's host.
func TestExecHearsOnlyTheSandboxHost(t *testing.T) {
	st := newStack(t, true)
	st.ok(t, "sandbox_create", map[string]any{"start": true, "name": "box", "image": "nexus-mini"}, nil)
	// The gateway's user may publish on any host's streams: it stands in for host other's vmm.
	impConn := st.bus.Connect(t, bus.UserGateway)
	imps := make(chan *stream.Session, 1)
	st.vmm.execHook = func(r vmmapi.ExecRequest) error {
		imp, err := stream.Server(impConn, "other", r.SID)
		if err != nil {
			return err
		}
		imp.Write(stream.KindStdout, []byte("forged"))
		imp.Send(stream.KindExit, vmmapi.Exit{Code: 0})
		imps <- imp
		return impConn.Flush() // all of it reaches the caller before the sandbox's vmm speaks
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	var out bytes.Buffer
	exit, err := st.gw.Run(ctx, api.ExecRequest{Name: "box", Argv: []string{"cat"}, Stdin: true},
		api.IO{Stdin: strings.NewReader("secret"), Stdout: &out})
	imp := <-imps
	defer imp.Close()
	if strings.Contains(out.String(), "forged") {
		t.Fatalf("the caller printed another host's output %q (exit %+v, %v)", out.String(), exit, err)
	}
	if err != nil {
		msg := err.Error()
		if !strings.Contains(msg, "host "+bus.LocalHost) || !strings.Contains(msg, "host other") || strings.Contains(msg, "\n") {
			t.Fatalf("exec failed with %q; want one line naming both hosts", msg)
		}
	} else if exit.Code != 0 || out.String() != "secret" {
		t.Fatalf("exec: exit %+v stdout %q; want the sandbox's cat to echo \"secret\"", exit, out.String())
	}
	if n := imp.Buffered(); n != 0 {
		t.Fatalf("the impostor received %d bytes of the exec's stdin", n)
	}
}
