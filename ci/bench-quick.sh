#!/usr/bin/env bash
# ci/bench-quick.sh - every benchmark program in its quick mode, its JSON checked with jq: the
# output must be complete and well formed (every field there, of the right type, null only where
# a figure can be missing, no failure recorded). It never judges a figure: speed is not a test.
#
#   bash ci/bench-quick.sh [--build-dir DIR]
#
#   ferry-bench --quick                        all scenarios, nodes as threads, blocking
#   ferry-bench --quick --procs --pin --wait both -s remote --sizes 8
#                                              processes, pinned, both wait modes
#   ferry-bench --quick -s move --timeline     the step medians, nodes as threads and
#                                              processes (--sizes 8)
#   ferry-mf --synthetic ...                   2 epochs, both modes
#   ferry-dp --synthetic ...                   20 iterations, every scheme
#   bench/plot.sh, bench/dp/plot.sh            when gnuplot is there (bash ci/deps.sh bench)
#
# ctest runs it as `bench_quick` (about 20 s on 2 cores; ferry-coll-mpi has its own,
# coll_mpi_quick). Needs jq (bash ci/deps.sh build).
set -euo pipefail

build=build
while [[ $# -gt 0 ]]; do
	case $1 in
	--build-dir) build=$2; shift ;;
	-h | --help) sed -n '2,17s/^# \{0,1\}//p' "$0"; exit 0 ;;
	*) echo "bench-quick: unknown option '$1'" >&2; exit 2 ;;
	esac
	shift
done
here=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
command -v jq >/dev/null || { echo "bench-quick: no jq (bash ci/deps.sh build)" >&2; exit 2; }
for b in ferry-bench ferry-mf ferry-dp; do
	[[ -x $build/bench/$b ]] || { echo "bench-quick: $build/bench/$b is missing; build first" >&2; exit 2; }
done
tmp=$(mktemp -d /tmp/ferry-bench-quick.XXXXXX)
trap 'rm -rf "$tmp"' EXIT

fail() { echo "bench-quick: FAILED: $*"; exit 1; }
# check FILE WHAT JQ-EXPR: the expression must be true on FILE
check()
{
	jq -e "$3" "$1" >/dev/null 2>"$tmp/jq.err" ||
		fail "$2 ($(basename "$1"): $(head -c 300 "$tmp/jq.err"))"
}
run() { timeout --kill-after=5 "$1" "${@:2}"; }

# a number, or null where the figure may be missing
num='(type == "number")'
numnull='(type == "number" or type == "null")'

bench_schema='
	(.context | type == "object") and
	(.context | (.program == "ferry-bench") and
		([.git_commit, .kernel, .cpu, .transport, .mode, .nodes_as, .wait, .link, .date,
		  .loadavg_start, .loadavg_end, .command] | all(type == "string")) and
		(.cores | type == "number") and (.pin | type == "boolean")) and
	(.failures == []) and
	(.results | type == "array" and length > 0) and
	(.results | all(
		([.scenario, .op, .wait, .note] | all(type == "string")) and
		(.wait == "blocking" or .wait == "busy-poll") and
		([.value_bytes, .keys, .threads, .writer] | all(type == "number")) and
		([.min_us, .mean_us, .stdev_us, .p50_us, .p99_us, .p999_us, .ops_per_s, .mb_per_s,
		  .baseline_min_us, .baseline_mean_us, .baseline_stdev_us, .baseline_p50_us,
		  .baseline_p99_us, .baseline_ops_per_s, .ratio] | all('"$numnull"')) and
		(.baseline_suspect | type == "boolean" or type == "null") and
		(if .ratio != null then .ratio > 0 else true end) and
		(if .p50_us != null and .min_us != null then .min_us <= .p50_us else true end)))'

# 1. ferry-bench, everything, as CI's smoke run
run 120 "$build/bench/ferry-bench" --quick --json "$tmp/fb.json" >"$tmp/fb.out" 2>&1 ||
	{ tail -n 20 "$tmp/fb.out"; fail "ferry-bench --quick exited $?"; }
check "$tmp/fb.json" "ferry-bench's JSON is complete" "$bench_schema"
check "$tmp/fb.json" "every scenario has rows" \
	'[.results[].scenario] | unique | . == ["local", "localize", "remote"]'
check "$tmp/fb.json" "latency rows have a baseline and a ratio" \
	'[.results[] | select(.op == "pull" or .op == "move-home")] |
	 length > 0 and all(.baseline_p50_us != null and .ratio != null and
	                    (.baseline_suspect | type == "boolean"))'
grep -q '^# goals, blocking' "$tmp/fb.out" || fail "ferry-bench printed no goals"
echo "bench-quick: ferry-bench --quick: ok ($(jq '.results | length' "$tmp/fb.json") rows)"

# 2. processes, pinned, both wait modes
run 120 "$build/bench/ferry-bench" --quick --procs --pin --wait both -s remote --sizes 8 \
	--json "$tmp/fbp.json" >"$tmp/fbp.out" 2>&1 ||
	{ tail -n 20 "$tmp/fbp.out"; fail "ferry-bench --procs --pin --wait both exited $?"; }
check "$tmp/fbp.json" "ferry-bench --procs --pin's JSON is complete" "$bench_schema"
check "$tmp/fbp.json" "both wait modes have rows" \
	'(.context.wait == "both") and (.context.pin == true) and
	 ([.results[].wait] | unique == ["blocking", "busy-poll"])'
echo "bench-quick: ferry-bench --procs --pin --wait both: ok"

# 2b. ferry-bench --timeline: every table's steps and its derived line, threads and processes
for how in threads procs; do
	extra=()
	[[ $how == procs ]] && extra=(--procs)
	run 120 "$build/bench/ferry-bench" --quick -s move --sizes 8 --iters 20 --timeline \
		"${extra[@]}" >"$tmp/fbt.out" 2>&1 ||
		{ tail -n 20 "$tmp/fbt.out"; fail "ferry-bench --timeline ($how) exited $?"; }
	for t in 'push, one key of rank 1' 'localize, owner = home' 'localize, owner != home'; do
		grep -q "^# timeline: $t" "$tmp/fbt.out" || fail "--timeline ($how) printed no '$t' table"
	done
	[[ $(grep -c '^#   derived: round trip' "$tmp/fbt.out") -eq 3 ]] ||
		fail "--timeline ($how) printed no derived line for every table"
	grep -qE '^#   1 +home +LOCALIZE received' "$tmp/fbt.out" ||
		fail "--timeline ($how) has no step of the home (rank 1)"
	! grep -q 'stamps dropped' "$tmp/fbt.out" || fail "--timeline ($how) dropped stamps"
done
echo "bench-quick: ferry-bench --timeline (threads, procs): ok"

# 3. ferry-mf
run 120 "$build/bench/ferry-mf" --synthetic 3000x300:60000:4 --rank 8 --epochs 2 --mode both \
	--json "$tmp/mf.json" >"$tmp/mf.out" 2>&1 || { tail -n 20 "$tmp/mf.out"; fail "ferry-mf exited $?"; }
check "$tmp/mf.json" "ferry-mf's JSON is complete" '
	(.program == "ferry-mf") and (.format == "synthetic") and (.speedup | '"$num"') and
	([.rows, .cols, .train_nnz, .test_nnz, .nodes, .threads, .rank, .epochs] | all('"$num"')) and
	(.runs | keys == ["classic", "dynamic"]) and
	(.runs | to_entries | all(.value |
		(.epochs | length == 2) and (.stopped_by_time_budget == false) and
		(.epochs | all([.seconds, .elapsed_seconds, .train_loss, .train_rmse, .test_rmse,
		                .bytes_sent, .lr, .local_ops, .remote_ops, .comm_share] |
		               all('"$num"')))))'
echo "bench-quick: ferry-mf: ok"

# 4. ferry-dp
run 120 "$build/bench/ferry-dp" --synthetic 2000 --iters 20 --eval-every 10 --workers 2 \
	--scheme all --json "$tmp/dp.json" >"$tmp/dp.out" 2>&1 || { tail -n 20 "$tmp/dp.out"; fail "ferry-dp exited $?"; }
check "$tmp/dp.json" "ferry-dp's JSON is complete" '
	(.program == "ferry-dp") and (.runs | length == 5) and
	(.runs | all((.time_to_target_s | '"$numnull"') and (.points | length > 0) and
		(.points | all(([.iter, .time_s, .test_loss, .test_acc] | all('"$num"')) and
		               (.batch | length == 2)))))'
echo "bench-quick: ferry-dp: ok"

# 5. the plot scripts read the files (gnuplot is in the bench group, not always there)
if command -v gnuplot >/dev/null; then
	bash "$here/bench/plot.sh" "$tmp/fb.json" "$tmp/png" >/dev/null || fail "bench/plot.sh"
	bash "$here/bench/dp/plot.sh" "$tmp/dp.json" "$tmp/png" >/dev/null || fail "bench/dp/plot.sh"
	n=$(find "$tmp/png" -name '*.png' -size +1k | wc -l)
	[[ $n -ge 9 ]] || fail "the plot scripts drew $n plots, want 9"
	echo "bench-quick: plots: ok ($n)"
else
	echo "bench-quick: plots: skipped (no gnuplot; bash ci/deps.sh bench)"
fi
echo "bench-quick: ok"
