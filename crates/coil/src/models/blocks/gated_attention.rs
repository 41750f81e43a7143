//! Gated attention (Qwen3-Next, Qwen3.5): `attn_q` gives, per head, the
//! query and an output gate (`[q (hd) | gate (hd)]`); q and k are
//! RMS-normalised per head (`attn_q_norm`, `attn_k_norm`), rotated on their
//! first `n_rot` lanes (NeoX halves), attend causally over the sequence's
//! KV cells (grouped-query), and the result is scaled by `sigmoid(gate)`
//! before `attn_output`.
//!
//! Qwen3.5's interleaved multi-section RoPE rotates every pair by the
//! position of its section (time, height, width); for text all three are
//! the token's position, so it is this plain rotation.

use super::attention::{attend, AttentionParams};
use super::common::gather_rows;
use crate::memory::Memory;
use crate::models::weights::{Loader, Matrix};
use crate::models::{ModelError, Rows};
use coil_gguf::GgufFile;
use coil_kernels::ops::act::mul_sigmoid_inplace;
use coil_kernels::ops::norm::rms_norm_inplace;
use coil_kernels::{matmul, matmul_shared, Scratch, ThreadPool};

pub struct GatedAttention {
    pub p: AttentionParams,
    pub eps: f32,
    /// `[n_head · 2 · head_dim, d_model]`: per head q then gate.
    pub wq: Matrix,
    pub wk: Matrix,
    pub wv: Matrix,
    pub wo: Matrix,
    pub q_norm: Vec<f32>,
    pub k_norm: Vec<f32>,
}

impl GatedAttention {
    pub fn load(
        ld: &Loader,
        layer: usize,
        p: AttentionParams,
        eps: f32,
    ) -> Result<Self, ModelError> {
        let n = |t: &str| format!("blk.{layer}.{t}");
        let (qd, kvd, hd) = (p.n_head * p.head_dim, p.n_kv_head * p.head_dim, p.head_dim);
        if p.n_kv_head == 0 || !p.n_head.is_multiple_of(p.n_kv_head) {
            return Err(ModelError::BadKey {
                key: format!("{}.attention.head_count_kv", ld.arch),
                reason: format!(
                    "layer {layer}: {} KV heads do not divide {} heads",
                    p.n_kv_head, p.n_head
                ),
            });
        }
        Ok(GatedAttention {
            wq: ld.matrix(&n("attn_q.weight"), 2 * qd, p.d_model)?,
            wk: ld.matrix(&n("attn_k.weight"), kvd, p.d_model)?,
            wv: ld.matrix(&n("attn_v.weight"), kvd, p.d_model)?,
            wo: ld.matrix(&n("attn_output.weight"), p.d_model, qd)?,
            q_norm: ld.vector(&n("attn_q_norm.weight"), &[hd])?,
            k_norm: ld.vector(&n("attn_k_norm.weight"), &[hd])?,
            p,
            eps,
        })
    }

    /// `h`: normed input `[n_tokens, d_model]` stacked over `rows`;
    /// `out`: `[n_out, d_model]`, the rows `q_rows` lists (every row for
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
        let (mut q, gate, mut k, v) = self.project(file, pool, h, q_rows);
        // (every row written by `attend`: each query row is in one chunk)
        let p = &self.p;
        let mut att = Scratch::dirty(gate.len());
        attend(
            pool, p, layer, rows, mem, q_rows, &mut q, &mut k, &v, &mut att, None,
        )?;
        self.finish(file, pool, &mut att, &gate, out);
        Ok(())
    }

    /// The projections of the rows `h` (`[n, d_model]`): the queries (of
    /// `q_rows`, or every row) RMS-normalised per head and their gates
    /// (`[n_q, n_head·head_dim]` each), the keys RMS-normalised per head
    /// and the values (`[n, n_kv_head·head_dim]` each); no rotation yet.
    pub fn project(
        &self,
        file: &GgufFile,
        pool: &ThreadPool,
        h: &[f32],
        q_rows: Option<&[usize]>,
    ) -> (Scratch, Scratch, Scratch, Scratch) {
        let p = &self.p;
        let n = h.len() / p.d_model;
        let hd = p.head_dim;
        let (qd, kvd) = (p.n_head * hd, p.n_kv_head * hd);
        let nq = q_rows.map_or(n, <[usize]>::len);
        let mut qg = Scratch::dirty(nq * 2 * qd);
        let mut k = Scratch::dirty(n * kvd);
        let mut v = Scratch::dirty(n * kvd);
        let (wq, wk, wv) = (self.wq.get(file), self.wk.get(file), self.wv.get(file));
        match q_rows {
            // one activation quantization for the three where they share it
            None => matmul_shared(pool, &[&wq, &wk, &wv], h, &mut [&mut qg, &mut k, &mut v], n),
            Some(keep) => {
                matmul(pool, &wq, &gather_rows(h, keep, p.d_model), &mut qg, nq);
                matmul_shared(pool, &[&wk, &wv], h, &mut [&mut k, &mut v], n);
            }
        }
        // Split [q | gate] per head, q and k RMS-normalised per head.
        let mut q = Scratch::dirty(nq * qd);
        let mut gate = Scratch::dirty(nq * qd);
        let halves = |r0: usize, part: &mut [f32], second: bool| {
            let src = qg[r0 * 2 * qd..].chunks_exact(2 * hd);
            for (s, dst) in src.zip(part.chunks_exact_mut(hd)) {
                dst.copy_from_slice(if second { &s[hd..] } else { &s[..hd] });
            }
        };
        pool.rows_mut(&mut gate, qd, 16, |r0, part| halves(r0, part, true));
        pool.rows_mut(&mut q, qd, 16, |r0, part| {
            halves(r0, part, false);
            rms_norm_inplace(part, Some(&self.q_norm), self.eps, hd);
        });
        pool.rows_mut(&mut k, kvd, 16, |_, part| {
            rms_norm_inplace(part, Some(&self.k_norm), self.eps, hd)
        });
        (q, gate, k, v)
    }

    /// `out = (att ⊙ sigmoid(gate))·Wo` (`att`, `gate`: `[n_q, n_head·head_dim]`;
    /// `out`: at least `[n_q, d_model]`).
    pub fn finish(
        &self,
        file: &GgufFile,
        pool: &ThreadPool,
        att: &mut [f32],
        gate: &[f32],
        out: &mut [f32],
    ) {
        let p = &self.p;
        let qd = p.n_head * p.head_dim;
        let nq = att.len() / qd;
        pool.rows_mut(att, qd, 16, |r0, part| {
            mul_sigmoid_inplace(part, &gate[r0 * qd..r0 * qd + part.len()])
        });
        matmul(
            pool,
            &self.wo.get(file),
            att,
            &mut out[..nq * p.d_model],
            nq,
        );
    }
}
