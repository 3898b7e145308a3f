#!/usr/bin/env bash
# knod-policyd built with AddressSanitizer + UndefinedBehaviorSanitizer (g++, in build-asan/),
# then integration tests of the normal build run against it (KNOD_TEST_DAEMON: every Sandbox
# starts that daemon instead), so the real buses, uids and races of those tests drive the
# sanitized daemon. Fails when a test fails or any sanitizer wrote a report (LeakSanitizer at
# each daemon's exit included).
#
#   scripts/sanitize.sh [CTEST_REGEX]   (default: the availability and robustness tests)
#
# Needs the normal build's integration tests (build/, `cmake --build build --target
# knod_integration_tests`). The reports stay in build-asan/reports/ (one file per process).
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
regex=${1:-'^integration\.(Availability|Robustness)\.'}
asan=$repo/build-asan
# g++ 12 warns "may be used uninitialized" inside libstdc++'s <regex> once ASan instruments it
# (a false positive of the sanitizer's code, not ours): that one warning is not an error here.
flags="-fsanitize=address,undefined -fno-omit-frame-pointer -fno-sanitize-recover=undefined"
flags+=" -Wno-maybe-uninitialized"
launcher=()
command -v ccache >/dev/null && launcher=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache
    -DCMAKE_C_COMPILER_LAUNCHER=ccache)
cmake -S "$repo" -B "$asan" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DKNOD_WERROR=ON \
    -DKNOD_BUILD_TESTS=OFF -DKNOD_BUILD_EXTRAS=OFF "${launcher[@]}" \
    -DCMAKE_CXX_FLAGS="$flags" -DCMAKE_C_FLAGS="$flags" \
    -DCMAKE_EXE_LINKER_FLAGS="-fsanitize=address,undefined" \
    -DCMAKE_SHARED_LINKER_FLAGS="-fsanitize=address,undefined" >/dev/null
cmake --build "$asan" --target knod-policyd -j "$(nproc)"
tests=$repo/build/tests/integration/knod_integration_tests
[ -x "$tests" ] || { echo "sanitize: build $tests first" >&2; exit 1; }

reports=$asan/reports
rm -rf "$reports" && mkdir -p "$reports" && chmod 1777 "$reports" # daemons of other uids too
export KNOD_TEST_DAEMON=$asan/daemon/knod-policyd
# A report goes to a file of its own (the sandboxes remove their daemon.log); UBSan stops the
# process at the first finding, so a test fails on it as well.
export ASAN_OPTIONS=log_path=$reports/asan:detect_leaks=1:strict_string_checks=1
export UBSAN_OPTIONS=log_path=$reports/ubsan:print_stacktrace=1:halt_on_error=1
rc=0
(cd "$repo/build" && ctest -R "$regex" --output-on-failure -j "$(nproc)") || rc=1
if compgen -G "$reports/*" >/dev/null; then
    echo "sanitize: reports in $reports:" >&2
    for f in "$reports"/*; do
        echo "== $f" >&2
        head -60 "$f" >&2
    done
    rc=1
else
    echo "sanitize: no sanitizer report"
fi
exit $rc
