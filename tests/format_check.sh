#!/usr/bin/env bash
# Fails when any C/C++ source differs from .clang-format's style. Fix: clang-format -i FILE.
set -u
cd "$1"
files=$(find common policy daemon cli cni bpf bench tests -name '*.cc' -o -name '*.h' -o -name '*.c' 2>/dev/null | grep -v '/build' | sort)
bad=0
for f in $files; do
    clang-format --dry-run -Werror "$f" >/dev/null 2>&1 || { echo "needs clang-format: $f"; bad=$((bad + 1)); }
done
echo "$(echo "$files" | wc -w) files checked, $bad need formatting"
[ "$bad" -eq 0 ]
