#!/usr/bin/env bash
# The SDK installed somewhere it was not configured for (#36, "Conventions of an SDK"): a
# DESTDIR install of the build tree, then a C program built through pkg-config --define-prefix
# and --define-variable=prefix=..., and a CMake project through find_package, both against the
# relocated tree, and the two agreeing on the include dir and the library. An absolute libdir
# in knod-client.pc made pkg-config point at the configured prefix, where nothing is.
#
# Usage: sdk_relocated_test.sh SOURCE_DIR BUILD_DIR. Needs no root.
set -uo pipefail
src=${1:?usage: sdk_relocated_test.sh SOURCE_DIR BUILD_DIR}
build=${2:?usage: sdk_relocated_test.sh SOURCE_DIR BUILD_DIR}
work=$(mktemp -d /tmp/knod-sdk-relocated.XXXXXX)
trap 'rm -rf "$work"' EXIT
passed=0 failed=0
check() { if eval "$2"; then passed=$((passed + 1)); echo "ok - $1"; else failed=$((failed + 1)); echo "not ok - $1"; return 1; fi; }

DESTDIR=$work/root cmake --install "$build" >"$work/install.log" 2>&1
check "cmake --install into a DESTDIR" '[ $? -eq 0 ]' || tail -20 "$work/install.log"
pc=$(find "$work/root" -name knod-client.pc | head -1)
check "knod-client.pc is installed" '[ -n "$pc" ]' || exit 1
pcdir=$(dirname "$pc")
libdir=$(cd "$pcdir/.." && pwd) # <prefix>/<libdir>/pkgconfig
prefix=$(cd "$pcdir/../.." && pwd)
case "$libdir" in */lib/*-linux-gnu) prefix=$(cd "$libdir/../.." && pwd) ;; esac
check "no absolute libdir or includedir: both are relative to \${prefix}" \
    'grep -q "^libdir=\${prefix}/" "$pc" && grep -q "^includedir=\${prefix}/" "$pc" && ! grep -q "^URL:.*invalid" "$pc"' ||
    cat "$pc"
flags=$(PKG_CONFIG_PATH=$pcdir pkg-config --define-prefix --cflags --libs knod-client)
check "pkg-config --define-prefix names the relocated tree" \
    '[[ "$flags" == *"-I$prefix/include"* && "$flags" == *"-L$libdir"* ]]' || echo "# $flags"
flags2=$(PKG_CONFIG_PATH=$pcdir pkg-config --define-variable=prefix="$prefix" --cflags --libs knod-client)
check "pkg-config --define-variable=prefix= does too" '[ "$flags" = "$flags2" ]' || echo "# $flags2"
(cd "$work" && cc -std=c11 -Wall -Wextra -Werror "$src/tests/packaging/sdk/receive.c" $flags -o c-receive) >"$work/cc.log" 2>&1
check "a C program builds against the relocated tree" '[ $? -eq 0 ]' || cat "$work/cc.log"
LD_LIBRARY_PATH=$libdir "$work/c-receive" >"$work/run.log" 2>&1
check "and runs with its library (usage: exit 2)" '[ $? -eq 2 ] && grep -q usage "$work/run.log"' || cat "$work/run.log"
# Captured first: grep -q closing the pipe at its match would fail the pipeline under pipefail
# whenever ldd was still writing (it did, on a loaded machine).
links=$(LD_LIBRARY_PATH=$libdir ldd "$work/c-receive")
check "it links the relocated library" 'grep -q "libknod-client.so.1 => $libdir/" <<<"$links"'
grep -q "libknod-client.so.1 => $libdir/" <<<"$links" || echo "$links"
cmake -S "$src/tests/packaging/sdk" -B "$work/cmake" -DCMAKE_PREFIX_PATH="$prefix" >"$work/cmake.log" 2>&1 &&
    cmake --build "$work/cmake" >>"$work/cmake.log" 2>&1
check "a CMake project builds with find_package(knod-client) from the relocated tree" '[ $? -eq 0 ]' ||
    tail -20 "$work/cmake.log"
check "find_package and pkg-config agree on the library" \
    'grep -rqs -- "$libdir/libknod-client.so" "$work/cmake/CMakeFiles" || grep -rqs -- "$libdir/libknod-client.so" "$work/cmake/build.ninja"' ||
    grep -rh "libknod-client" "$work/cmake/CMakeFiles" 2>/dev/null | head -3
echo "$passed passed, $failed failed"
[ "$failed" -eq 0 ]
