#!/usr/bin/env python3
"""Build the NextN / multi-token-prediction fixtures in tests/fixtures/nextn/:
the tiny models of tests/fixtures/hf/ given an MTP block, converted by
llama.cpp's own convert_hf_to_gguf.py *with* the block (the default; the
committed trunk-only files were converted with `--no-mtp`, or from a
checkpoint without one).

Run by hand (the outputs are committed):

    python3 tools/make_fixtures_nextn.py --llama-cpp <llama.cpp source tree> \
        [--converter-python <python with transformers 4.57>] [--only NAME...]

For each fixture this script

1. copies the checkpoint tests/fixtures/hf/<source>/ and adds the tensors a
   released checkpoint of that family carries for its MTP block, with fresh
   random values (fixed seed; matrices N(0, 1/fan_in), norm weights as the
   trunk's, all f16-representable), in the checkpoint's naming:
   - Nemotron-H-MoE (`num_nextn_predict_layers` 1, Nemotron-3's layout):
     `mtp.layers.0.{enorm,hnorm,eh_proj}` and an attention sub-layer
     (`norm`, `mixer.{q,k,v,o}_proj`), `mtp.layers.1` a MoE sub-layer
     (`norm`, router, score-correction bias, experts, shared expert) and its
     `final_layernorm`;
   - Qwen3.5 / Qwen3.5-MoE / Qwen3-Next (`mtp_num_hidden_layers` 1 where the
     family's config has the key): `mtp.fc`, `mtp.pre_fc_norm_embedding`,
     `mtp.pre_fc_norm_hidden`, `mtp.norm` and one full-attention decoder
     layer `mtp.layers.0.*` shaped like the trunk's attention layer;
2. checks that transformers (the system's, 5.x) ignores the block: the
   logits of the checkpoint with the block equal, bit for bit, the trunk's
   reference logits committed beside the trunk-only GGUF;
3. converts the checkpoint twice with llama.cpp's converter, with the block
   (-> tests/fixtures/nextn/<name>/model.gguf) and with `--no-mtp`, and
   checks that the `--no-mtp` file is byte for byte the committed trunk-only
   GGUF, so that the two files are the same model with and without the tail;
4. saves the block's tensors alone as tests/fixtures/nextn/<name>/
   mtp.safetensors (the checkpoint is the trunk's folder plus these and the
   config key: coil convert's tests convert it and compare with model.gguf).

The converter runs in `--converter-python` (llama.cpp's converter is made
for transformers 4.57: a venv with `pip install transformers==4.57.*`,
torch, numpy, safetensors, sentencepiece); with the cut fixture vocabulary
its pre-tokenizer name is fixed to "olmo", as for the other fixtures.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]

# name -> (source checkpoint, trunk-only GGUF and its logits, converter outtype, seed)
FIXTURES = {
    "nemotron_h_moe": ("nemotron_h_moe", "models/nemotron_h_moe/model.f16.gguf", "models/nemotron_h_moe/logits.npy", "f16", 5901),
    "qwen35": ("qwen35_tiny", "parity/qwen35_tiny/model.gguf", "parity/qwen35_tiny/logits.npy", "f32", 5902),
    "qwen35moe": ("qwen35moe_tiny", "parity/qwen35moe_tiny/model.gguf", "parity/qwen35moe_tiny/logits.npy", "f32", 5903),
    "qwen3next": ("qwen3next_tiny", "parity/qwen3next_tiny/model.gguf", "parity/qwen3next_tiny/logits.npy", "f32", 5904),
}

CONVERT_SHIM = """
import sys
sys.path.insert(0, {llama!r})
import convert_hf_to_gguf as c
from conversion import base
# The cut vocabulary's pre-tokenizer hash is not in the converter's table.
base.TextModel.get_vocab_base_pre = lambda self, tokenizer: "olmo"
c.main()
"""


def convert(python: str, llama: Path, hf_dir: Path, out: Path, outtype: str, name: str | None, no_mtp: bool) -> None:
    cmd = [python, "-c", CONVERT_SHIM.format(llama=str(llama)), str(hf_dir), "--outtype", outtype, "--outfile", str(out)]
    if name is not None:
        cmd += ["--model-name", name]
    if no_mtp:
        cmd.append("--no-mtp")
    env = dict(os.environ)
    env["PYTHONPATH"] = f"{llama / 'gguf-py'}:{llama}"
    r = subprocess.run(cmd, env=env, capture_output=True, text=True)
    if r.returncode != 0:
        raise SystemExit(f"converter failed on {hf_dir}:\n{r.stderr[-4000:]}")


def mtp_tensors(trunk: dict, family: str, hidden: int, seed: int) -> dict:
    """The MTP block's tensors, shaped after the trunk's layers of the same kind."""
    import torch

    g = torch.Generator().manual_seed(seed)

    def like(t, kind: str):
        shape = tuple(t.shape)
        if kind == "norm":
            v = 1.0 + 0.1 * torch.randn(shape, generator=g)
        elif kind == "norm0":  # zero-centred (1 + w) norm
            v = 0.3 * torch.randn(shape, generator=g)
        elif kind == "bias":
            v = 0.1 * torch.randn(shape, generator=g)
        else:
            v = torch.randn(shape, generator=g) / math.sqrt(shape[-1])
        return v.half().to(t.dtype)

    def norm_kind(name: str) -> str:
        if "norm" not in name:
            return "bias" if len(trunk[name].shape) == 1 else "matrix"
        return "norm" if family == "nemotron" else "norm0"

    out = {}
    if family == "nemotron":
        attn = next(i for i in range(64) if f"backbone.layers.{i}.mixer.q_proj.weight" in trunk)
        moe = next(i for i in range(64) if f"backbone.layers.{i}.mixer.gate.weight" in trunk)
        ref = trunk["backbone.norm_f.weight"]
        out["mtp.layers.0.enorm.weight"] = like(ref, "norm")
        out["mtp.layers.0.hnorm.weight"] = like(ref, "norm")
        out["mtp.layers.0.eh_proj.weight"] = like(torch.empty(hidden, 2 * hidden, dtype=ref.dtype), "matrix")
        for sub, src in ((0, attn), (1, moe)):
            prefix = f"backbone.layers.{src}."
            for name in sorted(n for n in trunk if n.startswith(prefix)):
                out[f"mtp.layers.{sub}.{name[len(prefix):]}"] = like(trunk[name], norm_kind(name))
        out["mtp.layers.1.final_layernorm.weight"] = like(ref, "norm")
    else:
        attn = next(i for i in range(64) if f"model.layers.{i}.self_attn.q_proj.weight" in trunk)
        ref = trunk["model.norm.weight"]
        out["mtp.fc.weight"] = like(torch.empty(hidden, 2 * hidden, dtype=ref.dtype), "matrix")
        out["mtp.pre_fc_norm_embedding.weight"] = like(ref, "norm0")
        out["mtp.pre_fc_norm_hidden.weight"] = like(ref, "norm0")
        out["mtp.norm.weight"] = like(ref, "norm0")
        prefix = f"model.layers.{attn}."
        for name in sorted(n for n in trunk if n.startswith(prefix)):
            out[f"mtp.layers.0.{name[len(prefix):]}"] = like(trunk[name], norm_kind(name))
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--llama-cpp", type=Path, required=True, help="llama.cpp source tree")
    ap.add_argument("--converter-python", default=sys.executable, help="python that runs llama.cpp's converter")
    ap.add_argument("--out", type=Path, default=REPO / "tests/fixtures/nextn")
    ap.add_argument("--only", nargs="*", metavar="NAME")
    args = ap.parse_args()

    import torch
    import transformers
    from safetensors.torch import load_file, save_file

    torch.use_deterministic_algorithms(True)
    torch.set_num_threads(1)
    fixtures = REPO / "tests/fixtures"

    for name, (source, trunk_gguf, trunk_logits, outtype, seed) in FIXTURES.items():
        if args.only and name not in args.only:
            continue
        family = "nemotron" if name.startswith("nemotron") else "qwen"
        with tempfile.TemporaryDirectory() as tmp:
            hf = Path(tmp) / "hf"
            shutil.copytree(fixtures / "hf" / source, hf)
            cfg = json.loads((hf / "config.json").read_text())
            trunk = load_file(hf / "model.safetensors")
            extra = mtp_tensors(trunk, family, cfg["hidden_size"], seed)
            save_file({**trunk, **extra}, hf / "model.safetensors", metadata={"format": "pt"})
            if family == "nemotron":
                cfg["num_nextn_predict_layers"] = 1
            elif "qwen3_5" in cfg["model_type"]:
                cfg["mtp_num_hidden_layers"] = 1
            (hf / "config.json").write_text(json.dumps(cfg, indent=2))

            # transformers ignores the block: the trunk's logits are unchanged.
            model = transformers.AutoModelForCausalLM.from_pretrained(hf, dtype=torch.float32).eval()
            tokens = json.loads((fixtures / trunk_logits).with_name("tokens.json").read_text())
            with torch.no_grad():
                out = model(torch.tensor([tokens]), position_ids=torch.arange(len(tokens))[None], use_cache=False)
            logits = out.logits[0].float().numpy()
            want = np.load(fixtures / trunk_logits)
            diff = float(np.abs(logits - want).max())
            print(f"{name}: transformers {transformers.__version__} with the MTP block vs {trunk_logits}: max |diff| {diff:.3g}")
            assert diff <= 1e-4 * float(np.abs(want).max()), "transformers' trunk changed with the MTP block"

            # The GGUF name of the committed files: the converter's default
            # ("Hf", after the folder) or the fixture's name.
            model_name = None if family == "nemotron" else source
            dest = args.out / name
            dest.mkdir(parents=True, exist_ok=True)
            # The block's tensors alone: with the trunk's checkpoint
            # (tests/fixtures/hf/<source>) and the config key above, the
            # checkpoint converted here (coil convert's tests rebuild it).
            save_file(extra, dest / "mtp.safetensors", metadata={"format": "pt"})
            convert(args.converter_python, args.llama_cpp, hf, dest / "model.gguf", outtype, model_name, no_mtp=False)
            no_mtp = Path(tmp) / "no-mtp.gguf"
            convert(args.converter_python, args.llama_cpp, hf, no_mtp, outtype, model_name, no_mtp=True)
            same = no_mtp.read_bytes() == (fixtures / trunk_gguf).read_bytes()
            print(
                f"{name}: {len(extra)} MTP tensors, model.gguf {(dest / 'model.gguf').stat().st_size} bytes; "
                f"--no-mtp conversion {'is' if same else 'IS NOT'} byte for byte {trunk_gguf}"
            )
            if not same:
                raise SystemExit(f"{name}: the --no-mtp conversion differs from {trunk_gguf}")
    print(f"versions: torch {torch.__version__}, transformers {transformers.__version__} (reference)")


if __name__ == "__main__":
    main()
