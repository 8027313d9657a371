package image_test

import (
	"bufio"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/IniZio/nexus/gateway/cli"
	vmmapi "github.com/IniZio/nexus/pkg/api/vmm"
)

const buildDockerfile = `# a comment
ARG BASE=nexus-mini
FROM ${BASE}
ARG GREETING=hello
ENV APP_HOME=/srv/app \
    MODE=test
WORKDIR $APP_HOME
COPY app/ ./
COPY --chmod=0640 app/hello.txt /etc/hello
RUN echo "$GREETING from run in $(pwd)" > built.txt && id -u > uid.txt && mkdir /srv/data && chown 1000 /srv/data
USER 1000
LABEL org.example.built=yes
EXPOSE 8080
CMD ["cat", "built.txt"]
`

func writeFiles(t *testing.T, dir string, files map[string]string) {
	t.Helper()
	for name, body := range files {
		p := filepath.Join(dir, name)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		mode := os.FileMode(0o644)
		if strings.HasSuffix(name, ".sh") {
			mode = 0o755
		}
		if err := os.WriteFile(p, []byte(body), mode); err != nil {
			t.Fatal(err)
		}
	}
}

// build runs nexus image build -f --json and returns the image and the progress lines.
func build(t *testing.T, args ...string) (vmmapi.ImageInfo, []cli.BuildProgress, string, int) {
	t.Helper()
	out, errOut, code := stack.Nexus(t, append([]string{"image", "build", "--json"}, args...)...)
	var info vmmapi.ImageInfo
	if code == 0 {
		if err := json.Unmarshal([]byte(out), &info); err != nil {
			t.Fatalf("build output: %v: %s", err, out)
		}
	}
	var steps []cli.BuildProgress
	sc := bufio.NewScanner(strings.NewReader(errOut))
	for sc.Scan() {
		var p cli.BuildProgress
		if json.Unmarshal(sc.Bytes(), &p) == nil && p.Step != "" && p.Status != "" {
			steps = append(steps, p)
		}
	}
	return info, steps, errOut, code
}

func statuses(steps []cli.BuildProgress) map[string]int {
	m := map[string]int{}
	for _, s := range steps {
		m[s.Status]++
	}
	return m
}

// TestDockerfileBuild: a Dockerfile with ARG, ENV, WORKDIR, COPY, RUN, USER, LABEL, EXPOSE and
// CMD builds in a builder sandbox from nexus-mini; the result boots with the files, the config
// and what RUN made; an unchanged rebuild is all cached and boots nothing; a Dockerfile that
// extends it starts from it; unsupported instructions and a failing RUN are refused with the
// line and leave no image and no builder.
func TestDockerfileBuild(t *testing.T) {
	ctx := t.TempDir()
	writeFiles(t, ctx, map[string]string{
		"Dockerfile":    buildDockerfile,
		".dockerignore": "secret.txt\n**/*.log\n",
		"app/hello.txt": "hello from the context\n",
		"app/bin/go.sh": "#!/bin/sh\necho go\n",
		"secret.txt":    "never copied",
		"app/debug.log": "left out",
	})
	// A link out of the context is copied as a link, never followed.
	if err := os.Symlink("/etc/shadow", filepath.Join(ctx, "app", "escape")); err != nil {
		t.Fatal(err)
	}
	df := filepath.Join(ctx, "Dockerfile")
	t0 := time.Now()
	info, steps, errOut, code := build(t, "-f", df, "--build-arg", "GREETING=hi", "-t", "built/app:1", ctx)
	if code != 0 {
		t.Fatalf("image build: exit %d:\n%s", code, errOut)
	}
	t.Logf("build: %v", time.Since(t0))
	if info.Name != "built/app" || len(info.Tags) != 1 || info.Tags[0] != "1" || !strings.HasPrefix(info.Digest, "sha256:") {
		t.Errorf("built %+v", info)
	}
	if info.WorkingDir != "/srv/app" || info.User != "1000" || info.Labels["org.example.built"] != "yes" ||
		strings.Join(info.Cmd, " ") != "cat built.txt" || len(info.ExposedPorts) != 1 || info.ExposedPorts[0] != "8080/tcp" {
		t.Errorf("built config %+v", info)
	}
	if st := statuses(steps); st["running"] != 10 || st["failed"] != 0 {
		t.Errorf("progress %v:\n%s", st, errOut)
	}

	const box = "img/built"
	stack.MustNexus(t, "create", box, "--image", "built/app:1", "--memory", "256", "-l", "nexus-test=1")
	t.Cleanup(func() { stack.Nexus(t, "rm", "--force", box) })
	if o := stack.MustNexus(t, "exec", box); o != "hi from run in /srv/app\n" {
		t.Errorf("exec without a command printed %q, want the CMD's output", o)
	}
	out := stack.MustNexus(t, "exec", box, "--", "sh", "-c",
		`id -u; cat uid.txt; echo "$MODE"; cat hello.txt; bin/go.sh; stat -c %a /etc/hello; readlink escape; ls -a`)
	lines := strings.Split(out, "\n")
	want := []string{"1000", "0", "test", "hello from the context", "go", "640", "/etc/shadow"}
	for i, w := range want {
		if i >= len(lines) || lines[i] != w {
			t.Fatalf("guest line %d: want %q:\n%s", i+1, w, out)
		}
	}
	if strings.Contains(out, "debug.log") || strings.Contains(out, "secret") {
		t.Errorf(".dockerignore'd files were copied:\n%s", out)
	}

	// The running sandbox's disk becomes an image (flushed, paused for the copy, resumed).
	stack.MustNexus(t, "exec", box, "--", "sh", "-c", "echo saved live > /srv/data/live.txt")
	live := imageJSON(t, "image", "save", box, "saved/app:live")
	if b, err := exec.Command("debugfs", "-R", "cat /srv/data/live.txt", live.Path).Output(); err != nil || string(b) != "saved live\n" {
		t.Errorf("the saved disk has live.txt = %q, %v", b, err)
	}
	if live.WorkingDir != "/srv/app" || strings.Join(live.Cmd, " ") != "cat built.txt" {
		t.Errorf("the saved image lost its base's config: %+v", live)
	}
	if o := stack.MustNexus(t, "exec", box, "--", "cat", "/srv/data/live.txt"); o != "saved live\n" {
		t.Errorf("the sandbox after save: %q", o)
	}
	// image save -o writes a docker save tarball that image import reads back.
	tarball := filepath.Join(t.TempDir(), "app.tar")
	stack.MustNexus(t, "image", "save", "built/app:1", "-o", tarball)
	// From stdin it streams over the bus to the vmm, wherever that runs.
	archive, err := os.ReadFile(tarball)
	if err != nil {
		t.Fatal(err)
	}
	out, errOut, code = stack.NexusIn(t, archive, "image", "import", "-", "reimported/app:1", "--json")
	var back vmmapi.ImageInfo
	if err := json.Unmarshal([]byte(out), &back); code != 0 || err != nil {
		t.Fatalf("image import -: exit %d, %v: %s", code, err, errOut)
	}
	if back.WorkingDir != "/srv/app" || back.User != "1000" || back.Labels["org.example.built"] != "yes" {
		t.Errorf("imported back %+v", back)
	}
	if b, err := exec.Command("debugfs", "-R", "cat /srv/app/built.txt", back.Path).Output(); err != nil || string(b) != "hi from run in /srv/app\n" {
		t.Errorf("the imported root has built.txt = %q, %v", b, err)
	}

	// Unchanged: every step cached, the same image, no builder.
	t0 = time.Now()
	again, steps, errOut, code := build(t, "-f", df, "--build-arg", "GREETING=hi", "-t", "built/app:2", ctx)
	if code != 0 || again.Key != info.Key {
		t.Fatalf("rebuild: exit %d, key %s (was %s):\n%s", code, again.Key, info.Key, errOut)
	}
	t.Logf("rebuild from cache: %v", time.Since(t0))
	if st := statuses(steps); st["running"] != 0 || st["cached"] != 10 {
		t.Errorf("rebuild progress %v, want all 10 steps after FROM cached:\n%s", st, errOut)
	}
	// Extending it starts from the last build: only the new step is done, without a builder.
	os.WriteFile(df, []byte(buildDockerfile+"ENV EXTRA=1\n"), 0o644)
	ext, steps, errOut, code := build(t, "-f", df, "--build-arg", "GREETING=hi", "-t", "built/app:3", ctx)
	if st := statuses(steps); code != 0 || st["cached"] != 10 || st["running"] != 0 || ext.Key == info.Key {
		t.Errorf("extended build: exit %d, %v, key %s:\n%s", code, st, ext.Key, errOut)
	}

	// Refusals: the line, one line, nothing recorded.
	os.WriteFile(df, []byte("FROM nexus-mini\nRUN true\nHEALTHCHECK CMD true\n"), 0o644)
	_, _, errOut, code = build(t, "-f", df, "-t", "built/bad:1", ctx)
	if code == 0 || !strings.Contains(errOut, "Dockerfile:3: HEALTHCHECK is not supported") {
		t.Errorf("HEALTHCHECK: exit %d: %s", code, errOut)
	}
	os.WriteFile(df, []byte("FROM nexus-mini\nCOPY app/hello.txt /\nRUN echo doomed; exit 3\n"), 0o644)
	_, steps, errOut, code = build(t, "-f", df, "-t", "built/bad:2", ctx)
	last := strings.TrimSpace(errOut[strings.LastIndex(strings.TrimSpace(errOut), "\n")+1:])
	if code == 0 || !strings.Contains(last, "step 3/3 (Dockerfile:3)") || !strings.Contains(last, "exit status 3: doomed") {
		t.Errorf("failing RUN: exit %d, last line %q:\n%s", code, last, errOut)
	}
	if st := statuses(steps); st["failed"] != 1 {
		t.Errorf("failing RUN progress %v", st)
	}
	if ls := stack.MustNexus(t, "image", "ls"); strings.Contains(ls, "built/bad") {
		t.Errorf("a failed build recorded an image:\n%s", ls)
	}
	if ps := stack.MustNexus(t, "ps", "-a"); strings.Contains(ps, "nexus-build") {
		t.Errorf("a builder sandbox was left:\n%s", ps)
	}
}
