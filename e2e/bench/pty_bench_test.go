package bench

import (
	"bytes"
	"fmt"
	"os"
	"testing"
	"time"

	"github.com/creack/pty"
)

// BenchmarkKeystrokeEcho measures keystroke → echo through a pty driver (the latency the spec
// lists as never measured): `nexus attach` against `nexus exec -t … sh`.
func BenchmarkKeystrokeEcho(b *testing.B) {
	sandbox(b, "bench/pty")
	for _, mode := range []struct {
		name string
		args []string
	}{
		{"attach", []string{"attach", "bench/pty"}},
		{"exec-t", []string{"exec", "-t", "-i", "bench/pty", "--", "sh"}},
	} {
		b.Run(mode.name, func(b *testing.B) {
			cmd := stack.Command(mode.args...)
			cmd.Env = append(cmd.Env, "TERM=dumb")
			f, err := pty.StartWithSize(cmd, &pty.Winsize{Rows: 40, Cols: 120})
			if err != nil {
				b.Fatal(err)
			}
			defer func() { f.Close(); cmd.Process.Kill(); cmd.Wait() }()
			if err := waitFor(f, []byte("#"), 30*time.Second); err != nil {
				b.Fatalf("no prompt: %v", err)
			}
			var lat []time.Duration
			for i := 0; b.Loop(); i++ {
				key := []byte{byte('a' + i%26)}
				t0 := time.Now()
				if _, err := f.Write(key); err != nil {
					b.Fatal(err)
				}
				if err := waitFor(f, key, 10*time.Second); err != nil {
					b.Fatal(err)
				}
				lat = append(lat, time.Since(t0))
			}
			f.Write([]byte("\x15exit\r"))
			b.ReportMetric(percentile(lat, 0.5), "p50-ms")
			b.ReportMetric(percentile(lat, 0.99), "p99-ms")
		})
	}
}

// waitFor reads f until want appears or the deadline passes.
func waitFor(f *os.File, want []byte, d time.Duration) error {
	f.SetReadDeadline(time.Now().Add(d))
	var seen []byte
	buf := make([]byte, 4096)
	for {
		n, err := f.Read(buf)
		seen = append(seen, buf[:n]...)
		if bytes.Contains(seen, want) {
			return nil
		}
		if err != nil {
			return fmt.Errorf("%w after %q", err, tail(seen))
		}
	}
}

func tail(b []byte) []byte {
	if len(b) > 200 {
		return b[len(b)-200:]
	}
	return b
}
