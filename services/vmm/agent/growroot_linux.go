package agent

import (
	"fmt"
	"os"
	"unsafe"

	"golang.org/x/sys/unix"
)

// ext4ResizeFS is EXT4_IOC_RESIZE_FS, _IOW('f', 16, __u64): grow a mounted ext4 to a new
// block count (what resize2fs does online).
const ext4ResizeFS = 0x40086610

// growRoot grows the ext4 mounted at root to the size of its device dev: the host sizes the
// disk (--disk) and the base image's file system only fills its first part. Growing to the
// size it already has is a no-op in the kernel, so every boot asks.
func growRoot(dev, root string) error {
	d, err := os.Open(dev)
	if err != nil {
		return err
	}
	defer d.Close()
	devBytes, err := unix.IoctlGetUint64(int(d.Fd()), unix.BLKGETSIZE64)
	if err != nil {
		return fmt.Errorf("size of %s: %w", dev, err)
	}
	var st unix.Statfs_t
	if err := unix.Statfs(root, &st); err != nil {
		return err
	}
	if st.Type != unix.EXT4_SUPER_MAGIC || st.Bsize <= 0 {
		return nil // only ext4 is grown
	}
	blocks := devBytes / uint64(st.Bsize)
	r, err := os.Open(root)
	if err != nil {
		return err
	}
	defer r.Close()
	if _, _, errno := unix.Syscall(unix.SYS_IOCTL, r.Fd(), ext4ResizeFS, uintptr(unsafe.Pointer(&blocks))); errno != 0 {
		return fmt.Errorf("grow %s to %d blocks: %w", root, blocks, errno)
	}
	return nil
}
