package qemu_test

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/rs/zerolog"
	"golang.org/x/sys/unix"

	"github.com/IniZio/nexus/internal/testutil"
	"github.com/IniZio/nexus/pkg/errdefs"
	"github.com/IniZio/nexus/pkg/home"
	"github.com/IniZio/nexus/services/vmm/hypervisor"
	"github.com/IniZio/nexus/services/vmm/image"
	"github.com/IniZio/nexus/services/vmm/initramfs"
	"github.com/IniZio/nexus/services/vmm/internal/vmtest"
	"github.com/IniZio/nexus/services/vmm/kernel"
	"github.com/IniZio/nexus/services/vmm/qemu"
)

func newDriver(t testing.TB, accel string) *qemu.Driver {
	t.Helper()
	testutil.RequireQEMU(t)
	d, err := qemu.New(qemu.Config{Accel: accel, CacheDir: t.TempDir(), Logger: zerolog.Nop()})
	if err != nil {
		t.Fatal(err)
	}
	return d
}

func bootKernel(k *kernel.Kernel) string {
	if k.VmlinuxPath != "" {
		return k.VmlinuxPath
	}
	return k.VmlinuzPath
}

// testInitramfs builds the test init with the default module set into the shared cache.
func testInitramfs(t testing.TB, k *kernel.Kernel) string {
	t.Helper()
	p, err := initramfs.Build(k, vmtest.TestInit(t), initramfs.DefaultModules, filepath.Join(testutil.CacheDir(), "initramfs"))
	if err != nil {
		t.Fatal(err)
	}
	return p
}

func console(dir string) string {
	b, _ := os.ReadFile(qemu.ConsoleLog(dir))
	return string(b)
}

func waitConsole(t *testing.T, vm hypervisor.VM, want string, timeout time.Duration) {
	t.Helper()
	testutil.WaitFor(t, timeout, func() error {
		if strings.Contains(console(vm.Spec().Dir), want) {
			return nil
		}
		if vm.Exited() {
			return fmt.Errorf("qemu exited without %q; console:\n%s", want, console(vm.Spec().Dir))
		}
		return fmt.Errorf("no %q yet; console:\n%s", want, console(vm.Spec().Dir))
	})
}

// TestBootDevices boots the real kernel with the test init and checks every device the agent
// relies on: the nexus.agent port, /dev/vda being the root disk, an extra disk, a NIC on the
// netstack socket and a 9p mount.
func TestBootDevices(t *testing.T) {
	d := newDriver(t, qemu.AccelTCG)
	k := vmtest.Kernel(t)
	dir := t.TempDir()
	share := t.TempDir()
	os.WriteFile(filepath.Join(share, "hello"), []byte("from-host"), 0o644)

	// QEMU listens on the network socket; the netstack side dials it (and redials after a
	// restart), as services/netstack does.
	netSock := filepath.Join(t.TempDir(), "net.sock")
	accepted := make(chan net.Conn, 1)
	go func() {
		for range 600 {
			if c, err := net.Dial("unix", netSock); err == nil {
				accepted <- c
				return
			}
			time.Sleep(50 * time.Millisecond)
		}
	}()
	extra := filepath.Join(dir, "extra.raw")
	os.WriteFile(extra, make([]byte, 1<<20), 0o644)

	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	// The root disk is a nexus-mini overlay, as sandboxes get: the guest mounts it as ext4.
	h := home.Dir(t.TempDir())
	info, err := image.Build(ctx, h, testutil.CacheDir(), image.Mini, false, nil)
	if err != nil {
		t.Fatal(err)
	}
	disk := filepath.Join(dir, "root.qcow2")
	if err := image.NewOverlay(info.Path, disk); err != nil {
		t.Fatal(err)
	}
	initrd := testInitramfs(t, k)
	start := time.Now()
	vm, err := d.Start(ctx, qemu.VMSpec{
		ID: "boot-devices", Dir: dir, Kernel: bootKernel(k), KernelVersion: k.Version,
		Initrd: initrd, MemoryMiB: 256, VCPUs: 1,
		Disk: disk, ExtraDisks: []qemu.Disk{{Path: extra}},
		NetSocket: netSock, Mounts: []qemu.Mount{{HostPath: share, ReadOnly: true}},
		Cmdline: []string{"nexus.test9p=nexus0", "nexus.testroot=1"},
	})
	if err != nil {
		t.Fatal(err)
	}
	defer vm.Cleanup()
	defer vm.Kill()
	waitConsole(t, vm, "TESTINIT-DONE", 90*time.Second)
	t.Logf("start → TESTINIT-DONE (modules loaded, devices probed): %v", time.Since(start))
	out := console(dir)
	t.Logf("console:\n%s", out)
	for _, want := range []string{
		"VIRTIO-PORT nexus.agent",
		"BLOCK vda serial=nexus-root node=true",
		"BLOCK vdb serial=nexus-disk0 node=true",
		"NET eth0",
		"9P from-host",
		"ROOT ext4 busybox=",
		"write=true",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("console lacks %q:\n%s", want, out)
		}
	}
	if strings.Contains(out, "MODULE ") {
		t.Errorf("a module failed to load:\n%s", out)
	}
	select {
	case c := <-accepted:
		c.Close()
	case <-time.After(5 * time.Second):
		t.Error("qemu never accepted a connection on the network socket")
	}
	// The test init powers off: QEMU must exit by itself.
	wctx, wcancel := context.WithTimeout(ctx, 30*time.Second)
	defer wcancel()
	if err := vm.Wait(wctx); err != nil {
		t.Fatalf("wait: %v", err)
	}
	if _, err := os.Stat(vm.RAMPath()); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("RAM file %s still exists after exit", vm.RAMPath())
	}
}

// TestNoNICWithoutSocket: no netstack socket means no network device at all.
func TestNoNICWithoutSocket(t *testing.T) {
	d := newDriver(t, qemu.AccelTCG)
	k := vmtest.Kernel(t)
	dir := t.TempDir()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	vm, err := d.Start(ctx, qemu.VMSpec{ID: "no-nic", Dir: dir, Kernel: bootKernel(k), Initrd: testInitramfs(t, k), MemoryMiB: 256, VCPUs: 1})
	if err != nil {
		t.Fatal(err)
	}
	defer vm.Cleanup()
	defer vm.Kill()
	waitConsole(t, vm, "TESTINIT-DONE", 90*time.Second)
	if out := console(dir); strings.Contains(out, "NET ") {
		t.Errorf("guest has a NIC without a netstack socket:\n%s", out)
	}
}

// TestLifecycle: pause stops the guest, resume restarts it, a dropped handle can be re-adopted,
// and Kill leaves no process and no RAM file.
func TestLifecycle(t *testing.T) {
	d := newDriver(t, qemu.AccelTCG)
	k := vmtest.Kernel(t)
	dir := t.TempDir()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	started, err := d.Start(ctx, qemu.VMSpec{
		ID: "lifecycle", Dir: dir, Kernel: bootKernel(k), Initrd: testInitramfs(t, k),
		MemoryMiB: 256, VCPUs: 1, Cmdline: []string{"nexus.testwait=1"},
	})
	if err != nil {
		t.Fatal(err)
	}
	vm := started.(*qemu.VM) // QMP's own status names, below
	defer vm.Kill()
	if _, err := os.Stat(vm.RAMPath()); err != nil {
		t.Fatalf("RAM file: %v", err)
	}
	waitConsole(t, vm, "TICK 2", 90*time.Second)

	if err := vm.Pause(ctx); err != nil {
		t.Fatal(err)
	}
	if s, err := vm.Status(ctx); err != nil || s != "paused" {
		t.Fatalf("status after pause = %q, %v", s, err)
	}
	if p, err := vm.Paused(ctx); err != nil || !p {
		t.Fatalf("Paused after pause = %v, %v", p, err)
	}
	// Paused vCPUs print nothing: the console stays the same size over several tick periods.
	before := len(console(dir))
	deadline := time.Now().Add(time.Second)
	for time.Now().Before(deadline) {
		if n := len(console(dir)); n != before {
			t.Fatalf("console grew while paused: %d → %d", before, n)
		}
		time.Sleep(50 * time.Millisecond)
	}
	if err := vm.Resume(ctx); err != nil {
		t.Fatal(err)
	}
	if s, err := vm.Status(ctx); err != nil || s != "running" {
		t.Fatalf("status after resume = %q, %v", s, err)
	}
	if p, err := vm.Paused(ctx); err != nil || p {
		t.Fatalf("Paused after resume = %v, %v", p, err)
	}
	testutil.WaitFor(t, 30*time.Second, func() error {
		if len(console(dir)) > before {
			return nil
		}
		return errors.New("console not growing after resume")
	})

	// Drop our handle; adopt from the pidfile + QMP socket as a restarted vmm would.
	pid := vm.Pid()
	vm.Close()
	adopted, err := d.Adopt(ctx, dir)
	if err != nil {
		t.Fatalf("adopt: %v", err)
	}
	vm2 := adopted.(*qemu.VM)
	if vm2.Pid() != pid || vm2.ID != "lifecycle" {
		t.Fatalf("adopted pid %d id %s, want %d lifecycle", vm2.Pid(), vm2.ID, pid)
	}
	if s, err := vm2.Status(ctx); err != nil || s != "running" {
		t.Fatalf("adopted status = %q, %v", s, err)
	}
	if err := vm2.Kill(); err != nil {
		t.Fatal(err)
	}
	if err := unix.Kill(pid, 0); !errors.Is(err, unix.ESRCH) {
		// Our first handle's goroutine reaps the child; give it a moment.
		testutil.WaitFor(t, 5*time.Second, func() error {
			if err := unix.Kill(pid, 0); errors.Is(err, unix.ESRCH) {
				return nil
			}
			return fmt.Errorf("pid %d still exists", pid)
		})
	}
	if _, err := os.Stat(vm2.RAMPath()); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("RAM file %s left behind", vm2.RAMPath())
	}
	if err := vm2.Cleanup(); err != nil {
		t.Fatal(err)
	}
	for _, f := range []string{"qemu.pid", "vm.json", "qmp.sock", "agent.sock"} {
		if _, err := os.Stat(filepath.Join(dir, f)); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("%s left behind", f)
		}
	}
	// Nothing left to adopt.
	if _, err := d.Adopt(ctx, dir); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("adopt after cleanup = %v, want not found", err)
	}
}

// TestAdoptRejectsStranger: a pidfile pointing at some other process is not adopted.
func TestAdoptRejectsStranger(t *testing.T) {
	d := newDriver(t, qemu.AccelTCG)
	dir := t.TempDir()
	sleep := exec.Command("sleep", "30")
	if err := sleep.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { sleep.Process.Kill(); sleep.Wait() }()
	pid := strconv.Itoa(sleep.Process.Pid)
	os.WriteFile(filepath.Join(dir, "qemu.pid"), []byte(pid+"\n"), 0o644)
	os.WriteFile(filepath.Join(dir, "vm.json"), []byte(`{"id":"x","pid":`+pid+`,"ram_path":"/dev/shm/nexus-x-test.ram"}`), 0o644)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := d.Adopt(ctx, dir); !errors.Is(err, errdefs.ErrNotFound) {
		t.Fatalf("adopt of a non-qemu pid = %v, want not found", err)
	}
	if err := unix.Kill(sleep.Process.Pid, 0); err != nil {
		t.Fatalf("the stranger process was harmed: %v", err)
	}
}

func TestStartValidation(t *testing.T) {
	d := newDriver(t, qemu.AccelTCG)
	k := vmtest.Kernel(t)
	ctx := context.Background()
	base := qemu.VMSpec{ID: "ok", Dir: t.TempDir(), Kernel: bootKernel(k), Initrd: bootKernel(k), MemoryMiB: 256, VCPUs: 1}
	cases := map[string]func(s *qemu.VMSpec){
		"bad id":       func(s *qemu.VMSpec) { s.ID = "Bad_ID" },
		"low memory":   func(s *qemu.VMSpec) { s.MemoryMiB = 64 },
		"no vcpus":     func(s *qemu.VMSpec) { s.VCPUs = 0 },
		"no kernel":    func(s *qemu.VMSpec) { s.Kernel = "/nonexistent" },
		"cmdline sp":   func(s *qemu.VMSpec) { s.Cmdline = []string{"a b"} },
		"mount file":   func(s *qemu.VMSpec) { s.Mounts = []qemu.Mount{{HostPath: s.Kernel}} },
		"relative dir": func(s *qemu.VMSpec) { s.Dir = "rel" },
	}
	for name, mut := range cases {
		t.Run(name, func(t *testing.T) {
			s := base
			mut(&s)
			if _, err := d.Start(ctx, s); !errors.Is(err, errdefs.ErrInvalid) {
				t.Fatalf("err = %v, want invalid", err)
			}
		})
	}
}

// TestAcceleratorProbeCached: auto mode probes KVM with a real boot once, then answers from
// accel.json without booting.
func TestAcceleratorProbeCached(t *testing.T) {
	testutil.RequireQEMU(t)
	k := vmtest.Kernel(t)
	cache := t.TempDir()
	d1, err := qemu.New(qemu.Config{Accel: qemu.AccelAuto, CacheDir: cache})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	start := time.Now()
	a1, err := d1.Accelerator(ctx, bootKernel(k), k.Version)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("probe chose %s in %v", a1, time.Since(start))
	b, err := os.ReadFile(filepath.Join(cache, "accel.json"))
	if err != nil || !strings.Contains(string(b), k.Version) || !strings.Contains(string(b), d1.Version()) {
		t.Fatalf("accel.json = %s, %v", b, err)
	}
	d2, _ := qemu.New(qemu.Config{Accel: qemu.AccelAuto, CacheDir: cache})
	start = time.Now()
	a2, err := d2.Accelerator(ctx, bootKernel(k), k.Version)
	if err != nil || a2 != a1 {
		t.Fatalf("cached accel = %s, %v; want %s", a2, err, a1)
	}
	if dt := time.Since(start); dt > 500*time.Millisecond {
		t.Fatalf("cached answer took %v: it probed again", dt)
	}
}

// TestBareBootTime measures wall time from exec to the probe init's marker (the bare-QEMU
// baseline for the create benchmark), with plain RAM and with the shared RAM file.
func TestBareBootTime(t *testing.T) {
	d := newDriver(t, qemu.AccelTCG)
	k := vmtest.Kernel(t)
	initrd, err := initramfs.BuildProbe(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		name    string
		kernel  string
		ramFile bool
	}{
		{"vmlinux", k.VmlinuxPath, false},
		{"vmlinux+ramfile", k.VmlinuxPath, true},
		{"bzImage", k.VmlinuzPath, false},
	} {
		if c.kernel == "" {
			continue
		}
		var times []time.Duration
		for i := 0; i < 3; i++ {
			ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
			dt, err := d.BootToMarker(ctx, qemu.BootSpec{Kernel: c.kernel, Initrd: initrd, Accel: qemu.AccelTCG, Marker: initramfs.ProbeMarker, RAMFile: c.ramFile})
			cancel()
			if err != nil {
				t.Fatalf("%s: %v", c.name, err)
			}
			times = append(times, dt.Round(time.Millisecond))
		}
		t.Logf("TCG boot to /init marker, %s: %v", c.name, times)
	}
}

// BenchmarkBareBoot is the baseline for create → first exec: bare QEMU boot of the guest kernel
// and a trivial initramfs to /init, TCG.
func BenchmarkBareBoot(b *testing.B) {
	d := newDriver(b, qemu.AccelTCG)
	k := vmtest.Kernel(b)
	initrd, err := initramfs.BuildProbe(b.TempDir())
	if err != nil {
		b.Fatal(err)
	}
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
		dt, err := d.BootToMarker(ctx, qemu.BootSpec{Kernel: bootKernel(k), Initrd: initrd, Accel: qemu.AccelTCG, Marker: initramfs.ProbeMarker, RAMFile: true})
		cancel()
		if err != nil {
			b.Fatal(err)
		}
		b.ReportMetric(float64(dt.Milliseconds()), "ms-to-init")
	}
}
