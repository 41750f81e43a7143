#!/usr/bin/env python3
"""RMSE of coil's K-quant quantizers against ggml's reference C quantizers
(`quantize_row_q{4,5,6}_K_ref`, compiled from a llama.cpp tree) on the same
f32 tensors; both dequantized with gguf-py (exact).

    python3 tools/kquant_rmse.py COIL_QUANTIZE_FILE GGML_QREF [GGML_QREF_NATIVE]

COIL_QUANTIZE_FILE: target/release/examples/quantize_file; GGML_QREF: a
program `qref 4|5|6 in.f32 out.bin` calling ggml's reference quantizer.
"""
import subprocess, sys, tempfile, os
import numpy as np
from gguf.quants import dequantize
from gguf import GGMLQuantizationType as T

coil, *refs = sys.argv[1:]
rng = np.random.default_rng(1234)
tensors = {
    "normal 1024x4096": rng.standard_normal((1024, 4096), dtype=np.float32),
    # Mamba-2-370m-shaped layer (d_model 1024, d_inner 2048, d_state 128, 32 heads)
    "m2-370m in_proj 4384x1024": (rng.standard_normal((4384, 1024), dtype=np.float32) / 32),
    "m2-370m out_proj 1024x2048": (rng.standard_normal((1024, 2048), dtype=np.float32) / np.float32(np.sqrt(2048))),
    "student-t(3) 1024x4096": rng.standard_t(3, (1024, 4096)).astype(np.float32) * 0.02,
}
types = [("Q4_K", T.Q4_K, 4), ("Q5_K", T.Q5_K, 5), ("Q6_K", T.Q6_K, 6)]
d = tempfile.mkdtemp()
print(f"| tensor | type | coil RMSE | ggml RMSE | ratio | identical blocks |" + (" ggml -march=native RMSE |" if len(refs) > 1 else ""))
print("|---|---|---|---|---|---|" + ("---|" if len(refs) > 1 else ""))
for name, x in tensors.items():
    src = os.path.join(d, "x.f32")
    x.tofile(src)
    for tn, tt, num in types:
        out = {}
        subprocess.run([coil, tn, src, os.path.join(d, "coil.bin")], check=True)
        out["coil"] = np.fromfile(os.path.join(d, "coil.bin"), dtype=np.uint8)
        for i, r in enumerate(refs):
            subprocess.run([r, str(num), src, os.path.join(d, f"ref{i}.bin")], check=True)
            out[f"ref{i}"] = np.fromfile(os.path.join(d, f"ref{i}.bin"), dtype=np.uint8)
        rm = {}
        for k, q in out.items():
            y = dequantize(q.reshape(x.shape[0], -1), tt).reshape(x.shape)
            rm[k] = float(np.sqrt(np.mean((y.astype(np.float64) - x) ** 2)))
        bs = {4: 144, 5: 176, 6: 210}[num]
        a, b = out["coil"].reshape(-1, bs), out["ref0"].reshape(-1, bs)
        same = float(np.mean(np.all(a == b, axis=1)))
        row = f"| {name} | {tn} | {rm['coil']:.6g} | {rm['ref0']:.6g} | {rm['coil']/rm['ref0']:.5f} | {same*100:.2f} % |"
        if len(refs) > 1:
            row += f" {rm['ref1']:.6g} |"
        print(row, flush=True)
