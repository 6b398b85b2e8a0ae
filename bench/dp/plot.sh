#!/usr/bin/env bash
# bench/dp/plot.sh - plot a ferry-dp JSON file: test loss and test accuracy against wall time, one
# line per scheme, and LB-BSP's per-worker batch sizes against iterations.
#
#   bash bench/dp/plot.sh FILE.json [OUTDIR]
#
# Writes <name>-loss.png, <name>-acc.png and (when the file has an lbbsp run) <name>-batch.png
# into OUTDIR (default: the JSON file's folder), <name> the file's name without .json. Needs
# gnuplot (Debian gnuplot-nox: `bash ci/deps.sh bench`) and jq (`bash ci/deps.sh build`).
# Exit status: 0, 1 no plot made, 2 bad arguments.
set -euo pipefail

case ${1:-} in
-h | --help) sed -n '2,10s/^# \{0,1\}//p' "$0"; exit 0 ;;
'') sed -n '2,10s/^# \{0,1\}//p' "$0" >&2; exit 2 ;;
esac
json=$1
[[ -f $json ]] || { echo "dp/plot.sh: no such file: $json" >&2; exit 2; }
outdir=${2:-$(dirname "$json")}
name=$(basename "$json" .json)
mkdir -p "$outdir"
command -v gnuplot >/dev/null || { echo "dp/plot.sh: no gnuplot (bash ci/deps.sh bench)" >&2; exit 1; }
command -v jq >/dev/null || { echo "dp/plot.sh: no jq (bash ci/deps.sh build)" >&2; exit 1; }
jq -e '.program == "ferry-dp" and (.runs | type) == "array"' "$json" >/dev/null 2>&1 ||
	{ echo "dp/plot.sh: $json is not a ferry-dp JSON file" >&2; exit 2; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

# one data file per scheme: time loss acc iter batch...
jq -r '.runs[] | .scheme as $s | .points[] |
	[$s, .time_s, .test_loss, .test_acc, .iter] + .batch | map(tostring) | join(" ")' "$json" |
	awk -v dir="$tmp" '{ f = dir "/" $1 ".dat"; $1 = ""; sub(/^ /, ""); print >> f; close(f) }'
ls "$tmp"/*.dat >/dev/null 2>&1 || { echo "dp/plot.sh: no points in $json" >&2; exit 1; }
plots() {
	local col=$1 sep=""
	for f in "$tmp"/*.dat; do
		printf '%s"%s" using 1:%s with linespoints title "%s"' "$sep" "$f" "$col" \
			"$(basename "$f" .dat)"
		sep=", "
	done
}
gnuplot <<GP
set terminal png size 900,500
set grid
set key top right
set xlabel "wall time (s, evaluation excluded)"
set output "$outdir/$name-loss.png"
set ylabel "test loss"
plot $(plots 2)
set output "$outdir/$name-acc.png"
set key bottom right
set ylabel "test accuracy"
plot $(plots 3)
GP
if [[ -f $tmp/lbbsp.dat ]]; then
	nw=$(awk 'NR == 1 { print NF - 4 }' "$tmp/lbbsp.dat")
	cmd=""
	for ((w = 0; w < nw; w++)); do
		cmd+="${cmd:+, }\"$tmp/lbbsp.dat\" using 4:$((w + 5)) with linespoints title \"worker $w\""
	done
	gnuplot <<GP
set terminal png size 900,500
set grid
set xlabel "iteration"
set ylabel "LB-BSP batch size"
set output "$outdir/$name-batch.png"
plot $cmd
GP
fi
echo "dp/plot.sh: wrote $outdir/$name-*.png"
