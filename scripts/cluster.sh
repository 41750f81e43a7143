#!/usr/bin/env bash
# Starts N `coil serve` replicas and the Shepherd Model Gateway (SMG) in front
# of them, all on loopback; stops everything on exit (Ctrl-C, or when the
# given time is up).
#
#   scripts/cluster.sh [-n REPLICAS] [-p POLICY] [-m MODEL] [-t THREADS]
#                      [-d SECONDS] [--base-port PORT] [--router-port PORT]
#                      [-- extra coil serve flags]
#
#   -n  replicas (default 2)              -p  SMG policy (default cache_aware;
#   -m  GGUF model (default the demo)         round_robin, consistent_hashing, ...)
#   -t  threads per replica (default 1)   -d  stop after SECONDS (default 600)
#
# Needs `smg` on PATH or SMG=/path/to/smg (pip install smg), and the coil
# binary (COIL=..., default target/release/coil). Logs go to $LOGDIR
# (default a fresh temporary directory, printed). Client requests go to
# http://127.0.0.1:ROUTER_PORT/v1/...; each replica also answers directly on
# BASE_PORT+i.
set -euo pipefail

here="$(cd "$(dirname "$0")/.." && pwd)"
n=2
policy=cache_aware
model="$here/models/shakespeare-hybrid-q8_0.gguf"
threads=1
duration=600
base_port=18100
router_port=18000
extra=()
while [[ $# -gt 0 ]]; do
  case "$1" in
    -n) n="$2"; shift 2 ;;
    -p) policy="$2"; shift 2 ;;
    -m) model="$2"; shift 2 ;;
    -t) threads="$2"; shift 2 ;;
    -d) duration="$2"; shift 2 ;;
    --base-port) base_port="$2"; shift 2 ;;
    --router-port) router_port="$2"; shift 2 ;;
    --) shift; extra=("$@"); break ;;
    -h|--help) sed -n '2,20p' "$0"; exit 0 ;;
    *) echo "unknown argument: $1 (see --help)" >&2; exit 2 ;;
  esac
done

coil="${COIL:-$here/target/release/coil}"
smg="${SMG:-$(command -v smg || true)}"
[[ -x "$coil" ]] || { echo "no coil binary at $coil (cargo build --release -p coil-cli)" >&2; exit 1; }
[[ -n "$smg" && -x "$smg" ]] || { echo "smg not found: pip install smg, or SMG=/path/to/smg" >&2; exit 1; }
[[ -f "$model" ]] || { echo "no model at $model" >&2; exit 1; }
logdir="${LOGDIR:-$(mktemp -d -t coil-cluster.XXXXXX)}"
mkdir -p "$logdir"

pids=()
cleanup() {
  trap - EXIT INT TERM
  for p in "${pids[@]}"; do kill -TERM "$p" 2>/dev/null || true; done
  # Replicas drain (at most --drain-timeout); give them a bounded wait.
  for _ in $(seq 50); do
    alive=0
    for p in "${pids[@]}"; do kill -0 "$p" 2>/dev/null && alive=1; done
    [[ $alive == 0 ]] && break
    sleep 0.2
  done
  for p in "${pids[@]}"; do kill -KILL "$p" 2>/dev/null || true; done
  echo "cluster stopped; logs in $logdir" >&2
}
trap cleanup EXIT INT TERM

wait_health() { # url, seconds
  for _ in $(seq $(( $2 * 10 ))); do
    curl -sf "$1" >/dev/null 2>&1 && return 0
    sleep 0.1
  done
  echo "no answer from $1 after $2 s" >&2
  return 1
}

urls=()
for i in $(seq 0 $((n - 1))); do
  port=$((base_port + i))
  "$coil" serve -m "$model" -t "$threads" --host 127.0.0.1 --port "$port" \
    --alias coil-demo --drain-timeout 10 "${extra[@]}" >"$logdir/coil-$i.log" 2>&1 &
  pids+=($!)
  urls+=("http://127.0.0.1:$port")
done
for u in "${urls[@]}"; do wait_health "$u/health" 60; done

"$smg" launch --host 127.0.0.1 --port "$router_port" --worker-urls "${urls[@]}" \
  --policy "$policy" --prometheus-host 127.0.0.1 --prometheus-port $((router_port + 1)) \
  --log-level warn ${SMG_ARGS:-} >"$logdir/smg.log" 2>&1 &
pids+=($!)
wait_health "http://127.0.0.1:$router_port/health" 60
# The router is up before it has registered the workers: wait for the model.
for _ in $(seq 300); do
  curl -sf "http://127.0.0.1:$router_port/v1/models" | grep -q coil-demo && break
  sleep 0.1
done

echo "cluster: SMG ($policy) on http://127.0.0.1:$router_port -> ${urls[*]}; logs in $logdir; stops in ${duration}s" >&2
echo "ready" >"$logdir/ready"
sleep "$duration" &
pids+=($!)
wait "${pids[-1]}" || true
