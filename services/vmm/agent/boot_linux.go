package agent

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/rs/zerolog"
	"golang.org/x/sys/unix"

	"github.com/IniZio/nexus/pkg/agentproto"
)

// newRoot is where the root disk is mounted before it becomes /.
const newRoot = "/newroot"

// step is one named boot step; its name appears in the console line when it fails.
type step struct {
	name string
	run  func() error
}

// RunInit is the agent as PID 1: it boots the guest (mounts, clock, modules, root switch,
// hostname, network), then serves the channel forever. Boot failures are printed to the console
// and the agent keeps serving so the host can still reach it and read its log.
func RunInit() {
	start := time.Now()
	ring := NewRing(DefaultRingSize)
	// Early mounts come first: everything else needs /proc, /sys or /dev (and the console node).
	earlyMounts()
	console := openConsole()
	log := zerolog.New(zerolog.ConsoleWriter{Out: io.MultiWriter(console, ring), NoColor: true, TimeFormat: "15:04:05.000"}).
		Level(zerolog.InfoLevel).With().Timestamp().Str("component", "nexus-agent").Logger()
	raw, _ := os.ReadFile("/proc/cmdline")
	cmd := ParseCmdline(string(raw))
	if v := cmd.Get(agentproto.CmdlineTime); v != "" {
		if sec, err := strconv.ParseInt(v, 10, 64); err == nil {
			setClock(time.Unix(sec, 0))
		}
	}
	var kernel string
	var uts unix.Utsname
	if unix.Uname(&uts) == nil {
		kernel = unix.ByteSliceToString(uts.Release[:])
	}
	log.Info().Str("kernel", kernel).Msg("booting")

	hostname := cmd.Get(agentproto.CmdlineHostname)
	steps := []step{
		{"modules", func() error {
			n, err := LoadModules(agentproto.ModulesList, cmd)
			log.Info().Int("loaded", n).Dur("took", time.Since(start)).Msg("modules")
			return err
		}},
		{"root", func() error {
			return switchRoot(cmd)
		}},
		{"grow root", func() error {
			// A disk larger than the image (--disk) is grown into, online and beside the rest
			// of the boot (an 8 GiB grow is ~0.7 s of guest CPU under TCG); a failure leaves
			// the guest usable at the image's size, so it is logged, not a boot error.
			go func() {
				if err := growRoot(cmd.Get(agentproto.CmdlineRoot), "/"); err != nil {
					log.Warn().Err(err).Msg("root file system not grown to its disk")
				}
			}()
			return nil
		}},
		{"system mounts", systemMounts},
		{"agent binary", bindAgentBinary},
		{"hostname", func() error { return setHostname(hostname) }},
		{"network", func() error { return bootNetwork(cmd) }},
	}
	var bootErrors []string
	took := zerolog.Dict()
	for _, st := range steps {
		t0 := time.Now()
		err := st.run()
		took.Dur(st.name, time.Since(t0))
		if err != nil {
			bootErrors = append(bootErrors, st.name+": "+err.Error())
			fmt.Fprintf(console, "nexus-agent: boot step %q failed: %v\n", st.name, err)
			log.Error().Err(err).Str("step", st.name).Msg("boot step failed")
			if st.name == "root" {
				break // the rest needs the root file system
			}
		}
	}

	log.Info().Dict("took", took).Msg("boot steps")

	// Before the reaper: the cgroup's probe waits for its own child.
	execCG, err := ExecCgroup()
	if err != nil {
		log.Warn().Err(err).Msg("the guest's commands run without a cgroup of their own")
	}
	reaper := NewReaper()
	go reaper.Run(nil)
	srv, _ := New(Config{
		Logger:   log,
		Env:      []string{"PATH=" + DefaultPath, "HOME=/root", "LANG=C.UTF-8", "GIT_SSH_COMMAND=" + agentproto.GuestBinDir + "/nexus-agent ssh-shim"},
		Dir:      "/",
		Logs:     ring,
		BootTime: start,
		Kernel:   kernel,
		Reaper:   reaper,

		ExecCgroup: execCG,

		BootErrors: bootErrors,
		SetHostname: func(name string) error {
			return setHostname(name)
		},
		SetClock: setClock,
		ConfigureNetwork: func(n agentproto.NetworkConfig) error {
			if err := ConfigureInterface("eth0", n); err != nil {
				return err
			}
			if len(n.DNS) > 0 {
				return WriteResolvConf("/etc/resolv.conf", n.DNS)
			}
			return nil
		},
		TrustCA:      func(ca agentproto.TrustCA) error { return InstallCA("/", ca) },
		Reseed:       Reseed,
		SetMachineID: func(id string) error { return SetMachineID("/", id) },
		PowerOff:     func() { powerOff(log) },
	})
	ctx := context.Background()

	if err := os.MkdirAll(filepath.Dir(agentproto.HostDialSocket), 0o755); err == nil {
		os.Remove(agentproto.HostDialSocket)
		if l, err := net.Listen("unix", agentproto.HostDialSocket); err == nil {
			os.Chmod(agentproto.HostDialSocket, 0o666)
			go srv.ServeHostDial(ctx, l)
		} else {
			log.Warn().Err(err).Msg("host dial socket")
		}
	}
	vport := uint32(agentproto.DefaultVsockPort)
	if v, err := strconv.ParseUint(cmd.Get(agentproto.CmdlineVsockPort), 10, 32); err == nil {
		vport = uint32(v)
	}
	go func() {
		if err := srv.ServeVsock(ctx, vport); err != nil {
			log.Info().Err(err).Msg("no vsock listener")
		}
	}()

	name := cmd.Get(agentproto.CmdlineAgentPort)
	if name == "" {
		name = agentproto.DefaultAgentPort
	}
	for {
		path, err := FindPort(name, 10*time.Second)
		if err != nil {
			fmt.Fprintf(console, "nexus-agent: %v\n", err)
			log.Error().Err(err).Msg("agent port")
			continue
		}
		log.Info().Str(logPath, path).Dur("boot", time.Since(start)).Msg("serving")
		if err := srv.ServePort(ctx, path); err != nil {
			fmt.Fprintf(console, "nexus-agent: %v\n", err)
			log.Error().Err(err).Msg("agent port")
			time.Sleep(time.Second)
		}
	}
}

// openConsole makes /dev/console the agent's stdin/stdout/stderr (the kernel gives init none
// when the initramfs has no /dev/console) and returns it.
func openConsole() io.Writer {
	fd, err := unix.Open("/dev/console", unix.O_RDWR|unix.O_NOCTTY|unix.O_CLOEXEC, 0)
	if err != nil {
		return io.Discard
	}
	for i := 0; i < 3; i++ {
		unix.Dup3(fd, i, 0)
	}
	return os.NewFile(uintptr(fd), "/dev/console")
}

func mount(src, target, fstype string, flags uintptr, data string) error {
	if err := os.MkdirAll(target, 0o755); err != nil {
		return fmt.Errorf("mount %s: %w", target, err)
	}
	if err := unix.Mount(src, target, fstype, flags, data); err != nil && err != unix.EBUSY {
		return fmt.Errorf("mount %s on %s: %w", fstype, target, err)
	}
	return nil
}

func earlyMounts() {
	mount("devtmpfs", "/dev", "devtmpfs", unix.MS_NOSUID, "mode=0755")
	mount("proc", "/proc", "proc", unix.MS_NOSUID|unix.MS_NODEV|unix.MS_NOEXEC, "")
	mount("sysfs", "/sys", "sysfs", unix.MS_NOSUID|unix.MS_NODEV|unix.MS_NOEXEC, "")
}

// switchRoot mounts the root disk and makes it / (like switch_root: move /dev, /proc, /sys into
// it, move it onto /, chroot). The initramfs stays in memory beneath (rootfs cannot be unmounted).
func switchRoot(cmd Cmdline) error {
	dev := cmd.Get(agentproto.CmdlineRoot)
	if dev == "" {
		return errors.New("no nexus.root on the kernel command line")
	}
	fstype := cmd.Get(agentproto.CmdlineRootFS)
	if fstype == "" {
		fstype = "ext4"
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		if _, err := os.Stat(dev); err == nil {
			break
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("root device %s did not appear", dev)
		}
		time.Sleep(10 * time.Millisecond) // devtmpfs creates the node asynchronously
	}
	if err := mount(dev, newRoot, fstype, 0, ""); err != nil {
		return err
	}
	for _, d := range []string{"/dev", "/proc", "/sys"} {
		if err := mount(d, newRoot+d, "", unix.MS_MOVE, ""); err != nil {
			return err
		}
	}
	if err := unix.Chdir(newRoot); err != nil {
		return fmt.Errorf("chdir %s: %w", newRoot, err)
	}
	if err := unix.Mount(".", "/", "", unix.MS_MOVE, ""); err != nil {
		return fmt.Errorf("move root: %w", err)
	}
	if err := unix.Chroot("."); err != nil {
		return fmt.Errorf("chroot: %w", err)
	}
	if err := unix.Chdir("/"); err != nil {
		return err
	}
	// An image need not have /etc (a pulled one made FROM scratch); the agent writes into it
	// (hostname, hosts, resolv.conf, machine-id, the CA).
	if err := os.MkdirAll("/etc", 0o755); err != nil {
		return fmt.Errorf("/etc: %w", err)
	}
	return nil
}

// systemMounts gives exec'd commands a normal system: /dev/pts, /dev/shm, /tmp, /run and the
// /dev/fd links.
func systemMounts() error {
	var errs []error
	add := func(err error) {
		if err != nil {
			errs = append(errs, err)
		}
	}
	// /dev, /proc and /sys were moved here from the initramfs by switchRoot.
	add(mount("devpts", "/dev/pts", "devpts", unix.MS_NOSUID|unix.MS_NOEXEC, "gid=5,mode=0620,ptmxmode=0666"))
	add(mount("tmpfs", "/dev/shm", "tmpfs", unix.MS_NOSUID|unix.MS_NODEV, "mode=1777"))
	add(mount("tmpfs", "/tmp", "tmpfs", unix.MS_NOSUID|unix.MS_NODEV, "mode=1777"))
	add(mount("tmpfs", "/run", "tmpfs", unix.MS_NOSUID|unix.MS_NODEV, "mode=0755"))
	for link, target := range map[string]string{
		"/dev/fd": "/proc/self/fd", "/dev/stdin": "/proc/self/fd/0",
		"/dev/stdout": "/proc/self/fd/1", "/dev/stderr": "/proc/self/fd/2",
	} {
		if _, err := os.Lstat(link); err != nil {
			os.Symlink(target, link)
		}
	}
	if _, err := os.Stat("/dev/ptmx"); err != nil {
		os.Symlink("pts/ptmx", "/dev/ptmx")
	}
	return errors.Join(errs...)
}

// bindAgentBinary makes the running agent binary available inside the new root as
// /run/nexus/bin/nexus-agent (for `nexus-agent selftest-vsock`, `nexus-agent dial-host`), and
// as nexus-why there: every image, pulled ones too, has the command.
func bindAgentBinary() error {
	target := filepath.Join(agentproto.GuestBinDir, "nexus-agent")
	if err := os.MkdirAll(agentproto.GuestBinDir, 0o755); err != nil {
		return err
	}
	why := filepath.Join(agentproto.GuestBinDir, "nexus-why")
	if _, err := os.Lstat(why); err != nil {
		if err := os.Symlink("nexus-agent", why); err != nil {
			return err
		}
	}
	if err := os.WriteFile(target, nil, 0o755); err != nil {
		return err
	}
	// /proc/self/exe still leads to the initramfs /init after the chroot.
	if err := unix.Mount("/proc/self/exe", target, "", unix.MS_BIND, ""); err == nil {
		return nil
	}
	src, err := os.Open("/proc/self/exe")
	if err != nil {
		return fmt.Errorf("agent binary: %w", err)
	}
	defer src.Close()
	dst, err := os.OpenFile(target, os.O_WRONLY|os.O_TRUNC, 0o755)
	if err != nil {
		return fmt.Errorf("agent binary: %w", err)
	}
	if _, err := io.Copy(dst, src); err != nil {
		dst.Close()
		return fmt.Errorf("agent binary: %w", err)
	}
	return dst.Close()
}

func setClock(t time.Time) error {
	tv := unix.NsecToTimeval(t.UnixNano())
	if err := unix.Settimeofday(&tv); err != nil {
		return fmt.Errorf("set clock: %w", err)
	}
	return nil
}

func setHostname(name string) error {
	if name == "" {
		return nil
	}
	if err := unix.Sethostname([]byte(name)); err != nil {
		return fmt.Errorf("hostname: %w", err)
	}
	os.WriteFile("/etc/hostname", []byte(name+"\n"), 0o644)
	hosts := "127.0.0.1\tlocalhost\n::1\tlocalhost ip6-localhost ip6-loopback\n127.0.1.1\t" + name + "\n"
	os.WriteFile("/etc/hosts", []byte(hosts), 0o644)
	return nil
}

func bootNetwork(cmd Cmdline) error {
	if err := LinkUp("lo"); err != nil {
		return err
	}
	addr := cmd.Get(agentproto.CmdlineIP)
	if addr == "" {
		return nil
	}
	deadline := time.Now().Add(5 * time.Second)
	for {
		if _, err := net.InterfaceByName("eth0"); err == nil {
			break
		}
		if time.Now().After(deadline) {
			return errors.New("network: eth0 did not appear")
		}
		time.Sleep(10 * time.Millisecond) // virtio_net probes asynchronously
	}
	if err := ConfigureInterface("eth0", agentproto.NetworkConfig{Address: addr, Gateway: cmd.Get(agentproto.CmdlineGateway)}); err != nil {
		return err
	}
	if dns := cmd.Get(agentproto.CmdlineDNS); dns != "" {
		return WriteResolvConf("/etc/resolv.conf", strings.Split(dns, ","))
	}
	return nil
}

// powerOff stops every process, syncs, remounts the root read-only and powers the VM off (QEMU
// exits). If power-off is refused it reboots, which with -no-reboot also ends QEMU.
func powerOff(log zerolog.Logger) {
	log.Info().Msg("powering off")
	unix.Kill(-1, unix.SIGTERM)
	deadline := time.Now().Add(3 * time.Second)
	for time.Now().Before(deadline) && othersAlive() {
		time.Sleep(50 * time.Millisecond) // processes have no exit event we can wait on as a set
	}
	unix.Kill(-1, unix.SIGKILL)
	unix.Sync()
	for _, m := range []string{"/tmp", "/run", "/dev/shm", "/dev/pts"} {
		unix.Unmount(m, unix.MNT_DETACH)
	}
	unix.Mount("", "/", "", unix.MS_REMOUNT|unix.MS_RDONLY, "")
	unix.Sync()
	if err := unix.Reboot(unix.LINUX_REBOOT_CMD_POWER_OFF); err != nil {
		log.Error().Err(err).Msg("power off")
		unix.Reboot(unix.LINUX_REBOOT_CMD_RESTART)
	}
}

// othersAlive reports whether any user process other than the agent (and kernel threads) runs.
func othersAlive() bool {
	ents, _ := os.ReadDir("/proc")
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil || pid == 1 {
			continue
		}
		if b, err := os.ReadFile("/proc/" + e.Name() + "/cmdline"); err == nil && len(b) > 0 {
			return true
		}
	}
	return false
}
