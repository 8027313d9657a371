package main

import (
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"strconv"
	"strings"
	"testing"
)

// TestBenchHeader runs `scripts/bench.sh --header` (what `make bench` puts at the top of BENCH.md)
// in a scratch git repository with a stand-in QEMU, and checks that it says where and at which
// commit the figures were taken.
func TestBenchHeader(t *testing.T) {
	for _, tool := range []string{"git", "bash"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Fatalf("%s is needed to run scripts/bench.sh: %v", tool, err)
		}
	}
	repo := t.TempDir()
	script, err := os.ReadFile("scripts/bench.sh")
	if err != nil {
		t.Fatal(err)
	}
	writeBenchFile(t, filepath.Join(repo, "scripts", "bench.sh"), string(script), 0o755)
	writeBenchFile(t, filepath.Join(repo, "BENCH.md"), "old figures\n", 0o644)
	git := func(args ...string) string {
		t.Helper()
		cmd := exec.Command("git", append([]string{"-c", "user.name=t", "-c", "user.email=t@t", "-c", "commit.gpgsign=false"}, args...)...)
		cmd.Dir = repo
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("git %v: %v\n%s", args, err, out)
		}
		return strings.TrimSpace(string(out))
	}
	git("init", "-q")
	git("add", ".")
	git("commit", "-q", "-m", "bench")
	head := git("rev-parse", "HEAD")

	// A QEMU that only tells its version, and probe results for it and for another version.
	bin := t.TempDir()
	writeBenchFile(t, filepath.Join(bin, "qemu-system-x86_64"), "#!/bin/sh\necho 'QEMU emulator version 9.1.5 (test)'\n", 0o755)
	cache := t.TempDir()
	writeBenchFile(t, filepath.Join(cache, "accel.json"), `{
  "qemu 7.2.22 kernel 6.1.0-57-amd64": {
    "accel": "tcg",
    "reason": "kvm probe boot failed"
  },
  "qemu 9.1.5 kernel 6.1.0-57-amd64": {
    "accel": "kvm",
    "reason": "kvm probe boot reached /init"
  }
}`, 0o600)

	header := func(env ...string) map[string]string {
		t.Helper()
		cmd := exec.Command("bash", filepath.Join(repo, "scripts", "bench.sh"), "--header")
		cmd.Env = append(os.Environ(), "PATH="+bin+":"+os.Getenv("PATH"), "NEXUS_CACHE="+cache, "NEXUS_ACCEL=")
		cmd.Env = append(cmd.Env, env...)
		out, err := cmd.Output()
		if err != nil {
			t.Fatalf("bench.sh --header: %v", err)
		}
		if !strings.HasPrefix(string(out), "# nexus benchmarks\n") {
			t.Fatalf("header does not start with the title:\n%s", out)
		}
		rows := map[string]string{}
		for _, line := range strings.Split(string(out), "\n") {
			if f := strings.Split(line, " | "); len(f) == 2 && strings.HasPrefix(line, "| ") {
				rows[strings.TrimPrefix(f[0], "| ")] = strings.TrimSuffix(f[1], " |")
			}
		}
		return rows
	}

	rows := header()
	kernel, _ := os.ReadFile("/proc/sys/kernel/osrelease")
	want := map[string]*regexp.Regexp{
		"taken":       regexp.MustCompile(`^\d{4}-\d\d-\d\dT\d\d:\d\dZ to \d{4}-\d\d-\d\dT\d\d:\d\dZ$`),
		"commit":      regexp.MustCompile(`^[0-9a-f]{12} \(` + head + `\), clean$`),
		"cores":       regexp.MustCompile(`^` + strconv.Itoa(runtime.NumCPU()) + `$`),
		"memory":      regexp.MustCompile(`^\d+\.\d GiB$`),
		"CPU":         regexp.MustCompile(`\S`),
		"kernel":      regexp.MustCompile(`^` + regexp.QuoteMeta(strings.TrimSpace(string(kernel))) + `$`),
		"QEMU":        regexp.MustCompile(`^9\.1\.5$`),
		"accelerator": regexp.MustCompile(`^NEXUS_ACCEL unset: the stack uses auto, bare-QEMU baselines tcg; the KVM probe chose kvm$`),
	}
	for k, re := range want {
		if !re.MatchString(rows[k]) {
			t.Errorf("row %q = %q, want %v", k, rows[k], re)
		}
	}

	// Rewriting BENCH.md is what a run does: still clean. Any other change is dirty.
	writeBenchFile(t, filepath.Join(repo, "BENCH.md"), "new figures\n", 0o644)
	if c := header()["commit"]; !strings.HasSuffix(c, ", clean") {
		t.Errorf("with only BENCH.md changed, commit = %q, want clean", c)
	}
	writeBenchFile(t, filepath.Join(repo, "scripts", "bench.sh"), string(script)+"\n", 0o755)
	if c := header()["commit"]; !strings.HasSuffix(c, "), dirty: tracked files changed: 1") {
		t.Errorf("with a script change, commit = %q, want dirty", c)
	}
	if a := header("NEXUS_ACCEL=tcg")["accelerator"]; a != "NEXUS_ACCEL=tcg" {
		t.Errorf("with NEXUS_ACCEL=tcg, accelerator = %q", a)
	}
}

func writeBenchFile(t *testing.T, path, content string, mode os.FileMode) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, []byte(content), mode); err != nil {
		t.Fatal(err)
	}
}
