package qemu

import (
	"strings"
	"testing"
	"time"
)

func TestIncomingArgs(t *testing.T) {
	s := VMSpec{ID: "a", Dir: "/tmp/x", Kernel: "/k", Initrd: "/i", MemoryMiB: 256, VCPUs: 1, Disk: "/d.qcow2"}
	normal := strings.Join(commandLine(&s, AccelTCG, "/dev/shm/nexus-a.ram", time.Unix(0, 0)), " ")
	if !strings.Contains(normal, "mem-path=/dev/shm/nexus-a.ram,share=on") || strings.Contains(normal, "-incoming") {
		t.Fatalf("boot args: %s", normal)
	}
	s.Incoming = true
	in := strings.Join(commandLine(&s, AccelTCG, "/snap/ram", time.Unix(0, 0)), " ")
	if !strings.Contains(in, "mem-path=/snap/ram,share=off") || !strings.Contains(in, "-S -incoming defer") {
		t.Fatalf("restore args: %s", in)
	}
}
