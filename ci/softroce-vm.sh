#!/usr/bin/env bash
# ci/softroce-vm.sh - run Ferry's test binaries on real SoftRoCE (rdma_rxe) inside a QEMU guest.
#
#   bash ci/softroce-vm.sh [options]
#
# Works on a host whose kernel has no RDMA and no module support: it boots Debian's own kernel
# (fetched with apt, cached) from a busybox initramfs holding the rxe modules, the rdma/ip tools,
# perftest and the project's binaries; the guest binds rxe0 to dummy0 (10.77.0.1/24), runs the
# perftest baselines and every test binary, and powers off. Uses KVM when /dev/kvm is usable,
# TCG otherwise. See docs/rdma.md, "Running the RDMA tests".
#
# Options:
#   --build-dir DIR     where the test binaries were built (default: build)
#   --tests GLOB        run every executable in DIR/tests/ matching GLOB (default: 'test_*';
#                       '' runs none)
#   --bin PATH          also copy PATH into the guest's /usr/local/bin (repeatable); executables
#                       DIR/bench/ferry-* and DIR/tools/ferry-* are copied too when present
#   --env NAME=VALUE    export NAME in the guest before the tests (repeatable)
#   --cmd "COMMAND"     run COMMAND (guest shell) after the tests, reported as its own VMTEST
#                       line with its whole output (repeatable), e.g. a benchmark
#   --timeout SECS      bound for the whole VM run (default 900)
#   --test-timeout SECS bound for each test binary and command in the guest (default 300)
#   --no-baseline       skip the perftest baselines: ib_read_lat, ib_write_lat, ib_send_lat
#                       (busy-polling) and ib_send_lat -e (sleeping on CQ events: the floor
#                       of a blocking wait), each 64 bytes x 1000, outputs in the guest's
#                       /tmp/ib_read_lat.client, ib_write_lat, ib_send_lat, ib_send_lat-e
#   --accel auto|kvm|tcg  (default auto: kvm when /dev/kvm is usable, with a TCG retry if the
#                       KVM guest never starts; env FERRY_VM_ACCEL)
#   --log FILE          serial log (default: DIR/softroce-vm.log)
#   --keep              keep the work directory (initramfs tree, kernel, qemu command line)
#   --verbose           print the whole guest console, and every test's output
#
# Cache: ${FERRY_VM_CACHE:-/var/cache/ferry-vm} (~/.cache/ferry-vm when that is not writable)
# holds the kernel and the modules it needs; delete it to fetch the kernel again.
#
# Guest output, one line each: "VMTEST <name> PASS|FAIL|TIMEOUT <seconds>s", "VMBASE <tool>
# bytes=.. iters=.. p50=<us> p99=<us> min=.. avg=.. max=..", and the verdict "VMRESULT pass=N fail=M".
# Exit status: 0 every test passed, 1 some test failed, 2 no verdict (timeout, boot failure,
# setup error).
set -euo pipefail

ci_dir=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)

# The guest network: rxe0 sits on dummy0, never on lo (rdma_cm fails on lo).
readonly GUEST_IP=10.77.0.1
readonly GUEST_PREFIX=24
# Top-level modules; each one's dependencies come from modules.dep. crc32_generic is not a
# declared dependency of rdma_rxe, but `rdma link add` fails without it on 6.1.
readonly TOP_MODULES="crc32_generic rdma_rxe rdma_ucm dummy"
readonly OPTIONAL_MODULES="crc32_generic"
readonly CACHE_FORMAT="ferry-vm-cache 1: $TOP_MODULES"

build_dir=build
tests_glob='test_*'
bins=()
envs=()
cmds=()
vm_timeout=900
test_timeout=300
baseline=1
accel=${FERRY_VM_ACCEL:-auto}
log_file=
keep=0
verbose=0
vm_mem=2048
vm_smp=2

say() { printf 'softroce-vm: %s\n' "$*"; }
die()
{
	printf 'softroce-vm: error: %s\n' "$*" >&2
	exit 2
}
usage() { sed -n '2,/^set -euo/{/^set -euo/d;s/^# \{0,1\}//;p}' "$0"; }

need_arg() { [[ $# -ge 2 ]] || die "$1 needs a value"; }
while [[ $# -gt 0 ]]; do
	case $1 in
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
	--timeout) need_arg "$@"; vm_timeout=$2; shift 2 ;;
	--test-timeout) need_arg "$@"; test_timeout=$2; shift 2 ;;
	--no-baseline) baseline=0; shift ;;
	--accel) need_arg "$@"; accel=$2; shift 2 ;;
	--log) need_arg "$@"; log_file=$2; shift 2 ;;
	--keep) keep=1; shift ;;
	--verbose) verbose=1; shift ;;
	-h | --help) usage; exit 0 ;;
	*) die "unknown option '$1' (see --help)" ;;
	esac
done
[[ $vm_timeout =~ ^[1-9][0-9]*$ ]] || die "--timeout wants seconds, got '$vm_timeout'"
[[ $test_timeout =~ ^[1-9][0-9]*$ ]] || die "--test-timeout wants seconds, got '$test_timeout'"
case $accel in auto | kvm | tcg) ;; *) die "--accel wants auto, kvm or tcg, got '$accel'" ;; esac

# ---------------------------------------------------------------------------------------------
# Cleanup: everything this script started is killed by pid; the work dir goes unless --keep.

work=
qemu_pid=
fetch_tmp=
# shellcheck disable=SC2317 # reached through the trap
cleanup()
{
	local rc=$?
	[[ -z $fetch_tmp ]] || rm -rf "$fetch_tmp"
	if [[ -n $qemu_pid ]] && kill -0 "$qemu_pid" 2>/dev/null; then
		# qemu_pid is the timeout(1) wrapper: TERM reaches qemu through it.
		kill -TERM "$qemu_pid" 2>/dev/null || true
		sleep 1
		kill -KILL "$qemu_pid" 2>/dev/null || true
		wait "$qemu_pid" 2>/dev/null || true
	fi
	if [[ -n $work && -d $work ]]; then
		if [[ $keep -eq 1 ]]; then
			say "kept work dir $work"
		else
			rm -rf "$work"
		fi
	fi
	exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

start_s=$SECONDS

# ---------------------------------------------------------------------------------------------
# Host packages.

if ! bash "$ci_dir/deps.sh" vm; then
	die "the vm packages are missing (run ci/deps.sh vm as root)"
fi
for tool in qemu-system-x86_64 cpio gzip ldd depmod modprobe apt-get apt-cache dpkg flock; do
	command -v "$tool" >/dev/null 2>&1 || die "$tool not found"
done
busybox_bin=$(command -v busybox || true)
[[ -n $busybox_bin ]] || die "busybox not found (package busybox-static)"
if ldd "$busybox_bin" >/dev/null 2>&1; then
	die "$busybox_bin is dynamically linked; the guest needs busybox-static"
fi

# ---------------------------------------------------------------------------------------------
# Kernel and modules, cached.

cache_dir=${FERRY_VM_CACHE:-/var/cache/ferry-vm}
if ! mkdir -p "$cache_dir" 2>/dev/null || [[ ! -w $cache_dir ]]; then
	[[ -z ${FERRY_VM_CACHE:-} ]] || die "cache dir $cache_dir is not writable"
	cache_dir=${XDG_CACHE_HOME:-$HOME/.cache}/ferry-vm
	mkdir -p "$cache_dir" || die "cannot create $cache_dir"
fi

as_root()
{
	if [[ $(id -u) -eq 0 ]]; then
		"$@"
	elif command -v sudo >/dev/null 2>&1 && sudo -n true 2>/dev/null; then
		sudo -n "$@"
	else
		return 1
	fi
}

# The ABI package's name changes with every kernel update: resolve it through the meta package.
resolve_kernel_pkg()
{
	apt-cache depends linux-image-amd64 2>/dev/null |
		awk '!found && /Depends: linux-image-[0-9]/ { print $2; found = 1 }'
}

# Unpacks one module into $2, decompressing .ko.xz/.ko.zst/.ko.gz (busybox insmod wants a .ko).
copy_module()
{
	local src=$1 dst_dir=$2 base
	base=${src##*/}
	case $src in
	*.ko) cp "$src" "$dst_dir/$base" ;;
	*.ko.xz) xz -dc "$src" >"$dst_dir/${base%.xz}" ;;
	*.ko.zst) zstd -qdc "$src" >"$dst_dir/${base%.zst}" ;;
	*.ko.gz) gzip -dc "$src" >"$dst_dir/${base%.gz}" ;;
	*) return 1 ;;
	esac
}

# Fills $cache_dir/<pkg>/ with vmlinuz, kver, modules.list and modules/*.ko; sets kdir.
fetch_kernel()
{
	local pkg tmp deb kver mroot m out mods=() seen_mods=" " line f
	pkg=$(resolve_kernel_pkg || true)
	if [[ -n $pkg && -f $cache_dir/$pkg/.complete ]] &&
		[[ $(<"$cache_dir/$pkg/.complete") == "$CACHE_FORMAT" ]]; then
		kdir=$cache_dir/$pkg
		say "kernel $(<"$kdir/kver") from cache $kdir"
		return 0
	fi
	if [[ -z $pkg ]]; then
		# No apt lists (a fresh container): refresh once, else use whatever is cached.
		as_root timeout --kill-after=10 300 apt-get -q update >/dev/null 2>&1 || true
		pkg=$(resolve_kernel_pkg || true)
	fi
	if [[ -z $pkg ]]; then
		for f in "$cache_dir"/*/.complete; do
			[[ -f $f && $(<"$f") == "$CACHE_FORMAT" ]] || continue
			kdir=${f%/.complete}
			say "apt cannot resolve linux-image-amd64; using cached kernel $kdir"
			return 0
		done
		die "cannot resolve linux-image-amd64 with apt-cache (no apt lists?) and nothing is cached"
	fi

	say "fetching kernel package $pkg into $cache_dir"
	tmp=$(mktemp -d "$cache_dir/.fetch.XXXXXX")
	fetch_tmp=$tmp # removed by cleanup, also when die() leaves early
	if ! (cd "$tmp" && timeout --kill-after=10 300 apt-get -q download "$pkg" >/dev/null 2>&1); then
		# Stale lists point at a superseded .deb: refresh them and try once more.
		as_root timeout --kill-after=10 300 apt-get -q update >/dev/null 2>&1 || true
		pkg=$(resolve_kernel_pkg || true)
		[[ -n $pkg ]] || die "linux-image-amd64 no longer resolves after apt-get update"
		(cd "$tmp" && timeout --kill-after=10 300 apt-get -q download "$pkg" >/dev/null) ||
			die "apt-get download $pkg failed"
	fi
	deb=$(find "$tmp" -maxdepth 1 -name '*.deb' -print -quit)
	[[ -n $deb ]] || die "apt-get download $pkg left no .deb"
	dpkg -x "$deb" "$tmp/root"
	# Newer packages are usr-merged (usr/lib/modules); depmod -b looks under lib/modules.
	if [[ ! -d $tmp/root/lib/modules && -d $tmp/root/usr/lib/modules ]]; then
		ln -s usr/lib "$tmp/root/lib"
	fi
	mroot=$tmp/root/lib/modules
	kver=$(find "$mroot" -mindepth 1 -maxdepth 1 -type d -printf '%f\n' | sort | tail -n 1)
	[[ -n $kver && -f $tmp/root/boot/vmlinuz-$kver ]] || die "$pkg has no kernel/modules pair"
	# The .deb ships no modules.dep.
	depmod -b "$tmp/root" "$kver"

	for m in $TOP_MODULES; do
		if ! out=$(modprobe -C /dev/null -d "$tmp/root" -S "$kver" --show-depends "$m" 2>&1); then
			if [[ " $OPTIONAL_MODULES " == *" $m "* ]]; then
				say "note: module $m not in $kver (built in or no longer needed)"
				continue
			fi
			die "module $m: $out"
		fi
		while read -r line; do
			[[ $line == insmod\ * ]] || continue # "builtin X" needs nothing
			f=${line#insmod }
			f=${f%% *}
			[[ $seen_mods == *" $f "* ]] && continue
			seen_mods+="$f "
			mods+=("$f")
		done <<<"$out"
	done

	mkdir -p "$tmp/out/modules"
	: >"$tmp/out/modules.list"
	for f in "${mods[@]}"; do
		copy_module "$f" "$tmp/out/modules" || die "cannot unpack module $f"
		m=${f##*/}
		m=${m%.xz}
		m=${m%.zst}
		m=${m%.gz}
		printf '%s\n' "$m" >>"$tmp/out/modules.list"
	done
	cp "$tmp/root/boot/vmlinuz-$kver" "$tmp/out/vmlinuz"
	printf '%s\n' "$kver" >"$tmp/out/kver"
	printf '%s\n' "$pkg" >"$tmp/out/package"
	printf '%s\n' "$CACHE_FORMAT" >"$tmp/out/.complete"
	rm -rf "${cache_dir:?}/$pkg"
	mv "$tmp/out" "$cache_dir/$pkg"
	kdir=$cache_dir/$pkg
	rm -rf "$tmp"
	fetch_tmp=
	say "cached kernel $kver and ${#mods[@]} modules in $kdir"
}

kdir=
t0=$SECONDS
exec {lock_fd}>"$cache_dir/.lock"
flock -w 600 "$lock_fd" || die "timed out waiting for the cache lock $cache_dir/.lock"
fetch_kernel
flock -u "$lock_fd"
kver=$(<"$kdir/kver")
t_kernel=$((SECONDS - t0))

# ---------------------------------------------------------------------------------------------
# Binaries to carry into the guest.

[[ -d $build_dir ]] || die "build dir '$build_dir' does not exist (build first, or pass --build-dir)"
build_dir=$(cd "$build_dir" && pwd)
[[ -n $log_file ]] || log_file=$build_dir/softroce-vm.log

test_bins=()
if [[ -n $tests_glob && -d $build_dir/tests ]]; then
	mapfile -t test_bins < <(find "$build_dir/tests" -maxdepth 1 -type f -perm -u+x \
		-name "$tests_glob" | LC_ALL=C sort)
fi
tool_bins=()
for d in bench tools; do
	[[ -d $build_dir/$d ]] || continue
	mapfile -t -O "${#tool_bins[@]}" tool_bins < <(find "$build_dir/$d" -maxdepth 1 -type f \
		-perm -u+x -name 'ferry-*' | LC_ALL=C sort)
done
for b in "${bins[@]}"; do
	[[ -f $b && -x $b ]] || die "--bin $b: not an executable file"
	tool_bins+=("$(cd "$(dirname "$b")" && pwd)/$(basename "$b")")
done
if [[ ${#test_bins[@]} -eq 0 ]]; then
	say "note: no executable matches '$tests_glob' in $build_dir/tests: running the baselines only"
fi
declare -A guest_names=()
for b in "${test_bins[@]}" "${tool_bins[@]}"; do
	n=${b##*/}
	[[ -z ${guest_names[$n]:-} || ${guest_names[$n]} == "$b" ]] ||
		die "two binaries named $n: ${guest_names[$n]} and $b"
	guest_names[$n]=$b
done

# ---------------------------------------------------------------------------------------------
# The initramfs.

t0=$SECONDS
work=$(mktemp -d "${TMPDIR:-/tmp}/ferry-vm.XXXXXX")
root=$work/root
mkdir -p "$root"/{usr/bin,usr/sbin,usr/lib,usr/lib64,usr/local/bin,proc,sys,dev,tmp,run,etc,root,ferry/cmd}
ln -s usr/bin "$root/bin"
ln -s usr/sbin "$root/sbin"
ln -s usr/lib "$root/lib"
ln -s usr/lib64 "$root/lib64"
cp "$busybox_bin" "$root/usr/bin/busybox"

declare -A copied=()
# Copies a host file to the same path in the guest (usr-merged: /lib -> /usr/lib).
copy_path()
{
	local src=$1
	[[ -z ${copied[$src]:-} ]] || return 0
	copied[$src]=1
	mkdir -p "$root$(dirname "$src")"
	cp -L "$src" "$root$src"
}
# Copies every library ldd lists for $1 (and the loader).
copy_libs()
{
	local out lib
	out=$(ldd "$1" 2>&1) || return 0 # static, or not an ELF file (a script)
	if grep -q 'not found' <<<"$out"; then
		die "$1: ldd cannot find: $(grep 'not found' <<<"$out" | tr -s ' \t\n' ' ')"
	fi
	while read -r lib; do
		copy_path "$lib"
	done < <(awk '$2 == "=>" && $3 ~ /^\// { print $3 } $1 ~ /^\// { print $1 }' <<<"$out")
}
# Copies a binary to /usr/local/bin in the guest, with its libraries.
copy_bin()
{
	local src=$1 dst=$root/usr/local/bin/${1##*/} strip=${2:-0}
	cp -L "$src" "$dst"
	chmod 755 "$dst"
	# Debug info only costs unpack time in a TCG guest; symbols stay for backtraces.
	if [[ $strip -eq 1 ]] && command -v objcopy >/dev/null 2>&1; then
		objcopy --strip-debug "$dst" 2>/dev/null || cp -L "$src" "$dst"
	fi
	copy_libs "$src"
}

for tool in rdma ip ibv_devices ibv_devinfo ib_read_lat ib_write_lat ib_send_lat timeout; do
	p=$(PATH=/usr/sbin:/usr/bin:/sbin:/bin:$PATH command -v "$tool" || true)
	[[ -n $p ]] || die "$tool not found on the host"
	copy_bin "$p"
done
# The rxe provider is dlopened by libibverbs, so ldd never lists it.
rxe_provider=$(find /usr/lib/x86_64-linux-gnu/libibverbs /usr/lib64/libibverbs -maxdepth 1 \
	-name 'librxe-rdmav*.so' -print -quit 2>/dev/null || true)
[[ -n $rxe_provider ]] || die "the rxe provider librxe-rdmav*.so is missing (package ibverbs-providers)"
copy_path "$rxe_provider"
copy_libs "$rxe_provider"
[[ -f /etc/libibverbs.d/rxe.driver ]] || die "/etc/libibverbs.d/rxe.driver is missing"
copy_path /etc/libibverbs.d/rxe.driver
# glibc dlopens libgcc_s.so.1 when a thread exits; ldd does not list it.
# (awk reads to the end: an early exit would kill ldconfig with SIGPIPE, fatal under pipefail.)
libgcc_s=$(ldconfig -p | awk '!found && /libgcc_s\.so\.1 .*x86-64/ { print $NF; found = 1 }')
[[ -n $libgcc_s ]] || die "libgcc_s.so.1 not found (ldconfig -p)"
copy_path "$libgcc_s"

for b in "${test_bins[@]}"; do
	copy_bin "$b" 1
	printf '%s\n' "${b##*/}" >>"$root/ferry/tests"
done
for b in "${tool_bins[@]}"; do
	copy_bin "$b" 1
done
[[ -f $root/ferry/tests ]] || : >"$root/ferry/tests"

mkdir -p "$root/lib/modules/$kver"
cp "$kdir"/modules/*.ko "$root/lib/modules/$kver/"
cp "$kdir/modules.list" "$root/ferry/modules.list"

cat >"$root/etc/passwd" <<'EOF'
root:x:0:0:root:/root:/bin/sh
nobody:x:65534:65534:nobody:/nonexistent:/bin/false
EOF
cat >"$root/etc/group" <<'EOF'
root:x:0:
nogroup:x:65534:
EOF
printf '127.0.0.1\tlocalhost\n%s\tferry-vm\n' "$GUEST_IP" >"$root/etc/hosts"
printf 'hosts: files\n' >"$root/etc/nsswitch.conf"

# Single-quotes a string for the guest shell.
sq() { printf "'%s'" "${1//\'/\'\\\'\'}"; }

IFS=. read -r o1 o2 o3 o4 <<<"$GUEST_IP"
{
	printf 'KVER=%s\n' "$(sq "$kver")"
	printf 'GUEST_IP=%s\nGUEST_PREFIX=%s\n' "$GUEST_IP" "$GUEST_PREFIX"
	# The IPv4-mapped GID ends in ffff:<ip as two hex words>.
	printf 'GID_SUFFIX=ffff:%02x%02x:%02x%02x\n' "$o1" "$o2" "$o3" "$o4"
	printf 'TEST_TIMEOUT=%s\nBASELINE=%s\nVERBOSE=%s\n' "$test_timeout" "$baseline" "$verbose"
	printf 'PORT_READ_HEX=%04X\nPORT_WRITE_HEX=%04X\nPORT_SEND_HEX=%04X\nPORT_SENDEV_HEX=%04X\n' \
		18515 18516 18517 18518
} >"$root/ferry/config"
: >"$root/ferry/env.sh"
for e in "${envs[@]}"; do
	printf 'export %s=%s\n' "${e%%=*}" "$(sq "${e#*=}")" >>"$root/ferry/env.sh"
done
# Debian's busybox runs its own applets in preference to PATH (FEATURE_SH_STANDALONE), so a bare
# `timeout` or `ip` in the guest shell would be busybox's: shadow those applets with functions
# that call the host's binaries carried in /usr/local/bin.
{
	echo '# Generated by ci/softroce-vm.sh: host binaries win over busybox applets of the same name.'
	declare -A applets=()
	while read -r n; do applets[$n]=1; done < <("$busybox_bin" --list)
	for f in "$root"/usr/local/bin/*; do
		n=${f##*/}
		if [[ -n ${applets[$n]:-} ]]; then
			printf '%s() { /usr/local/bin/%s "$@"; }\n' "$n" "$n"
		fi
	done
} >"$root/ferry/prelude.sh"
i=0
for c in "${cmds[@]}"; do
	i=$((i + 1))
	printf '%s\n' "$c" >"$root/ferry/cmd/$i.sh"
done

cat >"$root/init" <<'GUEST_INIT'
#!/bin/busybox sh
# Generated by ci/softroce-vm.sh. Runs as pid 1 in the SoftRoCE guest; writes to the serial
# console. Never returns: every path ends in finish (poweroff).
/bin/busybox --install -s
export PATH=/usr/local/bin:/usr/bin:/usr/sbin:/bin:/sbin
export HOME=/root TMPDIR=/tmp LC_ALL=C TERM=dumb
mount -t proc proc /proc
mount -t sysfs sysfs /sys
# Without devtmpfs there is no /dev/infiniband, and ibv_devices lists nothing (exit 0).
mount -t devtmpfs devtmpfs /dev
mkdir -p /dev/pts /dev/shm
mount -t devpts devpts /dev/pts
mount -t tmpfs -o mode=1777 tmpfs /tmp
mount -t tmpfs -o mode=1777 tmpfs /dev/shm
echo /sbin/modprobe >/proc/sys/kernel/modprobe
ulimit -l unlimited
ulimit -c 0
hostname ferry-vm
. /ferry/config
. /ferry/prelude.sh
# The leading newline parts this line from the firmware's escape sequences on the console.
echo
echo "VMINFO guest up: kernel $(uname -r), $(nproc) cpus"

pass=0
fail=0
NOW=0
# Centiseconds since boot, without a fork (TCG makes forks dear).
now() {
	read -r up _ </proc/uptime
	NOW=$((${up%.*} * 100 + 1${up#*.} - 100))
}
secs() { # $1 centiseconds -> SECS
	SECS=$(($1 / 100)).$(($1 % 100 / 10))$(($1 % 10))
}
finish() {
	echo "VMRESULT pass=$pass fail=$fail"
	sync
	poweroff -f
	sleep 10
}
setup_fail() {
	echo "VMTEST vm-setup FAIL 0s"
	echo "  | $*"
	dmesg | tail -n 20 | sed 's/^/  | dmesg: /'
	fail=$((fail + 1))
	finish
}

while read -r m; do
	insmod "/lib/modules/$KVER/$m" || setup_fail "insmod $m failed"
done </ferry/modules.list

ip link set lo up
[ -e /sys/class/net/dummy0 ] || ip link add dummy0 type dummy || setup_fail "no dummy0"
ip link set dummy0 up
ip addr add "$GUEST_IP/$GUEST_PREFIX" dev dummy0 || setup_fail "ip addr add failed"
# Needs crc32_generic loaded; its own error says only "No such file or directory".
rdma link add rxe0 type rxe netdev dummy0 || setup_fail "rdma link add rxe0 failed"
[ -e /sys/class/infiniband/rxe0 ] || setup_fail "/sys/class/infiniband/rxe0 missing"

# RoCE needs a GID index; the IPv4 GID appears once the address is up. Builtins only, and only
# the first 16 entries: a fork per entry costs seconds under TCG.
gid_idx=
tries=0
while [ -z "$gid_idx" ] && [ $tries -lt 50 ]; do
	i=0
	while [ $i -lt 16 ]; do
		g=
		t=
		read -r g 2>/dev/null </sys/class/infiniband/rxe0/ports/1/gids/$i
		case "$g" in
		*"$GID_SUFFIX")
			read -r t 2>/dev/null </sys/class/infiniband/rxe0/ports/1/gid_attrs/types/$i
			if [ "$t" = "RoCE v2" ]; then
				gid_idx=$i
				break
			fi
			;;
		esac
		i=$((i + 1))
	done
	[ -n "$gid_idx" ] || { tries=$((tries + 1)); sleep 0.1; }
done
[ -n "$gid_idx" ] || setup_fail "no RoCE v2 GID for $GUEST_IP on rxe0 in the first 16 entries"

devs=$(ibv_devices 2>&1)
case "$devs" in
*rxe0*) ;;
*) setup_fail "ibv_devices does not list rxe0: $devs" ;;
esac
mtu=$(ibv_devinfo -d rxe0 -i 1 2>/dev/null | awk '$1 == "active_mtu:" { print $2; exit }')
echo "VMINFO rxe0 up on dummy0 $GUEST_IP/$GUEST_PREFIX, gid index $gid_idx, active_mtu $mtu"

export FERRY_RDMA_DEVICE=rxe0 FERRY_RDMA_GID_INDEX=$gid_idx FERRY_TEST_IN_VM=1
export FERRY_TEST_RDMA_ADDR=$GUEST_IP

report() { # name rc centiseconds log show-output
	secs "$3"
	if [ "$2" -eq 0 ]; then
		st=PASS
	elif [ "$2" -eq 124 ] || [ "$2" -eq 137 ]; then
		st=TIMEOUT
	else
		st=FAIL
	fi
	echo "VMTEST $1 $st ${SECS}s"
	if [ "$st" = PASS ]; then
		pass=$((pass + 1))
	else
		fail=$((fail + 1))
	fi
	if [ "$5" = all ] || [ "$VERBOSE" = 1 ]; then
		sed 's/^/  | /' "$4"
	elif [ "$st" != PASS ]; then
		# the failed cases first (their lines scroll away behind the log), then the tail
		grep -h -A4 -e '\[FAIL\]' -e 'Assertion Failed' -e 'CRASH' "$4" | head -n 60 |
			sed 's/^/  | failed: /'
		tail -n 40 "$4" | sed 's/^/  | /'
	else
		# Criterion's one-line count shows that the tests ran, not only started.
		grep -h 'Synthesis:' "$4" | sed 's/^/  | /'
	fi
	[ "$st" = PASS ] || echo "  | exit status $2"
}

wait_listen() { # hex port: poll /proc/net/tcp{,6} with builtins
	n=0
	while [ $n -lt 150 ]; do
		for f in /proc/net/tcp /proc/net/tcp6; do
			while read -r _ l _ st _; do
				case "$l:$st" in *":$1:0A") return 0 ;; esac
			done <$f
		done
		sleep 0.1
		n=$((n + 1))
	done
	return 1
}

# perftest converts cycles to microseconds with a clock rate it samples itself; under TCG on a
# busy host that sample is often rejected and every figure reads "inf". So ask for cycles (-C)
# and divide by the guest's nominal TSC rate.
MHZ=
while IFS=: read -r k v; do
	case "$k" in "cpu MHz"*) MHZ=${v# }; break ;; esac
done </proc/cpuinfo

# perf_baseline NAME HEXPORT PORT [FLAGS]: runs perftest tool NAME's first word (ib_*_lat) with
# FLAGS on both sides; its output goes to /tmp/NAME.client and .server (NAME may carry a suffix:
# ib_send_lat-e is ib_send_lat -e, the event mode)
perf_baseline() {
	tool=$1
	bin=${1%%-*}
	now
	t0=$NOW
	# shellcheck disable=SC2086 # $4: the flags, word-split on purpose
	timeout -k 5 60 $bin -d rxe0 -x "$gid_idx" -s 64 -n 1000 -F -C -p "$3" $4 \
		>/tmp/$tool.server 2>&1 </dev/null &
	spid=$!
	if wait_listen "$2"; then
		# shellcheck disable=SC2086
		timeout -k 5 60 $bin -d rxe0 -x "$gid_idx" -s 64 -n 1000 -F -C -p "$3" $4 "$GUEST_IP" \
			>/tmp/$tool.client 2>&1 </dev/null
		rc=$?
	else
		echo "server never listened on port $3" >/tmp/$tool.client
		rc=1
	fi
	wait $spid
	src=$?
	[ $rc -ne 0 ] || rc=$src
	now
	cat /tmp/$tool.client /tmp/$tool.server >/tmp/$tool.log
	# perftest's header: "#bytes #iterations t_min[cycles] t_max t_typical t_avg t_stdev
	# 99% percentile[cycles] 99.9% percentile"; the percentile columns take two header words
	# each. t_typical is the median.
	line=$(awk -v mhz="$MHZ" '
		/#bytes/ {
			n = 0
			for (i = 1; i <= NF; i++)
				if ($i !~ /^percentile/) { k = $i; sub(/\[.*/, "", k); col[k] = ++n }
			hdr = 1
			next
		}
		hdr && $1 ~ /^[0-9]+$/ && NF >= 8 && mhz > 0 {
			printf "bytes=%s iters=%s p50=%.2fus p99=%.2fus min=%.2fus avg=%.2fus max=%.2fus (%s MHz)",
				$1, $2, $(col["t_typical"]) / mhz, $(col["99%"]) / mhz,
				$(col["t_min"]) / mhz, $(col["t_avg"]) / mhz, $(col["t_max"]) / mhz, mhz
			exit
		}' /tmp/$tool.client)
	if [ $rc -eq 0 ] && [ -z "$line" ]; then
		echo "no result line in the client output (cpu MHz '$MHZ')" >>/tmp/$tool.log
		rc=1
	fi
	report "baseline/$tool" $rc $((NOW - t0)) /tmp/$tool.log
	[ -z "$line" ] || echo "VMBASE $tool $line"
}

if [ "$BASELINE" = 1 ]; then
	perf_baseline ib_read_lat "$PORT_READ_HEX" 18515
	perf_baseline ib_write_lat "$PORT_WRITE_HEX" 18516
	# the floors of a message round trip (SEND/RECV, as Ferry's frames): busy-polling the CQ,
	# and sleeping on CQ events (-e), the floor of Ferry's blocking mode
	perf_baseline ib_send_lat "$PORT_SEND_HEX" 18517
	perf_baseline ib_send_lat-e "$PORT_SENDEV_HEX" 18518 -e
fi

. /ferry/env.sh
cd /tmp
while read -r name; do
	[ -n "$name" ] || continue
	now
	t0=$NOW
	timeout -k 10 "$TEST_TIMEOUT" "/usr/local/bin/$name" --jobs 1 \
		>/tmp/test.log 2>&1 </dev/null
	rc=$?
	now
	report "$name" $rc $((NOW - t0)) /tmp/test.log
done </ferry/tests

i=1
while [ -f /ferry/cmd/$i.sh ]; do
	now
	t0=$NOW
	timeout -k 10 "$TEST_TIMEOUT" sh -c '. /ferry/prelude.sh; . "$1"' sh /ferry/cmd/$i.sh \
		>/tmp/cmd.log 2>&1 </dev/null
	rc=$?
	now
	report "cmd$i" $rc $((NOW - t0)) /tmp/cmd.log all
	i=$((i + 1))
done

finish
GUEST_INIT
chmod 755 "$root/init"

(cd "$root" && find . -print0 | cpio --null -o -H newc -R 0:0 --quiet) | gzip -1 >"$work/initramfs.cpio.gz"
cp "$kdir/vmlinuz" "$work/vmlinuz"
t_initramfs=$((SECONDS - t0))
say "initramfs $(du -h "$work/initramfs.cpio.gz" | cut -f1) (${#test_bins[@]} tests, ${#tool_bins[@]} tools, $(wc -l <"$kdir/modules.list") modules) built in ${t_initramfs}s"

# ---------------------------------------------------------------------------------------------
# Boot, bounded, without stdin; stream the guest's result lines; judge from the log.

# /dev/kvm alone is not enough: a nested host may expose it without vmx/svm, and then qemu
# asserts (kvm_buf_set_msrs) or the guest hangs before its first line. The boot watchdog in
# run_qemu catches what this test misses.
kvm_dev_ok() { [[ -c /dev/kvm && -r /dev/kvm && -w /dev/kvm ]]; }
kvm_usable() { kvm_dev_ok && grep -qE '^flags.*\b(vmx|svm)\b' /proc/cpuinfo; }
if [[ $accel == auto ]]; then
	if kvm_usable; then accel=kvm; else accel=tcg; fi
	accel_auto=1
else
	accel_auto=0
	[[ $accel != kvm ]] || kvm_dev_ok || die "--accel kvm: /dev/kvm is missing or not accessible"
fi

mkdir -p "$(dirname "$log_file")"
log_file=$(cd "$(dirname "$log_file")" && pwd)/$(basename "$log_file")

# Prints a guest console line on the host: result lines always, everything with --verbose.
show_line()
{
	local l=${1%$'\r'}
	if [[ $verbose -eq 1 ]]; then
		printf '%s\n' "$l"
	else
		case $l in
		VM* | "  | "* | *"Kernel panic"*) printf '%s\n' "$l" ;;
		esac
	fi
}

# Runs qemu once with accelerator $1; returns qemu's (timeout's) status. Sets booted=1 once the
# guest's /init has spoken.
booted=0
run_qemu()
{
	local acc=$1 fd line buf='' rc start boot_limit
	local -a accel_args
	if [[ $acc == kvm ]]; then
		accel_args=(-accel kvm -cpu host)
		boot_limit=20
	else
		# shellcheck disable=SC2054 # the comma is qemu's
		accel_args=(-accel tcg,thread=multi -cpu max)
		boot_limit=300
	fi
	local -a qemu=(qemu-system-x86_64 "${accel_args[@]}" -smp "$vm_smp" -m "$vm_mem"
		-kernel "$work/vmlinuz" -initrd "$work/initramfs.cpio.gz"
		-append "console=ttyS0 panic=-1 loglevel=4 rdinit=/init"
		-nographic -no-reboot -nic none)
	printf '%q ' "${qemu[@]}" >"$work/qemu-cmdline"
	say "booting $kver under qemu ($acc, $vm_smp vCPUs, $vm_mem MB), bound ${vm_timeout}s; log $log_file"
	: >"$log_file"
	start=$SECONDS
	timeout --kill-after=10 "$vm_timeout" "${qemu[@]}" </dev/null >"$log_file" 2>&1 &
	qemu_pid=$!
	exec {fd}<"$log_file"
	while :; do
		while IFS= read -r line <&"$fd"; do
			line=$buf$line
			buf=
			[[ $line != *VMINFO\ guest\ up* ]] || booted=1
			show_line "$line"
		done
		buf+=$line
		kill -0 "$qemu_pid" 2>/dev/null || break
		if [[ $booted -eq 0 && $((SECONDS - start)) -gt $boot_limit ]]; then
			say "the guest did not reach /init within ${boot_limit}s"
			kill -TERM "$qemu_pid" 2>/dev/null || true
		fi
		sleep 0.5
	done
	rc=0
	wait "$qemu_pid" || rc=$?
	qemu_pid=
	while IFS= read -r line <&"$fd" || [[ -n $line ]]; do
		line=$buf$line
		buf=
		[[ $line != *VMINFO\ guest\ up* ]] || booted=1
		show_line "$line"
	done
	exec {fd}<&-
	return "$rc"
}

t0=$SECONDS
qrc=0
run_qemu "$accel" || qrc=$?
if [[ $booted -eq 0 && $accel == kvm && $accel_auto -eq 1 ]]; then
	say "KVM guest never started (qemu status $qrc); retrying under TCG"
	grep -m 3 -i 'kvm' "$log_file" | sed 's/^/  | /' || true
	accel=tcg
	qrc=0
	run_qemu tcg || qrc=$?
fi
t_vm=$((SECONDS - t0))

verdict=$(tr -d '\r' <"$log_file" | grep -E '^VMRESULT pass=[0-9]+ fail=[0-9]+' | tail -n 1 || true)
timing="kernel ${t_kernel}s, initramfs ${t_initramfs}s, vm ${t_vm}s, total $((SECONDS - start_s))s"
if [[ -z $verdict ]]; then
	if [[ $qrc -eq 124 || $qrc -eq 137 ]]; then
		say "NO VERDICT: the VM ran past --timeout ${vm_timeout}s ($accel; $timing)"
	else
		say "NO VERDICT: qemu exited with status $qrc before the guest reported ($accel; $timing)"
	fi
	say "last lines of $log_file:"
	tr -d '\r' <"$log_file" | tail -n 30 | sed 's/^/  | /'
	exit 2
fi
vpass=${verdict#*pass=}
vpass=${vpass%% *}
vfail=${verdict##*fail=}
say "pass=$vpass fail=$vfail ($accel; $timing)"
if [[ $keep -eq 1 ]]; then
	say "rerun by hand: $(<"$work/qemu-cmdline")"
fi
[[ $vfail -eq 0 ]] || exit 1
exit 0
