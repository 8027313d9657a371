package vmm

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"time"

	api "github.com/IniZio/nexus/pkg/api/vmm"
	"github.com/IniZio/nexus/pkg/atomicfile"
	"github.com/IniZio/nexus/pkg/errdefs"
	"github.com/IniZio/nexus/services/vmm/hypervisor"
	"github.com/IniZio/nexus/services/vmm/image"
	"github.com/IniZio/nexus/services/vmm/internal/fsutil"
)

// Templates (DESIGN §4, issue 24). A template is a VM of one shape (image, memory, vCPUs, disk
// size, NIC or none, number of live shares) booted to "agent ready" and saved like a snapshot:
//
//	$NEXUS_HOME/templates/<key>/  state, ram, disk.qcow2 (as a snapshot) and template.json
//
// The key hashes the shape and everything the saved guest came from: the image build, kernel,
// initramfs (which holds the agent), the kernel command line every guest shares (its clock),
// QEMU and nexus versions; any of them changing gives a new key, so a stale template is never
// restored. The template's VM is never configured: no hostname, env, placeholder, CA, file or
// mount of a sandbox reaches it (its shares point at an empty directory and are never mounted).
//
// A create of a new sandbox of that shape restores the template (warmBoot): its own qcow2
// overlay over the template's disk, the template's RAM mapped privately (copy-on-write: idle
// sandboxes of one template share the pages they did not write) and then the very guest steps
// a cold boot runs (guestSteps: configure gives hostname, machine-id, a reseeded RNG, the clock,
// env and CA; then mounts and files), so the two cannot drift. Whatever cannot be restored
// (named volumes, --mount, a restore that fails) boots cold instead, with the reason logged.
// The first create of a shape boots cold and builds the template in the background.

// templateFile, in a sandbox directory, is the key of the template its disk is backed by.
const templateFile = "template"

func templateRecordFile(dir string) string { return filepath.Join(dir, "template.json") }

// templateRecord is template.json: what the template is, and the saved VM (as a snapshot's).
type templateRecord struct {
	Info     api.TemplateInfo `json:"info"`
	Snapshot api.SnapshotInfo `json:"snapshot"`
}

// warmBoot restores a new sandbox from a template (template.go).
var warmBoot = concatSteps(prepareSteps, []bootStep{
	{name: "disk", run: (*boot).templateDisk, undo: (*boot).dropTemplateDisk},
	{name: "restore", run: (*boot).restoreVM, undo: (*boot).killVM},
}, guestSteps)

// templateBuild boots a template's VM to agent ready; it is never configured.
var templateBuild = concatSteps(prepareSteps, []bootStep{
	{name: "image", run: (*boot).findImage},
	{name: "disk", run: (*boot).newDisk},
	{name: "qemu", run: (*boot).startVM, undo: (*boot).killVM},
	{name: "agent", run: (*boot).dialAgent},
})

// templates is the service's state of template builds.
type templates struct {
	ctx      context.Context // the service's lifetime: background builds end with it
	building sync.Map        // key → *sync.Mutex
	wg       sync.WaitGroup
}

// shapeOf is the template shape of a start, or why it cannot be restored from one.
func shapeOf(r api.StartRequest) (api.TemplateShape, string) {
	sh := api.TemplateShape{MemoryMiB: r.MemoryMiB, VCPUs: r.VCPUs, DiskMiB: r.DiskMiB, Net: r.NetSocket != ""}
	if len(r.Volumes) > 0 {
		return sh, "named volumes cannot be restored from a template"
	}
	for _, m := range r.Mounts {
		if !m.Remount {
			return sh, fmt.Sprintf("the live mount %s cannot be restored from a template", m.Guest)
		}
		sh.Shares++
	}
	return sh, ""
}

// templateKey hashes a shape with what its template's guest is made of. b has the kernel and
// initramfs prepared.
func (s *Service) templateKey(b *boot, img *image.Info, sh api.TemplateShape) string {
	h := sha256.New()
	fmt.Fprintf(h, "nexus-template-v1\nnexus %s\n", s.cfg.Version)
	if v, ok := s.drv.(interface{ Version() string }); ok {
		fmt.Fprintf(h, "hypervisor %s\n", v.Version())
	}
	if c, ok := s.drv.(interface{ GuestCmdline() string }); ok {
		fmt.Fprintf(h, "cmdline %s\n", c.GuestCmdline())
	}
	fmt.Fprintf(h, "kernel %s %s %s\ninitramfs %s\n", b.kern.Version, b.kern.VmlinuxPath, b.kern.VmlinuzPath, b.initrd)
	fmt.Fprintf(h, "image %s %s %s\n", img.Key, img.Digest, img.Built.UTC().Format(time.RFC3339Nano))
	if fi, err := os.Stat(img.Path); err == nil {
		fmt.Fprintf(h, "base %s %d %d\n", img.Path, fi.Size(), fi.ModTime().UnixNano())
	}
	fmt.Fprintf(h, "shape %d %d %d %t %d\n", sh.MemoryMiB, sh.VCPUs, sh.DiskMiB, sh.Net, sh.Shares)
	return hex.EncodeToString(h.Sum(nil))[:32]
}

// prepared returns a boot holding the kernel and initramfs, preparing them if no boot has.
func (s *Service) prepared(ctx context.Context) (*boot, error) {
	b := &boot{s: s}
	for _, st := range prepareSteps {
		if err := st.run(b, ctx); err != nil && !errors.Is(err, errSkip) {
			return nil, err
		}
	}
	return b, nil
}

// warmChoice is what a start of a new sandbox restores, or why it boots cold.
type warmChoice struct {
	shape api.TemplateShape
	img   *image.Info
	key   string
	dir   string // the template's, when there is one to restore
	rec   templateRecord
	cold  string // why it boots cold; empty with a template
	build bool   // after a cold boot, build the shape's template in the background
}

// chooseTemplate decides whether the start r of a new sandbox restores a template.
func (s *Service) chooseTemplate(ctx context.Context, r api.StartRequest) (c warmChoice) {
	var why string
	c.shape, why = shapeOf(r)
	if s.cfg.NoTemplates {
		why = "templates are off (--templates=false)"
	}
	if why != "" {
		c.cold = why
		return c
	}
	if image.IsLayerKey(r.Image) {
		c.cold = "a builder on a build cache layer" // one build's: no template is worth keeping
		return c
	}
	img, err := image.Resolve(s.cfg.Home, r.Image)
	if err != nil {
		c.cold = "its image is not on this host yet"
		c.build = !r.Cold
		return c
	}
	c.img = img
	b, err := s.prepared(ctx)
	if err != nil {
		c.cold = "kernel or initramfs: " + err.Error()
		return c
	}
	c.key = s.templateKey(b, img, c.shape)
	if r.Cold {
		c.cold = "--cold"
		return c
	}
	dir := filepath.Join(s.cfg.Home.Templates(), c.key)
	rec, err := readTemplate(dir)
	switch {
	case errors.Is(err, os.ErrNotExist):
		c.cold, c.build = "no template of this shape yet", true
	case err != nil:
		c.cold, c.build = "the template is damaged: "+err.Error(), true
		s.removeTemplate(c.key)
	default:
		c.dir, c.rec = dir, rec
	}
	return c
}

// readTemplate reads a template's record and checks its files' lengths.
func readTemplate(dir string) (templateRecord, error) {
	var rec templateRecord
	b, err := os.ReadFile(templateRecordFile(dir))
	if err != nil {
		return rec, err
	}
	if err := json.Unmarshal(b, &rec); err != nil {
		return rec, errors.New("its record does not parse")
	}
	if why := damage(dir, rec.Snapshot); why != "" {
		return rec, errors.New(why)
	}
	return rec, nil
}

// newWarmBoot is the restore of a new sandbox r from the template c.
func (s *Service) newWarmBoot(r api.StartRequest, c warmChoice) *boot {
	b := s.newBoot(r)
	b.snapshot, b.info, b.snapDir, b.template = "template "+c.key, c.rec.Snapshot, c.dir, c.key
	return b
}

// startWarm boots the new sandbox r from its shape's template when there is one, else cold
// (building the template in the background when its shape has none). A restore that fails
// falls back to a cold boot: a template never fails a create.
func (s *Service) startWarm(ctx context.Context, r api.StartRequest) (api.StartResponse, error) {
	c := s.chooseTemplate(ctx, r)
	if c.dir != "" {
		resp, err := s.newWarmBoot(r, c).run(ctx, "start", warmBoot)
		if err == nil {
			resp.Template = c.key
			s.log.Info().Str("sandbox", r.Name).Str("template", c.key).Msg("created from a template")
			return resp, nil
		}
		if ctx.Err() != nil {
			return resp, err
		}
		c.cold, c.build = "the restore failed: "+errdefs.FirstLine(err.Error()), false
		s.removeTemplate(c.key) // built again on a later create
	}
	resp, err := s.newBoot(r).run(ctx, "start", coldBoot)
	if err != nil {
		return resp, err // a refusal (an unknown image, say) is not news of a cold boot
	}
	s.log.Info().Str("sandbox", r.Name).Str("reason", c.cold).Msg("booted cold")
	resp.ColdReason = c.cold
	if c.build {
		s.buildInBackground(r.Image, c.shape)
	}
	return resp, nil
}

// buildInBackground builds the template of a shape after a cold create, bounded to one CPU of
// the host so the new sandbox's first commands are not starved.
func (s *Service) buildInBackground(imageRef string, sh api.TemplateShape) {
	ctx := s.tpl.ctx
	if ctx == nil || ctx.Err() != nil {
		return
	}
	s.tpl.wg.Add(1)
	go func() {
		defer s.tpl.wg.Done()
		img, err := image.Resolve(s.cfg.Home, imageRef)
		if err == nil {
			_, err = s.buildTemplate(ctx, img, sh)
		}
		if err != nil && ctx.Err() == nil {
			s.log.Warn().Err(err).Str("image", imageRef).Msg("template build failed; creates of this shape boot cold")
		}
	}()
}

// buildTemplate builds (or finds) the template of a shape of image img.
func (s *Service) buildTemplate(ctx context.Context, img *image.Info, sh api.TemplateShape) (api.TemplateInfo, error) {
	b, err := s.prepared(ctx)
	if err != nil {
		return api.TemplateInfo{}, err
	}
	key := s.templateKey(b, img, sh)
	v, _ := s.tpl.building.LoadOrStore(key, &sync.Mutex{})
	mu := v.(*sync.Mutex)
	mu.Lock()
	defer mu.Unlock()
	final := filepath.Join(s.cfg.Home.Templates(), key)
	if rec, err := readTemplate(final); err == nil {
		return rec.Info, nil
	}
	s.removeTemplate(key) // a damaged one
	started := time.Now()
	id := "tpl-" + key[:16]
	release, err := s.admit(id, sh.MemoryMiB, sh.VCPUs)
	if err != nil {
		return api.TemplateInfo{}, fmt.Errorf("template: %w", err)
	}
	defer release()
	if err := os.MkdirAll(s.cfg.Home.Templates(), 0o700); err != nil {
		return api.TemplateInfo{}, err
	}
	tmp, err := os.MkdirTemp(s.cfg.Home.Templates(), ".tmp-")
	if err != nil {
		return api.TemplateInfo{}, err
	}
	defer os.RemoveAll(tmp)
	vmDir := filepath.Join(tmp, "vm")
	empty := filepath.Join(vmDir, "share")
	if err := os.MkdirAll(empty, 0o700); err != nil {
		return api.TemplateInfo{}, err
	}
	tb := &boot{s: s, id: id, name: "template " + key[:16], hostname: id, image: img.Key, memoryMiB: sh.MemoryMiB,
		diskMiB: sh.DiskMiB, vcpus: sh.VCPUs, cpus: 1, dir: vmDir, noPortForward: true}
	for range sh.Shares {
		tb.mounts = append(tb.mounts, api.Mount{Host: empty, Remount: true})
	}
	if sh.Net {
		tb.netSocket = filepath.Join(vmDir, "net.sock")
	}
	if err := runSteps(ctx, "template", templateBuild, tb, func(string) {}); err != nil {
		return api.TemplateInfo{}, err
	}
	defer tb.killVM()
	out := filepath.Join(tmp, "t")
	if err := os.Mkdir(out, 0o700); err != nil {
		return api.TemplateInfo{}, err
	}
	info := api.SnapshotInfo{Name: key, Host: s.cfg.Host, ParentID: id, Image: img.Key, MemoryMiB: sh.MemoryMiB, VCPUs: sh.VCPUs,
		Accel: tb.m.vm.Accel(), Net: sh.Net, KernelVersion: tb.spec.KernelVersion, Created: time.Now().UTC()}
	for range sh.Shares {
		info.Mounts = append(info.Mounts, api.Mount{Remount: true})
	}
	if err := s.capture(ctx, tb.m, tb.spec, out, &info); err != nil {
		return api.TemplateInfo{}, fmt.Errorf("template: %w", err)
	}
	tb.killVM()
	// The boot's console lines (kernel, agent) are the restored sandboxes' too: nexus logs
	// shows them as after a cold boot. They hold no secret: the VM was never configured.
	if err := copyHead(hypervisor.ConsoleLog(vmDir), templateConsole(out), maxTemplateConsole); err != nil {
		return api.TemplateInfo{}, fmt.Errorf("template: console log: %w", err)
	}
	rec := templateRecord{Snapshot: info, Info: api.TemplateInfo{Key: key, Image: img.Key, MemoryMiB: sh.MemoryMiB, VCPUs: sh.VCPUs,
		DiskMiB: sh.DiskMiB, Net: sh.Net, Shares: sh.Shares, RAMDataBytes: info.RAMDataBytes, DiskBytes: info.DiskBytes,
		BuildMillis: time.Since(started).Milliseconds(), Created: info.Created}}
	j, _ := json.MarshalIndent(rec, "", "  ")
	if err := atomicfile.WriteFile(templateRecordFile(out), j, 0o600); err != nil {
		return api.TemplateInfo{}, err
	}
	if err := os.Rename(out, final); err != nil {
		return api.TemplateInfo{}, fmt.Errorf("template: %w", err)
	}
	fsutil.SyncDir(s.cfg.Home.Templates())
	s.log.Info().Str("template", key).Str("image", img.Key).Int("memory_mib", sh.MemoryMiB).Int("vcpus", sh.VCPUs).
		Int64("build_ms", rec.Info.BuildMillis).Int64("ram_data", info.RAMDataBytes).Msg("template built")
	s.pruneTemplates()
	return rec.Info, nil
}

// templateUsers are the sandboxes whose disks are backed by the template key.
func (s *Service) templateUsers(key string) []string {
	files, _ := filepath.Glob(filepath.Join(s.cfg.Home.Sandboxes(), "*", templateFile))
	var out []string
	for _, f := range files {
		if b, err := os.ReadFile(f); err == nil && strings.TrimSpace(string(b)) == key {
			out = append(out, filepath.Base(filepath.Dir(f)))
		}
	}
	return out
}

// removeTemplate deletes a template nothing depends on: no sandbox's disk, and no snapshot of
// its image (a snapshot of a warm sandbox copies an overlay backed by the template's disk).
// It says whether the template is gone.
func (s *Service) removeTemplate(key string) bool {
	dir := filepath.Join(s.cfg.Home.Templates(), key)
	if _, err := os.Stat(dir); errors.Is(err, os.ErrNotExist) {
		return true
	}
	if len(s.templateUsers(key)) > 0 {
		return false
	}
	if rec, err := readTemplateRecord(dir); err == nil && len(s.snapshotsOfImage(rec.Info.Image)) > 0 {
		return false
	}
	trash, err := os.MkdirTemp(s.cfg.Home.Templates(), ".rm-")
	if err != nil {
		return false
	}
	if err := os.Rename(dir, filepath.Join(trash, "x")); err != nil {
		os.Remove(trash)
		return false
	}
	os.RemoveAll(trash)
	return true
}

func readTemplateRecord(dir string) (templateRecord, error) {
	var rec templateRecord
	b, err := os.ReadFile(templateRecordFile(dir))
	if err == nil {
		err = json.Unmarshal(b, &rec)
	}
	return rec, err
}

// listTemplates reads the templates on this host, marking those stale that no create would
// restore any more (built from another kernel, agent, QEMU, nexus or image build).
func (s *Service) listTemplates(ctx context.Context) []api.TemplateInfo {
	recs, _ := filepath.Glob(filepath.Join(s.cfg.Home.Templates(), "*", "template.json"))
	var b *boot
	s.bootMu.Lock()
	ready := s.boot != nil
	s.bootMu.Unlock()
	if ready { // else staleness is not known yet: no boot has prepared this host's kernel
		b, _ = s.prepared(ctx)
	}
	var out []api.TemplateInfo
	for _, p := range recs {
		dir := filepath.Dir(p)
		if strings.HasPrefix(filepath.Base(dir), ".") {
			continue
		}
		rec, err := readTemplateRecord(dir)
		if err != nil {
			continue
		}
		info := rec.Info
		if b != nil {
			img, err := image.Resolve(s.cfg.Home, info.Image)
			sh := api.TemplateShape{MemoryMiB: info.MemoryMiB, VCPUs: info.VCPUs, DiskMiB: info.DiskMiB, Net: info.Net, Shares: info.Shares}
			info.Stale = err != nil || s.templateKey(b, img, sh) != info.Key
		}
		out = append(out, info)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Created.Before(out[j].Created) })
	return out
}

// pruneTemplates removes the stale templates nothing depends on any more.
func (s *Service) pruneTemplates() {
	for _, t := range s.listTemplates(context.Background()) {
		if t.Stale {
			s.removeTemplate(t.Key)
		}
	}
}

// cleanTemplateTemps removes what a crash mid-build or mid-remove left; a template VM a crashed
// vmm left running is killed by its pid file first.
func (s *Service) cleanTemplateTemps() {
	for _, pat := range []string{".tmp-*", ".rm-*"} {
		left, _ := filepath.Glob(filepath.Join(s.cfg.Home.Templates(), pat))
		for _, d := range left {
			if vm, err := s.drv.Adopt(context.Background(), filepath.Join(d, "vm")); err == nil {
				vm.Kill()
				vm.Cleanup()
				vm.Close()
			}
			os.RemoveAll(d)
		}
	}
}

// imageTemplates are the templates of the image with the given key.
func (s *Service) imageTemplates(ctx context.Context, key string) []api.TemplateInfo {
	var out []api.TemplateInfo
	for _, t := range s.listTemplates(ctx) {
		if t.Image == key {
			out = append(out, t)
		}
	}
	return out
}

// warmImage builds the template of an image for a shape (`nexus image warm`).
func (s *Service) warmImage(ctx context.Context, r api.ImageRequest) (api.ImageInfo, error) {
	if r.Warm == nil || r.Warm.MemoryMiB <= 0 || r.Warm.VCPUs <= 0 || r.Warm.Shares < 0 || r.Warm.Shares > 8 || r.Warm.DiskMiB < 0 {
		return api.ImageInfo{}, errdefs.Invalid("image warm: the template's memory, vCPUs and shares must be set")
	}
	img, err := s.ensureImage(ctx, r.Name, r.Progress)
	if err != nil {
		return api.ImageInfo{}, err
	}
	if _, err := s.buildTemplate(ctx, img, *r.Warm); err != nil {
		return api.ImageInfo{}, fmt.Errorf("image warm %s: %w", r.Name, err)
	}
	out := imageInfo(img)
	out.Templates = s.imageTemplates(ctx, img.Key)
	return out, nil
}

// templateDisk creates a warm sandbox's qcow2 overlay over its template's disk; when it fails it
// leaves none of it.
func (b *boot) templateDisk(ctx context.Context) error {
	if err := b.sandboxDir(); err != nil {
		return err
	}
	if err := b.writeTemplateDisk(ctx); err != nil {
		b.dropTemplateDisk()
		return err
	}
	return nil
}

func (b *boot) writeTemplateDisk(ctx context.Context) error {
	if err := atomicfile.WriteFile(filepath.Join(b.dir, imageFile), []byte(b.info.Image+"\n"), 0o600); err != nil {
		return err
	}
	if err := atomicfile.WriteFile(filepath.Join(b.dir, templateFile), []byte(b.template+"\n"), 0o600); err != nil {
		return err
	}
	if err := cloneOverlay(ctx, b.snapDir, b.disk); err != nil {
		return err
	}
	if err := os.Chmod(b.disk, 0o600); err != nil {
		return err
	}
	if _, err := os.Stat(hypervisor.ConsoleLog(b.dir)); errors.Is(err, os.ErrNotExist) {
		copyHead(templateConsole(b.snapDir), hypervisor.ConsoleLog(b.dir), maxTemplateConsole)
	}
	return nil
}

// cloneDiskFile, in a template directory, is an empty qcow2 overlay over the template's disk.
// Every clone's overlay is the same bytes (the header names the backing file, nothing else), so
// a warm create copies it (a 200 KiB file) instead of running qemu-img (a process start, most of
// the disk step on a loaded host). The first warm create of the template makes it.
func cloneDiskFile(dir string) string { return filepath.Join(dir, "clone.qcow2") }

// cloneOverlay makes disk a new overlay over the template in dir.
func cloneOverlay(ctx context.Context, dir, disk string) error {
	proto := cloneDiskFile(dir)
	if fi, err := os.Stat(proto); err != nil || fi.Size() < 512 {
		tmp := fmt.Sprintf("%s.tmp-%d-%d", proto, os.Getpid(), time.Now().UnixNano())
		err := overlayOn(ctx, diskFile(dir), tmp)
		if err == nil {
			err = os.Chmod(tmp, 0o600) // qemu-img makes it 0644, as nothing else in the home is
		}
		if err != nil {
			os.Remove(tmp)
			return err
		}
		if err := os.Rename(tmp, proto); err != nil {
			os.Remove(tmp)
			return err
		}
	}
	os.Remove(disk)
	_, err := fsutil.CopySparse(proto, disk)
	return err
}

// maxTemplateConsole bounds the boot console lines a template keeps.
const maxTemplateConsole = 1 << 20

func templateConsole(dir string) string { return filepath.Join(dir, "console.log") }

// copyHead copies at most max bytes of src to a new file dst (0600).
func copyHead(src, dst string, max int64) error {
	in, err := os.Open(src)
	if err != nil {
		return err
	}
	defer in.Close()
	out, err := os.OpenFile(dst, os.O_CREATE|os.O_WRONLY|os.O_TRUNC, 0o600)
	if err != nil {
		return err
	}
	if _, err := io.Copy(out, io.LimitReader(in, max)); err != nil {
		out.Close()
		return err
	}
	return out.Close()
}

// dropTemplateDisk undoes templateDisk, so that a cold boot after a failed restore makes the
// sandbox's disk anew.
func (b *boot) dropTemplateDisk() {
	for _, f := range []string{b.disk, filepath.Join(b.dir, imageFile), filepath.Join(b.dir, templateFile)} {
		os.Remove(f)
	}
}
