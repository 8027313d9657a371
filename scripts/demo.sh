#!/usr/bin/env bash
# The main job, end to end (make run): start the embedded stack, boot a sandbox, run commands in
# it, and show one allowed HTTPS request whose credential was swapped on the wire and the
# requests the perimeter denied, each with its audit event. A local upstream stands in for the
# internet (this machine has none); the demo never touches your real ~/.claude or ~/.ssh.
set -euo pipefail
cd "$(dirname "$0")/.."
NEXUS="$PWD/bin/nexus"
real_home=$HOME
export NEXUS_HOME="${NEXUS_DEMO_HOME:-$real_home/.local/share/nexus-demo}"
export NEXUS_CACHE="${NEXUS_CACHE:-$real_home/.local/share/nexus/cache}"
export NEXUS_BUS_PORT="${NEXUS_DEMO_PORT:-4254}"
export HOME="$NEXUS_HOME/home" # the demo's agent profile must not see the real ~/.claude
mkdir -p "$HOME" "$NEXUS_CACHE"
say() { printf '\n\033[1m== %s\033[0m\n' "$*"; }
run() { printf '$ %s\n' "$*"; "$@"; }

pids=()
cleanup() {
	"$NEXUS" rm --force demo/agent >/dev/null 2>&1 || true
	for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
	wait 2>/dev/null || true
}
trap cleanup EXIT

if "$NEXUS" status >/dev/null 2>&1; then
	echo "a demo stack already runs for $NEXUS_HOME; stop it first (or set NEXUS_DEMO_HOME)" >&2
	exit 1
fi

say "a local upstream stands in for api.github.com and example.test"
go build -o bin/demo-upstream ./scripts/upstream
token="ghp_demo$(head -c 16 /dev/urandom | od -An -tx1 | tr -d ' \n')"
DEMO_TOKEN="$token" bin/demo-upstream -ca "$NEXUS_HOME/upstream-ca.pem" -expect-env DEMO_TOKEN \
	-hosts example.test,api.github.com,evil.example >"$NEXUS_HOME/upstream.log" 2>&1 &
pids+=($!)

say "starting the stack: nexus up (log in $NEXUS_HOME/up.log)"
for _ in $(seq 1 50); do [ -s "$NEXUS_HOME/upstream-ca.pem" ] && break; sleep 0.1; done
"$NEXUS" up --resolve api.github.com=127.0.0.1:18443,example.test=127.0.0.1:18080,evil.example=127.0.0.1:18443 \
	--extra-ca "$NEXUS_HOME/upstream-ca.pem" >"$NEXUS_HOME/up.log" 2>&1 &
pids+=($!)
for _ in $(seq 1 150); do
	"$NEXUS" status >/dev/null 2>&1 && break
	kill -0 "${pids[1]}" 2>/dev/null || { cat "$NEXUS_HOME/up.log"; exit 1; }
	sleep 0.2
done
run "$NEXUS" status

say "the root image: Debian bookworm with git and curl (built once, ~40 s; cached after)"
run "$NEXUS" image build nexus-base

say "a secret the guest will only ever see as a placeholder"
printf '%s' "$token" | "$NEXUS" secret set GH_TOKEN
run "$NEXUS" secret ls

say "a sandbox bound to one repo, plus one extra host"
"$NEXUS" rm --force demo/agent >/dev/null 2>&1 || true
run "$NEXUS" create demo/agent --image nexus-base --repo demo/repo --allow-host example.test --label demo=true
run "$NEXUS" ps
run "$NEXUS" exec demo/agent -- bash -c 'echo "GH_TOKEN in the guest: ${GH_TOKEN:0:12}… (a placeholder; expires $NEXUS_CRED_API_GITHUB_COM_EXPIRES_AT)"'

say "allowed: HTTPS to api.github.com — the MITM swaps the placeholder for the real token"
run "$NEXUS" exec demo/agent -- sh -c 'curl -sS https://api.github.com/user -H "Authorization: Bearer $GH_TOKEN"'
tail -n 1 "$NEXUS_HOME/upstream.log"

say "denied: a host that is not on the allowlist, an IP nobody resolved, DNS elsewhere"
run "$NEXUS" exec demo/agent -- sh -c 'curl -sS -m 5 https://evil.example/ || true'
run "$NEXUS" exec demo/agent -- sh -c 'curl -sS -m 5 http://203.0.113.7/ || true'
run "$NEXUS" exec demo/agent -- sh -c 'getent hosts evil.example || echo "evil.example: no such host (NXDOMAIN from the perimeter)"'

say "denied at HTTP level: the credential used on a repository the sandbox is not bound to"
run "$NEXUS" exec demo/agent -- sh -c 'curl -sS -X POST https://api.github.com/repos/someone/else/issues -H "Authorization: Bearer $GH_TOKEN" -d "{}" -w "HTTP %{http_code}\n"'

say "every decision is in the audit stream"
run "$NEXUS" audit tail --sandbox demo/agent
run "$NEXUS" egress show demo/agent

say "removing the sandbox"
run "$NEXUS" rm --force demo/agent
