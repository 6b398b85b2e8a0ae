#!/usr/bin/env bash
# ci/check-layers.sh - check the architecture's rules (docs/architecture.md) on the sources and on
# the objects a build made of them.
#
#   bash ci/check-layers.sh [--build-dir DIR]      (default: build)
#
# Rules:
#   includes  no file under transport/ includes a lib/ header: the provider interface and the
#             transports stand below the core (transport/base/ holds what both share)
#   sizes     no file under lib/ or transport/ is over 1000 lines; every size is printed
#   layers    a library file calls (by symbol, read from the objects with nm) only files of its
#             own layer or of layers below it:
#               0 transport/base   1 transport/*   2 lib/store lib/dir   3 lib/core
#               4 lib/ops lib/coll lib/mgr   5 lib/reloc lib/ckpt lib/cons   6 lib/table   7 lib/*.c (ferry_open, local clusters)
#   circles   no two files of lib/ call each other, directly or through other files (the files
#             of one transport may: a provider's progress thread, receive and send paths call
#             each other by nature, as in libfabric's prov/verbs; they are listed, not failed)
# Prints one line per finding and "layers: N passed, N failed" last; exits 1 on any finding.
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."
build=build
while [[ $# -gt 0 ]]; do
	case $1 in
	--build-dir)
		[[ $# -ge 2 ]] || { echo "check-layers: --build-dir needs a folder" >&2; exit 2; }
		build=$2
		shift
		;;
	-h | --help)
		sed -n '2,/^set -euo/{/^set -euo/d;s/^# \{0,1\}//;p}' "$0"
		exit 0
		;;
	*)
		echo "check-layers: unknown option '$1' (see --help)" >&2
		exit 2
		;;
	esac
	shift
done

passed=0
failed=0
result()
{
	if [[ $2 -eq 0 ]]; then
		echo "check-layers: $1: ok"
		passed=$((passed + 1))
	else
		echo "check-layers: $1: FAILED"
		failed=$((failed + 1))
	fi
}

# ---- includes
bad=0
while IFS= read -r line; do
	echo "  $line: a transport includes a core header; move what it needs to transport/base/"
	bad=1
done < <(git ls-files -- 'transport/*.c' 'transport/*.h' | xargs grep -nE '^#include +"lib/' || true)
result includes $bad

# ---- sizes
bad=0
echo "check-layers: file sizes (lines) under lib/ and transport/:"
while read -r n f; do
	[[ $f == total ]] && continue
	mark=""
	if [[ $n -gt 1000 ]]; then
		mark="  <-- over 1000: split it by concern"
		bad=1
	fi
	printf '  %5d %s%s\n' "$n" "$f" "$mark"
done < <(git ls-files -- 'lib/*.c' 'lib/*.h' 'transport/*.c' 'transport/*.h' | xargs wc -l |
	sort -rn)
result sizes $bad

# ---- layers and circles, from the objects
layer_of()
{
	case $1 in
	transport/base/*) echo 0 ;;
	transport/*) echo 1 ;;
	lib/store/* | lib/dir/*) echo 2 ;;
	lib/core/*) echo 3 ;;
	lib/ops/* | lib/coll/* | lib/mgr/*) echo 4 ;;
	lib/reloc/* | lib/ckpt/* | lib/cons/*) echo 5 ;;
	lib/table/*) echo 6 ;;
	lib/*/*) echo 99 ;; # a new folder: give it a layer above
	lib/*) echo 7 ;;
	*) echo 99 ;;
	esac
}

objdir=$build/CMakeFiles/ferry_obj.dir
if [[ ! -d $objdir ]]; then
	echo "check-layers: no objects in $objdir; build first (cmake --build $build)" >&2
	exit 2
fi
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
missing=0
mapfile -t srcs < <(git ls-files -- 'lib/*.c' 'transport/*.c')
for src in "${srcs[@]}"; do
	obj=$objdir/$src.o
	if [[ ! -f $obj ]]; then
		# transport/rdma/ is not built without libibverbs: nothing to check there
		[[ $src == transport/rdma/* ]] && continue
		echo "  $src: no object at $obj (stale build?)"
		missing=1
		continue
	fi
	nm --defined-only -g "$obj" | awk -v f="$src" 'NF >= 3 { print $3, f }' >>"$tmp/defs"
	nm -u "$obj" | awk -v f="$src" '{ print $NF, f }' >>"$tmp/uses"
	echo "$src $(layer_of "$src")" >>"$tmp/layers"
done
[[ $missing -eq 0 ]] || { result objects 1; echo "layers: $passed passed, $failed failed"; exit 1; }

# edges: user file -> defining file (one line each, deduplicated)
awk 'NR == FNR { def[$1] = $2; next } ($1 in def) && def[$1] != $2 { print $2, def[$1] }' \
	"$tmp/defs" "$tmp/uses" | sort -u >"$tmp/edges"

bad=0
while read -r from to; do
	lf=$(layer_of "$from")
	lt=$(layer_of "$to")
	if [[ $lt -gt $lf ]]; then
		echo "  $from (layer $lf) calls $to (layer $lt): a call upward; register a handler or" \
			"pass a callback instead"
		bad=1
	fi
done <"$tmp/edges"
result layers $bad

# circles: transitive closure over the file graph (a few dozen files)
bad=0
while IFS= read -r line; do
	echo "  $line"
	[[ $line == "(ok) "* ]] || bad=1
done < <(awk '
	{ id[$1] = 1; id[$2] = 1; r[$1 SUBSEP $2] = 1 }
	END {
		n = 0
		for (f in id) name[n++] = f
		for (k = 0; k < n; k++)
			for (i = 0; i < n; i++) {
				if (!((name[i] SUBSEP name[k]) in r)) continue
				for (j = 0; j < n; j++)
					if ((name[k] SUBSEP name[j]) in r)
						r[name[i] SUBSEP name[j]] = 1
			}
		for (i = 0; i < n; i++)
			for (j = i + 1; j < n; j++)
				if ((name[i] SUBSEP name[j]) in r && (name[j] SUBSEP name[i]) in r)
					printf "%s%s and %s call each other (directly or through others)\n",
						name[i] ~ /^lib\// || name[j] ~ /^lib\// ? "" : "(ok) ",
						name[i], name[j]
	}' "$tmp/edges" | sort)
result circles $bad

echo "check-layers: $(wc -l <"$tmp/edges") calls between $(wc -l <"$tmp/layers") files"
echo "layers: $passed passed, $failed failed"
[[ $failed -eq 0 ]]
