#!/usr/bin/env python3
"""Build the tiny parity fixtures in tests/fixtures/parity/.

Run by hand (the outputs are committed):

    pip install torch transformers safetensors gguf numpy
    python3 tools/make_fixtures.py [--shared PATH] [--out DIR] [--only NAME...]

`--shared` is the project's shared data folder (default: `shared/` beside the
repository); it supplies the Tiny Shakespeare corpus and the 4096-token
fixture tokenizer (data/fixtures/mamba2/hf/tokenizer.json). The GGUF
vocabulary is read from the repository's own
tests/fixtures/models/mamba2/model.f16.gguf. `--out` defaults to
tests/fixtures/parity/ under the repository root.

For each model below this script

1. builds a random-weight Hugging Face model with transformers (fixed seed;
   init as in the shared fixtures README: every matrix N(0, 1/fan_in),
   embeddings scaled so the logits have std ~4, norm weights 1 + 0.1 N,
   SSM D 1 + 0.2 N, conv biases 0.1 N; A_log, dt_bias / dt_proj.bias and
   conv1d weights at transformers' own init);
2. rounds every parameter to an f16-representable value, but keeps float32
   everywhere afterwards: the GGUF tensors are all F32 (file type ALL_F32,
   as `convert_hf_to_gguf.py --outtype f32` writes them), so an engine that
   computes in f32 can match the reference to ~1e-6 relative; the rounding
   only keeps the door open to an exact f16 conversion of the same weights;
3. writes `model.gguf` the way llama.cpp's convert_hf_to_gguf.py writes arch
   `mamba` / `mamba2` (metadata keys, key order and types, tensor names via
   gguf's own TensorNameMap, A stored as -exp(A_log) computed in f32, conv1d
   squeezed to ne (d_conv, channels), Mamba-2 A and D as ne (1, n_head),
   Mamba-2 ssm_norm as ne (d_inner / n_groups, n_groups), output.weight only
   when untied), with a 1024-token cut of the fixture vocabulary;
4. stores transformers' float32 logits for `tokens.json` (one forward from an
   empty state, use_cache=False, deterministic algorithms, CPU torch path:
   no mamba_ssm / causal_conv1d / kernels package may be importable) as
   `logits.npy` [n_tokens, 1024] and the HF config as `config.json`.

The hybrids (Bamba / GraniteMoeHybrid -> `granitehybrid`, Nemotron-H ->
`nemotron_h` / `nemotron_h_moe`, Jamba -> `jamba`) go the same way, except
that their GGUF tensors come from the checkpoint layout save_pretrained
writes (what convert_hf_to_gguf.py reads: per-expert tensors stacked,
Granite's fused input_linear split into gate / up, Q/K rows permuted into
ggml's adjacent-pair RoPE order), their metadata keys, key order and types
are those of llama.cpp's conversions in tests/fixtures/models/<arch>, and
their reference forward passes position_ids 0..n-1. Where llama.cpp's
converter is known to be wrong (ARCHITECTURE.md, "GGUF conventions") the
files are what it should write:

- `bamba_partial_rope`: only the first rope.dimension_count rows of each Q/K
  head are permuted (llama.cpp permutes the whole head), and the file carries
  `coil.rope.partial_permute` = true so that coil doesn't "fix" it;
- `granitemoehybrid_rope`: `rope.scaling.finetuned` true (llama.cpp writes
  false for every hybrid GraniteMoeHybrid, dropping its RoPE) and the model's
  own context length;
- `nemotron_h_mixed`: the dense layer's per-layer `feed_forward_length` is
  its width (llama.cpp writes 0 when the pattern also has MoE layers);
- `nemotron_h_no_attn` (no attention layer) and `jamba_small` need no fix,
  llama.cpp's runtime just refuses the first; their converter output is
  mirrored.

Nemotron-H's time_step_min is set to 0 after construction (its dt_bias init
needs a positive one) on the config and on every mixer, which copies it into
its dt clamp when built.

One deliberate departure from the converter: llama.cpp's converter asserts
d_inner == 2 * d_model for Mamba and Mamba-2 and would refuse `mamba_dstate8`
(expand 3) and `mamba2_g4_hd24` (expand 3); the GGUF format and llama.cpp's
runtime take d_inner from `ssm.inner_size`, so these files are what the
converter would write without that early check.

Everything is seeded; rerunning with the same torch / transformers / gguf
versions reproduces the files (README.md in the output folder records them).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import math
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parent.parent
N_VOCAB = 1024
N_TOKENS = 37  # not a multiple of the chunk size (8) nor of the test's ubatch 7
# Tiny Shakespeare passage (the shared fixtures' passage and what follows it).
PASSAGE_OFFSET = 154470
PASSAGE_BYTES = 400

MODELS = {
    "mamba_dstate8": dict(
        cls="MambaForCausalLM",
        seed=1001,
        config=dict(
            vocab_size=N_VOCAB,
            hidden_size=32,
            expand=3,  # d_inner 96
            state_size=8,
            time_step_rank=5,
            conv_kernel=3,
            num_hidden_layers=3,
            use_conv_bias=True,
            use_bias=False,
            tie_word_embeddings=True,
            layer_norm_epsilon=1e-5,
            bos_token_id=0,
            eos_token_id=0,
            pad_token_id=1,
            use_mambapy=False,
            # transformers' dt init, over a wider range than its default
            # [0.001, 0.1]: with the default the selective scan barely moves
            # the logits (a 1 % change of A moved them by < 1e-4 relative)
            time_step_min=0.01,
            time_step_max=1.0,
        ),
    ),
    "mamba2_g4_hd24": dict(
        cls="Mamba2ForCausalLM",
        seed=1002,
        config=dict(
            vocab_size=N_VOCAB,
            hidden_size=64,
            expand=3,  # d_inner 192 = 8 heads x 24
            num_heads=8,
            head_dim=24,
            n_groups=4,
            state_size=12,
            conv_kernel=4,
            chunk_size=8,
            num_hidden_layers=2,
            use_conv_bias=True,
            use_bias=False,
            tie_word_embeddings=False,
            time_step_limit=(0.0, float("inf")),
            layer_norm_epsilon=1e-5,
            bos_token_id=0,
            eos_token_id=0,
            pad_token_id=1,
        ),
    ),
    "mamba2_g1_hd16": dict(
        cls="Mamba2ForCausalLM",
        seed=1003,
        config=dict(
            vocab_size=N_VOCAB,
            hidden_size=32,
            expand=2,  # d_inner 64 = 4 heads x 16
            num_heads=4,
            head_dim=16,
            n_groups=1,
            state_size=24,
            conv_kernel=2,
            chunk_size=8,
            num_hidden_layers=3,
            use_conv_bias=True,
            use_bias=False,
            tie_word_embeddings=True,
            time_step_limit=(0.0, float("inf")),
            layer_norm_epsilon=1e-5,
            bos_token_id=0,
            eos_token_id=0,
            pad_token_id=1,
        ),
    ),
}


# Hybrids (attention + SSM) whose llama.cpp conversion is known-wrong or
# missing; "fix" names what the GGUF does beyond llama.cpp's converter.
INF = float("inf")
MODELS.update(
    {
        # Bamba, partial RoPE (8 of head_dim 16), correctly converted: only the
        # first rope.dimension_count rows of each Q/K head are permuted, and the
        # file says so (`coil.rope.partial_permute`).
        "bamba_partial_rope": dict(
            cls="BambaForCausalLM",
            seed=2004,
            config=dict(
                vocab_size=N_VOCAB,
                hidden_size=48,
                num_hidden_layers=5,
                attn_layer_indices=[1, 4],
                num_attention_heads=3,  # head_dim 16
                num_key_value_heads=1,
                attn_rotary_emb=8,  # transformers hard-codes partial_rotary_factor 0.5
                rope_parameters=dict(rope_type="default", rope_theta=20000.0),
                intermediate_size=32,
                mamba_n_heads=6,
                mamba_d_head=16,  # d_inner 96 = expand 2 x 48
                mamba_expand=2,
                mamba_n_groups=1,
                mamba_d_state=16,
                mamba_d_conv=4,
                mamba_chunk_size=8,
                mamba_conv_bias=True,
                mamba_proj_bias=False,
                max_position_embeddings=4096,
                rms_norm_eps=1e-5,
                tie_word_embeddings=True,
                time_step_limit=(0.0, INF),
                bos_token_id=0,
                eos_token_id=0,
                pad_token_id=1,
            ),
        ),
        # GraniteMoeHybrid with `position_embedding_type: rope` (full rotary
        # over head_dim 10), MoE top-2 of 4 + shared expert, multipliers != 1.
        "granitemoehybrid_rope": dict(
            cls="GraniteMoeHybridForCausalLM",
            seed=1005,
            logit_div=2.5,
            config=dict(
                vocab_size=N_VOCAB,
                hidden_size=40,
                num_hidden_layers=5,
                layer_types=[
                    "full_attention",
                    "linear_attention",
                    "linear_attention",
                    "full_attention",
                    "linear_attention",
                ],
                num_attention_heads=4,  # head_dim 10
                num_key_value_heads=2,
                position_embedding_type="rope",
                rope_parameters=dict(rope_type="default", rope_theta=10000.0),
                intermediate_size=16,
                num_local_experts=4,
                num_experts_per_tok=2,
                shared_intermediate_size=32,
                embedding_multiplier=6.0,
                residual_multiplier=0.5,
                attention_multiplier=0.1,
                logits_scaling=2.5,
                mamba_n_heads=4,
                mamba_d_head=20,  # d_inner 80
                mamba_expand=2,
                mamba_n_groups=2,
                mamba_d_state=20,
                mamba_d_conv=3,
                mamba_chunk_size=8,
                mamba_conv_bias=True,
                mamba_proj_bias=False,
                max_position_embeddings=4096,
                rms_norm_eps=1e-5,
                # untied: with tied embeddings scaled by 6 the logits would be
                # dominated by each token's own embedding
                tie_word_embeddings=False,
                time_step_limit=(0.0, INF),
                bos_token_id=0,
                eos_token_id=0,
                pad_token_id=1,
            ),
        ),
        # Nemotron-H mixing a dense relu^2 MLP (-) and MoE (E) layers, with
        # attention (head_dim 12, GQA 4:2).
        "nemotron_h_mixed": dict(
            cls="NemotronHForCausalLM",
            seed=1006,
            config=dict(
                vocab_size=N_VOCAB,
                hidden_size=32,
                hybrid_override_pattern="M-E*M",
                mamba_num_heads=8,
                mamba_head_dim=8,  # d_inner 64
                n_groups=4,
                ssm_state_size=12,
                conv_kernel=3,
                chunk_size=8,
                use_conv_bias=True,
                use_bias=False,
                num_attention_heads=4,
                num_key_value_heads=2,
                head_dim=12,
                intermediate_size=48,
                n_routed_experts=5,
                num_experts_per_tok=2,
                moe_intermediate_size=16,
                moe_shared_expert_intermediate_size=24,
                n_shared_experts=1,
                n_group=1,
                topk_group=1,
                norm_topk_prob=False,
                routed_scaling_factor=1.5,
                layer_norm_epsilon=1e-5,
                tie_word_embeddings=False,
                time_step_limit=(0.0, INF),
                max_position_embeddings=4096,
                bos_token_id=0,
                eos_token_id=0,
                pad_token_id=1,
            ),
        ),
        # Nemotron-H without any attention layer.
        "nemotron_h_no_attn": dict(
            cls="NemotronHForCausalLM",
            seed=1007,
            config=dict(
                vocab_size=N_VOCAB,
                hidden_size=32,
                hybrid_override_pattern="M-M-",
                mamba_num_heads=4,
                mamba_head_dim=16,  # d_inner 64
                n_groups=2,
                ssm_state_size=8,
                conv_kernel=4,
                chunk_size=8,
                use_conv_bias=True,
                use_bias=False,
                num_attention_heads=4,
                num_key_value_heads=2,
                head_dim=8,
                intermediate_size=80,
                layer_norm_epsilon=1e-5,
                tie_word_embeddings=False,
                time_step_limit=(0.0, INF),
                max_position_embeddings=4096,
                bos_token_id=0,
                eos_token_id=0,
                pad_token_id=1,
            ),
        ),
        # Jamba: attention at 1 and 4 (GQA 4:2), MoE top-2 of 4 at 1 and 3,
        # d_state 8, dt_rank 3, d_conv 3.
        "jamba_small": dict(
            cls="JambaForCausalLM",
            seed=1008,
            config=dict(
                vocab_size=N_VOCAB,
                hidden_size=32,
                num_hidden_layers=5,
                attn_layer_offset=1,
                attn_layer_period=3,
                expert_layer_offset=1,
                expert_layer_period=2,
                num_attention_heads=4,
                num_key_value_heads=2,
                intermediate_size=32,
                num_experts=4,
                num_experts_per_tok=2,
                mamba_expand=2,
                mamba_d_state=8,
                mamba_dt_rank=3,
                mamba_d_conv=3,
                mamba_conv_bias=True,
                mamba_proj_bias=False,
                use_mamba_kernels=False,
                max_position_embeddings=4096,
                rms_norm_eps=1e-6,
                tie_word_embeddings=True,
                bos_token_id=0,
                eos_token_id=0,
                pad_token_id=1,
            ),
        ),
    }
)


def check_torch_path() -> None:
    """The reference must be transformers' pure-torch forward, not a kernel."""
    for pkg in ("mamba_ssm", "causal_conv1d", "kernels", "mambapy"):
        if importlib.util.find_spec(pkg) is not None:
            raise SystemExit(f"{pkg} is installed: uninstall it so transformers uses its torch path")


# --------------------------------------------------------------------------
# Vocabulary


def read_vocab(gguf_path: Path) -> dict:
    """The fixture vocabulary (tokenizer.ggml.*), cut to ids < N_VOCAB."""
    import gguf

    r = gguf.GGUFReader(gguf_path)

    def get(key):
        return r.fields[key].contents()

    tokens = get("tokenizer.ggml.tokens")[:N_VOCAB]
    types = [int(t) for t in get("tokenizer.ggml.token_type")[:N_VOCAB]]
    kept = set(tokens)
    merges = []
    for m in get("tokenizer.ggml.merges"):
        a, b = m.split(" ")
        if a in kept and b in kept and (a + b) in kept:
            merges.append(m)
    assert get("tokenizer.ggml.model") == "gpt2" and get("tokenizer.ggml.pre") == "olmo"
    return dict(tokens=tokens, types=types, merges=merges)


def cut_hf_tokenizer(tokenizer_json: Path, vocab: dict):
    """The 4096-token HF fixture tokenizer cut to the same ids and merges."""
    from tokenizers import Tokenizer

    t = json.loads(tokenizer_json.read_text(encoding="utf-8"))
    m = t["model"]
    m["vocab"] = {k: v for k, v in m["vocab"].items() if v < N_VOCAB}
    merges = [" ".join(x) if isinstance(x, list) else x for x in m["merges"]]
    keep = set(vocab["merges"])
    m["merges"] = [x.split(" ") for x in merges if x in keep]
    assert len(m["merges"]) == len(vocab["merges"])
    assert all(m["vocab"][tok] == i for i, tok in enumerate(vocab["tokens"]))
    t["added_tokens"] = [a for a in t["added_tokens"] if a["id"] < N_VOCAB]
    return Tokenizer.from_str(json.dumps(t))


def make_tokens(shared: Path, vocab: dict) -> tuple[list[int], str]:
    tok = cut_hf_tokenizer(shared / "data/fixtures/mamba2/hf/tokenizer.json", vocab)
    raw = (shared / "data/corpus/tinyshakespeare.txt").read_bytes()
    text = raw[PASSAGE_OFFSET : PASSAGE_OFFSET + PASSAGE_BYTES].decode("utf-8")
    ids = tok.encode(text).ids[:N_TOKENS]
    assert len(ids) == N_TOKENS and max(ids) < N_VOCAB
    return ids, tok.decode(ids)


# --------------------------------------------------------------------------
# Model


def build_model(spec: dict):
    import torch
    import transformers

    cls = getattr(transformers, spec["cls"])
    config_cls = getattr(transformers, spec["cls"].replace("ForCausalLM", "Config"))
    config = config_cls(**spec["config"])
    config.architectures = [spec["cls"]]
    torch.manual_seed(spec["seed"])
    model = cls(config).float().eval()
    tied = config.tie_word_embeddings
    hidden = config.hidden_size
    if tied:
        assert model.lm_head.weight is model.backbone.embeddings.weight

    g = torch.Generator().manual_seed(spec["seed"])

    def randn(shape):
        return torch.randn(shape, generator=g, dtype=torch.float32)

    sigma = 4.0  # logits std ~ sigma: unit-rms hidden state times N(0, sigma^2 / hidden)
    with torch.no_grad():
        for name, p in model.named_parameters():  # tied weights appear once
            short = name.rsplit(".", 1)[-1]
            if name == "backbone.embeddings.weight":
                std = sigma / math.sqrt(hidden) if tied else 1.0
                p.copy_(randn(p.shape) * std)
            elif name == "lm_head.weight":
                p.copy_(randn(p.shape) * (sigma / math.sqrt(hidden)))
            elif short in ("A_log", "dt_bias") or name.endswith(("dt_proj.bias", "conv1d.weight")):
                pass  # transformers' own init
            elif name.endswith("conv1d.bias"):
                p.copy_(0.1 * randn(p.shape))
            elif short == "D":
                p.copy_(1.0 + 0.2 * randn(p.shape))
            elif name.endswith(("norm.weight", "norm_f.weight")):
                p.copy_(1.0 + 0.1 * randn(p.shape))
            elif p.dim() == 2:
                p.copy_(randn(p.shape) / math.sqrt(p.shape[1]))
            else:
                raise ValueError(f"no init rule for {name} {tuple(p.shape)}")
            # f16-representable values, kept in float32
            p.copy_(p.half().float())
    return model


def reference_logits(model, ids: list[int]) -> np.ndarray:
    import torch

    with torch.no_grad():
        out = model(torch.tensor([ids]), use_cache=False)
    logits = out.logits[0].float().numpy()
    assert logits.shape == (len(ids), N_VOCAB)
    return np.ascontiguousarray(logits, dtype="<f4")


# --------------------------------------------------------------------------
# GGUF, as convert_hf_to_gguf.py (MambaModel / Mamba2Model) writes it


def hf_tensors(model) -> list[tuple[str, "np.ndarray"]]:
    """(HF name, float32 tensor) in checkpoint (sorted) order, as save_pretrained
    would store them: a tied lm_head is not stored."""
    sd = model.state_dict()
    if model.config.tie_word_embeddings:
        sd.pop("lm_head.weight")
    return [(k, sd[k].detach().float()) for k in sorted(sd)]


def write_gguf(path: Path, name: str, model, vocab: dict) -> None:
    import gguf
    import torch

    cfg = model.config
    mamba2 = cfg.model_type == "mamba2"
    arch = gguf.MODEL_ARCH.MAMBA2 if mamba2 else gguf.MODEL_ARCH.MAMBA
    n_layer = cfg.num_hidden_layers
    d_inner = cfg.intermediate_size if not mamba2 else cfg.num_heads * cfg.head_dim
    n_group = cfg.n_groups if mamba2 else 1
    tmap = gguf.get_tensor_name_map(arch, n_layer)

    tensors = []
    for hf_name, t in hf_tensors(model):
        if hf_name.endswith(".dt_bias"):  # Mamba2Model.filter_tensors
            hf_name = hf_name.rpartition(".dt_bias")[0] + ".dt_proj.bias"
        new = tmap.get_name(hf_name, try_suffixes=(".weight", ".bias"))
        assert new is not None, hf_name
        if hf_name.endswith(".A_log"):
            t = -torch.exp(t)  # in float32, like transformers' A = -exp(A_log.float())
        if ".ssm_conv1d." in new:
            t = t.squeeze()
        elif mamba2 and new.endswith((".ssm_a", ".ssm_d")):
            t = t.reshape((*t.shape, 1))
        elif mamba2 and new.endswith(".ssm_norm.weight"):
            t = t.reshape((n_group, d_inner // n_group))
        tensors.append((new, np.ascontiguousarray(t.numpy(), dtype=np.float32)))

    n_params = sum(a.size for _, a in tensors)
    w = gguf.GGUFWriter(path, gguf.MODEL_ARCH_NAMES[arch])
    w.add_type(gguf.GGUFType.MODEL)
    w.add_name(name)
    w.add_size_label(gguf.size_label(n_params, 0, 0, 0))
    w.add_context_length(2**20)
    w.add_embedding_length(cfg.hidden_size)
    w.add_feed_forward_length(0)
    w.add_head_count(0)
    w.add_block_count(n_layer)
    w.add_ssm_conv_kernel(cfg.conv_kernel)
    w.add_ssm_inner_size(d_inner)
    w.add_ssm_state_size(cfg.state_size)
    w.add_ssm_time_step_rank(cfg.num_heads if mamba2 else cfg.time_step_rank)
    if mamba2:
        w.add_ssm_group_count(n_group)
    w.add_layer_norm_rms_eps(cfg.layer_norm_epsilon)
    if not mamba2:
        w.add_ssm_dt_b_c_rms(False)
    w.add_file_type(gguf.LlamaFileType.ALL_F32)
    w.add_quantization_version(gguf.GGML_QUANT_VERSION)
    add_tokenizer(w, vocab)
    for new, a in tensors:
        w.add_tensor(new, a)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()

    # Read back: every tensor bit-exact, ggml shapes as llama.cpp expects.
    r = gguf.GGUFReader(path)
    got = {t.name: t for t in r.tensors}
    assert list(got) == [n for n, _ in tensors]
    for new, a in tensors:
        t = got[new]
        assert t.tensor_type == gguf.GGMLQuantizationType.F32, new
        assert np.array_equal(np.asarray(t.data).reshape(a.shape), a), new
    H = cfg.hidden_size
    conv_ch = d_inner + 2 * n_group * cfg.state_size if mamba2 else d_inner
    ne = {t.name: tuple(int(x) for x in t.shape) for t in r.tensors}
    assert ne["token_embd.weight"] == (H, N_VOCAB)
    assert ne["blk.0.ssm_conv1d.weight"] == (cfg.conv_kernel, conv_ch)
    assert ne["blk.0.ssm_conv1d.bias"] == (conv_ch,)
    if mamba2:
        assert ne["blk.0.ssm_a"] == (1, cfg.num_heads) and ne["blk.0.ssm_d"] == (1, cfg.num_heads)
        assert ne["blk.0.ssm_norm.weight"] == (d_inner // n_group, n_group)
        assert ne["blk.0.ssm_dt.bias"] == (cfg.num_heads,)
        assert ne["blk.0.ssm_in.weight"] == (H, 2 * d_inner + 2 * n_group * cfg.state_size + cfg.num_heads)
    else:
        assert ne["blk.0.ssm_a"] == (cfg.state_size, d_inner) and ne["blk.0.ssm_d"] == (d_inner,)
        assert ne["blk.0.ssm_x.weight"] == (d_inner, cfg.time_step_rank + 2 * cfg.state_size)
        assert ne["blk.0.ssm_dt.weight"] == (cfg.time_step_rank, d_inner)
        assert ne["blk.0.ssm_in.weight"] == (H, 2 * d_inner)
    assert ne["blk.0.ssm_out.weight"] == (d_inner, H)
    assert ("output.weight" in ne) == (not cfg.tie_word_embeddings)



# --------------------------------------------------------------------------
# Hybrid models: Bamba / GraniteMoeHybrid (`granitehybrid`), Nemotron-H
# (`nemotron_h`, `nemotron_h_moe`), Jamba (`jamba`)


def is_hybrid(spec: dict) -> bool:
    return spec["cls"] not in ("MambaForCausalLM", "Mamba2ForCausalLM")


def build_hybrid_model(spec: dict):
    """As build_model, for the hybrid classes (their own parameter names).
    Tied embeddings get std sigma * logit_div / sqrt(hidden), so that the
    logits (divided by Granite's logits_scaling) have std ~ sigma."""
    import torch
    import transformers

    cls = getattr(transformers, spec["cls"])
    config_cls = getattr(transformers, spec["cls"].replace("ForCausalLM", "Config"))
    config = config_cls(**spec["config"])
    config.architectures = [spec["cls"]]
    torch.manual_seed(spec["seed"])
    model = cls(config).float().eval()
    if config.model_type == "nemotron_h":
        # transformers' chunked path clamps dt to time_step_min, llama.cpp
        # never does; 0 makes the two agree. Set after construction (its dt_bias
        # init needs min > 0) on the config and on every mixer, which copied
        # (time_step_min, inf) when it was built.
        config.time_step_min = 0.0
        mixers = [m for m in model.modules() if hasattr(m, "time_step_limit")]
        assert mixers
        for m in mixers:
            m.time_step_limit = (0.0, INF)
    tied = config.tie_word_embeddings
    hidden = config.hidden_size
    emb = model.get_input_embeddings().weight
    if tied:
        assert model.lm_head.weight is emb
    g = torch.Generator().manual_seed(spec["seed"])

    def randn(shape):
        return torch.randn(shape, generator=g, dtype=torch.float32)

    sigma = 4.0 * spec.get("logit_div", 1.0)
    with torch.no_grad():
        named = list(model.named_parameters()) + [
            (n, b) for n, b in model.named_buffers() if n.endswith("e_score_correction_bias")
        ]
        for name, p in named:
            short = name.rsplit(".", 1)[-1]
            if p is emb:
                # untied: unit-variance input after Granite's embedding multiplier
                std = sigma / math.sqrt(hidden) if tied else 1.0 / getattr(config, "embedding_multiplier", 1.0)
                p.copy_(randn(p.shape) * std)
            elif name == "lm_head.weight":
                p.copy_(randn(p.shape) * (sigma / math.sqrt(hidden)))
            elif short in ("A_log", "dt_bias") or name.endswith(("dt_proj.bias", "conv1d.weight")):
                pass  # transformers' own init
            elif name.endswith("conv1d.bias") or short == "e_score_correction_bias":
                p.copy_(0.1 * randn(p.shape))
            elif short == "D":
                p.copy_(1.0 + 0.2 * randn(p.shape))
            elif name.endswith(("norm.weight", "norm_f.weight")):
                p.copy_(1.0 + 0.1 * randn(p.shape))
            elif p.dim() >= 2:  # (out, in) or fused experts (n_expert, out, in)
                p.copy_(randn(p.shape) / math.sqrt(p.shape[-1]))
            else:
                raise ValueError(f"no init rule for {name} {tuple(p.shape)}")
            p.copy_(p.half().float())
    return model


def reference_logits_pos(model, ids: list[int]) -> np.ndarray:
    """reference_logits with explicit position_ids 0..n-1 (attention models)."""
    import torch

    with torch.no_grad():
        out = model(torch.tensor([ids]), position_ids=torch.arange(len(ids))[None], use_cache=False)
    logits = out.logits[0].float().numpy()
    assert logits.shape == (len(ids), N_VOCAB)
    return np.ascontiguousarray(logits, dtype="<f4")


def checkpoint_tensors(model) -> list[tuple[str, "torch.Tensor"]]:
    """(name, float32 tensor) as save_pretrained stores them (the checkpoint
    layout convert_hf_to_gguf.py reads: per-expert Jamba / Nemotron-H
    tensors, Granite's fused input_linear), in sorted order."""
    import tempfile

    from safetensors.torch import load_file

    with tempfile.TemporaryDirectory() as d:
        model.save_pretrained(d, safe_serialization=True)
        files = sorted(Path(d).glob("*.safetensors"))
        sd = {}
        for f in files:
            sd.update(load_file(f))
    return [(k, sd[k].float()) for k in sorted(sd)]


def permute_rows(w, n_head: int, n_rot: int):
    """llama.cpp's Q/K permutation (LlamaModel.permute): within each head,
    HF's rotate-half order of the first n_rot rows -> adjacent pairs; rows
    n_rot.. of each head stay in place. n_rot == head_dim is llama.cpp's
    converter exactly."""
    rows = w.shape[0]
    hd = rows // n_head
    w = w.reshape(n_head, hd, *w.shape[1:]).clone()
    rot = w[:, :n_rot]
    w[:, :n_rot] = rot.reshape(n_head, 2, n_rot // 2, *rot.shape[2:]).swapaxes(1, 2).reshape(rot.shape)
    return w.reshape(rows, *w.shape[2:])


def layer_kinds(cfg) -> list[str]:
    """Per layer 'attention' / 'ssm' / 'mlp' / 'moe' (Nemotron-H's block)."""
    n = cfg.num_hidden_layers
    if cfg.model_type == "bamba":
        return ["attention" if i in cfg.attn_layer_indices else "ssm" for i in range(n)]
    if cfg.model_type == "granitemoehybrid":
        return ["attention" if t in ("attention", "full_attention") else "ssm" for t in cfg.layer_types]
    if cfg.model_type == "jamba":
        return [
            "attention" if i >= cfg.attn_layer_offset and (i - cfg.attn_layer_offset) % cfg.attn_layer_period == 0 else "ssm"
            for i in range(n)
        ]
    if cfg.model_type == "nemotron_h":
        m = {"linear_attention": "ssm", "mamba": "ssm", "full_attention": "attention", "attention": "attention"}
        return [m.get(t, t) for t in cfg.layers_block_type]
    raise ValueError(cfg.model_type)


def hybrid_gguf_tensors(model, arch, kinds: list[str], partial_permute: bool):
    """Checkpoint tensors -> (GGUF name, float32 array), with the transforms of
    convert_hf_to_gguf.py (GraniteHybridModel, NemotronHModel, JambaModel)."""
    import gguf
    import torch

    cfg = model.config
    n_layer = cfg.num_hidden_layers
    tmap = gguf.get_tensor_name_map(arch, n_layer)
    mt = cfg.model_type
    if mt == "jamba":
        n_group = 1
        d_inner = cfg.mamba_expand * cfg.hidden_size
    elif mt == "nemotron_h":
        n_group = cfg.n_groups
        d_inner = cfg.mamba_num_heads * cfg.mamba_head_dim
    else:
        n_group = cfg.mamba_n_groups
        d_inner = cfg.mamba_n_heads * cfg.mamba_d_head
    n_head = cfg.num_attention_heads
    n_kv = cfg.num_key_value_heads
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // n_head
    n_rot = head_dim
    if mt == "bamba":
        n_rot = cfg.attn_rotary_emb
        if not partial_permute:
            n_rot = head_dim  # what llama.cpp's converter does

    out = []
    experts: dict[tuple[int, str], dict[int, "torch.Tensor"]] = {}

    def emit(hf_name, t):
        new = tmap.get_name(hf_name, try_suffixes=(".weight", ".bias"))
        assert new is not None, hf_name
        out.append((new, np.ascontiguousarray(t.numpy(), dtype=np.float32)))

    for name, t in checkpoint_tensors(model):
        parts = name.split(".")
        bid = int(parts[2]) if len(parts) > 2 and parts[1] == "layers" else None
        # Per-expert checkpoint tensors -> one stacked tensor per weight.
        if ".experts." in name:
            xid, wname = int(parts[-3]), parts[-2]
            n_exp = cfg.num_experts if mt == "jamba" else cfg.n_routed_experts
            group = experts.setdefault((bid, wname), {})
            group[xid] = t
            if len(group) == n_exp:
                stacked = torch.stack([group[i] for i in range(n_exp)])
                emit(f"model.layers.{bid}.mlp.experts.{wname}.weight", stacked)
            continue
        if name.endswith("block_sparse_moe.input_linear.weight"):  # granite: [gate | up]
            ff = cfg.intermediate_size
            gate, up = t.split(ff, dim=-2)
            out.append((f"blk.{bid}.ffn_gate_exps.weight", np.ascontiguousarray(gate.numpy())))
            out.append((f"blk.{bid}.ffn_up_exps.weight", np.ascontiguousarray(up.numpy())))
            continue
        if name.endswith("shared_mlp.input_linear.weight"):
            gate, up = t.split(cfg.shared_intermediate_size, dim=-2)
            out.append((f"blk.{bid}.ffn_gate_shexp.weight", np.ascontiguousarray(gate.numpy())))
            out.append((f"blk.{bid}.ffn_up_shexp.weight", np.ascontiguousarray(up.numpy())))
            continue
        if name.endswith(".dt_bias"):
            name = name[: -len(".dt_bias")] + ".dt_proj.bias"
        if name.endswith("e_score_correction_bias"):
            name = name[: -len("_bias")] + ".bias"
        if name.endswith(".A_log"):
            t = -torch.exp(t)
        if name.endswith("conv1d.weight"):
            t = t.squeeze()
        if mt != "jamba":
            if name.endswith((".A_log", ".D")):
                t = t.reshape(-1, 1)
            elif bid is not None and kinds[bid] == "ssm" and name.endswith("mixer.norm.weight" if mt == "nemotron_h" else "mamba.norm.weight"):
                t = t.reshape(n_group, d_inner // n_group)
            # LlamaModel.modify_tensors (undo_permute): Q/K of attention layers
            elif name.endswith("q_proj.weight"):
                t = permute_rows(t, n_head, n_rot)
            elif name.endswith("k_proj.weight"):
                t = permute_rows(t, n_kv, n_rot)
        emit(name, t)
    n_exp = getattr(cfg, "num_experts", None) if mt == "jamba" else getattr(cfg, "n_routed_experts", None)
    assert all(len(g) == n_exp for g in experts.values()), "unmerged experts"
    return out, dict(n_group=n_group, d_inner=d_inner, head_dim=head_dim, n_rot=n_rot)


def add_tokenizer(w, vocab: dict) -> None:
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("olmo")
    w.add_token_list(vocab["tokens"])
    w.add_token_types(vocab["types"])
    w.add_token_merges(vocab["merges"])
    w.add_bos_token_id(0)
    w.add_eos_token_id(0)
    w.add_unk_token_id(0)
    w.add_pad_token_id(1)
    w.add_add_bos_token(False)
    w.add_add_eos_token(False)


def write_hybrid_gguf(path: Path, name: str, model, vocab: dict) -> None:
    """Metadata keys (order and types) as llama.cpp's converter writes them for
    the shared fixtures of the same arch, with coil's fixes (see MODELS)."""
    import gguf

    cfg = model.config
    mt = cfg.model_type
    kinds = layer_kinds(cfg)
    n_layer = cfg.num_hidden_layers
    if mt in ("bamba", "granitemoehybrid"):
        arch = gguf.MODEL_ARCH.GRANITE_HYBRID
    elif mt == "jamba":
        arch = gguf.MODEL_ARCH.JAMBA
    elif "moe" in kinds:
        arch = gguf.MODEL_ARCH.NEMOTRON_H_MOE
    else:
        arch = gguf.MODEL_ARCH.NEMOTRON_H
    partial = mt == "bamba"
    tensors, dims = hybrid_gguf_tensors(model, arch, kinds, partial_permute=partial)

    w = gguf.GGUFWriter(path, gguf.MODEL_ARCH_NAMES[arch])
    for new, a in tensors:
        w.add_tensor(new, a)
    n_kv_vec = [cfg.num_key_value_heads if k == "attention" else 0 for k in kinds]
    w.add_type(gguf.GGUFType.MODEL)
    w.add_name(name)
    w.add_size_label(gguf.size_label(*w.get_total_parameter_count()))
    w.add_block_count(n_layer)
    if mt == "jamba":
        w.add_context_length(cfg.max_position_embeddings)
        w.add_embedding_length(cfg.hidden_size)
        w.add_feed_forward_length(cfg.intermediate_size)
        w.add_head_count(cfg.num_attention_heads)
        w.add_head_count_kv(n_kv_vec)
        w.add_ssm_conv_kernel(cfg.mamba_d_conv)
        w.add_ssm_inner_size(dims["d_inner"])
        w.add_ssm_state_size(cfg.mamba_d_state)
        w.add_ssm_time_step_rank(cfg.mamba_dt_rank)
        w.add_layer_norm_rms_eps(cfg.rms_norm_eps)
        w.add_expert_count(cfg.num_experts)
        w.add_expert_used_count(cfg.num_experts_per_tok)
        w.add_file_type(gguf.LlamaFileType.ALL_F32)
    elif mt == "nemotron_h":
        moe = arch == gguf.MODEL_ARCH.NEMOTRON_H_MOE
        # fix: a dense layer's n_ff is its own width (llama.cpp writes 0 there
        # when the pattern also has MoE layers)
        ff = [
            cfg.intermediate_size if k == "mlp" else cfg.moe_intermediate_size if k == "moe" else 0
            for k in kinds
        ]
        w.add_context_length(2**20)  # no RoPE: GraniteHybridModel writes 2**20
        w.add_embedding_length(cfg.hidden_size)
        w.add_feed_forward_length(ff)
        w.add_head_count(cfg.num_attention_heads)
        w.add_head_count_kv(n_kv_vec)
        w.add_layer_norm_eps(cfg.layer_norm_epsilon)
        if moe:
            w.add_expert_count(cfg.n_routed_experts)
            w.add_expert_used_count(cfg.num_experts_per_tok)
            w.add_expert_group_count(cfg.n_group)
            w.add_expert_group_used_count(cfg.topk_group)
        w.add_file_type(gguf.LlamaFileType.ALL_F32)
        w.add_vocab_size(N_VOCAB)
        w.add_rope_dimension_count(cfg.hidden_size // cfg.num_attention_heads)
        w.add_ssm_conv_kernel(cfg.conv_kernel)
        w.add_ssm_state_size(cfg.ssm_state_size)
        w.add_ssm_group_count(cfg.n_groups)
        w.add_ssm_inner_size(dims["d_inner"])
        w.add_ssm_time_step_rank(cfg.mamba_num_heads)
        w.add_rope_scaling_finetuned(False)
        w.add_key_length(cfg.head_dim)
        w.add_value_length(cfg.head_dim)
        if moe:
            w.add_expert_feed_forward_length(cfg.moe_intermediate_size)
            w.add_expert_shared_feed_forward_length(cfg.moe_shared_expert_intermediate_size)
            w.add_expert_shared_count(cfg.n_shared_experts)
            w.add_expert_weights_norm(cfg.norm_topk_prob)
            w.add_expert_weights_scale(cfg.routed_scaling_factor)
    else:  # granitehybrid
        moe = mt == "granitemoehybrid" and cfg.num_local_experts > 0
        # fix: RoPE on for GraniteMoeHybrid with position_embedding_type rope
        use_rope = mt == "bamba" or cfg.position_embedding_type == "rope"
        w.add_context_length(cfg.max_position_embeddings if use_rope else 2**20)
        w.add_embedding_length(cfg.hidden_size)
        w.add_feed_forward_length(cfg.intermediate_size)
        w.add_head_count(cfg.num_attention_heads)
        w.add_head_count_kv(n_kv_vec)
        w.add_rope_freq_base(cfg.rope_parameters["rope_theta"])
        w.add_layer_norm_rms_eps(cfg.rms_norm_eps)
        if moe:
            w.add_expert_count(cfg.num_local_experts)
            w.add_expert_used_count(cfg.num_experts_per_tok)
        w.add_file_type(gguf.LlamaFileType.ALL_F32)
        w.add_vocab_size(N_VOCAB)
        w.add_rope_dimension_count(cfg.attn_rotary_emb if mt == "bamba" else dims["head_dim"])
        if mt == "granitemoehybrid":
            w.add_attention_scale(cfg.attention_multiplier)
            w.add_embedding_scale(cfg.embedding_multiplier)
            w.add_residual_scale(cfg.residual_multiplier)
            w.add_logit_scale(cfg.logits_scaling)
            if moe:
                w.add_expert_shared_feed_forward_length(cfg.shared_intermediate_size)
        w.add_ssm_conv_kernel(cfg.mamba_d_conv)
        w.add_ssm_state_size(cfg.mamba_d_state)
        w.add_ssm_group_count(dims["n_group"])
        w.add_ssm_inner_size(dims["d_inner"])
        w.add_ssm_time_step_rank(cfg.mamba_n_heads)
        w.add_rope_scaling_finetuned(use_rope)
        if partial:
            # fix: only the rotary rows of each Q/K head are permuted
            w.add_bool("coil.rope.partial_permute", True)
    w.add_quantization_version(gguf.GGML_QUANT_VERSION)
    add_tokenizer(w, vocab)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()

    # Read back: every tensor bit-exact and F32, shapes as llama.cpp expects.
    r = gguf.GGUFReader(path)
    got = {t.name: t for t in r.tensors}
    assert list(got) == [n for n, _ in tensors]
    for new, a in tensors:
        t = got[new]
        assert t.tensor_type == gguf.GGMLQuantizationType.F32, new
        assert np.array_equal(np.asarray(t.data).reshape(a.shape), a), new
    ne = {t.name: tuple(int(x) for x in t.shape) for t in r.tensors}
    H = cfg.hidden_size
    assert ne["token_embd.weight"] == (H, N_VOCAB)
    assert ("output.weight" in ne) == (not cfg.tie_word_embeddings)
    hd = dims["head_dim"]
    for l, k in enumerate(kinds):
        if k == "attention":
            assert ne[f"blk.{l}.attn_q.weight"] == (H, cfg.num_attention_heads * hd)
            assert ne[f"blk.{l}.attn_k.weight"] == (H, cfg.num_key_value_heads * hd)
            assert ne[f"blk.{l}.attn_output.weight"] == (cfg.num_attention_heads * hd, H)
        elif k == "ssm" and mt != "jamba":
            nh = cfg.mamba_num_heads if mt == "nemotron_h" else cfg.mamba_n_heads
            assert ne[f"blk.{l}.ssm_a"] == (1, nh) and ne[f"blk.{l}.ssm_d"] == (1, nh)
            assert ne[f"blk.{l}.ssm_norm.weight"] == (dims["d_inner"] // dims["n_group"], dims["n_group"])
        elif k == "ssm":
            assert ne[f"blk.{l}.ssm_a"] == (cfg.mamba_d_state, dims["d_inner"])
        assert f"blk.{l}.attn_norm.weight" in ne


# --------------------------------------------------------------------------


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--shared", type=Path, default=REPO.parent / "shared", help="shared data folder")
    ap.add_argument("--out", type=Path, default=REPO / "tests/fixtures/parity", help="output folder")
    ap.add_argument("--only", nargs="*", metavar="NAME", help="make only these fixtures")
    args = ap.parse_args()

    check_torch_path()
    import gguf
    import torch
    import transformers
    from importlib.metadata import version

    torch.use_deterministic_algorithms(True)
    torch.set_num_threads(1)

    vocab = read_vocab(REPO / "tests/fixtures/models/mamba2/model.f16.gguf")
    ids, text = make_tokens(args.shared, vocab)
    print(f"vocab: {len(vocab['tokens'])} tokens, {len(vocab['merges'])} merges; {len(ids)} tokens: {text!r}")

    for name, spec in MODELS.items():
        if args.only and name not in args.only:
            continue
        out = args.out / name
        out.mkdir(parents=True, exist_ok=True)
        hybrid = is_hybrid(spec)
        model = build_hybrid_model(spec) if hybrid else build_model(spec)
        assert next(model.parameters()).device.type == "cpu" and not model.training
        ref = reference_logits_pos if hybrid else reference_logits
        logits = ref(model, ids)
        # A second forward must be bit-identical (deterministic reference).
        assert np.array_equal(logits, ref(model, ids))
        np.save(out / "logits.npy", logits)
        (out / "tokens.json").write_text(json.dumps(ids) + "\n")
        model.config.to_json_file(out / "config.json", use_diff=False)
        (write_hybrid_gguf if hybrid else write_gguf)(out / "model.gguf", name, model, vocab)
        top2 = np.sort(logits, axis=1)[:, -2:]
        print(
            f"{name}: {sum(p.numel() for p in model.parameters())} params, "
            f"logits std {logits.std():.2f}, max|logit| {np.abs(logits).max():.2f}, "
            f"{len(set(logits.argmax(1).tolist()))} distinct argmax, "
            f"min top-2 gap {(top2[:, 1] - top2[:, 0]).min():.4f}, "
            f"gguf {(out / 'model.gguf').stat().st_size} bytes"
        )

    print(
        f"versions: torch {torch.__version__}, transformers {transformers.__version__}, "
        f"gguf {version('gguf')}, numpy {np.__version__}"
    )


if __name__ == "__main__":
    main()
