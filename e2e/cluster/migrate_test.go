package cluster_test

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/IniZio/nexus/internal/testutil"
)

// TestSingleHostBecomesTheFirstNode: a single host with a running sandbox and its audit
// history is stopped (its VM runs on), becomes the first node of a cluster with `nexus cluster
// init`, and starts again once a second host joined: its bus migrates the single-host store
// before its services start, so the sandbox is running on h1 in the registry, the same VM
// answers exec, and `nexus audit` shows its events from before.
func TestSingleHostBecomesTheFirstNode(t *testing.T) {
	c := &cluster{lan: testutil.NewLAN(t, 2)}
	t.Cleanup(c.stop)
	t.Cleanup(func() {
		if t.Failed() {
			for _, st := range c.hosts {
				dumpHost(t, st)
			}
		}
	})
	// As a cluster node, h1 serves nothing until h2 is up too: readiness is checked below then.
	clustered := false
	for i := range c.lan.Hosts {
		o := testutil.StackOptions{Netns: c.lan.Hosts[i].Netns, Ready: func(*testutil.Stack) error { return nil }}
		if i == 0 {
			o.Ready = func(st *testutil.Stack) error {
				if _, _, code := st.Nexus(t, "status"); code != 0 && !clustered {
					return fmt.Errorf("not all services are up")
				}
				return nil
			}
		}
		st, err := testutil.NewStack(o)
		if err != nil {
			t.Fatal(err)
		}
		c.hosts = append(c.hosts, st)
	}
	h1 := c.hosts[0]
	if err := h1.Start(); err != nil {
		t.Fatal(err)
	}
	const name = "migrate/kept"
	if _, errOut, code := h1.Nexus(t, "create", name, "--image", "nexus-mini", "--memory", "256m", "-l", label); code != 0 {
		t.Fatalf("create on the single host: exit %d: %s", code, errOut)
	}
	c.cli(t, "exec", name, "--", "sh", "-c", "echo before > /tmp/mark; nslookup evil.example >/dev/null 2>&1; wget -q -T 3 -O /dev/null http://evil.example/ 2>/dev/null; true")
	var auditBefore int
	testutil.WaitFor(t, 30*time.Second, func() error {
		_, by := c.auditEvents(t)
		if by[name] == 0 {
			return fmt.Errorf("no audit event of %s yet", name)
		}
		auditBefore = by[name]
		return nil
	})
	id := c.sandboxes(t)[name].ID
	qemu, err := os.ReadFile(filepath.Join(h1.Home.Sandbox(id), "qemu.pid"))
	if err != nil {
		t.Fatal(err)
	}
	qpid, _ := strconv.Atoi(strings.TrimSpace(string(qemu)))
	if err := h1.Shutdown(); err != nil {
		t.Fatal(err)
	}
	if qpid <= 0 || syscall.Kill(qpid, 0) != nil {
		t.Fatalf("the QEMU of %s (pid %d) did not outlive the stack", name, qpid)
	}

	h1.MustNexus(t, "cluster", "init", "--host", "h1", "--advertise", c.lan.Hosts[0].Addr.String())
	clustered = true
	if err := h1.Restart(); err != nil {
		t.Fatal(err)
	}
	token := strings.TrimSpace(h1.MustNexus(t, "cluster", "token", "create", "--ttl", "10m"))
	testutil.WaitFor(t, 60*time.Second, func() error {
		_, errOut, code := c.hosts[1].Nexus(t, "cluster", "join", token, "--host", "h2", "--advertise", c.lan.Hosts[1].Addr.String())
		if code != 0 {
			return fmt.Errorf("join h2: exit %d: %s", code, errOut)
		}
		return nil
	})
	if err := c.hosts[1].Start(); err != nil {
		t.Fatal(err)
	}
	testutil.WaitFor(t, 2*time.Minute, func() error {
		if _, _, code := h1.Nexus(t, "status"); code != 0 {
			return fmt.Errorf("not every service answers on h1")
		}
		return c.hostsUp(t, "h1", "h2")
	})
	if !strings.Contains(h1.Log(), "cluster: migrated ") {
		t.Errorf("h1's log does not say what it migrated")
	}
	s := c.waitSandbox(t, name, 90*time.Second, func(s sandbox) error {
		if s.State != "running" || s.Host != "h1" {
			return fmt.Errorf("%s is %s on %q (%q), want running on h1", s.Name, s.State, s.Host, s.Reason)
		}
		return nil
	})
	if out := c.cli(t, "exec", name, "--", "cat", "/tmp/mark"); out != "before\n" {
		t.Fatalf("after the move into the cluster %s has %q in /tmp/mark, want the guest as it was", name, out)
	}
	_, by := c.auditEvents(t)
	if by[name] < auditBefore {
		t.Fatalf("%d audit events of %s in the cluster, %d on the single host", by[name], name, auditBefore)
	}
	t.Logf("%s in the cluster: %s on %s, the same VM (pid %d); %d audit events (%d before)", name, s.State, s.Host, qpid, by[name], auditBefore)
	c.cli(t, "rm", "--force", "-l", label)
}
