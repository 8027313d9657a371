package gateway

import (
	"errors"
	"strings"
	"testing"

	api "github.com/IniZio/nexus/pkg/api/gateway"
	"github.com/IniZio/nexus/pkg/errdefs"
)

func TestParseNamedMounts(t *testing.T) {
	got, err := parseNamedMounts([]string{"node_modules:/work/node_modules,kind=disk", "cache:/cache"})
	if err != nil {
		t.Fatal(err)
	}
	want := []api.Volume{{Name: "node_modules", Guest: "/work/node_modules", SizeMiB: api.DefaultVolumeMiB}, {Name: "cache", Guest: "/cache", SizeMiB: api.DefaultVolumeMiB}}
	if len(got) != 2 || got[0] != want[0] || got[1] != want[1] {
		t.Fatalf("got %+v", got)
	}
	for _, bad := range []string{"", "cache", "cache:relative", "Cache:/c", "../x:/c", "c:/a,kind=9p", "c:/a:ro", "c:/a\n", strings.Repeat("a", 64) + ":/c"} {
		if _, err := parseNamedMounts([]string{bad}); !errors.Is(err, errdefs.ErrInvalid) {
			t.Errorf("%q: err %v, want invalid", bad, err)
		}
	}
	if _, err := parseNamedMounts([]string{"c:/a", "c:/b"}); !errors.Is(err, errdefs.ErrInvalid) {
		t.Errorf("a name used twice: err %v", err)
	}
}

func FuzzParseNamedMounts(f *testing.F) {
	for _, s := range []string{"cache:/cache", "n:/a,kind=disk", "x", ":/", "a:/b,,kind=disk,"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		vols, err := parseNamedMounts([]string{s})
		if err != nil {
			if !errors.Is(err, errdefs.ErrInvalid) || strings.Contains(err.Error(), "\n") && !strings.Contains(s, "\n") {
				t.Fatalf("%q: %v", s, err)
			}
			return
		}
		for _, v := range vols {
			if !volumeNameRE.MatchString(v.Name) || !strings.HasPrefix(v.Guest, "/") || strings.ContainsAny(v.Name, "/.") {
				t.Fatalf("%q parsed to %+v", s, v)
			}
		}
	})
}
