#!/usr/bin/env bash
# bench/dp/plot.sh - plot a ferry-dp JSON file: test loss and test accuracy against wall time, one
# line per scheme, and LB-BSP's per-worker batch sizes against iterations.
#
#   bash bench/dp/plot.sh FILE.json [OUTDIR]
#
# Writes <name>-loss.png, <name>-acc.png and (when the file has an lbbsp run) <name>-batch.png
# into OUTDIR (default: the JSON file's folder), <name> the file's name without .json. Needs
# gnuplot (Debian gnuplot-nox: `bash ci/deps.sh bench`) and awk; it reads ferry-dp's own layout
# (one point per line), not JSON in general. Exit status: 0, 1 no plot made, 2 bad arguments.
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
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

# one data file per scheme: time loss acc iter batch...
awk -v dir="$tmp" '
	/"scheme":/ { match($0, /"scheme": "[a-z]+"/); s = substr($0, RSTART + 11, RLENGTH - 12) }
	/"iter":/ {
		line = $0
		gsub(/[{}\[\],:"]/, " ", line)
		n = split(line, f, " ")
		out = ""
		for (i = 1; i <= n; i++) {
			if (f[i] == "time_s") t = f[i + 1]
			if (f[i] == "test_loss") l = f[i + 1]
			if (f[i] == "test_acc") a = f[i + 1]
			if (f[i] == "iter") it = f[i + 1]
			if (f[i] == "batch") { for (j = i + 1; j <= n; j++) out = out " " f[j] }
		}
		print t, l, a, it, out > (dir "/" s ".dat")
	}' "$json"
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
