package policy_test

import (
	"encoding/json"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// TestSecretCeilingCLI: the hosts stored with a secret (`nexus secret set NAME --host`) are shown
// by `nexus secret ls` and bound the project's config: a .nexus/config.yaml binding GH_TOKEN to a
// host outside them, or binding a secret stored without hosts at all, is refused at create with
// one line naming the secret and the host, and leaves no sandbox behind.
func TestSecretCeilingCLI(t *testing.T) {
	ls := stack.MustNexus(t, "secret", "ls")
	if !strings.Contains(ls, "api.github.com,uploads.github.com,github.com") || strings.Contains(ls, ghToken) {
		t.Fatalf("secret ls:\n%s", ls)
	}
	var list []struct {
		Name  string   `json:"name"`
		Hosts []string `json:"hosts"`
	}
	if err := json.Unmarshal([]byte(stack.MustNexus(t, "secret", "ls", "--json")), &list); err != nil {
		t.Fatal(err)
	}
	i := slices.IndexFunc(list, func(s struct {
		Name  string   `json:"name"`
		Hosts []string `json:"hosts"`
	}) bool {
		return s.Name == "GH_TOKEN"
	})
	if i < 0 || !slices.Equal(list[i].Hosts, []string{"api.github.com", "uploads.github.com", "github.com"}) {
		t.Fatalf("secret ls --json: %+v", list)
	}
	if _, errOut, code := stack.NexusIn(t, []byte("open-value\n"), "secret", "set", "POL_OPEN"); code != 0 {
		t.Fatalf("secret set POL_OPEN: %s", errOut)
	}

	dir := t.TempDir()
	for _, c := range []struct{ secret, host, want string }{
		{"GH_TOKEN", "api.evil.example", "secret GH_TOKEN may not be sent to api.evil.example: it is stored for api.github.com,uploads.github.com,github.com only"},
		{"POL_OPEN", "api.github.com", "secret POL_OPEN may not be sent to api.github.com: it is stored without hosts, so only `nexus create --secret POL_OPEN@api.github.com` can bind it"},
	} {
		p := filepath.Join(dir, c.secret+".yaml")
		os.WriteFile(p, []byte("version: 1\negress:\n  secrets:\n    - name: "+c.secret+"\n      hosts: ["+c.host+"]\n"), 0o644)
		out, errOut, code := stack.Nexus(t, "create", "--config", p, "pol-ceiling", "--image", "nexus-mini", "-l", "nexus-test=1")
		msg := strings.TrimSpace(errOut)
		if code == 0 || strings.Contains(msg, "\n") || !strings.Contains(msg, "egress.secrets in "+p+": "+c.want) {
			t.Fatalf("create with %s bound to %s: exit %d\nstdout: %s\nstderr: %q", c.secret, c.host, code, out, errOut)
		}
	}
	if out := stack.MustNexus(t, "ps", "-a"); strings.Contains(out, "pol-ceiling") {
		t.Fatal("a refused binding left a sandbox behind")
	}
}
