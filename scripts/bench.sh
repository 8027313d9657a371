#!/usr/bin/env bash
# make bench: run every benchmark once in this run (ours and the baselines side by side) and
# write the results as a table to BENCH.md. Figures are from this machine, today; compare the
# ratios, not the absolute numbers.
set -euo pipefail
cd "$(dirname "$0")/.."
out=$(mktemp)
# package, benchmark pattern, iterations: slow whole-VM figures a few times, latencies many times.
# Each line is its own `go test` (its own stack): the boot figure is taken first, on a quiet
# machine, not after twenty forks have just been torn down.
runs=(
	"./e2e/bench ^BenchmarkBoot$ 3x"
	"./e2e/bench IdleMemory|Create10|Fork|Pause 3x"
	"./e2e/bench ExecTrue|Keystroke|Clone 200x"
	"./e2e/bench GuestNet 1x"
	"./services/mitm . 2s"
	"./services/netstack . 2s"
	"./services/portfwd . 2s"
	"./services/vmm/guest . 1s"
	"./services/gitrelay RelayClone 5x"
	"./e2e/gitrelay Clone50MB 1x"
	"./e2e/portfwd . 3x"
)
for r in "${runs[@]}"; do
	read -r pkg pattern benchtime <<<"$r"
	[ -d "$pkg" ] || continue
	echo "== $pkg $pattern" >&2
	go test -run '^$' -bench "$pattern" -benchtime "$benchtime" "$pkg" 2>&1 | tee -a "$out" >&2 || true
done
{
	echo "# nexus benchmarks"
	echo
	echo "Run: $(date -u +%Y-%m-%dT%H:%MZ) on $(nproc) cores, $(uname -r), QEMU $(qemu-system-x86_64 --version | head -1 | awk '{print $4}'); accelerator: ${NEXUS_ACCEL:-auto}."
	echo
	echo "| benchmark | iterations | metrics |"
	echo "| --- | --- | --- |"
	grep -E '^Benchmark' "$out" | while read -r name iters rest; do
		metrics=$(echo "$rest" | tr -s '\t ' '  ' | sed -E 's/([0-9.]+) ([^ ]+)/\1 \2;/g; s/;[[:space:]]*$//; s/;[[:space:]]+/; /g')
		echo "| ${name%-*} | $iters | $metrics |"
	done
} > BENCH.md
rm -f "$out"
cat BENCH.md
