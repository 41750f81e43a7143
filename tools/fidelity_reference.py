#!/usr/bin/env python3
"""llama.cpp's fidelity on the fidelity fixture: the reference numbers of
crates/coil-cli/tests/fidelity.rs.

Run by hand from the repository root after `cargo build --release -p coil-cli`,
with a llama.cpp build (scripts/build-llamacpp.sh; `source env.sh` there sets
LLAMACPP_DIR and LLAMACPP_SRC):

    python3 tools/fidelity_reference.py [--threads 2]

For each quantization TYPE of the fixture (tests/fixtures/fidelity/
shakespeare-llama-q8_0.gguf, tools/train_fidelity_llama.py):

1. `coil quantize` the fixture to TYPE (the test quantizes it the same way
   and checks the file's SHA-256 against the one recorded here);
2. dequantize every tensor of that file to F32 with gguf-py (the file's own
   weights, exactly) into a second GGUF;
3. run llama.cpp (tools/llama_logits.c, built here against the llama.cpp
   build) over the fixture's token windows (windows.json): the F32 file with
   the whole window in one batch is the reference; the TYPE file whole
   (`prompt`), one token per call (`token`) and four windows side by side one
   token each (`batch4`);
4. record per path the KL divergence KL(reference ‖ llama.cpp) over every
   position (f64, from the f32 logits: mean, 99th percentile, maximum), how
   often both put the same token first, and how often they do not on the
   positions where the reference's first two tokens are at least TIE_MARGIN
   apart (the others are ties).

Writes tests/fixtures/fidelity/reference.json. The test holds coil to these:
its own KL from its own F32 forward of the same dequantized weights at most
1.05 × llama.cpp's, per path and SIMD level.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import platform
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parent.parent
FIX = REPO / "tests/fixtures/fidelity"
SOURCE = FIX / "shakespeare-llama-q8_0.gguf"
WINDOWS = FIX / "windows.json"
OUT = FIX / "reference.json"
TYPES = ["Q4_0", "Q4_1", "Q4_K_M", "Q5_K_M", "Q6_K", "Q8_0", "IQ4_XS",
         "IQ1_S", "IQ1_M", "IQ2_XXS", "IQ2_XS", "IQ2_S", "IQ3_XXS", "IQ3_S"]
# The types quantized with the importance matrix IMATRIX (llama-quantize makes
# IQ1_* / IQ2_* / IQ3_XXS only with one; IQ3_S takes it too). IMATRIX is
# `coil imatrix` of the fixture over the test data's Shakespeare slice, made
# here when missing:
#   coil imatrix -m shakespeare-llama-q8_0.gguf -f ../../../crates/coil-cli/tests/data/shakespeare_val_slice.txt
#                -o imatrix.gguf -c 128 -t 2
# and given to `coil quantize` by its name in this folder, as the test does
# (the name is recorded in the file's `quantize.imatrix.file`).
IMATRIX_TYPES = {"IQ1_S", "IQ1_M", "IQ2_XXS", "IQ2_XS", "IQ2_S", "IQ3_XXS", "IQ3_S"}
IMATRIX = FIX / "imatrix.gguf"
CALIBRATION = REPO / "crates/coil-cli/tests/data/shakespeare_val_slice.txt"
MODES = ["prompt", "token", "batch4"]


def cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.machine()


def sha256(p: Path) -> str:
    return hashlib.sha256(p.read_bytes()).hexdigest()


def dequantize_gguf(src: Path, dst: Path) -> None:
    """Every tensor of src as F32 (quantized ones dequantized by gguf-py),
    metadata copied, general.file_type ALL_F32."""
    import gguf

    r = gguf.GGUFReader(src)
    arch = r.fields[gguf.Keys.General.ARCHITECTURE].contents()
    w = gguf.GGUFWriter(dst, arch)
    for f in r.fields.values():
        if f.name == gguf.Keys.General.ARCHITECTURE or f.name.startswith("GGUF."):
            continue
        if f.name == gguf.Keys.General.FILE_TYPE:
            w.add_file_type(gguf.LlamaFileType.ALL_F32)
            continue
        vt = f.types[0]
        sub = f.types[-1] if vt == gguf.GGUFValueType.ARRAY else None
        w.add_key_value(f.name, f.contents(), vt, sub_type=sub)
    for t in r.tensors:
        a = gguf.quants.dequantize(t.data, t.tensor_type).astype(np.float32)
        shape = [int(x) for x in reversed(t.shape)]  # numpy order
        w.add_tensor(t.name, a.reshape(shape))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def build_llama_logits(work: Path) -> Path:
    src = os.environ.get("LLAMACPP_SRC")
    lib = os.environ.get("LLAMACPP_BIN")
    if not src or not lib:
        raise SystemExit("set LLAMACPP_SRC and LLAMACPP_BIN (source env.sh of a llama.cpp build)")
    exe = work / "llama_logits"
    subprocess.run(
        ["cc", "-O2", "-o", str(exe), str(REPO / "tools/llama_logits.c"), f"-I{src}/include",
         f"-I{src}/ggml/include", f"-L{lib}", "-lllama", f"-Wl,-rpath,{lib}"],
        check=True,
    )
    return exe


def llama_logits(exe: Path, model: Path, tokens: Path, n_ctx: int, mode: str, threads: int, n_vocab: int, work: Path):
    out = work / f"{model.stem}.{mode}.f32"
    subprocess.run([str(exe), str(model), str(tokens), str(n_ctx), mode, str(threads), str(out)],
                   check=True, stderr=subprocess.DEVNULL, stdout=subprocess.DEVNULL)
    return np.fromfile(out, dtype="<f4").reshape(-1, n_vocab)


def log_softmax(x: np.ndarray) -> np.ndarray:
    x = x.astype(np.float64)
    m = x.max(axis=1, keepdims=True)
    return x - (m + np.log(np.exp(x - m).sum(axis=1, keepdims=True)))


# A position whose reference puts its first two tokens closer than this (in
# logits) is a tie: which of them an engine's rounding puts first is chance.
# The test (TIE_MARGIN there) counts top-token flips on the other positions.
TIE_MARGIN = 0.01


def compare(ref: np.ndarray, got: np.ndarray) -> dict:
    lp, lq = log_softmax(ref), log_softmax(got)
    kl = np.maximum((np.exp(lp) * (lp - lq)).sum(axis=1), 0.0)
    flip = ref.argmax(axis=1) != got.argmax(axis=1)
    top2 = np.sort(ref, axis=1)[:, -2:]
    decided = (top2[:, 1] - top2[:, 0]) >= TIE_MARGIN
    return dict(kl_mean=float(kl.mean()), kl_p99=float(np.quantile(kl, 0.99)), kl_max=float(kl.max()),
                same_top=float(1.0 - flip.mean()), rows=int(len(kl)),
                flips_decided=int((flip & decided).sum()), decided_rows=int(decided.sum()))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--types", nargs="*", default=TYPES)
    args = ap.parse_args()
    coil = REPO / "target/release/coil"
    if not coil.exists():
        raise SystemExit(f"{coil} not found: cargo build --release -p coil-cli")
    win = json.loads(WINDOWS.read_text())
    n_ctx = win["n_ctx"]
    ids = [t for w in win["windows"] for t in w]
    assert all(len(w) == n_ctx for w in win["windows"])
    assert len(win["windows"]) % 4 == 0, "batch4 takes the windows four at a time"
    out = json.loads(OUT.read_text()) if OUT.exists() else {}
    out.update(
        source_sha256=sha256(SOURCE),
        n_ctx=n_ctx,
        windows=len(win["windows"]),
        llama_cpp=Path(os.environ.get("LLAMACPP_SRC", "")).parent.parent.name,
        cpu=cpu_name(),
        threads=args.threads,
    )
    out.setdefault("types", {})
    if not IMATRIX.exists():
        # the text by its path from the fixtures folder (the file records it)
        subprocess.run([str(coil), "imatrix", "-m", SOURCE.name, "-f", os.path.relpath(CALIBRATION, FIX),
                        "-o", IMATRIX.name, "-c", "128", "-t", "2"], check=True, cwd=FIX,
                       stderr=subprocess.DEVNULL)
    with tempfile.TemporaryDirectory(prefix="fidelity-") as tmp:
        work = Path(tmp)
        exe = build_llama_logits(work)
        tokens = work / "tokens.i32"
        np.asarray(ids, dtype="<i4").tofile(tokens)
        for ty in args.types:
            q = work / f"{ty}.gguf"
            extra = ["--imatrix", IMATRIX.name] if ty in IMATRIX_TYPES else []
            subprocess.run([str(coil), "quantize", "--quiet", *extra, SOURCE.name, str(q), ty],
                           check=True, cwd=FIX, stderr=subprocess.DEVNULL)
            f32 = work / f"{ty}-f32.gguf"
            dequantize_gguf(q, f32)
            import gguf

            n_vocab = len(gguf.GGUFReader(q).fields["tokenizer.ggml.tokens"].data)
            ref = llama_logits(exe, f32, tokens, n_ctx, "prompt", args.threads, n_vocab, work)
            rec = dict(sha256=sha256(q), llama={})
            for mode in MODES:
                got = llama_logits(exe, q, tokens, n_ctx, mode, args.threads, n_vocab, work)
                assert got.shape == ref.shape, (got.shape, ref.shape)
                rec["llama"][mode] = compare(ref, got)
            out["types"][ty] = rec
            print(ty, json.dumps(rec["llama"]), flush=True)
    OUT.write_text(json.dumps(out, indent=1) + "\n")
    print(f"wrote {OUT}")


if __name__ == "__main__":
    sys.exit(main())
