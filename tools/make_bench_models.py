#!/usr/bin/env python3
"""Random-weight Hugging Face checkpoints of real model shapes, for benchmarks.

    python3 tools/make_bench_models.py --tokenizer PATH/gpt-neox-20b_tokenizer.json \
        [--out DIR] [--only mamba2-370m-like|hybrid-350m-like ...] [--seed N] [--force]

Writes, under --out (default: ../bench-models relative to the repository root,
i.e. outside the repository), one folder per model with `config.json`,
`model.safetensors` (float16; `A_log` float32, so that llama.cpp's converter
computes A = -exp(A_log) in f32), `tokenizer.json` (the GPT-NeoX-20B
tokenizer given with --tokenizer) and `tokenizer_config.json`.

The two default shapes are the reference shapes of docs/PERFORMANCE.md
("How to measure"); the others are made with --only:

- mamba2-370m-like: Mamba2ForCausalLM, 48 layers, d_model 1024, expand 2
  (d_inner 2048 = 32 heads x 64), d_state 128, 1 group, d_conv 4, vocab
  50280 padded to 50288, tied embeddings (~368 M parameters, 704 MiB as an
  F16 GGUF);
- hybrid-350m-like: GraniteMoeHybridForCausalLM without routed experts
  (Granite-4.0-H dense style), 32 layers, d_model 768, attention (12 heads,
  4 KV heads, head_dim 64, no positional encoding) at layers 5, 13, 21, 29,
  Mamba-2 elsewhere (24 heads x 64, d_state 128, 1 group), a shared SwiGLU
  MLP of 2560 in every layer, vocab 50280, tied (648 MiB as an F16 GGUF);
- mamba-370m-like (Mamba-1; run with --only or the benchmark script's
  --models): MambaForCausalLM with the shape of
  state-spaces/mamba-370m-hf, 48 layers, d_model 1024, expand 2 (d_inner
  2048), d_state 16, dt_rank 64, d_conv 4, vocab 50280, tied;
- lfm2-1.2b-like: Lfm2ForCausalLM with the
  shape of LiquidAI/LFM2-1.2B, 16 layers of d_model 2048: short convolutions
  (window 3) and grouped-query attention (32 heads, 8 KV heads, head_dim 64,
  RoPE θ 1e6) at layers 2, 5, 8, 10, 12, 14; SwiGLU `block_ff_dim` 12288
  adjusted (x 2/3, multiple of 256) to 8192; vocab 65536 (the NeoX ids, the
  rest padding), tied (~1.17 G parameters);
- lfm2-350m-like, lfm3-350m-like (--only; LFM3 needs transformers 5.25 and
  `coil convert`, llama.cpp has no LFM3): the shape of LiquidAI/LFM2-350M,
  16 layers of d_model 1024, SwiGLU 4608, vocab 65536, tied, 16 heads of
  64; LFM2: 8 KV heads, attention at 2, 5, 8, 10, 12, 14, conv window 3;
  LFM3 as its config's defaults lay it out: full attention at 2, 6, 10, 14
  (proportional RoPE θ 1e6 on half the pairs), sliding-window attention
  (window 256, RoPE θ 1e4) at 4, 8, 12, short convolutions (window 7)
  elsewhere, 4 KV heads, sandwich norms and the attention gate (~0.35 G
  parameters each);
- zamba2-370m-like (--only; llama.cpp has no Zamba2, convert with `coil
  convert`): Zamba2ForCausalLM with mamba2-370m-like's Mamba-2 stack (48
  layers of d_model 1024, 32 heads x 64, d_state 128, 1 group, conv 4) and
  one shared block (attention over the 2048-wide [x, embedding], 16 heads of
  128 with RoPE θ 1e4; exact-GELU GeGLU 4096) used at every sixth layer (5,
  11, ..., 47: 8 uses), each use with its own projection back and MLP
  adapters of rank 128 (Zamba2-1.2B's choices: no attention adapters, one
  block), vocab 50280, tied (~0.41 G parameters);
- qwen35-0.8b-like: Qwen3_5ForCausalLM with the
  shape of Qwen3.5-0.8B: 24 layers of d_model 1024, 3 Gated DeltaNet : 1
  gated attention, DeltaNet 16 key and 16 value heads of 128 (conv 4),
  attention 8 heads / 2 KV heads of 256 (rotary 64 lanes, sections
  [11, 11, 10]), SwiGLU 3584, vocab 248320 (the real one's size; the token
  strings are the GPT-NeoX tokenizer's, padded), tied (752 M parameters);
- qwen35moe-1b-like (--only): Qwen3_5MoeForCausalLM, the same stack with
  16 key / 32 value heads and, in every layer, 64 experts of 160 (top-8)
  plus a shared expert of 512; untied (1.65 B parameters, 0.5 B of them the
  two 248320-row embeddings; ~0.7 B active per token, output head included).
- qwen35moe-35b-a3b-like (--only): Qwen3.5-35B-A3B's layer shapes (d_model
  2048; 256 experts of 512, top-8, a shared expert of 512; 16 query / 2 KV
  heads of 256; DeltaNet 16 key / 32 value heads of 128) over two layers,
  one of each kind; untied (2.70 B parameters; building it takes ~11 GB).
- kimi-linear-48b-a3b-like (--only): Kimi-Linear-48B-A3B's layer shapes
  (transformers' KimiLinearConfig defaults, which are that checkpoint's:
  d_model 2304; KDA 32 heads of 128, conv 4, gate ranks 128; MLA 32 heads,
  kv_lora_rank 512, no query LoRA, no-RoPE / RoPE key lanes 128 + 64,
  value 128; a dense SwiGLU 9216 first layer, then 256 experts of 1024,
  top-8 by sigmoid score, plus one shared expert; vocab 163840 (the NeoX
  ids, the rest padding), untied) over four layers, three KDA then one MLA
  (`full_attn_layers` [4]: the released 3 : 1 order); 6.4 B parameters.
  Written tensor by tensor in the released checkpoint's layout (the names
  llama.cpp's KimiLinearModel converter reads: `block_sparse_moe.experts.N.
  w1/w2/w3`, `q_conv1d`, `A_log`, `dt_bias`, ...) without building the model,
  which would not fit in memory in f32; needs transformers 5 (KimiLinear)
  for the config only.
- ling3-flash-like (--only): Ling-3.0-flash's layer shapes (transformers'
  BailingHybridConfig defaults, which are that checkpoint's: d_model 2560;
  KDA 32 heads of 128, conv 4, full-rank forget gate; MLA 32 heads,
  kv_lora_rank 512, no query LoRA, no-RoPE / RoPE key lanes 128 + 64,
  value 128, a per-head output gate; 512 experts of 768, top-8 by sigmoid
  score in 4 of 8 groups, plus one shared expert; vocab 157184 (the NeoX
  ids, the rest padding), untied) over two layers: KDA with the dense
  SwiGLU 6144, then MLA with the experts; 3.97 B parameters. Written tensor
  by tensor in the released layout as tools/make_fixtures_bailing.py's
  checkpoints have it; `coil convert` writes the `bailingmoe3` file
  llama.cpp runs.
- qwen35-0.8b-mtp-like (--only): qwen35-0.8b-like with one multi-token-
  prediction block as released Qwen3.5 checkpoints carry it
  (`mtp_num_hidden_layers` 1; `mtp.fc` [d, 2d], `mtp.pre_fc_norm_embedding`,
  `mtp.pre_fc_norm_hidden`, `mtp.norm` and one full-attention decoder layer
  `mtp.layers.0.*` shaped like the trunk's), for `--spec mtp` (convert it
  with `coil convert`, which keeps the block). Its drafts are random: they
  measure what rejected MTP drafts cost.
  Both need transformers 5 (Qwen3.5) and llama.cpp's converter with
  `--no-mtp`, run as tools/make_fixtures_qwen35.py runs it (pre-tokenizer
  name fixed to olmo); scripts/bench-vs-llamacpp.sh builds them so (`--models
  "qwen35-0.8b-like qwen35moe-1b-like"`, in a second Python environment,
  $BENCH_DIR/venv-qwen35 or QWEN35_PYTHON; `--prepare-only` stops once the
  GGUF files exist).

Random weights cost the same compute as trained ones. Init: every matrix
N(0, 1/fan_in) (unit-variance activations), tied embeddings N(0, (4/sqrt(d))^2)
(logits of std ~4), norms 1; A_log, dt_bias, D and the conv1d weights at
transformers' own init. Every value is f16-representable.

Run it with the Python that runs llama.cpp's convert_hf_to_gguf.py: the
converter of the pinned llama.cpp expects transformers 4.x (the Qwen3.5
shapes, which transformers 4 does not have: transformers 5 for both). With
transformers 5 the script still works: it writes GraniteMoeHybrid's
`layer_types` in the 4.x spelling ("mamba" / "attention") that the converter
reads.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
# The GPT-NeoX tokenizer's 50280 ids (50277 used). Mamba-2 checkpoints pad the
# embedding to a multiple of 16 (state-spaces/mamba2-370m: 50288), and
# llama.cpp's converter pads the GGUF vocabulary the same way, so the
# embedding must have those rows; Granite keeps vocab_size as configured.
VOCAB = 50280
VOCAB_MAMBA2 = 50288

MODELS = (
    "mamba2-370m-like",
    "hybrid-350m-like",
    "mamba-370m-like",
    "lfm2-1.2b-like",
    "lfm2-350m-like",
    "lfm3-350m-like",
    "zamba2-370m-like",
    "qwen35-0.8b-like",
    "qwen35moe-1b-like",
    "qwen35-0.8b-mtp-like",
    "qwen35moe-35b-a3b-like",
    "kimi-linear-48b-a3b-like",
    "ling3-flash-like",
)
# What --only builds by default: the two reference shapes.
DEFAULT_MODELS = ("mamba2-370m-like", "hybrid-350m-like")


# What the Mamba and Mamba-2 shapes share (state-spaces' mamba*-370m):
# 48 layers of d_model 1024, expand 2, a causal conv of 4 with bias, tied
# embeddings, the GPT-NeoX token ids.
MAMBA_COMMON = dict(
    hidden_size=1024,
    num_hidden_layers=48,
    expand=2,
    conv_kernel=4,
    use_bias=False,
    use_conv_bias=True,
    layer_norm_epsilon=1e-5,
    tie_word_embeddings=True,
    bos_token_id=0,
    eos_token_id=0,
    pad_token_id=1,
    residual_in_fp32=True,
)


def mamba2_config():
    from transformers import Mamba2Config

    return Mamba2Config(
        vocab_size=VOCAB_MAMBA2,
        head_dim=64,
        num_heads=32,
        state_size=128,
        n_groups=1,
        chunk_size=256,
        time_step_limit=(0.0, float("inf")),
        **MAMBA_COMMON,
    )


def mamba1_config():
    from transformers import MambaConfig

    return MambaConfig(vocab_size=VOCAB, state_size=16, time_step_rank=64, **MAMBA_COMMON)


ATTN_LAYERS = (5, 13, 21, 29)

# Qwen3.5-0.8B's stack (Qwen/Qwen3.5-0.8B config.json, text part).
QWEN35_COMMON = dict(
    vocab_size=248320,
    hidden_size=1024,
    num_hidden_layers=24,
    num_attention_heads=8,
    num_key_value_heads=2,
    head_dim=256,
    hidden_act="silu",
    max_position_embeddings=262144,
    rms_norm_eps=1e-6,
    linear_conv_kernel_dim=4,
    linear_key_head_dim=128,
    linear_value_head_dim=128,
    linear_num_key_heads=16,
    layer_types=["full_attention" if (i + 1) % 4 == 0 else "linear_attention" for i in range(24)],
    rope_parameters=dict(
        rope_type="default",
        rope_theta=10_000_000.0,
        partial_rotary_factor=0.25,
        mrope_section=[11, 11, 10],
        mrope_interleaved=True,
    ),
    bos_token_id=0,
    eos_token_id=0,
    pad_token_id=1,
)


def qwen35_config():
    from transformers import Qwen3_5TextConfig

    return Qwen3_5TextConfig(
        intermediate_size=3584, linear_num_value_heads=16, tie_word_embeddings=True, **QWEN35_COMMON
    )


def qwen35moe_config(**over):
    from transformers import Qwen3_5MoeTextConfig

    cfg = dict(QWEN35_COMMON)
    cfg.update(
        linear_num_value_heads=32,
        num_experts=64,
        num_experts_per_tok=8,
        moe_intermediate_size=160,
        shared_expert_intermediate_size=512,
        tie_word_embeddings=False,
    )
    cfg.update(over)
    return Qwen3_5MoeTextConfig(**cfg)


def qwen35moe_35b_a3b_config():
    """Qwen3.5-35B-A3B's expert layout over two layers: the shape the
    sub-4-bit MoE files are made of, at a size two cores quantize in minutes."""
    return qwen35moe_config(
        hidden_size=2048,
        num_hidden_layers=2,
        num_attention_heads=16,
        layer_types=["linear_attention", "full_attention"],
        num_experts=256,
        moe_intermediate_size=512,
    )


# Keys of Kimi-Linear's released config.json that transformers' class does
# not keep; llama.cpp's converter reads `moe_router_activation_func`.
KIMI_RELEASED_EXTRA = dict(
    moe_router_activation_func="sigmoid",
    use_grouped_topk=True,
    mla_use_nope=True,
    moe_layer_freq=1,
    num_nextn_predict_layers=0,
)


def kimi_linear_48b_a3b_config():
    """Kimi-Linear-48B-A3B (transformers' KimiLinearConfig defaults are its
    shapes) over four layers: three KDA, then one MLA, as the released
    config orders them (1-based `full_attn_layers` 4, 8, ...)."""
    from transformers import KimiLinearConfig

    cfg = KimiLinearConfig(
        num_hidden_layers=4,
        linear_attn_config=dict(
            head_dim=128, num_heads=32, short_conv_kernel_size=4, full_attn_layers=[4], kda_layers=[1, 2, 3]
        ),
        first_k_dense_replace=1,
        vocab_size=163840,
        tie_word_embeddings=False,
        bos_token_id=0,
        eos_token_id=0,
        pad_token_id=1,
    )
    cfg.architectures = ["KimiLinearForCausalLM"]
    return cfg


def kimi_linear_tensors(cfg):
    """(name, shape, kind) of every tensor of a KimiLinearForCausalLM
    checkpoint in the released layout; kind picks the init."""
    d = cfg.hidden_size
    h, dk, k = cfg.linear_num_heads, cfg.linear_head_dim, cfg.linear_conv_kernel_dim
    hd = h * dk
    nh = cfg.num_attention_heads
    r, rope, nope, dv = cfg.kv_lora_rank, cfg.qk_rope_head_dim, cfg.qk_nope_head_dim, cfg.v_head_dim
    e, fe = cfg.num_experts, cfg.moe_intermediate_size
    out = [("model.embed_tokens.weight", (cfg.vocab_size, d), "embed")]
    for i in range(cfg.num_hidden_layers):
        p = f"model.layers.{i}."
        out += [(p + "input_layernorm.weight", (d,), "norm"), (p + "post_attention_layernorm.weight", (d,), "norm")]
        a = p + "self_attn."
        if cfg.layer_types[i] == "full_attention":
            if cfg.q_lora_rank:
                raise SystemExit("error: the bench shape has no query LoRA")
            out += [
                (a + "q_proj.weight", (nh * (nope + rope), d), "matrix"),
                (a + "kv_a_proj_with_mqa.weight", (r + rope, d), "matrix"),
                (a + "kv_a_layernorm.weight", (r,), "norm"),
                (a + "kv_b_proj.weight", (nh * (nope + dv), r), "matrix"),
                (a + "o_proj.weight", (d, nh * dv), "matrix"),
            ]
        else:
            out += [(a + f"{x}_proj.weight", (hd, d), "matrix") for x in "qkv"]
            out += [(a + f"{x}_conv1d.weight", (hd, 1, k), "conv") for x in "qkv"]
            out += [
                (a + "A_log", (1, 1, h, 1), "A_log"),
                (a + "dt_bias", (hd,), "dt_bias"),
                (a + "f_a_proj.weight", (dk, d), "matrix"),
                (a + "f_b_proj.weight", (hd, dk), "matrix"),
                (a + "g_a_proj.weight", (dk, d), "matrix"),
                (a + "g_b_proj.weight", (hd, dk), "matrix"),
                (a + "b_proj.weight", (h, d), "matrix"),
                (a + "o_norm.weight", (dk,), "norm"),
                (a + "o_proj.weight", (d, hd), "matrix"),
            ]
        if cfg.mlp_layer_types[i] == "dense":
            f = cfg.intermediate_size
            out += [
                (p + "mlp.gate_proj.weight", (f, d), "matrix"),
                (p + "mlp.up_proj.weight", (f, d), "matrix"),
                (p + "mlp.down_proj.weight", (d, f), "matrix"),
            ]
        else:
            m = p + "block_sparse_moe."
            out += [(m + "gate.weight", (e, d), "matrix"), (m + "gate.e_score_correction_bias", (e,), "zero")]
            for j in range(e):
                x = m + f"experts.{j}."
                out += [(x + "w1.weight", (fe, d), "matrix"), (x + "w2.weight", (d, fe), "matrix")]
                out += [(x + "w3.weight", (fe, d), "matrix")]
            fs = fe * cfg.num_shared_experts
            out += [
                (m + "shared_experts.gate_proj.weight", (fs, d), "matrix"),
                (m + "shared_experts.up_proj.weight", (fs, d), "matrix"),
                (m + "shared_experts.down_proj.weight", (d, fs), "matrix"),
            ]
    out += [("model.norm.weight", (d,), "norm"), ("lm_head.weight", (cfg.vocab_size, d), "matrix")]
    return out


def streamed_tensor(shape, kind, d, gen):
    """One tensor drawn as `build` draws its kind (A_log, dt_bias and the
    conv kernels at transformers' init; A_log f32, everything else f16)."""
    import math

    import torch

    if kind == "A_log":
        return torch.empty(shape).uniform_(1.0, 16.0, generator=gen).log()
    if kind == "dt_bias":
        dt = torch.empty(shape).uniform_(math.log(1e-3), math.log(1e-1), generator=gen).exp().clamp_min(1e-4)
        t = dt + torch.log(-torch.expm1(-dt))
    elif kind == "conv":
        bound = 1.0 / math.sqrt(shape[-1])
        t = torch.empty(shape).uniform_(-bound, bound, generator=gen)
    elif kind == "embed":
        t = torch.empty(shape).normal_(0.0, 4.0 / d**0.5, generator=gen)
    elif kind == "matrix":
        t = torch.empty(shape).normal_(0.0, 1.0 / shape[-1] ** 0.5, generator=gen)
    elif kind == "norm":
        t = torch.ones(shape)
    else:
        t = torch.zeros(shape)
    return t.half()


def save_streamed(cfg, specs, extra: dict, out: Path, tokenizer: Path, seed: int) -> int:
    """A checkpoint written one tensor at a time (safetensors: an 8-byte
    header length, the JSON header, then the tensors' bytes in order), so
    that memory holds one tensor, not the model: `specs` are (name, shape,
    kind) in the released layout, drawn by `streamed_tensor`; `extra`
    are the released config's keys the config class does not keep.
    Returns the parameter count."""
    import struct

    import torch

    header, offset = {"__metadata__": {"format": "pt"}}, 0
    for name, shape, kind in specs:
        dtype, size = ("F32", 4) if kind == "A_log" else ("F16", 2)
        n = size
        for s in shape:
            n *= s
        header[name] = {"dtype": dtype, "shape": list(shape), "data_offsets": [offset, offset + n]}
        offset += n
    raw = json.dumps(header, separators=(",", ":")).encode()
    raw += b" " * (-len(raw) % 8)
    out.mkdir(parents=True, exist_ok=True)
    gen = torch.Generator().manual_seed(seed)
    params = 0
    path = out / "model.safetensors"
    with open(str(path) + ".partial", "wb") as f:
        f.write(struct.pack("<Q", len(raw)))
        f.write(raw)
        for name, shape, kind in specs:
            t = streamed_tensor(shape, kind, cfg.hidden_size, gen).contiguous()
            f.write(t.numpy().tobytes())
            params += t.numel()
    Path(str(path) + ".partial").rename(path)
    cfg.save_pretrained(out)
    cfg_path = out / "config.json"
    c = json.loads(cfg_path.read_text())
    c.update(extra)
    c["dtype"] = "float16"
    cfg_path.write_text(json.dumps(c, indent=2, sort_keys=True) + "\n")
    save_tokenizer(out, tokenizer)
    return params


def ling3_flash_config():
    """Ling-3.0-flash (transformers' BailingHybridConfig defaults are its
    shapes) over two layers: one KDA layer with the dense feed-forward, then
    one MLA layer with the experts."""
    from transformers import BailingHybridConfig

    cfg = BailingHybridConfig(
        num_hidden_layers=2,
        layer_group_size=2,
        first_k_dense_replace=1,
        num_nextn_predict_layers=0,
        expert_swiglu_limit_list=[0, 0],
        share_expert_swiglu_limit_list=[0, 0],
        tie_word_embeddings=False,
        bos_token_id=0,
        eos_token_id=0,
        pad_token_id=1,
    )
    cfg.architectures = ["BailingHybridForCausalLM"]
    return cfg


def ling3_released_extra(cfg) -> dict:
    """The released config's keys llama.cpp's converter reads, as
    tools/make_fixtures_bailing.py writes them for its checkpoints."""
    from make_fixtures_bailing import released_extra

    return released_extra(cfg)


def ling3_tensors(cfg):
    """(name, shape, kind) of every tensor of a BailingHybridForCausalLM
    checkpoint in the released layout (`model.word_embeddings`,
    `attention.*`, separate q/k/v convolutions, per-expert matrices; the
    names tests/fixtures/hf/bailing_hybrid_tiny has)."""
    d = cfg.hidden_size
    h, dk, k = cfg.linear_num_heads, cfg.linear_head_dim, cfg.linear_conv_kernel_dim
    hd = h * dk
    nh = cfg.num_attention_heads
    r, rope, nope, dv = cfg.kv_lora_rank, cfg.qk_rope_head_dim, cfg.qk_nope_head_dim, cfg.v_head_dim
    e, fe = cfg.num_experts, cfg.moe_intermediate_size
    out = [("model.word_embeddings.weight", (cfg.vocab_size, d), "embed")]
    for i in range(cfg.num_hidden_layers):
        p = f"model.layers.{i}."
        out += [(p + "input_layernorm.weight", (d,), "norm"), (p + "post_attention_layernorm.weight", (d,), "norm")]
        a = p + "attention."
        if cfg.layer_types[i] == "full_attention":
            if cfg.q_lora_rank:
                raise SystemExit("error: the bench shape has no query LoRA")
            out += [
                (a + "q_proj.weight", (nh * (nope + rope), d), "matrix"),
                (a + "kv_a_proj_with_mqa.weight", (r + rope, d), "matrix"),
                (a + "kv_a_layernorm.weight", (r,), "norm"),
                (a + "kv_b_proj.weight", (nh * (nope + dv), r), "matrix"),
                (a + "g_proj.weight", (nh, d), "matrix"),
                (a + "dense.weight", (d, nh * dv), "matrix"),
            ]
        else:
            out += [(a + f"{x}_proj.weight", (hd, d), "matrix") for x in "qkv"]
            out += [(a + f"{x}_conv1d.weight", (hd, 1, k), "conv") for x in "qkv"]
            out += [
                (a + "A_log", (h,), "A_log"),
                (a + "dt_bias", (hd,), "dt_bias"),
                (a + "f_proj.weight", (hd, d), "matrix"),
                (a + "g_proj.weight", (hd, d), "matrix"),
                (a + "b_proj.weight", (h, d), "matrix"),
                (a + "o_norm.weight", (dk,), "norm"),
                (a + "dense.weight", (d, hd), "matrix"),
            ]
        m = p + "mlp."
        if cfg.mlp_layer_types[i] == "dense":
            f = cfg.intermediate_size
            out += [
                (m + "gate_proj.weight", (f, d), "matrix"),
                (m + "up_proj.weight", (f, d), "matrix"),
                (m + "down_proj.weight", (d, f), "matrix"),
            ]
        else:
            out += [(m + "gate.weight", (e, d), "matrix"), (m + "gate.expert_bias", (e,), "zero")]
            for j in range(e):
                x = m + f"experts.{j}."
                out += [(x + "gate_proj.weight", (fe, d), "matrix"), (x + "up_proj.weight", (fe, d), "matrix")]
                out += [(x + "down_proj.weight", (d, fe), "matrix")]
            fs = fe * cfg.num_shared_experts
            out += [
                (m + "shared_experts.gate_proj.weight", (fs, d), "matrix"),
                (m + "shared_experts.up_proj.weight", (fs, d), "matrix"),
                (m + "shared_experts.down_proj.weight", (d, fs), "matrix"),
            ]
    out += [("model.norm.weight", (d,), "norm"), ("lm_head.weight", (cfg.vocab_size, d), "matrix")]
    return out


def hybrid_config():
    from transformers import GraniteMoeHybridConfig

    n_layer = 32
    kw = dict(
        vocab_size=VOCAB,
        hidden_size=768,
        num_hidden_layers=n_layer,
        num_attention_heads=12,
        num_key_value_heads=4,
        intermediate_size=2560,
        shared_intermediate_size=2560,
        num_local_experts=0,
        num_experts_per_tok=0,
        hidden_act="silu",
        max_position_embeddings=32768,
        rms_norm_eps=1e-5,
        attention_bias=False,
        position_embedding_type="nope",
        embedding_multiplier=12.0,
        residual_multiplier=0.246,
        attention_multiplier=0.015625,
        logits_scaling=4.0,
        mamba_n_heads=24,
        mamba_d_head=64,
        mamba_n_groups=1,
        mamba_d_state=128,
        mamba_d_conv=4,
        mamba_expand=2,
        mamba_chunk_size=256,
        mamba_conv_bias=True,
        mamba_proj_bias=False,
        tie_word_embeddings=True,
        bos_token_id=0,
        eos_token_id=0,
        pad_token_id=1,
    )
    # transformers 4.x spells the layer types "mamba" / "attention",
    # transformers 5 "linear_attention" / "full_attention".
    for mamba, attn in (("mamba", "attention"), ("linear_attention", "full_attention")):
        types = [attn if i in ATTN_LAYERS else mamba for i in range(n_layer)]
        try:
            cfg = GraniteMoeHybridConfig(layer_types=types, **kw)
        except (ValueError, TypeError):
            continue
        got = list(getattr(cfg, "layer_types", None) or [])
        if got == types:
            return cfg
    sys.exit("error: this transformers version accepts no known spelling of GraniteMoeHybrid layer_types")


LFM2_ATTN_LAYERS = (2, 5, 8, 10, 12, 14)


def lfm2_config():
    from transformers import Lfm2Config

    n_layer = 16
    return Lfm2Config(
        vocab_size=65536,
        hidden_size=2048,
        intermediate_size=12288,
        block_auto_adjust_ff_dim=True,
        block_ffn_dim_multiplier=1.0,
        block_multiple_of=256,
        num_hidden_layers=n_layer,
        layer_types=["full_attention" if i in LFM2_ATTN_LAYERS else "conv" for i in range(n_layer)],
        num_attention_heads=32,
        num_key_value_heads=8,
        conv_L_cache=3,
        conv_bias=False,
        norm_eps=1e-5,
        rope_theta=1000000.0,
        max_position_embeddings=128000,
        tie_word_embeddings=True,
        bos_token_id=0,
        eos_token_id=0,
        pad_token_id=1,
    )


def lfm2_350m_config():
    from transformers import Lfm2Config

    attn = (2, 5, 8, 10, 12, 14)
    return Lfm2Config(
        vocab_size=65536,
        hidden_size=1024,
        intermediate_size=4608,
        block_auto_adjust_ff_dim=False,
        num_hidden_layers=16,
        layer_types=["full_attention" if i in attn else "conv" for i in range(16)],
        num_attention_heads=16,
        num_key_value_heads=8,
        conv_L_cache=3,
        conv_bias=False,
        norm_eps=1e-5,
        rope_theta=1000000.0,
        max_position_embeddings=128000,
        tie_word_embeddings=True,
        bos_token_id=0,
        eos_token_id=0,
        pad_token_id=1,
    )


def lfm3_350m_config():
    from transformers import Lfm3Config

    return Lfm3Config(
        vocab_size=65536,
        hidden_size=1024,
        intermediate_size=4608,
        num_hidden_layers=16,
        num_attention_heads=16,
        num_key_value_heads=4,
        head_dim=64,
        conv_L_cache=7,
        sliding_window=256,
        norm_eps=1e-5,
        max_position_embeddings=128000,
        tie_word_embeddings=True,
        bos_token_id=0,
        eos_token_id=0,
        pad_token_id=1,
    )


def zamba2_370m_config():
    from transformers import Zamba2Config

    return Zamba2Config(
        vocab_size=VOCAB,
        hidden_size=1024,
        num_hidden_layers=48,
        layers_block_type=["hybrid" if i % 6 == 5 else "mamba" for i in range(48)],
        mamba_d_state=128,
        mamba_d_conv=4,
        mamba_expand=2,
        mamba_ngroups=1,
        n_mamba_heads=32,
        intermediate_size=4096,
        hidden_act="gelu",
        num_attention_heads=16,
        num_key_value_heads=16,
        num_mem_blocks=1,
        use_shared_attention_adapter=False,
        adapter_rank=128,
        use_mem_rope=True,
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
        rms_norm_eps=1e-5,
        max_position_embeddings=4096,
        tie_word_embeddings=True,
        bos_token_id=0,
        eos_token_id=0,
        pad_token_id=1,
    )


def build(name: str):
    import torch
    from transformers import GraniteMoeHybridForCausalLM, Mamba2ForCausalLM, MambaForCausalLM

    if name in ("qwen35-0.8b-like", "qwen35-0.8b-mtp-like"):
        from transformers import Qwen3_5ForCausalLM

        cfg = qwen35_config()
        cls = Qwen3_5ForCausalLM
    elif name == "qwen35moe-1b-like":
        from transformers import Qwen3_5MoeForCausalLM

        cfg = qwen35moe_config()
        cls = Qwen3_5MoeForCausalLM
    elif name == "qwen35moe-35b-a3b-like":
        from transformers import Qwen3_5MoeForCausalLM

        cfg = qwen35moe_35b_a3b_config()
        cls = Qwen3_5MoeForCausalLM
    elif name == "lfm2-1.2b-like":
        from transformers import Lfm2ForCausalLM

        cfg = lfm2_config()
        cls = Lfm2ForCausalLM
    elif name == "lfm2-350m-like":
        from transformers import Lfm2ForCausalLM

        cfg = lfm2_350m_config()
        cls = Lfm2ForCausalLM
    elif name == "lfm3-350m-like":
        from transformers import Lfm3ForCausalLM

        cfg = lfm3_350m_config()
        cls = Lfm3ForCausalLM
    elif name == "zamba2-370m-like":
        from transformers import Zamba2ForCausalLM

        cfg = zamba2_370m_config()
        cls = Zamba2ForCausalLM
    elif name == "mamba2-370m-like":
        cfg = mamba2_config()
        cls = Mamba2ForCausalLM
    elif name == "mamba-370m-like":
        cfg = mamba1_config()
        cls = MambaForCausalLM
    else:
        cfg = hybrid_config()
        cls = GraniteMoeHybridForCausalLM
    model = cls(cfg).float().eval()
    d = cfg.hidden_size
    # Kept at transformers' init: the SSM parameters (Mamba-1's dt_proj too:
    # its bias sets dt's range), LFM2's short-conv kernels.
    keep = ("A_log", "dt_bias", ".D", "conv1d", "dt_proj", "conv.conv")
    with torch.no_grad():
        for pname, p in model.named_parameters():
            if any(k in pname for k in keep):
                continue
            if "embed" in pname or "embedding" in pname:
                p.normal_(0.0, 4.0 / d**0.5)
            elif p.ndim in (2, 3):  # (out, in), or fused experts (n, out, in)
                p.normal_(0.0, 1.0 / p.shape[-1] ** 0.5)
            elif pname.endswith("norm.weight") or "norm" in pname:
                p.fill_(1.0)
            elif "bias" in pname:
                p.zero_()
            # Everything f16-representable (A_log is then saved as f32).
            p.copy_(p.half().float())
    return model


def mtp_tensors(model) -> dict:
    """One MTP block for a Qwen3.5 model, in the checkpoint's names, drawn
    as `build` draws the trunk (matrices N(0, 1/fan_in), norms as the
    trunk's, f16-representable); its decoder layer is shaped like the
    trunk's first full-attention layer."""
    import torch

    cfg = model.config
    d = cfg.hidden_size
    attn = cfg.layer_types.index("full_attention")
    prefix = f"model.layers.{attn}."
    trunk = model.state_dict()
    norm = trunk["model.norm.weight"]
    out = {
        "mtp.fc.weight": torch.empty(d, 2 * d),
        "mtp.pre_fc_norm_embedding.weight": torch.empty_like(norm),
        "mtp.pre_fc_norm_hidden.weight": torch.empty_like(norm),
        "mtp.norm.weight": torch.empty_like(norm),
    }
    for name, t in trunk.items():
        if name.startswith(prefix):
            out["mtp.layers.0." + name[len(prefix) :]] = torch.empty_like(t)
    with torch.no_grad():
        for name, t in out.items():
            if "norm" in name:
                src = trunk.get(prefix + name[len("mtp.layers.0.") :], norm)
                t.copy_(src)
            elif t.ndim == 2:
                t.normal_(0.0, 1.0 / t.shape[-1] ** 0.5)
            else:
                t.zero_()
            t.copy_(t.half().float())
    return {k: v.half().contiguous() for k, v in out.items()}


def save(model, out: Path, tokenizer: Path, mtp: bool = False):
    import torch

    out.mkdir(parents=True, exist_ok=True)
    model = model.half()
    for pname, p in model.named_parameters():
        if pname.endswith("A_log"):
            p.data = p.data.to(torch.float32)
    # The tensors themselves, written directly: save_pretrained's checks on
    # tied weights differ between transformers versions. A tied lm_head is
    # left out, as save_pretrained does.
    from safetensors.torch import save_file

    tensors = {}
    seen = set()
    for pname, t in model.state_dict().items():
        if pname == "lm_head.weight" and model.config.tie_word_embeddings:
            continue
        # A tied copy (Zamba2's later uses of a shared block) is kept once,
        # under its first name, as save_pretrained keeps it.
        if t.data_ptr() in seen:
            continue
        seen.add(t.data_ptr())
        tensors[pname] = t.contiguous()
    if mtp:
        tensors.update(mtp_tensors(model))
    save_file(tensors, str(out / "model.safetensors"), metadata={"format": "pt"})
    model.config.save_pretrained(out)
    if hasattr(model, "generation_config") and model.generation_config is not None:
        model.generation_config.save_pretrained(out)
    cfg_path = out / "config.json"
    cfg = json.loads(cfg_path.read_text())
    cfg["architectures"] = [type(model).__name__]
    cfg["dtype"] = "float16"
    if mtp:
        cfg["mtp_num_hidden_layers"] = 1
    if "layer_types" in cfg and cfg.get("model_type") == "granitemoehybrid":
        spell = {"linear_attention": "mamba", "full_attention": "attention"}
        cfg["layer_types"] = [spell.get(t, t) for t in cfg["layer_types"]]
    cfg_path.write_text(json.dumps(cfg, indent=2) + "\n")
    save_tokenizer(out, tokenizer)


def save_tokenizer(out: Path, tokenizer: Path):
    """The GPT-NeoX tokenizer and its config beside a checkpoint."""
    shutil.copyfile(tokenizer, out / "tokenizer.json")
    (out / "tokenizer_config.json").write_text(
        json.dumps(
            {
                "tokenizer_class": "GPTNeoXTokenizerFast",
                "bos_token": "<|endoftext|>",
                "eos_token": "<|endoftext|>",
                "unk_token": "<|endoftext|>",
                "pad_token": "<|padding|>",
                "add_bos_token": False,
                "add_eos_token": False,
                "model_max_length": 1000000,
            },
            indent=2,
        )
        + "\n"
    )


# The shapes written tensor by tensor (too large to build in memory):
# config, tensor list, released config keys.
STREAMED = {
    "kimi-linear-48b-a3b-like": (kimi_linear_48b_a3b_config, kimi_linear_tensors, lambda cfg: KIMI_RELEASED_EXTRA),
    "ling3-flash-like": (ling3_flash_config, ling3_tensors, ling3_released_extra),
}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tokenizer", type=Path, required=True, help="the GPT-NeoX-20B tokenizer.json")
    ap.add_argument("--out", type=Path, default=REPO.parent / "bench-models")
    ap.add_argument("--only", nargs="*", choices=MODELS, default=list(DEFAULT_MODELS))
    ap.add_argument("--seed", type=int, default=1234)
    ap.add_argument("--force", action="store_true", help="rebuild models that already exist")
    a = ap.parse_args()

    import torch

    if not a.tokenizer.is_file():
        sys.exit(f"error: tokenizer {a.tokenizer} not found")
    out_root = a.out.resolve()
    if out_root == REPO or REPO in out_root.parents:
        sys.exit(f"error: --out {out_root} is inside the repository; put it outside")
    for i, name in enumerate(a.only):
        out = out_root / name / "hf"
        if (out / "model.safetensors").is_file() and not a.force:
            print(f"{name}: {out} exists (--force rebuilds it)")
            continue
        if name in STREAMED:
            cfg, tensors, extra = STREAMED[name]
            cfg = cfg()
            n = save_streamed(cfg, tensors(cfg), extra(cfg), out, a.tokenizer, a.seed + i)
            print(f"{name}: {n / 1e6:.1f} M parameters -> {out}")
            continue
        torch.manual_seed(a.seed + i)
        model = build(name)
        n = sum(p.numel() for p in model.parameters())
        save(model, out, a.tokenizer, mtp=name.endswith("-mtp-like"))
        print(f"{name}: {n / 1e6:.1f} M parameters -> {out}")


if __name__ == "__main__":
    main()
