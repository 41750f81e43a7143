"""Qwen3.5's multi-token-prediction (MTP) block in torch, for training it,
and `tools/train_demo.py --model qwen35-mtp`: a small Qwen3.5 model trained
with it on Tiny Shakespeare (see `main` for what it writes).

transformers runs a Qwen3.5 checkpoint's trunk and ignores its `mtp.*`
tensors; this module is that block, named as the checkpoint names it, so
that a model trained here converts with llama.cpp's converter (and
`coil convert`) to `blk.N.nextn.*` like a released Qwen3.5:

    mtp.pre_fc_norm_embedding   RMSNorm (zero-centred: x·(1 + w)) of the token's embedding
    mtp.pre_fc_norm_hidden      RMSNorm of the trunk's hidden state
    mtp.fc                      [d, 2·d]: the concatenation [embedding ; hidden] → d
    mtp.layers.0.*              one full-attention decoder layer (gated attention, SwiGLU)
    mtp.norm                    RMSNorm before the shared output head

At position p the block reads the embedding of token t_p and the trunk's
last hidden state (after its final norm, what the output head reads) of
position p − 1, and predicts t_{p+1}: the token after next, seen from that
hidden state. Position 0 has no hidden state before it and reads zeros
there (as llama.cpp's draft-mtp does), so the block's attention covers
every position of the sequence; RoPE positions are the tokens' own.

Drafting runs the block recursively: its own final-normed output at
position p stands in for the trunk's hidden state at p when it drafts the
token after the one it just proposed.
"""

from __future__ import annotations

import copy
import json
import math
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import torch
from torch import nn

REPO = Path(__file__).resolve().parent.parent
# The fixture tokenizer (GPT-NeoX's BPE cut to 4096 ids): both coil convert
# and llama.cpp's converter (pre-tokenizer "olmo", as for the fixtures) take it.
TOKENIZER = REPO / "tests/fixtures/hf/mamba2"
FIXTURE = REPO / "tests/fixtures/mtp"
SEQ = 64
VOCAB = 4096
# Reference cases: drafts of K tokens after the first L + 1 tokens of the prompt.
REF_LENGTHS = [8, 24, 39]
REF_K = 3


def shifted_hidden(h: torch.Tensor) -> torch.Tensor:
    """[B, T, d] trunk hidden states → the state each MTP position reads:
    position p gets h[p − 1], position 0 zeros."""
    return torch.cat([torch.zeros_like(h[:, :1]), h[:, :-1]], dim=1)


class Qwen35Mtp(nn.Module):
    """The `mtp.*` block of a Qwen3.5 checkpoint (one layer)."""

    def __init__(self, config):
        super().__init__()
        from transformers.models.qwen3_5 import modeling_qwen3_5 as q

        d, eps = config.hidden_size, config.rms_norm_eps
        cfg = copy.deepcopy(config)
        cfg.layer_types = ["full_attention"]
        cfg.num_hidden_layers = 1
        self.pre_fc_norm_embedding = q.Qwen3_5RMSNorm(d, eps=eps)
        self.pre_fc_norm_hidden = q.Qwen3_5RMSNorm(d, eps=eps)
        self.fc = nn.Linear(2 * d, d, bias=False)
        self.layers = nn.ModuleList([q.Qwen3_5DecoderLayer(cfg, 0)])
        self.norm = q.Qwen3_5RMSNorm(d, eps=eps)

    def forward(self, embeds: torch.Tensor, hidden: torch.Tensor, position_embeddings) -> torch.Tensor:
        """embeds [B, T, d]: embeddings of t_p; hidden [B, T, d]: the hidden
        state each position reads (see `shifted_hidden`). Returns the
        block's final-normed output [B, T, d] (what the head reads, and what
        a recursive draft step feeds back)."""
        x = torch.cat([self.pre_fc_norm_embedding(embeds), self.pre_fc_norm_hidden(hidden)], dim=-1)
        x = self.fc(x)
        for layer in self.layers:
            # attention_mask None: causal (sdpa / eager with is_causal)
            x = layer(x, position_embeddings=position_embeddings, attention_mask=None)
        return self.norm(x)


class Qwen35WithMtp(nn.Module):
    """A Qwen3_5ForCausalLM and its MTP block, trained together:
    loss = CE(trunk) + mtp_weight · CE(MTP)."""

    def __init__(self, lm, mtp_weight: float):
        super().__init__()
        self.lm = lm
        self.mtp = Qwen35Mtp(lm.config)
        self.mtp_weight = mtp_weight

    def positions(self, x: torch.Tensor):
        """RoPE (cos, sin) of positions 0..T of the text stream."""
        pos = torch.arange(x.shape[1])[None].expand(x.shape[0], -1)
        pos3 = pos[None].expand(3, -1, -1)
        emb = self.lm.model.embed_tokens(x)
        return emb, self.lm.model.rotary_emb(emb, pos3), pos

    def forward(self, x: torch.Tensor):
        """x [B, T] token ids → (trunk logits, MTP logits), each [B, T, V]:
        trunk row p predicts t_{p+1}, MTP row p predicts t_{p+1} from
        (t_p, h_{p−1})."""
        emb, rope, pos = self.positions(x)
        h = self.lm.model(input_ids=x, position_ids=pos, use_cache=False).last_hidden_state
        logits = self.lm.lm_head(h)
        m = self.mtp(emb, shifted_hidden(h), rope)
        return logits, self.lm.lm_head(m)

    def loss(self, x: torch.Tensor):
        """Mean next-token cross entropy of the trunk and of the MTP block on
        [B, T] windows (both score t_1..t_{T−1})."""
        logits, mtp = self(x)
        v = logits.shape[-1]
        ce = nn.functional.cross_entropy
        lt = ce(logits[:, :-1].reshape(-1, v), x[:, 1:].reshape(-1))
        lm = ce(mtp[:, :-1].reshape(-1, v), x[:, 1:].reshape(-1))
        return lt + self.mtp_weight * lm, lt, lm

    @torch.no_grad()
    def draft(self, ids: list[int], k: int) -> tuple[list[int], list[torch.Tensor]]:
        """Greedy MTP drafts of k tokens after `ids` = t_0..t_L, where t_L is
        the token just sampled (the trunk's hidden states used are those of
        t_0..t_{L−1}; h_L never is): the first draft reads (h_{L−1}, t_L) at
        position L, each next one the block's own output at the position
        before and the token it just drafted. Returns the drafts and the
        logits of each step ([V])."""
        x = torch.tensor([ids])
        emb, rope, pos = self.positions(x)
        h = self.lm.model(input_ids=x, position_ids=pos, use_cache=False).last_hidden_state
        hid = shifted_hidden(h)
        toks = list(ids)
        out, rows = [], []
        for _ in range(k):
            xt = torch.tensor([toks])
            emb, rope, _ = self.positions(xt)
            m = self.mtp(emb, hid, rope)
            row = self.lm.lm_head(m[0, -1])
            t = int(row.argmax())
            rows.append(row)
            out.append(t)
            toks.append(t)
            hid = torch.cat([hid, m[:, -1:]], dim=1)
        return out, rows


# --------------------------------------------------------------------------
# The model trained by `train_demo.py --model qwen35-mtp`


def model_config():
    """Qwen3.5 (dense), 8 layers (Gated DeltaNet ×3, gated attention) ×2,
    d_model 128: deep and narrow, so that the one-layer MTP block costs a
    small part of a decode step."""
    import transformers

    d = 128
    return transformers.Qwen3_5TextConfig(
        vocab_size=VOCAB,
        hidden_size=d,
        num_hidden_layers=8,
        layer_types=["linear_attention"] * 3 + ["full_attention"] + ["linear_attention"] * 3 + ["full_attention"],
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=32,
        linear_num_key_heads=4,
        linear_num_value_heads=4,
        linear_key_head_dim=32,
        linear_value_head_dim=32,
        linear_conv_kernel_dim=4,
        intermediate_size=384,
        rms_norm_eps=1e-6,
        tie_word_embeddings=True,
        max_position_embeddings=4096,
        rope_parameters=dict(
            rope_type="default", rope_theta=10000.0, partial_rotary_factor=0.25, mrope_section=[2, 1, 1], mrope_interleaved=True
        ),
        bos_token_id=0,
        eos_token_id=0,
        pad_token_id=1,
    )


def mtp_loss(model, x):
    loss, lt, lm = model.loss(x)
    return loss, dict(trunk=lt.item(), mtp=lm.item())


@torch.no_grad()
def agreement(model, ids: list[int], n_win: int = 16) -> dict:
    """On held-out windows: how often the MTP block's argmax at position p
    (from t_p and h_{p−1}) equals the trunk's at p (what greedy drafting
    needs), and how often each predicts the text's next token."""
    model.eval()
    same = hit_t = hit_m = n = 0
    for i in range(min(n_win, (len(ids) - 1) // SEQ)):
        x = torch.tensor([ids[i * SEQ : (i + 1) * SEQ + 1]])
        logits, mtp = model(x[:, :-1])
        a, b = logits[0].argmax(-1), mtp[0].argmax(-1)
        y = x[0, 1:]
        # position 0 reads no hidden state: left out
        same += (a[1:] == b[1:]).sum().item()
        hit_t += (a[1:] == y[1:]).sum().item()
        hit_m += (b[1:] == y[1:]).sum().item()
        n += SEQ - 1
    return dict(mtp_equals_trunk=same / n, trunk_top1=hit_t / n, mtp_top1=hit_m / n, positions=n)


def round_to_f16(model) -> None:
    """Every parameter to its nearest f16 value (kept in f32): the F16 GGUF
    is then this model exactly."""
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(p.half().float())


def round_to_q8_0(model) -> None:
    """Every matrix (2-D parameter: projections, the embedding) to the
    values its Q8_0 encoding gives back (blocks of 32 along the input
    dimension, gguf-py's bit-exact copy of ggml's quantizer), so that the
    Q8_0 GGUF holds exactly the weights of this model and the reference
    numbers are those of the file's own weights. Q8_0 of these values gives
    them back unchanged (checked)."""
    import numpy as np
    from gguf import GGMLQuantizationType, quants

    q8 = GGMLQuantizationType.Q8_0
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.dim() != 2 or p.shape[-1] % 32:
                continue
            w = p.detach().numpy().astype(np.float32)
            r = quants.dequantize(quants.quantize(w, q8), q8).reshape(w.shape)
            again = quants.dequantize(quants.quantize(r, q8), q8).reshape(w.shape)
            if not np.array_equal(again, r):
                raise SystemExit(f"{name}: Q8_0 does not give its rounded values back")
            p.copy_(torch.from_numpy(r))


def save_checkpoint(model, tok_dir: Path, out: Path) -> None:
    """The Hugging Face checkpoint: transformers' files for the trunk, the
    MTP block's tensors added under `mtp.` and `mtp_num_hidden_layers` in
    the config (as released Qwen3.5 checkpoints carry them)."""
    from safetensors.torch import load_file, save_file

    model.lm.config.architectures = ["Qwen3_5ForCausalLM"]
    model.lm.save_pretrained(out, safe_serialization=True)
    st = out / "model.safetensors"
    tensors = load_file(st)
    for name, p in model.mtp.state_dict().items():
        tensors[f"mtp.{name}"] = p.detach().clone().contiguous()
    save_file(tensors, st, metadata={"format": "pt"})
    cfg = json.loads((out / "config.json").read_text())
    cfg["mtp_num_hidden_layers"] = 1
    (out / "config.json").write_text(json.dumps(cfg, indent=2) + "\n")
    for f in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(tok_dir / f, out / f)


def load_checkpoint(hf: Path):
    import transformers
    from safetensors.torch import load_file

    lm = transformers.Qwen3_5ForCausalLM.from_pretrained(hf, dtype="float32")
    model = Qwen35WithMtp(lm, 1.0)
    t = load_file(hf / "model.safetensors")
    model.mtp.load_state_dict({k[4:]: v for k, v in t.items() if k.startswith("mtp.")})
    return model.eval()


@torch.no_grad()
def write_reference(model, ids: list[int], out: Path) -> None:
    """The trunk's logits of `ids` (every position) and, for each L of
    REF_LENGTHS, the MTP block's REF_K greedy drafts after ids[:L + 1] with
    each step's logits: reference.json + reference_logits.npy
    [len(REF_LENGTHS) · REF_K, V] + logits.npy [len(ids), V]."""
    import numpy as np

    model.eval()
    x = torch.tensor([ids])
    logits, _ = model(x)
    cases, rows = [], []
    for L in REF_LENGTHS:
        d, r = model.draft(ids[: L + 1], REF_K)
        cases.append(dict(fed=L, next=ids[L], drafts=d))
        rows.extend(t.numpy() for t in r)
    np.save(out / "logits.npy", logits[0].numpy().astype(np.float32))
    np.save(out / "reference_logits.npy", np.stack(rows).astype(np.float32))
    ref = dict(
        tokens=ids,
        cases=cases,
        k=REF_K,
        source="tools/qwen35_mtp.py: Qwen35WithMtp (transformers Qwen3_5ForCausalLM + the MTP block), float32, the Q8_0 file's weights exactly",
    )
    (out / "reference.json").write_text(json.dumps(ref, indent=1) + "\n")


def main(args) -> None:
    """Trains the model (or, with --export-only, reuses OUT/hf) and writes:
    OUT/hf/ (the checkpoint with mtp.*, its matrices on the Q8_0 grid),
    tests/fixtures/mtp/model.q8_0.gguf (`coil convert --type q8_0`, MTP
    block kept: the checkpoint's weights exactly), tests/fixtures/mtp/
    {reference.json, reference_logits.npy, logits.npy, metrics.json}, and
    with --llama-cpp OUT/llama-q8_0.gguf (llama.cpp's converter, with the
    block; compared byte for byte with coil's)."""
    import numpy as np
    from tokenizers import Tokenizer

    sys.path.insert(0, str(REPO / "tools"))
    import train_demo as td

    torch.set_num_threads(args.threads)
    torch.use_deterministic_algorithms(True)
    out = args.out if args.out != REPO / "target/demo" else REPO / "target/demo-mtp"
    hf = out / "hf"
    out.mkdir(parents=True, exist_ok=True)
    text = args.data.read_text(encoding="utf-8")
    train_text, val_text = td.split_text(text)
    tok = Tokenizer.from_file(str(TOKENIZER / "tokenizer.json"))
    train_ids = tok.encode(train_text).ids
    val_ids = tok.encode(val_text).ids
    print(f"tokens: train {len(train_ids):,}  val {len(val_ids):,}  vocab {VOCAB}", flush=True)
    if args.export_only:
        model = load_checkpoint(hf)
        round_to_q8_0(model)  # unchanged when already rounded
        save_checkpoint(model, TOKENIZER, hf)
        model = load_checkpoint(hf)
        metrics = json.loads((out / "metrics.json").read_text())
    else:
        torch.manual_seed(args.seed)
        import transformers

        lm = transformers.Qwen3_5ForCausalLM(model_config()).float()
        model = Qwen35WithMtp(lm, 1.0)
        model, n_param, secs, log = td.train(args, model, train_ids, val_ids, loss_of=mtp_loss, seq=SEQ)
        model.eval()
        round_to_f16(model)
        round_to_q8_0(model)
        save_checkpoint(model, TOKENIZER, hf)
        model = load_checkpoint(hf)
        metrics = dict(
            seed=args.seed,
            steps=args.steps,
            batch=args.batch,
            seq=SEQ,
            lr=args.lr,
            threads=args.threads,
            mtp_weight=1.0,
            parameters=n_param,
            train_seconds=round(secs),
            train_tokens=len(train_ids),
            val_tokens=len(val_ids),
            log=log,
        )
        (out / "metrics.json").write_text(json.dumps(metrics, indent=1) + "\n")
    metrics["held_out"] = agreement(model, val_ids)
    print(json.dumps({k: v for k, v in metrics.items() if k != "log"}, indent=1), flush=True)
    FIXTURE.mkdir(parents=True, exist_ok=True)
    (FIXTURE / "metrics.json").write_text(json.dumps(metrics, indent=1) + "\n")
    # the reference prompt: the start of the held-out text
    write_reference(model, val_ids[:40], FIXTURE)

    gguf = FIXTURE / "model.q8_0.gguf"
    subprocess.run(
        [str(td.coil_bin()), "convert", str(hf), "-o", str(gguf), "--type", "q8_0", "--name", "Shakespeare Qwen3.5 MTP", "--quiet"],
        check=True,
    )
    print(f"wrote {gguf} ({gguf.stat().st_size / 1e6:.1f} MB)")
    if args.llama_cpp:
        shim = (
            "import sys\nsys.path.insert(0, {llama!r})\nimport convert_hf_to_gguf as c\n"
            "from conversion import base\nbase.TextModel.get_vocab_base_pre = lambda self, tokenizer: 'olmo'\nc.main()\n"
        ).format(llama=str(args.llama_cpp))
        theirs = out / "llama-q8_0.gguf"
        env = dict(os.environ, PYTHONPATH=f"{args.llama_cpp / 'gguf-py'}:{args.llama_cpp}")
        subprocess.run(
            [args.converter_python, "-c", shim, str(hf), "--outtype", "q8_0", "--outfile", str(theirs), "--model-name", "Shakespeare Qwen3.5 MTP"],
            check=True,
            env=env,
        )
        same = theirs.read_bytes() == gguf.read_bytes()
        print(f"llama.cpp's converter: {theirs} ({'byte for byte coil convert' if same else 'differs from coil convert'})")
