#!/usr/bin/env bash
# Runs every cargo-fuzz target in fuzz/ for SECONDS each (default 600), one
# after the other, starting from seed inputs made here (a tokenizer GGUF and
# a tiny model GGUF from the test fixtures, a session saved by `coil run` on
# the bundled model) plus whatever corpus earlier runs left in fuzz/corpus.
# Crashing inputs land in fuzz/artifacts/<target>/; the summary of each run
# (executions, coverage, corpus) is printed from libFuzzer's last status line.
#
#   scripts/fuzz-all.sh [SECONDS] [TARGET...]
#
# Needs a nightly toolchain and cargo-fuzz (`cargo install cargo-fuzz`).
# Runs at the lowest CPU priority (FUZZ_NICE=0 for a fair share); see docs/FUZZING.md.
set -euo pipefail

REPO_ROOT="$(cd "$(dirname "$0")/.." && pwd)"
SECONDS_EACH="${1:-600}"
shift || true
TARGETS="${*:-gguf blocks split imatrix session tokenizer template request model convert quantize engine_ops tool_calls}"
cd "$REPO_ROOT/fuzz"

seeds="$REPO_ROOT/fuzz/seeds"
mkdir -p "$seeds"/{gguf,blocks,split,imatrix,session,tokenizer,template,request,model,convert,quantize,engine_ops,tool_calls}
cp "$REPO_ROOT/crates/coil/tests/fixtures/tokenizers/lfm2-bpe.gguf" "$seeds/gguf/"
cp "$REPO_ROOT/tests/fixtures/parity/mamba2_g1_hd16/model.gguf" "$seeds/gguf/mamba2.gguf"
COIL="${COIL:-$REPO_ROOT/target/release/coil}"
if [ -x "$COIL" ] && [ ! -f "$seeds/session/demo.raw" ]; then
    # the target's first byte picks the mode: 0 = the bytes are the whole file
    tmp="$(mktemp)"
    (cd "$REPO_ROOT" && "$COIL" run -p "To be or not" -n 2 --save-session "$tmp" >/dev/null 2>&1)
    { printf '\0'; cat "$tmp"; } > "$seeds/session/demo.raw"
    rm -f "$tmp"
fi
# sessions of the parity fixtures the session target also loads into: first
# byte 2k = raw bytes into its k-th model (the order of its FIXTURES)
k=1
for f in qwen35_tiny lfm2_small jamba_small; do
    if [ -x "$COIL" ] && [ ! -f "$seeds/session/$f.raw" ]; then
        tmp="$(mktemp)"
        if (cd "$REPO_ROOT" && "$COIL" run -m "tests/fixtures/parity/$f/model.gguf" -p "To be or not" \
            -n 2 --save-session "$tmp" >/dev/null 2>&1); then
            { printf "\\$(printf '%03o' $((2 * k)))"; cat "$tmp"; } > "$seeds/session/$f.raw"
        fi
        rm -f "$tmp"
    fi
    k=$((k + 1))
done

nice -n "${FUZZ_NICE:-19}" cargo +nightly fuzz build --sanitizer none -O >&2
for t in $TARGETS; do
    mkdir -p "corpus/$t" "artifacts/$t"
    log="$REPO_ROOT/fuzz/artifacts/$t.log"
    echo "== $t: ${SECONDS_EACH} s" >&2
    # the model, convert and quantize targets read a byte or two and 16
    # edits of 8 bytes: longer inputs add nothing, shorter ones fewer edits
    max_len=400000
    len_control=100
    case "$t" in model | convert | quantize) max_len=130 len_control=0 ;; esac
    # engine_ops: a byte for the model, two for the options, then operations
    # of 1-26 bytes each; a few hundred bytes make a long run of them
    case "$t" in engine_ops) max_len=300 len_control=0 ;; esac
    # a target's dictionary of tokens (markers), where it has one
    dict=()
    if [ -f "dicts/$t.dict" ]; then dict=("-dict=dicts/$t.dict"); fi
    nice -n "${FUZZ_NICE:-19}" cargo +nightly fuzz run --sanitizer none -O "$t" "corpus/$t" "$seeds/$t" -- \
        -max_total_time="$SECONDS_EACH" -max_len="$max_len" -len_control="$len_control" ${dict[@]+"${dict[@]}"} \
        -print_final_stats=1 > "$log" 2>&1 || echo "   $t: libFuzzer exited non-zero (a crash? see $log and artifacts/$t/)" >&2
    grep -E '^#[0-9]+' "$log" | tail -n 1 | sed "s/^/   $t: /" >&2
    grep -E 'stat::number_of_executed_units|stat::peak_rss_mb' "$log" | sed "s/^/   $t: /" >&2
    ls "artifacts/$t" | sed "s/^/   $t crash: /" >&2 || true
done
