#!/usr/bin/env bash
# ci/mpirun-test.sh - three ranks under Open MPI's mpirun, with no rendezvous given: the nodes must
# exchange their addresses through mpirun's PMIx server (lib/core/pmix.c), push, pull and localize
# across each other (build/tests/ferry-rank-check), and say in their logs that PMIx was the source.
#
#   bash ci/mpirun-test.sh [--build-dir DIR] [--np N]
#
# ctest runs it as `mpirun_pmix` when the build found libpmix and mpirun. As root (CI, containers)
# mpirun needs --allow-run-as-root; --oversubscribe lets 3 ranks share 2 cores. Every wait is
# bounded (timeout, FERRY_TIMEOUT_MS); the logs go to a temporary folder, removed on exit.
set -euo pipefail

build=build
np=3
while [[ $# -gt 0 ]]; do
	case $1 in
	--build-dir) build=$2; shift ;;
	--np) np=$2; shift ;;
	-h | --help) sed -n '2,11s/^# \{0,1\}//p' "$0"; exit 0 ;;
	*) echo "mpirun-test: unknown option '$1'" >&2; exit 2 ;;
	esac
	shift
done
bin=$build/tests/ferry-rank-check
[[ -x $bin ]] || { echo "mpirun-test: $bin is missing; build first" >&2; exit 2; }
command -v mpirun >/dev/null || { echo "mpirun-test: no mpirun (Debian: openmpi-bin)" >&2; exit 2; }

tmp=$(mktemp -d /tmp/ferry-mpirun.XXXXXX)
trap 'rm -rf "$tmp"' EXIT

# under ASan (ci/test.sh's asan-ctest), libpmix's own leftovers are not Ferry's leaks
LSAN_OPTIONS="suppressions=$(realpath "$(dirname "${BASH_SOURCE[0]}")/../tests/lsan.supp")${LSAN_OPTIONS:+:$LSAN_OPTIONS}"
export LSAN_OPTIONS

root=()
[[ $(id -u) -ne 0 ]] || root=(--allow-run-as-root)
# No rendezvous in any form: the nodes must find PMIx on their own.
rc=0
env -u MASTER_ADDR -u MASTER_PORT -u FERRY_RENDEZVOUS -u FERRY_BIND_ADDR \
	-u RANK -u WORLD_SIZE -u FERRY_RANK -u FERRY_WORLD \
	timeout --kill-after=10 90 mpirun -np "$np" "${root[@]}" --oversubscribe \
	-x FERRY_LOG_LEVEL=info -x "FERRY_LOG_FILE=$tmp/ferry.%r.log" -x FERRY_TIMEOUT_MS=30000 \
	"$bin" --rounds 3 >"$tmp/out" 2>&1 || rc=$?
cat "$tmp/out"
fail=0
[[ $rc -eq 0 ]] || { echo "mpirun-test: mpirun exited $rc"; fail=1; }
oks=$(grep -c "ferry-rank-check: rank .* of $np: ok" "$tmp/out" || true)
[[ $oks -eq $np ]] || { echo "mpirun-test: $oks of $np ranks said ok"; fail=1; }
for ((r = 0; r < np; r++)); do
	log=$tmp/ferry.$r.log
	if ! grep -q "exchanged through PMIx" "$log" 2>/dev/null; then
		echo "mpirun-test: rank $r's log does not say PMIx was the source:"
		cat "$log" 2>/dev/null || echo "  (no $log)"
		fail=1
	fi
done
[[ $fail -ne 0 ]] || grep -h "through PMIx\|config: listening" "$tmp"/ferry.*.log
[[ $fail -eq 0 ]] && echo "mpirun-test: ok: $np ranks met through PMIx, no rendezvous given"
exit "$fail"
