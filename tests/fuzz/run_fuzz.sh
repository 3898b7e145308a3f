#!/usr/bin/env bash
# Builds the libFuzzer targets with clang (ASan + UBSan) and runs one for a bounded time.
#   run_fuzz.sh build SRC OUT            build both targets into OUT
#   run_fuzz.sh run OUT TARGET SECONDS SRC   fuzz TARGET (policy or flow_spec) from its seeds
# The test suite runs each for a few seconds; for a longer run see README "Fuzzing".
set -euo pipefail
case "$1" in
build)
    src=$2 out=$3
    mkdir -p "$out"
    flags=(-std=c++2b -g -O1 -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=undefined -fno-sanitize=unreachable
           -I"$src" -I"$src/common" -DTOML_HEADER_ONLY=1 '-DTOML_ASSERT(expr)=((void)0)')
    # toml++ 3.3 asserts on some malformed keys it then reports as errors anyway ('[$[x]]');
    # Debian's release build has those asserts off, so the fuzz build turns them off too, and
    # without NDEBUG, which would make clang treat them as __builtin_assume. Its unicode tables
    # also reach TOML_UNREACHABLE on some non-ASCII whitespace, so UBSan's unreachable check is
    # off; policy files are root's own input, and this is toml++'s to fix, not ours to hide.
    policy_srcs=("$src"/policy/*.cc)
    # The policy's digest is OpenSSL's SHA-256.
    clang++ "${flags[@]}" "${policy_srcs[@]}" "$src/tests/fuzz/policy_fuzz.cc" -lcrypto -o "$out/policy_fuzz" &
    clang++ "${flags[@]}" "${policy_srcs[@]}" "$src/tests/fuzz/flow_spec_fuzz.cc" -lcrypto -o "$out/flow_spec_fuzz" &
    wait -n && wait -n
    ;;
run)
    out=$2 target=$3 seconds=$4 src=$5
    corpus=$(mktemp -d)
    trap 'rm -rf "$corpus"' EXIT
    if [ "$target" = policy ]; then
        seeds=("$src/tests/data/policies/good" "$src/tests/data/policies/bad" "$src/packaging"
               "$src/tests/fuzz/corpus/policy")
    else
        seeds=("$src/tests/fuzz/corpus/flow_spec")
    fi
    "$out/${target}_fuzz" -max_total_time="$seconds" -max_len=4096 -timeout=10 -rss_limit_mb=2048 \
        -print_final_stats=1 "$corpus" "${seeds[@]}" 2>&1 | tail -n 12
    ;;
*) echo "usage: $0 build SRC OUT | run OUT TARGET SECONDS SRC" >&2; exit 2 ;;
esac
