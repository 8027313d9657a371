package portfwd

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
)

// hostHolder names what holds a host port that could not be bound: "host process <pid>
// (<command>)" when /proc shows it, "a host process" when it belongs to a process we cannot
// see, or the bind error when it was not "address in use".
func hostHolder(port uint16, bindErr error) string {
	if !errors.Is(bindErr, syscall.EADDRINUSE) {
		return "host: " + bindErr.Error()
	}
	inodes := map[string]bool{}
	for _, f := range []string{"/proc/net/tcp", "/proc/net/tcp6"} {
		b, err := os.ReadFile(f)
		if err != nil {
			continue
		}
		for _, ino := range listeningInodes(b, port) {
			inodes[ino] = true
		}
	}
	if len(inodes) == 0 {
		return "a host process"
	}
	if pid, comm, ok := socketOwner(inodes); ok {
		return fmt.Sprintf("host process %d (%s)", pid, comm)
	}
	return "a host process"
}

// listeningInodes returns the socket inodes listening (state 0A) on port in the text of
// /proc/net/tcp or /proc/net/tcp6.
func listeningInodes(data []byte, port uint16) []string {
	var out []string
	want := fmt.Sprintf(":%04X", port)
	sc := bufio.NewScanner(bytes.NewReader(data))
	first := true
	for sc.Scan() {
		if first {
			first = false
			continue
		}
		f := strings.Fields(sc.Text())
		if len(f) < 10 || f[3] != "0A" || !strings.HasSuffix(f[1], want) {
			continue
		}
		out = append(out, f[9])
	}
	return out
}

// socketOwner finds a process with an open fd on one of the socket inodes.
func socketOwner(inodes map[string]bool) (int, string, bool) {
	procs, _ := filepath.Glob("/proc/[0-9]*")
	for _, p := range procs {
		pid, err := strconv.Atoi(filepath.Base(p))
		if err != nil {
			continue
		}
		fds, err := os.ReadDir(filepath.Join(p, "fd"))
		if err != nil {
			continue
		}
		for _, fd := range fds {
			link, err := os.Readlink(filepath.Join(p, "fd", fd.Name()))
			if err != nil || !strings.HasPrefix(link, "socket:[") {
				continue
			}
			if inodes[strings.TrimSuffix(strings.TrimPrefix(link, "socket:["), "]")] {
				comm, _ := os.ReadFile(filepath.Join(p, "comm"))
				return pid, strings.TrimSpace(string(comm)), true
			}
		}
	}
	return 0, "", false
}
