package qemu

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/IniZio/nexus/pkg/atomicfile"
	"github.com/IniZio/nexus/services/vmm/initramfs"
)

// accelRecord is one entry of accel.json.
type accelRecord struct {
	Accel    string    `json:"accel"`
	Reason   string    `json:"reason"`
	ProbedAt time.Time `json:"probed_at"`
	BootMS   int64     `json:"boot_ms,omitempty"`
}

// Accelerator returns the accelerator to boot kernel with. With Config.Accel auto it is kvm only
// when a probe boot of that very kernel under KVM reaches /init within ProbeTimeout (a KVM that
// cannot run a stock guest, such as a paravirtual nested one, hangs instead); otherwise tcg. The
// result is cached in <CacheDir>/accel.json by QEMU version and kernel version.
func (d *Driver) Accelerator(ctx context.Context, kernel, kernelVersion string) (string, error) {
	if d.cfg.Accel != AccelAuto {
		return d.cfg.Accel, nil
	}
	if kernelVersion == "" {
		st, err := os.Stat(kernel)
		if err != nil {
			return "", fmt.Errorf("accelerator: %w", err)
		}
		kernelVersion = filepath.Base(kernel) + ":" + strconv.FormatInt(st.Size(), 10)
	}
	key := "qemu " + d.version + " kernel " + kernelVersion
	d.mu.Lock()
	defer d.mu.Unlock()
	if a, ok := d.accel[key]; ok {
		return a, nil
	}
	file := ""
	if d.cfg.CacheDir != "" {
		file = filepath.Join(d.cfg.CacheDir, "accel.json")
		if rec, ok := readAccel(file)[key]; ok && (rec.Accel == AccelKVM || rec.Accel == AccelTCG) {
			d.accel[key] = rec.Accel
			return rec.Accel, nil
		}
	}
	rec := d.probe(ctx, kernel)
	if ctx.Err() != nil {
		return "", fmt.Errorf("accelerator probe: %w", ctx.Err())
	}
	d.cfg.Logger.Info().Str("accel", rec.Accel).Str("reason", rec.Reason).Msg("accelerator probed")
	d.accel[key] = rec.Accel
	if file != "" {
		if err := os.MkdirAll(d.cfg.CacheDir, 0o755); err == nil {
			// Read-modify-write under a lock so concurrent probes of other keys are kept.
			if unlock, err := flock(filepath.Join(d.cfg.CacheDir, "accel.lock")); err == nil {
				all := readAccel(file)
				all[key] = rec
				b, _ := json.MarshalIndent(all, "", "  ")
				atomicfile.WriteFile(file, b, 0o600)
				unlock()
			}
		}
	}
	return rec.Accel, nil
}

func (d *Driver) probe(ctx context.Context, kernel string) accelRecord {
	now := time.Now().UTC()
	f, err := os.OpenFile("/dev/kvm", os.O_RDWR, 0)
	if err != nil {
		return accelRecord{Accel: AccelTCG, Reason: "no usable /dev/kvm: " + err.Error(), ProbedAt: now}
	}
	f.Close()
	dir := os.TempDir()
	if d.cfg.CacheDir != "" {
		dir = filepath.Join(d.cfg.CacheDir, "probe")
	}
	initrd, err := initramfs.BuildProbe(dir)
	if err != nil {
		return accelRecord{Accel: AccelTCG, Reason: "probe initramfs: " + err.Error(), ProbedAt: now}
	}
	ctx, cancel := context.WithTimeout(ctx, d.cfg.ProbeTimeout)
	defer cancel()
	dt, err := d.BootToMarker(ctx, BootSpec{Kernel: kernel, Initrd: initrd, Accel: AccelKVM, Marker: initramfs.ProbeMarker})
	if err != nil {
		return accelRecord{Accel: AccelTCG, Reason: "kvm probe boot failed: " + err.Error(), ProbedAt: now}
	}
	return accelRecord{Accel: AccelKVM, Reason: "kvm probe boot reached /init", ProbedAt: now, BootMS: dt.Milliseconds()}
}

func readAccel(file string) map[string]accelRecord {
	m := map[string]accelRecord{}
	if b, err := os.ReadFile(file); err == nil && len(b) < 1<<20 {
		json.Unmarshal(b, &m)
	}
	return m
}

// BootSpec is a bare boot: kernel + initramfs, serial console on a pipe, no devices.
type BootSpec struct {
	Kernel, Initrd string
	Accel          string // kvm or tcg
	MemoryMiB      int    // default 256
	VCPUs          int    // default 1
	Marker         string // console text that ends the measurement
	Cmdline        []string
	// RAMFile backs guest RAM with a shared file in /dev/shm, as Start does.
	RAMFile bool
}

// BootToMarker boots spec and returns the wall time from exec to Marker on the console. QEMU is
// killed once the marker is seen (or on error); ctx bounds the whole boot.
func (d *Driver) BootToMarker(ctx context.Context, spec BootSpec) (time.Duration, error) {
	vm, err := d.StartBare(ctx, spec)
	if err != nil {
		return 0, err
	}
	vm.Stop()
	return vm.Boot, nil
}

// BareVM is a bare boot left running once its marker was seen (StartBare).
type BareVM struct {
	// Pid is QEMU's process id.
	Pid int
	// Boot is the wall time from exec to the marker on the console.
	Boot time.Duration
	stop func()
}

// Stop kills QEMU and waits for it to exit.
func (v *BareVM) Stop() { v.stop() }

// StartBare boots spec and returns once Marker is on the console, QEMU still running (its
// console still drained) until Stop; ctx bounds the boot, not the VM's life after it.
func (d *Driver) StartBare(ctx context.Context, spec BootSpec) (*BareVM, error) {
	if spec.MemoryMiB == 0 {
		spec.MemoryMiB = 256
	}
	if spec.VCPUs == 0 {
		spec.VCPUs = 1
	}
	cpu, accel, name := "max", "tcg,thread=multi", AccelTCG
	if spec.Accel == AccelKVM {
		cpu, accel, name = "host", "kvm", AccelKVM
	}
	mem := strconv.Itoa(spec.MemoryMiB) + "M"
	cmdline := strings.Join(append(baseCmdline(name), spec.Cmdline...), " ")
	machine := "microvm,x-option-roms=off"
	args := []string{"-accel", accel, "-cpu", cpu, "-m", mem, "-smp", strconv.Itoa(spec.VCPUs)}
	ram := ""
	if spec.RAMFile {
		f, err := os.CreateTemp("/dev/shm", "nexus-boot-*.ram")
		if err != nil {
			return nil, err
		}
		f.Close()
		ram = f.Name()
		machine += ",memory-backend=mem"
		args = append(args, "-object", "memory-backend-file,id=mem,size="+mem+",mem-path="+ram+",share=on")
	}
	args = append(args, "-M", machine, "-nodefaults", "-no-user-config", "-nographic", "-no-reboot",
		"-kernel", spec.Kernel, "-initrd", spec.Initrd, "-append", cmdline, "-serial", "stdio")
	cmd := exec.Command(d.binary, args...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	removeRAM := func() {
		if ram != "" {
			os.Remove(ram)
		}
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		removeRAM()
		return nil, err
	}
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	start := time.Now()
	if err := cmd.Start(); err != nil {
		removeRAM()
		return nil, fmt.Errorf("boot: %w", err)
	}
	found := make(chan time.Duration, 1)
	go func() {
		sc := bufio.NewScanner(stdout)
		sc.Buffer(make([]byte, 4096), 64<<10)
		for sc.Scan() {
			if bytes.Contains(sc.Bytes(), []byte(spec.Marker)) {
				found <- time.Since(start)
				break
			}
		}
		// Keep draining so QEMU never blocks on a full pipe.
		for sc.Scan() {
		}
		close(found)
	}()
	stop := func() {
		cmd.Process.Kill()
		cmd.Wait()
		removeRAM()
	}
	select {
	case dt, ok := <-found:
		if !ok {
			stop()
			return nil, fmt.Errorf("boot: qemu exited before %q: %s", spec.Marker, lastOf(stderr.String()))
		}
		return &BareVM{Pid: cmd.Process.Pid, Boot: dt, stop: sync.OnceFunc(stop)}, nil
	case <-ctx.Done():
		stop()
		return nil, fmt.Errorf("boot: no %q on the console: %w", spec.Marker, ctx.Err())
	}
}

func lastOf(s string) string {
	s = string(bytes.TrimSpace([]byte(s)))
	if i := bytes.LastIndexByte([]byte(s), '\n'); i >= 0 {
		s = s[i+1:]
	}
	if len(s) > 300 {
		s = s[:300]
	}
	return s
}

// flock takes an exclusive lock on path (blocking).
func flock(path string) (func(), error) {
	f, err := os.OpenFile(path, os.O_CREATE|os.O_RDWR, 0o644)
	if err != nil {
		return nil, err
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX); err != nil {
		f.Close()
		return nil, err
	}
	return func() { syscall.Flock(int(f.Fd()), syscall.LOCK_UN); f.Close() }, nil
}
