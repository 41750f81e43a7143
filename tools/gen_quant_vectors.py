#!/usr/bin/env python3
"""Generate the tensor block-format test vectors for coil-gguf.

Run by hand (the outputs are committed):

    pip install gguf numpy
    python3 tools/gen_quant_vectors.py            # writes crates/coil-gguf/tests/fixtures/quant/

The reference is the `gguf` Python package's `gguf.quants` (which mirrors
ggml's reference C code). Everything is seeded, so a rerun with the same
gguf/numpy versions reproduces the files byte for byte; `versions.txt`
records the versions used.

Files, per format (`<fmt>` = lowercase ggml type name, e.g. `q4_k`), all raw
little-endian with no header:

    <fmt>.blocks.bin       random but valid blocks (all formats): random bytes
                           whose f16 (Q8_K: f32) scale fields are overwritten
                           with finite values (zero, f16-subnormal, large,
                           negative and ordinary ones)
    <fmt>.blocks.deq.f32   gguf.quants.dequantize of <fmt>.blocks.bin

    and for the quantizable formats (f32 f16 bf16 q8_0 q4_0 q4_1 q5_0 q5_1):

    <fmt>.in.f32           f32 input: edge-case blocks (zeros, tiny, f32
                           subnormal, large, overflowing f16, negative-only,
                           positive-only, magnitude ties, ±inf, constant,
                           exact grids and rounding ties) then random blocks;
                           the float formats also get NaNs with payloads,
                           rounding ties/boundaries and random bit patterns
    <fmt>.in.q.bin         gguf.quants.quantize(<fmt>.in.f32)
    <fmt>.in.deq.f32       gguf.quants.dequantize(<fmt>.in.q.bin)

Element counts follow from the file sizes and the block layout
(elements per block, bytes per block) of the type.

Notes:
- gguf.quants has no Q8_K; its reference here is ggml's dequantize_row_q8_K
  (`d * qs`, in f32), written out in numpy below.
- NaN is never fed to the block formats' quantizers: which NaN numpy's
  max/min/argmax return is not something to pin down; ±inf is.
- float32 -> uint8/int8 casts of NaN/inf (reachable when 1/d overflows) follow
  numpy on x86-64 (0); that is what coil mirrors.
"""

from __future__ import annotations

import argparse
import os
import sys

import numpy as np

try:
    import gguf
    from gguf import GGMLQuantizationType as T
    from gguf import quants
    from gguf.constants import GGML_QUANT_SIZES
except ImportError:  # pragma: no cover
    sys.exit("needs the gguf package: pip install gguf numpy")

SEED = 20251129

QUANTIZABLE = [T.F32, T.F16, T.BF16, T.Q8_0, T.Q4_0, T.Q4_1, T.Q5_0, T.Q5_1]
DEQUANT_ONLY = [T.Q2_K, T.Q3_K, T.Q4_K, T.Q5_K, T.Q6_K, T.Q8_K, T.IQ4_NL, T.IQ4_XS]

# Byte offsets of the f16 scale fields in each block.
F16_FIELDS = {
    T.Q4_0: [0],
    T.Q4_1: [0, 2],
    T.Q5_0: [0],
    T.Q5_1: [0, 2],
    T.Q8_0: [0],
    T.Q2_K: [80, 82],
    T.Q3_K: [108],
    T.Q4_K: [0, 2],
    T.Q5_K: [0, 2],
    T.Q6_K: [208],
    T.IQ4_NL: [0],
    T.IQ4_XS: [0],
}

# Blocks of random bytes per format (k-quants: 256 elements each).
N_RANDOM_BLOCKS = {T.F32: 1024, T.F16: 4096, T.BF16: 4096}


def n_random_blocks(t: T) -> int:
    if t in N_RANDOM_BLOCKS:
        return N_RANDOM_BLOCKS[t]
    block_size, _ = GGML_QUANT_SIZES[t]
    return 64 if block_size == 32 else 8


def scale_values(rng: np.random.Generator, n: int) -> np.ndarray:
    """n finite f16 scales: the first few are edge cases, the rest ordinary."""
    v = (rng.choice([-1.0, 1.0], n) * 10.0 ** rng.uniform(-5, 0.5, n)).astype(np.float16)
    edge = [
        np.float16(0.0),
        np.uint16(rng.integers(1, 0x400)).view(np.float16),  # subnormal
        np.float16(rng.uniform(30000, 65504)),  # large
        np.float16(-rng.uniform(0.01, 2)),  # negative
        np.float16(65504.0),
    ]
    for i, e in enumerate(edge[:n]):
        v[i] = e
    return v


def random_blocks(rng: np.random.Generator, t: T) -> np.ndarray:
    block_size, type_size = GGML_QUANT_SIZES[t]
    n = n_random_blocks(t)
    if t in (T.F16, T.BF16, T.F32):
        blocks = rng.integers(0, 256, (n, type_size), dtype=np.uint8)
        special = {
            T.F16: [0x0000, 0x8000, 0x0001, 0x8001, 0x03FF, 0x0400, 0x3C00, 0x7BFF, 0xFBFF, 0x7C00, 0xFC00,
                    0x7C01, 0xFC01, 0x7D55, 0x7E00, 0xFE00, 0x7FFF, 0xFFFF],
            T.BF16: [0x0000, 0x8000, 0x0001, 0x007F, 0x0080, 0x3F80, 0x7F7F, 0x7F80, 0xFF80, 0x7F81, 0x7FC0,
                     0xFFC1, 0x7FFF, 0xFFFF],
            T.F32: [0x00000000, 0x80000000, 0x00000001, 0x007FFFFF, 0x3F800000, 0x7F7FFFFF, 0x7F800000,
                    0xFF800000, 0x7F800001, 0x7FC00000, 0xFFC12345, 0x7FFFFFFF],
        }[t]
        dtype = np.uint32 if t == T.F32 else np.uint16
        sp = np.array(special, dtype=dtype).view(np.uint8).reshape(-1, type_size)
        blocks[: len(sp)] = sp
        return blocks
    blocks = rng.integers(0, 256, (n, type_size), dtype=np.uint8)
    if t == T.Q8_K:
        d = (rng.choice([-1.0, 1.0], n) * 10.0 ** rng.uniform(-8, 0, n)).astype(np.float32)
        d[0] = 0.0
        blocks[:, 0:4] = d.reshape(n, 1).view(np.uint8)
        return blocks
    for k, off in enumerate(F16_FIELDS[t]):
        v = scale_values(rng, n)
        if k > 0:
            v = rng.permutation(v)  # min fields: other edge cases per block
        blocks[:, off : off + 2] = v.reshape(n, 1).view(np.uint8)
    return blocks


def legacy_input(rng: np.random.Generator) -> np.ndarray:
    """f32 input for the 32-element block quantizers: edge cases, then random."""
    f = np.float32
    B = []
    B.append(np.zeros(32, f))  # zeros block
    B.append(rng.normal(size=32) * 1e-30)  # tiny: the f16 scale underflows to 0
    B.append(rng.normal(size=32) * 1e-40)  # f32 subnormals: 1/d overflows
    B.append(rng.normal(size=32) * 3e4)  # large
    B.append(rng.normal(size=32) * 1e7)  # scales overflow f16 to inf
    B.append(-np.abs(rng.normal(size=32)) - 0.1)  # negative only
    B.append(np.abs(rng.normal(size=32)) * 7 + 3)  # positive only, offset
    t = rng.uniform(-1, 1, 32)
    t[5], t[20] = 2.5, -2.5  # magnitude tie, positive first
    B.append(t)
    t = rng.uniform(-1, 1, 32)
    t[2], t[30] = -3.75, 3.75  # magnitude tie, negative first
    B.append(t)
    t = rng.normal(size=32)
    t[9] = np.inf
    B.append(t)
    t = rng.normal(size=32)
    t[17] = -np.inf
    B.append(t)
    B.append(np.full(32, 0.7))  # constant: max == min
    B.append(np.full(32, -1e-3))  # constant negative
    B.append(np.arange(32) % 16 - 8.0)  # exact Q4 grid (max -8, d = 1)
    B.append(np.arange(32) - 16.0)  # exact Q5 grid
    t = np.arange(32) - 15.5  # .5 ties for Q8_0 once d = 1
    t[0] = 127.0
    B.append(t)
    B.append(np.linspace(-1, 1, 32))
    B.append(np.full(32, 65504.0) * rng.choice([-1, 1], 32))
    B.append(rng.uniform(0, 1, 32))
    # 32 ordinary random blocks at varied scales and offsets
    for _ in range(32):
        scale = 10.0 ** rng.uniform(-4, 2)
        offset = rng.choice([0.0, 0.0, rng.normal() * 3 * scale])
        B.append(rng.normal(size=32) * scale + offset)
    x = np.concatenate([np.asarray(b, dtype=np.float64).astype(f) for b in B])
    assert not np.isnan(x).any()
    return x


def float_input(rng: np.random.Generator, base: np.ndarray) -> np.ndarray:
    """Extra input for F32/F16/BF16: specials, rounding boundaries, random bits."""
    u = []
    u += [0x7F800001, 0xFF812345, 0x7FA00000, 0x7FC00000, 0xFFC00000, 0x7FFFFFFF, 0xFFFFFFFF,
          0x7F801FFF, 0x7F802000, 0x7FBFFFFF, 0x80000000]
    one = 0x3F800000
    u += [one + 0x1000, one + 0x3000, one + 0x0FFF, one + 0x1001]  # f16 ties near 1
    u += [one + 0x8000, one + 0x18000, one + 0x7FFF, one + 0x8001]  # bf16 ties near 1
    u += [0x33000000, 0x33000001, 0x33C00000, 0x387FC000, 0x387FE000, 0x38800000, 0x337FFFFF]
    u += [0x477FE000, 0x477FEFFF, 0x477FF000, 0x7F7FFFFF, 0x7F7F7FFF, 0x7F7F8000, 0x00000001]
    x = np.array(u, dtype=np.uint32).view(np.float32)
    floats = np.array([65504, 65505, 65519.99, 65520, -65520, 6.1e-5, 5.96e-8, 2.98e-8, 1e-45, 3.4e38],
                      dtype=np.float32)
    rand_bits = rng.integers(0, 2**32, 2048, dtype=np.uint64).astype(np.uint32).view(np.float32)
    return np.concatenate([base, x, floats, rand_bits])


def reference_dequant(blocks: np.ndarray, t: T) -> np.ndarray:
    if t == T.Q8_K and T.Q8_K not in getattr(quants, "_type_traits", {}):
        # ggml's dequantize_row_q8_K: y = d * qs (f32)
        d = blocks[:, 0:4].copy().view(np.float32)
        qs = blocks[:, 4:260].copy().view(np.int8).astype(np.float32)
        return (d * qs).astype(np.float32)
    if t in (T.F32, T.F16):
        return quants.dequantize(blocks.reshape(-1), t).astype(np.float32, copy=False)
    return quants.dequantize(blocks, t)


def write(path: str, arr: np.ndarray) -> None:
    data = np.ascontiguousarray(arr).tobytes()
    with open(path, "wb") as fh:
        fh.write(data)


def main() -> None:
    here = os.path.dirname(os.path.abspath(__file__))
    default_out = os.path.join(here, "..", "crates", "coil-gguf", "tests", "fixtures", "quant")
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=default_out)
    args = ap.parse_args()
    out = os.path.normpath(args.out)
    os.makedirs(out, exist_ok=True)
    assert sys.byteorder == "little"

    rng = np.random.default_rng(SEED)
    base = legacy_input(rng)
    finput = float_input(rng, base)
    total = 0
    with np.errstate(all="ignore"):
        for t in QUANTIZABLE + DEQUANT_ONLY:
            name = t.name.lower()
            block_size, type_size = GGML_QUANT_SIZES[t]
            blocks = random_blocks(rng, t)
            deq = reference_dequant(blocks, t)
            assert deq.dtype == np.float32 and deq.size == blocks.shape[0] * block_size, name
            files = {f"{name}.blocks.bin": blocks, f"{name}.blocks.deq.f32": deq}
            if t in QUANTIZABLE:
                x = finput if block_size == 1 else base
                x = x.reshape(-1, block_size)
                q = quants.quantize(x, t)
                q = np.ascontiguousarray(q).view(np.uint8).reshape(-1, type_size)
                qdeq = reference_dequant(q, t)
                files[f"{name}.in.f32"] = x
                files[f"{name}.in.q.bin"] = q
                files[f"{name}.in.deq.f32"] = qdeq
            for fname, arr in files.items():
                write(os.path.join(out, fname), arr)
                total += arr.nbytes
            print(f"{name:7s} {blocks.shape[0]:5d} random blocks" +
                  (f", {files[name + '.in.f32'].size} input values" if t in QUANTIZABLE else ""))
    with open(os.path.join(out, "versions.txt"), "w") as fh:
        fh.write(f"generated by tools/gen_quant_vectors.py, seed {SEED}\n")
        fh.write(f"gguf {getattr(gguf, '__version__', None) or _dist_version('gguf')}\n")
        fh.write(f"numpy {np.__version__}\n")
    print(f"{total} bytes written to {out}")


def _dist_version(name: str) -> str:
    try:
        from importlib.metadata import version

        return version(name)
    except Exception:  # pragma: no cover
        return "unknown"


if __name__ == "__main__":
    main()
