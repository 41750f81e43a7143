#!/usr/bin/env python3
"""Test vectors of the IQ1/IQ2/IQ3, TQ and MXFP4 formats, made by ggml itself, in
crates/coil-gguf/tests/fixtures/quant/.

    QREF=path/to/qref python3 tools/gen_iq_vectors.py LLAMA_CPP_DIR

QREF is tools/qref.c built against llama.cpp's ggml-base (see the comment at its top);
LLAMA_CPP_DIR the llama.cpp source it was built from (its ggml-common.h is hashed into
iq.versions.txt). Run by hand; the outputs are committed. Everything is seeded.

Per format (`<fmt>` = lowercase ggml name):

    <fmt>.blocks.bin        random blocks: random bytes, the f16 scale made finite (zero,
                            subnormal, large, negative and ordinary values)
    <fmt>.blocks.deq.f32    ggml's dequantize_row_<fmt> of them
    <fmt>.ggml.q.bin        ggml_quantize_chunk of iq.ggml.in.f32 in rows of ROW values without
                            importance weights (formats that allow it)
    <fmt>.ggml.qw.bin       the same with the weights iq.ggml.w.f32 (ROW floats, every row);
                            also for the legacy, K-quant and IQ4 formats (WEIGHTED)

The random blocks are also dequantized by the `gguf` Python package (gguf.quants); the script
stops if it disagrees with ggml anywhere (its tables are its own copy).
"""
import hashlib
import importlib.metadata
import os
import subprocess
import sys
import tempfile

import numpy as np
from gguf import GGMLQuantizationType as T
from gguf import quants
from gguf.constants import GGML_QUANT_SIZES

SEED = 20260701
OUT = "crates/coil-gguf/tests/fixtures/quant"
ROW = 512  # values per row of the quantization vectors
N_BLOCKS = 24

# format -> byte offset of its f16 scale (IQ1_M: spread over nibbles; MXFP4: none)
FORMATS = {
    T.IQ2_XXS: 0,
    T.IQ2_XS: 0,
    T.IQ2_S: 0,
    T.IQ3_XXS: 0,
    T.IQ3_S: 0,
    T.IQ1_S: 0,
    T.IQ1_M: None,
    T.TQ1_0: 52,
    T.TQ2_0: 64,
    T.MXFP4: None,
}
NEEDS_WEIGHTS = {T.IQ2_XXS, T.IQ2_XS, T.IQ1_S}
# formats whose importance-weighted quantizers (llama-quantize --imatrix) get <fmt>.ggml.qw.bin
# of the same input and weights (their unweighted vectors come from the other scripts)
WEIGHTED = ["q4_0", "q4_1", "q5_0", "q5_1", "q2_k", "q3_k", "q4_k", "q5_k", "q6_k", "iq4_nl", "iq4_xs"]


def scales(rng, n):
    v = (rng.choice([-1.0, 1.0], n) * 10.0 ** rng.uniform(-5, 0.5, n)).astype(np.float16)
    edge = [0.0, np.uint16(rng.integers(1, 0x400)).view(np.float16), 40000.0, -1.5, 65504.0]
    v[: len(edge)] = np.array(edge, dtype=np.float16)
    return v


def random_blocks(rng, t):
    _, ts = GGML_QUANT_SIZES[t]
    b = rng.integers(0, 256, (N_BLOCKS, ts), dtype=np.uint8)
    off = FORMATS[t]
    d = scales(rng, N_BLOCKS).view(np.uint16)
    if off is not None:
        b[:, off : off + 2] = d.reshape(-1, 1).view(np.uint8)
    elif t == T.IQ1_M:
        # the f16 is the top nibbles of the four u16 scale words @48 (first one lowest)
        sc = b[:, 48:56].copy().view(np.uint16)
        for k in range(4):
            sc[:, k] = (sc[:, k] & 0x0FFF) | (((d >> (4 * k)) & 0xF) << 12)
        b[:, 48:56] = sc.view(np.uint8)
    return b


def quant_input(rng):
    f = np.float32
    B = []
    B.append(rng.standard_normal(256 * 6))
    B.append(rng.standard_t(3, 256 * 4) * 0.02)  # heavy tails
    B.append(np.zeros(256))
    B.append(np.full(256, 0.75))
    B.append(np.abs(rng.standard_normal(256)))
    B.append(-np.abs(rng.standard_normal(256)) * 1e-3)
    x = rng.standard_normal(256)
    x[::37] *= 50  # outliers
    B.append(x)
    B.append(rng.choice([-1.0, 0.0, 1.0], 256) * 0.3)  # ternary values exactly
    B.append(np.tile([0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12], 16) * 0.125)  # e2m1 exactly
    x = rng.uniform(-1, 1, 256)
    x[::5] = 0.5  # ternary rounding ties against amax 1
    x[3] = 1.0
    B.append(x)
    B.append(rng.standard_normal(256) * 1e-41)  # f32 subnormals
    B.append(rng.standard_normal(256) * 1e4)
    B.append(rng.standard_normal(256) * 3 + 5)  # offset
    B.append(np.sign(rng.standard_normal(256)) * rng.uniform(0.9, 1.1, 256))  # near-constant magnitude
    x = rng.standard_normal(256)
    x[64:96] = 0.0  # one all-zero sub-block between others
    B.append(x)
    B.append(rng.standard_normal(256))
    x = np.concatenate([np.asarray(b, dtype=np.float64).astype(f) for b in B])
    assert len(x) % ROW == 0 and np.isfinite(x).all()
    return x


def run(*args):
    subprocess.run([os.environ["QREF"], *map(str, args)], check=True)


def main():
    if len(sys.argv) != 2 or "QREF" not in os.environ:
        sys.exit(__doc__)
    rng = np.random.default_rng(SEED)
    x = quant_input(rng)
    x.tofile(f"{OUT}/iq.ggml.in.f32")
    # importance weights: positive, spread like an imatrix's mean squared activations
    w = (rng.gamma(0.8, 1.0, ROW) + 1e-3).astype(np.float32)
    w[7] = 0.0
    w.tofile(f"{OUT}/iq.ggml.w.f32")
    with tempfile.TemporaryDirectory() as tmp:
        for t, _ in FORMATS.items():
            name = t.name.lower()
            blocks = random_blocks(rng, t)
            blocks.tofile(f"{OUT}/{name}.blocks.bin")
            run("deq", name, f"{OUT}/{name}.blocks.bin", f"{OUT}/{name}.blocks.deq.f32")
            ggml = np.fromfile(f"{OUT}/{name}.blocks.deq.f32", dtype=np.float32)
            py = quants.dequantize(blocks.reshape(-1), t).astype(np.float32).reshape(-1)
            if not np.array_equal(ggml.view(np.uint32), py.view(np.uint32)):
                bad = np.nonzero(ggml.view(np.uint32) != py.view(np.uint32))[0]
                sys.exit(f"{name}: gguf.quants differs from ggml at {len(bad)} values, first {bad[:5]}")
            if t not in NEEDS_WEIGHTS:
                run("q", name, ROW, f"{OUT}/iq.ggml.in.f32", f"{OUT}/{name}.ggml.q.bin")
            run("q", name, ROW, f"{OUT}/iq.ggml.in.f32", f"{OUT}/{name}.ggml.qw.bin", f"{OUT}/iq.ggml.w.f32")
            print(name, "ok")
    for name in WEIGHTED:
        run("q", name, ROW, f"{OUT}/iq.ggml.in.f32", f"{OUT}/{name}.ggml.qw.bin", f"{OUT}/iq.ggml.w.f32")
        print(name, "weighted ok")
    common = os.path.join(sys.argv[1], "ggml/src/ggml-common.h")
    sha = hashlib.sha256(open(common, "rb").read()).hexdigest()
    with open(f"{OUT}/iq.versions.txt", "w") as f:
        f.write(f"generated by tools/gen_iq_vectors.py, seed {SEED}\n")
        f.write(f"ggml (tools/qref.c) from llama.cpp with ggml-common.h sha256 {sha}\n")
        f.write(f"gguf {importlib.metadata.version('gguf')}\n")
        f.write(f"numpy {np.__version__}\n")


if __name__ == "__main__":
    main()
