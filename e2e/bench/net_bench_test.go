package bench

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"os"
	osexec "os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/IniZio/nexus/internal/testutil"
	api "github.com/IniZio/nexus/pkg/api/gateway"
	netapi "github.com/IniZio/nexus/pkg/api/netstack"
	"github.com/IniZio/nexus/services/vmm/guest"
	"github.com/IniZio/nexus/services/vmm/image"
	"github.com/IniZio/nexus/services/vmm/initramfs"
	"github.com/IniZio/nexus/services/vmm/kernel"
	"github.com/IniZio/nexus/services/vmm/qemu"
)

const (
	netHost      = "bench.test" // the netstack resolves it to the HTTP server below (--resolve)
	netBlob      = 64 << 20     // bytes per download
	netRequests  = 50           // tiny requests, each on a new connection, per iteration
	netDownloads = 3            // blob downloads per iteration
	netMemMiB    = 1024         // the gateway's default sandbox memory; every row uses it
)

// netPort is the loopback port of the HTTP server every guest downloads from.
var netPort int

// startNetServer serves /tiny (2 bytes) and /blob (64 MiB) on the host's loopback for the life
// of the process and returns the --resolve flag mapping bench.test to it. TestMain passes
// it to the stack; no other benchmark uses that name.
func startNetServer() (string, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", err
	}
	netPort = l.Addr().(*net.TCPAddr).Port
	blob := make([]byte, netBlob)
	mux := http.NewServeMux()
	mux.HandleFunc("/tiny", func(w http.ResponseWriter, r *http.Request) { w.Write([]byte("ok")) })
	mux.HandleFunc("/blob", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Length", strconv.Itoa(len(blob)))
		w.Write(blob)
	})
	go http.Serve(l, mux)
	return "--resolve=" + netHost + "=" + l.Addr().String(), nil
}

// shell runs a script in a guest and returns its stdout.
type shell func(ctx context.Context, script string) (string, error)

// BenchmarkGuestNet measures, from inside the same nexus-base guest with curl, connection setup
// plus first byte of a tiny response (p50 over 50 fresh connections) and the throughput of a
// 64 MiB download from an HTTP server in this process, through the netstack (a sandbox allowed
// bench.test:<port>) and, as reference rows, QEMU's user networking (slirp) and passt. The
// reference rows also report netstack ÷ them: netstack-MB/s-ratio (goal ≥ 0.9 against the
// fastest) and netstack-connect-ratio.
func BenchmarkGuestNet(b *testing.B) {
	var ns struct{ mbps, p50 float64 }
	b.Run("netstack", func(b *testing.B) {
		sh := netSandbox(b, "bench/net")
		out, err := sh(context.Background(), "getent hosts "+netHost)
		if err != nil {
			b.Fatal(err)
		}
		ns.mbps, ns.p50 = measureNet(b, sh, strings.Fields(out)[0])
	})
	// slirp's gateway 10.0.2.2 and passt's gateway (given the same address) reach the host's
	// loopback.
	reference := func(b *testing.B, id string, netdev []string) {
		mbps, p50 := measureNet(b, bootDirect(b, id, netdev), "10.0.2.2")
		if ns.mbps > 0 {
			b.ReportMetric(ns.mbps/mbps, "netstack-MB/s-ratio")
			b.ReportMetric(ns.p50/p50, "netstack-connect-ratio")
		}
	}
	b.Run("qemu-user", func(b *testing.B) {
		reference(b, "bench-slirp", []string{"-netdev", "user,id=net0"})
	})
	b.Run("passt", func(b *testing.B) {
		sock := startPasst(b)
		reference(b, "bench-passt", []string{"-netdev", "stream,id=net0,server=off,addr.type=unix,addr.path=" + sock})
	})
}

// measureNet runs the latency and throughput samples against the server at ip:netPort, once
// per iteration, reports them and returns MB/s and the connect p50 in milliseconds.
func measureNet(b *testing.B, sh shell, ip string) (float64, float64) {
	b.Helper()
	url := fmt.Sprintf("http://%s:%d", ip, netPort)
	ctx := context.Background()
	if _, err := sh(ctx, "curl -sSf -o /dev/null "+url+"/tiny"); err != nil { // warm: ARP, page cache
		b.Fatal(err)
	}
	latency := fmt.Sprintf(`for i in $(seq %d); do curl -sSf -o /dev/null -w '%%{time_starttransfer}\n' %s/tiny || exit 1; done`, netRequests, url)
	download := fmt.Sprintf(`for i in $(seq %d); do curl -sSf -o /dev/null -w '%%{size_download} %%{time_total}\n' %s/blob || exit 1; done`, netDownloads, url)
	var lat []time.Duration
	var total, secs float64
	for b.Loop() {
		out, err := sh(ctx, latency)
		if err != nil {
			b.Fatal(err)
		}
		times := strings.Fields(out)
		if len(times) != netRequests {
			b.Fatalf("latency: %d of %d times in %q", len(times), netRequests, out)
		}
		for _, f := range times {
			s, err := strconv.ParseFloat(f, 64)
			if err != nil {
				b.Fatalf("curl time %q: %v", f, err)
			}
			lat = append(lat, time.Duration(s*float64(time.Second)))
		}
		out, err = sh(ctx, download)
		if err != nil {
			b.Fatal(err)
		}
		for _, line := range strings.Split(strings.TrimSpace(out), "\n") {
			var n, t float64
			if _, err := fmt.Sscan(line, &n, &t); err != nil || n != netBlob || t <= 0 {
				b.Fatalf("download: %q (%v)", line, err)
			}
			total += n
			secs += t
		}
	}
	mbps, p50 := total/secs/1e6, percentile(lat, 0.5)
	b.ReportMetric(mbps, "MB/s")
	b.ReportMetric(p50, "connect-p50-ms")
	return mbps, p50
}

// netSandbox creates a nexus-base sandbox allowed to reach bench.test:<port> and returns a
// shell in it; the sandbox is removed afterwards.
func netSandbox(b *testing.B, name string) shell {
	b.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute) // may build nexus-base
	defer cancel()
	sb, err := client.Create(ctx, api.CreateRequest{Name: name, Image: image.Base, MemoryMiB: netMemMiB, VCPUs: 1,
		AllowHosts: []string{fmt.Sprintf("%s:%d", netHost, netPort)}, Labels: map[string]string{"nexus-test": "1"},
		// The data path is measured, not the default ingress budget (100 MiB/s).
		Limits: netapi.Limits{IngressBandwidth: 1 << 40}})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { remove(name) })
	var vm struct{ Accel string }
	raw, _ := os.ReadFile(filepath.Join(stack.Home.Sandbox(sb.ID), "vm.json"))
	json.Unmarshal(raw, &vm)
	b.Logf("%s: accel %s", name, vm.Accel) // the reference rows must run on the same one
	return func(ctx context.Context, script string) (string, error) {
		ctx, cancel := context.WithTimeout(ctx, 5*time.Minute)
		defer cancel()
		var out, errOut bytes.Buffer
		exit, err := client.Run(ctx, api.ExecRequest{Name: name, Argv: []string{"sh", "-c", script}}, api.IO{Stdout: &out, Stderr: &errOut})
		if err == nil && exit.Code != 0 {
			err = fmt.Errorf("%s: exit %d %s %s", script, exit.Code, exit.Error, errOut.Bytes())
		}
		return out.String(), err
	}
}

// bootDirect boots the sandbox's kernel, initramfs (agent) and a nexus-base overlay straight
// on QEMU, without nexus, its NIC on netdev and eth0 set up as slirp's default guest
// (10.0.2.15/24 via 10.0.2.2). It returns a shell through the agent; QEMU is killed afterwards.
func bootDirect(b *testing.B, id string, netdev []string) shell {
	b.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	k, err := kernel.Ensure(ctx, testutil.CacheDir(), nil)
	if err != nil {
		b.Fatal(err)
	}
	bin, err := testutil.Binaries()
	if err != nil {
		b.Fatal(err)
	}
	initrd, err := initramfs.Build(k, filepath.Join(bin, "nexus-agent"), initramfs.DefaultModules, filepath.Join(testutil.CacheDir(), "initramfs"))
	if err != nil {
		b.Fatal(err)
	}
	base, err := image.Build(ctx, stack.Home, testutil.CacheDir(), image.Base, false, nil)
	if err != nil {
		b.Fatal(err)
	}
	dir := b.TempDir()
	disk := filepath.Join(dir, "root.qcow2")
	if err := image.NewOverlay(base.Path, disk); err != nil {
		b.Fatal(err)
	}
	d, err := qemu.New(qemu.Config{Accel: os.Getenv("NEXUS_ACCEL"), CacheDir: testutil.CacheDir(), Logger: zerolog.Nop()})
	if err != nil {
		b.Fatal(err)
	}
	kern := k.VmlinuxPath
	if kern == "" {
		kern = k.VmlinuzPath
	}
	vm, err := d.Start(ctx, qemu.VMSpec{ID: id, Dir: dir, Kernel: kern, KernelVersion: k.Version, Initrd: initrd,
		MemoryMiB: netMemMiB, VCPUs: 1, Disk: disk, NetdevArgs: netdev, Net: &qemu.GuestNet{IP: "10.0.2.15/24", Gateway: "10.0.2.2"}})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { vm.Kill(); vm.Cleanup() })
	actx, acancel := context.WithTimeout(ctx, 2*time.Minute)
	defer acancel()
	go func() { // a guest that dies while booting ends the wait at once
		select {
		case <-vm.Done():
			acancel()
		case <-actx.Done():
		}
	}()
	agent, err := guest.Dial(actx, qemu.AgentSocket(dir))
	if err != nil {
		console, _ := os.ReadFile(qemu.ConsoleLog(dir))
		b.Fatalf("agent: %v; console: %s", err, tail(console))
	}
	b.Cleanup(func() { agent.Close() })
	if errs := agent.Agent().BootErrors; len(errs) > 0 {
		b.Fatalf("guest boot: %s", strings.Join(errs, "; "))
	}
	b.Logf("%s: qemu pid %d, accel %s", id, vm.Pid(), vm.Accel())
	return func(ctx context.Context, script string) (string, error) {
		ctx, cancel := context.WithTimeout(ctx, 5*time.Minute)
		defer cancel()
		var out, errOut bytes.Buffer
		st, err := agent.Exec(ctx, guest.ExecRequest{Argv: []string{"sh", "-c", script}}, nil, &out, &errOut, nil)
		if err == nil && st.Code != 0 {
			err = fmt.Errorf("%s: exit %d %s %s", script, st.Code, st.Error, errOut.Bytes())
		}
		return out.String(), err
	}
}

// startPasst runs passt for one guest and returns its socket; passt is killed (by pid)
// afterwards. Its DHCP answers would hand out the same addresses the agent configures, and
// connections to the gateway address go to the host's loopback.
func startPasst(b *testing.B) string {
	b.Helper()
	bin, err := osexec.LookPath("passt")
	if err != nil {
		b.Skip("passt is not installed (Debian: apt-get install passt)")
	}
	dir := b.TempDir()
	sock := filepath.Join(dir, "passt.sock")
	logf, err := os.Create(filepath.Join(dir, "passt.log"))
	if err != nil {
		b.Fatal(err)
	}
	defer logf.Close()
	// --runas 0: as root passt would switch to nobody, who cannot create the socket in our
	// private temp dir.
	cmd := osexec.Command(bin, "--foreground", "--stderr", "--runas", "0", "--ipv4-only", "--socket", sock,
		"--address", "10.0.2.15", "--netmask", "24", "--gateway", "10.0.2.2")
	cmd.Stdout, cmd.Stderr = logf, logf
	if err := cmd.Start(); err != nil {
		b.Fatal(err)
	}
	exited := make(chan struct{})
	go func() { cmd.Wait(); close(exited) }()
	b.Cleanup(func() { cmd.Process.Kill(); <-exited })
	err = testutil.Poll(10*time.Second, func() error {
		select {
		case <-exited:
			log, _ := os.ReadFile(logf.Name())
			return fmt.Errorf("passt exited: %s", tail(log))
		default:
		}
		_, err := os.Stat(sock)
		return err
	})
	if err != nil {
		b.Fatal(err)
	}
	return sock
}
