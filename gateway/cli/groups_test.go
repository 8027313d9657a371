package cli

import (
	"bytes"
	"encoding/json"
	"testing"
)

// An unknown subcommand of a group is a usage error (exit 2), as at the top level; the group
// alone still prints its help and succeeds.
func TestUnknownSubcommandExits2(t *testing.T) {
	for _, args := range [][]string{{"sandbox", "list"}, {"image", "frobnicate"}, {"secret", "get"}, {"nope"}} {
		root := NewRoot()
		root.SetArgs(args)
		root.SetOut(&bytes.Buffer{})
		if code := Execute(root); code != 2 {
			t.Errorf("nexus %v: exit %d, want 2", args, code)
		}
	}
	root := NewRoot()
	var out bytes.Buffer
	root.SetOut(&out)
	root.SetArgs([]string{"secret"})
	if code := Execute(root); code != 0 || !bytes.Contains(out.Bytes(), []byte("Available Commands")) {
		t.Errorf("nexus secret: exit %d, output %q", code, out.String())
	}
}

func TestVersionJSON(t *testing.T) {
	root := NewRoot()
	var out bytes.Buffer
	root.SetOut(&out)
	root.SetArgs([]string{"version", "--json"})
	if code := Execute(root); code != 0 {
		t.Fatalf("exit %d", code)
	}
	var v versionInfo
	if err := json.Unmarshal(out.Bytes(), &v); err != nil || v.Version == "" || v.Go == "" {
		t.Fatalf("version --json: %v: %s", err, out.String())
	}
}
