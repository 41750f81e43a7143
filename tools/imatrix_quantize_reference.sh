#!/usr/bin/env bash
# llama-quantize's outputs with importance matrices, as hashes, for
# crates/coil-cli/tests/imatrix.rs (tests/fixtures/imatrix/quantize.sha256).
#
#   tools/imatrix_quantize_reference.sh LLAMA_QUANTIZE
#
# Per line of tests/fixtures/imatrix/cases.txt (`MODEL IMATRIX MIX...`, paths relative to
# tests/fixtures/imatrix/, where llama-quantize runs so that the recorded
# quantize.imatrix.file is the relative name), llama-quantize --allow-requantize --imatrix
# IMATRIX MODEL OUT MIX; writes `MODEL IMATRIX MIX sha256` lines. The importance matrices there were
# made by `coil imatrix` (see tests/fixtures/imatrix/README.md).
set -euo pipefail
llq=$(realpath "$1")
cd "$(dirname "$0")/../tests/fixtures/imatrix"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
out=quantize.sha256
: > "$out"
while read -r model imatrix mixes; do
  [ -z "$model" ] || [ "${model#\#}" != "$model" ] && continue
  for mix in $mixes; do
    "$llq" --allow-requantize --imatrix "$imatrix" "$model" "$tmp/q.gguf" "$mix" 2 > "$tmp/log" 2>&1 \
      || { echo "$model $mix: llama-quantize failed"; tail -3 "$tmp/log"; exit 1; }
    echo "$model $imatrix $mix $(sha256sum < "$tmp/q.gguf" | cut -c1-64)" >> "$out"
  done
done < cases.txt
cat "$out"
