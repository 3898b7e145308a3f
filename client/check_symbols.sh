#!/usr/bin/env bash
# The ABI check: the dynamic symbols libknod-client exports must be exactly the stored list
# (LIST, one name per line, # comments), and the Debian symbols file must list the same names.
# A removed symbol breaks every program linked against SONAME 1: the build fails. So does an
# added one until it is written into both lists (it then becomes part of the ABI).
# Usage: check_symbols.sh LIB LIST DEBIAN_SYMBOLS
set -uo pipefail
lib=${1:?usage: check_symbols.sh LIB LIST DEBIAN_SYMBOLS} list=${2:?} debian=${3:?}
exported=$(nm -D --defined-only "$lib" | awk '{print $NF}' | sed 's/@.*//' |
    grep -v '^KNOD_CLIENT_[0-9]*$' | sort -u)
stored=$(grep -v '^#' "$list" | sed '/^$/d' | sort -u)
packaged=$(sed -n 's/^ \([A-Za-z_][A-Za-z0-9_]*\)@KNOD_CLIENT_[0-9]* .*/\1/p' "$debian" |
    grep -v "^KNOD_CLIENT_[0-9]*$" | sort -u)
rc=0
removed=$(comm -13 <(echo "$exported") <(echo "$stored"))
added=$(comm -23 <(echo "$exported") <(echo "$stored"))
if [ -n "$removed" ]; then
    echo "libknod-client: symbols in $list are no longer exported (an ABI break):" >&2
    echo "$removed" | sed 's/^/  /' >&2
    rc=1
fi
if [ -n "$added" ]; then
    echo "libknod-client: new exported symbols not in $list (add them there and to $debian):" >&2
    echo "$added" | sed 's/^/  /' >&2
    rc=1
fi
if [ "$stored" != "$packaged" ]; then
    echo "libknod-client: $debian does not list the same symbols as $list:" >&2
    diff <(echo "$stored") <(echo "$packaged") | sed 's/^/  /' >&2
    rc=1
fi
exit $rc
