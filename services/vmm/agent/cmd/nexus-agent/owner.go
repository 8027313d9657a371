package main

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"

	"github.com/IniZio/nexus/pkg/agentproto"
)

// Bounds of `nexus-agent owner`.
const (
	maxOwnerProcs   = 4096
	maxOwnerFDs     = 4096
	maxOwnerCmdline = 4 << 10
)

// owner is `nexus-agent owner tcp|udp PORT`: it prints the pid and command line of the guest
// process whose socket has local port PORT (the gateway asks, to show which process an egress
// request came from). Nothing is printed, and it exits 1, when no process has it.
func owner(args []string) error {
	if len(args) != 2 || (args[0] != "tcp" && args[0] != "udp") {
		return errors.New("usage: nexus-agent owner tcp|udp PORT")
	}
	port, err := strconv.ParseUint(args[1], 10, 16)
	if err != nil || port == 0 {
		return fmt.Errorf("owner: bad port %.20q", args[1])
	}
	var ino uint64
	for _, f := range []string{"/proc/net/" + args[0], "/proc/net/" + args[0] + "6"} {
		if data, err := readHead(f, 4<<20); err == nil {
			if ino = agentproto.SocketInode(data, uint16(port)); ino != 0 {
				break
			}
		}
	}
	if ino == 0 {
		return fmt.Errorf("owner: no %s socket has port %d", args[0], port)
	}
	want := "socket:[" + strconv.FormatUint(ino, 10) + "]"
	procs, _ := os.ReadDir("/proc")
	for i, p := range procs {
		if i >= maxOwnerProcs {
			break
		}
		pid, err := strconv.Atoi(p.Name())
		if err != nil {
			continue
		}
		fds, _ := os.ReadDir(filepath.Join("/proc", p.Name(), "fd"))
		for j, fd := range fds {
			if j >= maxOwnerFDs {
				break
			}
			if l, err := os.Readlink(filepath.Join("/proc", p.Name(), "fd", fd.Name())); err == nil && l == want {
				cmd, _ := readHead(filepath.Join("/proc", p.Name(), "cmdline"), maxOwnerCmdline)
				fmt.Printf("%d %s\n", pid, bytes.TrimSpace(bytes.ReplaceAll(cmd, []byte{0}, []byte{' '})))
				return nil
			}
		}
	}
	return fmt.Errorf("owner: no process holds %s port %d", args[0], port)
}

// readHead reads at most max bytes of a file.
func readHead(path string, max int64) ([]byte, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	return io.ReadAll(io.LimitReader(f, max))
}
