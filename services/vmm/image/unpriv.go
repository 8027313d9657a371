package image

import (
	"bufio"
	"bytes"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"golang.org/x/sys/unix"

	"github.com/IniZio/nexus/pkg/errdefs"
)

// Layers are hostile input, so they are not applied by the vmm (root) itself: an extractor child,
// this package's ExtractMain run as a hidden subcommand of the nexus binary, applies them. The
// vmm starts it in new user, mount, network, IPC and UTS namespaces whose only uid and gid (0)
// map to ExtractUID on the host (to the vmm's own uid when the vmm is not root). Before it reads
// any layer the child pivot_roots into the work root and drops the host's root, so it can name
// nothing else, then drops to that uid: on the host it is an unprivileged uid with no
// capabilities, no supplementary groups and no network. The vmm streams the uncompressed layers
// to it over a pipe (framed, checking each against its diff id as it goes), and the child sends
// back the owners and modes it recorded, which the vmm writes into the ext4 image after mkfs.
// Where user namespaces are unavailable, a root vmm runs the child as ExtractUID without them
// (chdir'd into the root; every path is resolved inside it either way).

// ExtractCommand is the hidden subcommand of the nexus binary that runs ExtractMain.
const ExtractCommand = "__image-extract"

// ExtractUID is the host uid (and gid) layers are extracted as when the vmm runs as root.
const ExtractUID = 60999

// extractSpec is what the child is told, as JSON in its one argument.
type extractSpec struct {
	Root      string `json:"root"`           // the root's name in the directory that is fd 4
	Path      string `json:"path,omitempty"` // the root's path (a user namespace's bind)
	Tree      bool   `json:"tree,omitempty"` // fd 4 is the root, a detached mount
	MaxBytes  int64  `json:"max_bytes"`
	MaxInodes int64  `json:"max_inodes"`
	UserNS    bool   `json:"userns"`         // in a user namespace: pivot_root, then setuid(0)
	Groups    bool   `json:"groups"`         // in one: the child may (and must) drop its groups
	DropTo    int    `json:"drop_to"`        // without one: the uid and gid to drop to (-1: stay)
	Test      bool   `json:"test,omitempty"` // wait for the parent's go before reading
}

// extractResult is the child's last message.
type extractResult struct {
	Meta    map[string][3]int64 `json:"meta,omitempty"` // path → uid, gid, mode
	Devices int                 `json:"devices,omitempty"`
	Error   string              `json:"error,omitempty"`
	Invalid bool                `json:"invalid,omitempty"` // Error is the input's fault
}

// Frames from the vmm to the child: a type byte and a 4-byte big-endian length, then the payload.
const (
	frameLayer  = 'L' // a layer starts; payload: its label
	frameData   = 'D' // layer content
	frameEnd    = 'E' // the layer is done
	frameFinish = 'F' // no more layers
	maxFrame    = 256 << 10
)

// testNoUserNS (tests) starts the child as if user namespaces were unavailable.
var testNoUserNS bool

// testExtractorReady, when set (tests), is called with the child's pid once it is contained.
var testExtractorReady func(pid int)

// ExtractMain is the child: it contains itself, applies the layers it is sent and writes the
// owners back. It runs in the namespaces the vmm created it in.
func ExtractMain(args []string) int {
	if len(args) != 1 {
		fmt.Fprintln(os.Stderr, "nexus "+ExtractCommand+": internal helper of the vmm")
		return 2
	}
	var spec extractSpec
	if err := json.Unmarshal([]byte(args[0]), &spec); err != nil {
		fmt.Fprintln(os.Stderr, "image extract:", err)
		return 2
	}
	out := bufio.NewWriter(os.Stdout)
	res := spec.run(bufio.NewReaderSize(os.Stdin, maxFrame+5), out)
	json.NewEncoder(out).Encode(res)
	out.Flush()
	if res.Error != "" {
		return 1
	}
	return 0
}

func (spec *extractSpec) run(in *bufio.Reader, out *bufio.Writer) extractResult {
	if err := spec.contain(); err != nil {
		return extractResult{Error: "contain the extractor: " + err.Error()}
	}
	out.WriteString("ready\n")
	out.Flush()
	if spec.Test {
		if _, err := in.ReadByte(); err != nil {
			return extractResult{Error: err.Error()}
		}
	}
	x := newExtractor(".", spec.MaxBytes, spec.MaxInodes)
	fail := func(err error) extractResult {
		return extractResult{Error: err.Error(), Invalid: errors.Is(err, errdefs.ErrInvalid)}
	}
	for {
		typ, payload, err := readFrame(in)
		if err != nil {
			return fail(err)
		}
		switch typ {
		case frameFinish:
			if err := x.finish(); err != nil {
				return fail(err)
			}
			meta := make(map[string][3]int64, len(x.meta))
			for p, o := range x.meta {
				meta[p] = [3]int64{int64(o.uid), int64(o.gid), int64(o.perm)}
			}
			return extractResult{Meta: meta, Devices: x.devices}
		case frameLayer:
			lr := &layerReader{in: in}
			err := x.apply(lr, string(payload))
			if err == nil {
				// The tar's end padding; more than that is not a layer's.
				if _, err = io.Copy(io.Discard, io.LimitReader(lr, 1<<20)); err == nil && !lr.done {
					err = x.errorf("data after the end of its tar: corrupt layer")
				}
			}
			if err != nil {
				return fail(err)
			}
		default:
			return fail(fmt.Errorf("unexpected frame %q", typ))
		}
	}
}

// contain moves into the root. Without a user namespace it chdirs into it (fd 4 is its parent
// directory); in one it pivot_roots into it and drops the host's tree, so it can name nothing
// else. A root vmm hands it the root as a detached mount (fd 4, open_tree), since its uid cannot
// reach the root by path; an unprivileged vmm's child can, and binds it.
func (spec *extractSpec) contain() error {
	defer unix.Close(3) // the binary it was started from
	defer unix.Close(4)
	if !spec.UserNS {
		if err := unix.Fchdir(4); err != nil {
			return fmt.Errorf("enter the work directory: %w", err)
		}
		return unix.Chdir(spec.Root)
	}
	if err := unix.Mount("", "/", "", unix.MS_REC|unix.MS_PRIVATE, ""); err != nil {
		return fmt.Errorf("make mounts private: %w", err)
	}
	target := spec.Path
	if spec.Tree {
		target = "/tmp"
		if err := unix.MoveMount(4, "", unix.AT_FDCWD, target, unix.MOVE_MOUNT_F_EMPTY_PATH); err != nil {
			return fmt.Errorf("mount the root: %w", err)
		}
	} else if err := unix.Mount(target, target, "", unix.MS_BIND, ""); err != nil {
		return fmt.Errorf("bind the root: %w", err)
	}
	if err := unix.Chdir(target); err != nil {
		return err
	}
	if err := unix.PivotRoot(".", "."); err != nil {
		return fmt.Errorf("pivot_root: %w", err)
	}
	if err := unix.Unmount(".", unix.MNT_DETACH); err != nil {
		return fmt.Errorf("drop the host's tree: %w", err)
	}
	return unix.Chdir("/")
}

func readFrame(in *bufio.Reader) (byte, []byte, error) {
	var hdr [5]byte
	if _, err := io.ReadFull(in, hdr[:]); err != nil {
		return 0, nil, fmt.Errorf("read from the vmm: %w", err)
	}
	n := binary.BigEndian.Uint32(hdr[1:])
	if n > maxFrame {
		return 0, nil, fmt.Errorf("frame of %d bytes", n)
	}
	payload := make([]byte, n)
	if _, err := io.ReadFull(in, payload); err != nil {
		return 0, nil, fmt.Errorf("read from the vmm: %w", err)
	}
	return hdr[0], payload, nil
}

// layerReader reads one layer's data frames, up to its end frame.
type layerReader struct {
	in   *bufio.Reader
	left int // of the current data frame
	done bool
}

func (r *layerReader) Read(p []byte) (int, error) {
	for r.left == 0 {
		if r.done {
			return 0, io.EOF
		}
		var hdr [5]byte
		if _, err := io.ReadFull(r.in, hdr[:]); err != nil {
			return 0, io.ErrUnexpectedEOF
		}
		switch hdr[0] {
		case frameData:
			if r.left = int(binary.BigEndian.Uint32(hdr[1:])); r.left > maxFrame {
				return 0, fmt.Errorf("frame of %d bytes", r.left)
			}
		case frameEnd:
			r.done = true
		default:
			return 0, fmt.Errorf("unexpected frame %q in a layer", hdr[0])
		}
	}
	n, err := r.in.Read(p[:min(len(p), r.left)])
	r.left -= n
	if err != nil && errors.Is(err, io.EOF) {
		err = io.ErrUnexpectedEOF
	}
	return n, err
}

// extraction is a running extractor child, fed by the vmm.
type extraction struct {
	cmd       *exec.Cmd
	in        io.WriteCloser
	out       *bufio.Reader
	stderr    bytes.Buffer
	root      string
	maxInodes int64
	userNS    bool // the child runs in a user namespace
	broken    bool // the child stopped reading: its result says why
}

// startExtraction starts the extractor child on root, an empty directory in a directory of its
// own (which, like root, is handed to the extraction uid while the child runs).
func startExtraction(root string, maxBytes, maxInodes int64) (*extraction, error) {
	exe, err := os.Executable()
	if err != nil {
		return nil, fmt.Errorf("extractor: %w", err)
	}
	hostID := os.Getuid()
	if hostID == 0 {
		hostID = ExtractUID
	}
	for _, p := range []string{filepath.Dir(root), root} {
		if err := os.Lchown(p, hostID, hostID); err != nil {
			return nil, fmt.Errorf("extractor: %w", err)
		}
	}
	spec := extractSpec{Root: filepath.Base(root), Path: root, Tree: os.Getuid() == 0, MaxBytes: maxBytes, MaxInodes: maxInodes, UserNS: !testNoUserNS, Test: testExtractorReady != nil}
	e, err := spawnExtractor(exe, root, spec, hostID)
	if err != nil {
		// No user namespaces here (disabled, or none left): the unprivileged uid without one.
		spec.UserNS = false
		if e, err = spawnExtractor(exe, root, spec, hostID); err != nil {
			return nil, err
		}
	}
	return e, nil
}

// spawnExtractor starts the child as hostID (as uid 0 of a user namespace mapping only that,
// with spec.UserNS). It is started from an open descriptor of the binary and handed one of the
// work directory, so hostID need not reach either by path.
func spawnExtractor(exe, root string, spec extractSpec, hostID int) (*extraction, error) {
	bin, err := os.Open(exe)
	if err != nil {
		return nil, fmt.Errorf("extractor: %w", err)
	}
	defer bin.Close()
	var dir *os.File
	if spec.UserNS && spec.Tree {
		fd, err := unix.OpenTree(unix.AT_FDCWD, root, unix.OPEN_TREE_CLONE|unix.OPEN_TREE_CLOEXEC)
		if err != nil {
			return nil, fmt.Errorf("extractor: open_tree: %w", err)
		}
		dir = os.NewFile(uintptr(fd), root)
	} else if dir, err = os.Open(filepath.Dir(root)); err != nil {
		return nil, fmt.Errorf("extractor: %w", err)
	}
	defer dir.Close()
	js, _ := json.Marshal(spec)
	e := &extraction{root: root, userNS: spec.UserNS, maxInodes: spec.MaxInodes}
	if e.maxInodes <= 0 {
		e.maxInodes = DefaultMaxInodes
	}
	e.cmd = &exec.Cmd{Path: "/proc/self/fd/3", Args: []string{"nexus", ExtractCommand, string(js)}, ExtraFiles: []*os.File{bin, dir}}
	root0 := os.Getuid() == 0
	attr := &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	switch {
	case spec.UserNS:
		attr.Cloneflags = syscall.CLONE_NEWUSER | syscall.CLONE_NEWNS | syscall.CLONE_NEWNET | syscall.CLONE_NEWIPC | syscall.CLONE_NEWUTS
		attr.UidMappings = []syscall.SysProcIDMap{{ContainerID: 0, HostID: hostID, Size: 1}}
		attr.GidMappings = []syscall.SysProcIDMap{{ContainerID: 0, HostID: hostID, Size: 1}}
		// uid 0 of the namespace before exec, so that it keeps its capabilities there; a root
		// vmm's groups are dropped (an unprivileged vmm's child keeps the user's own).
		attr.GidMappingsEnableSetgroups = root0
		attr.Credential = &syscall.Credential{Uid: 0, Gid: 0, NoSetGroups: !root0}
	case root0:
		attr.Credential = &syscall.Credential{Uid: uint32(hostID), Gid: uint32(hostID)}
	}
	e.cmd.SysProcAttr = attr
	e.cmd.Stderr = &limitedBuffer{buf: &e.stderr, max: 4096}
	if e.in, err = e.cmd.StdinPipe(); err != nil {
		return nil, err
	}
	stdout, err := e.cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	if err := e.cmd.Start(); err != nil {
		return nil, fmt.Errorf("extractor: %w", err)
	}
	e.out = bufio.NewReader(stdout)
	if line, err := e.out.ReadString('\n'); line != "ready\n" {
		// It could not contain itself: its result (the line) says why.
		e.out = bufio.NewReader(io.MultiReader(strings.NewReader(line), e.out))
		if _, werr := e.wait(); werr != nil {
			return nil, werr
		}
		return nil, fmt.Errorf("extractor: %v", err)
	}
	if testExtractorReady != nil {
		testExtractorReady(e.cmd.Process.Pid)
		e.in.Write([]byte{'g'})
	}
	return e, nil
}

type limitedBuffer struct {
	buf *bytes.Buffer
	max int
}

func (l *limitedBuffer) Write(p []byte) (int, error) {
	if room := l.max - l.buf.Len(); room > 0 {
		l.buf.Write(p[:min(len(p), room)])
	}
	return len(p), nil
}

func (e *extraction) frame(typ byte, payload []byte) error {
	if e.broken {
		return errStopped
	}
	var hdr [5]byte
	hdr[0] = typ
	binary.BigEndian.PutUint32(hdr[1:], uint32(len(payload)))
	if _, err := e.in.Write(append(hdr[:], payload...)); err != nil {
		e.broken = true
		return err
	}
	return nil
}

// errStopped says the child stopped reading: finish says why.
var errStopped = errors.New("the extractor stopped")

// layer streams one uncompressed layer to the child, checking it against its diff id.
func (e *extraction) layer(r io.Reader, label string, diffID v1.Hash) error {
	if err := e.frame(frameLayer, []byte(label)); err != nil {
		return errStopped
	}
	sum := sha256.New()
	buf := make([]byte, maxFrame)
	for {
		n, rerr := io.ReadFull(r, buf)
		if n > 0 {
			sum.Write(buf[:n])
			if err := e.frame(frameData, buf[:n]); err != nil {
				return errStopped
			}
		}
		if errors.Is(rerr, io.EOF) || errors.Is(rerr, io.ErrUnexpectedEOF) {
			break
		}
		if rerr != nil {
			return errdefs.Invalid("%s: %s (truncated or corrupt layer)", label, oneLine(rerr))
		}
	}
	if err := e.frame(frameEnd, nil); err != nil {
		return errStopped
	}
	if got := "sha256:" + hex.EncodeToString(sum.Sum(nil)); got != diffID.String() {
		return errdefs.Invalid("%s: content is %s, not the %s its config says: corrupt layer", label, shortHex(got), shortHex(diffID.String()))
	}
	return nil
}

// finish tells the child there are no more layers and returns the extractor it filled (its
// owners, modes and skipped devices), or the child's error.
func (e *extraction) finish(maxBytes, maxInodes int64) (*extractor, error) {
	e.frame(frameFinish, nil)
	res, err := e.wait()
	if err != nil {
		return nil, err
	}
	x := newExtractor(e.root, maxBytes, maxInodes)
	for p, m := range res.Meta { // the child's word, checked as the layers' was
		if m[0] < 0 || m[1] < 0 || m[0] > 1<<31 || m[1] > 1<<31 || m[2] < 0 {
			return nil, fmt.Errorf("extractor: %s: owner %d:%d out of range", p, m[0], m[1])
		}
		x.meta[p] = owner{uid: int(m[0]), gid: int(m[1]), perm: uint32(m[2]) & 0o7777}
	}
	x.devices = res.Devices
	return x, nil
}

// wait reads the child's result and reaps it.
func (e *extraction) wait() (extractResult, error) {
	e.in.Close()
	var res extractResult
	// Bounded as the layers are: an entry's path is at most maxLinkTarget bytes.
	limit := e.maxInodes*(maxLinkTarget+64) + 1<<20
	derr := json.NewDecoder(io.LimitReader(e.out, limit)).Decode(&res)
	io.Copy(io.Discard, e.out)
	werr := e.cmd.Wait()
	if os.Getuid() == 0 {
		os.Lchown(filepath.Dir(e.root), 0, 0)
	}
	switch {
	case res.Error != "" && res.Invalid:
		return res, errdefs.Invalid("%s", res.Error)
	case res.Error != "":
		return res, errors.New(res.Error)
	case derr != nil || werr != nil:
		msg := strings.TrimSpace(e.stderr.String())
		if msg == "" {
			msg = fmt.Sprint(errors.Join(werr, derr))
		}
		return res, fmt.Errorf("extractor: %s", lastLine(msg))
	}
	return res, nil
}

// kill stops a child that is no longer wanted.
func (e *extraction) kill() {
	e.cmd.Process.Kill()
	e.wait()
}
