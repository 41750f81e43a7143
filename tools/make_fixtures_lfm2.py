#!/usr/bin/env python3
"""Build the LFM2 / LFM2-MoE parity fixtures in tests/fixtures/parity/.

Run by hand (the outputs are committed):

    PYTHON=/path/to/python-with-torch-transformers
    $PYTHON tools/make_fixtures_lfm2.py --llama-cpp LLAMA_CPP_TREE [--out DIR] [--only NAME...]

LLAMA_CPP_TREE is a llama.cpp source tree (the one vendored in the
llama-cpp-python 0.3.36 sdist was used): its `convert_hf_to_gguf.py` writes
`model.gguf`. Needs torch, transformers (5.x), safetensors, numpy, gguf
(llama.cpp's gguf-py is put on the path).

For each model below this script

1. builds a tiny random-weight `Lfm2ForCausalLM` / `Lfm2MoeForCausalLM`
   (fixed seed; every matrix N(0, 1/fan_in), fused expert tensors included;
   tied embeddings N(0, (4/sqrt(hidden))^2) so that the logits have std ~4,
   untied embeddings N(0, 1) with lm_head N(0, 16/hidden); norm weights
   1 + 0.3 N (q/k norms too); the short-conv kernel 0.7 N, far from an
   identity; LFM2-MoE's expert bias (a buffer, used to choose experts only)
   0.3 N), every value rounded to an f16-representable one;
2. saves it with `save_pretrained` (float16; the values are f16-exact) with
   the fixture vocabulary as `hf/` (tokenizer.json: the 4096-token GPT-NeoX
   fixture tokenizer of tests/fixtures/hf/mamba cut to its first 1024 ids and
   the merges among them, as tools/make_fixtures.py does);
3. converts `hf/` with llama.cpp's own convert_hf_to_gguf.py
   (`--outtype f32`) to `model.gguf`. One shim: the converter identifies a
   BPE pre-tokenizer by a hash of the token ids of a test string and refuses
   the cut vocabulary's; it is named `olmo`, the name llama.cpp gives the
   full NeoX tokenizer (as for every other fixture). Nothing else of the
   converter is changed: its LFM2 classes run as they are with
   transformers 5.
4. stores transformers' float32 logits for `tokens.json` (the 37 ids of the
   other parity fixtures) as `logits.npy` [37, 1024]: one forward from an
   empty cache, `use_cache=False`, explicit position_ids 0..36,
   deterministic algorithms, transformers' pure-torch conv path (no
   causal_conv1d installed).

The script also reports how much the expert bias and the conv kernel matter
(the logits with the bias zeroed, and with the kernel replaced by an
identity), so that a loader that ignores them cannot pass.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import math
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parent.parent
N_VOCAB = 1024

MODELS = {
    # Dense LFM2: conv layers 0, 1, 3, 5 (window 3, as the released
    # models), attention at 2 and 4 (4 heads, 2 KV heads, head_dim 12,
    # NeoX RoPE θ 1e4); SwiGLU whose width the converter adjusts like
    # transformers: int(2 · 100 / 3) = 66, times 1.0, rounded up to a
    # multiple of 16 = 80; untied (`output.weight`; the released models
    # are tied, as the MoE fixture below).
    "lfm2_small": dict(
        cls="Lfm2ForCausalLM",
        seed=1611,
        config=dict(
            vocab_size=N_VOCAB,
            hidden_size=48,
            intermediate_size=100,
            block_auto_adjust_ff_dim=True,
            block_ffn_dim_multiplier=1.0,
            block_multiple_of=16,
            num_hidden_layers=6,
            layer_types=["conv", "conv", "full_attention", "conv", "full_attention", "conv"],
            num_attention_heads=4,
            num_key_value_heads=2,
            conv_L_cache=3,
            conv_bias=False,
            norm_eps=1e-5,
            rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
            max_position_embeddings=4096,
            tie_word_embeddings=False,
            bos_token_id=0,
            eos_token_id=0,
            pad_token_id=1,
        ),
    ),
    # LFM2-MoE: 2 leading dense layers, then MoE (8 experts, top-3, SwiGLU
    # 24, sigmoid router, expert bias for choosing, weights renormalised);
    # conv window 4 (not the released 3, to test the general case) at
    # 0, 2, 3, 5, attention at 1 and 4 (4 heads, 1 KV head, head_dim 8);
    # tied (llama.cpp's converter has no `output` tensor for lfm2moe).
    "lfm2moe_small": dict(
        cls="Lfm2MoeForCausalLM",
        seed=1602,
        config=dict(
            vocab_size=N_VOCAB,
            hidden_size=32,
            intermediate_size=64,
            moe_intermediate_size=24,
            num_hidden_layers=6,
            layer_types=["conv", "full_attention", "conv", "conv", "full_attention", "conv"],
            num_dense_layers=2,
            num_experts=8,
            num_experts_per_tok=3,
            use_expert_bias=True,
            norm_topk_prob=True,
            routed_scaling_factor=1.0,
            num_attention_heads=4,
            num_key_value_heads=1,
            conv_L_cache=4,
            conv_bias=False,
            norm_eps=1e-5,
            rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
            max_position_embeddings=4096,
            tie_word_embeddings=True,
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
            elif name.endswith("norm.weight") or name.endswith("layernorm.weight"):
                p.copy_(1.0 + 0.3 * randn(p.shape))
            elif p.dim() >= 2:
                p.copy_(randn(p.shape) / math.sqrt(p.shape[-1]))
            else:
                raise ValueError(f"no init rule for {name} {tuple(p.shape)}")
            p.copy_(p.half().float())
        for name, b in model.named_buffers():
            if name.endswith("expert_bias"):
                b.copy_((0.3 * randn(b.shape)).half().float())
    return model


def reference_logits(model, ids: list[int]) -> np.ndarray:
    import torch

    with torch.no_grad():
        out = model(torch.tensor([ids]), position_ids=torch.arange(len(ids))[None], use_cache=False)
    logits = out.logits[0].float().numpy()
    assert logits.shape == (len(ids), N_VOCAB)
    return np.ascontiguousarray(logits, dtype="<f4")


def sensitivity(model, ids, logits) -> str:
    """How far the logits move without the expert bias / with an identity conv."""
    import torch

    notes = []
    scale = np.abs(logits).max()
    with torch.no_grad():
        saved = {n: b.clone() for n, b in model.named_buffers() if n.endswith("expert_bias")}
        if saved:
            for n, b in model.named_buffers():
                if n in saved:
                    b.zero_()
            d = np.abs(reference_logits(model, ids) - logits).max() / scale
            notes.append(f"expert bias zeroed: max rel change {d:.3f}")
            for n, b in model.named_buffers():
                if n in saved:
                    b.copy_(saved[n])
        convs = {n: p.clone() for n, p in model.named_parameters() if n.endswith("conv.conv.weight")}
        for n, p in model.named_parameters():
            if n in convs:
                p.zero_()
                p[:, :, -1] = 1.0
        d = np.abs(reference_logits(model, ids) - logits).max() / scale
        notes.append(f"identity conv kernel: max rel change {d:.3f}")
        for n, p in model.named_parameters():
            if n in convs:
                p.copy_(convs[n])
    assert np.array_equal(reference_logits(model, ids), logits)
    return "; ".join(notes)


def save_hf(model, out: Path, tokenizer) -> None:
    import torch

    if out.exists():
        shutil.rmtree(out)
    model.to(torch.float16).save_pretrained(out)
    model.float()
    tokenizer.save(str(out / "tokenizer.json"))
    shutil.copy(REPO / "tests/fixtures/hf/mamba/tokenizer_config.json", out / "tokenizer_config.json")


def convert(llama_cpp: Path, hf: Path, gguf_out: Path) -> None:
    shim = f"""
import sys, runpy
sys.path.insert(0, {str(llama_cpp / 'gguf-py')!r}); sys.path.insert(0, {str(llama_cpp)!r})
import conversion.base as b
b.TextModel.get_vocab_base_pre = lambda self, tok: "olmo"
sys.argv = [{str(llama_cpp / 'convert_hf_to_gguf.py')!r}] + sys.argv[1:]
runpy.run_path({str(llama_cpp / 'convert_hf_to_gguf.py')!r}, run_name='__main__')
"""
    with tempfile.TemporaryDirectory() as d:
        p = Path(d) / "convert_shim.py"
        p.write_text(shim)
        r = subprocess.run(
            [sys.executable, str(p), str(hf), "--outtype", "f32", "--outfile", str(gguf_out)],
            capture_output=True,
            text=True,
        )
    if r.returncode != 0:
        raise SystemExit(f"llama.cpp's converter failed:\n{r.stderr[-3000:]}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--llama-cpp", type=Path, required=True, help="llama.cpp source tree")
    ap.add_argument("--out", type=Path, default=REPO / "tests/fixtures/parity", help="output folder")
    ap.add_argument("--only", nargs="*", metavar="NAME", help="make only these fixtures")
    args = ap.parse_args()

    sys.path.insert(0, str(args.llama_cpp / "gguf-py"))  # its gguf reader, for the vocabulary
    mf = load_make_fixtures()
    mf.check_torch_path()
    if importlib.util.find_spec("causal_conv1d") is not None:
        raise SystemExit("causal_conv1d is installed: uninstall it so transformers uses its torch path")
    import torch
    import transformers
    from importlib.metadata import version

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
        notes = sensitivity(model, ids, logits)
        np.save(out / "logits.npy", logits)
        (out / "tokens.json").write_text(json.dumps(ids) + "\n")
        save_hf(model, out / "hf", tokenizer)
        convert(args.llama_cpp, out / "hf", out / "model.gguf")
        top2 = np.sort(logits, axis=1)[:, -2:]
        print(
            f"{name}: {sum(p.numel() for p in model.parameters())} params, "
            f"logits std {logits.std():.2f}, max|logit| {np.abs(logits).max():.2f}, "
            f"{len(set(logits.argmax(1).tolist()))} distinct argmax, "
            f"min top-2 gap {(top2[:, 1] - top2[:, 0]).min():.4f}, "
            f"gguf {(out / 'model.gguf').stat().st_size} bytes; {notes}"
        )
    print(
        f"versions: torch {torch.__version__}, transformers {transformers.__version__}, "
        f"numpy {np.__version__}"
    )


if __name__ == "__main__":
    main()
