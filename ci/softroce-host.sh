#!/usr/bin/env bash
# ci/softroce-host.sh - run Ferry's test binaries on SoftRoCE (rdma_rxe) in this machine's own
# kernel, for hosts whose kernel has the rdma_rxe module. Needs root (or password-less sudo)
# for modprobe and `rdma link`.
#
#   bash ci/softroce-host.sh [options]
#   bash ci/softroce-host.sh --vm [softroce-vm.sh options]   (delegates to ci/softroce-vm.sh)
#
# It loads rdma_rxe, adds `ferry_rxe0` on the interface (unless an rxe link already sits on it),
# finds the RoCE v2 GID index of the interface's IPv4 address, runs the perftest baselines and
# every test binary with FERRY_RDMA_DEVICE / FERRY_RDMA_GID_INDEX / FERRY_TEST_RDMA_ADDR set,
# and deletes the link it added on exit. A kernel without rdma_rxe gets a clear refusal (exit 2):
# use ci/softroce-vm.sh there.
#
# Options:
#   --netdev IFACE      interface for rxe (default: the default route's interface)
#   --build-dir DIR     where the test binaries were built (default: build)
#   --tests GLOB        run every executable in DIR/tests/ matching GLOB (default 'test_*')
#   --bin PATH          run PATH as a test too (repeatable)
#   --env NAME=VALUE    export NAME for the tests (repeatable)
#   --cmd "COMMAND"     run COMMAND after the tests, as its own TEST line (repeatable)
#   --test-timeout SECS bound for each test (default 300)
#   --no-baseline       skip ib_read_lat / ib_write_lat
#   --keep-link         do not delete the rxe link this script added
#   --vm                run everything in the QEMU guest instead (ci/softroce-vm.sh; KVM when
#                       /dev/kvm is usable); the remaining arguments go to that script
#
# Prints "TEST <name> PASS|FAIL|TIMEOUT <seconds>s" per test and "RESULT pass=N fail=M".
# Exit status: 0 every test passed, 1 some failed, 2 setup refused or failed.
set -euo pipefail

ci_dir=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
readonly LINK_NAME=ferry_rxe0

say() { printf 'softroce-host: %s\n' "$*"; }
die()
{
	printf 'softroce-host: error: %s\n' "$*" >&2
	exit 2
}
usage() { sed -n '2,/^set -euo/{/^set -euo/d;s/^# \{0,1\}//;p}' "$0"; }

# --vm anywhere: hand every other argument to the VM script untouched.
for a in "$@"; do
	if [[ $a == --vm ]]; then
		args=()
		for b in "$@"; do [[ $b == --vm ]] || args+=("$b"); done
		exec bash "$ci_dir/softroce-vm.sh" "${args[@]}"
	fi
done

netdev=
build_dir=build
tests_glob='test_*'
bins=()
envs=()
cmds=()
test_timeout=300
baseline=1
keep_link=0
need_arg() { [[ $# -ge 2 ]] || die "$1 needs a value"; }
while [[ $# -gt 0 ]]; do
	case $1 in
	--netdev) need_arg "$@"; netdev=$2; shift 2 ;;
	--build-dir) need_arg "$@"; build_dir=$2; shift 2 ;;
	--tests) need_arg "$@"; tests_glob=$2; shift 2 ;;
	--bin) need_arg "$@"; bins+=("$2"); shift 2 ;;
	--env)
		need_arg "$@"
		[[ $2 =~ ^[A-Za-z_][A-Za-z0-9_]*= ]] || die "--env wants NAME=VALUE, got '$2'"
		envs+=("$2")
		shift 2
		;;
	--cmd) need_arg "$@"; cmds+=("$2"); shift 2 ;;
	--test-timeout) need_arg "$@"; test_timeout=$2; shift 2 ;;
	--no-baseline) baseline=0; shift ;;
	--keep-link) keep_link=1; shift ;;
	-h | --help) usage; exit 0 ;;
	*) die "unknown option '$1' (see --help)" ;;
	esac
done
[[ $test_timeout =~ ^[1-9][0-9]*$ ]] || die "--test-timeout wants seconds, got '$test_timeout'"

as_root()
{
	if [[ $(id -u) -eq 0 ]]; then
		"$@"
	elif command -v sudo >/dev/null 2>&1 && sudo -n true 2>/dev/null; then
		sudo -n "$@"
	else
		die "'$*' needs root: run as root or with password-less sudo"
	fi
}

for tool in modprobe ip rdma timeout; do
	command -v "$tool" >/dev/null 2>&1 ||
		PATH=$PATH:/usr/sbin:/sbin command -v "$tool" >/dev/null 2>&1 ||
		die "$tool not found (packages: kmod iproute2 coreutils; run ci/deps.sh vm)"
done
PATH=$PATH:/usr/sbin:/sbin

# 1. The module. Everything that can make this fail means "no SoftRoCE in this kernel".
if [[ ! -d /sys/module/rdma_rxe ]]; then
	if ! err=$(as_root modprobe rdma_rxe 2>&1); then
		printf 'softroce-host: this kernel (%s) cannot load rdma_rxe: %s\n' "$(uname -r)" \
			"${err:-modprobe failed}" >&2
		if [[ ! -d /lib/modules/$(uname -r) ]]; then
			echo "softroce-host: (/lib/modules/$(uname -r) does not exist: a kernel built without modules)" >&2
		fi
		echo "softroce-host: run the RDMA tests in a VM instead: bash ci/softroce-vm.sh (or this script with --vm)" >&2
		exit 2
	fi
fi
# rdma_cm users need the connection manager modules too; they exist wherever rxe does.
as_root modprobe rdma_ucm 2>/dev/null || say "note: modprobe rdma_ucm failed; rdma_cm tests may fail"

# 2. The interface and the link.
if [[ -z $netdev ]]; then
	netdev=$(ip -o route show default 2>/dev/null |
		awk '{ for (i = 1; i < NF; i++) if ($i == "dev") { print $(i + 1); exit } }' || true)
	[[ -n $netdev ]] || die "no default route: name the interface with --netdev IFACE"
fi
[[ -e /sys/class/net/$netdev ]] || die "no interface '$netdev'"
[[ $netdev != lo ]] || die "rxe on lo breaks every rdma_cm user (rdma_resolve_route: No such device): pick another --netdev, or add a dummy one: ip link add ferry0 type dummy"

added=0
work=
# shellcheck disable=SC2317 # reached through the trap
cleanup()
{
	local rc=$?
	[[ -z $work ]] || rm -rf "$work"
	if [[ $added -eq 1 && $keep_link -eq 0 ]]; then
		as_root rdma link delete "$LINK_NAME" 2>/dev/null || say "warning: could not delete $LINK_NAME"
	fi
	exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

# `rdma link show` prints "link rxe0/1 state ACTIVE physical_state LINK_UP netdev eth0".
device=$(rdma link show 2>/dev/null | awk -v nd="$netdev" '
	{ for (i = 1; i < NF; i++) if ($i == "netdev" && $(i + 1) == nd) { split($2, a, "/"); print a[1] } }' |
	sed -n 1p || true)
if [[ -n $device ]]; then
	say "using the existing RDMA link $device on $netdev"
else
	if ! err=$(as_root rdma link add "$LINK_NAME" type rxe netdev "$netdev" 2>&1); then
		die "rdma link add $LINK_NAME type rxe netdev $netdev failed: $err (\"No such file or directory\" usually means the crc32 crypto module is missing: modprobe crc32_generic; see dmesg)"
	fi
	added=1
	device=$LINK_NAME
	say "added $LINK_NAME on $netdev (deleted on exit)"
fi
[[ -e /sys/class/infiniband/$device ]] || die "/sys/class/infiniband/$device does not exist"

# 3. The GID index of the interface's IPv4 address, RoCE v2.
addr=$(ip -o -4 addr show dev "$netdev" | awk '{ split($4, a, "/"); print a[1] }' | sed -n 1p)
gid_index=
if [[ -n $addr ]]; then
	IFS=. read -r o1 o2 o3 o4 <<<"$addr"
	suffix=$(printf 'ffff:%02x%02x:%02x%02x' "$o1" "$o2" "$o3" "$o4")
	for i in $(seq 0 15); do
		g=$(<"/sys/class/infiniband/$device/ports/1/gids/$i") 2>/dev/null || continue
		t=$(<"/sys/class/infiniband/$device/ports/1/gid_attrs/types/$i") 2>/dev/null || continue
		if [[ $g == *"$suffix" && $t == "RoCE v2" ]]; then
			gid_index=$i
			break
		fi
	done
fi
if [[ -z $gid_index ]]; then
	die "no RoCE v2 GID for ${addr:-an IPv4 address} on $device ($netdev) in the first 16 entries: give $netdev an IPv4 address"
fi
say "device $device, port 1, gid index $gid_index, address $addr"

# memlock: root is exempt; anyone else needs room to register the arenas.
memlock=$(ulimit -l)
if [[ $(id -u) -ne 0 && $memlock != unlimited ]] && ((memlock < 65536)); then
	say "warning: memlock limit is ${memlock} KiB: memory registration will fail (\"Couldn't register MR\"); raise it with 'ulimit -l unlimited' or in /etc/security/limits.conf"
fi

export FERRY_RDMA_DEVICE=$device FERRY_RDMA_GID_INDEX=$gid_index FERRY_TEST_RDMA_ADDR=$addr
for e in "${envs[@]}"; do
	export "${e%%=*}=${e#*=}"
done

# 4. The runs.
pass=0
fail=0
work=$(mktemp -d "${TMPDIR:-/tmp}/ferry-host.XXXXXX")

report() # name rc seconds log show-all
{
	local st
	if [[ $2 -eq 0 ]]; then
		st=PASS
		pass=$((pass + 1))
	elif [[ $2 -eq 124 || $2 -eq 137 ]]; then
		st=TIMEOUT
		fail=$((fail + 1))
	else
		st=FAIL
		fail=$((fail + 1))
	fi
	echo "TEST $1 $st ${3}s"
	if [[ $5 == all ]]; then
		sed 's/^/  | /' "$4"
	elif [[ $st != PASS ]]; then
		tail -n 40 "$4" | sed 's/^/  | /'
		echo "  | exit status $2"
	else
		grep -h 'Synthesis:' "$4" | sed 's/^/  | /' || true
	fi
}

# Seconds since $1 (an $EPOCHREALTIME), two decimals, without forking date.
elapsed() { awk -v a="$1" -v b="$EPOCHREALTIME" 'BEGIN { printf "%.2f", b - a }'; }

if [[ $baseline -eq 1 ]]; then
	port=18515
	for tool in ib_read_lat ib_write_lat; do
		if ! command -v "$tool" >/dev/null 2>&1; then
			say "note: $tool not found (package perftest): baseline skipped"
			continue
		fi
		t0=$EPOCHREALTIME
		rc=0
		timeout -k 5 60 "$tool" -d "$device" -x "$gid_index" -s 64 -n 1000 -F -p "$port" \
			>"$work/server" 2>&1 </dev/null &
		spid=$!
		sleep 1
		timeout -k 5 60 "$tool" -d "$device" -x "$gid_index" -s 64 -n 1000 -F -p "$port" "$addr" \
			>"$work/client" 2>&1 </dev/null || rc=$?
		src=0
		wait "$spid" || src=$?
		[[ $rc -ne 0 ]] || rc=$src
		cat "$work/client" "$work/server" >"$work/log"
		report "baseline/$tool" "$rc" "$(elapsed "$t0")" "$work/log" ""
		awk '/#bytes/ { print "  | " $0; getline; print "  | " $0 }' "$work/client"
		port=$((port + 1))
	done
fi

test_bins=()
if [[ -n $tests_glob && -d $build_dir/tests ]]; then
	mapfile -t test_bins < <(find "$build_dir/tests" -maxdepth 1 -type f -perm -u+x \
		-name "$tests_glob" | LC_ALL=C sort)
fi
test_bins+=("${bins[@]}")
[[ ${#test_bins[@]} -gt 0 ]] || say "note: no executable matches '$tests_glob' in $build_dir/tests"
for b in "${test_bins[@]}"; do
	t0=$EPOCHREALTIME
	rc=0
	timeout -k 10 "$test_timeout" "$b" --jobs 1 >"$work/log" 2>&1 </dev/null || rc=$?
	report "${b##*/}" "$rc" "$(elapsed "$t0")" "$work/log" ""
done
i=0
for c in "${cmds[@]}"; do
	i=$((i + 1))
	t0=$EPOCHREALTIME
	rc=0
	timeout -k 10 "$test_timeout" bash -c "$c" >"$work/log" 2>&1 </dev/null || rc=$?
	report "cmd$i" "$rc" "$(elapsed "$t0")" "$work/log" all
done

echo "RESULT pass=$pass fail=$fail"
[[ $fail -eq 0 ]]
