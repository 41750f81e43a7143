#!/usr/bin/env python3
"""Build the Gated DeltaNet parity fixtures in tests/fixtures/parity/:
`qwen35_tiny` (Qwen3_5ForCausalLM -> `qwen35`), `qwen35moe_tiny`
(Qwen3_5MoeForCausalLM -> `qwen35moe`) and `qwen3next_tiny`
(Qwen3NextForCausalLM -> `qwen3next`).

Run by hand (the outputs are committed):

    PYTHONPATH=<llama.cpp>/gguf-py python3 tools/make_fixtures_qwen35.py \
        --llama-cpp <llama.cpp source tree> [--shared PATH] [--only NAME...]

`--shared` is the project's shared data folder (Tiny Shakespeare and the
4096-token fixture tokenizer, as for tools/make_fixtures.py, whose
vocabulary and token helpers this script reuses: the same 1024-token cut and
the same 37 tokens).

For each model this script

1. builds a tiny random-weight transformers model (fixed seed) whose
   Gated DeltaNet layers carry state for real: A drawn so that heads
   remember ~2-100 tokens, dt_bias with spread (a constant would hide a
   value-head ordering error), conv kernels far from identity, the
   zero-centred RMSNorm weights ((1 + w) x) around 0 with spread, the gated
   norm's plain weight around 1, every matrix N(0, 1/fan_in); every
   parameter rounded to an f16-representable value (kept in f32);
2. saves it with the cut tokenizer and converts it with llama.cpp's own
   convert_hf_to_gguf.py (`--outtype f32 --no-mtp`; the cut vocabulary's
   pre-tokenizer hash is unknown to the converter, so the converter runs
   with its pre-tokenizer name fixed to "olmo", the name it gives the full
   NeoX tokenizer, as for the shared fixtures);
3. stores transformers' float32 logits for tokens.json (one forward from an
   empty state, explicit position_ids, use_cache=False, deterministic
   algorithms; transformers' pure-torch gated-delta and conv paths: fla and
   causal_conv1d must not be importable) as logits.npy [37, 1024] and the
   config as config.json.

Every layer stack has 4 layers, 3 Gated DeltaNet : 1 attention (attention
at layer 1, so the per-layer recurrent map is exercised, not only the
"every 4th" default), Hk = 2 key heads and Hv = 4 value heads (so the value
head order matters: llama.cpp's converter re-orders Qwen3.5's to tiled, and
keeps Qwen3-Next's grouped).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import math
import subprocess
import sys
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tools"))
import make_fixtures as mf  # noqa: E402  (vocabulary and tokens)

N_VOCAB = mf.N_VOCAB

COMMON = dict(
    vocab_size=N_VOCAB,
    hidden_size=64,
    num_hidden_layers=4,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=32,
    rms_norm_eps=1e-6,
    max_position_embeddings=4096,
    linear_conv_kernel_dim=4,
    linear_key_head_dim=16,
    linear_value_head_dim=16,
    linear_num_key_heads=2,
    linear_num_value_heads=4,
    layer_types=["linear_attention", "full_attention", "linear_attention", "linear_attention"],
    bos_token_id=0,
    eos_token_id=0,
    pad_token_id=1,
)
MOE = dict(
    num_experts=4,
    num_experts_per_tok=2,
    moe_intermediate_size=32,
    shared_expert_intermediate_size=48,
)

MODELS = {
    "qwen35_tiny": dict(
        cls="Qwen3_5ForCausalLM",
        config_cls="Qwen3_5TextConfig",
        seed=3501,
        config=dict(
            COMMON,
            intermediate_size=96,
            tie_word_embeddings=True,
            rope_parameters=dict(
                rope_type="default",
                rope_theta=10000.0,
                partial_rotary_factor=0.25,
                mrope_section=[2, 1, 1],
                mrope_interleaved=True,
            ),
        ),
    ),
    "qwen35moe_tiny": dict(
        cls="Qwen3_5MoeForCausalLM",
        config_cls="Qwen3_5MoeTextConfig",
        seed=3502,
        config=dict(
            COMMON,
            **MOE,
            tie_word_embeddings=False,
            rope_parameters=dict(
                rope_type="default",
                rope_theta=10000.0,
                partial_rotary_factor=0.25,
                mrope_section=[2, 1, 1],
                mrope_interleaved=True,
            ),
        ),
    ),
    "qwen3next_tiny": dict(
        cls="Qwen3NextForCausalLM",
        config_cls="Qwen3NextConfig",
        seed=3503,
        config=dict(
            COMMON,
            **MOE,
            intermediate_size=96,
            decoder_sparse_step=1,
            mlp_only_layers=[],
            norm_topk_prob=True,
            tie_word_embeddings=False,
            rope_parameters=dict(rope_type="default", rope_theta=10000.0, partial_rotary_factor=0.25),
        ),
    ),
}


def check_torch_path() -> None:
    for pkg in ("fla", "causal_conv1d", "kernels"):
        if importlib.util.find_spec(pkg) is not None:
            raise SystemExit(f"{pkg} is installed: uninstall it so transformers uses its torch path")


def build_model(spec: dict):
    import torch
    import transformers

    config = getattr(transformers, spec["config_cls"])(**spec["config"])
    config.architectures = [spec["cls"]]
    torch.manual_seed(spec["seed"])
    model = getattr(transformers, spec["cls"])(config).float().eval()
    tied = config.tie_word_embeddings
    hidden = config.hidden_size
    g = torch.Generator().manual_seed(spec["seed"])

    def randn(shape):
        return torch.randn(shape, generator=g, dtype=torch.float32)

    def uniform(shape, lo, hi):
        return lo + (hi - lo) * torch.rand(shape, generator=g, dtype=torch.float32)

    sigma = 4.0  # logits std ~ sigma
    with torch.no_grad():
        for name, p in model.named_parameters():  # tied weights appear once
            short = name.rsplit(".", 1)[-1]
            if name == "model.embed_tokens.weight":
                p.copy_(randn(p.shape) * (sigma / math.sqrt(hidden) if tied else 1.0))
            elif name == "lm_head.weight":
                p.copy_(randn(p.shape) * (sigma / math.sqrt(hidden)))
            elif short == "A_log":
                # A = exp(A_log) in [0.02, 0.6]: with softplus(a + dt_bias)
                # around 0.3-2 a head remembers ~1-100 tokens.
                p.copy_(torch.log(uniform(p.shape, 0.02, 0.6)))
            elif short == "dt_bias":
                p.copy_(randn(p.shape) - 1.0)
            elif name.endswith("conv1d.weight"):
                p.copy_(0.6 * randn(p.shape))
            elif name.endswith("linear_attn.norm.weight"):
                p.copy_(1.0 + 0.3 * randn(p.shape))  # plain weight
            elif name.endswith("norm.weight"):
                p.copy_(0.3 * randn(p.shape))  # zero-centred: (1 + w) x
            elif p.dim() >= 2:  # (out, in) or fused experts (n_expert, out, in)
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


CONVERT_SHIM = """
import sys
sys.argv = [sys.argv[0]] + sys.argv[1:]
sys.path.insert(0, {llama!r})
import convert_hf_to_gguf as c
from conversion import base
# The cut vocabulary's pre-tokenizer hash is not in the converter's table.
base.TextModel.get_vocab_base_pre = lambda self, tokenizer: "olmo"
c.main()
"""


def convert(llama: Path, hf_dir: Path, out: Path, name: str) -> None:
    shim = CONVERT_SHIM.format(llama=str(llama))
    cmd = [sys.executable, "-c", shim, str(hf_dir), "--outtype", "f32", "--no-mtp", "--model-name", name, "--outfile", str(out)]
    env = dict(**__import__("os").environ)
    env["PYTHONPATH"] = f"{llama / 'gguf-py'}:{llama}"
    subprocess.run(cmd, check=True, env=env, capture_output=True)


def save_tokenizer(tok, d: Path) -> None:
    from transformers import PreTrainedTokenizerFast

    t = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<|endoftext|>", eos_token="<|endoftext|>")
    t.save_pretrained(d)
    # transformers 5 writes its own class name for Qwen models: keep the generic one.
    cfg = json.loads((d / "tokenizer_config.json").read_text())
    cfg["tokenizer_class"] = "PreTrainedTokenizerFast"
    (d / "tokenizer_config.json").write_text(json.dumps(cfg, indent=2))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--shared", type=Path, default=REPO.parent / "shared", help="shared data folder")
    ap.add_argument("--llama-cpp", type=Path, required=True, help="llama.cpp source tree")
    ap.add_argument("--out", type=Path, default=REPO / "tests/fixtures/parity", help="output folder")
    ap.add_argument("--only", nargs="*", metavar="NAME", help="make only these fixtures")
    ap.add_argument(
        "--hf-out",
        type=Path,
        default=REPO / "tests/fixtures/hf",
        help="where each model's Hugging Face checkpoint is kept (<dir>/<name>/): "
        "the converter tests convert it and compare with model.gguf",
    )
    args = ap.parse_args()

    check_torch_path()
    import torch
    import transformers

    torch.use_deterministic_algorithms(True)
    torch.set_num_threads(1)

    vocab = mf.read_vocab(REPO / "tests/fixtures/models/mamba2/model.f16.gguf")
    ids, text = mf.make_tokens(args.shared, vocab)
    tok = mf.cut_hf_tokenizer(args.shared / "data/fixtures/mamba2/hf/tokenizer.json", vocab)
    print(f"{len(ids)} tokens: {text!r}")

    for name, spec in MODELS.items():
        if args.only and name not in args.only:
            continue
        out = args.out / name
        out.mkdir(parents=True, exist_ok=True)
        model = build_model(spec)
        logits = reference_logits(model, ids)
        assert np.array_equal(logits, reference_logits(model, ids))
        with torch.no_grad():
            m64 = build_model(spec).double()
            if m64._can_set_experts_implementation():
                m64.set_experts_implementation("eager")  # grouped_mm has no f64
            out64 = m64(torch.tensor([ids]), position_ids=torch.arange(len(ids))[None], use_cache=False)
            l64 = out64.logits[0].numpy()
        rel64 = np.abs(l64 - logits).max() / np.abs(l64).max()
        np.save(out / "logits.npy", logits)
        (out / "tokens.json").write_text(json.dumps(ids) + "\n")
        model.config.to_json_file(out / "config.json", use_diff=False)
        d = args.hf_out / name
        d.mkdir(parents=True, exist_ok=True)
        model.save_pretrained(d, safe_serialization=True)
        save_tokenizer(tok, d)
        convert(args.llama_cpp, d, out / "model.gguf", name)
        top2 = np.sort(logits, axis=1)[:, -2:]
        print(
            f"{name}: {sum(p.numel() for p in model.parameters())} params, "
            f"logits std {logits.std():.2f}, max|logit| {np.abs(logits).max():.2f}, "
            f"{len(set(logits.argmax(1).tolist()))} distinct argmax, "
            f"min top-2 gap {(top2[:, 1] - top2[:, 0]).min():.4f}, f32 vs f64 {rel64:.2e}, "
            f"gguf {(out / 'model.gguf').stat().st_size} bytes"
        )
    print(f"versions: torch {torch.__version__}, transformers {transformers.__version__}")


if __name__ == "__main__":
    main()
