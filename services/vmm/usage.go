package vmm

import (
	"encoding/binary"
	"fmt"
	"io"
	"os"
	"strings"
	"syscall"
)

// clockTicks is USER_HZ, the unit of /proc/<pid>/stat's CPU times: 100 on every Linux we run on.
const clockTicks = 100

// cpuSeconds is the user and system CPU time of process pid, from /proc; 0 when it is gone.
func cpuSeconds(pid int) float64 {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0
	}
	// The command name (field 2) is in parentheses and may hold spaces: count from after it.
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	if i < 0 {
		return 0
	}
	f := strings.Fields(s[i+1:])
	// f[0] is field 3 (state); utime and stime are fields 14 and 15.
	if len(f) < 13 {
		return 0
	}
	var utime, stime uint64
	fmt.Sscan(f[11], &utime)
	fmt.Sscan(f[12], &stime)
	return float64(utime+stime) / clockTicks
}

// diskUsage is what a qcow2 disk takes on the host (allocated blocks) and the virtual size its
// header gives the guest; zeros for what cannot be read.
func diskUsage(path string) (used, size int64) {
	if path == "" {
		return 0, 0
	}
	f, err := os.Open(path)
	if err != nil {
		return 0, 0
	}
	defer f.Close()
	if st, err := f.Stat(); err == nil {
		if sys, ok := st.Sys().(*syscall.Stat_t); ok {
			used = sys.Blocks * 512
		}
	}
	// qcow2 header: magic "QFI\xfb" at 0, the virtual size (big-endian u64) at 24.
	var hdr [32]byte
	if _, err := io.ReadFull(f, hdr[:]); err == nil && string(hdr[:4]) == "QFI\xfb" {
		size = int64(binary.BigEndian.Uint64(hdr[24:32]))
	}
	return used, size
}
