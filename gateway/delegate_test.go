package gateway

import (
	"errors"
	"os"
	"path/filepath"
	"testing"

	"github.com/rs/zerolog"

	"github.com/IniZio/nexus/pkg/errdefs"
	"github.com/IniZio/nexus/pkg/home"
)

// TestOpenDelegationsMigratesStateFiles: at start the gateway moves the records that earlier
// builds kept in delegations/<name>/state.json to delegations/<name>.json, fields intact, and
// leaves damaged ones where they are.
func TestOpenDelegationsMigratesStateFiles(t *testing.T) {
	h := home.Dir(t.TempDir())
	old := `{
  "name": "t1",
  "sandbox": "default/t1",
  "repo": "/src/repo",
  "common_dir": "/src/repo/.git",
  "git_dir": "/src/repo/.git/worktrees/t1",
  "worktree": "/home/nexus/worktrees/t1",
  "branch": "nexus/t1",
  "base": "1111111111111111111111111111111111111111",
  "synced": "2222222222222222222222222222222222222222",
  "created": "2026-11-30T10:00:00Z"
}`
	for name, content := range map[string]string{"t1": old, "bad": "{not json"} {
		os.MkdirAll(filepath.Join(h.Delegations(), name, "refs"), 0o700)
		if err := os.WriteFile(filepath.Join(h.Delegations(), name, "state.json"), []byte(content), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	ds, err := openDelegations(h, zerolog.Nop())
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(h.Delegations(), "t1.json")); err != nil {
		t.Fatalf("record not migrated: %v", err)
	}
	if _, err := os.Stat(filepath.Join(h.Delegations(), "t1", "state.json")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("old state file kept: %v", err)
	}
	d, err := ds.get("t1")
	if err != nil {
		t.Fatal(err)
	}
	if d.Sandbox != "default/t1" || d.Repo != "/src/repo" || d.CommonDir != "/src/repo/.git" || d.GitDir != "/src/repo/.git/worktrees/t1" ||
		d.Worktree != "/home/nexus/worktrees/t1" || d.Branch != "nexus/t1" || d.Base[0] != '1' || d.Synced[0] != '2' ||
		d.Created.IsZero() || d.Dir != filepath.Join(h.Delegations(), "t1") {
		t.Errorf("migrated record: %+v", d)
	}
	if _, err := ds.get("bad"); err == nil || errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("damaged state file: %v", err)
	}
	if _, err := os.Stat(filepath.Join(h.Delegations(), "bad", "state.json")); err != nil {
		t.Errorf("damaged state file removed: %v", err)
	}
}
