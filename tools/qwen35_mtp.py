"""Qwen3.5's multi-token-prediction (MTP) block in torch, for training it.

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

import torch
from torch import nn


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
