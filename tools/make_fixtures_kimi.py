#!/usr/bin/env python3
"""Build the Kimi Delta Attention parity fixtures in tests/fixtures/parity/:
`kimi_linear_tiny` (KimiLinearForCausalLM as released: plain query
projection) and `kimi_linear_qlora` (the same class with a query LoRA,
`q_lora_rank` set), both -> GGUF arch `kimi-linear`.

Run by hand (the outputs are committed):

    PYTHONPATH=<llama.cpp>/gguf-py python3 tools/make_fixtures_kimi.py \
        --llama-cpp <llama.cpp source tree> [--shared PATH] [--only NAME...]

`--shared` is the project's shared data folder (Tiny Shakespeare and the
4096-token fixture tokenizer, as for tools/make_fixtures.py, whose
vocabulary and token helpers this script reuses: the same 1024-token cut and
the same 37 tokens).

For each model this script

1. builds a tiny random-weight transformers model (fixed seed) whose KDA
   layers carry state for real: A = exp(A_log) drawn in [0.02, 0.6] and
   dt_bias with spread per channel, so that with softplus(f_b(f_a(x)) +
   dt_bias) around 0.1-2 each key channel remembers ~1-100 tokens; conv
   kernels far from identity; every RMSNorm weight (plain `w x` in this
   model) around 1 with spread; the router's score-correction bias with
   spread (it changes which experts are chosen); every matrix N(0,
   1/fan_in); every parameter rounded to an f16-representable value (kept
   in f32);
2. saves it in the released checkpoint's layout (the names Moonshot's
   remote code uses and transformers 5 maps on load: `q_conv1d` / `k_conv1d`
   / `v_conv1d`, `A_log`, `dt_bias`, `f_a_proj` beside the attention,
   `block_sparse_moe.experts.N.w1/w2/w3`, the dense layer as `mlp.*`; the
   config with `linear_attn_config` and `moe_router_activation_func`), checks
   that transformers loads that back to the same logits, and converts it with
   llama.cpp's own convert_hf_to_gguf.py (`--outtype f32`; the cut
   vocabulary's pre-tokenizer hash is unknown to the converter, so the
   converter runs with its pre-tokenizer name fixed to "olmo", the name it
   gives the full NeoX tokenizer, as for the shared fixtures);
3. stores transformers' float32 logits for tokens.json (one forward from an
   empty state, use_cache=False, deterministic algorithms; transformers'
   pure-torch KDA and conv paths: fla and causal_conv1d must not be
   importable) as logits.npy [37, 1024] and the config as config.json.

Every stack has both layer kinds and both feed-forward kinds: KDA layers
(4 heads of 16) and MLA layers (4 heads, kv_lora_rank 24, no-RoPE / "RoPE"
head split 16 + 8, v_head_dim 12; Kimi-Linear's MLA applies no rotation at
all), a dense SwiGLU first layer, then DeepSeek-style MoE layers (4 experts,
top-2 by sigmoid score plus correction bias, renormalised, times the routed
scaling factor, plus a shared expert).
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
    hidden_size=48,
    intermediate_size=64,
    moe_intermediate_size=24,
    num_attention_heads=4,
    num_key_value_heads=4,
    kv_lora_rank=24,
    qk_rope_head_dim=8,
    qk_nope_head_dim=16,
    v_head_dim=12,
    num_local_experts=4,
    num_experts_per_tok=2,
    n_shared_experts=1,
    routed_scaling_factor=1.7,
    n_group=1,
    topk_group=1,
    first_k_dense_replace=1,
    rms_norm_eps=1e-6,
    model_max_length=4096,
    tie_word_embeddings=False,
    bos_token_id=0,
    eos_token_id=0,
    pad_token_id=1,
)

MODELS = {
    "kimi_linear_tiny": dict(
        seed=6301,
        config=dict(
            COMMON,
            num_hidden_layers=4,
            q_lora_rank=None,
            # 1-based, as the released config writes them
            linear_attn_config=dict(
                head_dim=16, num_heads=4, short_conv_kernel_size=4, full_attn_layers=[2], kda_layers=[1, 3, 4]
            ),
        ),
    ),
    "kimi_linear_qlora": dict(
        seed=6302,
        config=dict(
            COMMON,
            num_hidden_layers=5,
            q_lora_rank=20,
            linear_attn_config=dict(
                head_dim=16, num_heads=4, short_conv_kernel_size=3, full_attn_layers=[1, 4], kda_layers=[2, 3, 5]
            ),
        ),
    ),
}

# Keys of the released config.json that transformers' class does not keep
# (the converter reads `moe_router_activation_func` for the gating function).
RELEASED_EXTRA = dict(
    moe_router_activation_func="sigmoid",
    use_grouped_topk=True,
    mla_use_nope=True,
    moe_layer_freq=1,
    num_nextn_predict_layers=0,
)


def check_torch_path() -> None:
    """transformers' pure-torch KDA and conv paths: fla and causal_conv1d
    must not be importable, and the hub-kernel package is hidden from
    transformers (its kernels replace layers' forwards)."""
    for pkg in ("fla", "causal_conv1d"):
        if importlib.util.find_spec(pkg) is not None:
            raise SystemExit(f"{pkg} is installed: uninstall it so transformers uses its torch path")
    assert "transformers" not in sys.modules
    sys.modules["kernels"] = None  # import kernels -> ImportError


def build_model(spec: dict):
    import torch
    from transformers import KimiLinearConfig, KimiLinearForCausalLM

    config = KimiLinearConfig(**spec["config"])
    config.architectures = ["KimiLinearForCausalLM"]
    torch.manual_seed(spec["seed"])
    model = KimiLinearForCausalLM(config).float().eval()
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
                p.copy_(torch.log(uniform(p.shape, 0.02, 0.6)))
            elif short == "dt_bias":
                p.copy_(randn(p.shape) - 1.0)
            elif name.endswith("conv1d.weight"):
                p.copy_(0.6 * randn(p.shape))
            elif short == "e_score_correction_bias":
                p.copy_(0.1 * randn(p.shape))
            elif name.endswith("norm.weight"):
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


def reference_logits(model, ids: list[int]) -> np.ndarray:
    import torch

    with torch.no_grad():
        out = model(torch.tensor([ids]), use_cache=False)
    logits = out.logits[0].float().numpy()
    assert logits.shape == (len(ids), N_VOCAB)
    return np.ascontiguousarray(logits, dtype="<f4")


def save_released_layout(model, d: Path) -> None:
    """save_pretrained (which writes the original names back), the dense
    layers' MLP under `mlp.` as the released checkpoint has it, and the
    released config's extra keys."""
    from safetensors.torch import load_file, save_file

    model.save_pretrained(d, safe_serialization=True)
    path = d / "model.safetensors"
    tensors = load_file(path)
    dense = [i for i, t in enumerate(model.config.mlp_layer_types) if t == "dense"]
    renamed = {}
    for name, t in tensors.items():
        for i in dense:
            pre = f"model.layers.{i}.block_sparse_moe."
            if name.startswith(pre):
                name = f"model.layers.{i}.mlp." + name[len(pre) :]
        renamed[name] = t.contiguous()
    save_file(dict(sorted(renamed.items())), path, metadata={"format": "pt"})
    cfg = json.loads((d / "config.json").read_text())
    cfg.update(RELEASED_EXTRA)
    (d / "config.json").write_text(json.dumps(cfg, indent=2, sort_keys=True) + "\n")


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
    cmd = [sys.executable, "-c", shim, str(hf_dir), "--outtype", "f32", "--model-name", name, "--outfile", str(out)]
    env = dict(**__import__("os").environ)
    env["PYTHONPATH"] = f"{llama / 'gguf-py'}:{llama}"
    r = subprocess.run(cmd, env=env, capture_output=True, text=True)
    if r.returncode != 0:
        raise SystemExit(f"convert_hf_to_gguf.py failed:\n{r.stderr[-4000:]}")


def save_tokenizer(tok, d: Path) -> None:
    from transformers import PreTrainedTokenizerFast

    t = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<|endoftext|>", eos_token="<|endoftext|>")
    t.save_pretrained(d)
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
            l64 = m64(torch.tensor([ids]), use_cache=False).logits[0].numpy()
        rel64 = np.abs(l64 - logits).max() / np.abs(l64).max()
        d = args.hf_out / name
        d.mkdir(parents=True, exist_ok=True)
        save_released_layout(model, d)
        save_tokenizer(tok, d)
        back, info = transformers.KimiLinearForCausalLM.from_pretrained(
            d, dtype=torch.float32, use_kernels=False, output_loading_info=True
        )
        assert not any(info.values()), f"loading the released layout: {info}"
        back.eval()
        assert np.array_equal(reference_logits(back, ids), logits), "the released layout loads back differently"
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
