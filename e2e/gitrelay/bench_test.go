package gitrelay_test

import (
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"testing"
	"time"
)

// benchRepoMiB is the size of the benchmark repository (random, incompressible content).
const benchRepoMiB = 50

// makeBenchRepo creates acme/big behind the sshd once: benchRepoMiB files of 1 MiB.
func makeBenchRepo(b *testing.B) {
	b.Helper()
	bare := filepath.Join(srv.repos, "acme/big.git")
	if _, err := os.Stat(bare); err == nil {
		return
	}
	env := srv.gitEnv()
	work := filepath.Join(srv.root, "big")
	os.MkdirAll(work, 0o755)
	if _, err := runCmd(env, work, "git", "init", "-q", "-b", "main"); err != nil {
		b.Fatal(err)
	}
	for i := range benchRepoMiB {
		if err := randomFile(filepath.Join(work, fmt.Sprintf("blob-%02d.bin", i)), 1<<20); err != nil {
			b.Fatal(err)
		}
	}
	for _, c := range [][]string{{"add", "."}, {"commit", "-q", "-m", "big"}} {
		if _, err := runCmd(env, work, "git", c...); err != nil {
			b.Fatal(err)
		}
	}
	if _, err := runCmd(env, srv.root, "git", "clone", "-q", "--bare", "--no-local", work, bare); err != nil {
		b.Fatal(err)
	}
	// One stored pack: a clone sends it as is instead of compressing 50 MB of loose objects.
	if _, err := runCmd(env, bare, "git", "repack", "-a", "-d", "-q"); err != nil {
		b.Fatal(err)
	}
}

func median(d []time.Duration) time.Duration {
	s := append([]time.Duration{}, d...)
	sort.Slice(s, func(i, j int) bool { return s[i] < s[j] })
	return s[len(s)/2]
}

// BenchmarkClone50MB compares `git clone` of a 50 MB repository from inside a guest through the
// relay (guest git → shim → hybrid vsock → relay → host ssh → sshd) with the same clone by git on
// the host straight over ssh to the same sshd. Reported: ms per clone each way and their ratio
// (goal ≤ 1.2). Each run clones with --no-checkout into a fresh directory.
func BenchmarkClone50MB(b *testing.B) {
	makeBenchRepo(b)
	runs := 3
	if v, err := strconv.Atoi(os.Getenv("NEXUS_BENCH_RUNS")); err == nil && v > 0 {
		runs = v
	}
	var direct, relayed []time.Duration
	var guestFloor time.Duration
	b.Run("direct-ssh-on-host", func(b *testing.B) {
		env := append(srv.gitEnv(), "SSH_AUTH_SOCK="+srv.agentSck, "GIT_SSH_COMMAND="+srv.directSSH())
		for i := 0; i < runs; i++ {
			dst := filepath.Join(b.TempDir(), "big")
			t0 := time.Now()
			if _, err := runCmd(env, srv.root, "git", "clone", "-q", "--no-checkout", srv.user+"@127.0.0.1:acme/big.git", dst); err != nil {
				b.Fatal(err)
			}
			direct = append(direct, time.Since(t0))
		}
		b.ReportMetric(float64(median(direct).Milliseconds()), "ms/clone")
	})
	b.Run("guest-through-relay", func(b *testing.B) {
		name := "gr-bench"
		stack.MustNexus(b, "create", name, "--image", "nexus-base", "--memory", "1024", "-l", "nexus-test=1", "--repo", "acme/big")
		b.Cleanup(func() { stack.Nexus(b, "rm", "--force", name) })
		for i := 0; i < runs; i++ {
			script := "rm -rf /tmp/big && t0=$(date +%s%N) && git clone -q --no-checkout git@github.com:acme/big.git /tmp/big && echo $(( ($(date +%s%N) - t0) / 1000000 ))"
			out, errOut, code := stack.Nexus(b, "exec", name, "--", "sh", "-c", script)
			if code != 0 {
				b.Fatalf("guest clone: exit %d\n%s%s", code, out, errOut)
			}
			ms, err := strconv.Atoi(trim(out))
			if err != nil {
				b.Fatalf("guest clone time %q", out)
			}
			relayed = append(relayed, time.Duration(ms)*time.Millisecond)
		}
		b.ReportMetric(float64(median(relayed).Milliseconds()), "ms/clone")
		// The guest's own floor: the same clone from a local copy inside the guest (no network,
		// no relay), i.e. what git itself costs in this guest (index-pack of 50 MB).
		var local []time.Duration
		for i := 0; i < runs; i++ {
			script := "rm -rf /tmp/big2 && t0=$(date +%s%N) && git clone -q --no-checkout --no-local /tmp/big /tmp/big2 && echo $(( ($(date +%s%N) - t0) / 1000000 ))"
			out, errOut, code := stack.Nexus(b, "exec", name, "--", "sh", "-c", script)
			if code != 0 {
				b.Fatalf("guest local clone: exit %d\n%s%s", code, out, errOut)
			}
			ms, _ := strconv.Atoi(trim(out))
			local = append(local, time.Duration(ms)*time.Millisecond)
		}
		guestFloor = median(local)
		b.ReportMetric(float64(guestFloor.Milliseconds()), "ms/guest-local-clone")
	})
	if len(direct) > 0 && len(relayed) > 0 {
		ratio := float64(median(relayed)) / float64(median(direct))
		b.ReportMetric(ratio, "relay/direct")
		b.Logf("clone of %d MiB: direct %v, through the relay %v (median of %d): ratio %.2f (goal ≤ 1.2); the same clone local to the guest takes %v",
			benchRepoMiB, median(direct), median(relayed), runs, ratio, guestFloor)
	}
}

func trim(s string) string {
	for len(s) > 0 && (s[len(s)-1] == '\n' || s[len(s)-1] == '\r' || s[len(s)-1] == ' ') {
		s = s[:len(s)-1]
	}
	return s
}
