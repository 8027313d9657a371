package image

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"

	v1 "github.com/google/go-containerregistry/pkg/v1"

	"github.com/IniZio/nexus/pkg/errdefs"
)

func diffID(b []byte) v1.Hash {
	s := sha256.Sum256(b)
	return v1.Hash{Algorithm: "sha256", Hex: hex.EncodeToString(s[:])}
}

// procField is a field of /proc/PID/status.
func procField(t *testing.T, pid int, field string) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("/proc", strconv.Itoa(pid), "status"))
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(l, field+":"); ok {
			return strings.Join(strings.Fields(v), " ")
		}
	}
	t.Fatalf("no %s in /proc/%d/status", field, pid)
	return ""
}

// TestExtractorUnprivileged: the layers are applied by a child that holds no host privilege: on
// the host it is an unprivileged uid with no groups, in a user namespace of its own, and its root
// is the work root (it cannot name any other host path). What it writes is owned by that uid,
// the owners the layer asks for are recorded, and a hostile layer's error comes back whole.
func TestExtractorUnprivileged(t *testing.T) {
	t.Run("userns", testExtractorUnprivileged)
	// Where user namespaces are unavailable: the same uid, without one.
	testNoUserNS = true
	defer func() { testNoUserNS = false }()
	t.Run("uid", testExtractorUnprivileged)
}

func testExtractorUnprivileged(t *testing.T) {
	wantUID := os.Getuid()
	if wantUID == 0 {
		wantUID = ExtractUID
	}
	userNS := exec.Command("unshare", "-U", "true").Run() == nil && !testNoUserNS
	root := filepath.Join(t.TempDir(), "root")
	if err := os.Mkdir(root, 0o755); err != nil {
		t.Fatal(err)
	}
	var status, groups, ns string
	var childRoot os.FileInfo
	testExtractorReady = func(pid int) {
		status, groups = procField(t, pid, "Uid")+" / "+procField(t, pid, "Gid"), procField(t, pid, "Groups")
		ns, _ = os.Readlink(filepath.Join("/proc", strconv.Itoa(pid), "ns", "user"))
		childRoot, _ = os.Stat(filepath.Join("/proc", strconv.Itoa(pid), "root"))
	}
	defer func() { testExtractorReady = nil }()

	ex, err := startExtraction(root, 0, 0)
	if err != nil {
		t.Fatal(err)
	}
	id := strconv.Itoa(wantUID)
	if want := strings.Repeat(id+" ", 3) + id + " / " + strings.Repeat(id+" ", 3) + id; status != want {
		t.Errorf("the extractor runs as Uid/Gid %q on the host, want %q", status, want)
	}
	if os.Getuid() == 0 && groups != "" {
		t.Errorf("the extractor keeps the groups %q", groups)
	}
	own, _ := os.Readlink("/proc/self/ns/user")
	if userNS {
		if !ex.userNS || ns == own {
			t.Errorf("the extractor is not in a user namespace of its own (%s, ours %s)", ns, own)
		}
		if fi, err := os.Stat(root); err != nil || childRoot == nil || !os.SameFile(fi, childRoot) {
			t.Errorf("the extractor's root is not the work root %s", root)
		}
	}

	l := layerTar(t, entry{name: "etc/shadow", body: "secret", mode: 0o4640, uid: 0, gid: 42},
		entry{name: "srv/", typ: '5', mode: 0o750, uid: 1000, gid: 1000})
	if err := ex.layer(bytes.NewReader(l), "layer 1", diffID(l)); err != nil {
		t.Fatal(err)
	}
	x, err := ex.finish(0, 0)
	if err != nil {
		t.Fatal(err)
	}
	fi, err := os.Lstat(filepath.Join(root, "etc", "shadow"))
	if err != nil {
		t.Fatal(err)
	}
	if st := fi.Sys().(*syscall.Stat_t); int(st.Uid) != wantUID || fi.Mode()&os.ModeSetuid != 0 {
		t.Errorf("etc/shadow on the host: uid %d mode %v, want uid %d and no setuid", st.Uid, fi.Mode(), wantUID)
	}
	if got := x.meta["etc/shadow"]; got != (owner{uid: 0, gid: 42, perm: 0o4640}) {
		t.Errorf("recorded etc/shadow as %+v", got)
	}
	if got := x.meta["srv"]; got != (owner{uid: 1000, gid: 1000, perm: 0o750}) {
		t.Errorf("recorded srv as %+v", got)
	}
	if _, ok := x.meta["tmp"]; !ok {
		t.Error("the child made no /tmp")
	}

	// A hostile layer: the child's one-line error, as invalid input.
	root2 := filepath.Join(t.TempDir(), "root")
	os.Mkdir(root2, 0o755)
	ex, err = startExtraction(root2, 0, 0)
	if err != nil {
		t.Fatal(err)
	}
	bad := layerTar(t, entry{name: "../../etc/cron.d/x", body: "* * * * * root sh"})
	if err := ex.layer(bytes.NewReader(bad), "layer 1", diffID(bad)); err != nil && !errors.Is(err, errStopped) {
		t.Fatal(err)
	}
	if _, err := ex.finish(0, 0); !errors.Is(err, errdefs.ErrInvalid) || !strings.Contains(err.Error(), "layer 1: path traversal") {
		t.Errorf("hostile layer: %v", err)
	}
}
