// Package initramfs builds the guest's initial ramdisk: the agent as /init, the kernel modules it
// loads, and /etc/nexus/modules listing them in load order (DESIGN §4).
//
// The archive is a plain newc cpio written by our own deterministic writer, so the same
// inputs always give the same bytes. Build names its output by a hash of its inputs (agent binary,
// kernel version, module list) and returns an existing file without rebuilding. Modules go in
// uncompressed and without their signatures, so the guest spends no emulated CPU on either.
package initramfs

import (
	"bufio"
	"bytes"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"slices"
	"strings"

	"github.com/IniZio/nexus/pkg/agentproto"
	"github.com/IniZio/nexus/services/vmm/kernel"
)

// DefaultModules are the modules a nexus guest needs; built-in ones are skipped at build time.
var DefaultModules = []string{
	"virtio_mmio", "virtio_blk", "virtio_net", "virtio_console",
	"9p", "9pnet_virtio", "virtiofs", "virtio_balloon", "overlay",
	"vsock", "vmw_vsock_virtio_transport", "vsock_loopback",
	"crc32c_generic", "ext4", "af_packet",
}

// SharesModules are the modules only a guest with host shares to mount (9p, virtiofs) loads:
// under emulation they cost a guest without shares some 70 ms of boot. virtio_balloon is among
// them: only a VM with a live mount reports its free pages (hypervisor.ReportsFreePages).
var SharesModules = []string{"9p", "9pnet_virtio", "virtiofs", "virtio_balloon"}

// ModuleListPath is where the guest finds absolute module paths in load order, one per line;
// those after the agentproto.SharesModulesMarker line only when it has host shares.
const ModuleListPath = "etc/nexus/modules"

// maxAgentSize bounds what we read as the agent binary.
const maxAgentSize = 256 << 20

// Build writes an initramfs for k with agentPath as /init and the named modules (plus their
// dependencies) into outDir and returns its path. An archive for the same inputs is reused.
func Build(k *kernel.Kernel, agentPath string, modules []string, outDir string) (string, error) {
	agent, err := readAgent(agentPath)
	if err != nil {
		return "", err
	}
	sections, err := splitModules(k, modules)
	if err != nil {
		return "", fmt.Errorf("initramfs: %w", err)
	}
	h := sha256.New()
	fmt.Fprintf(h, "nexus-initramfs-v3\nkernel %s\n", k.Version)
	agentSum := sha256.Sum256(agent)
	fmt.Fprintf(h, "agent %x\n", agentSum)
	for _, sec := range sections {
		fmt.Fprintf(h, "section %s\n", sec.marker)
		for _, m := range sec.modules {
			fmt.Fprintf(h, "module %s\n", m.Path)
		}
	}
	key := hex.EncodeToString(h.Sum(nil))[:20]
	out := filepath.Join(outDir, "initramfs-"+key+".cpio")
	if _, err := os.Stat(out); err == nil {
		return out, nil
	}

	a := NewArchive()
	base := []struct {
		name string
		perm os.FileMode
	}{
		{"dev", 0o755}, {"proc", 0o555}, {"sys", 0o555}, {"run", 0o755}, {"tmp", 0o777 | os.ModeSticky},
		{"mnt", 0o755}, {"root", 0o700}, {"etc/nexus", 0o755},
	}
	for _, d := range base {
		if err := a.Dir(d.name, d.perm); err != nil {
			return "", err
		}
	}
	// The kernel opens /dev/console for init's stdio before devtmpfs exists.
	if err := a.CharDev("dev/console", 0o600, 5, 1); err != nil {
		return "", err
	}
	if err := a.File("init", 0o755, agent); err != nil {
		return "", err
	}
	var list strings.Builder
	for _, sec := range sections {
		if sec.marker != "" {
			list.WriteString(sec.marker + "\n")
		}
		for _, m := range sec.modules {
			data, rel, err := readModule(k.ModulesDir, m.Path)
			if err != nil {
				return "", err
			}
			dst := path.Join("lib/modules", k.Version, rel)
			if err := a.File(dst, 0o644, data); err != nil {
				return "", err
			}
			list.WriteString("/" + dst + "\n")
		}
	}
	if err := a.File(ModuleListPath, 0o644, []byte(list.String())); err != nil {
		return "", err
	}
	if err := writeArchive(a, out); err != nil {
		return "", err
	}
	return out, nil
}

// moduleSection is a part of the module list: its marker line ("" for the first) and its
// modules in load order.
type moduleSection struct {
	marker  string
	modules []kernel.Module
}

// splitModules resolves modules into the sections of the list: those every guest loads, then
// the SharesModules (less what the first section already loads), each in load order.
func splitModules(k *kernel.Kernel, modules []string) ([]moduleSection, error) {
	var always, shares []string
	for _, m := range modules {
		if slices.Contains(SharesModules, m) {
			shares = append(shares, m)
		} else {
			always = append(always, m)
		}
	}
	sections := []moduleSection{{marker: ""}, {marker: agentproto.SharesModulesMarker}}
	seen := map[string]bool{}
	for i, names := range [][]string{always, shares} {
		mods, err := k.Resolve(names)
		if err != nil {
			return nil, err
		}
		for _, m := range mods {
			if !seen[m.Path] {
				seen[m.Path] = true
				sections[i].modules = append(sections[i].modules, m)
			}
		}
	}
	return sections, nil
}

// BuildProbe writes the accelerator-probe initramfs (ProbeInit as /init) into outDir.
func BuildProbe(outDir string) (string, error) { return buildInit(outDir, "probe", ProbeInit()) }

// BuildSleeper writes the initramfs whose /init only sleeps (SleepInit) into outDir.
func BuildSleeper(outDir string) (string, error) { return buildInit(outDir, "sleep", SleepInit()) }

// buildInit writes an initramfs of /dev/console and init as /init into outDir, named after
// prefix and init's hash.
func buildInit(outDir, prefix string, init []byte) (string, error) {
	a := NewArchive()
	if err := a.Dir("dev", 0o755); err != nil {
		return "", err
	}
	if err := a.CharDev("dev/console", 0o600, 5, 1); err != nil {
		return "", err
	}
	if err := a.File("init", 0o755, init); err != nil {
		return "", err
	}
	sum := sha256.Sum256(init)
	out := filepath.Join(outDir, prefix+"-"+hex.EncodeToString(sum[:])[:16]+".cpio")
	if _, err := os.Stat(out); err == nil {
		return out, nil
	}
	return out, writeArchive(a, out)
}

func readAgent(p string) ([]byte, error) {
	f, err := os.Open(p)
	if err != nil {
		return nil, fmt.Errorf("initramfs: agent: %w", err)
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return nil, fmt.Errorf("initramfs: agent: %w", err)
	}
	if !st.Mode().IsRegular() || st.Size() == 0 || st.Size() > maxAgentSize {
		return nil, fmt.Errorf("initramfs: agent %s: not a regular file of 1 byte to %d MiB", p, maxAgentSize>>20)
	}
	b, err := io.ReadAll(io.LimitReader(f, maxAgentSize))
	if err != nil {
		return nil, fmt.Errorf("initramfs: agent: %w", err)
	}
	if !bytes.HasPrefix(b, []byte("\x7fELF")) {
		return nil, fmt.Errorf("initramfs: agent %s is not an ELF executable", p)
	}
	return b, nil
}

// readModule returns an uncompressed module and its path relative to the modules dir ending in
// .ko: the guest loads it with finit_module, which takes no compressed input on every kernel.
func readModule(modulesDir, rel string) ([]byte, string, error) {
	if strings.Contains(rel, "..") || path.IsAbs(rel) {
		return nil, "", fmt.Errorf("initramfs: bad module path %q", rel)
	}
	src := filepath.Join(modulesDir, filepath.FromSlash(rel))
	var tool string
	switch {
	case strings.HasSuffix(rel, ".ko"):
		b, err := os.ReadFile(src)
		if err != nil {
			return nil, "", fmt.Errorf("initramfs: module: %w", err)
		}
		return stripSignature(b), rel, nil
	case strings.HasSuffix(rel, ".ko.xz"):
		tool = "xz"
	case strings.HasSuffix(rel, ".ko.zst"):
		tool = "zstd"
	case strings.HasSuffix(rel, ".ko.gz"):
		tool = "gzip"
	default:
		return nil, "", fmt.Errorf("initramfs: module %s: unknown file type", rel)
	}
	var stderr bytes.Buffer
	cmd := exec.Command(tool, "-dc", src)
	cmd.Stderr = &stderr
	b, err := cmd.Output()
	if err != nil {
		return nil, "", fmt.Errorf("initramfs: decompress %s with %s: %w: %s", rel, tool, err, strings.TrimSpace(stderr.String()))
	}
	return stripSignature(b), rel[:strings.LastIndex(rel, ".ko")+3], nil
}

// moduleSigMagic ends a signed module: [signature][module_signature, 12 bytes][magic].
const moduleSigMagic = "~Module signature appended~\n"

// stripSignature drops a module's appended signature. The guest kernel does not enforce
// signatures, and checking one (SHA-256 over the module and an RSA verify) costs tens of
// milliseconds per module under emulation; unsigned, the kernel loads it at once (and notes the
// taint once).
func stripSignature(b []byte) []byte {
	if !bytes.HasSuffix(b, []byte(moduleSigMagic)) {
		return b
	}
	end := len(b) - len(moduleSigMagic)
	if end < 12 {
		return b
	}
	info := b[end-12 : end]
	sigLen := int(binary.BigEndian.Uint32(info[8:12]))
	start := end - 12 - sigLen
	if sigLen <= 0 || start < 0 {
		return b
	}
	return b[:start]
}

// writeArchive writes the archive to out via a temp file and rename. It is not compressed: QEMU
// copies it into guest memory at host speed, while inflating it would cost the guest's kernel
// about 200 ms of emulated CPU on every boot (8 MiB plain against 2.7 MiB gzipped).
func writeArchive(a *Archive, out string) error {
	if err := os.MkdirAll(filepath.Dir(out), 0o755); err != nil {
		return fmt.Errorf("initramfs: %w", err)
	}
	f, err := os.CreateTemp(filepath.Dir(out), ".initramfs-*.tmp")
	if err != nil {
		return fmt.Errorf("initramfs: %w", err)
	}
	defer os.Remove(f.Name()) // no-op after the rename
	bw := bufio.NewWriterSize(f, 1<<20)
	if _, err := a.WriteTo(bw); err != nil {
		f.Close()
		return fmt.Errorf("initramfs: write: %w", err)
	}
	err = errors.Join(bw.Flush(), f.Sync(), f.Chmod(0o644), f.Close())
	if err != nil {
		return fmt.Errorf("initramfs: write: %w", err)
	}
	if err := os.Rename(f.Name(), out); err != nil {
		return fmt.Errorf("initramfs: %w", err)
	}
	return nil
}
