#!/usr/bin/env bash
# bench/mf/plot-cons.sh - compare ferry-mf runs of different consistency models (docs/mf.md).
#
#   bash bench/mf/plot-cons.sh OUTDIR LABEL=FILE.json [LABEL=FILE.json ...]
#
# Each FILE.json is one ferry-mf --json run (one mode). Writes into OUTDIR:
#   cons-loss-time.png    training loss against cumulative wall time of the SGD passes
#   cons-loss-epoch.png   training loss against epoch
#   cons-staleness.png    share of reads by staleness (clocks behind), one bar group per run
#                         that recorded any (SSP, ESSP)
#   cons-summary.txt      per run: final loss, wall time, and the wall time at which it first
#                         reached the target loss (TARGET in the environment, else the worst
#                         final loss of all runs), interpolated linearly between epochs
# Needs /usr/bin/python3 (the standard library's json only) and gnuplot (ci/deps.sh bench).
set -euo pipefail

if [[ $# -lt 2 || $1 == -h || $1 == --help ]]; then
	sed -n '2,/^set -euo/{/^set -euo/d;s/^# \{0,1\}//;p}' "$0"
	[[ $# -ge 2 ]] && exit 0 || exit 2
fi
out=$1
shift
mkdir -p "$out"
command -v gnuplot >/dev/null 2>&1 || { echo "plot-cons: gnuplot not found (bash ci/deps.sh bench)" >&2; exit 1; }

/usr/bin/python3 - "$out" "$@" <<'PY'
import json, os, sys
out = sys.argv[1]
runs = []
for arg in sys.argv[2:]:
    label, path = arg.split('=', 1)
    with open(path) as f:
        j = json.load(f)
    run = next(iter(j['runs'].values()))
    runs.append((label, run))
target = float(os.environ.get('TARGET') or max(r['epochs'][-1]['train_loss'] for _, r in runs))
with open(f'{out}/cons-summary.txt', 'w') as s:
    s.write(f'target loss: {target:.5f}\n')
    s.write(f"{'run':<18}{'final loss':>12}{'wall s':>10}{'s to target':>13}{'epochs to target':>18}\n")
    for label, r in runs:
        t = 0.0
        hit = None
        prev = None  # (time, loss, epoch) of the epoch before
        with open(f'{out}/cons-{label}.dat', 'w') as d:
            for e in r['epochs']:
                t += e['seconds']
                loss = e['train_loss']
                d.write(f"{e['epoch']} {t:.4f} {loss:.6f}\n")
                if hit is None and loss <= target:
                    if prev and prev[1] > loss:
                        f = (prev[1] - target) / (prev[1] - loss)
                        hit = (prev[0] + f * (t - prev[0]), prev[2] + f)
                    else:
                        hit = (t, float(e['epoch']))
                prev = (t, loss, e['epoch'])
        s.write(f"{label:<18}{r['epochs'][-1]['train_loss']:>12.5f}{t:>10.2f}"
                f"{hit[0] if hit else float('nan'):>13.2f}{hit[1] if hit else float('nan'):>18.2f}\n")
    st = [(label, r.get('staleness', [])) for label, r in runs if sum(r.get('staleness', [])) > 0]
    with open(f'{out}/cons-staleness.dat', 'w') as d:
        d.write('clocks ' + ' '.join(l for l, _ in st) + '\n')
        n = max((len(h) for _, h in st), default=0)
        for b in range(n):
            d.write(f'{b} ' + ' '.join(f'{h[b] / sum(h):.5f}' for _, h in st) + '\n')
    for label, h in st:
        tot = sum(h)
        mean = sum(b * c for b, c in enumerate(h)) / tot
        s.write(f'{label}: reads {tot:.0f}, mean staleness {mean:.3f} clocks, shares '
                + ' '.join(f'{b}:{c / tot:.3f}' for b, c in enumerate(h) if c) + '\n')
with open(f'{out}/cons-labels.txt', 'w') as f:
    f.write(' '.join(l for l, _ in runs) + '\n')
    f.write(' '.join(l for l, _ in st) + '\n')
PY

mapfile -t lab <"$out/cons-labels.txt"
read -ra all <<<"${lab[0]}"
read -ra stl <<<"${lab[1]:-}"
plot_time="" plot_epoch=""
for l in "${all[@]}"; do
	plot_time+="'$out/cons-$l.dat' using 2:3 with linespoints title '$l', "
	plot_epoch+="'$out/cons-$l.dat' using 1:3 with linespoints title '$l', "
done
gnuplot <<GP
set terminal pngcairo size 900,560
set grid
set ylabel 'training loss (MSE)'
set output '$out/cons-loss-time.png'
set xlabel 'wall time of the SGD passes (s, logarithmic)'
set logscale x
set title 'ferry-mf: loss against wall time'
plot ${plot_time%, }
unset logscale x
set output '$out/cons-loss-epoch.png'
set xlabel 'epoch'
set title 'ferry-mf: loss against epoch'
plot ${plot_epoch%, }
GP
if [[ ${#stl[@]} -gt 0 ]]; then
	cols=""
	for i in "${!stl[@]}"; do
		cols+="'$out/cons-staleness.dat' using $((i + 2)):xtic(1) title '${stl[$i]}', "
	done
	gnuplot <<GP
set terminal pngcairo size 900,560
set style data histograms
set style fill solid 0.8
set grid ytics
set xlabel 'clocks behind the reader'
set ylabel 'share of reads'
set title 'ferry-mf: observed staleness of reads'
set output '$out/cons-staleness.png'
plot ${cols%, }
GP
fi
cat "$out/cons-summary.txt"
