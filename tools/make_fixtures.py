#!/usr/bin/env python3
"""Build the tiny parity fixtures in tests/fixtures/parity/.

Run by hand (the outputs are committed):

    pip install torch transformers safetensors gguf numpy
    python3 tools/make_fixtures.py [--shared PATH] [--out DIR]

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


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--shared", type=Path, default=REPO.parent / "shared", help="shared data folder")
    ap.add_argument("--out", type=Path, default=REPO / "tests/fixtures/parity", help="output folder")
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
        out = args.out / name
        out.mkdir(parents=True, exist_ok=True)
        model = build_model(spec)
        assert next(model.parameters()).device.type == "cpu" and not model.training
        logits = reference_logits(model, ids)
        # A second forward must be bit-identical (deterministic reference).
        assert np.array_equal(logits, reference_logits(model, ids))
        np.save(out / "logits.npy", logits)
        (out / "tokens.json").write_text(json.dumps(ids) + "\n")
        model.config.to_json_file(out / "config.json", use_diff=False)
        write_gguf(out / "model.gguf", name, model, vocab)
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
