package vmm

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	api "github.com/IniZio/nexus/pkg/api/vmm"
	"github.com/IniZio/nexus/pkg/home"
	"github.com/IniZio/nexus/services/vmm/image"
	"github.com/IniZio/nexus/services/vmm/kernel"
)

// What cannot be restored from a template says why; the profile's remountable share counts in
// the shape.
func TestShapeOf(t *testing.T) {
	base := api.StartRequest{MemoryMiB: 256, VCPUs: 1, NetSocket: "/x/net.sock"}
	sh, why := shapeOf(base)
	if why != "" || sh != (api.TemplateShape{MemoryMiB: 256, VCPUs: 1, Net: true}) {
		t.Fatalf("plain: %+v %q", sh, why)
	}
	r := base
	r.Mounts = []api.Mount{{Host: "/h/.claude", Guest: "/root/.claude", Remount: true}}
	if sh, why := shapeOf(r); why != "" || sh.Shares != 1 {
		t.Fatalf("profile share: %+v %q", sh, why)
	}
	r.Mounts = append(r.Mounts, api.Mount{Host: "/src", Guest: "/work"})
	if _, why := shapeOf(r); !strings.Contains(why, "/work") {
		t.Fatalf("--mount: %q", why)
	}
	r = base
	r.Volumes = []api.Volume{{Name: "cache", Guest: "/cache"}}
	if _, why := shapeOf(r); why == "" {
		t.Fatal("a named volume was not refused")
	}
}

// The key changes with every input of the saved guest and with the shape, and with nothing else.
func TestTemplateKey(t *testing.T) {
	dir := t.TempDir()
	base := filepath.Join(dir, "rootfs.ext4")
	os.WriteFile(base, []byte("image"), 0o600)
	drv := &cmdlineDriver{cmdline: "console=ttyS0 tsc=reliable"}
	s := &Service{cfg: Config{Home: home.Dir(dir), Version: "v1"}, drv: drv}
	b := &boot{s: s, kern: &kernel.Kernel{Version: "6.1", VmlinuxPath: "/k/vmlinux"}, initrd: "/c/initramfs-aa.cpio"}
	img := &image.Info{Key: "nexus-mini", Path: base, Built: time.Unix(1, 0)}
	sh := api.TemplateShape{MemoryMiB: 256, VCPUs: 1, Net: true}
	key := s.templateKey(b, img, sh)
	if again := s.templateKey(b, img, sh); again != key || len(key) != 32 {
		t.Fatalf("key %q then %q", key, again)
	}
	changes := map[string]func(){
		"nexus version": func() { s.cfg.Version = "v2" },
		"initramfs":     func() { b.initrd = "/c/initramfs-bb.cpio" },
		"kernel":        func() { b.kern = &kernel.Kernel{Version: "6.2", VmlinuxPath: "/k/vmlinux"} },
		"image build":   func() { img.Built = time.Unix(2, 0) },
		"image file":    func() { os.WriteFile(base, []byte("image, rebuilt"), 0o600) },
		"memory":        func() { sh.MemoryMiB = 512 },
		"shares":        func() { sh.Shares = 1 },
		"no NIC":        func() { sh.Net = false },
		"guest cmdline": func() { drv.cmdline = "console=ttyS0" },
	}
	seen := map[string]string{key: "first"}
	for what, change := range changes {
		change()
		k := s.templateKey(b, img, sh)
		if prev, dup := seen[k]; dup {
			t.Errorf("changing the %s left the key as after %s", what, prev)
		}
		seen[k] = what
	}
}

// cmdlineDriver is a Driver whose guests all boot with cmdline (nothing else of it is called).
type cmdlineDriver struct {
	Driver
	cmdline string
}

func (d *cmdlineDriver) GuestCmdline() string { return d.cmdline }

// A template a sandbox's disk is backed by is not removed; once it is gone, it is.
func TestRemoveTemplateKeepsUsed(t *testing.T) {
	dir := t.TempDir()
	s := &Service{cfg: Config{Home: home.Dir(dir)}}
	tdir := filepath.Join(s.cfg.Home.Templates(), "k1")
	os.MkdirAll(tdir, 0o700)
	os.WriteFile(templateRecordFile(tdir), []byte(`{"info":{"key":"k1","image":"nexus-mini"}}`), 0o600)
	sb := s.cfg.Home.Sandbox("sb1")
	os.MkdirAll(sb, 0o700)
	os.WriteFile(filepath.Join(sb, templateFile), []byte("k1\n"), 0o600)
	if s.removeTemplate("k1") {
		t.Fatal("a template in use was removed")
	}
	if _, err := os.Stat(tdir); err != nil {
		t.Fatal(err)
	}
	os.RemoveAll(sb)
	if !s.removeTemplate("k1") {
		t.Fatal("an unused template was kept")
	}
	if left, _ := filepath.Glob(filepath.Join(s.cfg.Home.Templates(), "*")); len(left) != 0 {
		t.Fatalf("left behind: %v", left)
	}
}

// A damaged template (a file missing or cut short) is not restored.
func TestReadTemplateDamaged(t *testing.T) {
	dir := t.TempDir()
	os.WriteFile(templateRecordFile(dir), []byte(`{"info":{"key":"k"},"snapshot":{"memory_mib":1,"ram_bytes":1048576,"state_bytes":3,"disk_bytes":3}}`), 0o600)
	os.WriteFile(stateFile(dir), []byte("abc"), 0o600)
	os.WriteFile(diskFile(dir), []byte("abc"), 0o600)
	if _, err := readTemplate(dir); err == nil || !strings.Contains(err.Error(), "RAM") {
		t.Fatalf("no RAM file: %v", err)
	}
	os.WriteFile(ramFile(dir), make([]byte, 1<<20), 0o600)
	if _, err := readTemplate(dir); err != nil {
		t.Fatalf("whole: %v", err)
	}
}
