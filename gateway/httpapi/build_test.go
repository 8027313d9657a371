package httpapi

import (
	"archive/tar"
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	vmmapi "github.com/IniZio/nexus/pkg/api/vmm"
)

func tarOf(t *testing.T, entries ...*tar.Header) string {
	t.Helper()
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, h := range entries {
		body := h.Linkname
		if h.Typeflag == tar.TypeReg {
			body, h.Linkname = h.Linkname, ""
			h.Size = int64(len(body))
		}
		if err := tw.WriteHeader(h); err != nil {
			t.Fatal(err)
		}
		if h.Typeflag == tar.TypeReg {
			tw.Write([]byte(body))
		}
	}
	tw.Close()
	return buf.String()
}

// file is a regular file entry; its content travels in Linkname until tarOf writes it.
func file(name, content string) *tar.Header {
	return &tar.Header{Name: name, Typeflag: tar.TypeReg, Mode: 0o644, Linkname: content}
}

func TestDockerBuildOverHTTP(t *testing.T) {
	var got DockerBuild
	var files map[string]string
	f := newFixture(t, func(c *Config) {
		c.Build = func(_ context.Context, b DockerBuild) (vmmapi.ImageInfo, error) {
			got, files = b, map[string]string{}
			filepath.Walk(b.Context, func(p string, fi os.FileInfo, err error) error {
				if err == nil && fi.Mode().IsRegular() {
					data, _ := os.ReadFile(p)
					rel, _ := filepath.Rel(b.Context, p)
					files[rel] = string(data)
				}
				return nil
			})
			return vmmapi.ImageInfo{Name: b.Tag}, nil
		}
	})
	ctx := tarOf(t, file("Dockerfile", "FROM nexus-mini\nCOPY app /app\n"), &tar.Header{Name: "app/", Typeflag: tar.TypeDir, Mode: 0o755},
		file("./app/run.sh", "echo hi"), &tar.Header{Name: "app/link", Typeflag: tar.TypeSymlink, Linkname: "/etc/passwd"})

	if a := f.do(t, f.tokens[ScopeRead], "POST", "/v1/builds/tools:dev", ctx); a.status != 403 || !strings.Contains(a.msg, "needs scope write") {
		t.Errorf("a build with a read token: %d %s", a.status, a.body)
	}
	a := f.do(t, f.tokens[ScopeWrite], "POST", "/v1/builds/tools:dev?build_arg=V%3D2&allow_host=deb.debian.org&memory_mib=512&no_cache=true", ctx)
	if a.status != 200 || !strings.Contains(a.body, `"name":"tools:dev"`) {
		t.Fatalf("build: %d %s", a.status, a.body)
	}
	if got.Tag != "tools:dev" || got.File != "Dockerfile" || got.BuildArgs["V"] != "2" || len(got.AllowHosts) != 1 || got.MemoryMiB != 512 || !got.NoCache {
		t.Errorf("the build asked: %+v", got)
	}
	if files["Dockerfile"] != "FROM nexus-mini\nCOPY app /app\n" || files["app/run.sh"] != "echo hi" || len(files) != 2 {
		t.Errorf("the unpacked context: %v", files)
	}
	if _, err := os.Stat(got.Context); !os.IsNotExist(err) {
		t.Errorf("the context %s is left after the build: %v", got.Context, err)
	}

	for _, c := range []struct{ what, query, body, msg string }{
		{"a path out of the context", "", tarOf(t, file("../evil", "x")), "not a path inside the context"},
		{"an absolute path", "", tarOf(t, file("/etc/evil", "x")), "not a path inside the context"},
		{"a write through a link", "", tarOf(t, &tar.Header{Name: "l", Typeflag: tar.TypeSymlink, Linkname: "/tmp"}, file("l/evil", "x")), "build context: l/evil"},
		{"not a tar", "", "plain text that is no tar archive at all, longer than one block? no" + strings.Repeat(".", 600), "not a tar archive"},
		{"a Dockerfile outside", "?file=..%2FDockerfile", ctx, "inside the context"},
		{"a build arg from the environment", "?build_arg=HOME", ctx, "give NAME=VALUE"},
	} {
		if a := f.do(t, f.tokens[ScopeWrite], "POST", "/v1/builds/x"+c.query, c.body); a.status != 400 || !strings.Contains(a.msg, c.msg) {
			t.Errorf("%s: %d %s", c.what, a.status, a.body)
		}
	}
}
