#!/usr/bin/env bash
# The main job's own honesty check: the figures an example client printed ("granted binding ID",
# "buffer holds N byte(s) from P packet(s)") against the session row the journal keeps for ID.
# Usage: check-client-figures.sh CLIENT_LOG JOURNAL_DB NAME   (exit 1 when they disagree)
set -euo pipefail
. "$(dirname "$0")/wait-lib.sh"
log=$1 db=$2 name=$3
id=$(sed -n 's/^granted binding \([^ ]*\) .*/\1/p' "$log" | head -1)
figures=$(sed -n 's/^buffer holds \([0-9]*\) byte(s) from \([0-9]*\) packet(s).*/\1 \2/p' "$log" | head -1)
if [ -z "$id" ] || [ -z "$figures" ]; then
    echo "  $name: printed no binding id or no buffer figures; nothing to check" >&2
    exit 1
fi
# The end is committed by the journal's writer after the release returns: wait for the row's
# end, never for a fixed time.
ended_row() {
    row=$(sqlite3 -separator ' ' "$db" \
        "select rx_bytes, rx_packets from sessions where id = '$id' and end_reason is not null")
    [ -n "$row" ]
}
row=
if ! wait_until 60 "the journal's ended session $id" ended_row; then
    echo "  $name: the journal has no ended session $id" >&2
    exit 1
fi
if [ "$row" != "$figures" ]; then
    echo "  $name: printed $figures (bytes packets) but the journal's row for $id says $row" >&2
    exit 1
fi
echo "  $name: binding $id, ${figures% *} byte(s) from ${figures#* } packet(s): the journal's row agrees"
