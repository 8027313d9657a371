#!/usr/bin/env bash
# make bench: run every benchmark once in this run (ours and the baselines side by side) and
# write the results as a table to BENCH.md. Figures are from this machine, today; compare the
# ratios, not the absolute numbers.
#
# `scripts/bench.sh --header` prints only the header: where and at which commit the figures are taken.
# `scripts/bench.sh --only REGEX` runs only the rows whose package and pattern match REGEX (e.g.
# 'Warm|IdlePSS|Boot|GitStatus|IdleCPU') and prints their table without touching BENCH.md.
set -euo pipefail
cd "$(dirname "$0")/.."

# commit says at which commit (and whether with uncommitted changes) this tree is.
commit() {
	local c dirty
	if ! c=$(git describe --always --tags --abbrev=12 2>/dev/null); then
		echo "unknown (not a git checkout)"
		return
	fi
	# BENCH.md itself is what a run rewrites; any other change means the figures are not the commit's.
	dirty=$(git status --porcelain --untracked-files=no -- . ':!BENCH.md' | wc -l)
	if [ "$dirty" -gt 0 ]; then
		echo "$c ($(git rev-parse HEAD)), dirty: tracked files changed: $dirty"
	else
		echo "$c ($(git rev-parse HEAD)), clean"
	fi
}

# accel says which accelerator was asked for and, for auto, what the KVM probe cached for this QEMU.
accel() {
	local f probed=""
	for f in "${NEXUS_CACHE:-}/accel.json"; do
		[ -f "$f" ] || continue
		# accel.json is indented JSON keyed "qemu <version> kernel <kernel>".
		probed+=$(awk -v v="$1" '$1 == "\"qemu" && $2 == v {on = 1; next}
			on && $1 == "\"accel\":" {gsub(/[",]/, "", $2); print $2; on = 0}' "$f")$'\n'
	done
	probed=$(echo -n "$probed" | grep -v '^$' | sort -u | paste -sd/ -) || true
	if [ -n "${NEXUS_ACCEL:-}" ]; then
		echo -n "NEXUS_ACCEL=$NEXUS_ACCEL"
	else
		echo -n "NEXUS_ACCEL unset: the stack uses auto, bare-QEMU baselines tcg"
	fi
	if [ -n "$probed" ] && [ "${NEXUS_ACCEL:-auto}" = auto ]; then
		echo "; the KVM probe chose $probed"
	else
		echo
	fi
}

# header prints BENCH.md's title and where the run was taken: $1 start time, $2 commit.
header() {
	local qemu
	qemu=$(qemu-system-x86_64 --version 2>/dev/null | awk 'NR == 1 {print $4}') || true
	echo "# nexus benchmarks"
	echo
	echo "Written by \`make bench\` (scripts/bench.sh). All figures are from one run on one machine: compare"
	echo "the ratios within a run, not absolute numbers across machines."
	echo
	echo "| run | |"
	echo "| --- | --- |"
	echo "| taken | $1 to $(date -u +%Y-%m-%dT%H:%MZ) |"
	echo "| commit | $2 |"
	echo "| cores | $(nproc) |"
	echo "| memory | $(awk '/^MemTotal:/ {printf "%.1f GiB", $2 / 1048576}' /proc/meminfo) |"
	echo "| CPU | $(awk -F': *' '/^model name/ {print $2; exit}' /proc/cpuinfo) |"
	echo "| kernel | $(uname -r) |"
	echo "| QEMU | ${qemu:-not installed} |"
	echo "| accelerator | $(accel "${qemu:-none}") |"
}

# Taken before the run: the tree may change while it runs.
started=$(date -u +%Y-%m-%dT%H:%MZ)
at=$(commit)
if [ "${1:-}" = --header ]; then
	header "$started" "$at"
	exit 0
fi
only=""
if [ "${1:-}" = --only ]; then
	only=${2:?--only needs a regular expression}
fi
out=$(mktemp)
# package, benchmark pattern, iterations: slow whole-VM figures a few times, latencies many times.
# Each line is its own `go test` (its own stack): the boot figure is taken first, on a quiet
# machine, not after twenty forks have just been torn down.
runs=(
	"./e2e/bench ^BenchmarkBoot$ 3x"
	"./e2e/bench IdleMemory|Create10|Fork|Pause|CreateFirstExecImage 3x"
	"./e2e/bench ^BenchmarkWarm|IdlePSS10 1x"
	"./e2e/bench IdleCPU 1x"
	"./e2e/bench ExecTrue|Keystroke|Clone|ExecAPI 200x"
	"./e2e/bench GuestNet 1x"
	"./e2e/bench NoisyNeighbour 1x"
	"./gateway PS10000 3x"
	"./gateway/cli PS10000 3x"
	"./gateway Placement 200x"
	"./e2e/cluster ExecLocalRemote 50x"
	"./e2e/bench MountedGitStatus 1x"
	"./services/mitm . 2s"
	"./services/netstack . 2s"
	"./services/portfwd . 2s"
	"./services/vmm/guest . 1s"
	"./services/vmm/image PullConvert 3x"
	"./pkg/audit AuditFlood 1x"
	"./pkg/audit AuditPublishReplicas 3x"
	"./services/gitrelay RelayClone 5x"
	"./e2e/gitrelay Clone50MB 1x"
	"./e2e/portfwd . 3x"
)
for r in "${runs[@]}"; do
	read -r pkg pattern benchtime <<<"$r"
	[ -d "$pkg" ] || continue
	if [ -n "$only" ] && ! grep -Eq -- "$only" <<<"$pkg $pattern"; then
		continue
	fi
	echo "== $pkg $pattern" >&2
	go test -run '^$' -bench "$pattern" -benchtime "$benchtime" "$pkg" 2>&1 | tee -a "$out" >&2 || true
done
{
	header "$started" "$at"
	echo
	echo "| benchmark | iterations | metrics |"
	echo "| --- | --- | --- |"
	grep -E '^Benchmark' "$out" | while read -r name iters rest; do
		metrics=$(echo "$rest" | tr -s '\t ' '  ' | sed -E 's/([0-9.]+) ([^ ]+)/\1 \2;/g; s/;[[:space:]]*$//; s/;[[:space:]]+/; /g')
		echo "| ${name%-*} | $iters | $metrics |"
	done
} > "$out.md"
rm -f "$out"
if [ -z "$only" ]; then
	mv "$out.md" BENCH.md
	cat BENCH.md
else
	cat "$out.md"
	rm -f "$out.md"
fi
