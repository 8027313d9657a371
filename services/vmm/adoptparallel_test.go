package vmm

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/IniZio/nexus/internal/testutil"
	"github.com/IniZio/nexus/pkg/bus"
	"github.com/IniZio/nexus/pkg/errdefs"
	"github.com/IniZio/nexus/pkg/home"
	"github.com/IniZio/nexus/services/vmm/hypervisor"
)

// stuckDriver's adoptions wait until release is closed (a VM whose agent is slow to answer),
// saying which sandbox directory each is for.
type stuckDriver struct {
	fakeDriver
	adopting chan string
	release  chan struct{}
}

func (d *stuckDriver) Adopt(ctx context.Context, dir string) (hypervisor.VM, error) {
	d.adopting <- dir
	<-d.release
	return nil, errdefs.NotFound("fake: the VM is gone")
}

// A restarted vmm is not held by the VMs it adopts (issue 18): the adoptions run at once, not
// one after another, the vmm goes on to serve while they run, and a sandbox not being adopted
// is answered meanwhile; one being adopted is answered when its adoption ends.
func TestAdoptionsRunAtOnceAndHoldNothingElse(t *testing.T) {
	h := home.Dir(t.TempDir())
	for _, id := range []string{"sb-a", "sb-b"} {
		if err := os.MkdirAll(h.Sandbox(id), 0o700); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(h.Sandbox(id), "qemu.pid"), []byte("4242\n"), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	b := testutil.NewBus(t)
	drv := &stuckDriver{adopting: make(chan string, 2), release: make(chan struct{})}
	s := &Service{cfg: Config{Home: h, Bus: b.Connect(t, bus.UserVMM)}, drv: drv, vms: map[string]*machine{},
		adopting: map[string]chan struct{}{}, failed: map[string]string{}}
	returned := make(chan struct{})
	go func() { s.adoptAll(context.Background()); close(returned) }()
	for range 2 {
		select {
		case <-drv.adopting:
		case <-time.After(30 * time.Second):
			t.Fatal("the second adoption waits for the first")
		}
	}
	select {
	case <-returned:
	case <-time.After(30 * time.Second):
		t.Fatal("the vmm waits for its adoptions before it serves")
	}
	if _, err := s.lookup("sb-c"); !errors.Is(err, errdefs.ErrConflict) {
		t.Fatalf("a sandbox not being adopted, while others are: %v, want its answer at once", err)
	}
	looked := make(chan error, 1)
	go func() { _, err := s.lookup("sb-a"); looked <- err }()
	select {
	case err := <-looked:
		t.Fatalf("a sandbox being adopted was answered before its adoption ended: %v", err)
	case <-time.After(100 * time.Millisecond): // a wait that must not end: its end would fail the test
	}
	close(drv.release)
	if err := <-looked; !errors.Is(err, errdefs.ErrConflict) {
		t.Fatalf("a sandbox whose VM was gone at adoption: %v", err)
	}
	s.awaitAdoptions()
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, id := range []string{"sb-a", "sb-b"} {
		if s.failed[id] == "" {
			t.Errorf("%s: no reason kept for the VM adoption gave up", id)
		}
	}
}
