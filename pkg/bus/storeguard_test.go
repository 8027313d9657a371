package bus_test

import (
	"context"
	"encoding/json"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"golang.org/x/sys/unix"

	"github.com/IniZio/nexus/internal/testutil"
	"github.com/IniZio/nexus/pkg/bus"
)

// smallDisk mounts a fresh ext4 of size (no root-reserved blocks) for t and returns its root.
func smallDisk(t *testing.T, size string) string {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("mounting a small ext4 to fill needs root")
	}
	for _, tool := range []string{"mkfs.ext4", "mount", "umount"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Skipf("%s not installed", tool)
		}
	}
	dir := t.TempDir()
	img, mnt := filepath.Join(dir, "disk.img"), filepath.Join(dir, "mnt")
	if err := os.Mkdir(mnt, 0o700); err != nil {
		t.Fatal(err)
	}
	for _, c := range [][]string{{"truncate", "-s", size, img}, {"mkfs.ext4", "-q", "-m", "0", img}, {"mount", "-o", "loop", img, mnt}} {
		if out, err := exec.Command(c[0], c[1:]...).CombinedOutput(); err != nil {
			t.Fatalf("%s: %v: %s", strings.Join(c, " "), err, out)
		}
	}
	t.Cleanup(func() { exec.Command("umount", "-l", mnt).Run() })
	return mnt
}

// fill takes every free block of dir's filesystem into one file and returns a func freeing it.
func fill(t *testing.T, dir string) func() {
	t.Helper()
	path := filepath.Join(dir, "ballast")
	f, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var st unix.Statfs_t
	if err := unix.Statfs(dir, &st); err != nil {
		t.Fatal(err)
	}
	unix.Fallocate(int(f.Fd()), 0, 0, int64(st.Bfree*uint64(st.Bsize)))
	block := make([]byte, 4096)
	for {
		if _, err := f.Write(block); err != nil {
			if !errors.Is(err, unix.ENOSPC) {
				t.Fatalf("fill %s: %v", dir, err)
			}
			break
		}
	}
	return func() { os.Remove(path) }
}

// TestStoreRecoversAfterDiskFull: a registry write on a full home fails within the store's
// deadline saying the bus cannot write for want of space; once space is freed the bus says on
// the bus that its store was restarted and the bucket takes writes again by itself
// (nats-server keeps a stream's write error until the stream is loaded again, so without the
// store guard every later write failed until the bus was restarted), and what it held before
// is still there.
func TestStoreRecoversAfterDiskFull(t *testing.T) {
	mnt := smallDisk(t, "32M")
	nh := filepath.Join(mnt, "nexus")
	b, err := testutil.StartBus(nh)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(b.Server.Shutdown)
	nc := b.Connect(t, bus.UserGateway)
	restarted := make(chan bus.StoreRestarted, 1)
	if _, err := nc.Subscribe(bus.StoreRestartedSubject, func(m *nats.Msg) {
		var ev bus.StoreRestarted
		json.Unmarshal(m.Data, &ev)
		restarted <- ev
	}); err != nil {
		t.Fatal(err)
	}
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	kv, err := js.KeyValue(ctx, bus.KVSandboxes)
	if err != nil {
		t.Fatal(err)
	}
	put := func(key, value string) error {
		sctx, cancel := bus.StoreContext(ctx)
		defer cancel()
		_, err := kv.Put(sctx, key, []byte(value))
		return bus.StoreError(err, nh)
	}
	if err := put("kept", "before"); err != nil {
		t.Fatal(err)
	}

	free := fill(t, mnt)
	defer free()
	// Large enough that the store's block file needs a new disk block.
	err = put("k", strings.Repeat("x", 64<<10))
	if err == nil || !strings.Contains(err.Error(), "the bus cannot write: no space left on "+nh) {
		t.Fatalf("a write on a full home: %v; want \"the bus cannot write: no space left on %s\"", err, nh)
	}

	free()
	select {
	case ev := <-restarted:
		if !strings.Contains(ev.Message, "JetStream was restarted") {
			t.Errorf("restart event: %+v", ev)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("no store-restarted event after the space was freed")
	}
	testutil.WaitFor(t, 15*time.Second, func() error { return put("k", "after") })
	if e, err := kv.Get(ctx, "kept"); err != nil || string(e.Value()) != "before" {
		t.Fatalf("a key written before the disk filled: %v %v", e, err)
	}
	if e, err := kv.Get(ctx, "k"); err != nil || string(e.Value()) != "after" {
		t.Fatalf("the key written after: %v %v", e, err)
	}
}
