#!/usr/bin/env bash
# Concurrent-client serving benchmark: coil serve (and llama-server when a
# llama.cpp build is there) on the same GGUF files, 1/2/4/8/16 clients each
# sending a short prompt and generating 128 tokens greedily, all at once.
#
#   scripts/serve-bench.sh [-c "1 2 4 8 16"] [-n 128] [-t THREADS] [-r ROUNDS] MODEL.gguf...
#
# Prints, per file, server and client count: aggregate generated tokens/s,
# time to first token (mean, max) and time per output token (mean), via
# scripts/serve_load.py (Python standard library only).
#
# Environment:
#   COIL             the coil binary (default: target/release/coil, built if missing)
#   LLAMA_SERVER     llama-server binary (default: ../llama.cpp-build/build/bin/llama-server
#                    relative to the repository, skipped when absent)
#   PYTHON           python3 to run the load generator (default: python3)
#   PORT             first port to use (default: 18080)
#
# Timings on a shared machine are noisy: run twice, compare interleaved.

set -euo pipefail

REPO_ROOT="$(cd "$(dirname "$0")/.." && pwd)"
CLIENTS="1 2 4 8 16"
N_GEN=128
THREADS=2
ROUNDS=1

usage() { sed -n '2,20p' "$0" | sed 's/^# \{0,1\}//'; exit "${1:-0}"; }

while getopts "c:n:t:r:h" opt; do
    case "$opt" in
        c) CLIENTS="$OPTARG" ;;
        n) N_GEN="$OPTARG" ;;
        t) THREADS="$OPTARG" ;;
        r) ROUNDS="$OPTARG" ;;
        h) usage 0 ;;
        *) usage 1 ;;
    esac
done
shift $((OPTIND - 1))
[ $# -ge 1 ] || { echo "error: give at least one GGUF file" >&2; usage 1; }

COIL="${COIL:-$REPO_ROOT/target/release/coil}"
LLAMA_SERVER="${LLAMA_SERVER:-$(realpath -m "$REPO_ROOT/../llama.cpp-build/build/bin/llama-server")}"
PYTHON="${PYTHON:-python3}"
PORT="${PORT:-18080}"
MAX_CLIENTS=0
for c in $CLIENTS; do [ "$c" -gt "$MAX_CLIENTS" ] && MAX_CLIENTS=$c; done

if [ ! -x "$COIL" ]; then
    echo "building coil (release)..." >&2
    (cd "$REPO_ROOT" && cargo build --release -p coil-cli >&2)
fi

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
    for i in $(seq 1 600); do
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

run_load() {
    local label="$1" url="$2"
    # shellcheck disable=SC2086
    "$PYTHON" "$REPO_ROOT/scripts/serve_load.py" --url "$url" --clients $CLIENTS \
        --max-tokens "$N_GEN" --rounds "$ROUNDS" --label "$label"
}

CTX=$((N_GEN + 256))
for model in "$@"; do
    [ -f "$model" ] || { echo "error: $model: no such file" >&2; exit 1; }
    echo
    echo "## $(basename "$model"): $N_GEN tokens per client, $THREADS threads"
    echo
    log="$(mktemp -t serve-bench-coil.XXXXXX.log)"
    "$COIL" serve -m "$model" -t "$THREADS" --port "$PORT" --parallel "$MAX_CLIENTS" \
        --cache-slots 0 -c "$CTX" --quiet > "$log" 2>&1 &
    SERVER_PID=$!
    wait_ready "http://127.0.0.1:$PORT" || { cat "$log" >&2; exit 1; }
    run_load "coil" "http://127.0.0.1:$PORT"
    cleanup

    if [ -x "$LLAMA_SERVER" ]; then
        log="$(mktemp -t serve-bench-llama.XXXXXX.log)"
        "$LLAMA_SERVER" -m "$model" -t "$THREADS" --port "$PORT" -np "$MAX_CLIENTS" \
            -c $((CTX * MAX_CLIENTS)) --no-warmup > "$log" 2>&1 &
        SERVER_PID=$!
        wait_ready "http://127.0.0.1:$PORT" || { cat "$log" >&2; exit 1; }
        run_load "llama-server" "http://127.0.0.1:$PORT" | tail -n +3
        cleanup
    else
        echo "(llama-server not found at $LLAMA_SERVER: skipped)"
    fi
done
