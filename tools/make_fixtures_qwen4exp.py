#!/usr/bin/env python3
"""Build the Qwen4-Exp parity fixture `tests/fixtures/parity/qwen4exp_tiny`
(and its Hugging Face checkpoint `tests/fixtures/hf/qwen4exp_tiny`).

Run by hand (the outputs are committed), from the repository root:

    python3 tools/make_fixtures_qwen4exp.py --llama-cpp <llama.cpp source tree> \
        --convert-python <venv with transformers 4.57>/bin/python \
        [--shared PATH] [--llama-bin DIR]

Needs torch, transformers 5.25 (the first with Qwen4ExpForCausalLM),
safetensors, numpy, gguf. `--shared` is the project's shared data folder
(Tiny Shakespeare and the 4096-token fixture tokenizer, as for
tools/make_fixtures.py, whose vocabulary and token helpers this script
reuses: the same 1024-token cut).

The script

1. builds a tiny random-weight `Qwen4ExpForCausalLM` (fixed seed) with every
   layer kind: Gated DeltaNet layers (0, 2, 3) whose heads remember ~1-100
   tokens (A = exp(A_log) in [0.02, 0.6], dt_bias with spread, conv kernels
   far from identity, sigmoid output gate as the released model), indexed
   (QSA) attention layers (1, 4: 4 index heads of 16, blocks of 4 tokens, a
   budget of 8 tokens, so a query past 12 tokens attends to 2 of its
   complete blocks plus its tail: sparsity matters on the 40-token prompt),
   4 hyper-connection streams of rank 16 in place of every norm, the
   per-layer n-gram hash embedding (PLE: 2- and 3-grams, 4 heads each,
   tables of a few dozen rows, dilated conv of 4 taps) on layer 0, and a
   mixture of 4 experts (top 2) plus the gated shared expert in every layer;
   the zero-centred RMSNorm weights ((1 + w) x) around 0 with spread, every
   matrix N(0, 1/fan_in), every parameter rounded to an f16-representable
   value (kept in f32);
2. saves it with the cut tokenizer (`layer_types` written "full_attention"
   for the indexed layers, as the released checkpoint spells them and
   llama.cpp's converter reads them) and converts it with llama.cpp's own
   convert_hf_to_gguf.py (`--outtype f32`; the cut vocabulary's
   pre-tokenizer hash is unknown to the converter, so it runs with its
   pre-tokenizer name fixed to "olmo", as for the shared fixtures);
3. stores transformers' float32 logits for `tokens.json` (the 37 ids of
   the other parity fixtures with the end-of-text token 0 put in at 12, 25
   and 26, so that the n-gram hash's reset at it is exercised: 40 tokens) as
   `logits.npy` [40, 1024]: one forward from an empty state, explicit
   position_ids, use_cache=False, deterministic algorithms, transformers'
   pure-torch gated-delta and conv paths (fla and causal_conv1d must not be
   importable).

It refuses a draw where a top-k choice is nearly tied (the indexer's block
choice or the router's expert choice within 1e-3 of the next candidate), so
that the fixture's top-k sets are well defined under f32 rounding, and
checks transformers' own token-by-token decoding (with its cache) against
the full forward. With `--llama-bin` it also runs llama.cpp on the GGUF
(tools/llama_logits.c, prompt and token by token) and prints its
disagreement with transformers (see docs/CONVERT.md).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import math
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tools"))
import make_fixtures as mf  # noqa: E402  (vocabulary and tokens)

N_VOCAB = mf.N_VOCAB
EOS = 0
EOS_AT = (12, 25, 26)  # where the end-of-text token is put into the prompt

MODELS = {
    "qwen4exp_tiny": dict(
        seed=4101,
        config=dict(
            vocab_size=N_VOCAB,
            hidden_size=64,
            num_hidden_layers=5,
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
            layer_types=[
                "linear_attention",
                "full_attention",
                "linear_attention",
                "linear_attention",
                "full_attention",
            ],
            num_experts=4,
            num_experts_per_tok=2,
            moe_intermediate_size=32,
            shared_expert_intermediate_size=48,
            norm_topk_prob=True,
            hc_count=4,
            hc_lowrank=16,
            ple_layer_ids=[1],
            ple_embed_dim=64,
            ple_conv_kernel_size=4,
            ngram_size=3,
            heads_per_ngram=4,
            ngram_vocab_size_base=23,
            make_ngram_vocab_size_divisible_by=128,
            split_ngram_parts=4,
            indexer_n_heads=4,
            indexer_kv_heads=1,
            indexer_head_dim=16,
            indexer_budget=8,
            indexer_compress_ratio=4,
            output_gate_type="sigmoid",
            tie_word_embeddings=False,
            bos_token_id=EOS,
            eos_token_id=EOS,
            pad_token_id=1,
            rope_parameters=dict(
                rope_type="default",
                rope_theta=10000.0,
                partial_rotary_factor=0.25,
                mrope_section=[2, 1, 1],
                mrope_interleaved=True,
            ),
        ),
    ),
}


def check_torch_path() -> None:
    # (the `kernels` hub package may be installed: transformers loads no hub
    # kernel for these layers on a CPU and says it falls back to torch)
    for pkg in ("fla", "causal_conv1d"):
        if importlib.util.find_spec(pkg) is not None:
            raise SystemExit(f"{pkg} is installed: uninstall it so transformers uses its torch path")


def build_model(spec: dict, seed: int):
    import torch
    from transformers import Qwen4ExpForCausalLM, Qwen4ExpTextConfig

    config = Qwen4ExpTextConfig(**spec["config"])
    config.architectures = ["Qwen4ExpForCausalLM"]
    torch.manual_seed(seed)
    model = Qwen4ExpForCausalLM(config).float().eval()
    hidden = config.hidden_size
    g = torch.Generator().manual_seed(seed)

    def randn(shape):
        return torch.randn(shape, generator=g, dtype=torch.float32)

    def uniform(shape, lo, hi):
        return lo + (hi - lo) * torch.rand(shape, generator=g, dtype=torch.float32)

    sigma = 4.0  # logits std ~ sigma
    zero_centred = (
        "hc_norm.weight",
        "norm_key.weight",
        "norm_query.weight",
        "norm_conv.weight",
        "q_layernorm.weight",
        "k_layernorm.weight",
        "q_norm.weight",
        "k_norm.weight",
    )
    with torch.no_grad():
        for name, p in model.named_parameters():
            short = name.rsplit(".", 1)[-1]
            if name == "model.embed_tokens.weight":
                p.copy_(randn(p.shape))
            elif name == "lm_head.weight":
                p.copy_(randn(p.shape) * (sigma / math.sqrt(hidden)))
            elif name.endswith("ngram_embedding.weight"):
                p.copy_(randn(p.shape))
            elif short == "A_log":
                p.copy_(torch.log(uniform(p.shape, 0.02, 0.6)))
            elif short == "dt_bias":
                p.copy_(randn(p.shape) - 1.0)
            elif name.endswith("conv1d.weight"):
                p.copy_(0.6 * randn(p.shape))
            elif name.endswith("linear_attn.norm.weight"):
                p.copy_(1.0 + 0.3 * randn(p.shape))  # plain weight
            elif name.endswith(zero_centred):
                p.copy_(0.3 * randn(p.shape))  # (1 + w) x
            elif p.dim() >= 2:  # (out, in) or fused experts (n_expert, out, in)
                p.copy_(randn(p.shape) / math.sqrt(p.shape[-1]))
            else:
                raise ValueError(f"no init rule for {name} {tuple(p.shape)}")
            p.copy_(p.half().float())
    return model


class TopkMargins:
    """Records, for every top-k taken while active, the gap between the k-th
    and the (k+1)-th largest candidate relative to the largest magnitude."""

    def __init__(self):
        import torch

        self.torch = torch
        self.gaps: list[float] = []

    def __enter__(self):
        torch = self.torch
        self.orig_fn, self.orig_m = torch.topk, torch.Tensor.topk
        rec = self

        def note(x, k, dim):
            s = x.detach().float().movedim(dim, -1).sort(dim=-1, descending=True).values
            if k < s.shape[-1]:
                scale = s.abs().amax(dim=-1).clamp_min(1e-6)
                rec.gaps.append(float(((s[..., k - 1] - s[..., k]) / scale).min()))

        def fn(x, k, dim=-1, *a, **kw):
            note(x, k, dim)
            return rec.orig_fn(x, k, dim, *a, **kw)

        def meth(x, k, dim=-1, *a, **kw):
            note(x, k, dim)
            return rec.orig_m(x, k, dim, *a, **kw)

        torch.topk, torch.Tensor.topk = fn, meth
        return self

    def __exit__(self, *exc):
        self.torch.topk, self.torch.Tensor.topk = self.orig_fn, self.orig_m


def reference_logits(model, ids: list[int]) -> np.ndarray:
    import torch

    with torch.no_grad():
        out = model(torch.tensor([ids]), position_ids=torch.arange(len(ids))[None], use_cache=False)
    logits = out.logits[0].float().numpy()
    assert logits.shape == (len(ids), N_VOCAB)
    return np.ascontiguousarray(logits, dtype="<f4")


def stepwise_logits(model, ids: list[int]) -> np.ndarray:
    """transformers' own decoding: the first token, then one token at a time
    with its cache."""
    import torch

    rows = []
    with torch.no_grad():
        cache = None
        for i, t in enumerate(ids):
            out = model(
                torch.tensor([[t]]),
                position_ids=torch.tensor([[i]]),
                cache=cache,
                use_cache=True,
            )
            cache = out.cache if hasattr(out, "cache") else out.past_key_values
            rows.append(out.logits[0, -1].float().numpy())
    return np.stack(rows)


def sensitivity(model, ids: list[int], logits: np.ndarray) -> str:
    """How far the largest logit moves (of max|logit|) when a Qwen4-Exp
    piece is left out: the indexer's selection (dense attention), the
    per-layer n-gram embedding, the n-gram hash's restart at end-of-text."""
    m = np.abs(logits).max()
    notes = []
    layers = model.model.layers
    saved = [getattr(l.self_attn, "indexer", None) for l in layers if hasattr(l, "self_attn")]
    for ix in saved:  # a budget past the prompt
        ix._keep = (ix.block_topk, ix.token_budget)
        ix.token_budget = ix.compress_ratio * (len(ids) // ix.compress_ratio + 1)
        ix.block_topk = ix.token_budget // ix.compress_ratio
    notes.append(f"dense attention {np.abs(reference_logits(model, ids) - logits).max() / m:.2f}")
    for ix in saved:
        ix.block_topk, ix.token_budget = ix._keep
    ples = [(l, l.ple) for l in layers if l.ple is not None]
    for l, _ in ples:
        l.ple = None
    notes.append(f"no PLE {np.abs(reference_logits(model, ids) - logits).max() / m:.2f}")
    for l, p in ples:
        l.ple = p
    for _, p in ples:
        p.ple_embedding._eos, p.ple_embedding.eos_token_id = p.ple_embedding.eos_token_id, -1
    notes.append(f"no n-gram restart {np.abs(reference_logits(model, ids) - logits).max() / m:.2f}")
    for _, p in ples:
        p.ple_embedding.eos_token_id = p.ple_embedding._eos
    assert np.array_equal(reference_logits(model, ids), logits)
    return ", ".join(notes)


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


def convert(python: str, llama: Path, hf_dir: Path, out: Path, name: str) -> None:
    shim = CONVERT_SHIM.format(llama=str(llama))
    cmd = [python, "-c", shim, str(hf_dir), "--outtype", "f32", "--model-name", name, "--outfile", str(out)]
    env = dict(os.environ)
    env["PYTHONPATH"] = f"{llama / 'gguf-py'}:{llama}"
    r = subprocess.run(cmd, env=env, capture_output=True, text=True)
    if r.returncode != 0:
        raise SystemExit(f"llama.cpp's converter failed:\n{r.stderr[-4000:]}")


def save_tokenizer(tok, d: Path) -> None:
    from transformers import PreTrainedTokenizerFast

    t = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<|endoftext|>", eos_token="<|endoftext|>")
    t.save_pretrained(d)
    # transformers 5 writes its own class name for Qwen models: keep the generic one.
    cfg = json.loads((d / "tokenizer_config.json").read_text())
    cfg["tokenizer_class"] = "PreTrainedTokenizerFast"
    (d / "tokenizer_config.json").write_text(json.dumps(cfg, indent=2))


def spell_full_attention(d: Path) -> None:
    """transformers saves the indexed layers as "indexed_attention"; the
    released checkpoint (and llama.cpp's converter) say "full_attention"."""
    p = d / "config.json"
    cfg = json.loads(p.read_text())
    cfg["layer_types"] = ["full_attention" if t == "indexed_attention" else t for t in cfg["layer_types"]]
    p.write_text(json.dumps(cfg, indent=2, sort_keys=True) + "\n")


def check_gguf(path: Path, config) -> None:
    """The converter wrote the indexed layers' compression ratio (see
    --convert-python)."""
    from gguf import GGUFReader

    r = GGUFReader(path)
    got = list(r.fields["qwen4exp.attention.compress_ratios"].contents())
    want = [config.indexer_compress_ratio if t != "linear_attention" else 0 for t in config.layer_types]
    if got != want:
        raise SystemExit(f"{path}: compress_ratios {got}, expected {want}: run the converter with transformers 4.57")


def llama_cpp_logits(bin_dir: Path, llama: Path, gguf_path: Path, ids: list[int], mode: str) -> np.ndarray:
    """llama.cpp's logits of every position (tools/llama_logits.c)."""
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        exe = work / "llama_logits"
        subprocess.run(
            ["cc", "-O2", "-o", str(exe), str(REPO / "tools/llama_logits.c"), f"-I{llama}/include",
             f"-I{llama}/ggml/include", f"-L{bin_dir}", "-lllama", "-lggml", "-lggml-base", f"-Wl,-rpath,{bin_dir}"],
            check=True,
        )
        toks = work / "t.i32"
        np.asarray(ids, dtype="<i4").tofile(toks)
        out = work / "o.f32"
        r = subprocess.run([str(exe), str(gguf_path), str(toks), str(len(ids)), mode, "1", str(out)],
                           capture_output=True, text=True)
        if r.returncode != 0:
            raise RuntimeError(f"llama.cpp failed ({mode}): {r.stderr[-2000:]}")
        return np.fromfile(out, dtype="<f4").reshape(len(ids), -1)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--shared", type=Path, default=REPO.parent / "shared", help="shared data folder")
    ap.add_argument("--llama-cpp", type=Path, required=True, help="llama.cpp source tree")
    ap.add_argument(
        "--convert-python",
        default=sys.executable,
        help="the Python that runs llama.cpp's converter: one with transformers 4.57 (no Qwen4-Exp config class, "
        "so the converter reads config.json as written; under transformers 5 it reads the layer types back as "
        "'indexed_attention' and writes a compression ratio of 0, dense attention, for every layer)",
    )
    ap.add_argument("--llama-bin", type=Path, help="llama.cpp build's lib/bin folder: also measure llama.cpp")
    ap.add_argument("--out", type=Path, default=REPO / "tests/fixtures/parity", help="output folder")
    ap.add_argument("--hf-out", type=Path, default=REPO / "tests/fixtures/hf", help="HF checkpoints folder")
    args = ap.parse_args()

    check_torch_path()
    import torch
    import transformers

    torch.use_deterministic_algorithms(True)
    torch.set_num_threads(1)

    vocab = mf.read_vocab(REPO / "tests/fixtures/models/mamba2/model.f16.gguf")
    ids, _ = mf.make_tokens(args.shared, vocab)
    for at in EOS_AT:
        ids.insert(at, EOS)
    tok = mf.cut_hf_tokenizer(args.shared / "data/fixtures/mamba2/hf/tokenizer.json", vocab)
    print(f"{len(ids)} tokens: {ids}")

    for name, spec in MODELS.items():
        out = args.out / name
        out.mkdir(parents=True, exist_ok=True)
        seed = spec["seed"]
        while True:
            model = build_model(spec, seed)
            with TopkMargins() as tk:
                logits = reference_logits(model, ids)
            if min(tk.gaps) > 1e-3:
                break
            print(f"seed {seed}: a top-k choice is within {min(tk.gaps):.1e} of a tie, next seed")
            seed += 1
        assert np.array_equal(logits, reference_logits(model, ids))
        step = stepwise_logits(model, ids)
        step_rel = np.abs(step - logits).max() / np.abs(logits).max()
        np.save(out / "logits.npy", logits)
        (out / "tokens.json").write_text(json.dumps(ids) + "\n")
        d = args.hf_out / name
        d.mkdir(parents=True, exist_ok=True)
        model.save_pretrained(d, safe_serialization=True)
        save_tokenizer(tok, d)
        spell_full_attention(d)
        back = transformers.AutoModelForCausalLM.from_pretrained(d, dtype=torch.float32).eval()
        assert np.array_equal(reference_logits(back, ids), logits), "the saved checkpoint loads back differently"
        convert(args.convert_python, args.llama_cpp, d, out / "model.gguf", name)
        check_gguf(out / "model.gguf", model.config)
        top2 = np.sort(logits, axis=1)[:, -2:]
        print(
            f"{name}: seed {seed}, {sum(p.numel() for p in model.parameters())} params, "
            f"logits std {logits.std():.2f}, max|logit| {np.abs(logits).max():.2f}, "
            f"{len(set(logits.argmax(1).tolist()))} distinct argmax, "
            f"min top-2 gap {(top2[:, 1] - top2[:, 0]).min():.4f}, min top-k margin {min(tk.gaps):.1e}, "
            f"transformers token by token vs full {step_rel:.1e}, "
            f"gguf {(out / 'model.gguf').stat().st_size} bytes"
        )
        print(f"  leaving a piece out moves the largest logit by: {sensitivity(model, ids, logits)}")
        if args.llama_bin:
            m = np.abs(logits).max()
            for mode in ("prompt", "token"):
                try:
                    ll = llama_cpp_logits(args.llama_bin, args.llama_cpp, out / "model.gguf", ids, mode)
                except RuntimeError as e:
                    print(f"  llama.cpp {mode}: {e}")
                    continue
                agree = (ll.argmax(1) == logits.argmax(1)).mean()
                print(
                    f"  llama.cpp {mode}: max abs {np.abs(ll - logits).max():.3e}, "
                    f"max rel {np.abs(ll - logits).max() / m:.2e}, argmax {100 * agree:.1f}%"
                )
    print(f"versions: torch {torch.__version__}, transformers {transformers.__version__}")


if __name__ == "__main__":
    main()
