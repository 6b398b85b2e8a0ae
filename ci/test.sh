#!/usr/bin/env bash
# ci/test.sh - Ferry's whole test run, as CI runs it (`bash .ci/run`) and as people run it.
#
#   bash ci/test.sh [--quick] [--no-asan] [--no-tsan] [--no-fuzz] [--no-vm] [--no-format] [--jobs N]
#
# Stages, each bounded with timeout(1), in this order:
#   deps        ci/deps.sh build python (and fuzz unless --no-fuzz, vm unless --no-vm)
#   build       cmake -S . -B build -DFERRY_WERROR=ON -DCMAKE_BUILD_TYPE=RelWithDebInfo; build
#   layers      ci/check-layers.sh: transports include no lib/ header, no file over 1000 lines,
#               no call upward between layers and no call circle (from the objects, with nm)
#   ctest       ctest --test-dir build --output-on-failure (with mpirun_pmix: 3 ranks under mpirun
#               meeting through PMIx, when libpmix and mpirun are there; coll_mpi_quick:
#               ferry_allreduce checked against MPI_Allreduce on 2 ranks, a few seconds;
#               dp_procs: ferry-dp as threads, as FERRY_* processes and under mpirun, the
#               results compared, about 5 s;
#               bench_quick: every benchmark in its quick mode, its JSON checked with jq, never
#               the timing, about 15 s; mf_data_cli: ferry-mf on MovieLens-format files;
#               deb_package: cpack -G DEB, the package checked unpacked, about 10 s)
#   netns       ci/netns-test.sh: 3 ranks in 3 network namespaces on a bridge, torchrun variables
#               only; the transport suite's message cases across them (ferry-tp-check); again
#               with FERRY_SOCKET_IFNAME and FERRY_BIND_ADDR=0.0.0.0; then while one namespace
#               loses every packet for 3 s (about 12 s; needs root, skipped otherwise)
#   asan-build  the same into build-asan/ with -DFERRY_SANITIZE=address,undefined
#   asan-ctest  ctest there, with ASAN_OPTIONS / UBSAN_OPTIONS that abort on the first finding
#   tsan        the threaded suites (test_store, test_onesided, test_cluster over tcp and loop,
#               test_slotmap, test_sparse, test_reconnect, test_coll, test_groups, test_ckpt,
#               test_etcd, test_cons, test_hot, test_hotauto, test_cons_teardown, test_rejoin)
#               built into build-tsan/ with -DFERRY_SANITIZE=thread and run with tests/tsan.supp,
#               halting on the first report (tests/CMakeLists.txt builds them against the
#               Criterion stand-in in tests/transport/tsan/: Criterion cannot start under TSan)
#   fuzz        the libFuzzer targets (fuzz/): a clang-14 tree in build-fuzz/ with -DFERRY_FUZZ=ON
#               (ASan+UBSan), the inputs that once crashed (fuzz/regress/), then each target for
#               FERRY_FUZZ_SECONDS (default 10) from the generated seeds; fails on any crash, leak,
#               timeout or sanitizer report (the artifact lands in build-fuzz/artifacts/)
#   vm          ci/softroce-vm.sh --build-dir build: the test binaries on SoftRoCE in QEMU
#   format      clang-format --dry-run -Werror over the C sources (--no-format skips it)
#
# Options:
#   --quick     build + ctest only (no asan, no tsan, no fuzz, no vm): the developer's loop
#   --no-asan   skip the address/undefined sanitizer build and run
#   --no-tsan   skip the ThreadSanitizer build and run
#   --no-fuzz   skip the fuzz targets
#   --no-vm     skip the SoftRoCE VM
#   --format    check formatting against .clang-format (the default; --no-format skips it)
#   --jobs N    build parallelism (default 2)
#
# The whole run stays inside FERRY_CI_BUDGET seconds (default 1790, under the brief's 30 min;
# session 10's runs took 1662 s and, on a slower day for the same machine, a projected
# 1830 s before the cuts below): each stage's bound is cut
# to what is left. FERRY_VM_TESTS (a glob, default 'test_transport') picks the binaries the VM
# runs as they are; the integration suites always run there too, over rdma.
# Prints one summary line per stage and last "N passed, N failed" (stages); exits non-zero when
# a stage failed.
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."

asan=1
tsan=1
fuzz=1
vm=1
asan_why=--no-asan
tsan_why=--no-tsan
fuzz_why=--no-fuzz
vm_why=--no-vm
format=1
jobs=2
while [[ $# -gt 0 ]]; do
	case $1 in
	--quick)
		asan=0; tsan=0; fuzz=0; vm=0
		asan_why=--quick; tsan_why=--quick; fuzz_why=--quick; vm_why=--quick
		;;
	--no-asan) asan=0 ;;
	--no-tsan) tsan=0 ;;
	--no-fuzz) fuzz=0 ;;
	--no-vm) vm=0 ;;
	--format) format=1 ;;
	--no-format) format=0 ;;
	--jobs=*) jobs=${1#--jobs=} ;;
	--jobs)
		[[ $# -ge 2 ]] || { echo "ci/test.sh: --jobs needs a number" >&2; exit 2; }
		jobs=$2
		shift
		;;
	-h | --help)
		sed -n '2,/^set -euo/{/^set -euo/d;s/^# \{0,1\}//;p}' "$0"
		exit 0
		;;
	*)
		echo "ci/test.sh: unknown option '$1' (see --help)" >&2
		exit 2
		;;
	esac
	shift
done
[[ $jobs =~ ^[1-9][0-9]*$ ]] || { echo "ci/test.sh: --jobs wants a number" >&2; exit 2; }

budget=${FERRY_CI_BUDGET:-1790}
run_start=$SECONDS
names=()
results=()
passed=0
failed=0

# stage NAME LIMIT CMD...: runs CMD bounded by LIMIT seconds (cut to the budget left), records
# PASS / FAIL / TIMEOUT. Returns CMD's status.
stage()
{
	local name=$1 limit=$2 left rc=0 t0 st
	shift 2
	left=$((budget - (SECONDS - run_start)))
	if [[ $left -lt 30 ]]; then
		names+=("$name")
		results+=("FAIL (no time left in the ${budget}s budget)")
		failed=$((failed + 1))
		return 1
	fi
	[[ $limit -le $left ]] || limit=$left
	printf '\n==> %s (bound %ss): %s\n' "$name" "$limit" "$*"
	t0=$SECONDS
	timeout --kill-after=30 "$limit" "$@" </dev/null || rc=$?
	if [[ $rc -eq 0 ]]; then
		st=PASS
		passed=$((passed + 1))
	elif [[ $rc -eq 124 || $rc -eq 137 ]]; then
		st="TIMEOUT after ${limit}s"
		failed=$((failed + 1))
	else
		st="FAIL (status $rc)"
		failed=$((failed + 1))
	fi
	printf '<== %s: %s in %ss\n' "$name" "$st" "$((SECONDS - t0))"
	names+=("$name")
	results+=("$st $((SECONDS - t0))s")
	return "$rc"
}

skip()
{
	names+=("$1")
	results+=("SKIP ($2)")
}

# Stage bodies that are more than one command; timeout(1) runs them through `bash -c`.
configure_build()
{
	local dir=$1
	shift
	cmake -S . -B "$dir" -DFERRY_WERROR=ON -DCMAKE_BUILD_TYPE=RelWithDebInfo "$@" &&
		cmake --build "$dir" -j"$jobs"
}
# history_size=7: the seqlock readers' intended race is suppressed by the reader's frame
# (tests/tsan.supp: ferry__slot_get); with the default history a busy reader's stack can be lost
# ("failed to restore the stack"), and the suppression then does not match (seen once in CI)
tsan_build_run()
{
	cmake -S . -B build-tsan -DFERRY_WERROR=ON -DCMAKE_BUILD_TYPE=RelWithDebInfo \
		-DFERRY_SANITIZE=thread &&
		cmake --build build-tsan -j"$jobs" --target test_store test_onesided test_cluster \
			test_slotmap test_sparse test_reconnect test_coll test_groups test_ckpt test_etcd \
			test_cons test_hot test_hotauto test_cons_teardown test_rejoin &&
		TSAN_OPTIONS="suppressions=$PWD/tests/tsan.supp halt_on_error=1 history_size=7" \
			ctest --test-dir build-tsan -R '^test_' --output-on-failure
}
# each target: the inputs that once crashed it, then FERRY_FUZZ_SECONDS of fuzzing; one line each
fuzz_build_run()
{
	local t secs=${FERRY_FUZZ_SECONDS:-10} out=build-fuzz/fuzz regress=()
	if ! command -v clang-14 >/dev/null; then
		echo "fuzz: clang-14 not found; install it with bash ci/deps.sh fuzz, or skip with --no-fuzz"
		return 1
	fi
	CC=clang-14 cmake -S . -B build-fuzz -DFERRY_FUZZ=ON -DFERRY_TESTS=OFF -DFERRY_WERROR=ON \
		-DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null &&
		cmake --build build-fuzz -j"$jobs" --target ferry_fuzz >/dev/null || return 1
	rm -rf build-fuzz/seeds && "$out"/gen_seeds build-fuzz/seeds || return 1
	mkdir -p build-fuzz/artifacts
	for t in frame handshake bootstrap table; do
		mapfile -t regress < <(compgen -G "fuzz/regress/$t-*" || true)
		if [[ ${#regress[@]} -gt 0 ]] &&
			! "$out/fuzz_$t" "${regress[@]}" >"build-fuzz/fuzz_$t.log" 2>&1; then
			tail -n 40 "build-fuzz/fuzz_$t.log"
			echo "fuzz_$t: an input of fuzz/regress/ crashes it again"
			return 1
		fi
		mkdir -p "build-fuzz/corpus/$t"
		if ! "$out/fuzz_$t" -max_total_time="$secs" -print_final_stats=1 \
			-artifact_prefix="build-fuzz/artifacts/$t-" "build-fuzz/corpus/$t" \
			"build-fuzz/seeds/$t" >"build-fuzz/fuzz_$t.log" 2>&1; then
			tail -n 40 "build-fuzz/fuzz_$t.log"
			echo "fuzz_$t: FAILED; the input is in build-fuzz/artifacts/ (replay: $out/fuzz_$t FILE)"
			return 1
		fi
		echo "fuzz_$t: $(grep -o 'Done [0-9]* runs in [0-9]* second(s)' "build-fuzz/fuzz_$t.log"), $(grep -o 'cov: [0-9]*' "build-fuzz/fuzz_$t.log" | tail -n 1), no crash"
	done
}
check_format()
{
	local files=()
	mapfile -t files < <(git ls-files -- '*.c' '*.h')
	[[ ${#files[@]} -eq 0 ]] || clang-format --dry-run -Werror "${files[@]}"
}
# The ASan ctest. One glibc abort is let through once: a test process that dies with "malloc
# assertion failure in __malloc_arena_thread_freeres" (glibc's own check as a thread exits, not an
# ASan or UBSan finding) has its failed tests run once more, and says so. Seen in test_coll in 2 of
# session 11's 3 whole CI runs, each time in thread-only cases that ran right after the case whose
# forked nodes are killed (the rerun passed); not reproduced in 7 runs of test_coll alone, idle and
# loaded; docs/collectives.md, "Tests".
# Any other failure fails the stage as before.
asan_ctest()
{
	local log=build-asan/ctest-asan.log rc=0

	ctest --test-dir build-asan --output-on-failure -E '^test_cons_loop$' 2>&1 | tee "$log" ||
		true
	rc=${PIPESTATUS[0]}
	if [[ $rc -ne 0 ]] &&
		grep -q 'malloc assertion failure in __malloc_arena_thread_freeres' "$log"; then
		echo "asan-ctest: a test died in glibc's arena check at a thread's exit (not a" \
			"sanitizer finding); running the failed tests once more"
		ctest --test-dir build-asan --output-on-failure --rerun-failed
		rc=$?
	fi
	return "$rc"
}

export -f configure_build tsan_build_run fuzz_build_run check_format asan_ctest
export jobs

echo "ci/test.sh: $(uname -srm), $(nproc) cpus, CI=${CI:-false}, budget ${budget}s"

dep_groups=(build python)
[[ $fuzz -eq 0 ]] || dep_groups+=(fuzz)
[[ $vm -eq 0 ]] || dep_groups+=(vm)
stage deps 1200 bash ci/deps.sh "${dep_groups[@]}" || true

build_ok=0
stage build 900 bash -c 'configure_build build' && build_ok=1
if [[ $build_ok -eq 1 ]]; then
	stage layers 120 bash ci/check-layers.sh --build-dir build || true
	# a few seconds: early, so that the long stages' budget never starves it
	if [[ $format -eq 1 ]]; then
		stage format 300 bash -c check_format || true
	fi
	stage ctest 900 ctest --test-dir build --output-on-failure || true
	if [[ $(id -u) -eq 0 ]]; then
		stage netns 60 bash ci/netns-test.sh --build-dir build || true
	else
		skip netns "needs root for network namespaces"
	fi
else
	skip layers "build failed"
	[[ $format -eq 0 ]] || stage format 300 bash -c check_format || true
	skip ctest "build failed"
	skip netns "build failed"
fi

if [[ $asan -eq 1 ]]; then
	# test_cons_loop is left out (48 s here; test_cons runs the same cases over tcp under ASan,
	# and over loop in ctest): the run's time (session 10)
	if stage asan-build 900 bash -c 'configure_build build-asan -DFERRY_SANITIZE=address,undefined'; then
		ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 \
			UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
			stage asan-ctest 900 bash -c asan_ctest || true
	else
		skip asan-ctest "asan-build failed"
	fi
else
	skip asan-build "$asan_why"
	skip asan-ctest "$asan_why"
fi

# 209-229 s in the last CI runs on the 2-core machine, build from scratch included (the suites'
# storms run 20x fewer reads under TSan); bounded at 2x that, well inside the run's budget
if [[ $tsan -eq 1 ]]; then
	stage tsan 450 bash -c tsan_build_run || true
else
	skip tsan "$tsan_why"
fi

# about 75 s on the 2-core development machine: the clang tree's build, then 4 targets x 15 s
if [[ $fuzz -eq 1 ]]; then
	stage fuzz 120 bash -c fuzz_build_run || true
else
	skip fuzz "$fuzz_why"
fi

if [[ $vm -eq 0 ]]; then
	skip vm "$vm_why"
elif [[ $build_ok -eq 0 ]]; then
	skip vm "build failed"
else
	# The VM's own bound (--timeout) sits inside the stage's, so it reports before being cut.
	# In the guest: the transport suite (tcp, loop and rdma cases), then every integration
	# suite of the core again with the rdma transport (its nodes listen on the rxe address).
	vm_args=(--build-dir build --timeout 900 --tests "${FERRY_VM_TESTS:-test_transport}")
	# test_auth and test_roles: the token at the rendezvous and on rdma_cm, forged role frames
	for t in test_cluster test_procs test_onesided test_badinput test_death test_sparse test_coll \
		test_auth test_roles; do
		vm_args+=(--bin "build/tests/$t"
			--cmd "FERRY_TRANSPORT=rdma FERRY_BIND_ADDR=10.77.0.1 $t --jobs 1")
	done
	# test_repl's r = 1 cases; its r = 2 cases (5 nodes each) run on the host, plain and under
	# ASan, and took 18 s more here (session 10)
	vm_args+=(--bin build/tests/test_repl
		--cmd "FERRY_TRANSPORT=rdma FERRY_BIND_ADDR=10.77.0.1 test_repl --jobs 1 --filter 'repl/a_*'")
	# a cluster whose every connection proves a token, over rdma
	vm_args+=(--cmd "FERRY_TRANSPORT=rdma FERRY_BIND_ADDR=10.77.0.1 FERRY_TOKEN=vm-token-of-32-random-characters test_cluster --jobs 1")
	# rdma links broken every 100-300 ms: redialed and resumed with nothing lost, and a killed
	# node failed within 2 s through the lower rank's probe (docs/rdma.md, "Reconnection")
	vm_args+=(--bin build/tests/test_reconnect
		--cmd "FERRY_TRANSPORT=rdma FERRY_BIND_ADDR=10.77.0.1 test_reconnect --jobs 1")
	# the same with a cluster token: every redial and probe over rdma_cm carries its proof
	# (transport/rdma/hello.c), as test_reconnect_token checks over tcp
	vm_args+=(--cmd "FERRY_TRANSPORT=rdma FERRY_BIND_ADDR=10.77.0.1 FERRY_TOKEN=vm-token-of-32-random-characters test_reconnect --jobs 1")
	# the landing inbox over real RDMA WRITEs (its other cases need the loop transport)
	vm_args+=(--bin build/tests/test_inbox
		--cmd "FERRY_TRANSPORT=rdma FERRY_BIND_ADDR=10.77.0.1 test_inbox --jobs 1 --filter 'inbox/hand_overs_*'")
	# batches past the 64 MiB frame limit over real RDMA (70 MiB: one frame and a bit)
	vm_args+=(--bin build/tests/test_bigbatch
		--cmd "FERRY_TRANSPORT=rdma FERRY_BIND_ADDR=10.77.0.1 FERRY_BIGBATCH_MIB=70 test_bigbatch --jobs 1")
	# a model larger than each node's memory budget, over rdma (fewer keys than on the host)
	vm_args+=(--bin build/tests/test_budget
		--cmd "FERRY_TRANSPORT=rdma FERRY_BIND_ADDR=10.77.0.1 FERRY_BUDGET_KEYS=8000 test_budget --jobs 1")
	# a checkpoint taken in training restored into 2 and 4 processes over rdma (the whole
	# suite took 125 s under TCG; this case about a sixth of it)
	vm_args+=(--bin build/tests/test_ckpt
		--cmd "FERRY_TRANSPORT=rdma FERRY_BIND_ADDR=10.77.0.1 test_ckpt --jobs 1 --filter 'ckpt/procs_dense_*'")
	# the transport suite's message cases with one process per rank over rdma (ferry-tp-check;
	# ci/netns-test.sh runs them over tcp across namespaces), and the survivors saw rank 2 leave
	vm_args+=(--bin build/tests/ferry-tp-check
		--cmd 'for i in 0 1 2; do RANK=$i WORLD_SIZE=3 MASTER_ADDR=10.77.0.1 MASTER_PORT=29400 FERRY_TRANSPORT=rdma FERRY_LOG_LEVEL=info FERRY_LOG_FILE=/tmp/tp.%r.log timeout 120 ferry-tp-check --count 200 >/tmp/tp$i.out 2>&1 & done; wait; cat /tmp/tp0.out /tmp/tp1.out /tmp/tp2.out; [ "$(cat /tmp/tp0.out /tmp/tp1.out /tmp/tp2.out | grep -c ": ok:")" = 3 ] && grep -q "rdma: rank 2 left" /tmp/tp.0.log && grep -q "rdma: rank 2 left" /tmp/tp.1.log')
	# the consistency models over rdma: every SSP/ESSP read checked against the bound, exact
	# eventual sums (copies fetched by one-sided READs, deltas by messages)
	# (the bound and the sums; the rest of the suite runs on the host: 68 s here for all of it)
	vm_args+=(--bin build/tests/test_cons
		--cmd "FERRY_TRANSPORT=rdma FERRY_BIND_ADDR=10.77.0.1 test_cons --jobs 1 --filter 'cons/*_keep_the_staleness_bound'"
		--cmd "FERRY_TRANSPORT=rdma FERRY_BIND_ADDR=10.77.0.1 test_cons --jobs 1 --filter 'cons/eventual_sums_are_exact_after_flush_and_barrier'")
	# hot keys' replicas over rdma: exact sums on every node after flush and barrier (200
	# operations per worker: the whole suite with 400 took 177 s under TCG)
	vm_args+=(--bin build/tests/test_hot
		--cmd "FERRY_TRANSPORT=rdma FERRY_BIND_ADDR=10.77.0.1 FERRY_TEST_HOT_ITERS=200 test_hot --jobs 1 --filter 'hot/sums_are_exact_after_flush_and_barrier'")
	# hot keys chosen from the accesses (hot_auto) over rdma: the chosen sets and exact sums,
	# as threads (sequential and eventual) and as processes (19 s in one boot)
	vm_args+=(--bin build/tests/test_hotauto
		--cmd "FERRY_TRANSPORT=rdma FERRY_BIND_ADDR=10.77.0.1 FERRY_TEST_HOTAUTO_ITERS=200 test_hotauto --jobs 1 --filter 'hotauto/the_*'")
	# ferry-info reads the GID table through verbs: it must list rxe0's RoCE v2 GID
	vm_args+=(--cmd 'ferry-info >/tmp/fi.txt; rc=$?; grep "gid\[" /tmp/fi.txt; [ $rc -eq 0 ] && grep -q "::ffff:10.77.0.1 RoCE v2" /tmp/fi.txt')
	stage vm 1000 bash ci/softroce-vm.sh "${vm_args[@]}" || true
fi

printf '\nci/test.sh summary (%ss):\n' "$((SECONDS - run_start))"
for i in "${!names[@]}"; do
	printf '  %-11s %s\n' "${names[$i]}" "${results[$i]}"
done
echo "$passed passed, $failed failed"
[[ $failed -eq 0 ]]
