#!/usr/bin/env python3
"""Build the Zamba2 parity fixtures in tests/fixtures/parity/ (and their
Hugging Face checkpoints in tests/fixtures/hf/).

Run by hand (the outputs are committed), from the repository root:

    cargo build --release -p coil-cli
    python3 tools/make_fixtures_zamba2.py [--coil target/release/coil] [--only NAME...]

Needs torch, transformers (5.25), safetensors, numpy, gguf. llama.cpp has no
Zamba2 converter, so `model.gguf` is written by `coil convert --type f32`
(coil's `zamba2` layout, see docs/CONVERT.md; the gguf package must read it
back, which this script checks); what the fixture checks is coil's runtime
against transformers.

For each model below this script

1. builds a tiny random-weight `Zamba2ForCausalLM` (fixed seed; every
   matrix N(0, 1/fan_in), the LoRA adapters' too (so that each use of a
   shared block differs from the others); tied embeddings N(0,
   (4/sqrt(hidden))^2) so that the logits have std ~4, untied embeddings
   N(0, 1) with lm_head N(0, 16/hidden); every norm weight 1 + 0.3 N; the
   Mamba-2 decays drawn so that the state carries information over 1 to
   100 tokens: per head dt ≈ softplus(dt_bias) log-uniform in [0.02, 0.2]
   (the in_proj rows that add to dt scaled by 0.3) and −A = exp(A_log)
   log-uniform in [0.3, 3], so exp(dt·A) lies between 0.55 and 0.994; the
   conv kernel 0.5 N, D 1 + 0.3 N), every value rounded to an
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
   deterministic algorithms, the eager attention path, transformers'
   pure-torch conv and scan paths (no causal_conv1d, no mamba_ssm).

softplus(dt) stays far above `time_step_min` (0.001), which transformers
applies in its chunked scan but not in its one-token step: both agree.

It also reports how far the logits move when each Zamba2-specific piece is
left out (the per-use LoRA adapters, the token embedding concatenated into
the shared block's input, the shared blocks altogether, RoPE), so that a
runtime that ignores one of them cannot pass.
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

COMMON = dict(
    vocab_size=N_VOCAB,
    mamba_d_conv=4,
    mamba_expand=2,
    time_step_min=0.001,
    time_step_max=0.1,
    chunk_size=256,
    add_bias_linear=False,
    use_conv_bias=True,
    hidden_act="gelu",
    rms_norm_eps=1e-5,
    max_position_embeddings=4096,
    bos_token_id=0,
    eos_token_id=0,
    pad_token_id=1,
)

MODELS = {
    # As the released 2.7B model, small: two shared blocks used in turn at
    # layers 1, 3 and 5 (block 0 twice), LoRA adapters on q, k, v and on the
    # MLP's gate/up projection (rank 8), RoPE over the whole head, 4 heads
    # of 16 on the 64-wide concatenation [x, embedding], Mamba-2 with 4
    # heads of 16, 2 groups, state 16, tied embeddings; widths of whole
    # 32-blocks, so that `coil quantize` quantizes them.
    "zamba2_tiny": dict(
        seed=2701,
        config=dict(
            COMMON,
            hidden_size=32,
            intermediate_size=64,
            num_hidden_layers=7,
            layers_block_type=["mamba", "hybrid", "mamba", "hybrid", "mamba", "hybrid", "mamba"],
            num_attention_heads=4,
            num_key_value_heads=4,
            n_mamba_heads=4,
            mamba_ngroups=2,
            mamba_d_state=16,
            num_mem_blocks=2,
            use_shared_attention_adapter=True,
            adapter_rank=8,
            use_mem_rope=True,
            rope_parameters={"rope_type": "default", "rope_theta": 10_000.0},
            tie_word_embeddings=True,
        ),
    ),
    # The options off: one shared block used at layers 0 and 3 (a hybrid
    # layer first), adapters on the MLP only (transformers always has
    # those), no RoPE, 4 heads and 2 KV heads, one Mamba-2 group, state 8.
    # Tied embeddings too: transformers 5.25 ties the shared blocks' uses
    # only when it ties the embeddings (untied, each hybrid layer gets a
    # block of its own, which is not Zamba2); the released models tie.
    "zamba2_plain": dict(
        seed=2702,
        config=dict(
            COMMON,
            hidden_size=32,
            intermediate_size=48,
            num_hidden_layers=5,
            layers_block_type=["hybrid", "mamba", "mamba", "hybrid", "mamba"],
            num_attention_heads=4,
            num_key_value_heads=2,
            n_mamba_heads=4,
            mamba_ngroups=1,
            mamba_d_state=8,
            num_mem_blocks=1,
            use_shared_attention_adapter=False,
            adapter_rank=4,
            use_mem_rope=False,
            tie_word_embeddings=True,
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
    config = transformers.Zamba2Config(**cfg)
    config.architectures = ["Zamba2ForCausalLM"]
    config._attn_implementation = "eager"
    torch.manual_seed(spec["seed"])
    model = transformers.Zamba2ForCausalLM(config).float().eval()
    tied = config.tie_word_embeddings
    hidden = config.hidden_size
    g = torch.Generator().manual_seed(spec["seed"])
    d_in = config.mamba_expand * hidden
    conv_dim = d_in + 2 * config.mamba_ngroups * config.mamba_d_state

    def randn(shape):
        return torch.randn(shape, generator=g, dtype=torch.float32)

    def log_uniform(n, lo, hi):
        u = torch.rand(n, generator=g, dtype=torch.float32)
        return torch.exp(math.log(lo) + u * (math.log(hi) - math.log(lo)))

    sigma = 4.0
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name == "model.embed_tokens.weight":
                p.copy_(randn(p.shape) * (sigma / math.sqrt(hidden) if tied else 1.0))
            elif name == "lm_head.weight":
                p.copy_(randn(p.shape) * (sigma / math.sqrt(hidden)))
            elif name.endswith("mamba.dt_bias"):
                dt = log_uniform(p.shape[0], 0.02, 0.2)
                p.copy_(dt + torch.log(-torch.expm1(-dt)))  # softplus⁻¹
            elif name.endswith("mamba.A_log"):
                p.copy_(torch.log(log_uniform(p.shape[0], 0.3, 3.0)))
            elif name.endswith("mamba.D"):
                p.copy_(1.0 + 0.3 * randn(p.shape))
            elif name.endswith("mamba.conv1d.weight"):
                p.copy_(0.5 * randn(p.shape))
            elif name.endswith("mamba.conv1d.bias"):
                p.copy_(0.1 * randn(p.shape))
            elif name.endswith("mamba.in_proj.weight"):
                w = randn(p.shape) / math.sqrt(p.shape[-1])
                w[d_in + conv_dim :] *= 0.3  # the dt rows
                p.copy_(w)
            elif name.endswith("norm.weight") or name.endswith("layernorm.weight"):
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
    """How far the logits move with each Zamba2-specific piece left out."""
    import torch

    scale = np.abs(logits).max()
    notes = []

    def moved(m) -> float:
        return float(np.abs(reference_logits(m, ids) - logits).max() / scale)

    def variant(**over):
        m = build_model(spec, **over)
        m.load_state_dict(model.state_dict(), strict=False)
        return m

    def zeroed(pred):
        m = variant()
        with torch.no_grad():
            for n, p in m.named_parameters():
                if pred(n):
                    p.zero_()
        return m

    notes.append(f"no LoRA adapters: {moved(zeroed(lambda n: '_adapter_list.' in n)):.3f}")
    notes.append(f"no shared blocks: {moved(zeroed(lambda n: n.endswith('.linear.weight'))):.3f}")
    # The embedding half of the shared block's input replaced by zeros.
    from transformers.models.zamba2 import modeling_zamba2 as mz

    forward = mz.Zamba2AttentionDecoderLayer.forward

    def without_embedding(self, hidden_states, original_hidden_states, *a, **k):
        return forward(self, hidden_states, torch.zeros_like(original_hidden_states), *a, **k)

    mz.Zamba2AttentionDecoderLayer.forward = without_embedding
    try:
        notes.append(f"no embedding in the shared input: {moved(model):.3f}")
    finally:
        mz.Zamba2AttentionDecoderLayer.forward = forward
    if spec["config"]["use_mem_rope"]:
        notes.append(f"no RoPE: {moved(variant(use_mem_rope=False)):.3f}")
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
    """The gguf package reads the file: arch, the schedule, every tensor."""
    from gguf import GGUFReader

    r = GGUFReader(str(path))
    arch = bytes(r.fields["general.architecture"].parts[-1]).decode()
    assert arch == "zamba2", arch
    f = r.fields["zamba2.shared_block_schedule"]
    schedule = [int(f.parts[i][0]) for i in f.data]
    assert schedule, "empty shared-block schedule"
    for t in r.tensors:
        assert t.data.size == int(np.prod(t.shape)), t.name


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--coil", type=Path, default=REPO / "target/release/coil", help="the coil binary")
    ap.add_argument("--out", type=Path, default=REPO / "tests/fixtures/parity", help="output folder")
    ap.add_argument("--hf-out", type=Path, default=REPO / "tests/fixtures/hf", help="checkpoint folder")
    ap.add_argument("--only", nargs="*", metavar="NAME", help="make only these fixtures")
    ap.add_argument("--no-convert", action="store_true", help="leave out steps 3 (the GGUF)")
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
        layers = model.model.layers
        hybrid = [i for i, t in enumerate(model.config.layers_block_type) if t == "hybrid"]
        for u, l in enumerate(hybrid):
            first = hybrid[u % model.config.num_mem_blocks]
            a, b = layers[l].shared_transformer, layers[first].shared_transformer
            assert a.self_attn.q_proj.weight is b.self_attn.q_proj.weight, "blocks not shared"
        logits = reference_logits(model, ids)
        assert np.array_equal(logits, reference_logits(model, ids))
        notes = sensitivity(spec, model, ids, logits)
        hf = args.hf_out / name
        save_hf(model, hf, tokenizer)
        back = transformers.Zamba2ForCausalLM.from_pretrained(
            hf, dtype=torch.float32, attn_implementation="eager", use_kernels=False
        )
        assert np.array_equal(reference_logits(back.eval(), ids), logits), "the checkpoint loads back differently"
        np.save(out / "logits.npy", logits)
        (out / "tokens.json").write_text(json.dumps(ids) + "\n")
        if not args.no_convert:
            convert(args.coil, hf, name, out / "model.gguf")
            check_gguf(out / "model.gguf")
        top2 = np.sort(logits, axis=1)[:, -2:]
        size = (out / "model.gguf").stat().st_size if (out / "model.gguf").exists() else 0
        print(
            f"{name}: {sum(p.numel() for p in model.parameters())} params, "
            f"logits std {logits.std():.2f}, max|logit| {np.abs(logits).max():.2f}, "
            f"{len(set(logits.argmax(1).tolist()))} distinct argmax, "
            f"min top-2 gap {(top2[:, 1] - top2[:, 0]).min():.4f}, "
            f"gguf {size} bytes; max rel change with {notes}"
        )
    print(
        f"versions: torch {torch.__version__}, transformers {transformers.__version__}, "
        f"numpy {np.__version__}"
    )


if __name__ == "__main__":
    main()
