package vmm

import "testing"

// The microvm's "no PCI" line, printed at every boot, is not in the console log a user reads;
// the rest is, and a noise line cut by the chunk's end is left alone.
func TestQuietConsole(t *testing.T) {
	in := "[    0.101000] smpboot: CPU0\r\n[    0.210000] PCI: Fatal: No config space access function found\r\n[    0.3] ok\r\n"
	if got, want := string(quietConsole([]byte(in))), "[    0.101000] smpboot: CPU0\r\n[    0.3] ok\r\n"; got != want {
		t.Errorf("quietConsole: %q, want %q", got, want)
	}
	cut := "a\nPCI: Fatal: No config space access function found"
	if got := string(quietConsole([]byte(cut))); got != cut {
		t.Errorf("a cut line: %q", got)
	}
}
