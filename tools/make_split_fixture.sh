#!/usr/bin/env bash
# Writes tests/fixtures/split/: the llama fixture's Q8_0 file cut into parts by
# llama.cpp's own `llama-gguf-split` (at most 8 tensors a part), for the test
# that coil opens splits written by that tool (crates/coil-gguf/tests/split.rs).
#
# Needs a llama.cpp build with the llama-gguf-split target
# (scripts/build-llamacpp.sh builds it; LLAMACPP_BIN from its env.sh).
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
: "${LLAMACPP_BIN:?source the env.sh that scripts/build-llamacpp.sh writes}"
out="$root/tests/fixtures/split"
mkdir -p "$out"
rm -f "$out"/llama-q8_0-*-of-*.gguf
"$LLAMACPP_BIN/llama-gguf-split" --split --split-max-tensors 8 \
    "$root/tests/fixtures/models/llama/model.q8_0.gguf" "$out/llama-q8_0"
ls -l "$out"
