package image_test

import (
	"archive/tar"
	"bufio"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"

	"github.com/IniZio/nexus/gateway/cli"
	"github.com/IniZio/nexus/internal/ocitest"
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
RUN echo "$GREETING from run in $(pwd)" > built.txt && id -u > uid.txt && mkdir /srv/data && chown 1000 /srv/data && \
    cat /proc/sys/kernel/random/uuid > /srv/once.txt && echo "first RUN $((6 * 7))"
USER 1000
RUN echo step one >> /srv/data/last.txt
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

// debugfsCat reads a file of an ext4 image on the host.
func debugfsCat(t *testing.T, img, p string) string {
	t.Helper()
	b, err := exec.Command("debugfs", "-R", "cat "+p, img).Output()
	if err != nil || len(b) == 0 {
		t.Fatalf("debugfs cat %s: %q, %v", p, b, err)
	}
	return string(b)
}

func statuses(steps []cli.BuildProgress) map[string]int {
	m := map[string]int{}
	for _, s := range steps {
		m[s.Status]++
	}
	return m
}

// TestDockerfileBuild: a Dockerfile with ARG, ENV, WORKDIR, COPY, RUN, USER, LABEL, EXPOSE and
// CMD builds in a builder sandbox from nexus-mini; an unchanged rebuild is all cached and boots
// nothing; a Dockerfile that extends it starts from it; one whose last RUN changed starts a
// builder on the layer of the step before it and runs only that RUN and what follows; the result
// boots, after the build cache is gone, with the files, the config and what both RUNs made;
// unsupported instructions and a failing RUN (in an image without /etc/passwd) are refused with
// the line and leave no image and no builder.
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
	if st := statuses(steps); st["running"] != 11 || st["failed"] != 0 {
		t.Errorf("progress %v:\n%s", st, errOut)
	}
	once := debugfsCat(t, info.Path, "/srv/once.txt")
	if !strings.Contains(errOut, "first RUN 42") {
		t.Errorf("the first RUN's output is not in the progress:\n%s", errOut)
	}

	// Unchanged: every step cached, the same image, no builder.
	t0 = time.Now()
	again, steps, errOut, code := build(t, "-f", df, "--build-arg", "GREETING=hi", "-t", "built/app:2", ctx)
	if code != 0 || again.Key != info.Key {
		t.Fatalf("rebuild: exit %d, key %s (was %s):\n%s", code, again.Key, info.Key, errOut)
	}
	t.Logf("rebuild from cache: %v", time.Since(t0))
	if st := statuses(steps); st["running"] != 0 || st["cached"] != 11 {
		t.Errorf("rebuild progress %v, want all 11 steps after FROM cached:\n%s", st, errOut)
	}
	// Extending it starts from the last build: only the new step is done, without a builder.
	os.WriteFile(df, []byte(buildDockerfile+"ENV EXTRA=1\n"), 0o644)
	ext, steps, errOut, code := build(t, "-f", df, "--build-arg", "GREETING=hi", "-t", "built/app:3", ctx)
	if st := statuses(steps); code != 0 || st["cached"] != 11 || st["running"] != 0 || ext.Key == info.Key {
		t.Errorf("extended build: exit %d, %v, key %s:\n%s", code, st, ext.Key, errOut)
	}
	// Only the last RUN changed: the steps to the first RUN come from the build cache's layers
	// (the first RUN is not executed again), the builder starts on the state before the old
	// last RUN (its append is not there), and the steps from USER on run.
	os.WriteFile(df, []byte(strings.Replace(buildDockerfile, "step one", "step two", 1)), 0o644)
	info, steps, errOut, code = build(t, "-f", df, "--build-arg", "GREETING=hi", "-t", "built/app:4", ctx)
	if code != 0 {
		t.Fatalf("build with a changed last RUN: exit %d:\n%s", code, errOut)
	}
	cached := 0
	for _, p := range steps {
		if p.Status == "cached" && p.Cached {
			cached++
		}
	}
	if st := statuses(steps); st["cached"] != 6 || cached != 6 || st["running"] != 5 || st["failed"] != 0 {
		t.Errorf("changed last RUN: progress %v (%d with cached: true), want 6 cached and 5 run:\n%s", st, cached, errOut)
	}
	if strings.Contains(errOut, "first RUN 42") {
		t.Errorf("the first RUN ran again:\n%s", errOut)
	}
	// The image stands alone: it boots with the build cache gone.
	if err := os.RemoveAll(filepath.Join(stack.Home.Images(), "layers")); err != nil {
		t.Fatal(err)
	}

	const box = "img/built"
	stack.MustNexus(t, "create", box, "--image", "built/app:4", "--memory", "256", "-l", "nexus-test=1")
	t.Cleanup(func() { stack.Nexus(t, "rm", "--force", box) })
	if o := stack.MustNexus(t, "exec", box); o != "hi from run in /srv/app\n" {
		t.Errorf("exec without a command printed %q, want the CMD's output", o)
	}
	out := stack.MustNexus(t, "exec", box, "--", "sh", "-c",
		`id -u; cat uid.txt; echo "$MODE"; cat hello.txt; bin/go.sh; stat -c %a /etc/hello; readlink escape; cat /srv/once.txt; cat /srv/data/last.txt; ls -a`)
	lines := strings.Split(out, "\n")
	want := []string{"1000", "0", "test", "hello from the context", "go", "640", "/etc/shadow", strings.TrimSpace(once), "step two"}
	for i, w := range want {
		if i >= len(lines) || lines[i] != w {
			t.Fatalf("guest line %d: want %q:\n%s", i+1, w, out)
		}
	}
	if strings.Contains(out, "step one") {
		t.Errorf("the build started on the old last RUN's result:\n%s", out)
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
	stack.MustNexus(t, "image", "save", "built/app:4", "-o", tarball)
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

	// Refusals: the line, one line, nothing recorded.
	os.WriteFile(df, []byte("FROM nexus-mini\nRUN true\nHEALTHCHECK CMD true\n"), 0o644)
	_, _, errOut, code = build(t, "-f", df, "-t", "built/bad:1", ctx)
	if code == 0 || !strings.Contains(errOut, "Dockerfile:3: HEALTHCHECK is not supported") {
		t.Errorf("HEALTHCHECK: exit %d: %s", code, errOut)
	}
	// The failing builder boots a scratch-like image: a static busybox and no /etc, so no
	// /etc/passwd. COPY runs as root all the same (uid 0 needs no entry), the agent makes /etc
	// (resolv.conf, hostname) and, without --allow-host, the builder has the allow-all window's
	// network and resolver.
	noEtc := ocitest.Image(t, "amd64", v1.Config{Env: []string{"PATH=/usr/bin:/bin"}}, ocitest.Layer(t, ocitest.Tar(t,
		ocitest.File{Name: "usr/bin/", Type: tar.TypeDir},
		ocitest.File{Name: "usr/bin/busybox", Body: string(busybox(t)), Mode: 0o755},
		ocitest.File{Name: "usr/bin/sh", Type: tar.TypeSymlink, Link: "busybox"},
		ocitest.File{Name: "usr/bin/grep", Type: tar.TypeSymlink, Link: "busybox"},
		ocitest.File{Name: "usr/bin/cat", Type: tar.TypeSymlink, Link: "busybox"},
		ocitest.File{Name: "bin", Type: tar.TypeSymlink, Link: "usr/bin"})))
	noEtcTar := filepath.Join(t.TempDir(), "noetc.tar")
	ocitest.Save(t, noEtcTar, "noetc:1", noEtc)
	stack.MustNexus(t, "image", "import", noEtcTar, "built/noetc:1")
	os.WriteFile(df, []byte("FROM built/noetc:1\nCOPY app/hello.txt /\nRUN cat /hello.txt && grep -q nameserver /etc/resolv.conf && echo doomed; exit 3\n"), 0o644)
	_, steps, errOut, code = build(t, "-f", df, "-t", "built/bad:2", ctx)
	last := strings.TrimSpace(errOut[strings.LastIndex(strings.TrimSpace(errOut), "\n")+1:])
	if code == 0 || !strings.Contains(last, "step 3/3 (Dockerfile:3)") || !strings.Contains(last, "exit status 3: doomed") {
		t.Errorf("failing RUN in an image without /etc/passwd: exit %d, last line %q:\n%s", code, last, errOut)
	}
	if !strings.Contains(errOut, "hello from the context") {
		t.Errorf("COPY as root in an image without /etc/passwd did not copy:\n%s", errOut)
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
