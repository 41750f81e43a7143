//! Multi-head attention with grouped-query KV heads: `q, k, v = x·Wq, x·Wk,
//! x·Wv` (+ optional biases), optional per-head RMSNorms of q and k (LFM2),
//! optional RoPE on the first `n_rot` lanes of each head (with optional
//! per-pair frequency factors), keys and values appended to the sequence's
//! KV cells, causal softmax attention over them (all of them, or the last
//! `window`: sliding-window attention), optionally each head's output
//! scaled by a sigmoid gate of the layer input (LFM3's `g_proj`),
//! `out = attn·Wo`. Optionally low-rank adapters beside Wq, Wk, Wv (Zamba2's
//! per-use adapters), and an output width other than the input's (Zamba2's
//! shared block reads `[x, embedding]`, twice the model's width).

use super::common::gather_rows;
use super::lora::Lora;
use crate::memory::Memory;
use crate::models::weights::{Loader, Matrix};
use crate::models::ModelError;
use crate::models::Rows;
use coil_gguf::GgufFile;
use coil_kernels::ops::act::add_bias_rows;
use coil_kernels::ops::attention::attention_windowed;
use coil_kernels::ops::norm::rms_norm_inplace;
use coil_kernels::ops::rope::{rope, rope_table_factors, RopeStyle};
use coil_kernels::{matmul, matmul_shared, Scratch, ThreadPool};

#[derive(Clone, Copy, Debug)]
pub struct Rope {
    pub n_rot: usize,
    pub freq_base: f32,
    pub freq_scale: f32,
    pub style: RopeStyle,
}

#[derive(Clone, Copy, Debug)]
pub struct AttentionParams {
    pub d_model: usize,
    pub n_head: usize,
    pub n_kv_head: usize,
    pub head_dim: usize,
    /// Multiplies q·k (1/√head_dim unless the model says otherwise).
    pub scale: f32,
    pub rope: Option<Rope>,
    /// Sliding-window attention: each query sees its own position and the
    /// `window − 1` before it (`None`: every earlier position).
    pub window: Option<usize>,
}

/// RMSNorms of each query and key head (weights `[head_dim]`), applied
/// before RoPE (LFM2's `q_layernorm` / `k_layernorm`, GGUF `attn_q_norm` /
/// `attn_k_norm`).
pub struct QkNorm {
    pub q: Vec<f32>,
    pub k: Vec<f32>,
    pub eps: f32,
}

impl QkNorm {
    /// Loads `blk.{layer}.attn_{q,k}_norm.weight`.
    pub fn load(ld: &Loader, layer: usize, head_dim: usize, eps: f32) -> Result<Self, ModelError> {
        Ok(QkNorm {
            q: ld.vector(&format!("blk.{layer}.attn_q_norm.weight"), &[head_dim])?,
            k: ld.vector(&format!("blk.{layer}.attn_k_norm.weight"), &[head_dim])?,
            eps,
        })
    }
}

pub struct Attention {
    pub p: AttentionParams,
    pub wq: Matrix,
    pub wk: Matrix,
    pub wv: Matrix,
    pub wo: Matrix,
    pub bq: Option<Vec<f32>>,
    pub bk: Option<Vec<f32>>,
    pub bv: Option<Vec<f32>>,
    pub bo: Option<Vec<f32>>,
    /// Lane order fix-up applied to q and k within each head:
    /// `new[r] = old[perm[r]]` (see [`bamba_qk_lane_fix`]).
    pub qk_lane_perm: Option<Vec<usize>>,
    pub qk_norm: Option<QkNorm>,
    /// `[n_head, d_model]`: per head, `sigmoid(x·g)` scales its output
    /// (`blk.N.attn_gate.weight`).
    pub head_gate: Option<Matrix>,
    /// RoPE frequency divisors per rotary pair (`rope_freqs.weight`).
    pub rope_freqs: Option<Vec<f32>>,
    /// Low-rank adapters added to q, k and v (`attn_{q,k,v}.weight.lora_{a,b}`).
    pub lora: Option<Box<[Lora; 3]>>,
}

impl Attention {
    pub fn load(ld: &Loader, layer: usize, p: AttentionParams) -> Result<Self, ModelError> {
        Self::load_prefixed(ld, &format!("blk.{layer}"), p, p.d_model)
    }

    /// Loads `{prefix}.attn_*`, with an output projection to `d_out`
    /// (`attn_output` `[d_out, n_head·head_dim]`; the input is `p.d_model`
    /// wide).
    pub fn load_prefixed(
        ld: &Loader,
        prefix: &str,
        p: AttentionParams,
        d_out: usize,
    ) -> Result<Self, ModelError> {
        let n = |t: &str| format!("{prefix}.{t}");
        let (qd, kvd) = (p.n_head * p.head_dim, p.n_kv_head * p.head_dim);
        let bias = |t: &str, len: usize| -> Result<Option<Vec<f32>>, ModelError> {
            let name = n(t);
            if ld.has(&name) {
                ld.vector(&name, &[len]).map(Some)
            } else {
                Ok(None)
            }
        };
        if p.n_kv_head == 0 || !p.n_head.is_multiple_of(p.n_kv_head) {
            return Err(ModelError::BadKey {
                key: format!("{}.attention.head_count_kv", ld.arch),
                reason: format!(
                    "{prefix}: {} KV heads do not divide {} heads",
                    p.n_kv_head, p.n_head
                ),
            });
        }
        Ok(Attention {
            wq: ld.matrix(&n("attn_q.weight"), qd, p.d_model)?,
            wk: ld.matrix(&n("attn_k.weight"), kvd, p.d_model)?,
            wv: ld.matrix(&n("attn_v.weight"), kvd, p.d_model)?,
            wo: ld.matrix(&n("attn_output.weight"), d_out, qd)?,
            bq: bias("attn_q.bias", qd)?,
            bk: bias("attn_k.bias", kvd)?,
            bv: bias("attn_v.bias", kvd)?,
            bo: bias("attn_output.bias", d_out)?,
            qk_lane_perm: None,
            qk_norm: None,
            head_gate: None,
            rope_freqs: None,
            lora: None,
            p,
        })
    }

    fn permute_lanes(&self, x: &mut [f32]) {
        let Some(perm) = &self.qk_lane_perm else {
            return;
        };
        let hd = self.p.head_dim;
        let mut tmp = vec![0f32; hd];
        for head in x.chunks_exact_mut(hd) {
            for (t, &src) in tmp.iter_mut().zip(perm) {
                *t = head[src];
            }
            head.copy_from_slice(&tmp);
        }
    }

    /// `h`: normed input `[n_tokens, d_model]` stacked over `rows`;
    /// `out`: `[n_out, d_out]` (`d_out` = `wo.rows`), the rows `q_rows` lists (every row for
    /// `None`; see [`attend`]). Every row's keys and values are cached.
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
        let n = h.len() / p.d_model;
        let (qd, kvd) = (p.n_head * p.head_dim, p.n_kv_head * p.head_dim);
        let mut k = Scratch::dirty(n * kvd);
        let mut v = Scratch::dirty(n * kvd);
        let (wq, wk, wv) = (self.wq.get(file), self.wk.get(file), self.wv.get(file));
        let hq = q_rows.map(|keep| gather_rows(h, keep, p.d_model));
        let nq = q_rows.map_or(n, <[usize]>::len);
        let mut q = Scratch::dirty(nq * qd);
        match &hq {
            // one activation quantization for the three where they share it
            None => matmul_shared(pool, &[&wq, &wk, &wv], h, &mut [&mut q, &mut k, &mut v], n),
            Some(hq) => {
                matmul(pool, &wq, hq, &mut q, nq);
                matmul_shared(pool, &[&wk, &wv], h, &mut [&mut k, &mut v], n);
            }
        }
        if let Some([lq, lk, lv]) = self.lora.as_deref() {
            lq.add(file, pool, hq.as_deref().unwrap_or(h), &mut q, nq);
            lk.add(file, pool, h, &mut k, n);
            lv.add(file, pool, h, &mut v, n);
        }
        for (x, b) in [(&mut q, &self.bq), (&mut k, &self.bk), (&mut v, &self.bv)] {
            if let Some(b) = b {
                add_bias_rows(x, b);
            }
        }
        if let Some(nrm) = &self.qk_norm {
            rms_norm_inplace(&mut q, Some(&nrm.q), nrm.eps, p.head_dim);
            rms_norm_inplace(&mut k, Some(&nrm.k), nrm.eps, p.head_dim);
        }
        self.permute_lanes(&mut q);
        self.permute_lanes(&mut k);
        // (every row written by `attend`: each query row is in one chunk)
        let mut att = Scratch::dirty(nq * qd);
        attend(
            pool,
            p,
            layer,
            rows,
            mem,
            q_rows,
            &mut q,
            &mut k,
            &v,
            &mut att,
            self.rope_freqs.as_deref(),
        )?;
        if let Some(g) = &self.head_gate {
            // sigmoid(x·g) per (row, head), from the normed input rows.
            let mut gate = Scratch::dirty(nq * p.n_head);
            matmul(
                pool,
                &g.get(file),
                hq.as_deref().unwrap_or(h),
                &mut gate,
                nq,
            );
            for (head, &gv) in att.chunks_exact_mut(p.head_dim).zip(gate.iter()) {
                let s = 1.0 / (1.0 + (-gv).exp());
                head.iter_mut().for_each(|v| *v *= s);
            }
        }
        let out = &mut out[..nq * self.wo.rows];
        matmul(pool, &self.wo.get(file), &att, out, nq);
        if let Some(b) = &self.bo {
            add_bias_rows(out, b);
        }
        Ok(())
    }
}

/// The core both attention blocks share: for each sequence chunk of `rows`,
/// rotate its queries and keys (`p.rope`), append its keys and values to the
/// sequence's KV cells of `layer`, and attend causally over them.
/// `k`, `v`: `[n_tokens, n_kv_head·head_dim]` (`v` empty for a latent
/// layer, whose values are its keys); `q`, `att`: `[n_q,
/// n_head·head_dim]`, the queries of every row (`q_rows` `None`) or of the
/// rows `q_rows` lists (ascending: a prompt's last layer, whose other rows
/// are never read).
#[allow(clippy::too_many_arguments)]
pub(super) fn attend(
    pool: &ThreadPool,
    p: &AttentionParams,
    layer: usize,
    rows: &[Rows],
    mem: &mut Memory,
    q_rows: Option<&[usize]>,
    q: &mut [f32],
    k: &mut [f32],
    v: &[f32],
    att: &mut [f32],
    rope_freqs: Option<&[f32]>,
) -> Result<(), ModelError> {
    let (qd, kvd) = (p.n_head * p.head_dim, p.n_kv_head * p.head_dim);
    let kv = mem.kv.as_mut().ok_or_else(|| ModelError::Tensor {
        name: format!("blk.{layer}"),
        reason: "memory has no KV cells for attention layers".into(),
    })?;
    if let Some(keep) = q_rows {
        assert!(
            keep.windows(2).all(|w| w[0] < w[1]),
            "query rows not ascending"
        );
    }
    for r in rows {
        let t = r.rows.len();
        let positions: Vec<usize> = (r.pos..r.pos + t).collect();
        // This chunk's queries: their rows in `q` and their positions.
        let (qr, q_pos) = match q_rows {
            None => (r.rows.clone(), positions.clone()),
            Some(keep) => {
                let a = keep.partition_point(|&x| x < r.rows.start);
                let b = keep.partition_point(|&x| x < r.rows.end);
                let pos = keep[a..b].iter().map(|&x| r.pos + x - r.rows.start);
                (a..b, pos.collect())
            }
        };
        let qs = &mut q[qr.start * qd..qr.end * qd];
        let ks = &mut k[r.rows.start * kvd..r.rows.end * kvd];
        if let Some(rp) = p.rope {
            let table_at = |pos: &[usize]| {
                rope_table_factors(pool, pos, rp.n_rot, rp.freq_base, rp.freq_scale, rope_freqs)
            };
            let table = table_at(&positions);
            rope(ks, p.n_kv_head, p.head_dim, rp.n_rot, &table, rp.style);
            if q_rows.is_none() {
                rope(qs, p.n_head, p.head_dim, rp.n_rot, &table, rp.style);
            } else {
                let table = table_at(&q_pos);
                rope(qs, p.n_head, p.head_dim, rp.n_rot, &table, rp.style);
            }
        }
        let vs = match v.is_empty() {
            true => &[][..],
            false => &v[r.rows.start * kvd..r.rows.end * kvd],
        };
        kv.append(layer, r.seq, r.pos, ks, vs)?;
        if qs.is_empty() {
            continue;
        }
        let pages = kv.view(layer, r.seq)?.ok_or_else(|| ModelError::Tensor {
            name: format!("blk.{layer}"),
            reason: "memory has no KV cells for this layer".into(),
        })?;
        let view = pages.view();
        let kv_len: Vec<usize> = q_pos.iter().map(|&p| p + 1).collect();
        attention_windowed(
            pool,
            qs,
            p.n_head,
            &view,
            &kv_len,
            p.window,
            p.scale,
            &mut att[qr.start * qd..qr.end * qd],
        );
    }
    Ok(())
}

/// llama.cpp's converter permutes the rows of the *whole* Q/K head into
/// adjacent-pair order for Bamba, although only the first `n_rot` lanes
/// rotate. This maps its lane order back to the correct one (only the rotary
/// lanes in adjacent pairs, the rest in Hugging Face order):
/// `new[r] = old[perm[r]]`.
pub fn bamba_qk_lane_fix(head_dim: usize, n_rot: usize) -> Vec<usize> {
    let half = head_dim / 2;
    // Where llama.cpp put Hugging Face lane k: row 2i + j holds HF j·half + i.
    let gguf_pos = |k: usize| 2 * (k % half) + k / half;
    (0..head_dim)
        .map(|r| {
            let hf = if r < n_rot {
                // Correct order: row 2i + j holds HF j·(n_rot/2) + i.
                (r % 2) * (n_rot / 2) + r / 2
            } else {
                r
            };
            gguf_pos(hf)
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bamba_lane_fix_matches_the_documented_layout() {
        // head_dim 16, n_rot 8: GGUF row 2i holds HF i, row 2i+1 holds HF i+8.
        let p = bamba_qk_lane_fix(16, 8);
        // Correct rows 0, 1 = HF 0, 4 → GGUF rows 0, 8.
        assert_eq!(&p[..4], &[0, 8, 2, 10]);
        // Correct row 8 = HF 8 → GGUF row 1; row 15 = HF 15 → GGUF row 15.
        assert_eq!(p[8], 1);
        assert_eq!(p[15], 15);
        let mut sorted = p.clone();
        sorted.sort();
        assert_eq!(sorted, (0..16).collect::<Vec<_>>());
        // Full rotary: the fix is the identity.
        assert_eq!(bamba_qk_lane_fix(8, 8), (0..8).collect::<Vec<_>>());
    }
}
