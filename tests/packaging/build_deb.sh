#!/usr/bin/env bash
# Builds the Debian package once per test run (ctest fixture packaging.build_deb) for every test
# that installs it (packaging.debian, vm.whole_system): dpkg-buildpackage in a copy of the
# source tree (it writes next to the tree), then the .deb and .changes into OUT_DIR.
# Usage: build_deb.sh SOURCE_DIR OUT_DIR
set -uo pipefail
src=$(cd "${1:?usage: build_deb.sh SOURCE_DIR OUT_DIR}" && pwd)
out=${2:?usage: build_deb.sh SOURCE_DIR OUT_DIR}
mkdir -p "$(dirname "$out")"
command -v dpkg-buildpackage >/dev/null || {
    echo "build_deb: dpkg-buildpackage not found (scripts/install-deps.sh installs it)"
    exit 77
}
started=$(date +%s)
# The same path on every run (next to OUT_DIR): the compiler sees the same paths and flags
# (-ffile-prefix-map names it), so a compiler cache hits on a rebuild.
work=$(cd "$(dirname "$out")" && pwd)/$(basename "$out").work
rm -rf "$work" && mkdir -p "$work" || {
    echo "build_deb: cannot make $work"
    exit 1
}
trap 'rm -rf "$work"' EXIT
mkdir "$work/src"
(cd "$src" && git ls-files -co --exclude-standard -z | xargs -0 cp --parents -P -t "$work/src") || {
    echo "build_deb: cannot copy the source tree"
    exit 1
}
# KNOD_CCACHE_DIR (tests/soak.sh sets it; CI does not): compile through ccache's compiler links,
# so a soak's later runs spend their minutes on the tests beside this build, not on recompiling.
if [ -n "${KNOD_CCACHE_DIR:-}" ] && [ -x /usr/lib/ccache/c++ ]; then
    export CCACHE_DIR=$KNOD_CCACHE_DIR PATH=/usr/lib/ccache:$PATH
fi
echo "# building the package (a few minutes)"
if ! (cd "$work/src" && dpkg-buildpackage -us -uc -b -j"$(nproc)") >"$work/build.log" 2>&1; then
    tail -40 "$work/build.log"
    echo "build_deb: dpkg-buildpackage failed"
    exit 1
fi
rm -rf "$out"
mkdir -p "$out"
cp "$work"/*.deb "$work"/knod-policy_*.changes "$work"/*.buildinfo "$out/" 2>/dev/null
ls "$out"/knod-policy_*.deb >/dev/null 2>&1 || {
    echo "build_deb: no package built"
    exit 1
}
echo "# built $(cd "$out" && ls *.deb | tr "\n" " ")in $(($(date +%s) - started)) s"
