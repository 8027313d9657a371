#!/usr/bin/env bash
# The main job, end to end: start the embedded stack, boot a sandbox, run commands in it,
# show what its perimeter allows and denies, and clean up. Run by `make run`.
set -euo pipefail
cd "$(dirname "$0")/.."
NEXUS=./bin/nexus
export NEXUS_HOME="${NEXUS_HOME:-$HOME/.local/share/nexus}"
mkdir -p "$NEXUS_HOME"
say() { printf '\n\033[1m== %s\033[0m\n' "$*"; }

started=""
cleanup() {
	$NEXUS rm --force demo/hello >/dev/null 2>&1 || true
	if [ -n "$started" ]; then
		kill "$started" 2>/dev/null || true
		wait "$started" 2>/dev/null || true
	fi
}
trap cleanup EXIT

if ! $NEXUS status >/dev/null 2>&1; then
	say "starting the stack (nexus up; log in $NEXUS_HOME/up.log)"
	$NEXUS up >"$NEXUS_HOME/up.log" 2>&1 &
	started=$!
	for _ in $(seq 1 100); do
		$NEXUS status >/dev/null 2>&1 && break
		kill -0 "$started" 2>/dev/null || { cat "$NEXUS_HOME/up.log"; exit 1; }
		sleep 0.2
	done
fi
$NEXUS status

say "building the nexus-mini image (cached after the first run)"
$NEXUS image build nexus-mini

say "creating a sandbox"
$NEXUS rm --force demo/hello >/dev/null 2>&1 || true
$NEXUS create demo/hello --image nexus-mini --memory 256 --label demo=true
$NEXUS ps

say "running commands inside it"
$NEXUS exec demo/hello -- uname -sr
$NEXUS exec demo/hello -- sh -c 'echo "hello from $(hostname)"; exit 3' || echo "(exit status $? came back from the guest)"

say "removing it"
$NEXUS rm --force demo/hello
