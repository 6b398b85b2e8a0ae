#!/usr/bin/env bash
# ci/dp-procs-test.sh - ferry-dp with its nodes as processes gives the results it gives with its
# nodes as threads (bench/dp/, docs/dp.md "Processes"). The same command (generated set, 30
# iterations, every scheme) runs three times:
#
#   threads    ferry-dp --workers 3 (one process, ferry_local_cluster_open)
#   ferry      3 processes started here with FERRY_RANK, FERRY_WORLD and FERRY_RENDEZVOUS
#   mpirun     mpirun -np 3 (Ferry takes rank and world from Open MPI's environment and meets its
#              peers through mpirun's PMIx server); skipped when there is no mpirun
#
# and the JSON files are compared: the same schemes and evaluation points; `allreduce`'s test
# losses and accuracies bit for bit (its sums are reduced in one fixed order whatever carries the
# nodes); `ps` within 1e-4 of the threads' losses (pushes are added at the owners in arrival
# order: float rounding, carried along by SGD); `ssp` within 20% (which clocks a read holds
# depends on the timing, up to the staleness bound); every LB-BSP split sums to the global
# batch; only rank 0 prints points. Then --duty's bounds and its record in the JSON. About 6 s.
#
#   bash ci/dp-procs-test.sh [--build-dir DIR] [--no-mpirun]
set -euo pipefail

build=build
use_mpirun=1
while [[ $# -gt 0 ]]; do
	case $1 in
	--build-dir) build=$2; shift ;;
	--no-mpirun) use_mpirun=0 ;;
	-h | --help) sed -n '2,17s/^# \{0,1\}//p' "$0"; exit 0 ;;
	*) echo "dp-procs-test: unknown option '$1'" >&2; exit 2 ;;
	esac
	shift
done
bin=$build/bench/ferry-dp
[[ -x $bin ]] || { echo "dp-procs-test: $bin is missing; build first" >&2; exit 2; }
command -v jq >/dev/null || { echo "dp-procs-test: no jq (bash ci/deps.sh build)" >&2; exit 2; }
command -v mpirun >/dev/null || use_mpirun=0

tmp=$(mktemp -d /tmp/ferry-dp-procs.XXXXXX)
pids=()
cleanup() {
	for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
	[[ -n ${KEEP:-} ]] || rm -rf "$tmp"
}
trap cleanup EXIT
fail() { echo "dp-procs-test: FAIL: $*"; exit 1; }
# no launcher variables from the caller's environment
clean=(env -u MASTER_ADDR -u MASTER_PORT -u FERRY_RENDEZVOUS -u FERRY_BIND_ADDR -u RANK
       -u WORLD_SIZE -u FERRY_RANK -u FERRY_WORLD -u OMPI_COMM_WORLD_SIZE -u PMI_SIZE)
args=(--synthetic 3000 --iters 30 --eval-every 5 --lr 0.05 --batch 300 --scheme all
      --straggler 2:1.5)
export FERRY_TIMEOUT_MS=20000
# ASan (ci/test.sh's asan-ctest): leaks are checked, but not under mpirun (below)

"${clean[@]}" timeout --kill-after=5 60 "$bin" --workers 3 "${args[@]}" \
	--json "$tmp/threads.json" >"$tmp/threads.out" 2>&1 ||
	{ tail -n 20 "$tmp/threads.out"; fail "threads: ferry-dp exited $?"; }

# three processes through FERRY_* variables; a port the kernel hands out is free to reuse
port=$(/usr/bin/python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])' 2>/dev/null ||
	echo $((20000 + RANDOM % 20000)))
for r in 0 1 2; do
	"${clean[@]}" FERRY_RANK=$r FERRY_WORLD=3 FERRY_RENDEZVOUS=127.0.0.1:$port \
		timeout --kill-after=5 60 "$bin" "${args[@]}" --json "$tmp/ferry$r.json" \
		>"$tmp/ferry$r.out" 2>&1 &
	pids+=($!)
done
rc=0
for p in "${pids[@]}"; do wait "$p" || rc=$?; done
pids=()
[[ $rc -eq 0 ]] || { tail -n 20 "$tmp"/ferry*.out; fail "FERRY_* processes: exit $rc"; }
[[ -f $tmp/ferry0.json && ! -e $tmp/ferry1.json && ! -e $tmp/ferry2.json ]] ||
	fail "FERRY_* processes: want a JSON file from rank 0 alone"
grep -q '^  allreduce' "$tmp/ferry1.out" && fail "rank 1 printed points; rank 0 alone reports"
runs=(ferry0)

if [[ $use_mpirun -eq 1 ]]; then
	root=()
	[[ $(id -u) -ne 0 ]] || root=(--allow-run-as-root)
	# Open MPI's PMIx client keeps what it allocated after the run: no leak check there
	ASAN_OPTIONS="${ASAN_OPTIONS:+$ASAN_OPTIONS:}detect_leaks=0" \
	"${clean[@]}" timeout --kill-after=10 90 mpirun -np 3 "${root[@]}" --oversubscribe \
		-x FERRY_TIMEOUT_MS -x ASAN_OPTIONS "$bin" "${args[@]}" --json "$tmp/mpirun.json" \
		>"$tmp/mpirun.out" 2>&1 || { tail -n 20 "$tmp/mpirun.out"; fail "mpirun exited $?"; }
	runs+=(mpirun)
else
	echo "dp-procs-test: no mpirun (Debian: openmpi-bin): the mpirun run is skipped"
fi

for run in "${runs[@]}"; do
	f=$tmp/$run.json
	jq -e '.nodes == "processes" and .workers == 3' "$f" >/dev/null ||
		fail "$run: the JSON does not say 3 nodes as processes"
	jq -e '.nodes == "threads"' "$tmp/threads.json" >/dev/null || fail "threads: not threads"
	# the same schemes and points
	jq -e --slurpfile t "$tmp/threads.json" '
		[.runs[] | [.scheme, [.points[].iter]]] == [$t[0].runs[] | [.scheme, [.points[].iter]]]
		and (.runs | length == 5)' "$f" >/dev/null ||
		fail "$run: other schemes or evaluation points than the threads' run"
	jq -e --slurpfile t "$tmp/threads.json" '
		[.runs[] | select(.scheme == "allreduce") | .points[] | [.test_loss, .test_acc]] ==
		[$t[0].runs[] | select(.scheme == "allreduce") | .points[] | [.test_loss, .test_acc]]' \
		"$f" >/dev/null || fail "$run: allreduce's losses differ from the threads' run"
	# ps within 1e-4 of the threads' losses; ssp's reads are as stale as the timing makes them
	# (up to 3 clocks): within 20% of the threads' losses at every point
	for s in ps:1e-4:0 ssp:0:0.2; do
		IFS=: read -r name abs rel <<<"$s"
		jq -e --slurpfile t "$tmp/threads.json" --arg s "$name" --argjson abs "$abs" \
			--argjson rel "$rel" '
			[.runs[] | select(.scheme == $s) | .points[].test_loss] as $a |
			[$t[0].runs[] | select(.scheme == $s) | .points[].test_loss] as $b |
			($a | length) == ($b | length) and ($a | length) > 2 and
			all(range(0; $a | length); . as $i | (($a[$i] - $b[$i]) | fabs) <= $abs + $rel * $b[$i]) and
			$a[-1] < 0.7 * $a[0]' "$f" >/dev/null ||
			fail "$run: $name's losses differ from the threads' run by more than" \
				"$abs + $rel x, or do not fall"
	done
	jq -e '[.runs[] | select(.scheme == "lbbsp") | .points[].batch | add] | all(. == 300)' \
		"$f" >/dev/null || fail "$run: an LB-BSP split does not sum to the global batch"
	echo "dp-procs-test: $run: ok"
done
# --duty (docs/dp.md): in (0, 1], said in the JSON; out of range refused with exit 2
for d in 0 1.5 x; do
	rc=0
	"${clean[@]}" "$bin" --workers 2 --duty "$d" --synthetic 300 --iters 2 >/dev/null 2>&1 || rc=$?
	[[ $rc -eq 2 ]] || fail "--duty $d: exit $rc, not 2"
done
"${clean[@]}" timeout --kill-after=5 60 "$bin" --workers 2 --duty 0.5 --straggler 1:2 \
	--synthetic 600 --iters 10 --eval-every 5 --scheme lbbsp --json "$tmp/duty.json" \
	>"$tmp/duty.out" 2>&1 || { tail -n 20 "$tmp/duty.out"; fail "--duty 0.5: exit $?"; }
jq -e '.duty == 0.5' "$tmp/duty.json" >/dev/null || fail "--duty 0.5: not in the JSON"
echo "dp-procs-test: ok: ${runs[*]} agree with the threads' run; --duty checked"
