package snapshot_test

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/IniZio/nexus/internal/testutil"
	api "github.com/IniZio/nexus/pkg/api/gateway"
	vmmapi "github.com/IniZio/nexus/pkg/api/vmm"
)

// templateOf waits for the booted template of nexus-mini at 256 MiB with a NIC (the shape of
// this package's creates), which the first create of that shape builds in the background.
func templateOf(t *testing.T) (dir string) {
	t.Helper()
	testutil.WaitFor(t, 3*time.Minute, func() error {
		recs, _ := filepath.Glob(filepath.Join(stack.Home.Templates(), "*", "template.json"))
		for _, p := range recs {
			var rec struct {
				Info vmmapi.TemplateInfo `json:"info"`
			}
			b, _ := os.ReadFile(p)
			if json.Unmarshal(b, &rec) == nil && rec.Info.Image == "nexus-mini" && rec.Info.MemoryMiB == 256 && rec.Info.Net && rec.Info.Shares == 0 {
				dir = filepath.Dir(p)
				return nil
			}
		}
		return fmt.Errorf("no template of nexus-mini 256 MiB among %v", recs)
	})
	return dir
}

// ids maps sandbox names to ids.
func ids(t *testing.T) map[string]string {
	t.Helper()
	var list []api.SandboxView
	json.Unmarshal([]byte(stack.MustNexus(t, "ps", "--json")), &list)
	out := map[string]string{}
	for _, s := range list {
		out[s.Name] = s.ID
	}
	return out
}

var hex64 = regexp.MustCompile(`^[0-9a-f]{64}$`)

// Two sandboxes created from one template are restored from it, each with an identity of its
// own (hostname, machine-id, RNG output, boot uuid, MAC), its own placeholder and the perimeter's CA;
// and the template's files hold neither the CA nor the placeholder. --cold still boots.
func TestWarmCreateFreshIdentity(t *testing.T) {
	create(t, "warm/first") // cold unless another test of this package built the template already
	tdir := templateOf(t)
	if _, errOut, code := stack.NexusIn(t, []byte("warm-secret-value\n"), "secret", "set", "WARM_TOK", "--host", "warm.example"); code != 0 {
		t.Fatalf("secret set: exit %d: %s", code, errOut)
	}
	create(t, "warm/a", "--secret", "WARM_TOK@warm.example")
	create(t, "warm/b")
	create(t, "warm/cold", "--cold")
	id := ids(t)
	key := filepath.Base(tdir)
	for name, want := range map[string]string{"warm/a": key, "warm/b": key, "warm/cold": ""} {
		got, _ := os.ReadFile(filepath.Join(stack.Home.Sandbox(id[name]), "template"))
		if strings.TrimSpace(string(got)) != want {
			t.Errorf("%s: restored from template %q, want %q", name, got, want)
		}
	}

	probe := "hostname; cat /etc/machine-id; cat /proc/sys/kernel/random/uuid; head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \\n'; echo; " +
		"cat /sys/class/net/eth0/address; (nslookup fresh.mac.example 2>&1 | grep -q NXDOMAIN && echo dns-ok || echo dns-fail)"
	seen := map[string]string{}
	for _, name := range []string{"warm/a", "warm/b"} {
		lines := strings.Split(strings.TrimSpace(stack.MustNexus(t, "exec", name, "--", "sh", "-c", probe)), "\n")
		if len(lines) != 6 {
			t.Fatalf("%s: probe printed %q", name, lines)
		}
		if want := strings.TrimPrefix(name, "warm/"); lines[0] != want {
			t.Errorf("%s: hostname %q, want %q", name, lines[0], want)
		}
		// The gateway resolver answers over the new MAC: the netstack learnt it.
		if lines[5] != "dns-ok" {
			t.Errorf("%s: no answer from the gateway's resolver after the MAC change: %q", name, lines[5])
		}
		for i, what := range []string{"machine-id", "boot uuid", "random bytes", "MAC"} {
			v := lines[i+1]
			if other, dup := seen[v]; dup {
				t.Errorf("%s and %s share their %s %s", other, name, what, v)
			}
			seen[v] = name
		}
	}

	ca := stack.MustNexus(t, "exec", "warm/a", "--", "cat", vmmapi.CAPath)
	if !strings.Contains(ca, "BEGIN CERTIFICATE") {
		t.Fatalf("warm/a has no CA at %s: %q", vmmapi.CAPath, ca)
	}
	var placeholder string
	for _, kv := range strings.Split(stack.MustNexus(t, "exec", "warm/a", "--", "env"), "\n") {
		if v, ok := strings.CutPrefix(kv, "WARM_TOK="); ok {
			placeholder = v
		}
	}
	if !hex64.MatchString(placeholder) {
		t.Fatalf("warm/a: WARM_TOK=%q is not a placeholder", placeholder)
	}
	caLines := strings.Split(strings.TrimSpace(ca), "\n")
	needles := map[string][]byte{"the CA": []byte(caLines[len(caLines)/2]), "the placeholder": []byte(placeholder),
		"the secret": []byte("warm-secret-value")}
	files, _ := filepath.Glob(filepath.Join(tdir, "*"))
	if len(files) < 4 {
		t.Fatalf("template %s has files %v", tdir, files)
	}
	for _, f := range files {
		for what := range fileContains(t, f, needles) {
			t.Errorf("template file %s holds %s", filepath.Base(f), what)
		}
	}
	// The needle is what the guests were given: the search above looks for the right bytes.
	if !strings.Contains(stack.MustNexus(t, "exec", "warm/b", "--", "cat", vmmapi.CAPath), string(needles["the CA"])) {
		t.Error("warm/b lacks the CA line searched for")
	}
	if out := stack.MustNexus(t, "image", "ls"); !strings.Contains(out, "256M/1cpu") {
		t.Errorf("image ls shows no template:\n%s", out)
	}

	// A restore that fails (device state damaged in place, lengths intact) boots cold: the
	// create succeeds all the same.
	state := filepath.Join(tdir, "state")
	orig, err := os.ReadFile(state)
	if err != nil {
		t.Fatal(err)
	}
	os.WriteFile(state, make([]byte, len(orig)), 0o600)
	create(t, "warm/fallback")
	os.WriteFile(state, orig, 0o600)
	if _, err := os.Stat(filepath.Join(stack.Home.Sandbox(ids(t)["warm/fallback"]), "template")); err == nil {
		t.Error("warm/fallback names a template its restore failed from")
	}
	if out := stack.MustNexus(t, "exec", "warm/fallback", "--", "hostname"); out != "fallback\n" {
		t.Errorf("warm/fallback: hostname %q", out)
	}
}

// fileContains reads f once, in chunks (RAM files are large), and says which needles it holds.
func fileContains(t *testing.T, f string, needles map[string][]byte) map[string]bool {
	t.Helper()
	in, err := os.Open(f)
	if err != nil {
		t.Fatal(err)
	}
	defer in.Close()
	const overlap = 256 // longer than any needle
	buf := make([]byte, 4<<20+overlap)
	found := map[string]bool{}
	carry := 0
	for {
		n, err := io.ReadFull(in, buf[carry:])
		for what, needle := range needles {
			if bytes.Contains(buf[:carry+n], needle) {
				found[what] = true
			}
		}
		if err != nil {
			return found
		}
		carry = copy(buf, buf[carry+n-overlap:carry+n])
	}
}
