// Package bytesize reads the sizes users type: 512m, 4g, 1.5GiB, 8192 (in a default unit).
package bytesize

import (
	"fmt"
	"math"
	"strconv"
	"strings"
)

// Units, binary as everywhere in nexus: 1m is 1 MiB.
const (
	B   int64 = 1
	KiB       = 1 << 10
	MiB       = 1 << 20
	GiB       = 1 << 30
	TiB       = 1 << 40
)

// Parse reads s as a size in bytes. A bare number is in unit; k, m, g and t (any case, with an
// optional i and b: 4g, 4G, 4GiB, 4gb) are binary multiples; fractions are allowed (1.5g).
func Parse(s string, unit int64) (int64, error) {
	t := strings.ToLower(strings.TrimSpace(s))
	num := strings.TrimRight(t, "kmgtib")
	suffix := strings.TrimSuffix(strings.TrimSuffix(t[len(num):], "b"), "i")
	mult := unit
	switch suffix {
	case "":
		if t != num { // just "b" or "ib"
			mult = B
			if strings.HasSuffix(t, "ib") {
				return 0, bad(s)
			}
		}
	case "k":
		mult = KiB
	case "m":
		mult = MiB
	case "g":
		mult = GiB
	case "t":
		mult = TiB
	default:
		return 0, bad(s)
	}
	f, err := strconv.ParseFloat(num, 64)
	if err != nil || f < 0 || math.IsInf(f, 0) || math.IsNaN(f) || strings.ContainsAny(num, "eEx_") {
		return 0, bad(s)
	}
	v := f * float64(mult)
	if v > math.MaxInt64/2 {
		return 0, fmt.Errorf("size %q is too large", s)
	}
	return int64(v), nil
}

// ParseMiB reads s as a whole number of MiB (a bare number is MiB).
func ParseMiB(s string) (int, error) {
	b, err := Parse(s, MiB)
	if err != nil {
		return 0, err
	}
	if b%MiB != 0 {
		return 0, fmt.Errorf("size %q is not a whole number of MiB", s)
	}
	return int(b / MiB), nil
}

func bad(s string) error {
	return fmt.Errorf("%q is not a size: use a number of MiB or a unit, as in 512m or 4g", s)
}
