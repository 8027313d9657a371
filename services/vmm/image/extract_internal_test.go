package image

import (
	"archive/tar"
	"bytes"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/IniZio/nexus/pkg/errdefs"
)

// entry is one tar entry of a test layer.
type entry struct {
	name, body, link string
	typ              byte
	mode             int64
	uid, gid         int
}

func layerTar(t testing.TB, ents ...entry) []byte {
	t.Helper()
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, e := range ents {
		h := &tar.Header{Name: e.name, Typeflag: e.typ, Linkname: e.link, Mode: e.mode, Uid: e.uid, Gid: e.gid, Size: int64(len(e.body))}
		if h.Typeflag == 0 {
			h.Typeflag = tar.TypeReg
		}
		if h.Mode == 0 {
			h.Mode = 0o644
		}
		if h.Typeflag != tar.TypeReg {
			h.Size = 0
		}
		if err := tw.WriteHeader(h); err != nil {
			t.Fatal(err)
		}
		if h.Size > 0 {
			tw.Write([]byte(e.body))
		}
	}
	tw.Close()
	return buf.Bytes()
}

func applyAll(t testing.TB, x *extractor, layers ...[]byte) error {
	t.Helper()
	for i, l := range layers {
		if err := x.apply(bytes.NewReader(l), "layer "+string(rune('1'+i))); err != nil {
			return err
		}
	}
	return nil
}

func exists(p string) bool { _, err := os.Lstat(p); return err == nil }

func TestExtractLayersInOrder(t *testing.T) {
	root := t.TempDir()
	x := newExtractor(root, 0, 0)
	l1 := layerTar(t,
		entry{name: "etc/", typ: tar.TypeDir, mode: 0o755},
		entry{name: "etc/gone", body: "lower"},
		entry{name: "opq/", typ: tar.TypeDir, mode: 0o755},
		entry{name: "opq/old", body: "old"},
		entry{name: "usr/lib/", typ: tar.TypeDir, mode: 0o755},
		entry{name: "lib", typ: tar.TypeSymlink, link: "usr/lib"},
		entry{name: "bin/tool", body: "#!/bin/sh\n", mode: 0o4755, uid: 1000, gid: 1000},
		entry{name: "bin/tool2", typ: tar.TypeLink, link: "bin/tool"},
		entry{name: "dev/null", typ: tar.TypeChar},
		entry{name: "run/fifo", typ: tar.TypeFifo, mode: 0o600},
	)
	l2 := layerTar(t,
		entry{name: "etc/.wh.gone"},
		entry{name: "opq/new", body: "new"},
		entry{name: "opq/.wh..wh..opq"},
		entry{name: "lib/libx.so", body: "x"}, // through the lower layer's symlink
	)
	if err := applyAll(t, x, l1, l2); err != nil {
		t.Fatal(err)
	}
	if exists(filepath.Join(root, "etc/gone")) {
		t.Error("whiteout did not remove etc/gone")
	}
	if exists(filepath.Join(root, "opq/old")) || !exists(filepath.Join(root, "opq/new")) {
		t.Error("opaque dir: want old gone and new (same layer) kept")
	}
	if !exists(filepath.Join(root, "usr/lib/libx.so")) {
		t.Error("file under a symlinked dir not written through it")
	}
	if m := x.meta["usr/lib/libx.so"]; m.perm != 0o644 {
		t.Errorf("meta of usr/lib/libx.so = %+v", m)
	}
	if m := x.meta["bin/tool"]; m.uid != 1000 || m.perm != 0o4755 {
		t.Errorf("meta of bin/tool = %+v", m)
	}
	if x.meta["bin/tool2"] != x.meta["bin/tool"] {
		t.Error("hard link has another owner than its inode")
	}
	a, _ := os.Stat(filepath.Join(root, "bin/tool"))
	b, _ := os.Stat(filepath.Join(root, "bin/tool2"))
	if !os.SameFile(a, b) {
		t.Error("bin/tool2 is not a hard link of bin/tool")
	}
	if a.Mode()&os.ModeSetuid != 0 {
		t.Error("setuid bit set on the host")
	}
	if exists(filepath.Join(root, "dev/null")) || x.devices != 1 {
		t.Errorf("device node made on the host (devices=%d)", x.devices)
	}
}

func TestExtractHostile(t *testing.T) {
	outside := t.TempDir()
	for _, tc := range []struct {
		name  string
		ents  []entry
		want  string // in the error; "" when the layer applies (but stays inside the root)
		check func(t *testing.T, root string)
	}{
		{name: "dotdot", ents: []entry{{name: "../../escape", body: "x"}}, want: "path traversal"},
		{name: "dotdot inside", ents: []entry{{name: "a/../../escape", body: "x"}}, want: "path traversal"},
		{name: "hardlink out", ents: []entry{{name: "h", typ: tar.TypeLink, link: "../../etc/passwd"}}, want: "path traversal"},
		{name: "hardlink to missing", ents: []entry{{name: "h", typ: tar.TypeLink, link: "nope"}}, want: "not a file in the image"},
		{name: "absolute symlink escape", ents: []entry{
			{name: "esc", typ: tar.TypeSymlink, link: outside},
			{name: "esc/pwned", body: "x"},
		}, check: func(t *testing.T, root string) {
			if exists(filepath.Join(outside, "pwned")) {
				t.Fatal("wrote through a symlink out of the root")
			}
			if !exists(filepath.Join(root, outside, "pwned")) {
				t.Error("the symlink was not followed inside the root")
			}
		}},
		{name: "relative symlink escape", ents: []entry{
			{name: "d/esc", typ: tar.TypeSymlink, link: "../../../../../../" + outside},
			{name: "d/esc/pwned2", body: "x"},
		}, check: func(t *testing.T, root string) {
			if exists(filepath.Join(outside, "pwned2")) {
				t.Fatal("wrote through a symlink out of the root")
			}
		}},
		{name: "symlink replaced file", ents: []entry{
			{name: "f", typ: tar.TypeSymlink, link: outside + "/victim"},
			{name: "f", body: "overwrite"},
		}, check: func(t *testing.T, root string) {
			if exists(filepath.Join(outside, "victim")) {
				t.Fatal("a file entry wrote through a symlink")
			}
		}},
		{name: "symlink loop", ents: []entry{
			{name: "a", typ: tar.TypeSymlink, link: "b"}, {name: "b", typ: tar.TypeSymlink, link: "a"},
			{name: "a/x", body: "x"},
		}, want: "too many levels"},
		{name: "control char", ents: []entry{{name: "bad\nname", body: "x"}}, want: "control character"},
		{name: "too big", ents: []entry{{name: "big", body: strings.Repeat("x", 2000)}}, want: "raise --max-size"},
		{name: "too many", ents: []entry{{name: "1"}, {name: "2"}, {name: "3"}, {name: "4"}, {name: "5"}, {name: "6"}}, want: "raise --max-inodes"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			root := t.TempDir()
			inodes := int64(100)
			if tc.name == "too many" {
				inodes = 5
			}
			x := newExtractor(root, 1000, inodes)
			err := applyAll(t, x, layerTar(t, tc.ents...))
			if tc.want == "" {
				if err != nil {
					t.Fatal(err)
				}
			} else {
				if err == nil || !strings.Contains(err.Error(), tc.want) || !errors.Is(err, errdefs.ErrInvalid) {
					t.Fatalf("err = %v, want invalid with %q", err, tc.want)
				}
				if strings.Contains(err.Error(), "\n") {
					t.Errorf("error is more than one line: %q", err)
				}
			}
			if tc.check != nil {
				tc.check(t, root)
			}
			if ents, _ := os.ReadDir(outside); len(ents) > 0 {
				t.Fatalf("%d entries appeared outside the root", len(ents))
			}
		})
	}
}

func TestExtractTruncated(t *testing.T) {
	l := layerTar(t, entry{name: "f", body: strings.Repeat("y", 4096)})
	x := newExtractor(t.TempDir(), 0, 0)
	err := x.apply(bytes.NewReader(l[:1024]), "layer 1")
	if err == nil || !strings.Contains(err.Error(), "layer 1") {
		t.Fatalf("truncated layer: err = %v", err)
	}
}

// FuzzExtract feeds arbitrary tar streams, after a layer with symlinks pointing out, and checks
// nothing is ever written outside the root.
func FuzzExtract(f *testing.F) {
	f.Add(layerTar(f, entry{name: "a/b", body: "x"}, entry{name: "l", typ: tar.TypeSymlink, link: "/"}))
	f.Add(layerTar(f, entry{name: "up/x", body: "x"}, entry{name: "h", typ: tar.TypeLink, link: "up/x"}, entry{name: ".wh.up"}))
	f.Add(layerTar(f, entry{name: "d/.wh..wh..opq"}, entry{name: "../x", body: "x"}))
	f.Fuzz(func(t *testing.T, data []byte) {
		base := t.TempDir()
		outside := filepath.Join(base, "outside")
		root := filepath.Join(base, "root")
		os.Mkdir(outside, 0o755)
		os.Mkdir(root, 0o755)
		x := newExtractor(root, 1<<20, 1000)
		setup := layerTar(t,
			entry{name: "up", typ: tar.TypeSymlink, link: "../outside"},
			entry{name: "abs", typ: tar.TypeSymlink, link: outside},
			entry{name: "dot", typ: tar.TypeSymlink, link: "../../../.."},
		)
		if err := x.apply(bytes.NewReader(setup), "setup"); err != nil {
			t.Fatal(err)
		}
		x.apply(bytes.NewReader(data), "fuzz")
		if ents, _ := os.ReadDir(outside); len(ents) > 0 {
			t.Fatalf("wrote %s outside the root", ents[0].Name())
		}
		if ents, _ := os.ReadDir(base); len(ents) != 2 {
			t.Fatalf("%d entries beside the root", len(ents))
		}
	})
}
