#!/usr/bin/env bash
# Compares `coil quantize` with llama.cpp's `llama-quantize` file for file.
#
#   [FLAGS="--pure --output-tensor-type q8_0 ..."] tools/crosscheck_quantize.sh LLAMA_QUANTIZE COIL IN.f32.gguf [MIX...]
#
# FLAGS (llama-quantize's --pure, --leave-output-tensor, --output-tensor-type,
# --token-embedding-type, --imatrix FILE) go to both tools; LLAMA_FLAGS to llama-quantize
# alone (--allow-requantize for a quantized IN: coil always requantizes).
# With --imatrix, give FILE by the same path for both (the output records it).
# IN should be an f32 GGUF (e.g. from `coil convert --type f32`, of a model whose rows are
# multiples of 256 so the K-quant rules apply). Prints "identical" or the first difference;
# with a difference, `python3 tools/...` style tensor-level checks help (see docs/CONVERT.md).
set -euo pipefail
llq=$1; coil=$2; in=$3; shift 3
mixes=${*:-Q8_0 Q4_0 Q4_1 Q5_0 Q5_1 Q2_K Q3_K_S Q3_K_M Q3_K_L Q4_K_S Q4_K_M Q5_K_S Q5_K_M Q6_K IQ4_NL IQ4_XS}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
for mix in $mixes; do
  "$llq" ${LLAMA_FLAGS:-} ${FLAGS:-} "$in" "$tmp/llama.$mix.gguf" "$mix" 2 > "$tmp/log" 2>&1 || { echo "$mix: llama-quantize failed"; tail -3 "$tmp/log"; continue; }
  "$coil" quantize --quiet ${FLAGS:-} "$in" "$tmp/coil.$mix.gguf" "$mix" 2>/dev/null
  if cmp -s "$tmp/llama.$mix.gguf" "$tmp/coil.$mix.gguf"; then
    echo "$mix: identical $(sha256sum < "$tmp/coil.$mix.gguf" | cut -c1-64)"
  else
    echo "$mix: DIFFERS: $(cmp "$tmp/llama.$mix.gguf" "$tmp/coil.$mix.gguf" | head -1)"
  fi
done
