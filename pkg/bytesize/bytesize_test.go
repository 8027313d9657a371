package bytesize

import "testing"

func TestParseMiB(t *testing.T) {
	for _, c := range []struct {
		in   string
		want int
		bad  bool
	}{
		{in: "1024", want: 1024},
		{in: "512m", want: 512},
		{in: "512M", want: 512},
		{in: "512MiB", want: 512},
		{in: "512mb", want: 512},
		{in: "4g", want: 4096},
		{in: "4G", want: 4096},
		{in: "4GiB", want: 4096},
		{in: "1.5g", want: 1536},
		{in: "1t", want: 1 << 20},
		{in: "1048576k", want: 1024},
		{in: "0", want: 0},
		{in: "", bad: true},
		{in: "g", bad: true},
		{in: "4x", bad: true},
		{in: "-4g", bad: true},
		{in: "1e3", bad: true},
		{in: "0x10", bad: true},
		{in: "4gg", bad: true},
		{in: "4ig", bad: true},
		{in: "1k", bad: true}, // not a whole MiB
		{in: "NaN", bad: true},
		{in: "Inf", bad: true},
		{in: "99999999999t", bad: true},
	} {
		got, err := ParseMiB(c.in)
		if c.bad {
			if err == nil {
				t.Errorf("ParseMiB(%q) = %d, want an error", c.in, got)
			}
			continue
		}
		if err != nil || got != c.want {
			t.Errorf("ParseMiB(%q) = %d, %v; want %d", c.in, got, err, c.want)
		}
	}
}

func FuzzParse(f *testing.F) {
	for _, s := range []string{"1024", "4g", "1.5GiB", "7b", "x"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		if v, err := Parse(s, MiB); err == nil && v < 0 {
			t.Fatalf("Parse(%q) = %d", s, v)
		}
	})
}
