#!/usr/bin/env bash
# Every relative link in README.md and docs/*.md points at a file that exists, and a #anchor at a
# heading of that file (GitHub's slugs). Exit 1 naming each broken link as file:line.
# Usage: tests/docs_links_test.sh [REPO_ROOT]
set -euo pipefail
root=${1:-$(cd "$(dirname "$0")/.." && pwd)}
exec python3 - "$root" <<'PY'
import os, re, sys
root = sys.argv[1]

def slugs(path):
    """GitHub-style heading anchors of a Markdown file (duplicates get -1, -2, ...)."""
    seen, out, fence = {}, set(), False
    for line in open(path, encoding='utf-8'):
        if line.lstrip().startswith('```'):
            fence = not fence
            continue
        m = None if fence else re.match(r'#{1,6}\s+(.*?)\s*#*\s*$', line)
        if not m:
            continue
        s = re.sub(r'[^\w\- ]', '', m.group(1).strip().lower()).replace(' ', '-')
        n = seen.get(s, 0)
        seen[s] = n + 1
        out.add(s if n == 0 else f'{s}-{n}')
    return out

pages = [os.path.join(root, 'README.md')] + sorted(
    os.path.join(root, 'docs', f) for f in os.listdir(os.path.join(root, 'docs')) if f.endswith('.md'))
link = re.compile(r'!?\[[^\]]*\]\(\s*<?([^)\s>]+)>?(?:\s+"[^"]*")?\s*\)')
broken = 0
for page in pages:
    fence = False
    for no, line in enumerate(open(page, encoding='utf-8'), 1):
        if line.lstrip().startswith('```'):
            fence = not fence
            continue
        if fence:
            continue
        text = re.sub(r'`[^`]*`', '', line)  # code spans hold no links
        for target in link.findall(text):
            if re.match(r'[a-z][a-z0-9+.-]*:', target, re.I):  # http:, mailto:, ...
                continue
            path, _, anchor = target.partition('#')
            dest = os.path.normpath(os.path.join(os.path.dirname(page), path)) if path else page
            where = f'{os.path.relpath(page, root)}:{no}'
            if not os.path.exists(dest):
                print(f'{where}: broken link {target}: no file {os.path.relpath(dest, root)}')
                broken += 1
            elif anchor and dest.endswith('.md') and anchor not in slugs(dest):
                print(f'{where}: broken link {target}: no heading #{anchor} in {os.path.relpath(dest, root)}')
                broken += 1
print(f'{broken} broken link(s) in {len(pages)} page(s)')
sys.exit(1 if broken else 0)
PY
