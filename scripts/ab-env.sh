#!/usr/bin/env bash
# A/B of two settings of one `coil bench` command, run in alternation so
# that a host whose memory speed drifts over minutes moves both alike:
#
#   scripts/ab-env.sh [-n ROUNDS] [-c COLUMN] "A_ENV" "B_ENV" -- coil bench ARGS...
#
# A_ENV / B_ENV are space-separated VAR=VALUE lists ("" for none), set
# for their runs only. Each round runs A then B (B then A on odd rounds);
# every run's first table row's COLUMN (default `t/s`; `--parallel` tables:
# e.g. `S_TG t/s`) is collected, and
# the medians, the per-round B/A ratios and their median are printed.
# Example (one-token prefetch on and off, decode of one file):
#
#   scripts/ab-env.sh -n 8 "COIL_PREFETCH=1" "COIL_PREFETCH=0" -- \
#     target/release/coil bench -m model.gguf -t 2 -p 0 -n 64 -r 1
set -euo pipefail
rounds=6
column="t/s"
while [[ "${1:-}" == "-n" || "${1:-}" == "-c" ]]; do
  if [[ "$1" == "-n" ]]; then rounds=$2; else column=$2; fi
  shift 2
done
if [[ $# -lt 4 || "$3" != "--" ]]; then
  sed -n '2,16p' "$0" >&2
  exit 2
fi
a_env=$1
b_env=$2
shift 3

run() { # ENV... -- prints the tokens/s of the first result row
  local envs=$1
  shift
  # shellcheck disable=SC2086
  env $envs "$@" 2>/dev/null </dev/null | awk -F'|' -v want="$column" '
    /^\| / && col == 0 {
      for (i = 2; i < NF; i++) { h = $i; gsub(/^ +| +$/, "", h); if (h == want) col = i }
      next
    }
    /^\| / && col > 0 && $0 !~ /---/ {
      v = $col; gsub(/ /, "", v); split(v, parts, "±"); print parts[1]; exit
    }'
}

median() { sort -g | awk '{ v[NR] = $1 } END { if (NR % 2) print v[(NR + 1) / 2]; else print (v[NR / 2] + v[NR / 2 + 1]) / 2 }'; }

as=()
bs=()
ratios=()
for ((i = 0; i < rounds; i++)); do
  if ((i % 2 == 0)); then
    a=$(run "$a_env" "$@")
    b=$(run "$b_env" "$@")
  else
    b=$(run "$b_env" "$@")
    a=$(run "$a_env" "$@")
  fi
  r=$(awk -v a="$a" -v b="$b" 'BEGIN { printf "%.3f", b / a }')
  printf 'round %d: A %s  B %s  B/A %s\n' "$((i + 1))" "$a" "$b" "$r"
  as+=("$a")
  bs+=("$b")
  ratios+=("$r")
done
printf 'median A (%s): %s\n' "$a_env" "$(printf '%s\n' "${as[@]}" | median)"
printf 'median B (%s): %s\n' "$b_env" "$(printf '%s\n' "${bs[@]}" | median)"
printf 'median B/A: %s (range %s – %s)\n' "$(printf '%s\n' "${ratios[@]}" | median)" \
  "$(printf '%s\n' "${ratios[@]}" | sort -g | head -1)" "$(printf '%s\n' "${ratios[@]}" | sort -g | tail -1)"
