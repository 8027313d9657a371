package httpapi

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"path"
	"strconv"
	"strings"
	"time"

	api "github.com/IniZio/nexus/pkg/api/gateway"
	"github.com/IniZio/nexus/pkg/errdefs"
)

// The file routes run small POSIX shell scripts in the guest (busybox in nexus-mini has every
// tool they use), the path always as a positional argument, never in the script; single files
// travel over the copy stream.

const (
	// MaxUpload bounds one uploaded file or tar archive.
	MaxUpload = 4 << 30
	// maxListing bounds what a listing reads of the guest's answer.
	maxListing   = 8 << 20
	fileTimeout  = time.Minute
	treeTimeout  = 30 * time.Minute
	maxPathBytes = 4096
	// Exit statuses the scripts use for what the routes answer as not found and conflict.
	exitNotFound = 44
	exitNotDir   = 45
	exitIsDir    = 46
)

// FileInfo is one entry of a listing, or a stat.
type FileInfo struct {
	Name    string    `json:"name"`
	Path    string    `json:"path"`
	Size    int64     `json:"size"`
	Mode    uint32    `json:"mode"` // permission bits
	Type    string    `json:"type"` // file, dir, symlink or other
	ModTime time.Time `json:"mod_time"`
}

func guestPathOf(r *http.Request) (string, error) {
	p := r.URL.Query().Get("path")
	switch {
	case p == "":
		return "", errdefs.Invalid("path is required: an absolute path in the guest")
	case !strings.HasPrefix(p, "/"):
		return "", errdefs.Invalid("path %q is not absolute", clip(p))
	case len(p) > maxPathBytes || strings.ContainsRune(p, 0):
		return "", errdefs.Invalid("path is longer than %d bytes or holds a NUL", maxPathBytes)
	}
	return path.Clean(p), nil
}

// statLine prints "size rawmode mtime\n" then the name and a NUL, for each argument.
const statLine = `st() { stat -c '%s %f %Y' -- "$1" && printf '%s\0' "$1"; }`

// guest runs script (sh -c) with args in sandbox name; stdout goes to out (nil: kept, up to
// maxListing). A status of exitNotFound, exitNotDir or exitIsDir becomes that error.
func (s *Service) guest(ctx context.Context, name, script string, args []string, in io.Reader, out io.Writer) ([]byte, error) {
	c, err := s.client(ctx)
	if err != nil {
		return nil, err
	}
	var kept bytes.Buffer
	if out == nil {
		out = &limitWriter{w: &kept, n: maxListing}
	}
	var stderr bytes.Buffer
	argv := append([]string{"/bin/sh", "-c", script, "sh"}, args...)
	exit, err := c.Run(ctx, api.ExecRequest{Name: name, Argv: argv, Stdin: in != nil}, api.IO{Stdin: in, Stdout: out, Stderr: &limitWriter{w: &stderr, n: 4096}})
	if err != nil {
		return nil, err
	}
	p := ""
	if len(args) > 0 {
		p = args[0]
	}
	switch exit.Code {
	case 0:
		return kept.Bytes(), nil
	case exitNotFound:
		return nil, errdefs.NotFound("%s: no such file or directory in %s", p, name)
	case exitNotDir:
		return nil, errdefs.Conflict("%s is not a directory", p)
	case exitIsDir:
		return nil, errdefs.Conflict("%s is a directory: remove it with recursive=true", p)
	}
	msg := errdefs.FirstLine(stderr.String())
	if msg == "" {
		msg = errdefs.FirstLine(exit.Error)
	}
	if msg == "" {
		msg = fmt.Sprintf("exit status %d", exit.Code)
	}
	return nil, errdefs.Invalid("%s in %s: %s", p, name, msg)
}

type limitWriter struct {
	w io.Writer
	n int64
}

func (l *limitWriter) Write(p []byte) (int, error) {
	if l.n > 0 {
		k := min(int64(len(p)), l.n)
		l.w.Write(p[:k])
		l.n -= k
	}
	return len(p), nil
}

// parseStats reads statLine's output.
func parseStats(dir string, b []byte) ([]FileInfo, error) {
	out := []FileInfo{}
	rd := bufio.NewReader(bytes.NewReader(b))
	for {
		head, err := rd.ReadString('\n')
		if errors.Is(err, io.EOF) && head == "" {
			return out, nil
		}
		if err != nil {
			return nil, errdefs.New(errdefs.ErrInternal, "the guest's listing is cut short")
		}
		name, err := rd.ReadString(0)
		if err != nil {
			return nil, errdefs.New(errdefs.ErrInternal, "the guest's listing is cut short")
		}
		name = strings.TrimSuffix(name, "\x00")
		f := strings.Fields(head)
		if len(f) != 3 {
			return nil, errdefs.New(errdefs.ErrInternal, "the guest's listing is not understood")
		}
		size, _ := strconv.ParseInt(f[0], 10, 64)
		raw, _ := strconv.ParseUint(f[1], 16, 32)
		mtime, _ := strconv.ParseInt(f[2], 10, 64)
		fi := FileInfo{Name: path.Base(name), Path: name, Size: size, Mode: uint32(raw & 0o7777), Type: fileType(uint32(raw)), ModTime: time.Unix(mtime, 0).UTC()}
		if dir != "" {
			fi.Path = path.Join(dir, name)
		}
		out = append(out, fi)
	}
}

func fileType(raw uint32) string {
	switch raw & 0o170000 {
	case 0o100000:
		return "file"
	case 0o040000:
		return "dir"
	case 0o120000:
		return "symlink"
	}
	return "other"
}

func (s *Service) stat(ctx context.Context, name, p string) (FileInfo, error) {
	script := statLine + `; [ -e "$1" ] || [ -L "$1" ] || exit 44; st "$1"`
	b, err := s.guest(ctx, name, script, []string{p}, nil, nil)
	if err != nil {
		return FileInfo{}, err
	}
	l, err := parseStats("", b)
	if err != nil {
		return FileInfo{}, err
	}
	if len(l) != 1 {
		return FileInfo{}, errdefs.New(errdefs.ErrInternal, "the guest's stat is not understood")
	}
	return l[0], nil
}

// fileReq is a file route's request: the sandbox, the guest path, and the deadline.
type fileReq struct {
	ctx        context.Context
	name, path string
}

// fileRoute reads the sandbox and path of a file route and runs fn under timeout.
func fileRoute(timeout time.Duration, fn func(*Service, http.ResponseWriter, *http.Request, fileReq) error) func(*Service, http.ResponseWriter, *http.Request) error {
	return func(s *Service, w http.ResponseWriter, r *http.Request) error {
		p, err := guestPathOf(r)
		if err != nil {
			return err
		}
		ctx, cancel := withTimeout(r, timeout)
		defer cancel()
		return fn(s, w, r, fileReq{ctx: ctx, name: r.PathValue("name"), path: p})
	}
}

// answerStat answers the path's stat: what a route that changed it made of it.
func (s *Service) answerStat(w http.ResponseWriter, f fileReq) error {
	fi, err := s.stat(f.ctx, f.name, f.path)
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, fi)
	return nil
}

// statKind stats the path and refuses it unless it is a directory (dir) or not one (!dir).
func (s *Service) statKind(f fileReq, dir bool, hint string) (FileInfo, error) {
	fi, err := s.stat(f.ctx, f.name, f.path)
	switch {
	case err != nil:
		return fi, err
	case dir && fi.Type != "dir":
		return fi, errdefs.Conflict("%s is not a directory", f.path)
	case !dir && fi.Type == "dir":
		return fi, errdefs.Conflict("%s is a directory: %s", f.path, hint)
	}
	return fi, nil
}

var (
	filesStat     = fileRoute(fileTimeout, func(s *Service, w http.ResponseWriter, _ *http.Request, f fileReq) error { return s.answerStat(w, f) })
	filesList     = fileRoute(fileTimeout, listDir)
	filesMkdir    = fileRoute(fileTimeout, mkdir)
	filesRemove   = fileRoute(fileTimeout, remove)
	filesDownload = fileRoute(treeTimeout, download)
	filesUpload   = fileRoute(treeTimeout, upload)
	filesTarGet   = fileRoute(treeTimeout, tarGet)
	filesTarPut   = fileRoute(treeTimeout, tarPut)
)

func listDir(s *Service, w http.ResponseWriter, _ *http.Request, f fileReq) error {
	script := statLine + `; [ -e "$1" ] || exit 44; [ -d "$1" ] || exit 45; cd -- "$1" || exit 1
for f in * .[!.]* ..?*; do { [ -e "$f" ] || [ -L "$f" ]; } && st "$f"; done; exit 0`
	b, err := s.guest(f.ctx, f.name, script, []string{f.path}, nil, nil)
	if err != nil {
		return err
	}
	l, err := parseStats(f.path, b)
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, map[string]any{"path": f.path, "entries": l})
	return nil
}

func mkdir(s *Service, w http.ResponseWriter, _ *http.Request, f fileReq) error {
	if _, err := s.guest(f.ctx, f.name, `mkdir -p -- "$1"`, []string{f.path}, nil, nil); err != nil {
		return err
	}
	return s.answerStat(w, f)
}

func remove(s *Service, w http.ResponseWriter, r *http.Request, f fileReq) error {
	if f.path == "/" {
		return errdefs.Invalid("refusing to remove /")
	}
	rec, err := boolQuery(r, "recursive", false)
	if err != nil {
		return err
	}
	script := `[ -e "$1" ] || [ -L "$1" ] || exit 44; [ -d "$1" ] && [ ! -L "$1" ] && [ "$2" != r ] && exit 46; rm -rf -- "$1"`
	flag := "-"
	if rec {
		flag = "r"
	}
	if _, err := s.guest(f.ctx, f.name, script, []string{f.path, flag}, nil, nil); err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, map[string]any{"path": f.path, "removed": true})
	return nil
}

// streamOut sends what fn writes as the body; an error before the first byte is the answer's
// status, one after it the X-Nexus-Error trailer (and a log line).
func (s *Service) streamOut(w http.ResponseWriter, f fileReq, contentType string, fn func(io.Writer) error) error {
	w.Header().Set("Content-Type", contentType)
	w.Header().Set("Trailer", "X-Nexus-Error")
	sw := &startWriter{w: w}
	if err := fn(sw); err != nil {
		if !sw.started {
			w.Header().Del("Content-Length")
			return err
		}
		w.Header().Set("X-Nexus-Error", oneLine(err.Error()))
		s.log.Warn().Err(err).Str("sandbox", f.name).Msg("api: download cut short")
	}
	return nil
}

func download(s *Service, w http.ResponseWriter, _ *http.Request, f fileReq) error {
	fi, err := s.statKind(f, false, "download it with GET …/files/tar")
	if err != nil {
		return err
	}
	c, err := s.client(f.ctx)
	if err != nil {
		return err
	}
	if fi.Type == "file" {
		w.Header().Set("Content-Length", strconv.FormatInt(fi.Size, 10))
	}
	return s.streamOut(w, f, "application/octet-stream", func(out io.Writer) error { return c.CopyOut(f.ctx, f.name, f.path, out) })
}

func tarGet(s *Service, w http.ResponseWriter, _ *http.Request, f fileReq) error {
	if _, err := s.statKind(f, true, ""); err != nil {
		return err
	}
	return s.streamOut(w, f, "application/x-tar", func(out io.Writer) error {
		_, err := s.guest(f.ctx, f.name, `cd -- "$1" || exit 45; exec tar -cf - .`, []string{f.path}, nil, out)
		return err
	})
}

// startWriter notes whether anything was written (after which an error cannot be a status).
type startWriter struct {
	w       io.Writer
	started bool
}

func (s *startWriter) Write(p []byte) (int, error) {
	s.started = true
	return s.w.Write(p)
}

// uploadBody bounds an upload and insists on its length (the copy stream needs it up front).
func uploadBody(w http.ResponseWriter, r *http.Request) (io.Reader, error) {
	if r.ContentLength < 0 {
		return nil, errdefs.Invalid("an upload needs a Content-Length")
	}
	if r.ContentLength > MaxUpload {
		return nil, errdefs.Invalid("the upload is %d bytes, more than %d", r.ContentLength, int64(MaxUpload))
	}
	return http.MaxBytesReader(w, r.Body, r.ContentLength), nil
}

func upload(s *Service, w http.ResponseWriter, r *http.Request, f fileReq) error {
	mode := uint64(0o644)
	if v := r.URL.Query().Get("mode"); v != "" {
		var err error
		if mode, err = strconv.ParseUint(v, 8, 32); err != nil || mode > 0o7777 {
			return errdefs.Invalid("invalid mode %q: use octal permission bits such as 644", clip(v))
		}
	}
	body, err := uploadBody(w, r)
	if err != nil {
		return err
	}
	c, err := s.client(f.ctx)
	if err != nil {
		return err
	}
	if err := c.CopyIn(f.ctx, f.name, f.path, uint32(mode), r.ContentLength, body); err != nil {
		return err
	}
	return s.answerStat(w, f)
}

func tarPut(s *Service, w http.ResponseWriter, r *http.Request, f fileReq) error {
	body, err := uploadBody(w, r)
	if err != nil {
		return err
	}
	if _, err := s.guest(f.ctx, f.name, `mkdir -p -- "$1" && exec tar -xf - -C "$1"`, []string{f.path}, body, nil); err != nil {
		return err
	}
	return s.answerStat(w, f)
}
