package qemu

import (
	"bufio"
	"context"
	"net"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/IniZio/nexus/services/vmm/hypervisor"
)

// TestDisksReportErrors: every disk hands write and read errors to the guest instead of pausing
// the VM (QEMU's default on ENOSPC, which got a full host disk's VMs killed as hung).
func TestDisksReportErrors(t *testing.T) {
	s := VMSpec{ID: "a", Dir: "/tmp/x", Kernel: "/k", Initrd: "/i", MemoryMiB: 256, VCPUs: 1, Disk: "/tmp/x/disk.qcow2",
		ExtraDisks: []Disk{{Path: "/tmp/x/v.img"}}}
	n := 0
	args := commandLine(&s, AccelTCG, "/dev/shm/r", time.Unix(0, 0))
	for i, a := range args {
		if a == "-drive" {
			n++
			if !strings.Contains(args[i+1], ",werror=report,rerror=report") {
				t.Errorf("drive %s does not report errors to the guest", args[i+1])
			}
		}
	}
	if n != 2 {
		t.Fatalf("%d drives, want 2: %v", n, args)
	}
}

// TestBlockIOErrorCounted: BLOCK_IO_ERROR events are counted, ENOSPC ones apart, and the last
// one's reason kept bounded.
func TestBlockIOErrorCounted(t *testing.T) {
	sock := filepath.Join(t.TempDir(), "qmp.sock")
	l, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	go func() {
		c, err := l.Accept()
		if err != nil {
			return
		}
		defer c.Close()
		c.Write([]byte(`{"QMP": {"version": {}, "capabilities": []}}` + "\n"))
		r := bufio.NewReader(c)
		line, _ := r.ReadString('\n')
		if strings.Contains(line, "qmp_capabilities") {
			c.Write([]byte(`{"return": {}, "id": "1"}` + "\n"))
		}
		for _, ev := range []string{
			`{"event": "BLOCK_IO_ERROR", "data": {"device": "", "node-name": "root", "operation": "write", "action": "report", "nospace": true, "reason": "No space left on device"}, "timestamp": {"seconds": 1, "microseconds": 0}}`,
			`{"event": "BLOCK_IO_ERROR", "data": {"device": "", "node-name": "disk0", "operation": "read", "action": "report", "reason": "Input/output error"}, "timestamp": {"seconds": 2, "microseconds": 0}}`,
			`{"event": "BLOCK_IO_ERROR", "data": "not an object"}`,
		} {
			c.Write([]byte(ev + "\n"))
		}
		r.ReadString('\n') // hold the connection until the client closes it
	}()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	q, err := DialQMP(ctx, sock)
	if err != nil {
		t.Fatal(err)
	}
	defer q.Close()
	deadline := time.Now().Add(5 * time.Second)
	for q.DiskErrors().Count < 2 && time.Now().Before(deadline) {
		time.Sleep(5 * time.Millisecond)
	}
	de := q.DiskErrors()
	if de.Count != 2 || de.NoSpace != 1 || de.Last != "disk0 read: Input/output error" || de.LastAt.Unix() != 2 {
		t.Fatalf("disk errors %+v", de)
	}
}

// TestFreePageReportingOnlyOnAVMNeverSaved: the balloon that reports free pages is on a VM
// that asks for it, never on a restore (QEMU 7.2 would punch the snapshot or template file).
func TestFreePageReportingOnlyOnAVMNeverSaved(t *testing.T) {
	has := func(s VMSpec) bool {
		return strings.Contains(strings.Join(commandLine(&s, AccelTCG, "/dev/shm/r", time.Unix(0, 0)), " "), "virtio-balloon-device,free-page-reporting=on")
	}
	base := VMSpec{ID: "a", Dir: "/tmp/x", Kernel: "/k", Initrd: "/i", MemoryMiB: 256, VCPUs: 1}
	if has(base) {
		t.Error("a VM that did not ask reports free pages")
	}
	on := base
	on.FreePageReporting = true
	if !has(on) {
		t.Error("a VM that asked does not report free pages")
	}
	on.Incoming = true
	if has(on) {
		t.Error("a restored VM reports free pages into its snapshot's file")
	}
	for _, tc := range []struct {
		mounts []Mount
		want   bool
	}{
		{nil, false},
		{[]Mount{{HostPath: "/h/.claude", Guest: "/root/.claude", Remount: true}}, false},
		{[]Mount{{HostPath: "/w", Guest: "/work"}}, true},
		{[]Mount{{HostPath: "/h/.claude", Guest: "/root/.claude", Remount: true}, {HostPath: "/w", Guest: "/work", Virtiofs: true}}, true},
	} {
		if got := hypervisor.ReportsFreePages(tc.mounts); got != tc.want {
			t.Errorf("ReportsFreePages(%+v) = %v, want %v", tc.mounts, got, tc.want)
		}
	}
}
