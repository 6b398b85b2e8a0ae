#!/usr/bin/env bash
# ci/deps.sh - install the Debian/Ubuntu packages Ferry needs, and only those that are missing.
#
#   bash ci/deps.sh [build|fuzz|vm|bench|python|all]...     (default: all)
#
# Groups:
#   build  compile libferry and its Criterion tests (etcd-server: the etcd manager's tests), check
#          formatting; run the multi-host tests (mpirun through PMIx: openmpi-bin, libpmix-dev;
#          network namespaces: iproute2); the tools' JSON (libjansson-dev) and its checks (jq); the
#          .deb's check (dpkg-dev)
#   fuzz   build and run the libFuzzer targets in fuzz/ (clang-14 and its libFuzzer)
#   vm     run the RDMA suites on SoftRoCE inside QEMU (ci/softroce-vm.sh)
#   bench  plot benchmark figures; Fashion-MNIST for ferry-dp (dataset-fashion-mnist)
#   python the Python package and its tests (python/, docs/python.md): headers, numpy, torch
#          (torchrun) and its C++ headers with g++ (ferry._torchview), pytest; WordNet 3.0 for
#          the KGE example; matplotlib for its plot
#
# Idempotent: a package counts as present when dpkg says "install ok installed"; `apt-get update`
# runs only when something is missing, at most once per call. Every apt call is bounded. Prints
# one line per group. Exit status: 0 when every requested package is present afterwards.
set -euo pipefail

readonly GROUP_BUILD="cmake gcc make pkg-config liburcu-dev libxxhash-dev libsodium-dev libjansson-dev libcurl4-openssl-dev etcd-server libcriterion-dev libibverbs-dev librdmacm-dev clang-format libpmix-dev openmpi-bin libopenmpi-dev iproute2 jq dpkg-dev"
readonly GROUP_FUZZ="clang-14 libfuzzer-14-dev"
readonly GROUP_VM="qemu-system-x86 busybox-static rdma-core ibverbs-utils rdmacm-utils perftest ibverbs-providers iproute2 cpio kmod"
readonly GROUP_BENCH="gnuplot-nox dataset-fashion-mnist"
readonly GROUP_PYTHON="python3-dev python3-numpy python3-torch libtorch-dev pybind11-dev g++ python3-pytest wordnet-base python3-matplotlib"

# Bounds, in seconds; override for slow mirrors.
readonly UPDATE_TIMEOUT=${FERRY_APT_UPDATE_TIMEOUT:-300}
readonly INSTALL_TIMEOUT=${FERRY_APT_INSTALL_TIMEOUT:-900}

usage()
{
	sed -n '2,17s/^# \{0,1\}//p' "$0"
}

group_packages()
{
	case $1 in
	build) echo "$GROUP_BUILD" ;;
	fuzz) echo "$GROUP_FUZZ" ;;
	vm) echo "$GROUP_VM" ;;
	bench) echo "$GROUP_BENCH" ;;
	python) echo "$GROUP_PYTHON" ;;
	*) return 1 ;;
	esac
}

# Prints the packages of "$@" that dpkg does not report as installed.
missing_packages()
{
	local p st
	for p in "$@"; do
		st=$(dpkg-query -W -f='${Status}' "$p" 2>/dev/null || true)
		[[ $st == "install ok installed" ]] || printf '%s\n' "$p"
	done
}

groups=()
for arg in "$@"; do
	case $arg in
	-h | --help)
		usage
		exit 0
		;;
	all) groups+=(build fuzz vm bench python) ;;
	build | fuzz | vm | bench | python) groups+=("$arg") ;;
	*)
		echo "deps: unknown group '$arg' (want build, fuzz, vm, bench, python or all)" >&2
		exit 2
		;;
	esac
done
[[ ${#groups[@]} -gt 0 ]] || groups=(build fuzz vm bench python)

if ! command -v dpkg-query >/dev/null 2>&1; then
	echo "deps: dpkg-query not found: this script knows Debian and Ubuntu only; install by hand:" >&2
	for g in "${groups[@]}"; do
		echo "deps $g: $(group_packages "$g")" >&2
	done
	exit 1
fi

apt_prefix=()
if [[ $(id -u) -ne 0 ]]; then
	if command -v sudo >/dev/null 2>&1 && sudo -n true 2>/dev/null; then
		apt_prefix=(sudo -n)
	else
		apt_prefix=(none)
	fi
fi

export DEBIAN_FRONTEND=noninteractive
apt_opts=(-y -q --no-install-recommends -o DPkg::Lock::Timeout=120 -o Dpkg::Use-Pty=0)
updated=0
status=0
declare -A seen=()

for g in "${groups[@]}"; do
	[[ -z ${seen[$g]:-} ]] || continue
	seen[$g]=1
	read -r -a pkgs <<<"$(group_packages "$g")"
	mapfile -t missing < <(missing_packages "${pkgs[@]}")
	if [[ ${#missing[@]} -eq 0 ]]; then
		echo "deps $g: ok, all ${#pkgs[@]} packages present"
		continue
	fi
	if [[ ${apt_prefix[0]:-} == none ]]; then
		echo "deps $g: MISSING ${missing[*]} (not root and no password-less sudo: install them by hand)"
		status=1
		continue
	fi
	if [[ $updated -eq 0 ]]; then
		# A failed update (offline mirror) is not fatal: the install below may still
		# succeed from the lists already on disk, and says so when it does not.
		if ! timeout --kill-after=10 "$UPDATE_TIMEOUT" "${apt_prefix[@]}" apt-get -q \
			-o DPkg::Lock::Timeout=120 update >/dev/null; then
			echo "deps: apt-get update failed or timed out after ${UPDATE_TIMEOUT}s; trying the current lists" >&2
		fi
		updated=1
	fi
	if timeout --kill-after=10 "$INSTALL_TIMEOUT" "${apt_prefix[@]}" apt-get install \
		"${apt_opts[@]}" "${missing[@]}" >/dev/null; then
		mapfile -t still < <(missing_packages "${missing[@]}")
	else
		mapfile -t still < <(missing_packages "${missing[@]}")
		[[ ${#still[@]} -gt 0 ]] || still=("(apt-get install failed)")
	fi
	if [[ ${#still[@]} -eq 0 ]]; then
		echo "deps $g: installed ${missing[*]}"
	else
		echo "deps $g: FAILED to install ${still[*]}"
		status=1
	fi
done
exit "$status"
