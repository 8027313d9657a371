package agent

import (
	"encoding/binary"
	"fmt"
	"os"
	"path/filepath"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/IniZio/nexus/pkg/atomicfile"
)

// Reseed mixes seed into the kernel's input pool, credited as entropy (RNDADDENTROPY), and
// forces the kernel RNG to reseed from it (RNDRESEEDCRNG): a guest restored from a template
// otherwise draws /dev/urandom from the state every clone of that template shares.
func Reseed(seed []byte) error {
	f, err := os.OpenFile("/dev/urandom", os.O_WRONLY, 0)
	if err != nil {
		return err
	}
	defer f.Close()
	// struct rand_pool_info { int entropy_count; int buf_size; __u32 buf[]; }
	buf := make([]byte, 8+len(seed))
	binary.NativeEndian.PutUint32(buf[0:], uint32(len(seed)*8))
	binary.NativeEndian.PutUint32(buf[4:], uint32(len(seed)))
	copy(buf[8:], seed)
	if _, _, e := unix.Syscall(unix.SYS_IOCTL, f.Fd(), unix.RNDADDENTROPY, uintptr(unsafe.Pointer(&buf[0]))); e != 0 {
		return fmt.Errorf("RNDADDENTROPY: %w", e)
	}
	if _, _, e := unix.Syscall(unix.SYS_IOCTL, f.Fd(), unix.RNDRESEEDCRNG, 0); e != 0 {
		return fmt.Errorf("RNDRESEEDCRNG: %w", e)
	}
	return nil
}

// SetMachineID writes id to root's /etc/machine-id (and dbus's copy where the image has one).
// Not synced: configure writes it on every boot, so a crash that loses it is repaired by the
// next boot before anything runs, and a sync would add a disk flush (hundreds of ms on a loaded
// host) to every create.
func SetMachineID(root, id string) error {
	if err := os.MkdirAll(filepath.Join(root, "etc"), 0o755); err != nil {
		return err
	}
	if err := atomicfile.Replace(filepath.Join(root, "etc", "machine-id"), []byte(id+"\n"), 0o444); err != nil {
		return err
	}
	dbus := filepath.Join(root, "var", "lib", "dbus", "machine-id")
	if fi, err := os.Lstat(dbus); err == nil && fi.Mode().IsRegular() {
		return atomicfile.Replace(dbus, []byte(id+"\n"), 0o444)
	}
	return nil
}
