package cli

import (
	"archive/tar"
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"strings"

	"github.com/spf13/cobra"

	api "github.com/IniZio/nexus/pkg/api/gateway"
	"github.com/IniZio/nexus/pkg/errdefs"
)

// CopyResult is what `nexus cp --json` prints.
type CopyResult struct {
	Sandbox string `json:"sandbox"`
	// From and To are the source and destination as given (NAME:/path for the guest side).
	From string `json:"from"`
	To   string `json:"to"`
	// ToGuest says the direction; Bytes counts the file contents copied.
	ToGuest bool  `json:"to_guest"`
	Bytes   int64 `json:"bytes"`
}

func cpCommand() *cobra.Command {
	return &cobra.Command{
		Use:   "cp SRC DST",
		Short: "Copy files or directories between host and sandbox (NAME:/path names the guest side; - is a tar stream)",
		Long: `Copy files or directories between the host and a sandbox, as docker cp does. NAME:/path names
the guest side; exactly one of SRC and DST is in a sandbox.

A directory is copied whole, with its modes. A DST that is an existing directory receives SRC
under its own name; any other DST is the new name. SRC - reads a tar stream from stdin and
unpacks it into the guest directory DST; DST - writes SRC as a tar stream to stdout.

What comes out of a guest is untrusted: an entry that would land outside DST, hard links,
devices, and symbolic links that are absolute or point outside what is copied are refused or
left out (with a warning), setuid bits are dropped, and a copy is placed only once it is whole.`,
		Args: cobra.ExactArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			src, dst := args[0], args[1]
			sName, sPath, sGuest := guestPath(src)
			dName, dPath, dGuest := guestPath(dst)
			if sGuest == dGuest {
				return usageError{errors.New("cp: exactly one of SRC and DST must be NAME:/path in a sandbox")}
			}
			c, _, err := dial(cmd)
			if err != nil {
				return err
			}
			res := CopyResult{From: src, To: dst, ToGuest: dGuest}
			if dGuest {
				res.Sandbox, _ = api.ParseName(dName)
				res.Bytes, err = copyIn(cmd, c, src, dName, dPath)
			} else {
				res.Sandbox, _ = api.ParseName(sName)
				res.Bytes, err = copyOut(cmd, c, sName, sPath, dst)
			}
			if err != nil {
				return err
			}
			if dst != "-" {
				printedJSON(cmd, res)
			}
			return nil
		},
	}
}

// guestRun runs argv in the sandbox with stdin and stdout as given; a failure of the command
// is an error naming what (its stderr's first line).
func guestRun(ctx context.Context, c *api.Client, name string, argv []string, stdin io.Reader, stdout io.Writer) (int, string, error) {
	return guestRunAs(ctx, c, api.ExecRequest{Name: name, Argv: argv}, stdin, stdout)
}

// guestRunAs is guestRun of a request that may name the user and directory.
func guestRunAs(ctx context.Context, c *api.Client, req api.ExecRequest, stdin io.Reader, stdout io.Writer) (int, string, error) {
	var errOut strings.Builder
	req.Stdin = stdin != nil
	if stdin == nil {
		stdin = strings.NewReader("")
	}
	exit, err := c.Run(ctx, req, api.IO{Stdin: stdin, Stdout: stdout, Stderr: &limitedWriter{w: &errOut, n: 4 << 10}})
	if err != nil {
		return 0, "", err
	}
	msg := errdefs.FirstLine(strings.TrimSpace(errOut.String()))
	if exit.Error != "" {
		msg = strings.TrimPrefix(exit.Error, "nexus: ")
	}
	return exit.Code, msg, nil
}

// limitedWriter keeps the first n bytes written to it.
type limitedWriter struct {
	w io.Writer
	n int
}

func (l *limitedWriter) Write(p []byte) (int, error) {
	if l.n > 0 {
		k := min(l.n, len(p))
		l.w.Write(p[:k])
		l.n -= k
	}
	return len(p), nil
}

// guestIsDir reports whether p is a directory in the sandbox.
func guestIsDir(ctx context.Context, c *api.Client, name, p string) (bool, error) {
	code, _, err := guestRun(ctx, c, name, []string{"test", "-d", p}, nil, io.Discard)
	return code == 0, err
}

// copyIn copies the host's src (a file, a directory, or - for a tar stream on stdin) to
// dPath in sandbox name.
func copyIn(cmd *cobra.Command, c *api.Client, src, name, dPath string) (int64, error) {
	ctx := cmd.Context()
	if src == "-" {
		counted := &countingReader{r: cmd.InOrStdin()}
		code, msg, err := guestRun(ctx, c, name, []string{"tar", "-x", "-f", "-", "-C", dPath}, counted, io.Discard)
		if err == nil && code != 0 {
			err = fmt.Errorf("cp: unpacking into %s:%s: %s", name, dPath, msg)
		}
		return counted.n, err
	}
	fi, err := os.Stat(src)
	if err != nil {
		return 0, fmt.Errorf("cp: %w", err)
	}
	isDir, err := guestIsDir(ctx, c, name, dPath)
	if err != nil {
		return 0, err
	}
	// A destination directory keeps the source's name; anything else is the new name.
	target, into := dPath, path.Dir(dPath)
	if isDir || strings.HasSuffix(dPath, "/") {
		target, into = path.Join(dPath, filepath.Base(src)), dPath
	}
	if fi.Mode().IsRegular() {
		return copyFileIn(cmd, c, src, fi, name, target)
	}
	if !fi.IsDir() {
		return 0, fmt.Errorf("cp: %s is not a regular file or a directory", src)
	}
	pr, pw := io.Pipe()
	var n int64
	go func() { var err error; n, err = writeTar(pw, src, path.Base(target)); pw.CloseWithError(err) }()
	script := `mkdir -p "$1" && exec tar -x -f - -C "$1"`
	code, msg, err := guestRun(ctx, c, name, []string{"sh", "-c", script, "sh", into}, pr, io.Discard)
	pr.Close()
	if err == nil && code != 0 {
		err = fmt.Errorf("cp: unpacking into %s:%s: %s", name, into, msg)
	}
	return n, err
}

type countingReader struct {
	r io.Reader
	n int64
}

func (c *countingReader) Read(p []byte) (int, error) {
	n, err := c.r.Read(p)
	c.n += int64(n)
	return n, err
}

// copyFileIn sends one regular file over the copy endpoint, with its mode.
func copyFileIn(cmd *cobra.Command, c *api.Client, src string, fi fs.FileInfo, name, target string) (int64, error) {
	f, err := os.Open(src)
	if err != nil {
		return 0, fmt.Errorf("cp: %w", err)
	}
	defer f.Close()
	return fi.Size(), c.CopyIn(cmd.Context(), name, target, uint32(fi.Mode().Perm()), fi.Size(), f)
}

// copyOut copies sPath of sandbox name to the host's dst (- for a tar stream on stdout): the
// guest packs it with tar, and the host unpacks it as untrusted input.
func copyOut(cmd *cobra.Command, c *api.Client, name, sPath, dst string) (int64, error) {
	ctx := cmd.Context()
	clean := path.Clean(sPath)
	dir, base := path.Dir(clean), path.Base(clean)
	if clean == "/" {
		dir, base = "/", "."
	}
	argv := []string{"tar", "-c", "-f", "-", "-C", dir, base}
	if dst == "-" {
		counted := &countingWriter{w: cmd.OutOrStdout()}
		code, msg, err := guestRun(ctx, c, name, argv, nil, counted)
		if err == nil && code != 0 {
			err = fmt.Errorf("cp: %s:%s: %s", name, sPath, msg)
		}
		return counted.n, err
	}
	// Unpack beside the destination, then put it in place whole.
	target := dst
	if fi, err := os.Stat(dst); err == nil && fi.IsDir() {
		target = filepath.Join(dst, base)
		if base == "." {
			target = dst
		}
	} else if strings.HasSuffix(dst, "/") {
		return 0, fmt.Errorf("cp: %s: no such directory", dst)
	}
	tmp, err := os.MkdirTemp(filepath.Dir(filepath.Clean(target)), ".nexus-cp-*")
	if err != nil {
		return 0, fmt.Errorf("cp: %w", err)
	}
	defer os.RemoveAll(tmp)
	pr, pw := io.Pipe()
	type unpacked struct {
		n   int64
		err error
	}
	done := make(chan unpacked, 1)
	go func() {
		n, err := untar(pr, tmp, base, cmd.ErrOrStderr())
		pr.CloseWithError(err)
		io.Copy(io.Discard, pr) // let the guest finish even after a refusal
		done <- unpacked{n, err}
	}()
	code, msg, err := guestRun(ctx, c, name, argv, nil, pw)
	pw.Close()
	u := <-done
	switch {
	case err != nil:
		return 0, err
	case code != 0:
		return 0, fmt.Errorf("cp: %s:%s: %s", name, sPath, msg)
	case u.err != nil:
		return 0, fmt.Errorf("cp: %s:%s: %w", name, sPath, u.err)
	}
	if err := place(filepath.Join(tmp, base), target); err != nil {
		return 0, fmt.Errorf("cp: %w", err)
	}
	return u.n, nil
}

type countingWriter struct {
	w io.Writer
	n int64
}

func (c *countingWriter) Write(p []byte) (int, error) {
	n, err := c.w.Write(p)
	c.n += int64(n)
	return n, err
}

// writeTar writes the directory src as a tar stream whose entries are under top.
func writeTar(w io.Writer, src, top string) (int64, error) {
	tw := tar.NewWriter(w)
	var total int64
	err := filepath.WalkDir(src, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, err := filepath.Rel(src, p)
		if err != nil {
			return err
		}
		fi, err := d.Info()
		if err != nil {
			return err
		}
		link := ""
		if fi.Mode()&fs.ModeSymlink != 0 {
			if link, err = os.Readlink(p); err != nil {
				return err
			}
		}
		h, err := tar.FileInfoHeader(fi, link)
		if err != nil {
			return nil // a socket or the like: not copied
		}
		h.Name = path.Join(top, filepath.ToSlash(rel))
		if fi.IsDir() {
			h.Name += "/"
		}
		h.Uname, h.Gname, h.Uid, h.Gid = "", "", 0, 0 // the guest's root owns what it receives
		if err := tw.WriteHeader(h); err != nil {
			return err
		}
		if !fi.Mode().IsRegular() {
			return nil
		}
		f, err := os.Open(p)
		if err != nil {
			return err
		}
		defer f.Close()
		n, err := io.Copy(tw, f)
		total += n
		return err
	})
	if err != nil {
		return total, err
	}
	return total, tw.Close()
}
