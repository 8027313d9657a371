package records

import (
	"bytes"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/rs/zerolog"

	"github.com/IniZio/nexus/pkg/errdefs"
)

type rec struct {
	Name  string `json:"name"`
	Count int    `json:"count"`
}

func TestPutGetUpdateDelete(t *testing.T) {
	s, err := Open[rec](filepath.Join(t.TempDir(), "r"), zerolog.Nop())
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.Get("a"); !errors.Is(err, errdefs.ErrNotFound) {
		t.Fatalf("get of a missing record: %v, want not found", err)
	}
	if err := s.Put("a", rec{Name: "x", Count: 1}); err != nil {
		t.Fatal(err)
	}
	if err := s.Update("a", func(r *rec) error { r.Count++; return nil }); err != nil {
		t.Fatal(err)
	}
	got, err := s.Get("a")
	if err != nil || got != (rec{Name: "x", Count: 2}) {
		t.Fatalf("get = %+v, %v", got, err)
	}
	st, err := os.Stat(filepath.Join(s.Dir(), "a.json"))
	if err != nil || st.Mode().Perm() != 0o600 {
		t.Fatalf("record file mode: %v %v, want 0600", st.Mode(), err)
	}
	if err := s.Update("missing", func(*rec) error { t.Fatal("fn called for a missing record"); return nil }); !errors.Is(err, errdefs.ErrNotFound) {
		t.Fatalf("update of a missing record: %v", err)
	}
	if err := s.Delete("a"); err != nil {
		t.Fatal(err)
	}
	if err := s.Delete("a"); err != nil {
		t.Fatalf("second delete: %v", err)
	}
	if _, err := s.Get("a"); !errors.Is(err, errdefs.ErrNotFound) {
		t.Fatalf("get after delete: %v", err)
	}
}

func TestKeysThatAreNotFileNamesAreRefused(t *testing.T) {
	s, err := Open[rec](t.TempDir(), zerolog.Nop())
	if err != nil {
		t.Fatal(err)
	}
	for _, k := range []string{"", "../x", "a/b", ".hidden", "a\x00b", "sp ace", strings.Repeat("k", MaxKeyLen+1)} {
		if err := s.Put(k, rec{}); !errors.Is(err, errdefs.ErrInvalid) {
			t.Errorf("Put(%q) = %v, want invalid", k, err)
		}
	}
	ents, _ := os.ReadDir(filepath.Dir(s.Dir()))
	for _, e := range ents {
		if e.Name() == "x" {
			t.Fatal("a key escaped the store's directory")
		}
	}
}

func TestLoadSkipsWhatItCannotRead(t *testing.T) {
	var logs bytes.Buffer
	s, err := Open[rec](t.TempDir(), zerolog.New(&logs))
	if err != nil {
		t.Fatal(err)
	}
	for _, k := range []string{"b", "a"} {
		if err := s.Put(k, rec{Name: k}); err != nil {
			t.Fatal(err)
		}
	}
	write := func(name, body string) {
		if err := os.WriteFile(filepath.Join(s.Dir(), name), []byte(body), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	write("torn.json", `{"name":"to`)            // damaged
	write(".c.json.tmp-123", `{"name":"c"}`)     // an interrupted write
	write("notes.txt", "hello")                  // not a record
	os.Mkdir(filepath.Join(s.Dir(), "a"), 0o700) // a record's working directory
	big := `{"name":"` + strings.Repeat("x", MaxRecordBytes) + `"}`
	write("big.json", big)

	got, err := s.Load()
	if err != nil {
		t.Fatal(err)
	}
	if len(got.Records) != 2 || got.Records[0].Key != "a" || got.Records[1].Value.Name != "b" {
		t.Fatalf("records = %+v, want a and b in key order", got.Records)
	}
	if got.Skipped != 4 {
		t.Fatalf("skipped = %d, want 4 (torn, temp, foreign, oversized)\n%s", got.Skipped, logs.String())
	}
	for _, f := range []string{"torn.json", ".c.json.tmp-123", "notes.txt", "big.json"} {
		if !strings.Contains(logs.String(), f) {
			t.Errorf("the skip of %s was not logged:\n%s", f, logs.String())
		}
	}
	if _, err := os.Stat(filepath.Join(s.Dir(), ".c.json.tmp-123")); !os.IsNotExist(err) {
		t.Errorf("the temp file of an interrupted write survived the load: %v", err)
	}
}
