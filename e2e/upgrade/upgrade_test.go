// Package upgrade_test proves that this build takes over a $NEXUS_HOME made by the previous one
// while its sandboxes run: the previous build (built from git at Previous) starts a stack and a
// sandbox with a brokered credential, is stopped the way an operator stops it, and this build's
// `nexus up` starts on the same home. The running guest (with the old guest agent inside) must be
// adopted: exec, its network, the credential swap and its audit history keep working, and it can
// be removed; a new sandbox boots beside it.
package upgrade_test

import (
	"bufio"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/IniZio/nexus/internal/testutil"
	api "github.com/IniZio/nexus/pkg/api/gateway"
	"github.com/IniZio/nexus/services/vmm/image"
)

// Previous is the last landed commit before the state layout of issue 15 (records through
// pkg/records, settings as flags). Move it forward when a later change moves state again, so the
// test always upgrades from the build users run today.
const Previous = "d4efa9b059dd7f263ef3e37a288c591dd69133ca"

const host = "api.github.com"

// seenAuth records the Authorization of every request that reached the fake upstream, by path.
type seenAuth struct {
	mu   sync.Mutex
	auth map[string]string
}

func (s *seenAuth) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	s.mu.Lock()
	s.auth[r.URL.Path] = r.Header.Get("Authorization")
	s.mu.Unlock()
	fmt.Fprintln(w, "ok")
}

func (s *seenAuth) get(path string) (string, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	v, ok := s.auth[path]
	return v, ok
}

// buildPrevious builds nexus and nexus-agent at Previous into dir/bin.
func buildPrevious(t *testing.T, dir string) string {
	t.Helper()
	root, err := exec.Command("git", "rev-parse", "--show-toplevel").Output()
	if err != nil {
		t.Fatalf("the upgrade test needs the git history (a full clone): %v", err)
	}
	top := strings.TrimSpace(string(root))
	if err := exec.Command("git", "-C", top, "cat-file", "-e", Previous+"^{commit}").Run(); err != nil {
		t.Fatalf("commit %s (the previous build) is not in this clone: a shallow clone cannot run the upgrade test", Previous[:12])
	}
	src := filepath.Join(dir, "src")
	os.MkdirAll(src, 0o755)
	archive := exec.Command("sh", "-c", `git -C "$1" archive "$2" | tar -x -C "$3"`, "sh", top, Previous, src)
	if out, err := archive.CombinedOutput(); err != nil {
		t.Fatalf("git archive %s: %v\n%s", Previous[:12], err, out)
	}
	bin := filepath.Join(dir, "bin")
	start := time.Now()
	for _, b := range [][]string{
		{"CGO_ENABLED=0", "-trimpath", "-ldflags", "-s -w", "-o", filepath.Join(bin, "nexus-agent"), "./services/vmm/agent/cmd/nexus-agent"},
		{"", "-o", filepath.Join(bin, "nexus"), "."},
	} {
		cmd := exec.Command("go", append([]string{"build"}, b[1:]...)...)
		cmd.Dir, cmd.Env = src, os.Environ()
		if b[0] != "" {
			cmd.Env = append(cmd.Env, b[0])
		}
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("build the previous %s: %v\n%s", b[len(b)-1], err, out)
		}
	}
	t.Logf("built the previous build (%s) in %.0fs", Previous[:12], time.Since(start).Seconds())
	return bin
}

// previousBaseRecipe is the name Previous's image.Recipe gives nexus-base in the download cache.
const previousBaseRecipe = "base-bookworm-1"

// previousCache is the download cache the stacks of the test run on: the shared cache's
// entries, and this build's nexus-base also under the name the previous build looks for
// (previousBaseRecipe). Without it the previous build debootstraps its own nexus-base, a
// minute of CI on every run (the recipes differ by the gh package only, which the test does
// not use; the guest agent it adopts is the previous build's, in its initramfs). It returns ""
// (the shared cache as is) when this build's nexus-base is not cached yet or links fail.
func previousCache(t *testing.T, dir string) string {
	t.Helper()
	shared := testutil.CacheDir()
	cur := filepath.Join(shared, "images", image.Recipe[image.Base])
	if image.Recipe[image.Base] == previousBaseRecipe {
		return ""
	}
	if _, err := os.Stat(cur + ".ext4"); err != nil {
		return ""
	}
	if _, err := os.Stat(cur + ".json"); err != nil {
		return ""
	}
	priv := filepath.Join(dir, "cache")
	if err := os.MkdirAll(filepath.Join(priv, "images"), 0o755); err != nil {
		t.Fatal(err)
	}
	entries, err := os.ReadDir(shared)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range entries { // kernel, initramfs, debs, ...: what either build adds is shared
		if e.Name() != "images" {
			if err := os.Symlink(filepath.Join(shared, e.Name()), filepath.Join(priv, e.Name())); err != nil {
				t.Fatal(err)
			}
		}
	}
	images, _ := os.ReadDir(filepath.Join(shared, "images"))
	for _, e := range images { // this build's images (the fresh sandbox's nexus-mini), hard-linked
		if strings.HasPrefix(e.Name(), previousBaseRecipe+".") {
			continue // the previous build's own, if it ever built one here: replaced below
		}
		if e.Type().IsRegular() && (strings.HasSuffix(e.Name(), ".ext4") || strings.HasSuffix(e.Name(), ".json")) {
			if os.Link(filepath.Join(shared, "images", e.Name()), filepath.Join(priv, "images", e.Name())) != nil {
				return ""
			}
		}
	}
	for _, ext := range []string{".ext4", ".json"} {
		if os.Link(cur+ext, filepath.Join(priv, "images", previousBaseRecipe+ext)) != nil {
			return ""
		}
	}
	t.Logf("the previous build's nexus-base is this build's (%s), from the cache", image.Recipe[image.Base])
	return priv
}

func token(prefix string) string {
	b := make([]byte, 12)
	rand.Read(b)
	return prefix + hex.EncodeToString(b)
}

// curlStatus runs curl in the guest with the placeholder of TOKEN as bearer and returns the HTTP
// status it printed.
func curlStatus(t *testing.T, st *testutil.Stack, box, path string) string {
	t.Helper()
	out, errOut, code := st.Nexus(t, "exec", box, "--", "sh", "-c",
		`curl -sS -m 20 -o /dev/null -w '%{http_code}' -H "Authorization: Bearer $UPGRADE_TOKEN" https://`+host+path)
	if code != 0 {
		return fmt.Sprintf("exit %d: %s %s", code, out, errOut)
	}
	return strings.TrimSpace(out)
}

func guestEnv(t *testing.T, st *testutil.Stack, box, key string) string {
	t.Helper()
	return strings.TrimSpace(st.MustNexus(t, "exec", box, "--", "sh", "-c", "printf %s \"$"+key+"\""))
}

func TestUpgradeAdoptsRunningSandboxes(t *testing.T) {
	testutil.RequireQEMU(t)
	dir := t.TempDir()
	prevBin := buildPrevious(t, dir)
	newBin, err := testutil.Binaries()
	if err != nil {
		t.Fatal(err)
	}

	pki, err := testutil.NewPKI(host)
	if err != nil {
		t.Fatal(err)
	}
	caFile, err := pki.WriteCA(dir)
	if err != nil {
		t.Fatal(err)
	}
	seen := &seenAuth{auth: map[string]string{}}
	up, err := testutil.ServeUpstream(host, seen, pki.ServerConfig())
	if err != nil {
		t.Fatal(err)
	}
	defer up.Close()

	// The previous build understands only the environment spelling of the test aids; this build
	// keeps it as the default of its flags.
	extra := []string{"NEXUS_RESOLVE=" + up.Resolve(), "NEXUS_EXTRA_CA=" + caFile}
	if c := previousCache(t, dir); c != "" {
		extra = append(extra, "NEXUS_CACHE="+c) // later entries win
	}
	st, err := testutil.StartStackOf(prevBin, extra...)
	if err != nil {
		t.Fatal(err)
	}
	defer st.Stop()

	real := token("upgrade_real_")
	if _, errOut, code := st.NexusIn(t, []byte(real+"\n"), "secret", "set", "UPGRADE_TOKEN"); code != 0 {
		t.Fatalf("secret set: exit %d: %s", code, errOut)
	}
	const box = "upgrade/box"
	st.MustNexus(t, "create", box, "--image", "nexus-base", "--memory", "512", "-l", "nexus-test=1",
		"--secret", "UPGRADE_TOKEN@"+host)
	placeholder := guestEnv(t, st, box, "UPGRADE_TOKEN")
	if len(placeholder) != 64 || placeholder == real {
		t.Fatalf("the guest's UPGRADE_TOKEN is not a placeholder: %d characters", len(placeholder))
	}
	if got := curlStatus(t, st, box, "/before"); got != "200" {
		t.Fatalf("curl under the previous build: %s", got)
	}
	if a, _ := seen.get("/before"); a != "Bearer "+real {
		t.Fatalf("under the previous build the upstream did not get the real token")
	}
	pidBefore := strings.TrimSpace(readFile(t, filepath.Join(st.Home.Sandboxes(), sandbox(t, st, box).ID, "qemu.pid")))

	// The upgrade: stop the previous build as an operator would, start this one on the same home.
	if err := st.Shutdown(); err != nil {
		t.Fatal(err)
	}
	st.Bin = filepath.Join(newBin, "nexus")
	start := time.Now()
	if err := st.Restart(); err != nil {
		t.Fatal(err)
	}
	t.Logf("this build's stack answered %.1fs after start", time.Since(start).Seconds())

	sb := sandbox(t, st, box)
	if sb.State != api.StateRunning {
		t.Fatalf("after the upgrade %s is %s (%s), want running", box, sb.State, sb.Reason)
	}
	if pid := strings.TrimSpace(readFile(t, filepath.Join(st.Home.Sandboxes(), sb.ID, "qemu.pid"))); pid != pidBefore {
		t.Fatalf("the VM was not adopted: qemu pid %s before, %s after", pidBefore, pid)
	}
	// The old guest agent answers the new host, with the environment the sandbox was made with.
	if got := guestEnv(t, st, box, "UPGRADE_TOKEN"); got != placeholder {
		t.Fatalf("the placeholder changed across the upgrade")
	}
	// The network, the mitm's record of the sandbox and the broker's placeholder came back.
	err = testutil.Poll(60*time.Second, func() error {
		if got := curlStatus(t, st, box, "/after"); got != "200" {
			return fmt.Errorf("curl after the upgrade: %s", got)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if a, _ := seen.get("/after"); a != "Bearer "+real {
		t.Fatalf("after the upgrade the upstream did not get the real token")
	}
	// A denial still works and the audit history of both builds is there.
	if out, _, code := st.Nexus(t, "exec", box, "--", "sh", "-c", "curl -sS -m 10 https://denied.example/ >/dev/null"); code == 0 {
		t.Fatalf("a host outside the allowlist was reached after the upgrade: %s", out)
	}
	audit := st.MustNexus(t, "audit", "tail", "--sandbox", box, "--json")
	for _, want := range []string{`"/before"`, `"/after"`, "denied.example"} {
		if !strings.Contains(audit, want) {
			t.Errorf("the audit history after the upgrade lacks %s", want)
		}
	}
	if strings.Contains(audit, real) || strings.Contains(audit, placeholder) {
		t.Fatal("the audit stream holds the token or its placeholder")
	}

	// A server started in the adopted guest is forwarded to the host: its agent predates pushed
	// listeners, so this build's vmm asks it for them.
	port := freeForwardPort(t)
	st.MustNexus(t, "exec", box, "--", "sh", "-c", fmt.Sprintf(`setsid perl -MIO::Socket::INET -e '$s = IO::Socket::INET->new(LocalAddr => "127.0.0.1:%d", Listen => 5, ReuseAddr => 1) or die $!; while ($c = $s->accept) { print $c "from-the-old-agent\n"; close $c }' </dev/null >/dev/null 2>&1 &`, port))
	err = testutil.Poll(60*time.Second, func() error {
		c, err := net.DialTimeout("tcp", fmt.Sprintf("127.0.0.1:%d", port), 5*time.Second)
		if err != nil {
			return err
		}
		defer c.Close()
		c.SetDeadline(time.Now().Add(10 * time.Second))
		line, err := bufio.NewReader(c).ReadString('\n')
		if line != "from-the-old-agent\n" {
			return fmt.Errorf("host port %d: read %q %v", port, line, err)
		}
		return nil
	})
	if err != nil {
		t.Fatalf("the adopted guest's listener was not forwarded: %v", err)
	}

	// This build boots a sandbox of its own in the old home, and removes the adopted one.
	const fresh = "upgrade/fresh"
	st.MustNexus(t, "create", fresh, "--image", "nexus-mini", "--memory", "256", "-l", "nexus-test=1")
	if got := strings.TrimSpace(st.MustNexus(t, "exec", fresh, "--", "echo", "hi")); got != "hi" {
		t.Fatalf("exec in a new sandbox: %q", got)
	}
	st.MustNexus(t, "rm", "--force", box)
	if _, err := os.Stat(filepath.Join(st.Home.Sandboxes(), sb.ID)); !os.IsNotExist(err) {
		t.Fatalf("the adopted sandbox's directory is still there after rm: %v", err)
	}
	for _, log := range []string{st.Log()} {
		if strings.Contains(log, real) || strings.Contains(log, placeholder) {
			t.Fatal("a stack log holds the token or its placeholder")
		}
	}
}

// freeForwardPort is a port in the forwarded range nothing on the host listens on.
func freeForwardPort(t *testing.T) int {
	t.Helper()
	for p := 7300; p < 7400; p++ {
		if l, err := net.Listen("tcp", fmt.Sprintf("127.0.0.1:%d", p)); err == nil {
			l.Close()
			return p
		}
	}
	t.Fatal("no free port in 7300-7399")
	return 0
}

// sandbox is the registry's record of name, as `nexus ps -a --json` shows it.
func sandbox(t *testing.T, st *testutil.Stack, name string) api.Sandbox {
	t.Helper()
	var list []api.Sandbox
	if err := json.Unmarshal([]byte(st.MustNexus(t, "ps", "-a", "--json")), &list); err != nil {
		t.Fatalf("ps --json: %v", err)
	}
	for _, sb := range list {
		if sb.Name == name {
			return sb
		}
	}
	t.Fatalf("no sandbox %s in nexus ps -a", name)
	return api.Sandbox{}
}

func readFile(t *testing.T, path string) string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}
