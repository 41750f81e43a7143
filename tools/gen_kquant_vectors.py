#!/usr/bin/env python3
"""Makes crates/coil-gguf/tests/fixtures/quant/kquant.ggml.in.f32 and q{4,5,6}_k.ggml.q.bin
with ggml's reference K-quant quantizers: compile llama.cpp's ggml/src/ggml-quants.c with
`gcc -O2 -DNDEBUG` and a main that calls quantize_row_q{4,5,6}_K_ref on a raw f32 file
(`qref 4|5|6 in.f32 out.bin`), then run this with QREF=path/to/qref."""
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
for t in (4, 5, 6):
    subprocess.run([os.environ["QREF"], str(t), f"{d}/kquant.ggml.in.f32", f"{d}/q{t}_k.ggml.q.bin"], check=True)
print(len(x)//256, "blocks")
