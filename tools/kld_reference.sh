#!/bin/sh
# llama.cpp's log-probability file of the bundled demo model over the test
# slice, for crates/coil-cli/tests/perplexity.rs (coil reads llama-perplexity's
# --kl-divergence-base files). Run from the repository root with a llama.cpp
# build (scripts/build-llamacpp.sh; `source env.sh` there sets LLAMACPP_BIN):
#
#     sh tools/kld_reference.sh
set -eu
: "${LLAMACPP_BIN:?source env.sh of a llama.cpp build first}"
"$LLAMACPP_BIN/llama-perplexity" -m models/shakespeare-hybrid-q8_0.gguf \
    -f crates/coil-cli/tests/data/shakespeare_val_slice.txt -c 64 --chunks 2 -t 2 \
    --kl-divergence-base crates/coil-cli/tests/data/demo_base_llama.kld >/dev/null 2>&1
ls -l crates/coil-cli/tests/data/demo_base_llama.kld
