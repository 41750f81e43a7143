#!/usr/bin/env python3
"""Train the fidelity fixture: a small Llama on Tiny Shakespeare.

Run by hand from the repository root (CPU only; the output is committed):

    cargo build --release -p coil-cli
    python3 tools/train_fidelity_llama.py [--data PATH] [--max-minutes 20]

The numerics tests (crates/coil-cli/tests/fidelity.rs) need a *trained*
model whose matrices every quantization applies to: rows of a multiple of
256 (the K-quants' super-block), realistic weight and activation
distributions, logits with real margins. The bundled demo model
(models/, a 128-wide hybrid) is too narrow for the K-quants. This one:

* the demo model's tokenizer (tools/train_demo.py: byte-level BPE, 2048
  tokens, trained on the training head of the corpus), same data split;
* a LlamaForCausalLM: d_model 256, 3 layers, 4 heads of 64 with 2 KV heads,
  SwiGLU 512, RoPE θ 10000, tied embeddings (as SmolLM2), 2.3M parameters;
* AdamW on random 256-token windows, for --steps or --max-minutes;
* the GGUF written with gguf-py as llama.cpp's convert_hf_to_gguf.py writes
  a Llama (Q/K rows permuted to adjacent RoPE pairs), F32, then quantized
  to Q8_0 with `coil quantize` into
  tests/fixtures/fidelity/shakespeare-llama-q8_0.gguf (the tests quantize
  it further), and the test's token windows (windows.json: the first
  4 x 160 tokens of the held-out text). `--windows-only` writes just those.
"""

from __future__ import annotations

import argparse
import json
import math
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tools"))

import train_demo as td  # noqa: E402

OUT_FILE = REPO / "tests/fixtures/fidelity/shakespeare-llama-q8_0.gguf"
WINDOWS_FILE = REPO / "tests/fixtures/fidelity/windows.json"
SEQ = 256
# the test's token windows: the first WINDOWS x WINDOW_CTX tokens of the
# held-out text (640 positions; a multiple of 4 windows for batched decoding)
WINDOWS, WINDOW_CTX = 4, 160


def model_config(vocab: int) -> dict:
    return dict(
        vocab_size=vocab,
        hidden_size=256,
        intermediate_size=512,
        num_hidden_layers=3,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=64,
        max_position_embeddings=SEQ,
        rms_norm_eps=1e-5,
        rope_theta=10000.0,
        tie_word_embeddings=True,
        initializer_range=0.02,
        bos_token_id=0,
        eos_token_id=0,
        pad_token_id=0,
    )


def train(args, train_ids, vocab: int):
    import torch
    import transformers

    torch.manual_seed(args.seed)
    cfg = transformers.LlamaConfig(**model_config(vocab))
    cfg.architectures = ["LlamaForCausalLM"]
    model = transformers.LlamaForCausalLM(cfg).float()
    n_param = sum(p.numel() for p in model.parameters())
    print(f"parameters: {n_param:,}", flush=True)
    decay = [p for n, p in model.named_parameters() if p.dim() >= 2 and "embed" not in n]
    other = [p for n, p in model.named_parameters() if not (p.dim() >= 2 and "embed" not in n)]
    opt = torch.optim.AdamW(
        [dict(params=decay, weight_decay=0.1), dict(params=other, weight_decay=0.0)],
        lr=args.lr,
        betas=(0.9, 0.95),
    )
    warm = min(30, args.steps // 10)

    def lr_at(step):
        if step < warm:
            return args.lr * (step + 1) / warm
        t = (step - warm) / max(1, args.steps - warm)
        return args.lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * t)))

    data = torch.tensor(train_ids, dtype=torch.long)
    g = torch.Generator().manual_seed(args.seed)
    model.train()
    t0 = time.time()
    step = 0
    for step in range(args.steps):
        for grp in opt.param_groups:
            grp["lr"] = lr_at(step)
        starts = torch.randint(0, len(data) - SEQ - 1, (args.batch,), generator=g)
        x = torch.stack([data[s : s + SEQ] for s in starts])
        out = model(x, labels=x, use_cache=False)
        opt.zero_grad(set_to_none=True)
        out.loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        el = time.time() - t0
        if step % 10 == 0:
            print(f"step {step:4d}  loss {out.loss.item():.4f}  {el:6.0f}s", flush=True)
        if args.max_minutes and el > args.max_minutes * 60:
            print(f"stopping after step {step}: --max-minutes {args.max_minutes}", flush=True)
            break
    return model, n_param, time.time() - t0, step + 1


def write_gguf(model, tok, path: Path) -> None:
    """F32 `llama` GGUF as convert_hf_to_gguf.py's LlamaModel writes it."""
    import gguf
    import numpy as np

    cfg = model.config
    tj = json.loads(tok.to_str())
    inv = {i: t for t, i in tj["model"]["vocab"].items()}
    special = {a["id"]: a["content"] for a in tj["added_tokens"]}
    inv.update(special)
    tokens, types = [], []
    for i in range(cfg.vocab_size):
        if i in inv:
            tokens.append(inv[i])
            types.append(3 if i in special else 1)
        else:
            tokens.append(f"[PAD{i}]")
            types.append(5)
    merges = [" ".join(m) if isinstance(m, list) else m for m in tj["model"]["merges"]]

    import make_fixtures as mf

    hd = cfg.head_dim
    names = {
        "model.embed_tokens.weight": "token_embd.weight",
        "model.norm.weight": "output_norm.weight",
    }
    per_layer = {
        "input_layernorm.weight": "attn_norm.weight",
        "self_attn.q_proj.weight": "attn_q.weight",
        "self_attn.k_proj.weight": "attn_k.weight",
        "self_attn.v_proj.weight": "attn_v.weight",
        "self_attn.o_proj.weight": "attn_output.weight",
        "post_attention_layernorm.weight": "ffn_norm.weight",
        "mlp.gate_proj.weight": "ffn_gate.weight",
        "mlp.up_proj.weight": "ffn_up.weight",
        "mlp.down_proj.weight": "ffn_down.weight",
    }
    sd = model.state_dict()
    tensors = [("token_embd.weight", sd["model.embed_tokens.weight"])]
    for i in range(cfg.num_hidden_layers):
        for hf, gg in per_layer.items():
            t = sd[f"model.layers.{i}.{hf}"]
            if gg == "attn_q.weight":
                t = mf.permute_rows(t, cfg.num_attention_heads, hd)
            elif gg == "attn_k.weight":
                t = mf.permute_rows(t, cfg.num_key_value_heads, hd)
            tensors.append((f"blk.{i}.{gg}", t))
    tensors.append(("output_norm.weight", sd["model.norm.weight"]))
    assert set(names) | {f"model.layers.{i}.{k}" for i in range(cfg.num_hidden_layers) for k in per_layer} >= {
        k for k in sd if k != "lm_head.weight"
    }

    w = gguf.GGUFWriter(path, "llama")
    w.add_type(gguf.GGUFType.MODEL)
    w.add_name("Shakespeare llama (coil fidelity fixture)")
    w.add_vocab_size(cfg.vocab_size)
    w.add_context_length(cfg.max_position_embeddings)
    w.add_embedding_length(cfg.hidden_size)
    w.add_block_count(cfg.num_hidden_layers)
    w.add_feed_forward_length(cfg.intermediate_size)
    w.add_rope_dimension_count(hd)
    w.add_head_count(cfg.num_attention_heads)
    w.add_head_count_kv(cfg.num_key_value_heads)
    w.add_rope_freq_base(cfg.rope_parameters["rope_theta"])
    w.add_layer_norm_rms_eps(cfg.rms_norm_eps)
    w.add_file_type(gguf.LlamaFileType.ALL_F32)
    w.add_quantization_version(gguf.GGML_QUANT_VERSION)
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
    for name, t in tensors:
        w.add_tensor(name, np.ascontiguousarray(t.detach().float().numpy(), dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def write_windows(val_ids: list[int]) -> None:
    ws = [val_ids[i * WINDOW_CTX : (i + 1) * WINDOW_CTX] for i in range(WINDOWS)]
    WINDOWS_FILE.parent.mkdir(parents=True, exist_ok=True)
    WINDOWS_FILE.write_text(json.dumps(dict(n_ctx=WINDOW_CTX, windows=ws)) + "\n")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--data", type=Path, default=td.DEFAULT_DATA, help="the Tiny Shakespeare text (default: shared/data/corpus/tinyshakespeare.txt beside the repository)")
    ap.add_argument("--out", type=Path, default=REPO / "target/fidelity-llama", help="work folder")
    ap.add_argument("--steps", type=int, default=400, help="the learning-rate schedule's length")
    ap.add_argument("--max-minutes", type=float, default=20, help="stop early after this long (0: never)")
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--lr", type=float, default=3e-3)
    ap.add_argument("--seed", type=int, default=1234)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--windows-only", action="store_true", help="write windows.json only")
    args = ap.parse_args()

    import torch

    torch.set_num_threads(args.threads)
    torch.use_deterministic_algorithms(True)
    text = args.data.read_text(encoding="utf-8")
    train_text, val_text = td.split_text(text)
    tok = td.train_tokenizer(train_text)
    train_ids = tok.encode(train_text).ids
    val_ids = tok.encode(val_text).ids
    write_windows(val_ids)
    if args.windows_only:
        return
    model, n_param, secs, steps = train(args, train_ids, td.VOCAB)
    model.eval()
    ppl = td.llama_perplexity(model, val_ids[: 16 * SEQ], SEQ)
    metrics = dict(
        seed=args.seed,
        steps_done=steps,
        steps_schedule=args.steps,
        batch=args.batch,
        seq=SEQ,
        lr=args.lr,
        threads=args.threads,
        parameters=n_param,
        train_seconds=round(secs),
        val_perplexity_16_windows=ppl,
    )
    print(json.dumps(metrics, indent=1), flush=True)
    args.out.mkdir(parents=True, exist_ok=True)
    f32 = args.out / "model-f32.gguf"
    write_gguf(model, tok, f32)
    OUT_FILE.parent.mkdir(parents=True, exist_ok=True)
    subprocess.run([str(td.coil_bin()), "quantize", str(f32), str(OUT_FILE), "Q8_0"], check=True)
    OUT_FILE.with_suffix(".metrics.json").write_text(json.dumps(metrics, indent=1) + "\n")
    print(f"wrote {OUT_FILE} ({OUT_FILE.stat().st_size / 1e6:.1f} MB)")


if __name__ == "__main__":
    main()
