#!/usr/bin/env python3
"""Build the LFM3 parity fixtures in tests/fixtures/parity/ (and their
Hugging Face checkpoints in tests/fixtures/hf/).

Run by hand (the outputs are committed), from the repository root:

    cargo build --release -p coil-cli
    python3 tools/make_fixtures_lfm3.py [--coil target/release/coil] [--only NAME...]

Needs torch, transformers (5.25: the first with Lfm3ForCausalLM),
safetensors, numpy, gguf. llama.cpp has no LFM3 converter, so `model.gguf`
is written by `coil convert --type f32` (coil's `lfm3` layout, see
docs/CONVERT.md; the gguf package must read it back, which this script
checks); what the fixture checks is coil's runtime against transformers.

For each model below this script

1. builds a tiny random-weight `Lfm3ForCausalLM` (fixed seed; every matrix
   N(0, 1/fan_in), the per-head attention gate `g_proj` too; tied
   embeddings N(0, (4/sqrt(hidden))^2) so that the logits have std ~4,
   untied embeddings N(0, 1) with lm_head N(0, 16/hidden); every norm weight
   1 + 0.3 N, the sandwich norms and q/k norms included; the short-conv
   kernel 0.7 N, far from an identity), every value rounded to an
   f16-representable one (kept in f32);
2. saves it with `save_pretrained` (float32) with the fixture vocabulary as
   `tests/fixtures/hf/<name>` (the 4096-token GPT-NeoX fixture tokenizer of
   tests/fixtures/hf/mamba cut to its first 1024 ids and the merges among
   them, as tools/make_fixtures_lfm2.py does), and checks that it loads
   back to the same logits;
3. converts it with `coil convert --type f32 --name <name>` to
   `tests/fixtures/parity/<name>/model.gguf`, and reads that back with the
   gguf package;
4. stores transformers' float32 logits for `tokens.json` (the 37 ids of the
   other parity fixtures) as `logits.npy` [37, 1024]: one forward from an
   empty cache, `use_cache=False`, explicit position_ids 0..36,
   deterministic algorithms, the eager attention path (the sliding window
   as a mask), transformers' pure-torch conv path (no causal_conv1d).

It also reports how far the logits move when each LFM3-specific piece is
left out (the sliding window, the attention gate, the sandwich norms, the
proportional RoPE's unrotated pairs), so that a runtime that ignores one of
them cannot pass.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import math
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parent.parent
N_VOCAB = 1024

MODELS = {
    # As the released model, small: every layer kind (conv at 0, 3, 5;
    # sliding-window attention at 1 and 4 with a window of 5 tokens, far
    # shorter than the 37-token prompt; full attention at 2), conv window 7,
    # sandwich norms, the attention gate, full layers with proportional RoPE
    # (θ 1e6, half of the head's pairs rotated), sliding layers with
    # default RoPE (θ 1e4), 4 heads and 2 KV heads of 16, tied embeddings;
    # widths of whole 32-blocks, so that `coil quantize` quantizes them.
    "lfm3_tiny": dict(
        seed=2603,
        config=dict(
            vocab_size=N_VOCAB,
            hidden_size=64,
            intermediate_size=96,
            num_hidden_layers=6,
            layer_types=[
                "conv",
                "sliding_attention",
                "full_attention",
                "conv",
                "sliding_attention",
                "conv",
            ],
            num_attention_heads=4,
            num_key_value_heads=2,
            head_dim=16,
            conv_L_cache=7,
            sliding_window=5,
            rope_parameters={
                "sliding_attention": {"rope_type": "default", "rope_theta": 10_000.0},
                "full_attention": {
                    "rope_type": "proportional",
                    "rope_theta": 1_000_000.0,
                    "partial_rotary_factor": 0.5,
                },
            },
            use_sandwich_norm=True,
            use_attention_gate=True,
            norm_eps=1e-5,
            max_position_embeddings=4096,
            tie_word_embeddings=True,
            bos_token_id=0,
            eos_token_id=0,
            pad_token_id=1,
        ),
    ),
    # The options off: no sandwich norms, no attention gate, untied
    # (`output.weight`), default RoPE on the full layers too (θ 5e5), a
    # window of 9, conv window 3, 3 heads and 1 KV head of 8, the sliding
    # layer first.
    "lfm3_plain": dict(
        seed=2604,
        config=dict(
            vocab_size=N_VOCAB,
            hidden_size=32,
            intermediate_size=64,
            num_hidden_layers=5,
            layer_types=["sliding_attention", "conv", "full_attention", "conv", "sliding_attention"],
            num_attention_heads=3,
            num_key_value_heads=1,
            head_dim=8,
            conv_L_cache=3,
            sliding_window=9,
            rope_parameters={
                "sliding_attention": {"rope_type": "default", "rope_theta": 10_000.0},
                "full_attention": {"rope_type": "default", "rope_theta": 500_000.0},
            },
            use_sandwich_norm=False,
            use_attention_gate=False,
            norm_eps=1e-5,
            max_position_embeddings=4096,
            tie_word_embeddings=False,
            bos_token_id=0,
            eos_token_id=0,
            pad_token_id=1,
        ),
    ),
}


def load_make_fixtures():
    spec = importlib.util.spec_from_file_location("make_fixtures", REPO / "tools/make_fixtures.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def build_model(spec: dict, **overrides):
    import torch
    import transformers

    cfg = dict(spec["config"], **overrides)
    config = transformers.Lfm3Config(**cfg)
    config.architectures = ["Lfm3ForCausalLM"]
    config._attn_implementation = "eager"
    torch.manual_seed(spec["seed"])
    model = transformers.Lfm3ForCausalLM(config).float().eval()
    tied = config.tie_word_embeddings
    hidden = config.hidden_size
    g = torch.Generator().manual_seed(spec["seed"])

    def randn(shape):
        return torch.randn(shape, generator=g, dtype=torch.float32)

    sigma = 4.0
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name == "model.embed_tokens.weight":
                p.copy_(randn(p.shape) * (sigma / math.sqrt(hidden) if tied else 1.0))
            elif name == "lm_head.weight":
                p.copy_(randn(p.shape) * (sigma / math.sqrt(hidden)))
            elif name.endswith("conv.conv.weight"):
                p.copy_(0.7 * randn(p.shape))
            elif name.endswith("norm.weight"):
                p.copy_(1.0 + 0.3 * randn(p.shape))
            elif p.dim() >= 2:
                p.copy_(randn(p.shape) / math.sqrt(p.shape[-1]))
            else:
                raise ValueError(f"no init rule for {name} {tuple(p.shape)}")
            p.copy_(p.half().float())
    return model


def reference_logits(model, ids: list[int]) -> np.ndarray:
    import torch

    with torch.no_grad():
        out = model(torch.tensor([ids]), position_ids=torch.arange(len(ids))[None], use_cache=False)
    logits = out.logits[0].float().numpy()
    assert logits.shape == (len(ids), N_VOCAB)
    return np.ascontiguousarray(logits, dtype="<f4")


def sensitivity(spec, model, ids, logits) -> str:
    """How far the logits move with each LFM3-specific piece left out."""
    import torch

    scale = np.abs(logits).max()
    notes = []

    def moved(m) -> float:
        return float(np.abs(reference_logits(m, ids) - logits).max() / scale)

    def variant(**over):
        m = build_model(spec, **over)
        m.load_state_dict(model.state_dict(), strict=False)
        return m

    notes.append(f"no sliding window: {moved(variant(sliding_window=4096)):.3f}")
    cfg = spec["config"]
    if cfg["use_attention_gate"]:
        m = variant()
        with torch.no_grad():
            for n, p in m.named_parameters():
                if n.endswith("g_proj.weight"):
                    p.fill_(1e4)  # sigmoid 1: no gate
        notes.append(f"no attention gate: {moved(m):.3f}")
    if cfg["use_sandwich_norm"]:
        notes.append(f"no sandwich norms: {moved(variant(use_sandwich_norm=False)):.3f}")
    full = cfg["rope_parameters"]["full_attention"]
    if full["rope_type"] == "proportional":
        rp = json.loads(json.dumps(cfg["rope_parameters"]))
        rp["full_attention"] = {"rope_type": "default", "rope_theta": full["rope_theta"]}
        notes.append(f"full RoPE on every pair: {moved(variant(rope_parameters=rp)):.3f}")
    assert np.array_equal(reference_logits(model, ids), logits)
    return "; ".join(notes)


def save_hf(model, out: Path, tokenizer) -> None:
    if out.exists():
        shutil.rmtree(out)
    model.save_pretrained(out)
    tokenizer.save(str(out / "tokenizer.json"))
    shutil.copy(REPO / "tests/fixtures/hf/mamba/tokenizer_config.json", out / "tokenizer_config.json")


def convert(coil: Path, hf: Path, name: str, gguf_out: Path) -> None:
    cmd = [str(coil), "convert", str(hf), "-o", str(gguf_out), "--type", "f32", "--name", name, "--quiet"]
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        raise SystemExit(f"coil convert failed:\n{r.stderr[-3000:]}")


def check_gguf(path: Path) -> None:
    """The gguf package reads the file: arch, per-layer keys, every tensor."""
    from gguf import GGUFReader

    r = GGUFReader(str(path))
    arch = bytes(r.fields["general.architecture"].parts[-1]).decode()
    assert arch == "lfm3", arch
    for t in r.tensors:
        assert t.data.size == int(np.prod(t.shape)), t.name


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--coil", type=Path, default=REPO / "target/release/coil", help="the coil binary")
    ap.add_argument("--out", type=Path, default=REPO / "tests/fixtures/parity", help="output folder")
    ap.add_argument("--hf-out", type=Path, default=REPO / "tests/fixtures/hf", help="checkpoint folder")
    ap.add_argument("--only", nargs="*", metavar="NAME", help="make only these fixtures")
    args = ap.parse_args()

    mf = load_make_fixtures()
    for pkg in ("causal_conv1d", "mamba_ssm"):
        if importlib.util.find_spec(pkg) is not None:
            raise SystemExit(f"{pkg} is installed: uninstall it so transformers uses its torch path")
    # The hub-kernel package is hidden from transformers (its kernels would
    # replace layers' forwards), as tools/make_fixtures_kimi.py does.
    assert "transformers" not in sys.modules
    sys.modules["kernels"] = None  # import kernels -> ImportError
    import torch
    import transformers

    torch.use_deterministic_algorithms(True)
    torch.set_num_threads(1)

    vocab = mf.read_vocab(REPO / "tests/fixtures/models/mamba2/model.f16.gguf")
    tokenizer = mf.cut_hf_tokenizer(REPO / "tests/fixtures/hf/mamba/tokenizer.json", vocab)
    ids = json.loads((REPO / "tests/fixtures/parity/mamba2_g1_hd16/tokens.json").read_text())
    assert len(ids) == 37 and max(ids) < N_VOCAB

    for name, spec in MODELS.items():
        if args.only and name not in args.only:
            continue
        out = args.out / name
        out.mkdir(parents=True, exist_ok=True)
        model = build_model(spec)
        logits = reference_logits(model, ids)
        assert np.array_equal(logits, reference_logits(model, ids))
        notes = sensitivity(spec, model, ids, logits)
        hf = args.hf_out / name
        save_hf(model, hf, tokenizer)
        back = transformers.Lfm3ForCausalLM.from_pretrained(
            hf, dtype=torch.float32, attn_implementation="eager", use_kernels=False
        )
        assert np.array_equal(reference_logits(back.eval(), ids), logits), "the checkpoint loads back differently"
        np.save(out / "logits.npy", logits)
        (out / "tokens.json").write_text(json.dumps(ids) + "\n")
        convert(args.coil, hf, name, out / "model.gguf")
        check_gguf(out / "model.gguf")
        top2 = np.sort(logits, axis=1)[:, -2:]
        print(
            f"{name}: {sum(p.numel() for p in model.parameters())} params, "
            f"logits std {logits.std():.2f}, max|logit| {np.abs(logits).max():.2f}, "
            f"{len(set(logits.argmax(1).tolist()))} distinct argmax, "
            f"min top-2 gap {(top2[:, 1] - top2[:, 0]).min():.4f}, "
            f"gguf {(out / 'model.gguf').stat().st_size} bytes; max rel change with {notes}"
        )
    print(
        f"versions: torch {torch.__version__}, transformers {transformers.__version__}, "
        f"numpy {np.__version__}"
    )


if __name__ == "__main__":
    main()
