#!/usr/bin/env bash
# `knod-policy audit report --html` as a browser shows it: the page of a known journal is
# rendered by headless Chromium and the bars in the screenshot are measured against the
# report's JSON (report_screenshot.py says how). Exit 77 (skipped) only where Chromium is not
# installed; scripts/install-deps.sh installs it (and Pillow), so CI runs it.
# Usage: report_html_test.sh KNOD_POLICY JOURNAL_FILL
set -u
cli=$1 fill=$2
here=$(cd "$(dirname "$0")" && pwd)
browser=$(command -v chromium || command -v chromium-browser || true)
if [ -z "$browser" ]; then
    echo "SKIP: chromium is not installed (Debian: apt-get install chromium)"
    exit 77
fi
python=
for p in python3 /usr/bin/python3; do
    if command -v "$p" >/dev/null && "$p" -c 'import PIL' 2>/dev/null; then python=$p; break; fi
done
if [ -z "$python" ]; then # scripts/install-deps.sh installs it with chromium: not a skip
    echo "not ok - Pillow is not installed (Debian: apt-get install python3-pil)"
    exit 1
fi
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

"$fill" --report "$work/r.db" || { echo "not ok - journal_fill --report"; exit 1; }
"$cli" audit report --db "$work/r.db" --json --html "$work/report.html" >"$work/report.json" ||
    { echo "not ok - audit report --html"; exit 1; }
# Its own profile in the work folder; a wide, tall window holds the whole page at scale 1.
timeout 120 "$browser" --headless --no-sandbox --disable-gpu --hide-scrollbars \
    --force-device-scale-factor=1 --force-color-profile=srgb --no-first-run \
    --user-data-dir="$work/profile" --window-size=1220,3200 \
    --screenshot="$work/page.png" "file://$work/report.html" >"$work/chromium.log" 2>&1
if [ ! -s "$work/page.png" ]; then
    echo "not ok - chromium made no screenshot"; cat "$work/chromium.log"; exit 1
fi
"$python" "$here/report_screenshot.py" "$work/report.html" "$work/report.json" "$work/page.png"
