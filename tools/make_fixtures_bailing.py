#!/usr/bin/env python3
"""Build the Bailing-Hybrid (Ling 3.0) parity fixtures in
tests/fixtures/parity/: `bailing_hybrid_tiny` (plain query projection) and
`bailing_hybrid_qlora` (a query LoRA), both `BailingHybridForCausalLM`
(transformers 5.25) -> GGUF arch `bailingmoe3`, the layout llama.cpp's
converter writes for the released class name `BailingMoeV3ForCausalLM`.

Run by hand (the outputs are committed):

    PYTHONPATH=<llama.cpp>/gguf-py python3 tools/make_fixtures_bailing.py \
        --llama-cpp <llama.cpp source tree> [--shared PATH] [--only NAME...]

`--shared` is the project's shared data folder (as for
tools/make_fixtures_kimi.py: the same 1024-token vocabulary cut and the same
37 tokens).

For each model this script

1. builds a tiny random-weight transformers model (fixed seed) whose KDA
   layers carry state for real: the bounded ("safe") forget gate
   g = lower_bound·sigmoid(exp(A_log)·(f_proj(x) + dt_bias)) with exp(A_log)
   drawn in [0.5, 1.5] and dt_bias around -3.5 with spread per channel, so
   that each key channel remembers ~1-100 tokens; conv kernels far from
   identity; every RMSNorm weight (plain `w x`) around 1 with spread; the
   router's score-correction bias with spread; SwiGLU clipping limits
   (`expert_swiglu_limit_list`, `share_expert_swiglu_limit_list`) low
   enough to clip on some layers and off (0) on others; group-limited
   routing (4 groups of 2 experts, 2 groups used); every matrix
   N(0, 1/fan_in); every parameter rounded to an f16-representable value
   (kept in f32);
2. saves it as transformers' save_pretrained writes it (the released
   checkpoint's names: `model.word_embeddings`, `attention.*`, the separate
   `q_conv1d` / `k_conv1d` / `v_conv1d`, per-expert `mlp.experts.N.*`,
   `mlp.gate.expert_bias`), with the config keys the released config has
   and llama.cpp's converter reads (`no_kda_lora`,
   `gated_attention_proj_granularity_type`, `score_function`, `n_group`,
   `moe_shared_expert_intermediate_size`) and `head_dim` the KDA head width
   (transformers' own save writes qk_rope_head_dim there, which it reads
   back wrongly); checks that transformers loads that back to the same
   logits, and converts it with llama.cpp's own convert_hf_to_gguf.py
   (`--outtype f32`, `BailingHybridForCausalLM` registered as its
   `BailingMoeV3ForCausalLM` converter, config.json read as written — what
   the converter does under the transformers 4.57 it pins, which does not
   know `bailing_hybrid` — and pre-tokenizer "olmo" as for the other
   fixtures);
3. stores transformers' float32 logits for tokens.json (one forward from an
   empty state, use_cache=False, deterministic algorithms, transformers'
   pure-torch KDA and conv paths) as logits.npy [37, 1024] and the config
   as config.json.

Every stack has both layer kinds and both feed-forward kinds: KDA layers
(4 heads of 16) and MLA layers (4 heads, kv_lora_rank 24, no-RoPE / RoPE
head split 16 + 8 with DeepSeek's interleaved rotation, v_head_dim 12, a
per-head sigmoid output gate), a dense SwiGLU first layer, then
DeepSeek-V3-style MoE layers (8 experts in 4 groups, top-2 by sigmoid score
plus correction bias within the 2 best groups, renormalised, times the
routed scaling factor, plus a shared expert).
"""

from __future__ import annotations

import argparse
import json
import math
import subprocess
import sys
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tools"))
import make_fixtures as mf  # noqa: E402  (vocabulary and tokens)
import make_fixtures_kimi as mk  # noqa: E402  (torch path, tokenizer)

N_VOCAB = mf.N_VOCAB

COMMON = dict(
    vocab_size=N_VOCAB,
    hidden_size=48,
    intermediate_size=64,
    moe_intermediate_size=24,
    num_attention_heads=4,
    num_key_value_heads=4,
    kv_lora_rank=24,
    qk_rope_head_dim=8,
    qk_nope_head_dim=16,
    v_head_dim=12,
    head_dim=16,
    num_local_experts=8,
    num_experts_per_tok=2,
    n_shared_experts=1,
    routed_scaling_factor=1.7,
    n_group=4,
    topk_group=2,
    first_k_dense_replace=1,
    rms_norm_eps=1e-6,
    rope_theta=10000.0,
    model_max_length=4096,
    tie_word_embeddings=False,
    num_mtp_layers=0,
    bos_token_id=0,
    eos_token_id=0,
    pad_token_id=1,
)

MODELS = {
    "bailing_hybrid_tiny": dict(
        seed=6311,
        config=dict(
            COMMON,
            num_hidden_layers=6,
            layer_group_size=3,
            q_lora_rank=None,
            short_conv_kernel_size=4,
            kda_lower_bound=-5.0,
            expert_swiglu_limit_list=[0, 0.9, 0, 1.2, 0.9, 0],
            share_expert_swiglu_limit_list=[0, 0, 0.8, 0, 1.1, 0.9],
        ),
    ),
    "bailing_hybrid_qlora": dict(
        seed=6312,
        config=dict(
            COMMON,
            num_hidden_layers=4,
            layer_group_size=2,
            q_lora_rank=20,
            short_conv_kernel_size=3,
            kda_lower_bound=-4.0,
            expert_swiglu_limit_list=[0, 0.9, 0, 1.0],
            share_expert_swiglu_limit_list=[0, 0.8, 0.9, 0],
        ),
    ),
}


def build_model(spec: dict):
    import torch
    from transformers import BailingHybridConfig, BailingHybridForCausalLM

    config = BailingHybridConfig(**spec["config"])
    config.architectures = ["BailingHybridForCausalLM"]
    torch.manual_seed(spec["seed"])
    model = BailingHybridForCausalLM(config).float().eval()
    hidden = config.hidden_size
    g = torch.Generator().manual_seed(spec["seed"])

    def randn(shape):
        return torch.randn(shape, generator=g, dtype=torch.float32)

    def uniform(shape, lo, hi):
        return lo + (hi - lo) * torch.rand(shape, generator=g, dtype=torch.float32)

    sigma = 4.0  # logits std ~ sigma
    with torch.no_grad():
        for name, p in model.named_parameters():
            short = name.rsplit(".", 1)[-1]
            if name == "model.embed_tokens.weight":
                p.copy_(randn(p.shape))
            elif name == "lm_head.weight":
                p.copy_(randn(p.shape) * (sigma / math.sqrt(hidden)))
            elif short == "A_log":
                p.copy_(torch.log(uniform(p.shape, 0.5, 1.5)))
            elif short == "dt_bias":
                p.copy_(randn(p.shape) - 3.5)
            elif name.endswith("conv1d.weight"):
                p.copy_(0.6 * randn(p.shape))
            elif name.endswith("norm.weight") or name.endswith("layernorm.weight"):
                p.copy_(1.0 + 0.3 * randn(p.shape))
            elif p.dim() >= 2:  # (out, in) or fused experts (n_expert, out, in)
                p.copy_(randn(p.shape) / math.sqrt(p.shape[-1]))
            else:
                raise ValueError(f"no init rule for {name} {tuple(p.shape)}")
            p.copy_(p.half().float())
        for name, b in model.named_buffers():
            if name.endswith("e_score_correction_bias"):
                b.copy_((0.1 * randn(b.shape)).half().float())
    return model


def released_extra(config) -> dict:
    """The released config's keys llama.cpp's converter reads, and the KDA
    head width under `head_dim` (as the released config has it)."""
    return dict(
        head_dim=config.linear_head_dim,
        no_kda_lora=True,
        gated_attention_proj_granularity_type="head_wise",
        score_function="sigmoid",
        n_group=config.n_group,
        topk_group=config.topk_group,
        num_experts_per_tok=config.num_experts_per_tok,
        norm_topk_prob=config.norm_topk_prob,
        moe_shared_expert_intermediate_size=config.moe_intermediate_size * config.n_shared_experts,
    )


def save_released_layout(model, d: Path) -> None:
    from safetensors.torch import load_file, save_file

    model.save_pretrained(d, safe_serialization=True)
    path = d / "model.safetensors"
    tensors = load_file(path)
    save_file({k: tensors[k].contiguous() for k in sorted(tensors)}, path, metadata={"format": "pt"})
    cfg = json.loads((d / "config.json").read_text())
    for k in ("linear_head_dim", "linear_num_heads", "linear_conv_kernel_dim", "qk_head_dim"):
        cfg.pop(k, None)
    cfg.update(released_extra(model.config))
    (d / "config.json").write_text(json.dumps(cfg, indent=2, sort_keys=True) + "\n")


CONVERT_SHIM = """
import sys
sys.argv = [sys.argv[0]] + sys.argv[1:]
sys.path.insert(0, {llama!r})
import convert_hf_to_gguf as c
import conversion
from conversion import base
# The cut vocabulary's pre-tokenizer hash is not in the converter's table.
base.TextModel.get_vocab_base_pre = lambda self, tokenizer: "olmo"
# config.json as written (the converter's pinned transformers 4.57 does not
# know bailing_hybrid and falls back to it; 5.x would rewrite head_dim).
import json
base.ModelBase.load_hparams = staticmethod(lambda d, mistral: json.loads((d / "config.json").read_text()))
# transformers' class name for the released BailingMoeV3ForCausalLM.
cls = conversion.get_model_class("BailingMoeV3ForCausalLM")
conversion.TEXT_MODEL_MAP["BailingHybridForCausalLM"] = conversion.TEXT_MODEL_MAP["BailingMoeV3ForCausalLM"]
base.ModelBase.register("BailingHybridForCausalLM")(cls)
c.main()
"""


def convert(llama: Path, hf_dir: Path, out: Path, name: str) -> None:
    shim = CONVERT_SHIM.format(llama=str(llama))
    cmd = [sys.executable, "-c", shim, str(hf_dir), "--outtype", "f32", "--model-name", name, "--outfile", str(out)]
    env = dict(**__import__("os").environ)
    env["PYTHONPATH"] = f"{llama / 'gguf-py'}:{llama}"
    r = subprocess.run(cmd, env=env, capture_output=True, text=True)
    if r.returncode != 0:
        raise SystemExit(f"convert_hf_to_gguf.py failed:\n{r.stderr[-4000:]}")


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
        help="where each model's Hugging Face checkpoint is kept (<dir>/<name>/)",
    )
    args = ap.parse_args()

    mk.check_torch_path()
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
        logits = mk.reference_logits(model, ids)
        assert np.array_equal(logits, mk.reference_logits(model, ids))
        with torch.no_grad():
            m64 = build_model(spec).double()
            if m64._can_set_experts_implementation():
                m64.set_experts_implementation("eager")  # grouped_mm has no f64
            l64 = m64(torch.tensor([ids]), use_cache=False).logits[0].numpy()
        rel64 = np.abs(l64 - logits).max() / np.abs(l64).max()
        d = args.hf_out / name
        d.mkdir(parents=True, exist_ok=True)
        save_released_layout(model, d)
        mk.save_tokenizer(tok, d)
        back, info = transformers.BailingHybridForCausalLM.from_pretrained(
            d, dtype=torch.float32, use_kernels=False, output_loading_info=True
        )
        assert not any(info.values()), f"loading the released layout: {info}"
        back.eval()
        assert back.config.linear_head_dim == model.config.linear_head_dim
        assert np.array_equal(mk.reference_logits(back, ids), logits), "the released layout loads back differently"
        np.save(out / "logits.npy", logits)
        (out / "tokens.json").write_text(json.dumps(ids) + "\n")
        model.config.to_json_file(out / "config.json", use_diff=False)
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
