package qemu

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"time"

	"github.com/IniZio/nexus/pkg/errdefs"
	"github.com/IniZio/nexus/services/vmm/hypervisor"
)

// MinMemoryMiB is the least RAM the Debian guest kernel boots in reliably.
const MinMemoryMiB = 128

// The machine description is the hypervisor's (hypervisor.Spec); these names keep QEMU's own
// callers short.
type (
	VMSpec   = hypervisor.Spec
	Mount    = hypervisor.Mount
	Disk     = hypervisor.Disk
	GuestNet = hypervisor.GuestNet
)

var (
	idRe    = regexp.MustCompile(`^[a-z0-9][a-z0-9-]{0,62}$`)
	tagRe   = regexp.MustCompile(`^[A-Za-z0-9_.-]{1,31}$`)
	macRe   = regexp.MustCompile(`^[0-9a-f]{2}(:[0-9a-f]{2}){5}$`)
	tokenRe = regexp.MustCompile(`^[\x21-\x7e]{1,256}$`)
)

// Paths of the files in a VM directory.
func pidPath(dir string) string     { return filepath.Join(dir, "qemu.pid") }
func statePath(dir string) string   { return filepath.Join(dir, "vm.json") }
func qmpPath(dir string) string     { return filepath.Join(dir, "qmp.sock") }
func consolePath(dir string) string { return hypervisor.ConsoleLog(dir) }
func logPath(dir string) string     { return filepath.Join(dir, "qemu.log") }

// AgentSocket is the host end of the guest agent's virtio-serial port.
func AgentSocket(dir string) string { return hypervisor.AgentSocket(dir) }

// ConsoleLog is the guest serial console log.
func ConsoleLog(dir string) string { return consolePath(dir) }

// AgentPortName is the virtio-serial port name the agent opens.
const AgentPortName = "nexus.agent"

func validate(s *VMSpec) error {
	if !idRe.MatchString(s.ID) {
		return errdefs.Invalid("vm id %q must be 1-63 lowercase letters, digits or dashes", s.ID)
	}
	if !filepath.IsAbs(s.Dir) || strings.ContainsAny(s.Dir, ",\n") {
		return errdefs.Invalid("vm %s: directory must be an absolute path without commas", s.ID)
	}
	// QEMU's unix socket paths must fit sun_path.
	if len(qmpPath(s.Dir)) > 100 || len(AgentSocket(s.Dir)) > 100 || len(vfsSocket(s.Dir, len(s.Mounts))) > 107 {
		return errdefs.Invalid("vm %s: directory path %s is too long for unix sockets", s.ID, s.Dir)
	}
	if s.MemoryMiB < MinMemoryMiB {
		return errdefs.Invalid("memory %d MiB is below the guest minimum of %d MiB", s.MemoryMiB, MinMemoryMiB)
	}
	if s.MemoryMiB > 1<<20 {
		return errdefs.Invalid("memory %d MiB is too large", s.MemoryMiB)
	}
	if s.VCPUs < 1 || s.VCPUs > 64 {
		return errdefs.Invalid("vcpus %d must be between 1 and 64", s.VCPUs)
	}
	if s.CPUs < 0 || s.CPUs > 64 {
		return errdefs.Invalid("cpus %g must be between 0.01 and 64", s.CPUs)
	}
	for name, p := range map[string]string{"kernel": s.Kernel, "initrd": s.Initrd} {
		if err := regularFile(p); err != nil {
			return errdefs.Invalid("vm %s: %s: %v", s.ID, name, err)
		}
	}
	if s.Disk != "" {
		if err := regularFile(s.Disk); err != nil {
			return errdefs.Invalid("vm %s: disk: %v", s.ID, err)
		}
	}
	for i, d := range s.ExtraDisks {
		if err := regularFile(d.Path); err != nil {
			return errdefs.Invalid("vm %s: extra disk %d: %v", s.ID, i, err)
		}
		if d.Format != "" && d.Format != "raw" && d.Format != "qcow2" {
			return errdefs.Invalid("vm %s: extra disk %d: format %q is not raw or qcow2", s.ID, i, d.Format)
		}
	}
	tags := map[string]bool{}
	for i, m := range s.Mounts {
		st, err := os.Stat(m.HostPath)
		if err != nil || !st.IsDir() || !filepath.IsAbs(m.HostPath) {
			return errdefs.Invalid("mount %s: host path must be an existing absolute directory", m.HostPath)
		}
		if strings.Contains(m.HostPath, ",") {
			return errdefs.Invalid("mount %s: host path must not contain a comma", m.HostPath)
		}
		tag := m.TagAt(i)
		if !tagRe.MatchString(tag) || tags[tag] {
			return errdefs.Invalid("mount %s: tag %q must be unique, 1-31 of [A-Za-z0-9_.-]", m.HostPath, tag)
		}
		tags[tag] = true
	}
	if s.NetSocket != "" && (!filepath.IsAbs(s.NetSocket) || strings.Contains(s.NetSocket, ",")) {
		return errdefs.Invalid("vm %s: network socket must be an absolute path without commas", s.ID)
	}
	if s.MAC != "" && !macRe.MatchString(s.MAC) {
		return errdefs.Invalid("vm %s: mac %q is not aa:bb:cc:dd:ee:ff", s.ID, s.MAC)
	}
	if s.Net != nil {
		if _, err := netip.ParsePrefix(s.Net.IP); err != nil {
			return errdefs.Invalid("vm %s: guest ip %q is not a CIDR", s.ID, s.Net.IP)
		}
		for _, a := range []string{s.Net.Gateway, s.Net.DNS} {
			if _, err := netip.ParseAddr(a); a != "" && err != nil {
				return errdefs.Invalid("vm %s: %q is not an IP address", s.ID, a)
			}
		}
	}
	if s.Hostname != "" && !regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9.-]{0,62}$`).MatchString(s.Hostname) {
		return errdefs.Invalid("vm %s: hostname %q is not valid", s.ID, s.Hostname)
	}
	for _, t := range s.Cmdline {
		if !tokenRe.MatchString(t) {
			return errdefs.Invalid("vm %s: kernel command-line token %q must be printable without spaces", s.ID, t)
		}
	}
	if s.RAMPath != "" && (!filepath.IsAbs(s.RAMPath) || strings.Contains(s.RAMPath, ",")) {
		return errdefs.Invalid("vm %s: ram path must be absolute without commas", s.ID)
	}
	return nil
}

func regularFile(p string) error {
	if p == "" {
		return fmt.Errorf("not set")
	}
	st, err := os.Stat(p)
	if err != nil {
		return err
	}
	if !st.Mode().IsRegular() {
		return fmt.Errorf("%s is not a regular file", p)
	}
	if strings.Contains(p, ",") {
		return fmt.Errorf("%s: path must not contain a comma", p)
	}
	return nil
}

// defaultRAMPath names the RAM file by id and a hash of the directory, so two nexus homes (tests)
// using the same id never share a file. It lives in a directory of its own (0700, the file
// 0600: guest memory is for this user only), which removeRAM removes with it. A VM started by
// an older build keeps the path it recorded (/dev/shm/nexus-<id>-<hash>.ram).
func defaultRAMPath(id, dir string) string {
	h := sha256.Sum256([]byte(dir))
	return "/dev/shm/nexus-" + id + "-" + hex.EncodeToString(h[:4]) + "/nexus-guest.ram"
}

// createRAM makes an empty RAM file at p, 0600 in a 0700 directory, for QEMU to size and map.
func createRAM(p string) error {
	dir := filepath.Dir(p)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return err
	}
	if err := os.Chmod(dir, 0o700); err != nil {
		return err
	}
	os.Remove(p)
	f, err := os.OpenFile(p, os.O_RDWR|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return err
	}
	return f.Close()
}

// baseCmdline starts every guest's kernel command line under accel, sandboxes' and bare boots'
// alike: console, panic behaviour and, under TCG, the clock.
//
// Under TCG the guest's PIT-based TSC calibration fails when the host is busy and the kernel
// then hangs with an unstable TSC; handing it the host TSC rate (tsc_early_khz) avoids that.
// tsc=reliable turns off the kernel's clocksource watchdog for the TSC, which TCG derives from
// the host's own (constant rate, one for all vCPUs): microvm has no HPET or ACPI PM timer, so
// the watchdog checks the TSC against jiffies, which lose ticks whenever the host leaves the
// vCPU thread waiting (a loaded boot). It then marked the TSC unstable and the guest fell back
// to refined-jiffies: no high-resolution timers, no tickless idle, the 250 Hz tick running in
// every idle sandbox (11 times the host CPU of a guest on the TSC), and a clock that lost time.
func baseCmdline(accel string) []string {
	t := []string{"console=ttyS0", "reboot=t", "panic=-1", "quiet"}
	if accel == AccelTCG {
		if khz := hostTSCkHz(); khz > 0 {
			t = append(t, "tsc_early_khz="+strconv.Itoa(khz))
		}
		t = append(t, "tsc=reliable")
	}
	return t
}

// GuestCmdline is the part of every guest's kernel command line that is the same for all VMs
// of this driver, under either accelerator: a template's saved guest booted with it, so the
// template's key includes it and a change of it rebuilds templates.
func (d *Driver) GuestCmdline() string {
	return "tcg: " + strings.Join(baseCmdline(AccelTCG), " ") + "; kvm: " + strings.Join(baseCmdline(AccelKVM), " ")
}

// kernelCmdline builds the command line the agent reads (see the agent's contract).
func kernelCmdline(s *VMSpec, accel string, now time.Time) string {
	t := baseCmdline(accel)
	if s.Disk != "" {
		t = append(t, "nexus.root=/dev/vda")
	}
	host := s.Hostname
	if host == "" {
		host = s.ID
	}
	t = append(t, "nexus.hostname="+host, "nexus.time="+strconv.FormatInt(now.Unix(), 10))
	if s.Net != nil {
		t = append(t, "nexus.ip="+s.Net.IP)
		if s.Net.Gateway != "" {
			t = append(t, "nexus.gw="+s.Net.Gateway)
		}
		if s.Net.DNS != "" {
			t = append(t, "nexus.dns="+s.Net.DNS)
		}
	}
	if len(s.Mounts) > 0 {
		t = append(t, "nexus.shares=1") // agentproto.CmdlineShares: the guest loads 9p
	}
	t = append(t, "nexus.agentport="+AgentPortName)
	t = append(t, s.Cmdline...)
	return strings.Join(t, " ")
}

// reportErrors makes a failed disk write or read the guest's error (ENOSPC, EIO) instead of
// pausing the VM, QEMU's default on ENOSPC: a paused guest misses its heartbeats and was killed as
// hung, and a full host disk then stopped every sandbox that wrote. QEMU still raises
// BLOCK_IO_ERROR, which the QMP client counts (QMP.DiskErrors).
const reportErrors = "werror=report,rerror=report"

// throttleGroup is the QEMU throttle group all of a VM's drives join.
const throttleGroup = "io"

// throttling is a drive's options that bound the VM's disk I/O where the guest issues it: each
// direction's bytes and operations per second, all of its drives together (one throttle group).
// QEMU holds a request back before it reaches the host, so this binds the buffered writes the
// host's page cache takes and writes back later, which a cgroup v1 blkio throttle never sees (it
// saw 5 MiB of a guest's 96 MiB); the cgroup's limits stay as a second bound for direct I/O.
func throttling(s *VMSpec) string {
	var b strings.Builder
	for _, o := range []struct {
		key string
		v   int64
	}{{"bps-read", s.DiskBps}, {"bps-write", s.DiskBps}, {"iops-read", int64(s.DiskIOPS)}, {"iops-write", int64(s.DiskIOPS)}} {
		if o.v > 0 {
			fmt.Fprintf(&b, ",throttling.%s=%d", o.key, o.v)
		}
	}
	if b.Len() == 0 {
		return ""
	}
	return b.String() + ",throttling.group=" + throttleGroup
}

// commandLine builds QEMU's argument list. Device order is significant: the root disk comes first so
// the guest names it /dev/vda.
func commandLine(s *VMSpec, accel, ramPath string, now time.Time) []string {
	cpu := "max"
	accelArg := "tcg,thread=multi,tb-size=" + strconv.Itoa(tcgCacheMiB) // bounded: it is most of QEMU's memory overhead
	if accel == AccelKVM {
		cpu, accelArg = "host", "kvm"
	}
	mem := strconv.Itoa(s.MemoryMiB) + "M"
	share := "on"
	if s.Incoming {
		share = "off"
	}
	a := []string{
		"-name", "nexus-" + s.ID + ",process=nexus-" + s.ID,
		// pit and pic stay at microvm's defaults (on): under TCG the guest hangs without them.
		"-M", "microvm,x-option-roms=off,memory-backend=mem",
		"-accel", accelArg,
		"-cpu", cpu,
		"-m", mem,
		"-smp", strconv.Itoa(s.VCPUs),
		"-object", "memory-backend-file,id=mem,size=" + mem + ",mem-path=" + ramPath + ",share=" + share,
		"-nodefaults", "-no-user-config", "-nographic", "-no-reboot",
		"-sandbox", sandboxFilter,
		"-kernel", s.Kernel,
		"-initrd", s.Initrd,
		"-append", kernelCmdline(s, accel, now),
		"-chardev", "file,id=console,path=" + consolePath(s.Dir) + ",append=on",
		"-serial", "chardev:console",
		"-qmp", "unix:" + qmpPath(s.Dir) + ",server=on,wait=off",
	}
	if s.Incoming {
		a = append(a, "-S", "-incoming", "defer")
	}
	if s.Disk != "" {
		a = append(a,
			"-drive", "id=root,file="+s.Disk+",format=qcow2,if=none,discard=unmap,detect-zeroes=unmap,"+reportErrors+throttling(s),
			"-device", "virtio-blk-device,drive=root,serial=nexus-root")
	}
	for i, d := range s.ExtraDisks {
		f := d.Format
		if f == "" {
			f = "raw"
		}
		drive := fmt.Sprintf("id=disk%d,file=%s,format=%s,if=none,discard=unmap,%s%s", i, d.Path, f, reportErrors, throttling(s))
		if d.ReadOnly {
			drive += ",read-only=on"
		}
		a = append(a, "-drive", drive, "-device", fmt.Sprintf("virtio-blk-device,drive=disk%d,serial=nexus-disk%d", i, i))
	}
	if s.FreePageReporting && !s.Incoming {
		// The guest reports freed 2 MiB blocks (after some 2 s) and QEMU punches them out of the
		// shared RAM file in /dev/shm: idle memory goes back to the host (see Spec).
		a = append(a, "-device", "virtio-balloon-device,free-page-reporting=on")
	}
	a = append(a,
		"-device", "virtio-serial-device,max_ports=2",
		"-chardev", "socket,id=agent,path="+AgentSocket(s.Dir)+",server=on,wait=off",
		"-device", "virtserialport,chardev=agent,name="+AgentPortName)
	if s.NetSocket != "" || len(s.NetdevArgs) > 0 {
		mac := s.MAC
		if mac == "" {
			mac = hypervisor.MACFor(s.ID)
		}
		netdev := s.NetdevArgs
		if len(netdev) == 0 {
			netdev = []string{"-netdev", "stream,id=net0,server=on,addr.type=unix,addr.path=" + s.NetSocket}
		}
		a = append(a, netdev...)
		a = append(a, "-device", "virtio-net-device,netdev=net0,mac="+mac)
	}
	modern := false
	for i, m := range s.Mounts {
		if m.Virtiofs {
			// libvhost-user serves only modern (virtio 1.0) devices, and microvm's virtio-mmio
			// transports are legacy by default: a machine with virtiofs has modern ones (only it,
			// so the saved state of every other machine keeps its layout).
			if !modern {
				a = append(a, "-global", "virtio-mmio.force-legacy=false")
				modern = true
			}
			// vhost-user needs the guest RAM shared with virtiofsd: the memory backend above is
			// a shared file (a restore, mapped privately, never has virtiofs mounts).
			a = append(a, "-chardev", fmt.Sprintf("socket,id=vfs%d,path=%s", i, vfsSocket(s.Dir, i)),
				"-device", fmt.Sprintf("vhost-user-fs-device,chardev=vfs%d,tag=%s", i, m.TagAt(i)))
			continue
		}
		fs := fmt.Sprintf("local,id=fs%d,path=%s,security_model=none", i, m.HostPath)
		if m.ReadOnly {
			fs += ",readonly=on"
		}
		a = append(a, "-fsdev", fs, "-device", fmt.Sprintf("virtio-9p-device,fsdev=fs%d,mount_tag=%s", i, m.TagAt(i)))
	}
	return a
}

// hostTSCkHz reads the host CPU clock from /proc/cpuinfo; under TCG the guest TSC ticks at the
// host TSC rate. 0 when unknown.
func hostTSCkHz() int {
	b, err := os.ReadFile("/proc/cpuinfo")
	if err != nil {
		return 0
	}
	for _, l := range strings.Split(string(b), "\n") {
		k, v, ok := strings.Cut(l, ":")
		if !ok || strings.TrimSpace(k) != "cpu MHz" {
			continue
		}
		mhz, err := strconv.ParseFloat(strings.TrimSpace(v), 64)
		if err != nil || mhz < 100 || mhz > 20000 {
			return 0
		}
		return int(mhz * 1000)
	}
	return 0
}
