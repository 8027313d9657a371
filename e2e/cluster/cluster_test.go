// Package cluster_test stands up a three-host cluster on this machine (issue 25): three network
// namespaces on a private bridge (testutil.NewLAN), each a host with its own HOME, NEXUS_HOME,
// bus node and services, joined as deploy/README.md says (`nexus cluster init` on h1, a join
// token each for h2 and h3, `nexus up` in every namespace). From h1's CLI it places sandboxes
// across the hosts and execs into each; from h1's and h2's CLIs it runs cp, logs, attach, ports
// and audit against the one on h3 (its forward opening on h3's 127.0.0.1). It kills every
// process of one host (its bus node and VMs included), and checks that its sandbox fails with "host h3 lost", that a new sandbox avoids
// it, that the audit stream and the registry lost nothing, and that the host's sandbox is
// cleaned up when it comes back; then it kills only the nexus of another host, whose VM runs on,
// and checks that the sandbox, failed as lost, is running again, the same VM, once the host's
// nexus is back. scripts/cluster-demo.sh (make cluster-demo) runs the same steps
// for people to watch. Traffic stays on the bridge and in the namespaces' loopbacks.
package cluster_test

import (
	"bufio"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/IniZio/nexus/internal/testutil"
)

func TestMain(m *testing.M) {
	if err := testutil.QEMUAvailable(); err != nil {
		if os.Getenv("CI") != "" {
			fmt.Fprintln(os.Stderr, "CI needs QEMU:", err)
			os.Exit(1)
		}
		fmt.Fprintln(os.Stderr, "skipping VM tests:", err)
		os.Exit(0)
	}
	code := m.Run()
	closeBench()
	os.Exit(code)
}

// label marks the test's sandboxes (testutil's Stop removes nexus-test ones).
const label = "nexus-test=cluster"

type sandbox struct {
	ID     string `json:"id"`
	Name   string `json:"name"`
	Host   string `json:"host"`
	State  string `json:"state"`
	Reason string `json:"reason"`
}

type hostRow struct {
	Host          string `json:"host"`
	State         string `json:"state"`
	MemoryUsedMiB int    `json:"memory_used_mib"`
	Running       int    `json:"running"`
}

// cluster is the three hosts; the CLI of every check runs on h1, the control host.
type cluster struct {
	lan   *testutil.LAN
	hosts []*testutil.Stack // h1, h2, h3
}

func (c *cluster) cli(t testing.TB, args ...string) string {
	t.Helper()
	return c.hosts[0].MustNexus(t, args...)
}

func (c *cluster) sandboxes(t testing.TB) map[string]sandbox {
	t.Helper()
	var list []sandbox
	if err := json.Unmarshal([]byte(c.cli(t, "ps", "-a", "--json")), &list); err != nil {
		t.Fatalf("ps --json: %v", err)
	}
	out := map[string]sandbox{}
	for _, s := range list {
		out[s.Name] = s
	}
	return out
}

func (c *cluster) hostRows(t testing.TB) ([]hostRow, error) {
	out, errOut, code := c.hosts[0].Nexus(t, "hosts", "--json")
	if code != 0 {
		return nil, fmt.Errorf("nexus hosts: exit %d: %s", code, errOut)
	}
	var rows []hostRow
	err := json.Unmarshal([]byte(out), &rows)
	return rows, err
}

// auditEvents are the audit stream's egress events as h1's CLI reads them, by sandbox name.
func (c *cluster) auditEvents(t *testing.T) (total int, by map[string]int) {
	t.Helper()
	by = map[string]int{}
	sc := bufio.NewScanner(strings.NewReader(c.cli(t, "audit", "tail", "--json")))
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		var e struct {
			Name string `json:"sandbox_name"`
		}
		if json.Unmarshal(sc.Bytes(), &e) == nil {
			total++
			by[e.Name]++
		}
	}
	return total, by
}

// waitSandbox waits until want holds for sandbox name and returns it.
func (c *cluster) waitSandbox(t *testing.T, name string, d time.Duration, want func(sandbox) error) sandbox {
	t.Helper()
	var got sandbox
	testutil.WaitFor(t, d, func() error {
		out, errOut, code := c.hosts[0].Nexus(t, "ps", "-a", "--json")
		if code != 0 {
			return fmt.Errorf("ps: exit %d: %s", code, errOut)
		}
		var list []sandbox
		if err := json.Unmarshal([]byte(out), &list); err != nil {
			return err
		}
		for _, s := range list {
			if s.Name == name {
				got = s
				return want(s)
			}
		}
		return fmt.Errorf("no sandbox %s", name)
	})
	return got
}

// startCluster stands up three hosts for t, removed at its cleanup.
func startCluster(t *testing.T) *cluster {
	c := &cluster{lan: testutil.NewLAN(t, 3)}
	t.Cleanup(c.stop)  // before the LAN is removed (cleanups run last first)
	t.Cleanup(func() { // before the stacks stop: what each host said, and its guests' logs
		if t.Failed() {
			for _, st := range c.hosts {
				dumpHost(t, st)
			}
		}
	})
	c.start(t)
	return c
}

// start makes every host of c's LAN a host of the cluster (h1, h2, …): `nexus cluster init` on
// h1, a join token for each of the others, `nexus up` in every namespace, and returns once h1's
// services answer and every host heartbeats. The hosts it started are in c.hosts for stop, even
// when it fails t midway.
func (c *cluster) start(t testing.TB) {
	t.Helper()
	lan := c.lan
	var names []string
	for i := range lan.Hosts {
		st, err := testutil.NewStack(testutil.StackOptions{
			Netns: lan.Hosts[i].Netns,
			// A cluster node serves nothing until a quorum of nodes is up, and h1 must answer
			// joins before that: readiness is checked below, cluster-wide.
			Ready: func(*testutil.Stack) error { return nil },
		})
		if err != nil {
			t.Fatal(err)
		}
		c.hosts = append(c.hosts, st)
		names = append(names, fmt.Sprintf("h%d", i+1))
	}
	h1 := c.hosts[0]
	h1.MustNexus(t, "cluster", "init", "--host", "h1", "--advertise", lan.Hosts[0].Addr.String())
	if err := h1.Start(); err != nil {
		t.Fatal(err)
	}
	for i := 1; i < len(c.hosts); i++ {
		token := strings.TrimSpace(h1.MustNexus(t, "cluster", "token", "create", "--ttl", "10m"))
		// h1's bus answers joins once it listens; until then the join cannot reach it.
		testutil.WaitFor(t, 60*time.Second, func() error {
			_, errOut, code := c.hosts[i].Nexus(t, "cluster", "join", token, "--host", names[i], "--advertise", lan.Hosts[i].Addr.String())
			if code != 0 {
				return fmt.Errorf("join %s: exit %d: %s", names[i], code, errOut)
			}
			return nil
		})
		if err := c.hosts[i].Start(); err != nil {
			t.Fatal(err)
		}
	}
	testutil.WaitFor(t, 2*time.Minute, func() error {
		if _, _, code := h1.Nexus(t, "status"); code != 0 {
			return fmt.Errorf("not every service answers on h1")
		}
		return c.hostsUp(t, names...)
	})
}

// stop stops every host's stack, its sandboxes removed, h1 (the gateway's host) last.
func (c *cluster) stop() {
	for i := len(c.hosts) - 1; i >= 0; i-- {
		c.hosts[i].Stop()
	}
}

// dumpHost logs the tail of a host's warnings and errors and its sandboxes' QEMU and console
// logs, for a failed run.
func dumpHost(t *testing.T, st *testutil.Stack) {
	var lines []string
	for _, l := range strings.Split(st.Log(), "\n") {
		if !strings.Contains(l, " DBG ") || strings.Contains(l, "qemu") || strings.Contains(l, "exit") {
			lines = append(lines, l)
		}
	}
	t.Logf("---- %s: log tail\n%s", st.Home, strings.Join(lines[max(0, len(lines)-60):], "\n"))
	logs, _ := filepath.Glob(filepath.Join(st.Home.Sandboxes(), "*", "*.log"))
	for _, f := range logs {
		b, _ := os.ReadFile(f)
		t.Logf("---- %s\n%s", f, b[max(0, len(b)-3000):])
	}
}

// hostsUp says whether exactly these hosts are up.
func (c *cluster) hostsUp(t testing.TB, want ...string) error {
	rows, err := c.hostRows(t)
	if err != nil {
		return err
	}
	var up []string
	for _, r := range rows {
		if r.State == "up" {
			up = append(up, r.Host)
		}
	}
	if !slices.Equal(up, want) {
		return fmt.Errorf("hosts up %v, want %v (%+v)", up, want, rows)
	}
	return nil
}

func TestThreeHostsOnOneMachine(t *testing.T) {
	c := startCluster(t)
	t.Logf("cluster up: %s", c.lan)
	names := []string{"cluster/s1", "cluster/s2", "cluster/s3", "cluster/s4"}
	create := func(name string) error {
		_, errOut, code := c.hosts[0].Nexus(t, "create", name, "--image", "nexus-mini", "--memory", "256m", "-l", label)
		if code != 0 {
			return fmt.Errorf("create %s: exit %d: %s", name, code, errOut)
		}
		return nil
	}

	// Placement: three creates at once would all see the same heartbeats, so each starts once
	// the one before holds memory in its host's heartbeat. Each then sees the others' memory
	// taken and goes to the host with the most free: every host gets one.
	done := make([]chan error, 3)
	for i, name := range names[:3] {
		done[i] = make(chan error, 1)
		go func() { done[i] <- create(name) }()
		testutil.WaitFor(t, 3*time.Minute, func() error {
			select {
			case err := <-done[i]:
				if err != nil {
					t.Fatal(err)
				}
				done[i] <- nil // read again below
			default:
			}
			rows, err := c.hostRows(t)
			if err != nil {
				return err
			}
			holding := 0
			for _, r := range rows {
				if r.MemoryUsedMiB > 0 {
					holding++
				}
			}
			if holding < i+1 {
				return fmt.Errorf("%d hosts hold memory, want %d: %+v", holding, i+1, rows)
			}
			return nil
		})
	}
	for _, d := range done {
		if err := <-d; err != nil {
			t.Fatal(err)
		}
	}
	sbs := c.sandboxes(t)
	placed := map[string]string{} // host -> sandbox
	for _, name := range names[:3] {
		s := sbs[name]
		if s.State != "running" {
			t.Fatalf("%s is %s (%s), want running", name, s.State, s.Reason)
		}
		placed[s.Host] = name
	}
	if len(placed) != 3 {
		t.Fatalf("placement: the three sandboxes are on hosts %v, want one on each of h1, h2, h3 (most free memory first)", placed)
	}
	victim := 2 // h3: a worker, not the control host whose CLI runs the checks
	lost := placed["h3"]

	// Every sandbox answers an exec from h1's CLI, whichever host it is on; each asks the
	// perimeter for a name it refuses, so every host's netstack writes to the audit stream.
	for _, name := range names[:3] {
		out := c.cli(t, "exec", name, "--", "sh", "-c", `echo "exec in $1 on $(hostname)"; nslookup evil.example >/dev/null 2>&1; wget -q -T 3 -O /dev/null http://evil.example/ 2>/dev/null; true`, "sh", name)
		if !strings.HasPrefix(out, "exec in "+name+" on ") {
			t.Fatalf("exec in %s (host %s) printed %q", name, sbs[name].Host, out)
		}
	}
	var auditBefore int
	testutil.WaitFor(t, 30*time.Second, func() error {
		total, by := c.auditEvents(t)
		for _, name := range names[:3] {
			if by[name] == 0 {
				return fmt.Errorf("no audit event of %s (host %s) yet: %v", name, sbs[name].Host, by)
			}
		}
		auditBefore = total
		return nil
	})
	recordsBefore := len(c.sandboxes(t))
	t.Logf("before h3 goes: %d audit events, %d registry records", auditBefore, recordsBefore)

	// The other verbs against a sandbox on another host, from the control host's CLI and from a
	// worker's (no gateway there): cp, logs, attach, ports (opened on the sandbox's host) and
	// audit.
	c.remoteVerbs(t, 0, lost, victim)
	c.remoteVerbs(t, 1, lost, victim)
	// The same guest port on h2's sandbox: each host's forwarder opens its own sandboxes' only,
	// so neither is in conflict with the other.
	c.forwardedOn(t, 0, placed["h2"], 1)
	if err := c.serves(victim, lost); err != nil {
		t.Fatal(err)
	}

	// h3 loses power: every process of its namespace, bus node and QEMU included.
	n, err := c.lan.KillHost(victim)
	if err != nil {
		t.Fatal(err)
	}
	<-c.hosts[victim].Exited()
	t.Logf("killed %d processes of h3", n)
	if n < 2 {
		t.Fatalf("killed %d processes of h3, want nexus up and the QEMU of %s at least", n, lost)
	}
	s := c.waitSandbox(t, lost, 60*time.Second, func(s sandbox) error {
		if s.State != "failed" || s.Reason != "host h3 lost" {
			return fmt.Errorf("%s is %s (%q), want failed (host h3 lost)", s.Name, s.State, s.Reason)
		}
		return nil
	})
	t.Logf("%s: %s (%s)", s.Name, s.State, s.Reason)
	for name, s := range c.sandboxes(t) {
		if name != lost && s.State != "running" {
			t.Errorf("%s on %s is %s (%s) while h3 is away, want running", name, s.Host, s.State, s.Reason)
		}
	}
	testutil.WaitFor(t, 30*time.Second, func() error { return c.hostsUp(t, "h1", "h2") })

	// A new sandbox goes to a host that is up.
	if err := create(names[3]); err != nil {
		t.Fatal(err)
	}
	s4 := c.sandboxes(t)[names[3]]
	if s4.Host != "h1" && s4.Host != "h2" {
		t.Fatalf("%s was placed on %q with h3 lost, want h1 or h2", names[3], s4.Host)
	}
	if out := c.cli(t, "exec", names[3], "--", "echo", "placed on "+s4.Host); out != "placed on "+s4.Host+"\n" {
		t.Fatalf("exec in %s printed %q", names[3], out)
	}

	// The audit stream and the registry are replicated: nothing of them went with h3, the
	// events h3's netstack published included.
	auditAfter, by := c.auditEvents(t)
	recordsAfter := len(c.sandboxes(t))
	t.Logf("after: %d audit events (%d of %s), %d registry records", auditAfter, by[lost], lost, recordsAfter)
	if auditAfter < auditBefore || by[lost] == 0 {
		t.Errorf("audit stream: %d events after h3 died, %d before; %d of %s", auditAfter, auditBefore, by[lost], lost)
	}
	if recordsAfter != recordsBefore+1 {
		t.Errorf("registry: %d records after h3 died and one create, %d before", recordsAfter, recordsBefore)
	}

	// h3 comes back: its VM did not survive the kill, so the sandbox is cleaned up there and
	// its record says how to start it again.
	if err := c.hosts[victim].Restart(); err != nil {
		t.Fatal(err)
	}
	testutil.WaitFor(t, 60*time.Second, func() error { return c.hostsUp(t, "h1", "h2", "h3") })
	s = c.waitSandbox(t, lost, 60*time.Second, func(s sandbox) error {
		if s.State != "failed" || !strings.Contains(s.Reason, "its VM did not survive") {
			return fmt.Errorf("%s is %s (%q), want failed with its VM cleaned up", s.Name, s.State, s.Reason)
		}
		return nil
	})
	t.Logf("%s after h3's return: %s (%s)", s.Name, s.State, s.Reason)
	pids, err := c.lan.Pids(victim)
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range pids {
		if comm, _ := os.ReadFile(fmt.Sprintf("/proc/%d/comm", p)); strings.HasPrefix(string(comm), "qemu") {
			t.Errorf("h3 runs QEMU (pid %d) after its return, with no sandbox running there", p)
		}
	}
	rows, err := c.hostRows(t)
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range rows {
		if r.Host == "h3" && r.Running != 0 {
			t.Errorf("h3's heartbeat counts %d running sandboxes after its return, want 0", r.Running)
		}
	}

	// h2's nexus dies (its bus node and services, a crash or a partition longer than 10 s)
	// while its VM runs on: the sandbox is failed as lost, and when h2 is back its vmm adopts
	// the VM again and the record says running, with the guest's state as it was.
	kept := placed["h2"]
	c.cli(t, "exec", kept, "--", "sh", "-c", "echo before > /tmp/mark")
	keptDir := c.hosts[1].Home.Sandbox(c.sandboxes(t)[kept].ID)
	qemu, err := os.ReadFile(filepath.Join(keptDir, "qemu.pid"))
	if err != nil {
		t.Fatal(err)
	}
	qpid, _ := strconv.Atoi(strings.TrimSpace(string(qemu)))
	c.hosts[1].Kill()
	if qpid <= 0 || syscall.Kill(qpid, 0) != nil {
		t.Fatalf("the QEMU of %s (pid %d) died with h2's nexus", kept, qpid)
	}
	c.waitSandbox(t, kept, 60*time.Second, func(s sandbox) error {
		if s.State != "failed" || s.Reason != "host h2 lost" {
			return fmt.Errorf("%s is %s (%q), want failed (host h2 lost)", s.Name, s.State, s.Reason)
		}
		return nil
	})
	if err := c.hosts[1].Restart(); err != nil {
		t.Fatal(err)
	}
	s = c.waitSandbox(t, kept, 90*time.Second, func(s sandbox) error {
		if s.State != "running" {
			return fmt.Errorf("%s is %s (%q) after h2's return, want running again (its VM survived)", s.Name, s.State, s.Reason)
		}
		return nil
	})
	if out := c.cli(t, "exec", kept, "--", "cat", "/tmp/mark"); out != "before\n" {
		t.Fatalf("after h2's return %s has %q in /tmp/mark, want the guest as it was", kept, out)
	}
	// Its port forward is open on h2 again (the vmm's listener set, or portfwd's own records).
	testutil.WaitFor(t, 30*time.Second, func() error { return c.serves(1, kept) })
	t.Logf("%s after h2's return: %s on %s, the same VM (pid %d)", kept, s.State, s.Host, qpid)
	c.cli(t, "rm", "--force", "-l", label)
}
