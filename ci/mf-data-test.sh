#!/usr/bin/env bash
# ci/mf-data-test.sh - ferry-mf on rating files as people have them, end to end: the MovieLens
# layouts of tests/data/movielens-tiny/ (made by its make.py: MovieLens itself cannot be installed
# here), MatrixMarket files made from it, --test FILE, --test-frac, --save then --load,
# --time-budget, the per-epoch JSON (read with jq), and the messages for a bad file and bad
# options. It checks what the run writes, never how fast it ran.
#
#   bash ci/mf-data-test.sh [--build-dir DIR]
#
# ctest runs it as `mf_data_cli` (a few seconds). Needs jq (bash ci/deps.sh build).
set -euo pipefail

build=build
while [[ $# -gt 0 ]]; do
	case $1 in
	--build-dir) build=$2; shift ;;
	-h | --help) sed -n '2,10s/^# \{0,1\}//p' "$0"; exit 0 ;;
	*) echo "mf-data-test: unknown option '$1'" >&2; exit 2 ;;
	esac
	shift
done
here=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
data=$here/tests/data/movielens-tiny
mf=$build/bench/ferry-mf
[[ -x $mf ]] || { echo "mf-data-test: $mf is missing; build first" >&2; exit 2; }
command -v jq >/dev/null || { echo "mf-data-test: no jq (bash ci/deps.sh build)" >&2; exit 2; }
tmp=$(mktemp -d /tmp/ferry-mf-data.XXXXXX)
trap 'rm -rf "$tmp"' EXIT

fail() { echo "mf-data-test: FAILED: $*"; exit 1; }
# check FILE JQ-EXPR WHAT: the expression must be true on FILE
check()
{
	jq -e "$2" "$1" >/dev/null || fail "$3 ($(jq -c "$2" "$1" 2>&1 | head -c 200))"
}
run() { timeout --kill-after=5 60 "$mf" "$@"; }

common=(--rank 4 --lr 0.05 --decay 0.98 --nodes 2)

# 1. ratings.csv with its header, the test ratings from test.csv, factors saved
run --input "$data/ratings.csv" --test "$data/test.csv" "${common[@]}" --epochs 15 \
	--json "$tmp/a.json" --save "$tmp/f" >"$tmp/a.out" || fail "the csv run exited $?"
check "$tmp/a.json" '.format == "csv" and .rows == 150 and .cols == 100 and .test_left_out == 2' \
	"ids remapped to 150 users x 100 movies, 2 unknown test ratings left out"
check "$tmp/a.json" '[.runs.dynamic.epochs[] | (.seconds, .train_loss, .train_rmse, .test_rmse,
	.elapsed_seconds, .bytes_sent) | numbers] | length == 15 * 6' \
	"every epoch has loss, RMSE (train and test), time and bytes sent"
check "$tmp/a.json" '.runs.dynamic.epochs | (.[-1].test_rmse < 0.8 * .[0].test_rmse)' \
	"the held-out RMSE fell during training"
check "$tmp/a.json" '.runs.dynamic.epochs | ([.[].elapsed_seconds] | . == sort)' \
	"elapsed time grows epoch by epoch"
for f in factors.json W.f32 H.f32 rows.txt cols.txt; do
	[[ -s $tmp/f/$f ]] || fail "--save wrote no $f"
done
[[ $(stat -c %s "$tmp/f/W.f32") -eq $((150 * 4 * 4)) ]] || fail "W.f32 is not 150 x 4 floats"
[[ $(head -n 1 "$tmp/f/rows.txt") == "$(sed -n 2p "$data/ratings.csv" | cut -d, -f1)" ]] ||
	fail "rows.txt does not start with the first user id of ratings.csv"
check "$tmp/f/factors.json" '.format == "ferry-mf-factors" and .ids == "raw" and .rank == 4' \
	"factors.json describes the factors"
echo "mf-data-test: csv + test.csv + --save: ok ($(jq -r '.runs.dynamic.final_test_rmse' "$tmp/a.json") test RMSE)"

# 2. the same data as ratings.dat, continued from the saved factors
run --input "$data/ratings.dat" --test "$data/test.csv" --nodes 3 --epochs 2 --load "$tmp/f" \
	--lr 0.03 --json "$tmp/b.json" >"$tmp/b.out" || fail "the --load run exited $?"
grep -q 'load: .*150 x 100 factors of rank 4' "$tmp/b.out" || fail "--load did not say what it read"
jq -e --slurpfile a "$tmp/a.json" \
	'.runs.dynamic.epochs[0].train_loss < 1.1 * $a[0].runs.dynamic.epochs[-1].train_loss' \
	"$tmp/b.json" >/dev/null || fail "a --load run did not start where the saved run ended"
echo "mf-data-test: ratings.dat + --load: ok"

# 3. u.data (tabs), 10% held out, under a time budget
run --input "$data/u.data" --test-frac 0.1 "${common[@]}" --epochs 1000 --time-budget 0.3 \
	--json "$tmp/c.json" >"$tmp/c.out" || fail "the u.data run exited $?"
check "$tmp/c.json" '.format == "tsv" and .test_nnz == 409 and .train_nnz == 3683' \
	"--test-frac 0.1 held out 10% of 4092 ratings"
check "$tmp/c.json" '.runs.dynamic.stopped_by_time_budget and (.runs.dynamic.epochs | length) < 1000' \
	"--time-budget stopped training early"
echo "mf-data-test: u.data + --test-frac + --time-budget: ok ($(jq '.runs.dynamic.epochs | length' "$tmp/c.json") epochs)"

# 4. MatrixMarket files: --test FILE beside --test-nnz (issue 17), factors saved by index
awk -F '\t' -v dir="$tmp" '
	!($1 in u) { u[$1] = ++nu } !($2 in m) { m[$2] = ++nm }
	{ line[NR] = u[$1] " " m[$2] " " $3 }
	END {
		ntest = int(NR / 10)
		f = dir "/train.mtx"; g = dir "/test.mtx"
		print "%%MatrixMarket matrix coordinate real general" > f
		print nu, nm, NR - ntest > f
		print "%%MatrixMarket matrix coordinate real general" > g
		print nu, nm, ntest > g
		for (k = 1; k <= NR; k++)
			print line[k] > (k <= NR - ntest ? f : g)
	}' "$data/u.data"
run --input "$tmp/train.mtx" --test "$tmp/test.mtx" "${common[@]}" --epochs 10 --save "$tmp/fm" \
	--json "$tmp/m.json" >"$tmp/m.out" || fail "the MatrixMarket run exited $?"
check "$tmp/m.json" '.format == "mm" and .test == "'"$tmp/test.mtx"'" and .test_nnz == 409 and
	.train_nnz == 3683 and (.runs.dynamic.epochs | all(.test_rmse | type == "number"))' \
	"--test FILE.mtx gives a held-out RMSE every epoch"
check "$tmp/fm/factors.json" '.ids == "index" and .rows == 150' "MatrixMarket factors are saved by index"
[[ $(sed -n 150p "$tmp/fm/rows.txt") == 150 ]] || fail "rows.txt of a MatrixMarket run is not 1..150"
run --input "$tmp/train.mtx" --test-nnz 100 --load "$tmp/fm" --epochs 1 >"$tmp/m2.out" ||
	fail "--load of MatrixMarket factors exited $?"
rc=0
run --input "$data/ratings.csv" --load "$tmp/fm" --epochs 1 >"$tmp/m3.out" 2>&1 || rc=$?
[[ $rc -eq 1 ]] && grep -q 'load factors saved from the same kind of file' "$tmp/m3.out" ||
	fail "--load of MatrixMarket factors for a rating file: status $rc, $(head -n 2 "$tmp/m3.out")"
echo "mf-data-test: MatrixMarket --test and --save/--load by index: ok"

# 5. what a user gets wrong
printf 'userId,movieId,rating\n1,2,4.0\n1,3,four\n' >"$tmp/bad.csv"
rc=0
run --input "$tmp/bad.csv" >"$tmp/d.out" 2>&1 || rc=$?
[[ $rc -eq 1 ]] || fail "a bad rating file exited $rc, not 1"
grep -q "bad.csv:3: rating 'four' is not a number" "$tmp/d.out" || fail "no line number: $(cat "$tmp/d.out")"
rc=0
run --input "$data/ratings.csv" --mode both --save "$tmp/g" >"$tmp/e.out" 2>&1 || rc=$?
[[ $rc -eq 2 ]] && grep -q 'give --mode dynamic or classic' "$tmp/e.out" ||
	fail "--save with --mode both: status $rc, $(head -n 1 "$tmp/e.out")"
rc=0
run --input "$data/ratings.csv" --load "$tmp/f" --rank 8 >"$tmp/h.out" 2>&1 || rc=$?
[[ $rc -eq 1 ]] && grep -q 'holds factors of rank 4, --rank asks for 8' "$tmp/h.out" ||
	fail "--load of another rank: status $rc, $(head -n 1 "$tmp/h.out")"
echo "mf-data-test: messages: ok"
echo "mf-data-test: ok"
