package qemu

import (
	"strings"
	"testing"
	"time"
)

// TestNetdevArgs: NetdevArgs replace the -netdev stream arguments; the NIC stays on net0.
func TestNetdevArgs(t *testing.T) {
	s := VMSpec{ID: "a", Dir: "/tmp/x", Kernel: "/k", Initrd: "/i", MemoryMiB: 256, VCPUs: 1, NetSocket: "/tmp/x/net.sock"}
	stream := strings.Join(commandLine(&s, AccelTCG, "/dev/shm/r", time.Unix(0, 0)), " ")
	if !strings.Contains(stream, "-netdev stream,id=net0,server=on,addr.type=unix,addr.path=/tmp/x/net.sock -device virtio-net-device,netdev=net0,") {
		t.Fatalf("stream args: %s", stream)
	}
	s.NetSocket, s.NetdevArgs = "", []string{"-netdev", "user,id=net0"}
	user := strings.Join(commandLine(&s, AccelTCG, "/dev/shm/r", time.Unix(0, 0)), " ")
	if !strings.Contains(user, "-netdev user,id=net0 -device virtio-net-device,netdev=net0,") || strings.Contains(user, "stream") {
		t.Fatalf("user args: %s", user)
	}
	s.NetdevArgs = nil
	if none := strings.Join(commandLine(&s, AccelTCG, "/dev/shm/r", time.Unix(0, 0)), " "); strings.Contains(none, "-netdev") {
		t.Fatalf("no NIC expected: %s", none)
	}
}
