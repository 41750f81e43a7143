#!/usr/bin/env bash
# Serving benchmark, unattended: coil against llama-server on the same GGUF
# files, every serving measurement of docs/PERFORMANCE.md, results in one
# directory.
#
#   scripts/serve-bench.sh [-o DIR] [-c "1 2 4 8 16"] [-n 128] [-t THREADS]
#                          [-R REPEATS] [-s "bench sweep join long pair"] [-W] MODEL.gguf...
#
# Per file, REPEATS times (coil and llama-server alternating, so that both
# see the same machine):
#   bench  `coil bench` tg alone, tg as coil serve decodes (a checkpoint
#          every 4th token, batch-invariant kernels), and `coil bench
#          --parallel 1,2,4,8,16` (generation
#          tokens/s and the GB/s a step's least traffic makes: divided by
#          the machine's read bandwidth, the batch-decode roofline fraction)
#   sweep  1, 2, 4, 8, 16 clients at once, each a short prompt and N greedy
#          tokens: aggregate generated tokens/s, time to first token, time
#          per output token (coil serve, then llama-server)
#   join   4 clients generating N tokens; once all stream, a ~1000-token
#          prompt arrives: its TTFT, and the longest gap between two texts
#          of the others (how much a long prompt stalls running generations)
#   long   8 clients, ~240-token prompts, 64 tokens each, two rounds: total
#          (prompt + generated) and generated tokens/s, TTFT, TPOT
#   pair   (coil only, not in the default set) one request through coil serve
#          against `coil bench`'s tg on the same file, interleaved: PAIRS rounds
#          (default 6) of `coil bench -n N -r 1` and one streamed request of N
#          tokens to a warm server (in turn first); per round bench ms/token ÷
#          the request's TPOT, and their median (the target: one request at
#          >= 0.95x bench)
# -W: before each timed load, the same load once with other prompts, not
# recorded (a warm server: state buffers and caches in place, and no prefix
# cache hit for the timed prompts), for both servers.
# Results: DIR/results.md (the tables, with the load average of each run),
# DIR/results.jsonl (one JSON object per serve measurement), DIR/logs/.
#
# Environment:
#   COIL             the coil binary (default: target/release/coil, built if missing)
#   LLAMA_SERVER     llama-server binary (default: ../llama.cpp-build/build/bin/llama-server
#                    relative to the repository, else on PATH; skipped when absent)
#   PYTHON           python3 to run the load generator (default: python3)
#   PORT             port to use (default: 18080)
#   COIL_SERVE_ARGS  extra flags for coil serve (e.g. "--prefill-chunk 256")
#   LLAMA_ARGS       extra flags for llama-server
#   PAIRS            rounds of the pair section (default 6)
#   TEMPERATURE      sample the bench/sweep/join/long loads at this temperature (the servers'
#                    default top-k 40, top-p, min-p) instead of greedily (default 0: greedy)
#
# Timings on a shared machine are noisy: compare the interleaved ratios.

set -euo pipefail

REPO_ROOT="$(cd "$(dirname "$0")/.." && pwd)"
CLIENTS="1 2 4 8 16"
N_GEN=128
THREADS=2
REPEATS=1
SECTIONS="bench sweep join long"
OUT=""
WARM=0

usage() { sed -n '2,45p' "$0" | sed 's/^# \{0,1\}//'; exit "${1:-0}"; }

while getopts "o:c:n:t:R:s:Wh" opt; do
    case "$opt" in
        o) OUT="$OPTARG" ;;
        c) CLIENTS="$OPTARG" ;;
        n) N_GEN="$OPTARG" ;;
        t) THREADS="$OPTARG" ;;
        R) REPEATS="$OPTARG" ;;
        s) SECTIONS="$OPTARG" ;;
        W) WARM=1 ;;
        h) usage 0 ;;
        *) usage 1 ;;
    esac
done
shift $((OPTIND - 1))
[ $# -ge 1 ] || { echo "error: give at least one GGUF file" >&2; usage 1; }
for model in "$@"; do
    [ -f "$model" ] || { echo "error: $model: no such file" >&2; exit 1; }
done

COIL="${COIL:-$REPO_ROOT/target/release/coil}"
if [ -z "${LLAMA_SERVER:-}" ]; then
    LLAMA_SERVER="$(realpath -m "$REPO_ROOT/../llama.cpp-build/build/bin/llama-server")"
    [ -x "$LLAMA_SERVER" ] || LLAMA_SERVER="$(command -v llama-server || echo "$LLAMA_SERVER")"
fi
PYTHON="${PYTHON:-python3}"
PORT="${PORT:-18080}"
OUT="${OUT:-serve-bench-$(date -u +%Y%m%dT%H%M%SZ)}"
mkdir -p "$OUT/logs"
RESULTS="$OUT/results.md"
JSONL="$OUT/results.jsonl"
MAX_CLIENTS=8
for c in $CLIENTS; do [ "$c" -gt "$MAX_CLIENTS" ] && MAX_CLIENTS=$c; done
# Per slot: the long load's ~240-token prompt and 64 tokens, or the sweep's
# short prompt and N_GEN tokens, with room to spare.
CTX=$((N_GEN + 1200))
LONG_WORDS=234   # ~240 tokens with the GPT-NeoX and Qwen tokenizers
JOIN_WORDS=980   # ~1000 tokens

if [ ! -x "$COIL" ]; then
    echo "building coil (release)..." >&2
    (cd "$REPO_ROOT" && cargo build --release -p coil-cli >&2)
fi
HAVE_LLAMA=0
[ -x "$LLAMA_SERVER" ] && HAVE_LLAMA=1

say() { echo "$*" | tee -a "$RESULTS"; }
loadavg() { cut -d' ' -f1-3 /proc/loadavg 2>/dev/null || echo "?"; }

SERVER_PID=""
cleanup() {
    if [ -n "$SERVER_PID" ]; then
        kill "$SERVER_PID" 2>/dev/null || true
        wait "$SERVER_PID" 2>/dev/null || true
        SERVER_PID=""
    fi
}
trap cleanup EXIT

wait_ready() {
    local url="$1" i
    for i in $(seq 1 1200); do
        if "$PYTHON" - "$url" <<'EOF' 2>/dev/null; then return 0; fi
import sys, urllib.request
urllib.request.urlopen(sys.argv[1] + "/health", timeout=2).read()
EOF
        if ! kill -0 "$SERVER_PID" 2>/dev/null; then
            echo "error: the server exited; see its log" >&2
            return 1
        fi
        sleep 0.5
    done
    echo "error: the server did not become ready" >&2
    return 1
}

# start_server coil|llama MODEL LOG
start_server() {
    local which="$1" model="$2" log="$3"
    if [ "$which" = coil ]; then
        # shellcheck disable=SC2086
        "$COIL" serve -m "$model" -t "$THREADS" --port "$PORT" --parallel "$MAX_CLIENTS" \
            --cache-slots 0 -c "$CTX" --quiet ${COIL_SERVE_ARGS:-} > "$log" 2>&1 &
    else
        # shellcheck disable=SC2086
        "$LLAMA_SERVER" -m "$model" -t "$THREADS" --port "$PORT" -np "$MAX_CLIENTS" \
            -c $((CTX * MAX_CLIENTS)) --no-warmup ${LLAMA_ARGS:-} > "$log" 2>&1 &
    fi
    SERVER_PID=$!
    wait_ready "http://127.0.0.1:$PORT" || { tail -20 "$log" >&2; exit 1; }
    # coil serve writes its reserve of state buffers once idle: wait for it,
    # so that nothing timed shares the machine with it (a server that has
    # been up a few seconds)
    if [ "$which" = coil ]; then wait_reserved "http://127.0.0.1:$PORT"; fi
}

wait_reserved() {
    "$PYTHON" - "$1" <<'EOF' || echo "warning: the server's state-buffer reserve did not finish" >&2
import sys, time, urllib.request
for _ in range(1200):
    text = urllib.request.urlopen(sys.argv[1] + "/metrics", timeout=5).read().decode()
    if "\ncoil_state_buffers_reserving 0\n" in "\n" + text:
        sys.exit(0)
    time.sleep(0.25)
sys.exit(1)
EOF
}

# load LABEL TAG ARGS...: the load generator's table rows (header dropped);
# with -W, after the same load once with other prompts, unrecorded
load() {
    local label="$1" tag="$2"
    shift 2
    if [ "$WARM" = 1 ]; then
        "$PYTHON" "$REPO_ROOT/scripts/serve_load.py" --url "http://127.0.0.1:$PORT" \
            --label warm-up --prompt-offset 100000 --temperature "${TEMPERATURE:-0}" "$@" > /dev/null
    fi
    "$PYTHON" "$REPO_ROOT/scripts/serve_load.py" --url "http://127.0.0.1:$PORT" \
        --label "$label" --tag "$tag" --out "$JSONL" --temperature "${TEMPERATURE:-0}" "$@" |
        tail -n +3 | tee -a "$RESULTS"
}

# serve_section SECTION MODEL REPEAT
serve_section() {
    local section="$1" model="$2" rep="$3" name which label
    name="$(basename "$model" .gguf)"
    for which in coil llama; do
        [ "$which" = llama ] && [ "$HAVE_LLAMA" = 0 ] && continue
        label="coil serve"
        [ "$which" = llama ] && label="llama-server"
        start_server "$which" "$model" "$OUT/logs/$name.$section.$which.$rep.log"
        if [ "$section" = sweep ]; then
            # shellcheck disable=SC2086
            load "$label" "$name sweep $rep" --clients $CLIENTS --max-tokens "$N_GEN"
        elif [ "$section" = join ]; then
            load "$label" "$name join $rep" --clients 4 --max-tokens "$N_GEN" \
                --join-words "$JOIN_WORDS"
        else
            load "$label" "$name long $rep" --clients 8 --max-tokens 64 --rounds 2 \
                --prompt-words "$LONG_WORDS"
        fi
        cleanup
    done
}

# pair_section MODEL: interleaved `coil bench` tg and one request through a
# warm coil serve (see the header)
pair_section() {
    local model="$1" name r tg tpot
    name="$(basename "$model" .gguf)"
    start_server coil "$model" "$OUT/logs/$name.pair.coil.log"
    "$PYTHON" "$REPO_ROOT/scripts/serve_load.py" --url "http://127.0.0.1:$PORT" \
        --clients 1 --max-tokens "$N_GEN" --prompt-offset 100000 > /dev/null
    say "| round | coil bench tg (tok/s) | ms/token | coil serve TPOT (ms) | ratio | load avg |"
    say "| ---: | ---: | ---: | ---: | ---: | ---: |"
    local ratios=""
    run_bench() {
        "$COIL" bench -m "$model" -p 0 -n "$N_GEN" -r 1 -t "$THREADS" \
            2>>"$OUT/logs/$name.bench.log" | awk -F'|' -v t="tg$N_GEN" '$6 ~ t { print $7 + 0 }'
    }
    run_request() {
        "$PYTHON" "$REPO_ROOT/scripts/serve_load.py" --url "http://127.0.0.1:$PORT" \
            --clients 1 --max-tokens "$N_GEN" --prompt-offset $((200000 + r)) --json \
            --label "coil serve" --tag "$name pair $r" --out "$JSONL" |
            "$PYTHON" -c 'import json, sys; print(json.loads(sys.stdin.readline())["tpot_mean_s"] or 0)'
    }
    for r in $(seq 1 "${PAIRS:-6}"); do
        # odd rounds bench first, even rounds the request first
        if [ $((r % 2)) = 1 ]; then
            tg="$(run_bench)"
            tpot="$(run_request)"
        else
            tpot="$(run_request)"
            tg="$(run_bench)"
        fi
        if [ -z "$tg" ] || [ "$tg" = 0 ] || [ "$tpot" = 0 ]; then
            say "| $r | ${tg:-?} | - | $tpot | - | $(loadavg) |"
            continue
        fi
        local row
        row="$("$PYTHON" -c "tg, tp = $tg, $tpot; print(f'{1e3 / tg:.2f} | {tp * 1e3:.2f} | {1 / tg / tp:.3f}')")"
        ratios="$ratios $(echo "$row" | awk -F'|' '{ print $3 + 0 }')"
        say "| $r | $tg | $row | $(loadavg) |"
    done
    cleanup
    if [ -n "$ratios" ]; then
        say ""
        say "median ratio (bench ms/token ÷ serve TPOT; 1 = the server adds nothing): $("$PYTHON" -c "import statistics, sys; print(f'{statistics.median(map(float, sys.argv[1:])):.3f}')" $ratios) over$ratios"
    fi
}

TABLE_HEAD="| server | clients | prompt tok | gen tok/s | total tok/s | TTFT mean (s) | TTFT max (s) | TPOT (ms) | max gap (ms) | joined TTFT (s) | load avg |
| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"

say "# serve-bench $(date -u +%Y-%m-%dT%H:%M:%SZ)"
say ""
say "coil: $COIL ($(cd "$REPO_ROOT" && git rev-parse --short HEAD 2>/dev/null || echo ?))"
if [ "$HAVE_LLAMA" = 1 ]; then
    say "llama-server: $LLAMA_SERVER"
else
    say "llama-server: not found at $LLAMA_SERVER (skipped)"
fi
say "threads $THREADS, clients \"$CLIENTS\", $N_GEN tokens per sweep request, repeats $REPEATS, warm-up load first: $([ "$WARM" = 1 ] && echo yes || echo no), temperature ${TEMPERATURE:-0}"
say "CPU: $(grep -m1 'model name' /proc/cpuinfo 2>/dev/null | cut -d: -f2- | sed 's/^ //') (family $(grep -m1 'cpu family' /proc/cpuinfo 2>/dev/null | cut -d: -f2- | tr -d ' '), model $(grep -m1 '^model[[:space:]]*:' /proc/cpuinfo 2>/dev/null | cut -d: -f2- | tr -d ' ')), load average at start: $(loadavg)"

for model in "$@"; do
    name="$(basename "$model" .gguf)"
    say ""
    say "## $name"
    for rep in $(seq 1 "$REPEATS"); do
        if [[ " $SECTIONS " == *" bench "* ]]; then
            say ""
            say "### coil bench, repeat $rep (load average $(loadavg))"
            say ""
            say "tg alone:"
            "$COIL" bench -m "$model" -p 0 -n 128 -r 3 -t "$THREADS" \
                2>>"$OUT/logs/$name.bench.log" | tee -a "$RESULTS"
            say ""
            say "tg as coil serve decodes (a checkpoint every 4th token, batch-invariant kernels):"
            "$COIL" bench -m "$model" -p 0 -n 128 -r 3 -t "$THREADS" --checkpoint-every-token \
                --checkpoint-spacing 4 --batch-invariant \
                2>>"$OUT/logs/$name.bench.log" | tee -a "$RESULTS"
            say ""
            "$COIL" bench -m "$model" -p 16 -n 32 -r 2 -t "$THREADS" --checkpoint-every-token \
                --parallel 1,2,4,8,16 2>>"$OUT/logs/$name.bench.log" | tee -a "$RESULTS"
        fi
        if [[ " $SECTIONS " == *" sweep "* ]]; then
            say ""
            say "### clients at once, $N_GEN tokens each, repeat $rep"
            say ""
            say "$TABLE_HEAD"
            serve_section sweep "$model" "$rep"
        fi
        if [[ " $SECTIONS " == *" join "* ]]; then
            say ""
            say "### 4 clients generating $N_GEN tokens, one ~1000-token prompt joining, repeat $rep"
            say ""
            say "$TABLE_HEAD"
            serve_section join "$model" "$rep"
        fi
        if [[ " $SECTIONS " == *" pair "* ]]; then
            say ""
            say "### one request through coil serve against coil bench, $N_GEN tokens, interleaved, repeat $rep"
            say ""
            pair_section "$model"
        fi
        if [[ " $SECTIONS " == *" long "* ]]; then
            say ""
            say "### 8 clients x ~240-token prompts, 64 tokens, 2 rounds, repeat $rep"
            say ""
            say "$TABLE_HEAD"
            serve_section long "$model" "$rep"
        fi
    done
done
say ""
say "done $(date -u +%Y-%m-%dT%H:%M:%SZ), load average $(loadavg)"
echo "results: $RESULTS and $JSONL" >&2
