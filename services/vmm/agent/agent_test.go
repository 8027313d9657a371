package agent

import (
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/rs/zerolog"
	"golang.org/x/sys/unix"

	"github.com/IniZio/nexus/pkg/agentproto"
)

func TestCmdline(t *testing.T) {
	c := ParseCmdline(`console=ttyS0 reboot=t virtio_mmio.device=4K@0xfeb00000:12 virtio-mmio.device=4K@0xfeb00200:13 ` +
		`nexus.root=/dev/vda nexus.ip=192.168.127.2/24 quiet foo.bar="a b" nexus.hostname=old nexus.hostname=box` + "\n")
	if got := c.Get(agentproto.CmdlineRoot); got != "/dev/vda" {
		t.Fatalf("root %q", got)
	}
	if got := c.Get(agentproto.CmdlineHostname); got != "box" {
		t.Fatalf("last value wins: %q", got)
	}
	if got := c.Get(agentproto.CmdlineDNS); got != "" {
		t.Fatalf("absent: %q", got)
	}
	if got := c.ModuleParams("virtio_mmio"); got != "device=4K@0xfeb00000:12 device=4K@0xfeb00200:13" {
		t.Fatalf("module params %q", got)
	}
	if got := c.ModuleParams("foo"); got != `bar="a b"` {
		t.Fatalf("quoted %q", got)
	}
	if got := c.ModuleParams("virtio_blk"); got != "" {
		t.Fatalf("none %q", got)
	}
	if moduleName("/lib/modules/6.1.0/kernel/drivers/virtio/virtio-mmio.ko") != "virtio_mmio" {
		t.Fatal("module name")
	}
}

func TestRing(t *testing.T) {
	r := NewRing(10)
	r.Write([]byte("abc"))
	if string(r.Bytes()) != "abc" {
		t.Fatal(string(r.Bytes()))
	}
	r.Write([]byte("defghij"))
	if string(r.Bytes()) != "abcdefghij" {
		t.Fatal(string(r.Bytes()))
	}
	r.Write([]byte("klm"))
	if string(r.Bytes()) != "defghijklm" {
		t.Fatal(string(r.Bytes()))
	}
	r.Write([]byte("0123456789XYZ"))
	if string(r.Bytes()) != "3456789XYZ" {
		t.Fatal(string(r.Bytes()))
	}
	for i := 0; i < 7; i++ {
		r.Write([]byte("ab"))
	}
	if got := string(r.Bytes()); got != "ababababab" {
		t.Fatal(got)
	}
}

func TestModuleList(t *testing.T) {
	n, err := LoadModules(filepath.Join(t.TempDir(), "none"), Cmdline{})
	if n != 0 || err != nil {
		t.Fatal(n, err)
	}
	list := filepath.Join(t.TempDir(), "modules")
	os.WriteFile(list, []byte("# comment\n\n/nonexistent/a.ko\n"+agentproto.SharesModulesMarker+"\n/nonexistent/9p.ko\n"), 0o644)
	if _, err := LoadModules(list, Cmdline{}); err == nil || !strings.Contains(err.Error(), "/nonexistent/a.ko") || strings.Contains(err.Error(), "9p") {
		t.Fatalf("without shares: %v", err)
	}
	withShares := ParseCmdline(agentproto.CmdlineShares + "=1")
	if _, err := LoadModules(list, withShares); err == nil || !strings.Contains(err.Error(), "/nonexistent/9p.ko") {
		t.Fatalf("with shares: %v", err)
	}
}

// TestReaper runs the agent as a child subreaper in a helper process: orphans are reaped, and
// exec still gets its own children's exit codes.
func TestReaper(t *testing.T) {
	if os.Getenv("NEXUS_REAPER_HELPER") == "1" {
		reaperHelper(t)
		return
	}
	cmd := exec.Command(os.Args[0], "-test.run=^TestReaper$", "-test.v")
	cmd.Env = append(os.Environ(), "NEXUS_REAPER_HELPER=1")
	out, err := cmd.CombinedOutput()
	if err != nil || !strings.Contains(string(out), "reaper ok") {
		t.Fatalf("helper: %v\n%s", err, out)
	}
}

func reaperHelper(t *testing.T) {
	if err := unix.Prctl(unix.PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0); err != nil {
		t.Fatal(err)
	}
	r := NewReaper()
	stop := make(chan struct{})
	defer close(stop)
	go r.Run(stop)
	srv, _ := New(Config{Logger: zerolog.Nop(), Env: []string{"PATH=" + os.Getenv("PATH")}, Reaper: r})
	for i := 0; i < 20; i++ {
		cmd := exec.Command("sh", "-c", "sleep 0.05 & exit 3")
		wait, err := srv.startProcess(cmd)
		if err != nil {
			t.Fatal(err)
		}
		if ws := wait(); ws.ExitStatus() != 3 {
			t.Fatalf("exit %d", ws.ExitStatus())
		}
	}
	// The orphaned sleeps were re-parented to us; the reaper must leave no zombie.
	deadline := time.Now().Add(10 * time.Second)
	for {
		z := zombies(t)
		if z == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d zombies left", z)
		}
		time.Sleep(20 * time.Millisecond)
	}
	t.Log("reaper ok")
}

func zombies(t *testing.T) int {
	ents, _ := os.ReadDir("/proc")
	me := os.Getpid()
	n := 0
	for _, e := range ents {
		b, err := os.ReadFile("/proc/" + e.Name() + "/stat")
		if err != nil {
			continue
		}
		s := string(b)
		i := strings.LastIndexByte(s, ')')
		f := strings.Fields(s[i+1:])
		if len(f) > 2 && f[0] == "Z" && f[1] == strconv.Itoa(me) {
			n++
		}
	}
	return n
}

// TestConfigureInterface configures lo in a fresh network namespace over netlink.
func TestConfigureInterface(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root for a network namespace")
	}
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread() // never unlocked: the thread dies with its namespace
		if err := unix.Unshare(unix.CLONE_NEWNET); err != nil {
			errc <- err
			return
		}
		err := ConfigureInterface("lo", agentproto.NetworkConfig{Address: "10.77.0.2/24", Gateway: "10.77.0.1"})
		if err != nil {
			errc <- err
			return
		}
		// Again: already configured is fine.
		if err := ConfigureInterface("lo", agentproto.NetworkConfig{Address: "10.77.0.2/24", Gateway: "10.77.0.1"}); err != nil {
			errc <- err
			return
		}
		ifc, _ := net.InterfaceByName("lo")
		addrs, _ := ifc.Addrs()
		var found bool
		for _, a := range addrs {
			if a.String() == "10.77.0.2/24" {
				found = true
			}
		}
		route, _ := os.ReadFile("/proc/thread-self/net/route")
		if !found || ifc.Flags&net.FlagUp == 0 || !strings.Contains(string(route), "01004D0A") {
			errc <- &net.AddrError{Err: "not configured: " + string(route), Addr: ifc.Flags.String()}
			return
		}
		errc <- nil
	}()
	if err := <-errc; err != nil {
		if err == syscall.EPERM {
			t.Skip("unshare not permitted here")
		}
		t.Fatal(err)
	}
	if err := ConfigureInterface("lo", agentproto.NetworkConfig{Address: "nonsense"}); err == nil {
		t.Fatal("bad address accepted")
	}
}

func TestWriteResolvConf(t *testing.T) {
	p := filepath.Join(t.TempDir(), "resolv.conf")
	if err := WriteResolvConf(p, []string{"192.168.127.1", "1.1.1.1"}); err != nil {
		t.Fatal(err)
	}
	b, _ := os.ReadFile(p)
	if string(b) != "nameserver 192.168.127.1\nnameserver 1.1.1.1\n" {
		t.Fatalf("%q", b)
	}
	if err := WriteResolvConf(p, []string{"evil\nsearch x"}); err == nil {
		t.Fatal("bad dns accepted")
	}
}
