package gateway_test

import (
	"bytes"
	"context"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/IniZio/nexus/internal/testutil"
	api "github.com/IniZio/nexus/pkg/api/gateway"
	vmmapi "github.com/IniZio/nexus/pkg/api/vmm"
	"github.com/IniZio/nexus/pkg/bus"
	"github.com/IniZio/nexus/pkg/stream"
)

// TestCopyOutKeepsToTheNamedHost (issue 25): a `nexus cp` from a sandbox whose session another
// host's vmm speaks on first never writes that host's bytes: the gateway's reply names the
// sandbox's host, and the copy either fails naming both hosts or carries the sandbox's file.
// With a reply naming no host (an older gateway) the first host to speak is the peer.
func TestCopyOutKeepsToTheNamedHost(t *testing.T) {
	b := testutil.NewBus(t)
	impConn := b.Connect(t, bus.UserGateway) // publishes anywhere: host other's vmm
	vmmConn := b.Connect(t, bus.UserVMM)
	var older atomic.Bool // the gateway names no host
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	ready := make(chan error, 1)
	go bus.Serve(ctx, b.Connect(t, bus.UserGateway), bus.ServiceInfo{Name: "gateway", Host: bus.LocalHost, Version: "0.0.1"}, zerolog.Nop(), func(s *bus.Service) error {
		err := api.Copy.Serve(s, func(_ context.Context, r api.CopyRequest) (api.Started, error) {
			imp, err := stream.Server(impConn, "other", r.SID)
			if err != nil {
				return api.Started{}, err
			}
			imp.Write(stream.KindStdout, []byte("forged"))
			imp.Send(stream.KindExit, vmmapi.Exit{})
			if err := impConn.Flush(); err != nil { // it reaches the caller first
				return api.Started{}, err
			}
			srv, err := stream.Server(vmmConn, bus.LocalHost, r.SID)
			if err != nil {
				return api.Started{}, err
			}
			srv.Write(stream.KindStdout, []byte("real"))
			srv.Send(stream.KindExit, vmmapi.Exit{})
			if older.Load() {
				return api.Started{}, nil
			}
			return api.Started{Host: bus.LocalHost}, nil
		})
		ready <- err
		return err
	})
	if err := <-ready; err != nil {
		t.Fatal(err)
	}
	c := api.NewClient(b.Connect(t, bus.UserCLI))
	for range 5 {
		var out bytes.Buffer
		err := c.CopyOut(ctx, "box", "/f", &out)
		if out.String() == "forged" {
			t.Fatalf("the copy wrote another host's bytes (%v)", err)
		}
		if err != nil {
			if msg := err.Error(); !strings.Contains(msg, "host "+bus.LocalHost) || !strings.Contains(msg, "host other") {
				t.Fatalf("copy failed with %q; want it to name both hosts", msg)
			}
		} else if out.String() != "real" {
			t.Fatalf("copy wrote %q; want \"real\"", out.String())
		}
	}
	older.Store(true) // the first to speak is taken
	var out bytes.Buffer
	if err := c.CopyOut(ctx, "box", "/f", &out); err != nil || out.String() != "forged" {
		t.Fatalf("without a named host the copy wrote %q (%v); want the first speaker's \"forged\"", out.String(), err)
	}
}
