package egress_test

import (
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/IniZio/nexus/internal/testutil"
	"github.com/IniZio/nexus/pkg/audit"
)

// TestGuestFloodIsLimited: a guest floods NXDOMAIN lookups of long names at full speed while
// another sandbox makes a few ordinary requests. Every request of the second is in the audit
// stream; the flooder's denials beyond its rate are there as `suppressed` counts, it is flagged
// in ps, and what it wrote is bounded by its rate.
func TestGuestFloodIsLimited(t *testing.T) {
	const flooder, quiet = "egress/flooder", "egress/quiet"
	// Its DNS budget (200 queries/s by default) raised far above what a guest can send, so that
	// every query reaches the audit limits this test is about.
	create(t, flooder, "nexus-mini", "--allow-host", "example.test:7000", "--dns-rate", "1000000")
	create(t, quiet, "nexus-mini", "--allow-host", "example.test:7000", "--allow-host", "example.test:8123")
	t.Run("file modes after create", func(t *testing.T) { checkFileModes(t, quiet) })
	installProbe(t, flooder)
	ip := resolveMini(t, quiet, "example.test")
	dns := strings.TrimSpace(mustSh(t, flooder, `awk '/^nameserver/ {print $2; exit}' /etc/resolv.conf`))

	const secs = 8
	done := make(chan string, 1)
	go func() {
		out, _, _ := sh(t, flooder, fmt.Sprintf("probe dnsflood %s:53 %d", dns, secs))
		done <- out
	}()
	const requests = 3
	for i := range requests {
		mustSh(t, quiet, fmt.Sprintf(`printf 'GET /quiet-%d HTTP/1.0\r\nHost: example.test\r\n\r\n' | nc -w 5 %s 7000`, i, ip))
	}
	out := <-done
	var sent int
	fmt.Sscanf(strings.TrimSpace(out), "sent %d", &sent)
	t.Logf("the flooder sent %d queries in %ds", sent, secs)

	for i := range requests {
		upstreamGot := len(upstreams[plainHost].find(fmt.Sprintf("/quiet-%d", i)))
		if upstreamGot != 1 {
			t.Errorf("request %d of the quiet sandbox reached the upstream %d times", i, upstreamGot)
		}
	}
	var connects int
	for _, ev := range events(t, quiet, false) {
		if ev.Layer == audit.LayerL4 && ev.Decision == audit.Allow && ev.Port == 7000 {
			connects += int(max(ev.Count, 1))
		}
		if ev.Name != quiet {
			t.Errorf("event of the quiet sandbox without its name: %+v", ev)
		}
	}
	if connects != requests {
		t.Errorf("the quiet sandbox's stream accounts for %d of its %d connections", connects, requests)
	}

	var stored, dnsDenied, summarised, budgeted int64
	waitEvent(t, flooder, true, "a suppressed summary", func(ev audit.Event) bool { return ev.Rule == audit.RuleSuppressed })
	// Summaries and budget windows are written a second after they open: wait for the last.
	testutil.WaitFor(t, 15*time.Second, func() error {
		stored, dnsDenied, summarised, budgeted = 0, 0, 0, 0
		for _, ev := range events(t, flooder, true) {
			stored++
			switch {
			case ev.Rule == audit.RuleSuppressed:
				summarised += ev.Count
			case ev.Rule == "dns_rate":
				// Past the sandbox's DNS budget (services/netstack), queries are refused and
				// counted a window at a time in the reason, before the audit limits see them.
				budgeted += int64(limitCount([]audit.Event{ev}, "dns_rate"))
			case ev.Layer == audit.LayerDNS:
				dnsDenied += max(ev.Count, 1)
			}
		}
		if int(dnsDenied+summarised+budgeted) < sent*9/10 {
			return fmt.Errorf("the stream accounts for %d of %d queries (%d events: %d denials one by one, %d suppressed, %d over its DNS budget)",
				dnsDenied+summarised+budgeted, sent, stored, dnsDenied, summarised, budgeted)
		}
		return nil
	})
	t.Logf("the flooder's stream: %d events standing for %d denials one by one, %d suppressed and %d over its DNS budget", stored, dnsDenied, summarised, budgeted)
	// Its burst, its rate, a summary a second; and a little slack for the seconds around the flood.
	if bound := int64(audit.DefaultLimits.Burst) + int64(audit.DefaultLimits.Rate+2)*(secs+10); stored > bound {
		t.Errorf("the flooder stored %d events, over its bound %d", stored, bound)
	}
	ps := stack.MustNexus(t, "ps")
	for _, l := range strings.Split(ps, "\n") {
		if f := strings.Fields(l); len(f) > 0 && (f[0] == flooder) != strings.Contains(l, "(audit limited)") {
			t.Errorf("ps flags the wrong sandboxes:\n%s", ps)
			break
		}
	}
	if show := stack.MustNexus(t, "egress", "show", flooder); !strings.Contains(show, "audit:    limited") {
		t.Errorf("egress show does not flag the flooder:\n%s", show)
	}
	// The quiet sandbox is the neighbour of a flooder held to its budgets (one boot fewer).
	t.Run("budgets", func(t *testing.T) { testEgressBudgets(t, quiet) })
}

// checkFileModes (run by TestGuestFloodIsLimited just after its creates): after a create
// nothing nexus wrote in $NEXUS_HOME or /dev/shm is readable or writable by group or others:
// records, secrets, sockets, guest RAM.
func checkFileModes(t *testing.T, box string) {
	id := sandboxID(t, box)
	var bad []string
	check := func(p string, fi fs.FileInfo) {
		if fi.Mode()&fs.ModeSymlink != 0 {
			return
		}
		if fi.Mode().Perm()&0o077 != 0 {
			bad = append(bad, fmt.Sprintf("%v %s", fi.Mode(), p))
		}
	}
	// Public by design: the CA certificate guests and users trust, and the base images (built
	// from public packages, shared read-only by every sandbox).
	public := map[string]bool{filepath.Join(string(stack.Home), "ca", "ca.pem"): true, filepath.Join(string(stack.Home), "images"): true}
	filepath.Walk(string(stack.Home), func(p string, fi os.FileInfo, err error) error {
		if public[p] && fi != nil && fi.IsDir() {
			return filepath.SkipDir
		}
		if err == nil && !public[p] {
			check(p, fi)
		}
		return nil
	})
	ram, _ := filepath.Glob("/dev/shm/nexus-" + id + "-*")
	if _, err := os.Stat(filepath.Join(stack.Home.Sandbox(id), "template")); err == nil {
		// A warm sandbox maps its template's RAM (under $NEXUS_HOME/templates, walked above)
		// privately: it has no RAM file of its own.
		if len(ram) > 0 {
			t.Errorf("warm sandbox %s has a RAM file of its own: %v", id, ram)
		}
	} else if len(ram) == 0 {
		t.Errorf("no guest RAM of %s under /dev/shm", id)
	}
	for _, p := range ram {
		filepath.Walk(p, func(p string, fi os.FileInfo, err error) error {
			if err == nil {
				check(p, fi)
			}
			return nil
		})
	}
	if len(bad) > 0 {
		t.Errorf("readable or writable by group or others:\n%s", strings.Join(bad, "\n"))
	}
}
