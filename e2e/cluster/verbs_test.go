package cluster_test

import (
	"bufio"
	"bytes"
	"crypto/rand"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/creack/pty"

	"github.com/IniZio/nexus/internal/testutil"
	portfwdapi "github.com/IniZio/nexus/pkg/api/portfwd"
)

// remoteVerbs runs, from the CLI of host from, the verbs other than exec against sandbox name
// on host i (another one): cp both ways, logs, attach on a pty, ports (the forward opens on
// host i's 127.0.0.1, not on the CLI's host's) and audit tail --sandbox.
func (c *cluster) remoteVerbs(t *testing.T, from int, name string, i int) {
	t.Helper()
	host, by := fmt.Sprintf("h%d", i+1), fmt.Sprintf("h%d", from+1)
	cli := func(args ...string) string {
		t.Helper()
		return c.hosts[from].MustNexus(t, args...)
	}
	id := c.sandboxes(t)[name].ID

	// cp, host -> guest and back: a small file, and one of many stream chunks.
	dir := t.TempDir()
	small := filepath.Join(dir, "small.txt")
	if err := os.WriteFile(small, []byte("from "+by+" to "+name+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	cli("cp", small, name+":/tmp/small.txt")
	if out := cli("exec", name, "--", "cat", "/tmp/small.txt"); out != "from "+by+" to "+name+"\n" {
		t.Fatalf("cp from %s to %s (host %s): the guest has %q", by, name, host, out)
	}
	big := make([]byte, 600<<10)
	rand.Read(big)
	if err := os.WriteFile(filepath.Join(dir, "big"), big, 0o644); err != nil {
		t.Fatal(err)
	}
	cli("cp", filepath.Join(dir, "big"), name+":/tmp/big")
	cli("exec", name, "--", "sh", "-c", `echo "written in $1" > /tmp/out.txt`, "sh", name)
	cli("cp", name+":/tmp/out.txt", filepath.Join(dir, "out.txt"))
	if b, _ := os.ReadFile(filepath.Join(dir, "out.txt")); string(b) != "written in "+name+"\n" {
		t.Fatalf("cp from %s (host %s): %s got %q", name, host, by, b)
	}
	cli("cp", name+":/tmp/big", filepath.Join(dir, "big.back"))
	if b, _ := os.ReadFile(filepath.Join(dir, "big.back")); !bytes.Equal(b, big) {
		t.Fatalf("cp of %d bytes from %s to %s (host %s) and back: %d bytes, not the same", len(big), by, name, host, len(b))
	}

	// logs: what the guest writes on its console.
	mark := fmt.Sprintf("console mark of %s for %s %d", name, by, os.Getpid())
	cli("exec", name, "--", "sh", "-c", `echo "$1" > /dev/console`, "sh", mark)
	testutil.WaitFor(t, 10*time.Second, func() error {
		out, errOut, code := c.hosts[from].Nexus(t, "logs", name)
		if code != 0 {
			return fmt.Errorf("logs %s: exit %d: %s", name, code, errOut)
		}
		if !strings.Contains(out, mark) {
			return fmt.Errorf("logs %s (host %s) lack %q; tail: %q", name, host, mark, out[max(0, len(out)-300):])
		}
		return nil
	})

	// logs --agent: the guest agent's own log, read from the agent on its host.
	if out := cli("logs", "--agent", name); !strings.Contains(out, "serving") {
		t.Fatalf("logs --agent %s (host %s) from %s lack the agent's serving line:\n%.1500s", name, host, by, out)
	}

	c.attach(t, from, name, host)
	c.forwardedOn(t, from, name, i)

	// audit tail --sandbox: the remote sandbox's refused egress, and nothing of another.
	refused := fmt.Sprintf("refused-%s-%d.example", by, os.Getpid())
	cli("exec", name, "--", "sh", "-c", `nslookup "$1" >/dev/null 2>&1; true`, "sh", refused)
	testutil.WaitFor(t, 15*time.Second, func() error {
		out, errOut, code := c.hosts[from].Nexus(t, "audit", "tail", "--sandbox", name, "--denied", "--json")
		if code != 0 {
			return fmt.Errorf("audit tail --sandbox %s: exit %d: %s", name, code, errOut)
		}
		seen := false
		sc := bufio.NewScanner(strings.NewReader(out))
		sc.Buffer(nil, 1<<20)
		for sc.Scan() {
			var e struct {
				Sandbox  string `json:"sandbox"`
				Host     string `json:"host"`
				Decision string `json:"decision"`
			}
			if err := json.Unmarshal(sc.Bytes(), &e); err != nil {
				t.Fatalf("audit tail --json line %q: %v", sc.Text(), err)
			}
			if e.Sandbox != id || e.Decision != "deny" {
				t.Fatalf("audit tail --sandbox %s --denied printed an event of %s, decision %s", name, e.Sandbox, e.Decision)
			}
			seen = seen || strings.TrimSuffix(e.Host, ".") == refused
		}
		if !seen {
			return fmt.Errorf("audit tail --sandbox %s (host %s) has no refusal of %s yet:\n%s", name, host, refused, out)
		}
		return nil
	})
	t.Logf("cp, logs, attach, ports and audit from %s against %s on %s", by, name, host)
}

// attach opens a shell in name from the CLI of host from on a pty, runs a line in it and
// checks its output, its terminal size and its exit status.
func (c *cluster) attach(t *testing.T, from int, name, host string) {
	t.Helper()
	cmd := c.hosts[from].Command("attach", name)
	f, err := pty.StartWithSize(cmd, &pty.Winsize{Rows: 31, Cols: 97})
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	var mu sync.Mutex
	var out bytes.Buffer
	go func() {
		buf := make([]byte, 4096)
		for {
			n, err := f.Read(buf)
			mu.Lock()
			out.Write(buf[:n])
			mu.Unlock()
			if err != nil {
				return
			}
		}
	}()
	screen := func() string {
		mu.Lock()
		defer mu.Unlock()
		return out.String()
	}
	// The shell's prompt, before it is given a line.
	if err := testutil.Poll(30*time.Second, func() error {
		if s := screen(); !strings.ContainsAny(s, "#$") {
			return fmt.Errorf("attach %s (host %s): no prompt yet: %q", name, host, s)
		}
		return nil
	}); err != nil {
		cmd.Process.Kill()
		t.Fatal(err)
	}
	// The echoed line has the expression, only the shell's output its value.
	f.Write([]byte("echo \"attached $((6*7)) $(stty size)\"; exit 7\r"))
	select {
	case err := <-exited:
		var ee *exec.ExitError
		if !errors.As(err, &ee) || ee.ExitCode() != 7 {
			t.Fatalf("attach %s (host %s): %v; want exit status 7; terminal: %q", name, host, err, screen())
		}
	case <-time.After(time.Minute):
		cmd.Process.Kill()
		t.Fatalf("attach %s (host %s) did not exit; terminal: %q", name, host, screen())
	}
	// The reader may still be draining the pty after the exit.
	if err := testutil.Poll(5*time.Second, func() error {
		if s := screen(); !strings.Contains(s, "attached 42 31 97") {
			return fmt.Errorf("attach %s (host %s): terminal shows %q, want the line's output with the pty's size 31 97", name, host, s)
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
}

// forwardedOn starts a web server on a guest port of name (on host i), unless it runs, and
// checks that nexus ports on host from lists it on host i, and that the port answers on host
// i's 127.0.0.1, not on the CLI's host's.
func (c *cluster) forwardedOn(t *testing.T, from int, name string, i int) {
	t.Helper()
	host, by := fmt.Sprintf("h%d", i+1), fmt.Sprintf("h%d", from+1)
	const port = webPort
	page := webPage(name)
	c.hosts[from].MustNexus(t, "exec", name, "--", "sh", "-c", fmt.Sprintf(`netstat -ltn | grep -q ':%d ' || { mkdir -p /tmp/www && echo "$1" > /tmp/www/index.html && busybox httpd -p 127.0.0.1:%d -h /tmp/www; }
i=0; until netstat -ltn | grep -q ':%d '; do i=$((i+1)); [ $i -gt 300 ] && exit 1; sleep 0.1; done`, port, port, port), "sh", strings.TrimSuffix(page, "\n"))
	var row portfwdapi.Forward
	testutil.WaitFor(t, 30*time.Second, func() error {
		var list []portfwdapi.Forward
		if err := json.Unmarshal([]byte(c.hosts[from].MustNexus(t, "ports", "--json")), &list); err != nil {
			return err
		}
		var rows []portfwdapi.Forward
		for _, f := range list {
			if f.Sandbox == name && f.Port == port {
				rows = append(rows, f)
			}
		}
		switch {
		case len(rows) == 0:
			return fmt.Errorf("port %d of %s not in nexus ports on %s: %+v", port, name, by, list)
		case len(rows) > 1:
			t.Fatalf("nexus ports on %s lists port %d of %s %d times (one a host): %+v", by, port, name, len(rows), rows)
		case rows[0].State != portfwdapi.StateForwarding:
			return fmt.Errorf("port %d of %s is %s", port, name, rows[0].State)
		}
		row = rows[0]
		return nil
	})
	if row.Host != host || row.HostAddr != fmt.Sprintf("127.0.0.1:%d", port) {
		t.Fatalf("nexus ports on %s lists %s:%d as %+v, want on host %s at 127.0.0.1:%d", by, name, port, row, host, port)
	}
	if err := c.serves(i, name); err != nil {
		t.Fatal(err)
	}
	if got, err := c.fetch(from); err == nil {
		t.Fatalf("127.0.0.1:%d answers on %s (%q), the forward of %s belongs on %s", port, by, got, name, host)
	}
	tw := c.hosts[from].MustNexus(t, "ports", name)
	listed := false
	for _, l := range strings.Split(tw, "\n") {
		f := strings.Fields(l)
		listed = listed || len(f) > 2 && f[0] == name && f[1] == host && f[2] == strconv.Itoa(port)
	}
	if !listed {
		t.Fatalf("nexus ports %s does not list port %d on host %s:\n%s", name, port, host, tw)
	}
}

// webPort is the guest port forwardedOn serves webPage on.
const webPort = 8371

func webPage(name string) string { return "served by " + name + "\n" }

// fetch GETs / from 127.0.0.1:webPort inside host i's namespace.
func (c *cluster) fetch(i int) (page string, err error) {
	err = c.lan.InHost(i, func() error {
		conn, err := net.DialTimeout("tcp", fmt.Sprintf("127.0.0.1:%d", webPort), 5*time.Second)
		if err != nil {
			return err
		}
		defer conn.Close()
		conn.SetDeadline(time.Now().Add(10 * time.Second))
		if _, err := conn.Write([]byte("GET / HTTP/1.0\r\n\r\n")); err != nil {
			return err
		}
		b, err := io.ReadAll(io.LimitReader(conn, 64<<10))
		page = string(b)
		return err
	})
	return page, err
}

// serves says whether 127.0.0.1:webPort on host i answers with name's page.
func (c *cluster) serves(i int, name string) error {
	got, err := c.fetch(i)
	if err != nil || !strings.HasSuffix(got, "\r\n\r\n"+webPage(name)) {
		return fmt.Errorf("127.0.0.1:%d on h%d: %v %q, want the page of %s's guest", webPort, i+1, err, got, name)
	}
	return nil
}
