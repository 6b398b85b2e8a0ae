#!/usr/bin/env bash
# bench/reloc-vs-10gbe.sh - what relocating one key costs, in raw round trips of the link it
# crosses, link by link; one table at the end.
#
#   bash bench/reloc-vs-10gbe.sh [options]
#
# Links (each is skipped, with the reason, when it cannot run here):
#   loopback     ferry-bench's nodes as threads of one process over 127.0.0.1 (the reference)
#   veth-10gbit  two network namespaces joined by a veth pair, each end shaped by
#                `tc qdisc ... tbf rate 10gbit`; one ferry-bench process per namespace, joined
#                as an external cluster (FERRY_RANK / FERRY_WORLD / FERRY_RENDEZVOUS /
#                FERRY_BIND_ADDR), addresses 10.99.0.1 and 10.99.0.2. Needs root (ip netns).
#                The kernel here has no netem, so no propagation delay is added: the link is
#                veth's software path with a 10 Gbit/s token bucket.
#   vm-rxe       inside the SoftRoCE guest (ci/softroce-vm.sh --cmd): --transport rdma on rxe0,
#                blocking and busy-poll (--wait both), with --timeline. The raw round trip is
#                perftest's in that guest run, like for like: 2 x `ib_send_lat -e` (sleeping
#                on CQ events) for the blocking rows, 2 x `ib_send_lat` (busy-polling) for
#                the busy-poll rows (perftest reports half a round trip); ferry-bench's
#                footer names the floor of each. When --transport rdma fails, the row says
#                why and the TCP rows still print.
#   vm-tcp       the same guest run, --transport tcp over 10.77.0.1 (blocking)
# Then, for each size: rxe relocation against tcp relocation in the same guest (goal: rxe at
# least 3x faster) and against the veth link (the host's, not the guest's: other CPUs), and
# a projection of the hardware figure from rxe's timeline: its wire steps at a published
# ConnectX-4 ib_send_lat (--hw-oneway, source in docs/benchmarks.md), its CPU steps as
# measured in the guest. A projection is not a measurement, and says so.
# ferry-bench measures the raw round trip itself (a TCP ping-pong between the same two nodes
# over the same link, with the bytes the relocation put on the wire), except for vm-rxe.
#
# Options:
#   --build-dir DIR   the build tree holding bench/ferry-bench (default: build)
#   --sizes LIST      value sizes in bytes (default 8,4096)
#   --iters N         relocations per size and link (default 1000; the VM uses --vm-iters)
#   --vm-iters N      relocations per size inside the VM (default 200)
#   --mode MODE       dynamic (default) or classic
#   --rate RATE       the tbf rate of the veth link (default 10gbit)
#   --hw-oneway LIST  the published one-way latencies the projection uses, BYTES:US,...
#                     (default 32:0.82,4096:2.25: ib_send_lat medians, ConnectX-4 EDR,
#                     docs/benchmarks.md)
#   --no-loopback, --no-veth, --no-vm   leave a link out
#   --vm-timeout SECS bound for the whole VM run (default 900)
#   --vm-cmds         print the two guest commands of the VM link, one per line, and exit: to
#                     run them in a boot of your own (ci/softroce-vm.sh --cmd "$(sed -n 1p)"
#                     --cmd "$(sed -n 2p)", after other tests) and then use --vm-log
#   --vm-log FILE     no boot: the VM link's figures from FILE, the serial log of an earlier
#                     ci/softroce-vm.sh run (its --log) whose commands were --vm-cmds'
#   --json-dir DIR    keep each link's ferry-bench JSON there (default: a temporary folder)
#   -h, --help
#
# Everything it creates (namespaces, the veth pair, its qdiscs, processes) is removed on exit.
# Exit status: 0 when every link that ran gave rows; 1 when one failed; 2 for bad options.
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
repo=$(cd "$here/.." && pwd)

build_dir=build
sizes=8,4096
iters=1000
vm_iters=200
mode=dynamic
rate=10gbit
hw_oneway=32:0.82,4096:2.25
do_loop=1
do_veth=1
do_vm=1
vm_timeout=900
vm_log=
print_cmds=0
json_dir=

say() { printf 'reloc-vs-10gbe: %s\n' "$*"; }
die()
{
	printf 'reloc-vs-10gbe: error: %s\n' "$*" >&2
	exit 2
}
usage() { sed -n '2,/^set -euo/{/^set -euo/d;s/^# \{0,1\}//;p}' "$0"; }
need_arg() { [[ $# -ge 2 ]] || die "$1 needs a value"; }

while [[ $# -gt 0 ]]; do
	case $1 in
	--build-dir) need_arg "$@"; build_dir=$2; shift 2 ;;
	--sizes) need_arg "$@"; sizes=$2; shift 2 ;;
	--iters) need_arg "$@"; iters=$2; shift 2 ;;
	--vm-iters) need_arg "$@"; vm_iters=$2; shift 2 ;;
	--mode) need_arg "$@"; mode=$2; shift 2 ;;
	--rate) need_arg "$@"; rate=$2; shift 2 ;;
	--hw-oneway) need_arg "$@"; hw_oneway=$2; shift 2 ;;
	--no-loopback) do_loop=0; shift ;;
	--no-veth) do_veth=0; shift ;;
	--no-vm) do_vm=0; shift ;;
	--vm-timeout) need_arg "$@"; vm_timeout=$2; shift 2 ;;
	--vm-cmds) print_cmds=1; shift ;;
	--vm-log) need_arg "$@"; vm_log=$2; shift 2 ;;
	--json-dir) need_arg "$@"; json_dir=$2; shift 2 ;;
	-h | --help) usage; exit 0 ;;
	*) die "unknown option '$1' (see --help)" ;;
	esac
done
[[ $sizes =~ ^[0-9]+(,[0-9]+)*$ ]] || die "--sizes wants a comma-separated list of bytes"
command -v jq >/dev/null 2>&1 || die "jq reads ferry-bench's JSON and is missing: bash ci/deps.sh build"
[[ $iters =~ ^[1-9][0-9]*$ ]] || die "--iters wants a number"
[[ $vm_iters =~ ^[1-9][0-9]*$ ]] || die "--vm-iters wants a number"
[[ $vm_timeout =~ ^[1-9][0-9]*$ ]] || die "--vm-timeout wants seconds"
[[ -z $vm_log || -r $vm_log ]] || die "--vm-log: cannot read '$vm_log'"
[[ $rate =~ ^[0-9]+[kmgKMG]?bit$ ]] || die "--rate wants a tc rate such as 10gbit"
[[ $hw_oneway =~ ^[0-9]+:[0-9.]+(,[0-9]+:[0-9.]+)*$ ]] || die "--hw-oneway wants BYTES:US,..."
case $mode in dynamic | classic) ;; *) die "--mode wants dynamic or classic" ;; esac

# The VM link's two guest commands: rdma (both wait modes, the timeline), then tcp.
# perftest's outputs are in the guest's /tmp (the VM script runs them before the commands).
guest_common="-s move --mode $mode --sizes $sizes --iters $vm_iters --bind 10.77.0.1"
# the floors perftest gave in the guest (a floor that failed is left out, and the footer
# says what each row was compared with)
# shellcheck disable=SC2016 # expanded by the guest shell
floors='f=--baseline-cycles; for b in ib_send_lat ib_write_lat; do grep -qs "^ *[0-9]" /tmp/$b.client && f="$f --baseline-file /tmp/$b.client"; done; grep -qs "^ *[0-9]" /tmp/ib_send_lat-e.client && f="$f --baseline-events /tmp/ib_send_lat-e.client"'
cmd_rdma="$floors; ferry-bench $guest_common --transport rdma --wait both --timeline --hw-oneway $hw_oneway --link rxe \$f --json /tmp/rxe.json; rc=\$?; echo FBJSON-BEGIN rxe; cat /tmp/rxe.json 2>/dev/null; echo FBJSON-END rxe; exit \$rc"
cmd_tcp="ferry-bench $guest_common --transport tcp --link vm-tcp --json /tmp/tcp.json; rc=\$?; echo FBJSON-BEGIN tcp; cat /tmp/tcp.json 2>/dev/null; echo FBJSON-END tcp; exit \$rc"
if [[ $print_cmds -eq 1 ]]; then
	printf '%s\n' "$cmd_rdma" "$cmd_tcp"
	exit 0
fi

bench=$build_dir/bench/ferry-bench
[[ -x $bench ]] || die "$bench not found: build it (cmake --build $build_dir --target ferry-bench)"
bench=$(cd "$(dirname "$bench")" && pwd)/ferry-bench

# ---------------------------------------------------------------------------------------------
# Cleanup: what this script made, and only that.

tag=$$
ns_a=ferry-bench-a-$tag
ns_b=ferry-bench-b-$tag
veth_a=fbv${tag}a
veth_b=fbv${tag}b
made_ns=()
pids=()
work=$(mktemp -d "${TMPDIR:-/tmp}/ferry-reloc.XXXXXX")
# shellcheck disable=SC2317 # reached through the trap
cleanup()
{
	local rc=$? p n
	for p in "${pids[@]}"; do
		kill "$p" 2>/dev/null || true
	done
	for p in "${pids[@]}"; do
		wait "$p" 2>/dev/null || true
	done
	# deleting a namespace deletes the veth end and the qdisc inside it
	for n in "${made_ns[@]}"; do
		ip netns del "$n" 2>/dev/null || true
	done
	ip link del "$veth_a" 2>/dev/null || true
	rm -rf "$work"
	exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

if [[ -n $json_dir ]]; then
	mkdir -p "$json_dir"
	json_dir=$(cd "$json_dir" && pwd)
else
	json_dir=$work
fi

common=(-s move --mode "$mode" --sizes "$sizes")
status=0
notes=()

# rows file: link transport wait op bytes p50 p99 base_name base_p50 base_p99 ratio
rows=$work/rows
: >"$rows"

# Appends the move rows of ferry-bench JSON $2 under link name $1.
collect()
{
	jq -r --arg link "$1" '.context.transport as $tp | .results[] |
		select(.scenario == "localize" and (.op == "move-home" or .op == "move-third")) |
		[$link, $tp, (if .wait == "busy-poll" then "busy" else "blk" end), .op,
		 .value_bytes, .p50_us, .p99_us, (.baseline // "-"),
		 (.baseline_p50_us // 0), (.baseline_p99_us // 0), (.ratio // "null")] |
		map(tostring) | join(" ")' "$2" >>"$rows"
}
# Does ferry-bench JSON $1 hold localize rows?
has_moves()
{
	jq -e '[.results[] | select(.scenario == "localize")] | length > 0' "$1" >/dev/null 2>&1
}

# ---------------------------------------------------------------------------------------------
# loopback

if [[ $do_loop -eq 1 ]]; then
	say "loopback: ferry-bench ${common[*]} --iters $iters (load $(cut -d' ' -f1-3 /proc/loadavg))"
	if timeout --kill-after=10 600 "$bench" "${common[@]}" --iters "$iters" --link loopback \
		--json "$json_dir/loopback.json" >"$work/loopback.out" 2>&1; then
		collect loopback "$json_dir/loopback.json"
	else
		say "loopback: ferry-bench failed:"
		grep -E 'FAILED|error' "$work/loopback.out" | sed 's/^/  | /' || tail -n 5 "$work/loopback.out"
		notes+=("loopback: ferry-bench failed (see above)")
		status=1
	fi
fi

# ---------------------------------------------------------------------------------------------
# veth, two namespaces, tbf 10gbit

veth_run()
{
	local port=29500 rc0=0 rc1=0 pid1
	ip netns add "$ns_a" || return 1
	made_ns+=("$ns_a")
	ip netns add "$ns_b" || return 1
	made_ns+=("$ns_b")
	ip link add "$veth_a" type veth peer name "$veth_b" || return 1
	ip link set "$veth_a" netns "$ns_a" || return 1
	ip link set "$veth_b" netns "$ns_b" || return 1
	ip -n "$ns_a" addr add 10.99.0.1/24 dev "$veth_a" || return 1
	ip -n "$ns_b" addr add 10.99.0.2/24 dev "$veth_b" || return 1
	ip -n "$ns_a" link set lo up
	ip -n "$ns_b" link set lo up
	ip -n "$ns_a" link set "$veth_a" up || return 1
	ip -n "$ns_b" link set "$veth_b" up || return 1
	# burst: at least rate/HZ; 1 MB covers 10 Gbit/s at HZ=100. latency bounds the queue.
	tc -n "$ns_a" qdisc add dev "$veth_a" root tbf rate "$rate" burst 1mb latency 10ms || return 1
	tc -n "$ns_b" qdisc add dev "$veth_b" root tbf rate "$rate" burst 1mb latency 10ms || return 1
	say "veth: $ns_a 10.99.0.1 <-> $ns_b 10.99.0.2, tbf rate $rate on both ends"

	ip netns exec "$ns_b" env FERRY_RANK=1 FERRY_WORLD=2 FERRY_RENDEZVOUS=10.99.0.1:$port \
		FERRY_BIND_ADDR=10.99.0.2 timeout --kill-after=10 600 "$bench" --external \
		"${common[@]}" --iters "$iters" --link "veth-$rate" >"$work/veth1.out" 2>&1 &
	pid1=$!
	pids+=("$pid1")
	ip netns exec "$ns_a" env FERRY_RANK=0 FERRY_WORLD=2 FERRY_RENDEZVOUS=10.99.0.1:$port \
		FERRY_BIND_ADDR=10.99.0.1 timeout --kill-after=10 600 "$bench" --external \
		"${common[@]}" --iters "$iters" --link "veth-$rate" --json "$json_dir/veth.json" \
		>"$work/veth0.out" 2>&1 || rc0=$?
	wait "$pid1" || rc1=$?
	if [[ $rc0 -ne 0 || $rc1 -ne 0 ]]; then
		say "veth: ferry-bench failed (rank 0 status $rc0, rank 1 status $rc1):"
		cat "$work/veth0.out" "$work/veth1.out" | grep -E 'FAILED|error' | sed 's/^/  | /' || true
		return 1
	fi
	return 0
}

if [[ $do_veth -eq 1 ]]; then
	if [[ $(id -u) -ne 0 ]]; then
		say "veth: skipped: network namespaces need root"
		notes+=("veth-$rate: skipped (not root)")
	elif ! command -v tc >/dev/null 2>&1 || ! command -v ip >/dev/null 2>&1; then
		say "veth: skipped: ip and tc (iproute2) are needed"
		notes+=("veth-$rate: skipped (no iproute2)")
	else
		say "veth: ferry-bench --external ${common[*]} --iters $iters, 2 processes (load $(cut -d' ' -f1-3 /proc/loadavg))"
		if veth_run; then
			collect "veth-$rate" "$json_dir/veth.json"
		else
			notes+=("veth-$rate: failed (see above)")
			status=1
		fi
	fi
fi

# ---------------------------------------------------------------------------------------------
# the SoftRoCE VM: rxe and tcp in the same guest run

# Prints the JSON a guest command printed between its markers in the serial log.
vm_json()
{
	tr -d '\r' <"$1" | awk -v tag="$2" '
		$0 == "  | FBJSON-BEGIN " tag { on = 1; next }
		$0 == "  | FBJSON-END " tag { on = 0; next }
		on { sub(/^  \| /, ""); print }'
}

if [[ $do_vm -eq 1 ]]; then
	vrc=0
	if [[ -n $vm_log ]]; then
		say "vm: the figures of an earlier run, from $vm_log (no boot)"
		tr -d '\r' <"$vm_log" >"$work/vm.log"
		grep -E '^(VMINFO|VMBASE|VMTEST|VMRESULT)' "$work/vm.log" >"$work/vm.out" || true
		grep -q '^VMRESULT' "$work/vm.log" || vrc=2
	else
		say "vm: ci/softroce-vm.sh with ferry-bench $guest_common, rdma then tcp (load $(cut -d' ' -f1-3 /proc/loadavg))"
		bash "$repo/ci/softroce-vm.sh" --build-dir "$build_dir" --tests '' --timeout "$vm_timeout" \
			--log "$work/vm.log" --cmd "$cmd_rdma" --cmd "$cmd_tcp" >"$work/vm.out" 2>&1 || vrc=$?
	fi
	# the serial log holds the timeline tables: kept with the JSON when asked
	[[ $json_dir == "$work" ]] || tr -d '\r' <"$work/vm.log" >"$json_dir/vm.log" || true
	grep -E '^(VMINFO|VMBASE|VMTEST|softroce-vm:)' "$work/vm.out" | sed 's/^/  | /' || true
	if [[ $vrc -eq 2 ]]; then
		say "vm: no verdict from the guest (status 2); last lines:"
		tail -n 15 "$work/vm.out" | sed 's/^/  | /'
		notes+=("vm: the guest never reported (see above)")
		status=1
	else
		vm_json "$work/vm.log" rxe >"$json_dir/vm-rxe.json"
		vm_json "$work/vm.log" tcp >"$json_dir/vm-tcp.json"
		if has_moves "$json_dir/vm-rxe.json"; then
			collect vm-rxe "$json_dir/vm-rxe.json"
		else
			why=$(tr -d '\r' <"$work/vm.log" | grep -m 1 -E 'FAILED|rdma was asked' |
				sed 's/^  | //' || true)
			if [[ -z $why ]]; then
				# no message of its own (a crash): the command's last lines say more
				why=$(tr -d '\r' <"$work/vm.log" |
					awk '/^VMTEST cmd1 /{on = 1; next} /^VMTEST /{on = 0} on' |
					grep -vE 'FBJSON|^  \| *$' | tail -n 2 | sed 's/^  | //' |
					tr '\n' ' ' || true)
			fi
			say "vm-rxe: --transport rdma failed: ${why:-no result}"
			notes+=("vm-rxe: --transport rdma failed: ${why:-no result}")
		fi
		if has_moves "$json_dir/vm-tcp.json"; then
			collect vm-tcp "$json_dir/vm-tcp.json"
		else
			say "vm-tcp: no result"
			notes+=("vm-tcp: no result (see the VM lines above)")
			status=1
		fi
	fi
fi

# ---------------------------------------------------------------------------------------------
# The table.

echo
printf '%-16s %-9s %-4s %-11s %7s %13s %13s %-20s %13s %13s %7s %s\n' link transport wait op \
	bytes 'reloc p50[us]' 'reloc p99[us]' 'raw round trip' 'raw p50[us]' 'raw p99[us]' ratio goal
printf '%s\n' "--------------------------------------------------------------------------------------------------------------------------------------------"
if [[ -s $rows ]]; then
	while read -r link tp wait op bytes p50 p99 bname bp50 bp99 ratio; do
		# issue 20: against the blocking floor (sleeping on CQ events) <= 3 and <= 4
		if [[ $op == move-home ]]; then goal=2; else goal=3; fi
		[[ $bname != *-e/* ]] || goal=$((goal + 1))
		verdict=$(awk -v r="$ratio" -v g="$goal" 'BEGIN {
			if (r == "null" || r == "") print "-"
			else if (r + 0 < 1) print "baseline SUSPECT (below one round trip)"
			else print (r + 0 <= g ? "<= " g " met" : "<= " g " MISSED") }')
		printf '%-16s %-9s %-4s %-11s %7s %13.1f %13.1f %-20s %13.1f %13.1f %7.2f %s\n' "$link" \
			"$tp" "$wait" "$op" "$bytes" "$p50" "$p99" "$bname" "$bp50" "$bp99" \
			"$([[ $ratio == null ]] && echo 0 || echo "$ratio")" "$verdict"
	done <"$rows"
fi
for n in "${notes[@]}"; do
	printf '%-16s %s\n' "${n%%:*}" "${n#*: }"
done
echo "ratio = relocation p50 / raw round trip p50 over the same link (goal: <= 2 owner = home, <= 3 otherwise;"
echo "against a floor that sleeps on CQ events, <= 3 and <= 4: issue 20's goals for blocking mode;"
echo "a ratio below 1 means the round trip was not measured right: SUSPECT, never met). vm-rxe's raw round"
echo "trip: 2 x ib_send_lat -e (sleeping on CQ events) for blk rows, 2 x ib_send_lat (busy-polling) for busy"
echo "rows, as the raw round trip column names them (ib_write_lat when ib_send_lat gave nothing)"

# ---------------------------------------------------------------------------------------------
# Relocation over rxe against tcp in the same guest and against veth, size by size, with the
# projection of rxe's timeline (the VM log holds its lines).

# p50 of link $1, wait $2, op $3, size $4 from the rows file; empty when absent
row_p50() { awk -v l="$1" -v w="$2" -v o="$3" -v b="$4" '$1 == l && $3 == w && $4 == o && $5 == b { print $6; exit }' "$rows"; }
# the projection of the rxe timeline table titled $1 (blocking or busy-poll rows), in us
proj_us()
{
	[[ -f $work/vm.log ]] || return 0
	tr -d '\r' <"$work/vm.log" | awk -v t="$1" '
		index($0, "# timeline: " t " (") { on = 1; next }
		index($0, "# timeline: ") { on = 0 }
		on && !done && /projection \(NOT a measurement\)/ {
			n = split($0, w, " ")
			for (i = 1; i < n; i++) if (w[i] == "=") { print w[i + 1]; done = 1; break }
		}' || true
}
if [[ -s $rows ]] && grep -q '^vm-rxe ' "$rows"; then
	echo
	echo "rxe against tcp in the same guest run, and against veth-$rate (the host: other CPUs), p50 in us:"
	printf '%-11s %7s %-4s %10s %10s %9s %-22s %12s %9s %s\n' op bytes wait rxe guest-tcp rxe/tcp \
		'goal rxe >= 3x faster' "veth-$rate" rxe/veth 'projection on ConnectX-4 (NOT measured)'
	IFS=, read -ra size_list <<<"$sizes"
	for op in move-home move-third; do
		if [[ $op == move-home ]]; then what="owner = home"; else what="owner != home"; fi
		for b in "${size_list[@]}"; do
			for wait in blk busy; do
				rx=$(row_p50 vm-rxe "$wait" "$op" "$b")
				[[ -n $rx ]] || continue
				tc_=$(row_p50 vm-tcp blk "$op" "$b")
				ve=$(row_p50 "veth-$rate" blk "$op" "$b")
				if [[ $wait == blk ]]; then wname=blocking; else wname=busy-poll; fi
				pr=$(proj_us "localize, $what, $b-byte values, $wname")
				awk -v op="$op" -v b="$b" -v w="$wait" -v rx="$rx" -v tc="$tc_" -v ve="$ve" \
					-v pr="$pr" 'BEGIN {
					r = tc != "" ? sprintf("%.2f", rx / tc) : "-"
					g = tc == "" ? "-" : (rx * 3 <= tc ? "met" : "MISSED")
					rv = ve != "" ? sprintf("%.2f", rx / ve) : "-"
					printf "%-11s %7s %-4s %10.1f %10s %9s %-22s %12s %9s %s\n", op, b, w, rx,
						tc != "" ? sprintf("%.1f", tc) : "-", r, g,
						ve != "" ? sprintf("%.1f", ve) : "-", rv,
						pr != "" ? pr " (projection)" : "-" }'
			done
		done
	done
	echo "guest-tcp: blocking. projection: rxe's timeline in that run with its wire steps (the one-way trips"
	echo "and the hand-over WRITE) at --hw-oneway $hw_oneway (published ib_send_lat medians, see"
	echo "docs/benchmarks.md) and its CPU steps as measured in the guest: not a measurement"
fi
echo "load average at the end: $(cut -d' ' -f1-3 /proc/loadavg)"
[[ $json_dir == "$work" ]] || say "JSON files in $json_dir"
exit "$status"
