#!/usr/bin/env bash
# A three-host cluster on one machine (make cluster-demo): three network namespaces on a private
# bridge, each a "host" with its own HOME, NEXUS_HOME, bus node and services, joined into one
# cluster as deploy/README.md describes. It places sandboxes across the hosts, execs into each
# from host 1's CLI, kills every process of host 3 (its bus node and VMs included), shows its
# sandbox failed and a new one placed on the others with the audit stream and the registry
# intact, then brings host 3 back. Each step is printed; any failed step exits non-zero.
# Needs root (namespaces, a bridge). Nothing leaves the namespaces; the real HOME is not read.
set -euo pipefail
cd "$(dirname "$0")/.."
NEXUS="$PWD/bin/nexus"
[ "$(id -u)" = 0 ] || { echo "cluster-demo: needs root (network namespaces and a bridge)" >&2; exit 1; }
[ -x "$NEXUS" ] || { echo "cluster-demo: $NEXUS is missing: make build first" >&2; exit 1; }
for c in ip nsenter; do
	command -v $c >/dev/null || { echo "cluster-demo: $c is missing (apt-get install iproute2 util-linux)" >&2; exit 1; }
done

PREFIX=${NEXUS_CLUSTER_DEMO_PREFIX:-nxdemo} # names of the bridge, namespaces and veths
STATE=/run/$PREFIX.root                     # the temp dir of the last run, for its cleanup
export NEXUS_CACHE="${NEXUS_CACHE:-$HOME/.local/share/nexus/cache}"
mkdir -p "$NEXUS_CACHE"
MEM=${NEXUS_CLUSTER_DEMO_MEMORY:-256m}
started=$(date +%s)

say() { printf '\n\033[1m== %s\033[0m\n' "$*"; }
fail() { printf '\033[1;31mcluster-demo: %s\033[0m\n' "$*" >&2; exit 1; }

# on N CMD...: run CMD in host N's namespace with its environment.
on() {
	local n=$1
	shift
	nsenter --net="/run/netns/$PREFIX-h$n" env HOME="$ROOT/h$n/home" NEXUS_HOME="$ROOT/h$n/nexus" \
		NEXUS_CACHE="$NEXUS_CACHE" NEXUS_TEMPLATES=false "$@"
}
# nx N ARGS...: the nexus CLI of host N, printed as it is run.
nx() {
	local n=$1
	shift
	printf '[h%s]$ nexus %s\n' "$n" "$*"
	on "$n" "$NEXUS" "$@"
}
# quiet N ARGS...: the nexus CLI of host N, not printed.
quiet() {
	local n=$1
	shift
	on "$n" "$NEXUS" "$@"
}
# waitfor SECONDS WHAT CMD...: run CMD until it succeeds, or fail after SECONDS.
waitfor() {
	local secs=$1 what=$2
	shift 2
	local end=$(($(date +%s) + secs))
	until "$@" >/dev/null 2>&1; do
		[ "$(date +%s)" -lt "$end" ] || fail "$what: not within ${secs}s"
		sleep 1
	done
}

# teardown kills every process of the namespaces (nexus and its QEMUs), removes them, the
# bridge and (unless called with "keep") the temp dir. It also clears what an earlier run left.
teardown() {
	local ns v
	for ns in $(ip netns list 2>/dev/null | awk -v p="$PREFIX-h" 'index($1, p) == 1 {print $1}'); do
		ip netns pids "$ns" 2>/dev/null | xargs -r kill -9 2>/dev/null || true
		ip netns del "$ns" 2>/dev/null || true
	done
	# A namespace goes away asynchronously, its veth with it; do not leave that to chance.
	for v in "$PREFIX-h1" "$PREFIX-h2" "$PREFIX-h3" "$PREFIX-br"; do
		ip link del "$v" 2>/dev/null || true
	done
	if [ "${1:-}" != keep ] && [ -f "$STATE" ]; then
		local old
		old=$(cat "$STATE")
		case "$old" in /tmp/nexus-cluster-demo.*) rm -rf "$old" ;; esac
		rm -f "$STATE"
	fi
}
# killhost N kills every process of host N's namespace and waits until none is left.
killhost() {
	local ns="$PREFIX-h$1" i
	for i in $(seq 1 50); do
		pids=$(ip netns pids "$ns")
		[ -n "$pids" ] || return 0
		kill -9 $pids 2>/dev/null || true
		sleep 0.2
	done
	fail "host $1: processes left after kill -9: $(ip netns pids "$ns" | tr '\n' ' ')"
}
finish() {
	rc=$?
	if [ $rc -ne 0 ] && [ -n "${ROOT:-}" ]; then
		for n in 1 2 3; do
			[ -f "$ROOT/h$n/up.log" ] && { echo "---- host $n: tail of up.log"; grep -v ' DBG ' "$ROOT/h$n/up.log" | tail -n 15; }
		done
	fi
	if [ $rc -eq 0 ]; then
		teardown
	else
		# A failed run's logs stay for a look; the next run removes them.
		teardown keep
		[ -z "${ROOT:-}" ] || echo "cluster-demo: failed; the hosts' logs are in $ROOT/h*/up.log (the next run removes them)" >&2
	fi
	[ $rc -ne 0 ] || echo "cluster-demo: done in $(($(date +%s) - started))s"
	exit $rc
}

say "clearing what an earlier run left (namespaces $PREFIX-h*, bridge $PREFIX-br)"
teardown
trap finish EXIT
trap 'exit 130' INT TERM

# A /24 that no route of this machine covers: 10.213.0.0/24, else the next free 10.213.N.0/24.
NET=""
for i in $(seq 0 255); do
	if ! ip -4 route show | grep -q "^10\.213\.$i\."; then
		NET=10.213.$i
		break
	fi
done
[ -n "$NET" ] || fail "no free 10.213.N.0/24 for the hosts"
ROOT=$(mktemp -d /tmp/nexus-cluster-demo.XXXXXX)
echo "$ROOT" >"$STATE"

say "three hosts: network namespaces on bridge $PREFIX-br, $NET.0/24 (state under $ROOT)"
ip link add "$PREFIX-br" type bridge
ip link set "$PREFIX-br" up
for n in 1 2 3; do
	ns="$PREFIX-h$n"
	ip netns add "$ns"
	ip link add "$PREFIX-h$n" type veth peer name eth0 netns "$ns"
	ip link set "$PREFIX-h$n" master "$PREFIX-br" up
	ip -n "$ns" link set lo up
	ip -n "$ns" addr add "$NET.$n/24" dev eth0
	ip -n "$ns" link set eth0 up
	mkdir -p "$ROOT/h$n/home" "$ROOT/h$n/nexus"
	chmod 700 "$ROOT/h$n/home" "$ROOT/h$n/nexus"
	printf 'h%s: %s (namespace %s)\n' "$n" "$NET.$n" "$ns"
done

# start N: nexus up in host N's namespace, its output in up.log.
start() {
	on "$1" "$NEXUS" up --log-level debug >>"$ROOT/h$1/up.log" 2>&1 &
	disown
}

say "host 1: the first node of the cluster (its CA, the gateway), then two join tokens"
nx 1 cluster init --host h1 --advertise "$NET.1"
start 1
waitfor 60 "host 1's bus" on 1 test -s "$ROOT/h1/nexus/bus/url"
tok2=$(quiet 1 cluster token create --ttl 10m 2>/dev/null)
tok3=$(quiet 1 cluster token create --ttl 10m 2>/dev/null)
nx 1 cluster token ls

for n in 2 3; do
	say "host $n joins with its token (a worker: vmm, netstack, mitm, gitrelay, portfwd)"
	tok=$tok2
	[ "$n" = 3 ] && tok=$tok3
	printf '[h%s]$ nexus cluster join nxjoin1.… --host h%s --advertise %s\n' "$n" "$n" "$NET.$n"
	waitfor 60 "host $n joins" quiet "$n" cluster join "$tok" --host "h$n" --advertise "$NET.$n"
	start "$n"
done

say "the cluster: three bus nodes, every service up, three hosts heartbeating"
waitfor 120 "every service of the cluster up" quiet 1 status
hosts_up() {
	quiet 1 hosts --json | python3 -c 'import json, sys
sys.exit(sum(h["state"] == "up" for h in json.load(sys.stdin)) != int(sys.argv[1]))' "$1"
}
waitfor 60 "three hosts up" hosts_up 3
nx 1 status
nx 1 hosts

# host_of NAME: the host a sandbox is placed on.
# field NAME KEY: a field of sandbox NAME in host 1's `nexus ps -a --json`.
field() {
	quiet 1 ps -a --json | python3 -c 'import json, sys
print(next((str(s.get(sys.argv[2], "")) for s in json.load(sys.stdin) if s["name"] == sys.argv[1]), ""))' "$1" "$2"
}
host_of() { field "$1" host; }

say "three sandboxes, each placed on the host with the most free memory"
for i in 1 2 3; do
	nx 1 create "cluster/s$i" --image nexus-mini --memory "$MEM" --label demo=cluster
done
nx 1 ps
placed=$(for i in 1 2 3; do host_of "cluster/s$i"; done | sort -u | wc -l)
[ "$placed" -ge 2 ] || fail "the three sandboxes were not spread over the hosts"

say "exec into each from host 1's CLI (over the bus to the sandbox's host)"
for i in 1 2 3; do
	nx 1 exec "cluster/s$i" -- sh -c 'echo "$(hostname): up $(cut -d" " -f1 /proc/uptime)s"; nslookup evil.example >/dev/null 2>&1 || echo "evil.example: refused by the perimeter (an audit event)"'
done

# counts: the audit stream's messages and the registry's sandbox records, from host 1.
audit_count() { quiet 1 audit tail --json | wc -l; }
record_count() { quiet 1 ps -a --json | python3 -c 'import json, sys; print(len(json.load(sys.stdin)))'; }
say "counts before host 3 goes"
audit_has() { [ "$(audit_count)" -ge "$1" ]; }
waitfor 30 "the three refusals in the audit stream" audit_has 3
a1=$(audit_count)
r1=$(record_count)
echo "audit stream: $a1 egress events; registry: $r1 sandbox records"

victim=$(host_of cluster/s3)
[ -n "$victim" ] || fail "no host for cluster/s3"
say "host 3 dies: kill -9 every process of namespace $PREFIX-h3 (its bus node, services, QEMUs)"
ip netns pids "$PREFIX-h3" | xargs -r ps -o pid=,comm= -p | sed 's/^/  killed /'
killhost 3

say "the gateway sees host h3 lost: its sandboxes are failed (at most 12 s after its last heartbeat)"
lost_shown() { [ "$(field cluster/s3 reason)" = "host h3 lost" ]; }
t0=$(date +%s)
waitfor 60 "a sandbox of h3 failed with \"host h3 lost\"" lost_shown
echo "(seen after $(($(date +%s) - t0))s) cluster/s3: $(field cluster/s3 state), $(field cluster/s3 reason)"
nx 1 ps -a
nx 1 hosts

say "a new sandbox goes to a host still up"
nx 1 create cluster/s4 --image nexus-mini --memory "$MEM" --label demo=cluster
h4=$(host_of cluster/s4)
[ -n "$h4" ] && [ "$h4" != h3 ] || fail "cluster/s4 was placed on ${h4:-no host}, not on h1 or h2"
nx 1 exec cluster/s4 -- hostname

say "counts after: nothing lost (the audit stream and the registry are R3 across the nodes)"
a2=$(audit_count)
r2=$(record_count)
echo "audit stream: $a1 -> $a2 egress events; registry: $r1 -> $r2 sandbox records"
[ "$a2" -ge "$a1" ] || fail "the audit stream lost messages ($a1 -> $a2)"
[ "$r2" -gt "$r1" ] || fail "the registry lost records ($r1 -> $r2)"

say "host 3 comes back: its VMs did not survive, so they are cleaned up and the registry corrected"
start 3
waitfor 60 "h3 up again" hosts_up 3
cleaned() { field cluster/s3 reason | grep -q "did not survive"; }
waitfor 60 "h3's sandboxes cleaned up" cleaned
echo "cluster/s3: $(field cluster/s3 state), $(field cluster/s3 reason)"
nx 1 hosts
nx 1 ps -a

say "removing the sandboxes"
nx 1 rm --force -l demo=cluster
