#!/usr/bin/env python3
"""Makes crates/coil-gguf/tests/fixtures/quant/kquant.ggml.in.f32 and q{2,3,4,5,6}_k.ggml.q.bin
and iq4_{nl,xs}.ggml.q.bin with ggml's quantizers: build tools/qref.c (a main that calls
quantize_row_q{2,3,4,5,6}_K_ref or quantize_iq4_{nl,xs} on a raw f32 file:
`qref 2|3|4|5|6|nl|xs in.f32 out.bin`) against
llama.cpp's ggml-base, e.g.

    G=llama.cpp/ggml; gcc -O2 -I$G/include -I$G/src tools/qref.c -L$BUILD/bin -lggml-base \
        -Wl,-rpath,$BUILD/bin -o qref

(ggml-base is compiled without -march flags, as llama-quantize uses it), then run this with
QREF=path/to/qref."""
import numpy as np, subprocess, os
rng = np.random.default_rng(99)
blocks = []
blocks.append(rng.standard_normal(256*6).astype(np.float32))            # normal
blocks.append((rng.standard_t(3, 256*4) * 0.02).astype(np.float32))    # heavy tails
blocks.append(np.zeros(256, np.float32))                               # zeros
blocks.append(np.full(256, 0.75, np.float32))                          # constant
blocks.append(np.abs(rng.standard_normal(256)).astype(np.float32))     # all positive
blocks.append(-np.abs(rng.standard_normal(256)).astype(np.float32) * 1e-3)  # all negative, small
x = rng.standard_normal(256).astype(np.float32); x[::37] *= 50         # outliers
blocks.append(x)
x = np.concatenate(blocks)
d = "crates/coil-gguf/tests/fixtures/quant"
x.tofile(f"{d}/kquant.ggml.in.f32")
for t in (2, 3, 4, 5, 6):
    subprocess.run([os.environ["QREF"], str(t), f"{d}/kquant.ggml.in.f32", f"{d}/q{t}_k.ggml.q.bin"], check=True)
for t in ("nl", "xs"):
    subprocess.run([os.environ["QREF"], t, f"{d}/kquant.ggml.in.f32", f"{d}/iq4_{t}.ggml.q.bin"], check=True)
print(len(x)//256, "blocks")
