#!/usr/bin/env bash
# bench/plot.sh - plot a ferry-bench JSON file: latency and throughput against value size.
#
#   bash bench/plot.sh FILE.json [OUTDIR]
#
# Writes into OUTDIR (default: the JSON file's folder), one pair per scenario that has rows:
#   <name>-local-latency.png      p50 per operation, Ferry (solid) and its baseline (dashed)
#   <name>-local-throughput.png   operations per second, Ferry and the baseline
#   ... -remote-..., -localize-...
# where <name> is the JSON file's name without .json. Series are one per operation (and key
# count for local: one reader thread, no writer). Axes are logarithmic. The title carries the run's
# context (commit, transport, mode, nodes, load).
#
# Needs gnuplot (Debian gnuplot-nox: `bash ci/deps.sh bench`) and jq (`bash ci/deps.sh build`),
# which reads the JSON whatever its layout; a figure that is null (not measured) is not drawn.
# Exit status: 0, 1 when no plot could be made, 2 for bad arguments.
set -euo pipefail

usage() { sed -n '2,/^set -euo/{/^set -euo/d;s/^# \{0,1\}//;p}' "$0"; }

case ${1:-} in
-h | --help) usage; exit 0 ;;
'') usage >&2; exit 2 ;;
esac
[[ $# -le 2 ]] || { echo "plot.sh: too many arguments (see --help)" >&2; exit 2; }
json=$1
[[ -f $json ]] || { echo "plot.sh: no such file: $json" >&2; exit 2; }
outdir=${2:-$(dirname "$json")}
mkdir -p "$outdir"
command -v gnuplot >/dev/null 2>&1 ||
	{ echo "plot.sh: gnuplot not found; install it with: bash ci/deps.sh bench" >&2; exit 1; }
command -v jq >/dev/null 2>&1 ||
	{ echo "plot.sh: jq not found; install it with: bash ci/deps.sh build" >&2; exit 1; }
jq -e '(.results | type) == "array" and (.context | type) == "object"' "$json" >/dev/null 2>&1 ||
	{ echo "plot.sh: $json is not a ferry-bench JSON file (no context and results)" >&2; exit 2; }

name=$(basename "$json" .json)
work=$(mktemp -d "${TMPDIR:-/tmp}/ferry-plot.XXXXXX")
trap 'rm -rf "$work"' EXIT

# pngcairo draws nicer lines; plain png (libgd) is the fallback.
term="pngcairo size 1000,640 font 'Sans,10'"
if ! gnuplot -e "set terminal pngcairo" </dev/null >/dev/null 2>&1; then
	term="png size 1000,640"
fi

# The context line for titles, and one data file per (scenario, series):
#   <scenario>.<series>.dat   value_bytes  p50_us  baseline_p50_us  ops_per_s  baseline_ops_per_s
# (a null figure becomes 0, which the plots leave out)
jq -r '.context | "commit \(.git_commit), \(.transport), \(.mode), nodes as \(.nodes_as), " +
	"\(.link), load \(.loadavg_start)" + (if .busy_poll == 1 then ", busy-poll" else "" end)' \
	"$json" >"$work/context"
jq -r '.results[] | select(.op != "hot-key") |
	select(.scenario != "local" or (.threads == 1 and .writer == 0)) |
	[.scenario, (if .scenario == "local" then "\(.op)-\(.keys)keys" else .op end),
	 .value_bytes, (.p50_us // 0), (.baseline_p50_us // 0), (.ops_per_s // 0),
	 (.baseline_ops_per_s // 0), (.baseline // "-")] | @tsv' "$json" |
	awk -F '\t' -v dir="$work" '{
		f = dir "/" $1 "." $2 ".dat"
		print $3, $4, $5, $6, $7, $8 >> f
		close(f)
	}'

ctx=$(cat "$work/context" 2>/dev/null || echo "")
made=0
for sc in local remote localize; do
	mapfile -t files < <(find "$work" -maxdepth 1 -name "$sc.*.dat" | LC_ALL=C sort)
	[[ ${#files[@]} -gt 0 ]] || continue
	for kind in latency throughput; do
		plots=()
		i=0
		for f in "${files[@]}"; do
			# sort by value size so the lines join in order
			sort -n -k1,1 "$f" -o "$f"
			s=${f##*/}
			s=${s#"$sc".}
			s=${s%.dat}
			i=$((i + 1))
			base=$(awk 'NR == 1 { print $6 }' "$f")
			if [[ $kind == latency ]]; then
				plots+=("'$f' using 1:(\$2 > 0 ? \$2 : 1/0) with linespoints lc $i pt 7 title '$s'")
				if awk '$3 > 0 { found = 1 } END { exit !found }' "$f"; then
					plots+=("'$f' using 1:(\$3 > 0 ? \$3 : 1/0) with linespoints lc $i dt 2 pt 6 title '$s: $base'")
				fi
			else
				plots+=("'$f' using 1:(\$4 > 0 ? \$4 : 1/0) with linespoints lc $i pt 7 title '$s'")
				if awk '$5 > 0 { found = 1 } END { exit !found }' "$f"; then
					plots+=("'$f' using 1:(\$5 > 0 ? \$5 : 1/0) with linespoints lc $i dt 2 pt 6 title '$s: $base'")
				fi
			fi
		done
		out=$outdir/$name-$sc-$kind.png
		if [[ $kind == latency ]]; then
			ylabel="p50 per call [us]  (solid: Ferry, dashed: baseline)"
		else
			ylabel="operations (keys) per second  (solid: Ferry, dashed: baseline)"
		fi
		joined=$(printf '%s, ' "${plots[@]}")
		joined=${joined%, }
		if gnuplot 2>"$work/gnuplot.err" <<EOF; then
set terminal $term
set output '$out'
set title "ferry-bench: $sc $kind against value size\n$ctx" noenhanced
set xlabel 'value size [bytes]'
set ylabel '$ylabel'
set logscale xy 2
set format y '%g'
set logscale y 10
set grid xtics ytics mytics
set key outside right top
plot $joined
EOF
			made=$((made + 1))
			echo "plot.sh: wrote $out"
		else
			echo "plot.sh: gnuplot failed for $out:" >&2
			sed 's/^/  /' "$work/gnuplot.err" >&2
		fi
	done
done
[[ $made -gt 0 ]] || { echo "plot.sh: nothing to plot in $json" >&2; exit 1; }
