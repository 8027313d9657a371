// Package stack_test checks the foundation as a user meets it: nexus up/serve/status, their
// refusals, and a stack under overmind surviving kill -9 of any one process.
package stack_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/IniZio/nexus/internal/testutil"
)

type status struct {
	Service string `json:"service"`
	Up      bool   `json:"up"`
	Version string `json:"version"`
	Host    string `json:"host"`
	PID     int    `json:"pid"`
}

// env is an isolated environment for one nexus installation.
func env(t *testing.T) []string {
	root := t.TempDir()
	os.MkdirAll(filepath.Join(root, "home"), 0o700)
	port := freePort(t)
	var out []string
	for _, kv := range os.Environ() {
		k := strings.SplitN(kv, "=", 2)[0]
		if k == "HOME" || k == "NEXUS_HOME" || k == "NEXUS_BUS_PORT" || k == "NEXUS_BUS_URL" {
			continue
		}
		out = append(out, kv)
	}
	return append(out, "HOME="+filepath.Join(root, "home"), "NEXUS_HOME="+filepath.Join(root, "nexus"),
		"NEXUS_BUS_PORT="+strconv.Itoa(port), "NEXUS_CACHE="+testutil.CacheDir())
}

func freePort(t *testing.T) int {
	port, err := testutil.BusPort()
	if err != nil {
		t.Fatal(err)
	}
	return port
}

func bin(t *testing.T) string {
	d, err := testutil.Binaries()
	if err != nil {
		t.Fatal(err)
	}
	return filepath.Join(d, "nexus")
}

func run(t *testing.T, env []string, args ...string) (string, string, int) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, bin(t), args...)
	cmd.Env = env
	var out, errOut bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errOut
	err := cmd.Run()
	code := 0
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		code = ee.ExitCode()
	} else if err != nil {
		t.Fatal(err)
	}
	return out.String(), errOut.String(), code
}

func statusOf(t *testing.T, env []string) ([]status, int) {
	out, _, code := run(t, env, "status", "--json")
	var rows []status
	if err := json.Unmarshal([]byte(out), &rows); err != nil {
		t.Fatalf("status --json: %v: %q", err, out)
	}
	return rows, code
}

func allUp(rows []status) error {
	for _, r := range rows {
		if !r.Up {
			return fmt.Errorf("%s is down", r.Service)
		}
	}
	if len(rows) != 8 {
		return fmt.Errorf("%d services", len(rows))
	}
	return nil
}

// startUp runs `nexus up` and waits until status is green.
func startUp(t *testing.T, env []string) *exec.Cmd {
	cmd := exec.Command(bin(t), "up")
	cmd.Env = env
	var logs bytes.Buffer
	cmd.Stdout, cmd.Stderr = &logs, &logs
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		cmd.Process.Signal(syscall.SIGTERM)
		cmd.Wait()
	})
	testutil.WaitFor(t, 60*time.Second, func() error {
		rows, _ := statusOf(t, env)
		return allUp(rows)
	})
	return cmd
}

func TestUpStatusAndRefusals(t *testing.T) {
	e := env(t)
	rows, code := statusOf(t, e)
	if code != 1 || len(rows) != 8 || rows[0].Up {
		t.Fatalf("status with nothing running: exit %d %+v", code, rows)
	}
	up := startUp(t, e)
	rows, code = statusOf(t, e)
	if code != 0 {
		t.Fatalf("status exit %d", code)
	}
	for _, r := range rows {
		if r.Version == "" || r.Host != "local" || r.PID != up.Process.Pid {
			t.Errorf("status row %+v", r)
		}
	}
	out, _, _ := run(t, e, "status")
	if !strings.Contains(out, "SERVICE") || !strings.Contains(out, "gateway") || !strings.Contains(out, "up") {
		t.Fatalf("status table:\n%s", out)
	}
	// A second stack for the same home says so and exits non-zero.
	_, errOut, code := run(t, e, "up")
	if code == 0 || !strings.Contains(errOut, "already running") {
		t.Fatalf("second up: exit %d %q", code, errOut)
	}
	// Clean stop on SIGTERM.
	up.Process.Signal(syscall.SIGTERM)
	done := make(chan error, 1)
	go func() { done <- up.Wait() }()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("nexus up did not exit cleanly: %v", err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("nexus up ignored SIGTERM")
	}
}

func TestBadInputIsOneLineAndExit2(t *testing.T) {
	e := env(t)
	file := filepath.Join(t.TempDir(), "afile")
	os.WriteFile(file, nil, 0o600)
	busy, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer busy.Close()
	busyPort := strconv.Itoa(busy.Addr().(*net.TCPAddr).Port)
	for _, c := range []struct {
		name string
		env  []string
		args []string
		want string
	}{
		{"unknown service", e, []string{"serve", "bogus"}, `unknown service "bogus"`},
		{"unusable home", append(slices.Clone(e), "NEXUS_HOME="+file+"/sub"), []string{"up"}, "is not usable"},
		{"port in use", append(slices.Clone(e), "NEXUS_BUS_PORT="+busyPort), []string{"serve", "bus"}, "the port is in use"},
		{"bad log level", e, []string{"status", "--log-level", "loud"}, `invalid --log-level "loud"`},
	} {
		_, errOut, code := run(t, c.env, c.args...)
		lines := strings.Split(strings.TrimSpace(errOut), "\n")
		if code != 2 || !strings.Contains(errOut, c.want) || len(lines) != 1 || strings.Contains(errOut, "goroutine") {
			t.Errorf("%s: exit %d, stderr %q; want exit 2 and one line with %q", c.name, code, errOut, c.want)
		}
	}
	_, errOut, code := run(t, e, "ps")
	if code == 0 || !strings.Contains(errOut, "nexus up") {
		t.Errorf("ps without a bus: exit %d %q", code, errOut)
	}
}
