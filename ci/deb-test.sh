#!/usr/bin/env bash
# ci/deb-test.sh - build the Debian package of a build tree (CPack, `cpack -G DEB`) and check it
# without installing it on this machine: its control fields, that it holds the library, the
# headers, the CMake and pkg-config files and the tools, and, unpacked into a temporary root
# (dpkg -x), that the tools run and that a program compiles and links against it through
# pkg-config and runs.
#
#   bash ci/deb-test.sh [--build-dir DIR] [--keep DIR]
#
# --keep DIR copies the .deb there. ctest runs it as `deb_package` when cpack, dpkg-deb and
# dpkg-shlibdeps are there (Debian: cmake, dpkg-dev); about 10 s. Install the package for real
# with `apt-get install ./libferry_<version>_<arch>.deb`.
set -euo pipefail

build=build
keep=
while [[ $# -gt 0 ]]; do
	case $1 in
	--build-dir) build=$2; shift ;;
	--keep) keep=$2; shift ;;
	-h | --help) sed -n '2,13s/^# \{0,1\}//p' "$0"; exit 0 ;;
	*) echo "deb-test: unknown option '$1'" >&2; exit 2 ;;
	esac
	shift
done
for t in cpack dpkg-deb dpkg-shlibdeps cc pkg-config; do
	command -v "$t" >/dev/null || { echo "deb-test: $t is missing (bash ci/deps.sh build; dpkg-dev)" >&2; exit 2; }
done
[[ -f $build/CPackConfig.cmake ]] || { echo "deb-test: $build has no CPackConfig.cmake; configure and build first" >&2; exit 2; }
build=$(cd "$build" && pwd)
tmp=$(mktemp -d /tmp/ferry-deb.XXXXXX)
trap 'rm -rf "$tmp"' EXIT
fail() { echo "deb-test: FAILED: $*"; exit 1; }

(cd "$tmp" && timeout 300 cpack -G DEB --config "$build/CPackConfig.cmake" -B "$tmp/out") \
	>"$tmp/cpack.log" 2>&1 || { tail -n 20 "$tmp/cpack.log"; fail "cpack -G DEB"; }
deb=$(find "$tmp/out" -maxdepth 1 -name 'libferry_*.deb' | head -n 1)
[[ -n $deb ]] || fail "cpack made no libferry_*.deb"
echo "deb-test: built $(basename "$deb") ($(stat -c %s "$deb") bytes)"

dpkg-deb -f "$deb" Package Version Architecture Depends >"$tmp/control"
grep -q '^Package: libferry$' "$tmp/control" || fail "Package is not libferry"
grep -q '^Depends:.*liburcu' "$tmp/control" || fail "Depends does not name liburcu: $(cat "$tmp/control")"
dpkg-deb -c "$deb" | awk '{ print $6 }' | sed 's|^\./||' >"$tmp/files"
for f in usr/include/ferry/ferry.h usr/lib/pkgconfig/ferry.pc usr/lib/cmake/ferry/ferryConfig.cmake \
	usr/lib/libferry.a usr/bin/ferry-info usr/bin/ferry-bench usr/bin/ferry-mf usr/bin/ferry-dp; do
	grep -q "^$f\$" "$tmp/files" || fail "the package lacks /$f"
done
grep -q '^usr/lib/libferry\.so\.0' "$tmp/files" || fail "the package lacks libferry.so.0"

root=$tmp/root
dpkg -x "$deb" "$root"
"$root/usr/bin/ferry-info" --version >"$tmp/v" || fail "ferry-info --version"
"$root/usr/bin/ferry-mf" --version >>"$tmp/v" || fail "ferry-mf --version"
grep -q "$(dpkg-deb -f "$deb" Version)" "$tmp/v" || fail "the tools' version is not the package's: $(cat "$tmp/v")"

cat >"$tmp/app.c" <<'C'
#include <stdio.h>
#include <string.h>
#include <ferry/ferry.h>

int main(void)
{
	printf("%s\n", ferry_version());
	return strlen(ferry_version()) ? 0 : 1;
}
C
export PKG_CONFIG_PATH=$root/usr/lib/pkgconfig
# shellcheck disable=SC2046
cc -o "$tmp/app" "$tmp/app.c" $(pkg-config --cflags --libs ferry) || fail "compiling against the package"
LD_LIBRARY_PATH=$root/usr/lib "$tmp/app" >"$tmp/app.out" || fail "a program linked to libferry.so"
ldd "$tmp/app" | grep -q "$root/usr/lib/libferry.so.0" 2>/dev/null ||
	LD_LIBRARY_PATH=$root/usr/lib ldd "$tmp/app" | grep -q "$root/usr/lib/libferry.so.0" ||
	fail "the program did not load the package's libferry.so.0"
echo "deb-test: unpacked: tools run, a program builds with pkg-config and runs ($(cat "$tmp/app.out"))"
if [[ -n $keep ]]; then
	mkdir -p "$keep"
	cp "$deb" "$keep/"
	echo "deb-test: kept $keep/$(basename "$deb")"
fi
echo "deb-test: ok"
