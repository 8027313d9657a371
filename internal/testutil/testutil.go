// Package testutil holds helpers shared by tests: an in-process bus on a random port with its
// JetStream store in a temp dir, an isolated HOME and NEXUS_HOME, and a condition poller.
package testutil

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/rs/zerolog"

	"github.com/IniZio/nexus/pkg/bus"
	"github.com/IniZio/nexus/pkg/home"
)

// Bus is a running in-process bus for one test (or one TestMain).
type Bus struct {
	Home   home.Dir
	URL    string
	Server *bus.Server
}

// StartBus starts a bus on a random loopback port with state under dir.
func StartBus(dir string) (*Bus, error) {
	h := home.Dir(dir)
	s, err := bus.StartServer(context.Background(), bus.ServerConfig{Home: h, Port: -1, Log: zerolog.Nop()})
	if err != nil {
		return nil, err
	}
	return &Bus{Home: h, URL: s.URL(), Server: s}, nil
}

// NewBus starts a bus for t, stopped at cleanup. It also points HOME and NEXUS_HOME at temp
// dirs so nothing the test runs can touch the real home.
func NewBus(t testing.TB) *Bus {
	t.Helper()
	dir := IsolateHome(t)
	b, err := StartBus(dir)
	if err != nil {
		t.Fatalf("start bus: %v", err)
	}
	t.Cleanup(b.Server.Shutdown)
	return b
}

// Connect connects to the test bus as user.
func (b *Bus) Connect(t testing.TB, user string) *nats.Conn {
	t.Helper()
	nc, err := bus.Connect(context.Background(), bus.ConnectConfig{Home: b.Home, User: user, URL: b.URL})
	if err != nil {
		t.Fatalf("connect as %s: %v", user, err)
	}
	t.Cleanup(nc.Close)
	return nc
}

// IsolateHome sets HOME and NEXUS_HOME to fresh temp dirs for t and returns NEXUS_HOME.
func IsolateHome(t testing.TB) string {
	t.Helper()
	root := t.TempDir()
	nh := filepath.Join(root, "nexus")
	hh := filepath.Join(root, "home")
	if err := os.MkdirAll(hh, 0o700); err != nil {
		t.Fatal(err)
	}
	t.Setenv("HOME", hh)
	t.Setenv("NEXUS_HOME", nh)
	return nh
}

// WaitFor polls cond until it returns nil or timeout passes; then it fails t with the last error.
func WaitFor(t testing.TB, timeout time.Duration, cond func() error) {
	t.Helper()
	if err := Poll(timeout, cond); err != nil {
		t.Fatalf("condition not met within %s: %v", timeout, err)
	}
}

// Poll is WaitFor without a testing.TB, for TestMain and benchmarks.
func Poll(timeout time.Duration, cond func() error) error {
	deadline := time.Now().Add(timeout)
	wait := 5 * time.Millisecond
	for {
		err := cond()
		if err == nil {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%w", err)
		}
		time.Sleep(wait)
		if wait < 200*time.Millisecond {
			wait *= 2
		}
	}
}
