package qemu

import (
	"bufio"
	"bytes"
	"strings"
	"testing"
)

func FuzzDecodeMessage(f *testing.F) {
	f.Add([]byte(`{"QMP": {"version": {"qemu": {"micro": 22, "minor": 2, "major": 7}}, "capabilities": ["oob"]}}`))
	f.Add([]byte(`{"return": {}, "id": "1"}`))
	f.Add([]byte(`{"error": {"class": "GenericError", "desc": "x"}, "id": "2"}`))
	f.Add([]byte(`{"timestamp": {"seconds": 1, "microseconds": 2}, "event": "STOP"}`))
	f.Add([]byte(`{"return": {}, "event": "X"}`))
	f.Fuzz(func(t *testing.T, b []byte) {
		m, err := decodeMessage(b)
		if err != nil {
			return
		}
		kinds := 0
		if m.QMP != nil {
			kinds++
		}
		if m.Return != nil || m.Error != nil {
			kinds++
		}
		if m.Event != "" {
			kinds++
		}
		if kinds != 1 {
			t.Fatalf("accepted a message of %d kinds: %s", kinds, b)
		}
	})
}

func TestReadLineBounded(t *testing.T) {
	long := strings.Repeat("x", maxQMPLine+10) + "\n"
	if _, err := readLine(bufio.NewReaderSize(strings.NewReader(long), 4096)); err == nil {
		t.Fatal("over-long line accepted")
	}
	l, err := readLine(bufio.NewReaderSize(bytes.NewReader([]byte("{\"a\":1}\nrest")), 16))
	if err != nil || string(l) != "{\"a\":1}\n" {
		t.Fatalf("line = %q, %v", l, err)
	}
}

func TestArgs(t *testing.T) {
	s := VMSpec{ID: "a", Dir: "/d", Kernel: "/k", Initrd: "/i", MemoryMiB: 256, VCPUs: 2, Disk: "/d/root.qcow2",
		ExtraDisks: []Disk{{Path: "/v.raw"}}}
	args := strings.Join(commandLine(&s, AccelTCG, "/dev/shm/x.ram", timeZero), " ")
	for _, bad := range []string{"netdev", "virtio-net", "pit=off", "pic=off", "-accel kvm"} {
		if strings.Contains(args, bad) {
			t.Errorf("args contain %q: %s", bad, args)
		}
	}
	for _, want := range []string{"-accel tcg,thread=multi", "-cpu max", "share=on", "memory-backend=mem", "-no-reboot", "-nodefaults",
		"virtserialport,chardev=agent,name=nexus.agent", "nexus.root=/dev/vda", "nexus.agentport=nexus.agent"} {
		if !strings.Contains(args, want) {
			t.Errorf("args lack %q: %s", want, args)
		}
	}
	if strings.Index(args, "drive=root") > strings.Index(args, "drive=disk0") {
		t.Error("root disk is not the first virtio-blk device")
	}
	s.NetSocket, s.Net = "/n.sock", &GuestNet{IP: "10.0.0.2/24", Gateway: "10.0.0.1", DNS: "10.0.0.1"}
	s.Mounts = []Mount{{HostPath: "/h", ReadOnly: true}}
	args = strings.Join(commandLine(&s, AccelKVM, "/dev/shm/x.ram", timeZero), " ")
	for _, want := range []string{"-netdev stream,id=net0,server=on,addr.type=unix,addr.path=/n.sock", "virtio-net-device,netdev=net0",
		"-accel kvm", "-cpu host", "security_model=none,readonly=on", "mount_tag=nexus0", "nexus.ip=10.0.0.2/24", "nexus.gw=10.0.0.1", "nexus.dns=10.0.0.1"} {
		if !strings.Contains(args, want) {
			t.Errorf("args lack %q: %s", want, args)
		}
	}
}
