#!/usr/bin/env bash
# ci/netns-test.sh - Ferry across three "hosts" without hardware: three network namespaces joined
# by a bridge, each with an address of its own, one rank in each (build/tests/ferry-rank-check),
# started with torchrun's variables only (RANK WORLD_SIZE MASTER_ADDR MASTER_PORT; no
# FERRY_BIND_ADDR): each node must find the address its peers reach it at by itself.
#
#   bash ci/netns-test.sh [--build-dir DIR] [--no-loss] [--keep-logs]
#
# Runs, each bounded:
#   plain  push, pull and localize across the three ranks; every rank's log must show it listens
#          on its own namespace's address (the route to the rendezvous), not loopback
#   transport  the transport suite's message cases, one rank per namespace over tcp
#          (build/tests/ferry-tp-check): every frame size from 16 B to 8 MiB, 4 threads per rank
#          sending to every rank at once (frames in order per thread, contents checked), 1 MiB
#          floods both ways with every frame acked, bad destinations refused, then the third
#          rank leaves: the others must see its BYE (their logs: "rank 2 left"), a send to it
#          must fail with -FERRY_E_PEER and the two must go on. One-sided read/write: tcp has
#          none; rdma needs a device, which a namespace here does not have (the SoftRoCE VM runs
#          the suite's rdma cases)
#   rules  the other two ways to choose the address: rank 1 with FERRY_SOCKET_IFNAME==eth0, rank 2
#          with FERRY_BIND_ADDR=0.0.0.0, which must tell its peers its namespace's address, never
#          the wildcard
#   loss   the same as plain for longer, while the third namespace loses every packet for 3 s: with tc
#          netem (loss 100%) when the kernel has sch_netem, else by taking its link to the
#          bridge down (the packets are dropped the same way: TCP retransmits until it is back).
#          Every rank must still finish with its values intact, and the slowest round must show
#          the outage (>= 1 s), or the loss never happened.
#
# Needs root and iproute2 (ci/deps.sh build). Everything it creates (namespaces fyns<pid>-N,
# bridge fybr<pid>, veth pairs, the log folder) is removed on exit, failure and signals included.
# Prints one line per run and exits non-zero when one failed.
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."
build=build
loss=1
keep=0
while [[ $# -gt 0 ]]; do
	case $1 in
	--build-dir) build=$2; shift ;;
	--no-loss) loss=0 ;;
	--keep-logs) keep=1 ;;
	-h | --help) sed -n '2,31s/^# \{0,1\}//p' "$0"; exit 0 ;;
	*) echo "netns-test: unknown option '$1'" >&2; exit 2 ;;
	esac
	shift
done
bin=$(realpath "$build/tests/ferry-rank-check" 2>/dev/null || true)
[[ -x $bin ]] || { echo "netns-test: $build/tests/ferry-rank-check is missing; build first" >&2; exit 2; }
tpbin=$(realpath "$build/tests/ferry-tp-check" 2>/dev/null || true)
[[ -x $tpbin ]] || { echo "netns-test: $build/tests/ferry-tp-check is missing; build first" >&2; exit 2; }
[[ $(id -u) -eq 0 ]] || { echo "netns-test: needs root (network namespaces)" >&2; exit 2; }
command -v ip >/dev/null || { echo "netns-test: no ip (Debian: iproute2)" >&2; exit 2; }

readonly N=3 NET=10.231.77 PORT=29400
tag=$$
br=fybr$tag
ns=()
for ((i = 0; i < N; i++)); do ns+=("fyns$tag-$i"); done
tmp=$(mktemp -d /tmp/ferry-netns.XXXXXX)
pids=()

cleanup()
{
	local p i
	# each rank leads its own process group (timeout(1) makes one): end the group, rank included
	for p in "${pids[@]}"; do kill -TERM -- "-$p" 2>/dev/null || true; done
	[[ ${#pids[@]} -eq 0 ]] || sleep 0.5
	for p in "${pids[@]}"; do kill -KILL -- "-$p" 2>/dev/null || true; done
	for ((i = 0; i < N; i++)); do
		ip netns del "${ns[$i]}" 2>/dev/null || true
		ip link del "fyh$tag-$i" 2>/dev/null || true
	done
	ip link del "$br" 2>/dev/null || true
	if [[ $keep -eq 1 ]]; then echo "netns-test: logs kept in $tmp"; else rm -rf "$tmp"; fi
}
trap cleanup EXIT
trap 'exit 130' INT TERM

ip link add "$br" type bridge
ip link set "$br" up
for ((i = 0; i < N; i++)); do
	ip netns add "${ns[$i]}"
	ip link add "fyh$tag-$i" type veth peer name eth0 netns "${ns[$i]}"
	ip link set "fyh$tag-$i" master "$br" up
	ip -n "${ns[$i]}" link set lo up
	ip -n "${ns[$i]}" addr add "$NET.$((i + 1))/24" dev eth0
	ip -n "${ns[$i]}" link set eth0 up
done
# no wait for the links: the bootstrap and the transport retry their connects until the deadline

# start_ranks NAME ARGS...: one rank per namespace of $prog, torchrun's variables only (and extra[i])
extra=("" "" "")
prog=$bin
start_ranks()
{
	local run=$1 i
	shift
	pids=()
	for ((i = 0; i < N; i++)); do
		# shellcheck disable=SC2086 # extra[i] is empty or one NAME=value
		ip netns exec "${ns[$i]}" env -i PATH="$PATH" ${extra[$i]} RANK=$i WORLD_SIZE=$N \
			MASTER_ADDR=$NET.1 MASTER_PORT=$PORT FERRY_TRANSPORT=tcp \
			FERRY_LOG_LEVEL=info FERRY_LOG_FILE="$tmp/$run.%r.log" FERRY_TIMEOUT_MS=30000 \
			timeout --kill-after=5 50 "$prog" "$@" >"$tmp/$run.$i.out" 2>&1 &
		pids+=($!)
	done
}

# check_ranks NAME [WHY...]: every rank exited 0, said ok, and listened on its own namespace's
# address for the reason WHY[i] (default: the route to the rendezvous)
check_ranks()
{
	local run=$1 i rc fail=0 want whys
	shift
	whys=("$@")
	for ((i = 0; i < N; i++)); do
		rc=0
		wait "${pids[$i]}" || rc=$?
		if [[ $rc -ne 0 ]] || ! grep -q ": ok:" "$tmp/$run.$i.out"; then
			echo "netns-test: $run: rank $i failed (status $rc):"
			cat "$tmp/$run.$i.out" "$tmp/$run.$i.log" 2>/dev/null | sed 's/^/    /'
			fail=1
		else
			want=${whys[$i]:-"listening on $NET.$((i + 1)), peers dial $NET.$((i + 1)) (the local address of the route"}
			grep -qF "$want" "$tmp/$run.$i.log" && continue
			echo "netns-test: $run: rank $i's log lacks \"$want\":"
			grep "config:" "$tmp/$run.$i.log" | sed 's/^/    /'
			fail=1
		fi
	done
	pids=()
	return "$fail"
}

status=0
t0=$SECONDS
start_ranks plain --rounds 3
if check_ranks plain; then
	echo "netns-test: plain: ok in $((SECONDS - t0)) s: 3 ranks in 3 namespaces, each on its own address:"
	grep -h ": ok:" "$tmp"/plain.*.out | sed 's/^/    /'
else
	status=1
fi

t0=$SECONDS
prog=$tpbin
start_ranks transport --wait-ms 20000
tfail=0
check_ranks transport || tfail=1
if [[ $tfail -eq 0 ]]; then
	# the survivors heard the last rank's BYE: a departure, not a lost link
	for ((i = 0; i < N - 1; i++)); do
		grep -qF "tcp: rank $((N - 1)) left (it closed its connection to rank $i)" "$tmp/transport.$i.log" && continue
		echo "netns-test: transport: rank $i's log does not say rank $((N - 1)) left (its BYE was not seen):"
		grep "tcp:" "$tmp/transport.$i.log" | sed 's/^/    /'
		tfail=1
	done
fi
if [[ $tfail -eq 0 ]]; then
	echo "netns-test: transport: ok in $((SECONDS - t0)) s: the transport suite's message cases, one rank per namespace, over tcp:"
	grep -h ": ok:" "$tmp"/transport.*.out | sed 's/^/    /'
else
	status=1
fi
prog=$bin

t0=$SECONDS
extra=("" "FERRY_SOCKET_IFNAME==eth0" "FERRY_BIND_ADDR=0.0.0.0")
start_ranks rules --rounds 2
if check_ranks rules "" "listening on $NET.2, peers dial $NET.2 (interface eth0, from FERRY_SOCKET_IFNAME==eth0)" \
	"listening on 0.0.0.0, peers dial $NET.3 (FERRY_BIND_ADDR=0.0.0.0: every interface"; then
	echo "netns-test: rules: ok in $((SECONDS - t0)) s: FERRY_SOCKET_IFNAME and a wildcard FERRY_BIND_ADDR reach the peers too"
else
	status=1
fi
extra=("" "" "")

if [[ $loss -eq 1 ]]; then
	t0=$SECONDS
	victim=${ns[$((N - 1))]}
	start_ranks loss --rounds 16 --sleep-ms 250
	sleep 1.5
	if tc -n "$victim" qdisc add dev eth0 root netem loss 100% 2>/dev/null; then
		how="tc netem loss 100% on ${victim}'s eth0"
		sleep 3
		tc -n "$victim" qdisc del dev eth0 root
	else
		how="its link to the bridge down (this kernel has no sch_netem: tc netem unavailable)"
		ip link set "fyh$tag-$((N - 1))" down
		sleep 3
		ip link set "fyh$tag-$((N - 1))" up
	fi
	if check_ranks loss; then
		slowest=$(grep -ho "slowest round [0-9]*" "$tmp"/loss.*.out | awk '{ if ($3 > m) m = $3 } END { print m + 0 }')
		if [[ $slowest -ge 1000 ]]; then
			echo "netns-test: loss: ok in $((SECONDS - t0)) s: rank $((N - 1)) lost every packet for 3 s ($how); slowest round ${slowest} ms, values intact:"
			grep -h ": ok:" "$tmp"/loss.*.out | sed 's/^/    /'
		else
			echo "netns-test: loss: FAILED: the slowest round took ${slowest} ms: the 3 s outage ($how) never reached the ranks"
			status=1
		fi
	else
		status=1
	fi
fi
exit "$status"
