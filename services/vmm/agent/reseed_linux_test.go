package agent

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/IniZio/nexus/pkg/agentproto"
)

// configure reseeds before anything else and writes the machine id; it bounds the seed and
// refuses a machine id that is not 32 hex digits, without calling either.
func TestConfigureReseedAndMachineID(t *testing.T) {
	var seeded []byte
	var id string
	s, _ := New(Config{Reseed: func(b []byte) error { seeded = b; return nil }, SetMachineID: func(v string) error { id = v; return nil }})
	if err := s.configure(&agentproto.ConfigureRequest{Seed: []byte("0123456789abcdef"), MachineID: "0123456789abcdef0123456789abcdef"}); err != nil {
		t.Fatal(err)
	}
	if string(seeded) != "0123456789abcdef" || id != "0123456789abcdef0123456789abcdef" {
		t.Fatalf("seeded %q, machine id %q", seeded, id)
	}
	seeded, id = nil, ""
	for _, bad := range []agentproto.ConfigureRequest{
		{Seed: make([]byte, agentproto.MaxSeedBytes+1)},
		{MachineID: "../../etc/passwd"},
		{MachineID: "0123456789ABCDEF0123456789ABCDEF"},
	} {
		if err := s.configure(&bad); err == nil {
			t.Errorf("configure accepted seed of %d bytes, machine id %q", len(bad.Seed), bad.MachineID)
		}
	}
	if seeded != nil || id != "" {
		t.Fatalf("a refused configure still reseeded (%d bytes) or set the machine id %q", len(seeded), id)
	}
}

func TestSetMachineID(t *testing.T) {
	root := t.TempDir()
	os.MkdirAll(filepath.Join(root, "var/lib/dbus"), 0o755)
	os.WriteFile(filepath.Join(root, "var/lib/dbus/machine-id"), []byte("old\n"), 0o444)
	if err := SetMachineID(root, "0123456789abcdef0123456789abcdef"); err != nil {
		t.Fatal(err)
	}
	for _, p := range []string{"etc/machine-id", "var/lib/dbus/machine-id"} {
		if b, _ := os.ReadFile(filepath.Join(root, p)); string(b) != "0123456789abcdef0123456789abcdef\n" {
			t.Errorf("%s: %q", p, b)
		}
	}
}
