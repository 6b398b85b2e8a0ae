#!/usr/bin/env bash
# tests/transport/tsan/run.sh - the transport suite under ThreadSanitizer.
#
#   bash tests/transport/tsan/run.sh [BUILD_DIR] [TEST_NAME_SUBSTRING]
#
# Criterion cannot start under TSan (see criterion/criterion.h), so this
# compiles tests/transport/test_transport.c against the stand-in here and
# links the libferry.a of BUILD_DIR, which must be configured with
# -DFERRY_SANITIZE=thread (default build-tsan/; it is configured and built
# when missing, without -Werror: gcc refuses atomic_thread_fence under TSan).
# Exit status: 0 when every test passed and TSan reported nothing.
set -euo pipefail
top=$(cd "$(dirname "${BASH_SOURCE[0]}")/../../.." && pwd)
build=${1:-$top/build-tsan}
here=$top/tests/transport/tsan

if [[ ! -f $build/libferry.a ]]; then
	cmake -S "$top" -B "$build" -DFERRY_SANITIZE=thread -DFERRY_TESTS=OFF >/dev/null
	cmake --build "$build" -j2 --target ferry_static
fi
grep -q 'FERRY_SANITIZE:STRING=thread' "$build/CMakeCache.txt" || {
	echo "run.sh: $build is not a -DFERRY_SANITIZE=thread build" >&2
	exit 2
}
bin=$build/test_transport_tsan
# shellcheck disable=SC2046
gcc -std=gnu11 -g -O1 -fsanitize=thread -I"$here" -I"$top" -I"$top/include" -I"$top/tests" \
	"$top/tests/transport/test_transport.c" "$top/tests/common/tnode.c" "$here/crshim.c" \
	"$build/libferry.a" \
	$(pkg-config --libs liburcu-memb liburcu-cds libxxhash libsodium jansson) \
	$(pkg-config --libs libcurl pmix libibverbs librdmacm 2>/dev/null) -lpthread -o "$bin"
supp=
[[ -f $top/tests/tsan.supp ]] && supp="suppressions=$top/tests/tsan.supp"
export TSAN_OPTIONS="halt_on_error=1 exitcode=66 $supp ${TSAN_OPTIONS:-}"
exec "$bin" ${2:+"$2"}
