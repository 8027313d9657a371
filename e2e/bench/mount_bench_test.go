package bench

import (
	"os"
	osexec "os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"
)

// makeRepo is the 3,000-file repository of the git status benchmark: 30 directories of 100
// small files, committed. The same script builds it on the host and in the guest.
const makeRepo = `set -e; mkdir -p "$1"; cd "$1"; git init -q .
for d in $(seq 1 30); do mkdir d$d; for f in $(seq 1 100); do echo "file $d $f" > d$d/f$f.txt; done; done
git add -A; git -c user.email=b@nexus -c user.name=bench commit -qm init`

// timeStatus runs git status 1+runs times in dir and prints the median of the timed runs in
// µs (by the clock of wherever it runs).
const timeStatus = `cd "$1"; git status --porcelain >/dev/null; for i in $(seq 1 $2); do s=$(date +%s%N); git status --porcelain >/dev/null; e=$(date +%s%N); echo $(( (e-s)/1000 )); done | sort -n | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}'`

// BenchmarkMountedGitStatus (issue 24): `git status` on a 3,000-file repository mounted into a
// sandbox with --mount (virtiofs where virtiofsd exists), the same repository mounted read-only
// (9p: a read-only share stays on 9p), the same repository on the guest's own ext4, and on the
// host, as ratios. Goal: mounted ≤ 2× ext4.
func BenchmarkMountedGitStatus(b *testing.B) {
	runs := 5
	if v, err := strconv.Atoi(os.Getenv("NEXUS_BENCH_RUNS")); err == nil && v > 0 {
		runs = v
	}
	repo := filepath.Join(b.TempDir(), "repo")
	if out, err := osexec.Command("sh", "-c", makeRepo, "sh", repo).CombinedOutput(); err != nil {
		b.Fatalf("host repo: %v: %s", err, out)
	}
	status := func(argv ...string) time.Duration {
		out, err := osexec.Command(argv[0], argv[1:]...).Output()
		us, perr := strconv.Atoi(strings.TrimSpace(string(out)))
		if err != nil || perr != nil {
			b.Fatalf("%v: %v %q", argv, err, out)
		}
		return time.Duration(us) * time.Microsecond
	}
	host := status("sh", "-c", timeStatus, "sh", repo, strconv.Itoa(runs))

	const name = "bench-gitstatus"
	stack.MustNexus(b, "create", name, "--image", "nexus-base", "--memory", "1024", "-l", "nexus-test=1",
		"--mount", repo+":/repo", "--mount", repo+":/repo9p:ro")
	b.Cleanup(func() { stack.Nexus(b, "rm", "--force", name) })
	guest := func(script string, args ...string) time.Duration {
		argv := append([]string{"exec", name, "--", "sh", "-c", script, "sh"}, args...)
		out, errOut, code := stack.Nexus(b, argv...)
		us, err := strconv.Atoi(strings.TrimSpace(out))
		if code != 0 || err != nil {
			b.Fatalf("guest %v: exit %d %q %q", args, code, out, errOut)
		}
		return time.Duration(us) * time.Microsecond
	}
	stack.MustNexus(b, "exec", name, "--", "git", "config", "--global", "--add", "safe.directory", "*")
	fsOf := strings.Fields(stack.MustNexus(b, "exec", name, "--", "grep", " /repo ", "/proc/mounts"))
	if _, _, code := stack.Nexus(b, "exec", name, "--", "sh", "-c", makeRepo+" >/dev/null", "sh", "/root/repo"); code != 0 {
		b.Fatal("guest repo on ext4")
	}
	ext4 := guest(timeStatus, "/root/repo", strconv.Itoa(runs))
	mounted := guest(timeStatus, "/repo", strconv.Itoa(runs))
	ninep := guest(timeStatus, "/repo9p", strconv.Itoa(runs))
	ms := func(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }
	if len(fsOf) > 2 {
		b.Logf("the rw mount is %s", fsOf[2])
	}
	b.ReportMetric(ms(host), "ms-host")
	b.ReportMetric(ms(ext4), "ms-ext4")
	b.ReportMetric(ms(mounted), "ms-mounted")
	b.ReportMetric(ms(ninep), "ms-9p")
	b.ReportMetric(ms(mounted)/ms(ext4), "mounted-x-ext4")
	b.ReportMetric(ms(ninep)/ms(ext4), "9p-x-ext4")
	b.ReportMetric(ms(mounted)/ms(host), "mounted-x-host")
}
