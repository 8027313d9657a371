package image_test

import (
	"archive/tar"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	v1 "github.com/google/go-containerregistry/pkg/v1"

	"github.com/IniZio/nexus/internal/ocitest"
	vmmapi "github.com/IniZio/nexus/pkg/api/vmm"
)

// busybox takes /bin/busybox out of nexus-mini, so the test image has a shell without a download.
func busybox(t *testing.T) []byte {
	t.Helper()
	var info vmmapi.ImageInfo
	if err := json.Unmarshal([]byte(stack.MustNexus(t, "image", "build", "nexus-mini", "--json")), &info); err != nil {
		t.Fatal(err)
	}
	out := filepath.Join(t.TempDir(), "busybox")
	if b, err := exec.Command("debugfs", "-R", "dump /bin/busybox "+out, info.Path).CombinedOutput(); err != nil {
		t.Fatalf("debugfs dump: %v: %s", err, b)
	}
	b, err := os.ReadFile(out)
	if err != nil || len(b) < 100000 {
		t.Fatalf("busybox from nexus-mini: %d bytes, %v", len(b), err)
	}
	return b
}

// appImage: busybox and its applets, a user, a whiteout, a symlink, files owned by the user,
// and ENV/WORKDIR/USER/CMD.
func appImage(t *testing.T, bb []byte) v1.Image {
	files := []ocitest.File{
		{Name: "usr/bin/", Type: tar.TypeDir},
		{Name: "usr/bin/busybox", Body: string(bb), Mode: 0o755},
		{Name: "bin", Type: tar.TypeSymlink, Link: "usr/bin"},
		{Name: "etc/", Type: tar.TypeDir},
		{Name: "etc/passwd", Body: "root:x:0:0:root:/root:/bin/sh\napp:x:1000:1000:app:/srv/app:/bin/sh\n"},
		{Name: "etc/group", Body: "root:x:0:\napp:x:1000:\n"},
		{Name: "etc/obsolete", Body: "whited out above"},
	}
	for _, a := range []string{"sh", "cat", "id", "pwd", "ls", "stat", "env", "readlink"} {
		files = append(files, ocitest.File{Name: "usr/bin/" + a, Type: tar.TypeSymlink, Link: "busybox"})
	}
	base := ocitest.Tar(t, files...)
	mid := ocitest.Tar(t,
		ocitest.File{Name: "etc/.wh.obsolete"},
		ocitest.File{Name: "srv/app/", Type: tar.TypeDir, UID: 1000, GID: 1000, Mode: 0o750},
	)
	top := ocitest.Tar(t,
		ocitest.File{Name: "srv/app/hello", Body: "hello from a layer\n", UID: 1000, GID: 1000, Mode: 0o640},
		ocitest.File{Name: "srv/app/greeting", Type: tar.TypeSymlink, Link: "/srv/app/hello"},
	)
	return ocitest.Image(t, "amd64", v1.Config{
		Env:        []string{"PATH=/usr/bin:/bin", "GREETING=hi from the image"},
		WorkingDir: "/srv/app", User: "app", Cmd: []string{"cat", "hello"},
		Labels: map[string]string{"org.example.team": "nexus"},
	}, ocitest.Layer(t, base), ocitest.Layer(t, mid), ocitest.Layer(t, top))
}

func imageJSON(t *testing.T, args ...string) vmmapi.ImageInfo {
	t.Helper()
	var info vmmapi.ImageInfo
	out := stack.MustNexus(t, append(args, "--json")...)
	if err := json.Unmarshal([]byte(out), &info); err != nil {
		t.Fatalf("%v: %v: %s", args, err, out)
	}
	return info
}

// TestOCIImage: push to a loopback registry, pull by tag and by digest, create a sandbox from a
// tag pulled on first use, and exec sees the image's files, env, workdir and user. Tags that do
// not exist and hostile layers are refused; an image in use is not removed.
func TestOCIImage(t *testing.T) {
	reg := ocitest.NewRegistry(t)
	img := appImage(t, busybox(t))
	dig := reg.Push(t, "demo/app:1.2", img)
	repo := reg.Host + "/demo/app"

	pulled := imageJSON(t, "image", "pull", "--insecure", repo+":1.2")
	if pulled.Digest != dig || pulled.WorkingDir != "/srv/app" || pulled.User != "app" || pulled.Labels["org.example.team"] != "nexus" {
		t.Fatalf("pulled %+v, want digest %s and the image config", pulled, dig)
	}
	if byDigest := imageJSON(t, "image", "pull", repo+"@"+dig); byDigest.Key != pulled.Key {
		t.Errorf("pull by digest gave %s, by tag %s", byDigest.Key, pulled.Key)
	}
	ls := stack.MustNexus(t, "image", "ls")
	if !strings.Contains(ls, "DIGEST") || !strings.Contains(ls, repo) || !strings.Contains(ls, dig[:19]) {
		t.Errorf("image ls does not show %s %s:\n%s", repo, dig[:19], ls)
	}
	if insp := stack.MustNexus(t, "image", "inspect", repo+":1.2"); !strings.Contains(insp, `"org.example.team": "nexus"`) {
		t.Errorf("inspect shows no labels:\n%s", insp)
	}

	// Unknown tags are refused before anything boots.
	_, errOut, code := stack.Nexus(t, "create", "img/bogus", "--image", "nexus-mini:bogus")
	if code == 0 || !strings.Contains(errOut, "its tags are") || !strings.Contains(errOut, "latest") {
		t.Errorf("create --image nexus-mini:bogus: exit %d: %s", code, errOut)
	}
	if _, errOut, code := stack.Nexus(t, "create", "img/bogus2", "--image", repo+":nope"); code == 0 || !strings.Contains(errOut, "nope") {
		t.Errorf("create --image %s:nope: exit %d: %s", repo, code, errOut)
	}

	if ls := stack.MustNexus(t, "ps", "-a"); strings.Contains(ls, "bogus") {
		t.Errorf("a refused create left a sandbox:\n%s", ls)
	}

	// A tag pushed only to the registry is pulled by create on first use.
	reg.Push(t, "demo/app:first-use", img)
	const box = "img/app"
	stack.MustNexus(t, "create", box, "--image", repo+":first-use", "--memory", "256", "-l", "nexus-test=1")
	t.Cleanup(func() { stack.Nexus(t, "rm", "--force", box) })
	out := stack.MustNexus(t, "exec", box, "--", "sh", "-c",
		`id -u; id -g; pwd; echo "$GREETING"; cat hello; cat greeting; ls /etc; stat -c %u:%g:%a /srv/app/hello; readlink /bin`)
	want := []string{"1000", "1000", "/srv/app", "hi from the image", "hello from a layer", "hello from a layer"}
	lines := strings.Split(strings.TrimSpace(out), "\n")
	if len(lines) < len(want) {
		t.Fatalf("exec output:\n%s", out)
	}
	for i, w := range want {
		if lines[i] != w {
			t.Errorf("exec line %d = %q, want %q\n%s", i+1, lines[i], w, out)
		}
	}
	if strings.Contains(out, "obsolete") || !strings.Contains(out, "passwd") {
		t.Errorf("/etc in the guest does not reflect the whiteout:\n%s", out)
	}
	if !strings.Contains(out, "1000:1000:640") || !strings.HasSuffix(strings.TrimSpace(out), "usr/bin") {
		t.Errorf("owner/mode or symlink lost:\n%s", out)
	}
	// No command: the image's Entrypoint + Cmd, in its WorkingDir.
	if o := stack.MustNexus(t, "exec", box); o != "hello from a layer\n" {
		t.Errorf("exec without a command printed %q, want the image's CMD (cat hello)", o)
	}
	// What the caller gives wins over the image's defaults.
	if o := stack.MustNexus(t, "exec", "-w", "/", box, "--", "pwd"); strings.TrimSpace(o) != "/" {
		t.Errorf("exec -w / ran in %q", o)
	}

	if _, errOut, code := stack.Nexus(t, "image", "rm", repo+"@"+dig); code == 0 || !strings.Contains(errOut, "backs the disks") {
		t.Errorf("image rm of an image in use: exit %d: %s", code, errOut)
	}

	// Hostile layers: one line, nothing recorded.
	reg.Push(t, "bad:traversal", ocitest.Image(t, "amd64", v1.Config{},
		ocitest.Layer(t, ocitest.Tar(t, ocitest.File{Name: "../../etc/cron.d/x", Body: "* * * * * root sh"}))))
	_, errOut, code = stack.Nexus(t, "image", "pull", reg.Host+"/bad:traversal")
	errLines := strings.Split(strings.TrimSpace(errOut), "\n")
	if last := errLines[len(errLines)-1]; code == 0 || !strings.Contains(last, "path traversal") || !strings.Contains(last, "layer 1/1") {
		t.Errorf("pull of a traversal layer: exit %d: %q", code, errOut)
	}
	if _, _, code := stack.Nexus(t, "image", "inspect", reg.Host+"/bad:traversal"); code == 0 {
		t.Error("a refused image was recorded")
	}
}
