//! Multi-head latent attention (MLA; DeepSeek-AI, "DeepSeek-V2", 2024), in
//! the absorbed form that caches only the compressed latent:
//!
//! ```text
//! q      = W_q x                 or  W_qb · RMSNorm(W_qa x)   (query LoRA)
//!        → per head [q_nope (d_nope) | q_rope (d_rope)]
//! c, k_r = W_kva x               (`attn_kv_a_mqa`: r + d_rope)
//! c      = RMSNorm(c)            (`attn_kv_a_norm`)
//! k_h = [W_uk_h c | k_r],  v_h = W_uv_h c                     (never formed)
//! ```
//!
//! The cache holds `[c | k_r]` per position (r + d_rope values, one row for
//! all heads: [`KvLayerShape::latent`]); each head's query is absorbed into
//! the latent, `q'_h = [W_uk_hᵀ q_nope_h | q_rope_h]`, so that `q'_h ·
//! [c | k_r] = q_h · k_h`; attention over the latent rows gives `Σ p · c`
//! per head, and `W_uv_h` maps it to the head's value, then `attn_output`.
//! `attn_k_b` holds `W_uk_hᵀ` (`[H][r, d_nope]`) and `attn_v_b` `W_uv_h`
//! (`[H][d_v, r]`), as llama.cpp's converter splits `kv_b_proj`. RoPE, where
//! the model has it, rotates q_rope and k_r; Kimi-Linear has none. Ling 3.0
//! (Bailing-Hybrid) scales each head's output by `sigmoid(W_g x)_h`
//! (`attn_gate`, one row per head) before `attn_output`.

use super::attention::{attend, AttentionParams, Rope};
use super::common::gather_rows;
use super::ffn::Experts;
use crate::memory::{KvLayerShape, Memory};
use crate::models::weights::{Loader, Matrix};
use crate::models::{ModelError, Rows};
use coil_gguf::GgufFile;
use coil_kernels::ops::norm::rms_norm_inplace;
use coil_kernels::ops::rope::{rope, rope_table};
use coil_kernels::{matmul, matmul_shared, Scratch, ThreadPool};

#[derive(Clone, Copy, Debug)]
pub struct MlaParams {
    pub d_model: usize,
    pub n_head: usize,
    /// r: the latent's width (`attention.kv_lora_rank`).
    pub kv_lora_rank: usize,
    /// The query LoRA's rank (`attention.q_lora_rank`), if the query has one.
    pub q_lora_rank: Option<usize>,
    pub d_nope: usize,
    pub d_rope: usize,
    pub d_v: usize,
    /// Multiplies q·k: 1/√(d_nope + d_rope).
    pub scale: f32,
    /// Rotation of q_rope and k_r (over all d_rope lanes); `None`: none.
    pub rope: Option<Rope>,
    /// Epsilon of the latent norms.
    pub eps: f32,
    /// A per-head sigmoid output gate (`attn_gate`: `[H, d_model]`).
    pub head_gate: bool,
}

impl MlaParams {
    /// Width of one head's query: d_nope + d_rope.
    pub fn qk_head(&self) -> usize {
        self.d_nope + self.d_rope
    }

    /// Width of a cached latent row (and of an absorbed query head).
    pub fn latent(&self) -> usize {
        self.kv_lora_rank + self.d_rope
    }

    pub fn kv_shape(&self) -> KvLayerShape {
        KvLayerShape::latent(self.latent())
    }
}

/// How the query comes out of the input.
pub enum QProj {
    /// `attn_q`: `[H·(d_nope + d_rope), d_model]`.
    Plain(Matrix),
    /// `attn_q_a` → RMSNorm (`attn_q_a_norm`) → `attn_q_b`.
    Lora {
        a: Matrix,
        norm: Vec<f32>,
        b: Matrix,
    },
}

pub struct Mla {
    pub p: MlaParams,
    pub q: QProj,
    /// `attn_kv_a_mqa`: `[r + d_rope, d_model]`.
    pub kv_a: Matrix,
    pub kv_a_norm: Vec<f32>,
    /// `attn_k_b`: per head `[r, d_nope]` (W_ukᵀ).
    pub k_b: Experts,
    /// `attn_v_b`: per head `[d_v, r]` (W_uv).
    pub v_b: Experts,
    /// `attn_gate`: `[H, d_model]`, where the heads are gated.
    pub gate: Option<Matrix>,
    pub wo: Matrix,
}

impl Mla {
    pub fn load(ld: &Loader, layer: usize, p: MlaParams) -> Result<Self, ModelError> {
        let n = |t: &str| format!("blk.{layer}.{t}");
        let (h, r, dm) = (p.n_head, p.kv_lora_rank, p.d_model);
        let qd = h * p.qk_head();
        let q = match p.q_lora_rank {
            Some(rank) => QProj::Lora {
                a: ld.matrix(&n("attn_q_a.weight"), rank, dm)?,
                norm: ld.vector(&n("attn_q_a_norm.weight"), &[rank])?,
                b: ld.matrix(&n("attn_q_b.weight"), qd, rank)?,
            },
            None if ld.has(&n("attn_q_a.weight")) => {
                return Err(ModelError::MissingKey(format!(
                    "{}.attention.q_lora_rank (layer {layer} has a query LoRA, attn_q_a)",
                    ld.arch
                )))
            }
            None => QProj::Plain(ld.matrix(&n("attn_q.weight"), qd, dm)?),
        };
        if ld.has(&n("attn_kv_b.weight")) && !ld.has(&n("attn_k_b.weight")) {
            return Err(ModelError::Tensor {
                name: n("attn_kv_b.weight"),
                reason: "an unsplit kv_b (no attn_k_b / attn_v_b): convert the model again \
                         (coil convert, or a current llama.cpp converter)"
                    .into(),
            });
        }
        Ok(Mla {
            q,
            kv_a: ld.matrix(&n("attn_kv_a_mqa.weight"), r + p.d_rope, dm)?,
            kv_a_norm: ld.vector(&n("attn_kv_a_norm.weight"), &[r])?,
            k_b: Experts::load(ld, &n("attn_k_b.weight"), h, r, p.d_nope)?,
            v_b: Experts::load(ld, &n("attn_v_b.weight"), h, p.d_v, r)?,
            gate: match p.head_gate {
                true => Some(ld.matrix(&n("attn_gate.weight"), h, dm)?),
                false => None,
            },
            wo: ld.matrix(&n("attn_output.weight"), dm, h * p.d_v)?,
            p,
        })
    }

    /// `h`: normed input `[n_tokens, d_model]` stacked over `rows`; `out`:
    /// `[n_out, d_model]`, the rows `q_rows` lists (every row for `None`).
    /// Every row's latent is cached.
    #[allow(clippy::too_many_arguments)]
    pub fn forward(
        &self,
        file: &GgufFile,
        pool: &ThreadPool,
        layer: usize,
        rows: &[Rows],
        mem: &mut Memory,
        h: &[f32],
        q_rows: Option<&[usize]>,
        out: &mut [f32],
    ) -> Result<(), ModelError> {
        let p = &self.p;
        let (nh, r, dr, lw, qkh) = (p.n_head, p.kv_lora_rank, p.d_rope, p.latent(), p.qk_head());
        let n = h.len() / p.d_model;
        let hq = q_rows.map(|keep| gather_rows(h, keep, p.d_model));
        let nq = q_rows.map_or(n, <[usize]>::len);
        let xq: &[f32] = hq.as_deref().unwrap_or(h);

        // The query [nq, H, d_nope + d_rope] and the latent rows [n, r + d_rope].
        let mut q = Scratch::dirty(nq * nh * qkh);
        let mut lat = Scratch::dirty(n * lw);
        let kv_a = self.kv_a.get(file);
        match (&self.q, q_rows) {
            (QProj::Plain(wq), None) => {
                matmul_shared(pool, &[&wq.get(file), &kv_a], h, &mut [&mut q, &mut lat], n)
            }
            (QProj::Plain(wq), Some(_)) => {
                matmul(pool, &wq.get(file), xq, &mut q, nq);
                matmul(pool, &kv_a, h, &mut lat, n);
            }
            (QProj::Lora { a, norm, b }, _) => {
                let mut qa = Scratch::dirty(nq * a.rows);
                if q_rows.is_none() {
                    matmul_shared(pool, &[&a.get(file), &kv_a], h, &mut [&mut qa, &mut lat], n);
                } else {
                    matmul(pool, &a.get(file), xq, &mut qa, nq);
                    matmul(pool, &kv_a, h, &mut lat, n);
                }
                rms_norm_inplace(&mut qa, Some(norm), p.eps, a.rows);
                matmul(pool, &b.get(file), &qa, &mut q, nq);
            }
        }
        for row in lat.chunks_exact_mut(lw) {
            rms_norm_inplace(&mut row[..r], Some(&self.kv_a_norm), p.eps, r);
        }

        // The absorbed queries [nq, H, r + d_rope]: W_ukᵀ q_nope, then q_rope.
        let mut qa = Scratch::dirty(nq * nh * lw);
        {
            let mut qn = Scratch::dirty(nq * p.d_nope);
            let mut y = Scratch::dirty(nq * r);
            for hd in 0..nh {
                for (t, dst) in qn.chunks_exact_mut(p.d_nope).enumerate() {
                    let at = (t * nh + hd) * qkh;
                    dst.copy_from_slice(&q[at..at + p.d_nope]);
                }
                matmul(pool, &self.k_b.get(file, hd), &qn, &mut y, nq);
                for t in 0..nq {
                    let (dst, src) = ((t * nh + hd) * lw, (t * nh + hd) * qkh + p.d_nope);
                    qa[dst..dst + r].copy_from_slice(&y[t * r..(t + 1) * r]);
                    qa[dst + r..dst + lw].copy_from_slice(&q[src..src + dr]);
                }
            }
        }
        if let Some(rp) = p.rope {
            self.rotate(pool, rows, q_rows, rp, &mut qa, &mut lat);
        }

        // Attention over the latent rows: one KV head of r + d_rope shared
        // by every query head (values: the same rows).
        let ap = AttentionParams {
            d_model: p.d_model,
            n_head: nh,
            n_kv_head: 1,
            head_dim: lw,
            scale: p.scale,
            rope: None,
            window: None,
        };
        let mut att = Scratch::dirty(nq * nh * lw);
        attend(
            pool,
            &ap,
            layer,
            rows,
            mem,
            q_rows,
            &mut qa,
            &mut lat,
            &[],
            &mut att,
            None,
        )?;

        // Each head's Σ p·c through W_uv_h, then attn_output.
        let mut o = Scratch::dirty(nq * nh * p.d_v);
        {
            let mut c = Scratch::dirty(nq * r);
            let mut y = Scratch::dirty(nq * p.d_v);
            for hd in 0..nh {
                for (t, dst) in c.chunks_exact_mut(r).enumerate() {
                    let at = (t * nh + hd) * lw;
                    dst.copy_from_slice(&att[at..at + r]);
                }
                matmul(pool, &self.v_b.get(file, hd), &c, &mut y, nq);
                for t in 0..nq {
                    let at = (t * nh + hd) * p.d_v;
                    o[at..at + p.d_v].copy_from_slice(&y[t * p.d_v..(t + 1) * p.d_v]);
                }
            }
        }
        if let Some(g) = &self.gate {
            // o_h ← o_h · sigmoid(W_g x)_h
            let mut gh = Scratch::dirty(nq * nh);
            matmul(pool, &g.get(file), xq, &mut gh, nq);
            for (oh, &z) in o.chunks_exact_mut(p.d_v).zip(gh.iter()) {
                let s = 1.0 / (1.0 + (-z).exp());
                oh.iter_mut().for_each(|v| *v *= s);
            }
        }
        matmul(pool, &self.wo.get(file), &o, &mut out[..nq * p.d_model], nq);
        Ok(())
    }

    /// RoPE on the d_rope trailing lanes of the absorbed queries and of the
    /// latent rows, at each row's position.
    fn rotate(
        &self,
        pool: &ThreadPool,
        rows: &[Rows],
        q_rows: Option<&[usize]>,
        rp: Rope,
        qa: &mut [f32],
        lat: &mut [f32],
    ) {
        let p = &self.p;
        let (nh, r, dr, lw) = (p.n_head, p.kv_lora_rank, p.d_rope, p.latent());
        let mut pos = vec![0usize; lat.len() / lw];
        for c in rows {
            for (i, x) in pos[c.rows.clone()].iter_mut().enumerate() {
                *x = c.pos + i;
            }
        }
        let qpos: Vec<usize> = match q_rows {
            None => pos.clone(),
            Some(keep) => keep.iter().map(|&i| pos[i]).collect(),
        };
        let part = |x: &mut [f32], heads: usize, positions: &[usize]| {
            let table = rope_table(pool, positions, dr, rp.freq_base, rp.freq_scale);
            let mut buf = vec![0f32; positions.len() * heads * dr];
            for (b, src) in buf.chunks_exact_mut(dr).zip(x.chunks_exact(lw)) {
                b.copy_from_slice(&src[r..]);
            }
            rope(&mut buf, heads, dr, dr, &table, rp.style);
            for (b, dst) in buf.chunks_exact(dr).zip(x.chunks_exact_mut(lw)) {
                dst[r..].copy_from_slice(b);
            }
        };
        part(qa, nh, &qpos);
        part(lat, 1, &pos);
    }
}
