package agent

import "testing"

func TestParseCPULine(t *testing.T) {
	busy, total := parseCPULine("cpu  10 2 3 100 5 1 1 0 7 0")
	if busy != 17 || total != 122 {
		t.Fatalf("busy %d total %d, want 17 and 122", busy, total)
	}
	if b, tt := parseCPULine("cpu0 1 2 3 4"); b != 0 || tt != 0 {
		t.Fatalf("a per-CPU line: %d %d", b, tt)
	}
	if b, tt := parseCPULine("cpu 1 x 3 4 5"); b != 0 || tt != 0 {
		t.Fatalf("a bad line: %d %d", b, tt)
	}
	if b, tt := cpuTicks(); tt == 0 || b > tt {
		t.Fatalf("this host's /proc/stat: busy %d total %d", b, tt)
	}
}
