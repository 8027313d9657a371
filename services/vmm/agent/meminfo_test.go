package agent

import "testing"

func TestParseMeminfo(t *testing.T) {
	for _, c := range []struct {
		in          string
		used, total uint64
	}{
		{"MemTotal:        1000 kB\nMemFree:          100 kB\nMemAvailable:     600 kB\n", 400 << 10, 1000 << 10},
		{"MemTotal:        1000 kB\nMemFree:          100 kB\n", 0, 1000 << 10}, // no MemAvailable: unknown
		{"MemTotal: 10 kB\nMemAvailable: 20 kB\n", 0, 10 << 10},                 // nonsense: unknown
		{"", 0, 0},
	} {
		if used, total := parseMeminfo(c.in); used != c.used || total != c.total {
			t.Errorf("parseMeminfo(%q) = %d, %d; want %d, %d", c.in, used, total, c.used, c.total)
		}
	}
}
