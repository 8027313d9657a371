package agent

import (
	"bufio"
	"os"
	"strconv"
	"strings"
)

// cpuTicks reads the aggregate "cpu" line of /proc/stat: busy ticks (all but idle and iowait)
// and all ticks; zeros when it cannot be read.
func cpuTicks() (busy, total uint64) {
	f, err := os.Open("/proc/stat")
	if err != nil {
		return 0, 0
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	if !sc.Scan() {
		return 0, 0
	}
	return parseCPULine(sc.Text())
}

// parseCPULine parses "cpu  user nice system idle iowait irq softirq steal guest guest_nice".
// guest and guest_nice are already inside user and nice, so they are not added again.
func parseCPULine(line string) (busy, total uint64) {
	f := strings.Fields(line)
	if len(f) < 5 || f[0] != "cpu" {
		return 0, 0
	}
	for i, v := range f[1:] {
		if i >= 8 { // guest, guest_nice
			break
		}
		n, err := strconv.ParseUint(v, 10, 64)
		if err != nil {
			return 0, 0
		}
		total += n
		if i != 3 && i != 4 { // idle, iowait
			busy += n
		}
	}
	return busy, total
}

// memUsed reads /proc/meminfo: the bytes in use (MemTotal - MemAvailable, what `free` calls
// used plus what the kernel cannot reclaim) and MemTotal; zeros when it cannot be read.
func memUsed() (used, total uint64) {
	b, err := os.ReadFile("/proc/meminfo")
	if err != nil {
		return 0, 0
	}
	return parseMeminfo(string(b))
}

func parseMeminfo(s string) (used, total uint64) {
	var avail uint64
	var haveAvail bool
	for _, line := range strings.Split(s, "\n") {
		k, v, ok := strings.Cut(line, ":")
		if !ok {
			continue
		}
		f := strings.Fields(v)
		if len(f) == 0 {
			continue
		}
		n, err := strconv.ParseUint(f[0], 10, 64)
		if err != nil {
			continue
		}
		switch k {
		case "MemTotal":
			total = n << 10
		case "MemAvailable":
			avail, haveAvail = n<<10, true
		}
	}
	if total == 0 || !haveAvail || avail > total {
		return 0, total
	}
	return total - avail, total
}
