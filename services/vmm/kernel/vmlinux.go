package kernel

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
)

// compressed-payload magics inside a bzImage and the tool that decompresses each.
var payloads = []struct {
	magic []byte
	tool  []string
}{
	{[]byte{0xfd, '7', 'z', 'X', 'Z', 0x00}, []string{"xz", "-dc", "--single-stream"}},
	{[]byte{0x28, 0xb5, 0x2f, 0xfd}, []string{"zstd", "-dcq"}},
	{[]byte{0x1f, 0x8b, 0x08}, []string{"gzip", "-dc"}},
}

// extractVmlinux finds the compressed kernel inside a bzImage and writes the ELF it contains to
// dst. The first candidate offset that decompresses to an ELF wins.
func extractVmlinux(ctx context.Context, bzImage, dst string) error {
	data, err := os.ReadFile(bzImage)
	if err != nil {
		return err
	}
	for _, p := range payloads {
		if _, err := exec.LookPath(p.tool[0]); err != nil {
			continue
		}
		for off := 0; ; {
			i := bytes.Index(data[off:], p.magic)
			if i < 0 {
				break
			}
			off += i
			if err := decompressTo(ctx, p.tool, data[off:], dst); err == nil {
				return nil
			}
			off++
		}
	}
	return errors.New("kernel: no ELF payload found in bzImage")
}

func decompressTo(ctx context.Context, tool []string, in []byte, dst string) error {
	tmp, err := os.CreateTemp(filepath.Dir(dst), ".vmlinux-")
	if err != nil {
		return err
	}
	defer os.Remove(tmp.Name())
	cmd := exec.CommandContext(ctx, tool[0], tool[1:]...)
	cmd.Stdin = bytes.NewReader(in)
	cmd.Stdout = tmp
	runErr := cmd.Run() // gzip/zstd complain about trailing bytes after the stream: judge by content
	if err := tmp.Close(); err != nil {
		return err
	}
	head := make([]byte, 4)
	f, err := os.Open(tmp.Name())
	if err != nil {
		return err
	}
	_, rerr := f.Read(head)
	st, _ := f.Stat()
	f.Close()
	if rerr != nil || !bytes.Equal(head, []byte("\x7fELF")) || st.Size() < 1<<20 {
		return fmt.Errorf("kernel: payload is not a kernel ELF (%v)", runErr)
	}
	if err := os.Chmod(tmp.Name(), 0o644); err != nil {
		return err
	}
	return os.Rename(tmp.Name(), dst)
}
