#!/usr/bin/env python3
"""Train coil's bundled demo model: a tiny Granite-4.0-H-style hybrid on Tiny Shakespeare.

Run by hand from the repository root (CPU only; the outputs are committed):

    pip install torch transformers tokenizers safetensors gguf numpy
    cargo build --release -p coil-cli
    python3 tools/train_demo.py [--data PATH] [--out DIR] [--steps N] [--seed S]

What it does, reproducibly for a given seed and thread count:

1. splits the corpus (default: ../shared/data/corpus/tinyshakespeare.txt,
   relative to the repository root) into a training head and a held-out
   validation tail (the last 10%, cut at a line start);
2. trains a byte-level BPE tokenizer (the `tokenizers` package, GPT-2's
   pre-tokenization regex, 2048 tokens including `<|endoftext|>`) on the
   training text only;
3. trains a GraniteMoeHybridForCausalLM (dense SwiGLU MLPs, no MoE, no
   positional encoding in its two attention layers, Mamba-2 everywhere else)
   with AdamW on random 256-token windows of the training text;
4. saves the Hugging Face checkpoint (config, safetensors, tokenizer) in
   OUT/hf/, the validation loss and the llama-perplexity-style perplexity of
   the validation text (non-overlapping windows of --ctx tokens, the second
   half of each scored) in OUT/metrics.json, and the same perplexity of the
   test slice (tests/data/shakespeare_val_slice.txt) in
   crates/coil-cli/tests/data/demo_perplexity.json;
5. writes the GGUF (`granitehybrid`, F32) with gguf-py as llama.cpp's
   converter would (see write_gguf), and quantizes it to Q8_0 with
   `coil quantize` into models/shakespeare-hybrid-q8_0.gguf.

`--export-only` skips training and redoes steps 4-5 from OUT/hf/.

`--model qwen35-mtp` trains instead a small Qwen3.5 model *with* a
multi-token-prediction head (the MTP module in tools/qwen35_mtp.py, trained
jointly), for measuring speculative decoding with the model's own draft
head; see tools/qwen35_mtp.py for what it writes.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
DEFAULT_DATA = REPO.parent / "shared/data/corpus/tinyshakespeare.txt"
MODEL_FILE = "shakespeare-hybrid-q8_0.gguf"
SLICE = REPO / "crates/coil-cli/tests/data/shakespeare_val_slice.txt"
SLICE_EXPECTED = REPO / "crates/coil-cli/tests/data/demo_perplexity.json"
SLICE_BYTES = 6000  # the test slice: the first ~6 KB of the validation text
SLICE_CTX = 128

VOCAB = 2048
SEQ = 256
EOT = "<|endoftext|>"


def model_config(vocab: int) -> dict:
    d = 128
    return dict(
        vocab_size=vocab,
        hidden_size=d,
        num_hidden_layers=4,
        layer_types=["mamba", "attention", "mamba", "attention"],
        num_attention_heads=4,  # head_dim 32
        num_key_value_heads=2,
        position_embedding_type="nope",
        attention_multiplier=32**-0.5,  # 1/sqrt(head_dim): Granite's explicit scale
        embedding_multiplier=1.0,
        residual_multiplier=1.0,
        logits_scaling=1.0,
        num_local_experts=0,  # dense: shared_mlp is the MLP
        shared_intermediate_size=320,
        intermediate_size=320,
        mamba_n_heads=8,
        mamba_d_head=32,  # d_inner 256 = 2 x 128
        mamba_expand=2,
        mamba_n_groups=1,
        mamba_d_state=32,
        mamba_d_conv=4,
        mamba_chunk_size=64,
        mamba_conv_bias=True,
        mamba_proj_bias=False,
        # transformers' single-step path never clamps dt; llama.cpp neither
        time_step_limit=(0.0, float("inf")),
        max_position_embeddings=SEQ,
        rms_norm_eps=1e-5,
        tie_word_embeddings=True,
        initializer_range=0.02,
        bos_token_id=0,
        eos_token_id=0,
        pad_token_id=0,
    )


# --------------------------------------------------------------------------
# Data and tokenizer


def split_text(text: str) -> tuple[str, str]:
    """Training head and the held-out tail (last 10%, from a line start)."""
    cut = text.rfind("\n", 0, int(len(text) * 0.9)) + 1
    return text[:cut], text[cut:]


def train_tokenizer(train_text: str):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    # ByteLevel with use_regex: GPT-2's regex, then the byte-to-unicode map
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB,
        special_tokens=[EOT],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        min_frequency=2,
        show_progress=False,
    )
    # in lines, so the trainer's parallel word counting is order-independent
    tok.train_from_iterator(train_text.splitlines(keepends=True), trainer)
    return tok


# --------------------------------------------------------------------------
# Perplexity as llama-perplexity computes it


def llama_perplexity(model, ids: list[int], n_ctx: int) -> dict:
    """Non-overlapping windows of n_ctx tokens (the tail that does not fill a
    window is dropped); in each, with first = n_ctx/2, the logits of
    positions first .. n_ctx-2 score the tokens first+1 .. n_ctx-1 (as
    llama-perplexity's process_logits: n_ctx - 1 - first per window);
    ppl = exp(mean NLL). No BOS (the vocabulary does not add one)."""
    import torch

    n_chunk = len(ids) // n_ctx
    first = n_ctx // 2
    nll, count = 0.0, 0
    with torch.no_grad():
        for c in range(n_chunk):
            x = torch.tensor([ids[c * n_ctx : (c + 1) * n_ctx]])
            logits = model(x, use_cache=False).logits[0].double()
            logp = torch.log_softmax(logits, dim=-1)
            tgt = x[0, first + 1 :]
            nll -= logp[first : n_ctx - 1].gather(1, tgt[:, None]).sum().item()
            count += n_ctx - 1 - first
    return dict(ctx=n_ctx, chunks=n_chunk, tokens_scored=count, nll=nll / count, ppl=math.exp(nll / count))


# --------------------------------------------------------------------------
# Training


def granite_model(args, vocab: int):
    import torch
    import transformers

    torch.manual_seed(args.seed)
    cfg = transformers.GraniteMoeHybridConfig(**model_config(vocab))
    cfg.architectures = ["GraniteMoeHybridForCausalLM"]
    return transformers.GraniteMoeHybridForCausalLM(cfg).float()


def lm_loss(model, x):
    """Mean next-token cross entropy of a transformers causal LM on [B, T]
    windows (labels shifted inside), and the parts to log."""
    loss = model(x, labels=x, use_cache=False).loss
    return loss, {}


def train(args, model, train_ids, val_ids, loss_of=lm_loss, seq: int = SEQ):
    """AdamW on random `seq`-token windows; `loss_of(model, x)` gives the
    loss to minimise and named parts (floats) to log beside it."""
    import torch

    n_param = sum(p.numel() for p in model.parameters())
    print(f"parameters: {n_param:,}", flush=True)

    decay = [p for n, p in model.named_parameters() if p.dim() >= 2 and "embed" not in n]
    other = [p for n, p in model.named_parameters() if not (p.dim() >= 2 and "embed" not in n)]
    opt = torch.optim.AdamW(
        [dict(params=decay, weight_decay=0.1), dict(params=other, weight_decay=0.0)],
        lr=args.lr,
        betas=(0.9, 0.95),
    )
    warm = min(50, args.steps // 10)

    def lr_at(step):
        if step < warm:
            return args.lr * (step + 1) / warm
        t = (step - warm) / max(1, args.steps - warm)
        return args.lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * t)))

    data = torch.tensor(train_ids, dtype=torch.long)
    val = torch.tensor(val_ids, dtype=torch.long)
    g = torch.Generator().manual_seed(args.seed)

    def val_loss(n_win=8):
        model.eval()
        tot, parts = 0.0, {}
        n = min(n_win, (len(val) - 1) // seq)
        with torch.no_grad():
            for i in range(n):
                x = val[i * seq : (i + 1) * seq]
                loss, more = loss_of(model, x[None])
                tot += loss.item()
                for k, v in more.items():
                    parts[k] = parts.get(k, 0.0) + v / n
        model.train()
        return tot / n, parts

    model.train()
    t0 = time.time()
    log = []
    for step in range(args.steps):
        for grp in opt.param_groups:
            grp["lr"] = lr_at(step)
        starts = torch.randint(0, len(data) - seq - 1, (args.batch,), generator=g)
        x = torch.stack([data[s : s + seq] for s in starts])
        loss, parts = loss_of(model, x)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        stop = None
        if args.stop_after and step + 1 >= args.stop_after:
            stop = f"--stop-after {args.stop_after}"
        elif args.max_minutes and time.time() - t0 > args.max_minutes * 60:
            stop = f"--max-minutes {args.max_minutes} reached"
        if stop:
            print(f"stopping after step {step}: {stop}", flush=True)
            vl, vp = val_loss()
            log.append(dict(step=step, train=loss.item(), val=vl, seconds=time.time() - t0, stopped=True, **parts, **{f"val_{k}": v for k, v in vp.items()}))
            break
        if step % 25 == 0 or step == args.steps - 1:
            el = time.time() - t0
            more = "".join(f"  {k} {v:.4f}" for k, v in parts.items())
            msg = f"step {step:5d}  loss {loss.item():.4f}{more}  lr {lr_at(step):.2e}  {el:7.0f}s  {(step + 1) / el:.3f} steps/s"
            if step % 250 == 0 or step == args.steps - 1:
                vl, vp = val_loss()
                msg += f"  val {vl:.4f}" + "".join(f" {k} {v:.4f}" for k, v in vp.items())
                log.append(dict(step=step, train=loss.item(), val=vl, seconds=el, **parts, **{f"val_{k}": v for k, v in vp.items()}))
            print(msg, flush=True)
    return model, n_param, time.time() - t0, log


# --------------------------------------------------------------------------
# GGUF


def write_gguf(hf_dir: Path, path: Path) -> None:
    """granitehybrid GGUF, all F32, as llama.cpp's convert_hf_to_gguf.py
    writes a dense GraniteMoeHybrid without RoPE (tensors and metadata via
    tools/make_fixtures.py; the dense MLP as ffn_gate / ffn_up / ffn_down,
    feed_forward_length = shared_intermediate_size), with the trained
    byte-level BPE as `gpt2` / pre `gpt-2`."""
    import numpy as np
    import transformers

    sys.path.insert(0, str(REPO / "tools"))
    import make_fixtures as mf

    model = transformers.AutoModelForCausalLM.from_pretrained(hf_dir, dtype="float32").eval()
    cfg = model.config
    tj = json.loads((hf_dir / "tokenizer.json").read_text(encoding="utf-8"))
    inv = {i: t for t, i in tj["model"]["vocab"].items()}
    special = {a["id"]: a["content"] for a in tj["added_tokens"]}
    inv.update(special)
    tokens, types = [], []
    for i in range(cfg.vocab_size):
        if i in inv:
            tokens.append(inv[i])
            types.append(3 if i in special else 1)  # CONTROL / NORMAL
        else:
            tokens.append(f"[PAD{i}]")
            types.append(5)  # UNUSED
    merges = [" ".join(m) if isinstance(m, list) else m for m in tj["model"]["merges"]]

    def add_tokenizer(w, _vocab):
        w.add_tokenizer_model("gpt2")
        w.add_tokenizer_pre("gpt-2")
        w.add_token_list(tokens)
        w.add_token_types(types)
        w.add_token_merges(merges)
        w.add_bos_token_id(0)
        w.add_eos_token_id(0)
        w.add_unk_token_id(0)
        w.add_pad_token_id(0)
        w.add_add_bos_token(False)
        w.add_add_eos_token(False)

    orig_tensors = mf.hybrid_gguf_tensors

    def dense_tensors(model, arch, kinds, partial_permute):
        out, dims = orig_tensors(model, arch, kinds, partial_permute)
        ren = {"ffn_gate_shexp": "ffn_gate", "ffn_up_shexp": "ffn_up", "ffn_down_shexp": "ffn_down"}
        fixed = []
        for name, a in out:
            parts = name.split(".")
            if len(parts) == 4 and parts[2] in ren:
                parts[2] = ren[parts[2]]
            fixed.append((".".join(parts), np.ascontiguousarray(a, dtype=np.float32)))
        return fixed, dims

    mf.N_VOCAB = cfg.vocab_size
    mf.add_tokenizer = add_tokenizer
    mf.hybrid_gguf_tensors = dense_tensors
    # dense: the MLP width is the shared one (what llama.cpp writes)
    cfg.intermediate_size = cfg.shared_intermediate_size
    mf.write_hybrid_gguf(path, "Shakespeare hybrid (coil demo)", model, None)


def coil_bin() -> Path:
    exe = REPO / "target/release" / ("coil.exe" if os.name == "nt" else "coil")
    if not exe.exists():
        raise SystemExit(f"{exe} not found: run `cargo build --release -p coil-cli` first")
    return exe


# --------------------------------------------------------------------------


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--data", type=Path, default=DEFAULT_DATA, help="the Tiny Shakespeare text")
    ap.add_argument("--out", type=Path, default=REPO / "target/demo", help="work folder (checkpoint, metrics)")
    ap.add_argument("--steps", type=int, default=350)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--lr", type=float, default=3e-3)
    ap.add_argument("--seed", type=int, default=1234)
    ap.add_argument(
        "--stop-after",
        type=int,
        default=0,
        help="stop after this many steps, on the schedule of --steps (reproduces a --max-minutes stop; 0: never)",
    )
    ap.add_argument("--max-minutes", type=float, default=0, help="stop training early after this long (0: never)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--ctx", type=int, default=SEQ, help="perplexity window")
    ap.add_argument("--export-only", action="store_true", help="reuse OUT/hf, skip training")
    ap.add_argument(
        "--model",
        choices=["hybrid", "qwen35-mtp"],
        default="hybrid",
        help="hybrid: the bundled demo model; qwen35-mtp: a Qwen3.5 model with an MTP head (tools/qwen35_mtp.py)",
    )
    ap.add_argument("--llama-cpp", type=Path, help="qwen35-mtp: llama.cpp source tree (its converter writes a second GGUF)")
    ap.add_argument("--converter-python", default=sys.executable, help="qwen35-mtp: python with transformers 4.57 for llama.cpp's converter")
    args = ap.parse_args()
    if args.model == "qwen35-mtp":
        sys.path.insert(0, str(REPO / "tools"))
        import qwen35_mtp

        return qwen35_mtp.main(args)

    import torch
    import transformers

    torch.set_num_threads(args.threads)
    torch.use_deterministic_algorithms(True)
    text = args.data.read_text(encoding="utf-8")
    train_text, val_text = split_text(text)
    hf_dir = args.out / "hf"
    args.out.mkdir(parents=True, exist_ok=True)

    if args.export_only:
        from tokenizers import Tokenizer

        tok = Tokenizer.from_file(str(hf_dir / "tokenizer.json"))
        model = transformers.AutoModelForCausalLM.from_pretrained(hf_dir, dtype="float32")
        metrics = json.loads((args.out / "metrics.json").read_text())
    else:
        tok = train_tokenizer(train_text)
        vocab = tok.get_vocab_size()
        assert vocab <= VOCAB, vocab
        train_ids = tok.encode(train_text).ids
        val_ids = tok.encode(val_text).ids
        print(f"tokens: train {len(train_ids):,}  val {len(val_ids):,}  vocab {vocab}", flush=True)
        model, n_param, secs, log = train(args, granite_model(args, VOCAB), train_ids, val_ids)
        model.eval()
        model.save_pretrained(hf_dir, safe_serialization=True)
        fast = transformers.PreTrainedTokenizerFast(
            tokenizer_object=tok, bos_token=EOT, eos_token=EOT, unk_token=EOT, pad_token=EOT
        )
        fast.save_pretrained(hf_dir)
        metrics = dict(
            seed=args.seed,
            steps=args.steps,
            batch=args.batch,
            seq=SEQ,
            lr=args.lr,
            threads=args.threads,
            parameters=n_param,
            train_seconds=round(secs),
            train_tokens=len(train_ids),
            val_tokens=len(val_ids),
            log=log,
        )
    model.eval()

    val_ids = tok.encode(val_text).ids
    # full validation loss: every token of the validation text predicted with
    # SEQ tokens of context windows (non-overlapping, all positions scored)
    with torch.no_grad():
        tot, n = 0.0, 0
        v = torch.tensor(val_ids)
        for i in range(0, len(v) - 1, SEQ):
            x = v[i : i + SEQ + 1]
            if len(x) < 2:
                break
            logits = model(x[None, :-1], use_cache=False).logits[0]
            tot += torch.nn.functional.cross_entropy(logits, x[1:], reduction="sum").item()
            n += len(x) - 1
    metrics["val_loss"] = tot / n
    metrics["val_ppl_token"] = math.exp(tot / n)
    metrics["perplexity"] = llama_perplexity(model, val_ids, args.ctx)
    metrics["uniform_ppl"] = VOCAB
    print(json.dumps({k: v for k, v in metrics.items() if k != "log"}, indent=1), flush=True)
    (args.out / "metrics.json").write_text(json.dumps(metrics, indent=1) + "\n")
    (REPO / "models").mkdir(exist_ok=True)
    (REPO / "models" / MODEL_FILE.replace(".gguf", ".metrics.json")).write_text(json.dumps(metrics, indent=1) + "\n")

    # the test slice: the first SLICE_BYTES of the validation text, at a line end
    cut = val_text.rfind("\n", 0, SLICE_BYTES) + 1
    sl = val_text[:cut]
    SLICE.parent.mkdir(parents=True, exist_ok=True)
    SLICE.write_text(sl, encoding="utf-8")
    sl_ids = tok.encode(sl).ids
    p = llama_perplexity(model, sl_ids, SLICE_CTX)
    p["tokens"] = len(sl_ids)
    p["ids"] = sl_ids  # transformers' tokenization, which coil's must equal
    p["source"] = "tools/train_demo.py: transformers GraniteMoeHybridForCausalLM, float32, on target/demo/hf"
    SLICE_EXPECTED.write_text(json.dumps(p, indent=1) + "\n")
    print("slice", p, flush=True)

    f32 = args.out / "model-f32.gguf"
    write_gguf(hf_dir, f32)
    dst = REPO / "models" / MODEL_FILE
    dst.parent.mkdir(exist_ok=True)
    subprocess.run([str(coil_bin()), "quantize", str(f32), str(dst), "Q8_0"], check=True)
    print(f"wrote {dst} ({dst.stat().st_size / 1e6:.1f} MB)")


if __name__ == "__main__":
    main()
