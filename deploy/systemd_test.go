// Package deploy holds no Go code: its tests check the deployment files beside them.
package deploy

import (
	"bufio"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/IniZio/nexus/pkg/bus"
)

// installedBinary is where the units expect nexus (and nexus-agent beside it).
const installedBinary = "/usr/local/bin/nexus"

// TestSystemdUnitsVerify runs systemd-analyze verify on every unit in systemd/ and on each
// service instance of the template. PID 1 need not be systemd: verify reads the files offline.
// The units' ExecStart points at installedBinary, which a test machine may lack, so the copies
// point at this test binary instead; nothing is started.
func TestSystemdUnitsVerify(t *testing.T) {
	analyze := requireAnalyze(t)
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	dir := copyUnits(t, func(name, text string) string {
		if !strings.Contains(text, "ExecStart="+installedBinary+" ") && strings.HasSuffix(name, ".service") {
			t.Errorf("%s: ExecStart does not run %s", name, installedBinary)
		}
		return strings.ReplaceAll(text, installedBinary, exe)
	})
	args := []string{"verify", "--man=no"}
	entries, _ := os.ReadDir(dir)
	for _, e := range entries {
		args = append(args, filepath.Join(dir, e.Name()))
	}
	for _, svc := range procfileServices(t) {
		if svc != "bus" {
			args = append(args, filepath.Join(dir, "nexus-serve@"+svc+".service"))
		}
	}
	out, err := exec.Command(analyze, args...).CombinedOutput()
	// Unknown keys and sections are only warnings (exit 0): any output is a failure.
	if err != nil || len(out) > 0 {
		t.Fatalf("systemd-analyze verify: %v\n%s", err, out)
	}
}

// TestSystemdVerifyCatchesTypos makes sure the check above can fail: a misspelt key is reported.
func TestSystemdVerifyCatchesTypos(t *testing.T) {
	analyze := requireAnalyze(t)
	dir := copyUnits(t, func(name, text string) string {
		text = strings.ReplaceAll(text, installedBinary, "/bin/true")
		return strings.Replace(text, "\nRestart=", "\nRestrat=", 1)
	})
	out, _ := exec.Command(analyze, "verify", "--man=no", filepath.Join(dir, "nexus.service")).CombinedOutput()
	if !strings.Contains(string(out), "Restrat") {
		t.Fatalf("systemd-analyze verify did not report a misspelt key; output:\n%s", out)
	}
}

// TestTargetRunsEveryService checks that nexus.target starts the bus and one instance per
// service, the same list as the Procfile.
func TestTargetRunsEveryService(t *testing.T) {
	got := targetServices(t, "systemd/nexus.target")
	// The HTTP API (the Procfile's api) is opt-in under systemd: systemctl enable --now
	// nexus-serve@api.
	want := slices.DeleteFunc(procfileServices(t), func(s string) bool { return s == "api" })
	slices.Sort(got)
	slices.Sort(want)
	if !slices.Equal(got, want) {
		t.Fatalf("nexus.target wants %v, the Procfile runs %v", got, want)
	}
}

// TestWorkerTargetRunsHostServices checks that nexus-worker.target starts the bus and the
// services of one host's sandboxes, without the control plane's (a worker's bus node has no
// users for them).
func TestWorkerTargetRunsHostServices(t *testing.T) {
	got := targetServices(t, "systemd/nexus-worker.target")
	want := slices.DeleteFunc(slices.Clone(bus.Services), func(s string) bool { return slices.Contains(bus.ControlUsers, s) })
	slices.Sort(got)
	slices.Sort(want)
	if !slices.Equal(got, want) {
		t.Fatalf("nexus-worker.target wants %v; a worker host runs %v", got, want)
	}
}

// targetServices is what a target Wants: "bus" for nexus-bus.service, the instance names of
// nexus-serve@.
func targetServices(t *testing.T, file string) []string {
	t.Helper()
	b, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, "Wants="); ok {
			for _, u := range strings.Fields(v) {
				switch {
				case u == "nexus-bus.service":
					got = append(got, "bus")
				case strings.HasPrefix(u, "nexus-serve@"):
					got = append(got, strings.TrimSuffix(strings.TrimPrefix(u, "nexus-serve@"), ".service"))
				}
			}
		}
	}
	return got
}

func requireAnalyze(t *testing.T) string {
	t.Helper()
	p, err := exec.LookPath("systemd-analyze")
	if err != nil {
		if os.Getenv("CI") != "" {
			t.Fatalf("systemd-analyze is required in CI (package systemd; make deps installs it): %v", err)
		}
		t.Skip("systemd-analyze not installed (package systemd)")
	}
	return p
}

// copyUnits copies systemd/* into a temporary directory through edit.
func copyUnits(t *testing.T, edit func(name, text string) string) string {
	t.Helper()
	dir := t.TempDir()
	entries, err := os.ReadDir("systemd")
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range entries {
		b, err := os.ReadFile(filepath.Join("systemd", e.Name()))
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, e.Name()), []byte(edit(e.Name(), string(b))), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

// procfileServices is the process names of the Procfile at the module root.
func procfileServices(t *testing.T) []string {
	t.Helper()
	f, err := os.Open("../Procfile")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var names []string
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if name, _, ok := strings.Cut(sc.Text(), ":"); ok && !strings.HasPrefix(name, "#") {
			names = append(names, strings.TrimSpace(name))
		}
	}
	if len(names) == 0 {
		t.Fatal("Procfile lists no process")
	}
	return names
}
