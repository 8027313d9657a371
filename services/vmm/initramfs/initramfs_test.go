package initramfs_test

import (
	"bufio"
	"bytes"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"

	"github.com/IniZio/nexus/pkg/agentproto"
	"github.com/IniZio/nexus/services/vmm/initramfs"
	"github.com/IniZio/nexus/services/vmm/internal/vmtest"
)

// TestNewcReadableByCpio checks our writer against GNU cpio.
func TestNewcReadableByCpio(t *testing.T) {
	if _, err := exec.LookPath("cpio"); err != nil {
		t.Skip("cpio not installed")
	}
	a := initramfs.NewArchive()
	a.File("etc/nexus/modules", 0o644, []byte("/lib/a.ko\n"))
	a.File("init", 0o755, []byte("#!/bin/sh\n"))
	a.Symlink("bin/sh", "/bin/busybox")
	a.Dir("tmp", 0o777|os.ModeSticky)
	a.File("odd", 0o600, []byte("x")) // 1-byte file exercises padding
	if err := a.File("init", 0o755, nil); err == nil {
		t.Error("duplicate path accepted")
	}
	var buf bytes.Buffer
	if _, err := a.WriteTo(&buf); err != nil {
		t.Fatal(err)
	}
	if buf.Len()%4 != 0 {
		t.Errorf("archive length %d not 4-aligned", buf.Len())
	}
	dir := t.TempDir()
	cmd := exec.Command("cpio", "-idm", "--quiet", "--no-absolute-filenames")
	cmd.Dir = dir
	cmd.Stdin = bytes.NewReader(buf.Bytes())
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("cpio: %v: %s", err, out)
	}
	if b, _ := os.ReadFile(filepath.Join(dir, "etc/nexus/modules")); string(b) != "/lib/a.ko\n" {
		t.Errorf("modules file = %q", b)
	}
	if l, _ := os.Readlink(filepath.Join(dir, "bin/sh")); l != "/bin/busybox" {
		t.Errorf("symlink = %q", l)
	}
	st, err := os.Stat(filepath.Join(dir, "init"))
	if err != nil || st.Mode().Perm() != 0o755 {
		t.Errorf("init mode = %v, %v", st.Mode(), err)
	}
	if st, _ := os.Stat(filepath.Join(dir, "tmp")); st.Mode()&os.ModeSticky == 0 {
		t.Errorf("tmp lost its sticky bit: %v", st.Mode())
	}
	if b, _ := os.ReadFile(filepath.Join(dir, "odd")); string(b) != "x" {
		t.Errorf("odd = %q", b)
	}
}

func agentFile(t *testing.T, content []byte) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "agent")
	if err := os.WriteFile(p, content, 0o755); err != nil {
		t.Fatal(err)
	}
	return p
}

func listing(t *testing.T, archive string) (names []string, modules string) {
	t.Helper()
	raw, err := os.ReadFile(archive)
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	cmd := exec.Command("cpio", "-idm", "--quiet", "--no-absolute-filenames")
	cmd.Dir = dir
	cmd.Stdin = bytes.NewReader(raw)
	if out, err := cmd.CombinedOutput(); err != nil && !strings.Contains(string(out), "dev/console") {
		t.Fatalf("cpio: %v: %s", err, out) // non-root cannot mknod /dev/console; that is fine
	}
	filepath.Walk(dir, func(p string, _ os.FileInfo, _ error) error {
		rel, _ := filepath.Rel(dir, p)
		names = append(names, rel)
		if strings.HasSuffix(p, ".ko") {
			if b, _ := os.ReadFile(p); bytes.Contains(b, []byte("~Module signature appended~")) {
				t.Errorf("%s still carries its signature: the guest would verify it on every boot", rel)
			}
		}
		return nil
	})
	b, _ := os.ReadFile(filepath.Join(dir, "etc/nexus/modules"))
	return names, string(b)
}

// TestBuild: deterministic bytes, cache hit by input hash, module list in load order.
func TestBuild(t *testing.T) {
	if _, err := exec.LookPath("cpio"); err != nil {
		t.Skip("cpio not installed")
	}
	k := vmtest.Kernel(t)
	agent := agentFile(t, initramfs.ProbeInit())
	out1, out2 := t.TempDir(), t.TempDir()
	p1, err := initramfs.Build(k, agent, initramfs.DefaultModules, out1)
	if err != nil {
		t.Fatal(err)
	}
	p2, err := initramfs.Build(k, agent, initramfs.DefaultModules, out2)
	if err != nil {
		t.Fatal(err)
	}
	b1, _ := os.ReadFile(p1)
	b2, _ := os.ReadFile(p2)
	if !bytes.Equal(b1, b2) || filepath.Base(p1) != filepath.Base(p2) {
		t.Fatal("same inputs gave different archives")
	}
	st1, _ := os.Stat(p1)
	p3, err := initramfs.Build(k, agent, initramfs.DefaultModules, out1)
	if err != nil || p3 != p1 {
		t.Fatalf("rebuild = %s, %v", p3, err)
	}
	if st3, _ := os.Stat(p3); !st3.ModTime().Equal(st1.ModTime()) {
		t.Error("cache hit rewrote the file")
	}
	// A different agent is a different archive.
	other := agentFile(t, append(initramfs.ProbeInit(), 0))
	p4, err := initramfs.Build(k, other, initramfs.DefaultModules, out1)
	if err != nil || p4 == p1 {
		t.Fatalf("changed agent: %s, %v", p4, err)
	}
	// So is a different module list.
	p5, err := initramfs.Build(k, agent, []string{"virtio_mmio"}, out1)
	if err != nil || p5 == p1 {
		t.Fatalf("changed modules: %s, %v", p5, err)
	}

	names, mods := listing(t, p1)
	for _, want := range []string{"init", "etc/nexus/modules", "lib/modules/" + k.Version + "/kernel/drivers/virtio/virtio_mmio.ko"} {
		found := false
		for _, n := range names {
			found = found || n == want
		}
		if !found {
			t.Errorf("archive lacks %s", want)
		}
	}
	lines := strings.Split(strings.TrimSpace(mods), "\n")
	idx := func(name string) int {
		for i, l := range lines {
			if strings.HasSuffix(l, "/"+name+".ko") {
				return i
			}
		}
		return -1
	}
	for _, l := range lines {
		if l == agentproto.SharesModulesMarker {
			continue
		}
		if !strings.HasPrefix(l, "/lib/modules/"+k.Version+"/") || !strings.HasSuffix(l, ".ko") {
			t.Errorf("bad module line %q", l)
		}
	}
	if idx("virtio_ring") < 0 || idx("virtio_ring") > idx("virtio_mmio") || idx("jbd2") > idx("ext4") || idx("9pnet") > idx("9pnet_virtio") {
		t.Errorf("module order wrong:\n%s", mods)
	}
	// 9p and what only it needs come after the shares marker: a guest without host shares skips
	// them.
	shares := slices.Index(lines, agentproto.SharesModulesMarker)
	if shares < 0 || idx("ext4") > shares || idx("vsock") > shares || idx("overlay") > shares || idx("9p") < shares || idx("netfs") < shares {
		t.Errorf("module sections wrong:\n%s", mods)
	}
	if idx("af_packet") >= 0 {
		t.Errorf("built-in af_packet listed")
	}
}

func TestBuildRejectsNonELFAgent(t *testing.T) {
	k := vmtest.Kernel(t)
	if _, err := initramfs.Build(k, agentFile(t, []byte("#!/bin/sh\n")), nil, t.TempDir()); err == nil {
		t.Fatal("a shell script was accepted as the agent")
	}
}

// TestProbeInitOnHost runs the probe binary as an ordinary process: not PID 1, so it prints
// the marker and exits 0 instead of powering off.
func TestProbeInitOnHost(t *testing.T) {
	p := agentFile(t, initramfs.ProbeInit())
	out, err := exec.Command(p).Output()
	if err != nil {
		t.Fatalf("probe init: %v", err)
	}
	if string(out) != initramfs.ProbeMarker+"\n" {
		t.Fatalf("output = %q", out)
	}
}

// TestSleepInitOnHost runs the sleeper binary as an ordinary process: it prints its marker and
// then sleeps until a signal ends it (it neither exits nor crashes on its own).
func TestSleepInitOnHost(t *testing.T) {
	cmd := exec.Command(agentFile(t, initramfs.SleepInit()))
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatalf("sleep init: %v", err)
	}
	line, err := bufio.NewReader(out).ReadString('\n')
	if line != initramfs.SleepMarker+"\n" {
		cmd.Process.Kill()
		t.Fatalf("output = %q (%v)", line, err)
	}
	cmd.Process.Signal(syscall.SIGTERM)
	err = cmd.Wait()
	var ee *exec.ExitError
	if !errors.As(err, &ee) || ee.Sys().(syscall.WaitStatus).Signal() != syscall.SIGTERM {
		t.Fatalf("sleep init ended with %v, want killed by SIGTERM while it slept", err)
	}
}
