#!/usr/bin/env bash
# ci/mf-demo.sh - build ferry-mf and show what dynamic parameter allocation buys.
#
#   bash ci/mf-demo.sh [ferry-mf options]...
#
# Installs the build dependencies (ci/deps.sh build, when present), configures and builds
# ferry-mf into build/, then factorizes a synthetic 30,000 x 3,000 matrix of rank 8 (1.5 million
# training entries) on a local cluster of 2 Ferry nodes by DSGD: first in dynamic mode (blocks
# move by ferry_localize, every SGD access is local), then in classic mode (static placement,
# remote accesses stay remote). It prints a line per epoch, both mean epoch times and the
# speedup. About a minute on a 2-core machine, most of it classic mode. Options given here
# are passed to ferry-mf and override the demo's (e.g. --epochs 3, --transport tcp, --procs).
# Exit status: ferry-mf's (0 when both runs finished), or the failing build step's.
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."

if [[ -f ci/deps.sh ]]; then
	bash ci/deps.sh build
fi

cmake -S . -B build
cmake --build build -j2 --target ferry-mf

exec build/bench/ferry-mf \
	--synthetic 30000x3000:1500000:8:0.1 \
	--rank 16 --lr 0.1 --epochs 8 \
	--nodes 2 --threads 1 \
	--mode both \
	"$@"
