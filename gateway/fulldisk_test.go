package gateway

import (
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/IniZio/nexus/internal/testutil"
	api "github.com/IniZio/nexus/pkg/api/gateway"
	"github.com/IniZio/nexus/pkg/bus"
	"github.com/IniZio/nexus/pkg/errdefs"
)

// A registry write on a bus whose disk is full fails within seconds, under a request deadline
// of minutes, with a sentence naming the cause.
func TestRegistryWriteOnFullDisk(t *testing.T) {
	dir := t.TempDir()
	if out, err := exec.Command("mount", "-t", "tmpfs", "-o", "size=8m", "tmpfs", dir).CombinedOutput(); err != nil {
		t.Skipf("cannot mount a small tmpfs to fill (needs root): %v: %s", err, out)
	}
	t.Cleanup(func() { exec.Command("umount", "-l", dir).Run() })
	b, err := testutil.StartBus(dir)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(b.Server.Shutdown)
	nc := b.Connect(t, bus.UserGateway)
	r, err := NewRegistry(context.Background(), nc)
	if err != nil {
		t.Fatal(err)
	}
	r.home = dir
	if err := r.Create(context.Background(), &api.Sandbox{Name: "disk/before"}); err != nil {
		t.Fatal(err)
	}
	fill, err := os.Create(filepath.Join(dir, "fill"))
	if err != nil {
		t.Fatal(err)
	}
	chunk := make([]byte, 64<<10)
	for {
		if _, err := fill.Write(chunk); err != nil {
			break
		}
	}
	fill.Close()

	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Minute) // a handler's deadline
	defer cancel()
	began := time.Now()
	done := make(chan error, 1)
	go func() {
		sb, err := r.Get(ctx, "disk/before")
		if err == nil {
			sb.Labels = map[string]string{"k": strings.Repeat("v", 4096)}
			err = r.Update(ctx, sb)
		}
		if err == nil {
			err = r.Create(ctx, &api.Sandbox{Name: "disk/after", Labels: map[string]string{"k": strings.Repeat("v", 4096)}})
		}
		done <- err
	}()
	select {
	case err := <-done:
		t.Logf("failed after %v: %v", time.Since(began).Round(time.Millisecond), err)
		if !errors.Is(err, errdefs.ErrUnavailable) || !strings.Contains(err.Error(), "the bus cannot write: no space left on "+dir) {
			t.Fatalf("a write on a full disk: %v", err)
		}
	case <-time.After(2 * bus.StoreTimeout):
		t.Fatalf("a registry write on a full disk still hangs after %v", 2*bus.StoreTimeout)
	}
}
