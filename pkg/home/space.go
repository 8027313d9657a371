package home

import (
	"fmt"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/IniZio/nexus/pkg/errdefs"
)

// Space is the free and total size of the filesystem holding the home.
type Space struct {
	Free, Total uint64 // bytes; Free is what an unprivileged writer may still use
}

// Space reads the free space of the filesystem the home is on.
func (d Dir) Space() (Space, error) {
	var st unix.Statfs_t
	if err := unix.Statfs(string(d), &st); err != nil {
		return Space{}, fmt.Errorf("free space of %s: %w", d, err)
	}
	return Space{Free: st.Bavail * uint64(st.Bsize), Total: st.Blocks * uint64(st.Bsize)}, nil
}

// Watermark is the least free space the home must keep for new sandboxes to be admitted: an
// absolute size, a percentage of the filesystem, or both (the larger applies).
type Watermark struct {
	Bytes   uint64
	Percent float64
}

// DefaultWatermark is the low free-space watermark when none is set.
const DefaultWatermark = "1GiB"

// ParseWatermark reads "1GiB", "512MiB", "2G", "1073741824" or "5%".
func ParseWatermark(s string) (Watermark, error) {
	s = strings.TrimSpace(s)
	if p, ok := strings.CutSuffix(s, "%"); ok {
		f, err := strconv.ParseFloat(p, 64)
		if err != nil || f < 0 || f >= 100 {
			return Watermark{}, fmt.Errorf("%q is not a percentage below 100", s)
		}
		return Watermark{Percent: f}, nil
	}
	units := []struct {
		suffix string
		mult   uint64
	}{{"TiB", 1 << 40}, {"GiB", 1 << 30}, {"MiB", 1 << 20}, {"KiB", 1 << 10}, {"T", 1 << 40}, {"G", 1 << 30}, {"M", 1 << 20}, {"K", 1 << 10}, {"B", 1}}
	mult := uint64(1)
	for _, u := range units {
		if n, ok := strings.CutSuffix(s, u.suffix); ok {
			s, mult = strings.TrimSpace(n), u.mult
			break
		}
	}
	n, err := strconv.ParseUint(s, 10, 64)
	if err != nil || n > (1<<62)/mult {
		return Watermark{}, fmt.Errorf("%q is not a size such as 1GiB or a percentage such as 5%%", s)
	}
	return Watermark{Bytes: n * mult}, nil
}

// Min is the free space the watermark asks of a filesystem of total bytes.
func (w Watermark) Min(total uint64) uint64 {
	return max(w.Bytes, uint64(float64(total)*w.Percent/100))
}

func (w Watermark) String() string {
	switch {
	case w.Percent > 0 && w.Bytes > 0:
		return fmt.Sprintf("%s or %g%%", Bytes(w.Bytes), w.Percent)
	case w.Percent > 0:
		return fmt.Sprintf("%g%%", w.Percent)
	}
	return Bytes(w.Bytes)
}

// Low says whether sp is below the watermark.
func (w Watermark) Low(sp Space) bool { return sp.Free < w.Min(sp.Total) }

// ErrDiskFull is the start of every refusal for want of host disk: callers and tests match it.
const ErrDiskFull = "host disk full"

// CheckSpace refuses, as an unavailable error saying "host disk full", when the home's
// filesystem is below the watermark. A zero watermark never refuses; a statfs failure does not
// refuse either (the write that follows reports its own error).
func (d Dir) CheckSpace(w Watermark) error {
	if w == (Watermark{}) {
		return nil
	}
	sp, err := d.Space()
	if err != nil || !w.Low(sp) {
		return nil
	}
	return errdefs.Unavailable("%s: %s has %s free, below the low watermark of %s; new sandboxes are refused until space is freed",
		ErrDiskFull, d, Bytes(sp.Free), Bytes(w.Min(sp.Total)))
}

// Bytes formats a size for messages: 812 MiB, 1.5 GiB.
func Bytes(n uint64) string {
	switch {
	case n >= 1<<30:
		return strconv.FormatFloat(float64(n)/(1<<30), 'f', 1, 64) + " GiB"
	case n >= 1<<20:
		return strconv.FormatUint(n>>20, 10) + " MiB"
	case n >= 1<<10:
		return strconv.FormatUint(n>>10, 10) + " KiB"
	}
	return strconv.FormatUint(n, 10) + " B"
}
