#!/usr/bin/env bash
# ci/tp-check-local.sh - the transport suite's message cases with one process per rank on this
# host (build/tests/ferry-tp-check, three ranks on 127.0.0.1 over tcp, torchrun's variables):
# what ci/netns-test.sh runs across network namespaces, without root, so that ctest (and its
# ASan+UBSan run) covers the program too.
#
#   bash ci/tp-check-local.sh [--build-dir DIR] [--ranks N]
#
# Prints every rank's line; exits 0 when every rank said ok and exited 0 and the others' logs
# say the last rank left (its BYE), 1 otherwise (2: usage).
# The rank processes are bounded (timeout 60 s) and ended on exit; the log folder is removed.
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."
build=build
n=3
while [[ $# -gt 0 ]]; do
	case $1 in
	--build-dir) build=$2; shift ;;
	--ranks) n=$2; shift ;;
	-h | --help) sed -n '2,11s/^# \{0,1\}//p' "$0"; exit 0 ;;
	*) echo "tp-check-local: unknown option '$1'" >&2; exit 2 ;;
	esac
	shift
done
bin=$(realpath "$build/tests/ferry-tp-check" 2>/dev/null || true)
[[ -x $bin ]] || { echo "tp-check-local: $build/tests/ferry-tp-check is missing; build first" >&2; exit 2; }
[[ $n =~ ^[2-8]$ ]] || { echo "tp-check-local: --ranks takes 2 to 8" >&2; exit 2; }

tmp=$(mktemp -d /tmp/ferry-tpcheck.XXXXXX)
pids=()
cleanup()
{
	local p
	for p in "${pids[@]}"; do kill -TERM -- "-$p" 2>/dev/null || true; done
	rm -rf "$tmp"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# a port per run, so that two builds' ctest runs on one host do not meet (the rendezvous is
# MASTER_PORT + 1)
port=$((30000 + ($$ % 2000) * 2))
for ((i = 0; i < n; i++)); do
	setsid env RANK=$i WORLD_SIZE="$n" MASTER_ADDR=127.0.0.1 MASTER_PORT=$port FERRY_TRANSPORT=tcp \
		FERRY_LOG_LEVEL=info FERRY_LOG_FILE="$tmp/r%r.log" FERRY_TIMEOUT_MS=30000 \
		timeout --kill-after=5 60 "$bin" >"$tmp/$i.out" 2>&1 &
	pids+=($!)
done
fail=0
for ((i = 0; i < n; i++)); do
	rc=0
	wait "${pids[$i]}" || rc=$?
	if [[ $rc -eq 0 ]] && grep -q ": ok:" "$tmp/$i.out"; then
		cat "$tmp/$i.out"
	else
		echo "tp-check-local: rank $i failed (status $rc):"
		cat "$tmp/$i.out" "$tmp/r$i.log" 2>/dev/null | sed 's/^/    /'
		fail=1
	fi
done
pids=()
# the others heard the last rank's BYE: a departure, not a lost link
for ((i = 0; i < n - 1 && fail == 0; i++)); do
	grep -qF "tcp: rank $((n - 1)) left (it closed its connection to rank $i)" "$tmp/r$i.log" && continue
	echo "tp-check-local: rank $i's log does not say rank $((n - 1)) left (its BYE was not seen)"
	fail=1
done
exit "$fail"
