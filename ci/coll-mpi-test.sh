#!/usr/bin/env bash
# ci/coll-mpi-test.sh - a short run of ferry-coll-mpi (bench/coll/allreduce_mpi.c): 2 ranks under
# Open MPI's mpirun, MPI_Allreduce and ferry_allreduce on the same processes, 8 B to 1 MiB, 20
# iterations a size. It checks that the program runs and that Ferry's results equal MPI's bit for
# bit (the program exits 1 otherwise); it never judges speed (docs/collectives.md has the figures).
#
#   bash ci/coll-mpi-test.sh [--build-dir DIR] [--np N]
#
# ctest runs it as `coll_mpi_quick` when the build found libpmix, mpirun and an MPI for C; a few
# seconds. As root (CI, containers) mpirun needs --allow-run-as-root.
set -euo pipefail

build=build
np=2
while [[ $# -gt 0 ]]; do
	case $1 in
	--build-dir) build=$2; shift ;;
	--np) np=$2; shift ;;
	-h | --help) sed -n '2,10s/^# \{0,1\}//p' "$0"; exit 0 ;;
	*) echo "coll-mpi-test: unknown option '$1'" >&2; exit 2 ;;
	esac
	shift
done
bin=$build/bench/ferry-coll-mpi
[[ -x $bin ]] || { echo "coll-mpi-test: $bin is missing; build first" >&2; exit 2; }
command -v mpirun >/dev/null || { echo "coll-mpi-test: no mpirun (Debian: openmpi-bin)" >&2; exit 2; }

# Under ASan (ci/test.sh's asan-ctest) leaks are not checked here: Open MPI 4.1 keeps what
# MPI_Init allocated after MPI_Finalize, in stacks LeakSanitizer's suppressions do not catch;
# Ferry's own leaks are checked by test_coll, which runs the same collectives without MPI.
ASAN_OPTIONS="${ASAN_OPTIONS:+$ASAN_OPTIONS:}detect_leaks=0"
export ASAN_OPTIONS
root=()
[[ $(id -u) -ne 0 ]] || root=(--allow-run-as-root)
tmp=$(mktemp -d /tmp/ferry-coll-mpi.XXXXXX)
trap 'rm -rf "$tmp"' EXIT
rc=0
env -u MASTER_ADDR -u MASTER_PORT -u FERRY_RENDEZVOUS -u FERRY_BIND_ADDR \
	-u RANK -u WORLD_SIZE -u FERRY_RANK -u FERRY_WORLD \
	timeout --kill-after=10 60 mpirun -np "$np" "${root[@]}" --oversubscribe \
	-x FERRY_TIMEOUT_MS=20000 "$bin" --quick --json "$tmp/out.json" >"$tmp/out" 2>&1 || rc=$?
cat "$tmp/out"
[[ $rc -eq 0 ]] || { echo "coll-mpi-test: mpirun exited $rc"; exit 1; }
rows=$(jq '[.results[] | select(.ferry_us > 0 and .mpi_us > 0)] | length' "$tmp/out.json" ||
	echo 0)
[[ $rows -ge 10 ]] || { echo "coll-mpi-test: $rows rows in the JSON, want 18"; exit 1; }
echo "coll-mpi-test: ok: $np ranks, $rows sizes, Ferry's all-reduce equal to MPI's"
