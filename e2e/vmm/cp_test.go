package vmm_test

import (
	"archive/tar"
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// TestCopyDirectories: cp as docker cp: a directory goes in and out whole with its modes, a
// destination directory keeps the source's name, and - is a tar stream on stdin or stdout.
func TestCopyDirectories(t *testing.T) {
	create(t, "cpd/box")
	src := filepath.Join(t.TempDir(), "proj")
	os.MkdirAll(filepath.Join(src, "bin"), 0o755)
	os.WriteFile(filepath.Join(src, "notes.txt"), []byte("notes\n"), 0o640)
	os.WriteFile(filepath.Join(src, "bin", "run.sh"), []byte("#!/bin/sh\necho ran\n"), 0o755)
	stack.MustNexus(t, "cp", src, "cpd/box:/root")
	if out := stack.MustNexus(t, "exec", "cpd/box", "sh", "-c", "stat -c %a /root/proj/bin/run.sh /root/proj/notes.txt && /root/proj/bin/run.sh"); out != "755\n640\nran\n" {
		t.Fatalf("in the guest: %q", out)
	}
	host := t.TempDir()
	stack.MustNexus(t, "cp", "cpd/box:/root/proj", host)
	if fi, err := os.Stat(filepath.Join(host, "proj", "bin", "run.sh")); err != nil || fi.Mode() != 0o755 {
		t.Fatalf("back on the host: %v %v", fi, err)
	}
	stack.MustNexus(t, "cp", "cpd/box:/etc/hostname", host) // was: rename … file exists
	if b, err := os.ReadFile(filepath.Join(host, "hostname")); err != nil || len(b) == 0 {
		t.Fatalf("cp NAME:/etc/hostname DIR: %q %v", b, err)
	}
	var names []string
	tr := tar.NewReader(strings.NewReader(stack.MustNexus(t, "cp", "cpd/box:/root/proj", "-")))
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatalf("cp … -: not a tar stream: %v", err)
		}
		names = append(names, strings.TrimSuffix(h.Name, "/"))
	}
	if !slices.Contains(names, "proj/bin/run.sh") {
		t.Fatalf("cp … -: entries %q", names)
	}
	var in bytes.Buffer
	tw := tar.NewWriter(&in)
	tw.WriteHeader(&tar.Header{Name: "from-stdin.txt", Mode: 0o600, Size: 3, Typeflag: tar.TypeReg})
	tw.Write([]byte("hi\n"))
	tw.Close()
	if _, errOut, code := stack.NexusIn(t, in.Bytes(), "cp", "-", "cpd/box:/tmp"); code != 0 {
		t.Fatalf("cp - NAME:/tmp: exit %d %s", code, errOut)
	}
	if out := stack.MustNexus(t, "exec", "cpd/box", "cat", "/tmp/from-stdin.txt"); out != "hi\n" {
		t.Fatalf("from stdin: %q", out)
	}
	// The same guest serves exec --json and logs --tail (issue 21), to boot no other.
	out, errOut, code := stack.Nexus(t, "exec", "--json", "cpd/box", "sh", "-c", "echo out; echo err >&2; exit 3")
	var res struct {
		ExitCode    int    `json:"exit_code"`
		Stdout      string `json:"stdout"`
		Stderr      string `json:"stderr"`
		StdoutBytes int64  `json:"stdout_bytes"`
		Sandbox     string `json:"sandbox"`
	}
	if err := json.Unmarshal([]byte(out), &res); err != nil || code != 3 || res.ExitCode != 3 || res.Stdout != "out\n" || res.Stderr != "err\n" ||
		res.StdoutBytes != 4 || res.Sandbox != "cpd/box" {
		t.Fatalf("exec --json: exit %d %q %q (%v)", code, out, errOut, err)
	}
	logs := stack.MustNexus(t, "logs", "--tail", "3", "cpd/box")
	if n := strings.Count(logs, "\n"); n > 3 || strings.Contains(logs, "\r") || strings.Contains(logs, "\x1b[") {
		t.Fatalf("logs --tail 3 to a pipe: %d lines %q", n, logs)
	}
	if all := stack.MustNexus(t, "logs", "cpd/box"); strings.Contains(all, "PCI: Fatal") || !strings.Contains(all, "nexus-agent") {
		t.Fatalf("logs: the PCI noise, or no agent line:\n%.1500s", all)
	}
}
