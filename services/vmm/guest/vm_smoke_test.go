package guest_test

import (
	"bytes"
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/IniZio/nexus/internal/testutil"
	"github.com/IniZio/nexus/pkg/agentproto"
	"github.com/IniZio/nexus/services/vmm/guest"
)

// TestVMSmoke boots the agent as PID 1 in a QEMU microvm when NEXUS_AGENT_SMOKE_DIR names a
// directory holding vmlinuz, initrd.gz (the agent as /init plus modules and /etc/nexus/modules)
// and root.img (ext4 with a shell). The vmm package's own tests build these for real; this one
// exercises the agent's PID 1 path (modules, root switch, virtio port, vsock) by hand.
func TestVMSmoke(t *testing.T) {
	dir := os.Getenv("NEXUS_AGENT_SMOKE_DIR")
	if dir == "" {
		t.Skip("NEXUS_AGENT_SMOKE_DIR not set")
	}
	qemu, err := exec.LookPath("qemu-system-x86_64")
	if err != nil {
		t.Fatal("qemu-system-x86_64 not found")
	}
	tmp := shortTemp(t)
	sock := filepath.Join(tmp, "agent.sock")
	overlay := filepath.Join(tmp, "root.img")
	b, err := os.ReadFile(filepath.Join(dir, "root.img"))
	if err != nil {
		t.Fatal(err)
	}
	os.WriteFile(overlay, b, 0o644)
	cmdline := "console=ttyS0 reboot=t panic=-1 nexus.root=/dev/vda nexus.hostname=smoke nexus.time=" + strconv.FormatInt(time.Now().Unix(), 10)
	if mhz := cpuMHz(); mhz > 0 {
		cmdline += " tsc_early_khz=" + strconv.Itoa(int(mhz*1000)) // TCG: no PIT to calibrate against
	}
	var console bytes.Buffer
	q := exec.Command(qemu, "-M", "microvm,x-option-roms=off", "-accel", "tcg,thread=multi", "-cpu", "max", "-m", "512", "-smp", "1", "-nodefaults", "-no-user-config",
		"-nographic", "-no-reboot", "-serial", "stdio",
		"-kernel", filepath.Join(dir, "vmlinuz"), "-initrd", filepath.Join(dir, "initrd.gz"), "-append", cmdline,
		"-drive", "id=root,file="+overlay+",format=raw,if=none", "-device", "virtio-blk-device,drive=root",
		"-device", "virtio-serial-device", "-chardev", "socket,id=agent,path="+sock+",server=on,wait=off",
		"-device", "virtserialport,chardev=agent,name="+agentproto.DefaultAgentPort)
	q.Stdout, q.Stderr = &console, &console
	start := time.Now()
	if err := q.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	go func() { exited <- q.Wait() }()
	defer func() {
		q.Process.Kill()
		if t.Failed() {
			t.Logf("console:\n%s", console.String())
		}
	}()
	ctx, cancel := context.WithTimeout(context.Background(), 120*time.Second)
	defer cancel()
	testutil.WaitFor(t, 30*time.Second, func() error { _, err := os.Stat(sock); return err })
	c, err := guest.Dial(ctx, sock)
	if err != nil {
		t.Fatalf("dial: %v", err)
	}
	defer c.Close()
	t.Logf("agent answered %v after qemu start (pong %+v)", time.Since(start), c.Agent())

	run := func(argv ...string) (string, guest.ExitStatus) {
		var out bytes.Buffer
		st, err := c.Exec(ctx, guest.ExecRequest{Argv: argv}, nil, &out, &out, nil)
		if err != nil {
			t.Fatalf("exec %v: %v", argv, err)
		}
		return out.String(), st
	}
	if out, st := run("sh", "-c", "echo hi; cat /proc/1/cmdline; echo; hostname; ls /run/nexus/bin"); st.Code != 0 || !strings.Contains(out, "hi\n") || !strings.Contains(out, "smoke") || !strings.Contains(out, "nexus-agent") {
		t.Fatalf("exec: %q %+v", out, st)
	}
	if out, st := run("tty"); st.Code == 0 || strings.Contains(out, "/dev/pts") {
		t.Fatalf("tty without pty: %q", out)
	}
	var out bytes.Buffer
	st, err := c.Exec(ctx, guest.ExecRequest{Argv: []string{"tty"}, TTY: true}, nil, &out, &out, nil)
	if err != nil || st.Code != 0 || !strings.HasPrefix(out.String(), "/dev/pts/") {
		t.Fatalf("tty: %q %+v %v", out.String(), st, err)
	}
	if out, st := run("nexus-agent", "selftest-vsock"); st.Code != 0 || !strings.Contains(out, "selftest-vsock: ok") {
		t.Fatalf("selftest-vsock: %q %+v", out, st)
	}
	if out, st := run("sh", "-c", "sleep 0.1 & sleep 0.1 & exit 0"); st.Code != 0 {
		t.Fatalf("orphans: %q %+v", out, st)
	}
	t0 := time.Now()
	const n = 20
	for i := 0; i < n; i++ {
		run("true")
	}
	t.Logf("exec true round trip (TCG): %v avg", time.Since(t0)/n)
	if err := c.CopyIn(ctx, agentproto.CopyInRequest{Path: "/root-file", Size: 5}, strings.NewReader("hello")); err != nil {
		t.Fatal(err)
	}
	logs, err := c.Logs(ctx)
	if err != nil || !strings.Contains(string(logs), "serving") {
		t.Fatalf("logs %q %v", logs, err)
	}
	t.Logf("agent log:\n%s", logs)
	t1 := time.Now()
	for i := 0; i < n; i++ {
		if _, err := c.Ping(ctx); err != nil {
			t.Fatal(err)
		}
	}
	t.Logf("ping round trip (TCG): %v avg", time.Since(t1)/n)
	if err := c.Shutdown(ctx); err != nil {
		t.Fatal(err)
	}
	select {
	case <-exited:
	case <-time.After(30 * time.Second):
		t.Fatal("qemu did not exit after shutdown")
	}
	if !strings.Contains(console.String(), "reboot: Power down") {
		t.Logf("console tail: %s", console.String()[max(0, console.Len()-500):])
	}
}

func cpuMHz() float64 {
	b, _ := os.ReadFile("/proc/cpuinfo")
	for _, line := range strings.Split(string(b), "\n") {
		if k, v, ok := strings.Cut(line, ":"); ok && strings.TrimSpace(k) == "cpu MHz" {
			f, _ := strconv.ParseFloat(strings.TrimSpace(v), 64)
			return f
		}
	}
	return 0
}
