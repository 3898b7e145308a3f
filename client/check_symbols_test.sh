#!/usr/bin/env bash
# The ABI check itself (ctest client.abi_check): the built library passes against the stored
# lists, and fails when a stored symbol is no longer exported (removed), when an exported one is
# not stored (added), or when the Debian symbols file disagrees.
# Usage: check_symbols_test.sh SOURCE_DIR LIB
set -uo pipefail
src=$1 lib=$2
list=$src/client/libknod-client.symbols debian=$src/packaging/debian/libknod-client1.symbols
check=$src/client/check_symbols.sh
work=$(mktemp -d /tmp/knod-abi.XXXXXX)
trap 'rm -rf "$work"' EXIT
failed=0
expect() { # expect RC WHAT LIST DEBIAN
    "$check" "$lib" "$3" "$4" >"$work/out" 2>&1
    local rc=$?
    if [ $rc -eq "$1" ]; then echo "ok - $2"; else echo "not ok - $2 (exit $rc)"; cat "$work/out"; failed=1; fi
}
expect 0 "the library exports exactly the stored symbols" "$list" "$debian"
{ cat "$list"; echo knod_binding_gone; } >"$work/removed"
{ cat "$debian"; echo " knod_binding_gone@KNOD_CLIENT_1 0.1.0"; } >"$work/removed.debian"
expect 1 "a stored symbol the library no longer exports fails" "$work/removed" "$work/removed.debian"
grep -q "no longer exported" "$work/out" && grep -q knod_binding_gone "$work/out" ||
    { echo "not ok - the failure names the removed symbol"; failed=1; }
grep -v '^knod_binding_renew$' "$list" >"$work/added"
grep -v ' knod_binding_renew@' "$debian" >"$work/added.debian"
expect 1 "an exported symbol missing from the list fails" "$work/added" "$work/added.debian"
expect 1 "a Debian symbols file that disagrees fails" "$list" "$work/added.debian"
exit $failed
