#!/usr/bin/env bash
# Builds the libFuzzer targets with clang (ASan + UBSan) and runs one for a bounded time.
#   run_fuzz.sh build SRC OUT [MIGRATIONS_CC]   build the targets into OUT (the journal's two
#                                        need the migrations.cc the build generates)
#   run_fuzz.sh run OUT TARGET SECONDS SRC   fuzz TARGET (policy, flow_spec, journal or export)
# With KNOD_FUZZ_CORPUS=DIR a run keeps what it finds in DIR (a later run resumes from it) and
# writes a crash's or hang's input into DIR/../artifacts-TARGET/; without it, both are temporary
# (the input is in the printed report).
# The test suite runs each for a few seconds; for a longer run see docs/testing.md, "Fuzzing".
set -euo pipefail
case "$1" in
build)
    # Absolute: ccache's CCACHE_BASEDIR must be (a relative SRC failed with KNOD_CCACHE_DIR).
    src=$(realpath "$2") out=$3
    mkdir -p "$out"
    flags=(-std=c++2b -g -O1 -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=undefined -fno-sanitize=unreachable
           -I"$src" -I"$src/common" -DTOML_HEADER_ONLY=1 '-DTOML_ASSERT(expr)=((void)0)')
    # toml++ 3.3 asserts on some malformed keys it then reports as errors anyway ('[$[x]]');
    # Debian's release build has those asserts off, so the fuzz build turns them off too, and
    # without NDEBUG, which would make clang treat them as __builtin_assume. Its unicode tables
    # also reach TOML_UNREACHABLE on some non-ASCII whitespace, so UBSan's unreachable check is
    # off; policy files are root's own input, and this is toml++'s to fix, not ours to hide.
    # Each source is compiled once into an object (the policy's sources serve three fuzzers,
    # the journal's two), in parallel, then each fuzzer is linked from its objects. With
    # KNOD_CCACHE_DIR (tests/soak.sh) the compiles go through ccache.
    cc=(clang++)
    if [ -n "${KNOD_CCACHE_DIR:-}" ] && command -v ccache >/dev/null; then
        export CCACHE_DIR=$KNOD_CCACHE_DIR CCACHE_BASEDIR=$src CCACHE_NOHASHDIR=true
        cc=(ccache clang++)
    fi
    objs=$out/obj
    mkdir -p "$objs"
    obj() { local rel=${1#"$src"/}; echo "$objs/${rel//\//_}.o"; }
    policy_srcs=("$src"/policy/*.cc)
    journal_srcs=()
    [ -n "${4:-}" ] && journal_srcs=("$src"/journal/*.cc "$4" "$src/cli/audit_report.cc"
                                     "$src/cli/report_html.cc" "$src/cli/audit_format.cc")
    fuzzers=(policy flow_spec)
    [ -n "${4:-}" ] && fuzzers+=(journal export)
    all=("${policy_srcs[@]}" "${journal_srcs[@]}")
    for f in "${fuzzers[@]}"; do all+=("$src/tests/fuzz/${f}_fuzz.cc"); done
    export -f obj
    export objs src
    printf '%s\0' "${all[@]}" |
        xargs -0 -P "$(nproc)" -I{} bash -c 'exec "$@" -c "$0" -o "$(obj "$0")"' {} "${cc[@]}" "${flags[@]}" ||
        { echo "fuzz build: a compile failed" >&2; exit 1; }
    # The policy's digest is OpenSSL's SHA-256; the journal's readers need SQLite and sd-journal.
    link() { local name=$1; shift; clang++ "${flags[@]}" "$@" -o "$out/$name"; }
    policy_objs=() journal_objs=()
    for f in "${policy_srcs[@]}"; do policy_objs+=("$(obj "$f")"); done
    for f in "${journal_srcs[@]}"; do journal_objs+=("$(obj "$f")"); done
    link policy_fuzz "${policy_objs[@]}" "$(obj "$src/tests/fuzz/policy_fuzz.cc")" -lcrypto
    link flow_spec_fuzz "${policy_objs[@]}" "$(obj "$src/tests/fuzz/flow_spec_fuzz.cc")" -lcrypto
    if [ -n "${4:-}" ]; then
        # The auditor's readers (#31): a journal file through open, verify, report (and its
        # page), events, sessions and export; export lines through verify --export.
        link journal_fuzz "${journal_objs[@]}" "${policy_objs[@]}" "$(obj "$src/tests/fuzz/journal_fuzz.cc")" \
            -lsqlite3 -lcrypto -lsystemd
        # export_fuzz needs the journal's own sources only (not the CLI's report).
        export_objs=()
        for f in "$src"/journal/*.cc "$4"; do export_objs+=("$(obj "$f")"); done
        link export_fuzz "${export_objs[@]}" "$(obj "$src/tests/fuzz/export_fuzz.cc")" -lsqlite3 -lcrypto -lsystemd
    fi
    ;;
run)
    out=$2 target=$3 seconds=$4 src=$5
    log=$(mktemp)
    if [ -n "${KNOD_FUZZ_CORPUS:-}" ]; then
        corpus=$KNOD_FUZZ_CORPUS artifacts=$(dirname "$corpus")/artifacts-$target/
        mkdir -p "$corpus" "$artifacts"
        trap 'rm -f "$log"' EXIT
    else
        corpus=$(mktemp -d) artifacts=$corpus/
        trap 'rm -rf "$corpus" "$log"' EXIT
    fi
    max_len=4096
    if [ "$target" = policy ]; then
        seeds=("$src/tests/data/policies/good" "$src/tests/data/policies/bad" "$src/packaging"
               "$src/tests/fuzz/corpus/policy")
    elif [ "$target" = journal ]; then
        # Journals journal_fill made (report, hostile texts, pruned, small), VACUUMed to 512-byte
        # pages so a mutation lands in few pages.
        seeds=("$src/tests/fuzz/corpus/journal") max_len=32768
    elif [ "$target" = export ]; then
        seeds=("$src/tests/fuzz/corpus/export") max_len=16384
    else
        seeds=("$src/tests/fuzz/corpus/flow_spec")
    fi
    # The whole report when it fails (a sanitizer's stack is longer than any tail), the final
    # statistics when it does not.
    rc=0
    "$out/${target}_fuzz" -max_total_time="$seconds" -max_len=$max_len -timeout=10 -rss_limit_mb=2048 \
        -print_final_stats=1 -artifact_prefix="$artifacts" "$corpus" "${seeds[@]}" >"$log" 2>&1 || rc=$?
    if [ "$rc" -ne 0 ]; then
        grep -vE '^#[0-9]+[[:space:]]+(NEW|REDUCE|pulse|INITED)' "$log" | tail -n 300
        exit "$rc"
    fi
    tail -n 12 "$log"
    ;;
*) echo "usage: $0 build SRC OUT | run OUT TARGET SECONDS SRC" >&2; exit 2 ;;
esac
