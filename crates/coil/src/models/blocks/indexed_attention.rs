//! Indexed (query-selected sparse) attention, Qwen4-Exp's "QSA": gated
//! attention (see [`GatedAttention`]) in which each query attends only to
//! the tokens a light indexer picks:
//!
//! * the keys are grouped in blocks of `r` consecutive positions
//!   (`attention.compress_ratios`); a block's index key is the mean of its
//!   raw indexer keys (`indexer.k_proj`), RMS-normalised (`indexer.k_norm`)
//!   and rotated at the block's first position;
//! * the query's index heads (`indexer.q_proj`, `indexer.head_count` ×
//!   `indexer.key_length`) are RMS-normalised per head (`indexer.q_norm`)
//!   and rotated at its position; a block's score is
//!   `Σ_h relu(q_h · k_block) / √key_length`;
//! * a query at position p sees the `⌊(p + 1)/r⌋` complete blocks at or
//!   before it and attends to the top `indexer.top_k / r` of them by score
//!   (all of them while they are no more) plus the incomplete tail
//!   `r·⌊(p + 1)/r⌋ ..= p`.
//!
//! The indexer's rotation is the attention's (its first `n_rot` lanes,
//! NeoX halves). Its raw keys are cached per position beside the
//! attention's keys and values (a KV layer of one head of `key_length`),
//! so blocks are pooled from the cache as they complete.

use super::attention::Rope;
use super::gated_attention::GatedAttention;
use crate::memory::Memory;
use crate::models::weights::{Loader, Matrix};
use crate::models::{ModelError, Rows};
use coil_gguf::GgufFile;
use coil_kernels::ops::attention::{attention_selected, KvView};
use coil_kernels::ops::norm::rms_norm_inplace;
use coil_kernels::ops::rope::{rope, rope_table};
use coil_kernels::{matmul, Scratch, ThreadPool};

/// The token indexer of one layer.
pub struct QsaIndexer {
    pub n_head: usize,
    pub head_dim: usize,
    /// Tokens per block `r`.
    pub ratio: usize,
    /// Blocks each query keeps: `indexer.top_k / r`.
    pub top_blocks: usize,
    pub eps: f32,
    /// `[n_head·head_dim, d_model]`
    pub wq: Matrix,
    /// `[head_dim, d_model]`
    pub wk: Matrix,
    pub q_norm: Vec<f32>,
    pub k_norm: Vec<f32>,
    pub rope: Rope,
}

/// The indexer's hyper-parameters shared by its layers.
#[derive(Clone, Copy, Debug)]
pub struct QsaParams {
    pub n_head: usize,
    pub head_dim: usize,
    /// `indexer.top_k`: tokens of complete blocks each query keeps.
    pub top_k: usize,
}

impl QsaParams {
    /// Reads `attention.indexer.{head_count, key_length, top_k}`.
    pub fn from_gguf(ld: &Loader) -> Result<Self, ModelError> {
        Ok(QsaParams {
            n_head: ld.u_in("attention.indexer.head_count", 1, 4096)?,
            head_dim: ld.u_in("attention.indexer.key_length", 2, 1 << 16)?,
            top_k: ld.u_in("attention.indexer.top_k", 1, 1 << 30)?,
        })
    }
}

impl QsaIndexer {
    /// Loads `blk.{layer}.indexer.{q_proj,k_proj,q_norm,k_norm}` for blocks
    /// of `ratio` tokens.
    pub fn load(
        ld: &Loader,
        layer: usize,
        d_model: usize,
        p: QsaParams,
        ratio: usize,
        rope: Rope,
        eps: f32,
    ) -> Result<Self, ModelError> {
        let n = |t: &str| format!("blk.{layer}.indexer.{t}.weight");
        let key = |s: &str| format!("{}.{s}", ld.arch);
        if !p.top_k.is_multiple_of(ratio) {
            return Err(ModelError::BadKey {
                key: key("attention.indexer.top_k"),
                reason: format!(
                    "{} is not a multiple of layer {layer}'s block of {ratio} tokens",
                    p.top_k
                ),
            });
        }
        if rope.n_rot > p.head_dim {
            return Err(ModelError::BadKey {
                key: key("attention.indexer.key_length"),
                reason: format!(
                    "{} is less than the {} rotated lanes",
                    p.head_dim, rope.n_rot
                ),
            });
        }
        Ok(QsaIndexer {
            n_head: p.n_head,
            head_dim: p.head_dim,
            ratio,
            top_blocks: p.top_k / ratio,
            eps,
            wq: ld.matrix(&n("q_proj"), p.n_head * p.head_dim, d_model)?,
            wk: ld.matrix(&n("k_proj"), p.head_dim, d_model)?,
            q_norm: ld.vector(&n("q_norm"), &[p.head_dim])?,
            k_norm: ld.vector(&n("k_norm"), &[p.head_dim])?,
            rope,
        })
    }

    /// The index keys of the first `n_blocks` blocks of the raw keys `raw`
    /// (`[n_blocks, head_dim]`).
    fn block_keys(&self, pool: &ThreadPool, raw: &KvView, n_blocks: usize) -> Vec<f32> {
        let (hd, r) = (self.head_dim, self.ratio);
        let mut keys = vec![0f32; n_blocks * hd];
        let mut buf = vec![0f32; hd];
        for (b, kb) in keys.chunks_exact_mut(hd).enumerate() {
            for p in b * r..(b + 1) * r {
                let row = raw.k_row(0, p, &mut buf);
                kb.iter_mut().zip(row).for_each(|(a, x)| *a += x);
            }
            kb.iter_mut().for_each(|a| *a /= r as f32);
        }
        rms_norm_inplace(&mut keys, Some(&self.k_norm), self.eps, hd);
        let starts: Vec<usize> = (0..n_blocks).map(|b| b * r).collect();
        let table = rope_table(
            pool,
            &starts,
            self.rope.n_rot,
            self.rope.freq_base,
            self.rope.freq_scale,
        );
        rope(&mut keys, 1, hd, self.rope.n_rot, &table, self.rope.style);
        keys
    }

    /// The positions each query attends to (appended to `positions`, one
    /// offset pushed per query): `q` holds the queries' index heads
    /// (`[t, n_head·head_dim]`, normalised and rotated) at positions
    /// `q_pos`, `raw` the sequence's raw indexer keys.
    fn select(
        &self,
        pool: &ThreadPool,
        q: &[f32],
        q_pos: &[usize],
        raw: &KvView,
        positions: &mut Vec<u32>,
        offsets: &mut Vec<usize>,
    ) {
        let (hd, r) = (self.head_dim, self.ratio);
        let most = q_pos.iter().map(|&p| (p + 1) / r).max().unwrap_or(0);
        let keys = match most > self.top_blocks {
            true => self.block_keys(pool, raw, most),
            false => Vec::new(),
        };
        let inv = 1.0 / (hd as f32).sqrt();
        let mut scored: Vec<(f32, usize)> = Vec::new();
        for (qt, &p) in q.chunks_exact(self.n_head * hd).zip(q_pos) {
            let nc = (p + 1) / r;
            if nc <= self.top_blocks {
                positions.extend(0..=p as u32);
            } else {
                scored.clear();
                for (b, kb) in keys.chunks_exact(hd).take(nc).enumerate() {
                    let s: f32 = qt
                        .chunks_exact(hd)
                        .map(|qh| qh.iter().zip(kb).map(|(a, b)| a * b).sum::<f32>().max(0.0))
                        .sum();
                    scored.push((s * inv, b));
                }
                // the highest scores; of equal ones the earlier block
                scored.sort_by(|a, b| b.0.total_cmp(&a.0).then(a.1.cmp(&b.1)));
                for &(_, b) in &scored[..self.top_blocks] {
                    positions.extend((b * r) as u32..((b + 1) * r) as u32);
                }
                positions.extend((nc * r) as u32..=p as u32);
            }
            offsets.push(positions.len());
        }
    }
}

pub struct IndexedAttention {
    pub attn: GatedAttention,
    pub indexer: QsaIndexer,
    /// The memory layer holding the indexer's raw keys.
    pub key_layer: usize,
}

impl IndexedAttention {
    /// `h`: the block input `[n_tokens, d_model]` stacked over `rows`;
    /// `out`: `[n_tokens, d_model]`. Every row's keys, values and raw index
    /// keys are cached.
    #[allow(clippy::too_many_arguments)]
    pub fn forward(
        &self,
        file: &GgufFile,
        pool: &ThreadPool,
        layer: usize,
        rows: &[Rows],
        mem: &mut Memory,
        h: &[f32],
        out: &mut [f32],
    ) -> Result<(), ModelError> {
        let p = &self.attn.p;
        let ix = &self.indexer;
        let n = h.len() / p.d_model;
        let (qd, kvd) = (p.n_head * p.head_dim, p.n_kv_head * p.head_dim);
        let iqd = ix.n_head * ix.head_dim;
        let (mut q, gate, mut k, v) = self.attn.project(file, pool, h, None);
        let mut iq = Scratch::dirty(n * iqd);
        matmul(pool, &ix.wq.get(file), h, &mut iq, n);
        let mut ik = Scratch::dirty(n * ix.head_dim);
        matmul(pool, &ix.wk.get(file), h, &mut ik, n);
        rms_norm_inplace(&mut iq, Some(&ix.q_norm), ix.eps, ix.head_dim);
        let kv = mem.kv.as_mut().ok_or_else(|| ModelError::Tensor {
            name: format!("blk.{layer}"),
            reason: "memory has no KV cells for attention layers".into(),
        })?;
        let mut att = Scratch::dirty(n * qd);
        for r in rows {
            let t = r.rows.len();
            let pos: Vec<usize> = (r.pos..r.pos + t).collect();
            let qs = &mut q[r.rows.start * qd..r.rows.end * qd];
            let ks = &mut k[r.rows.start * kvd..r.rows.end * kvd];
            let iqs = &mut iq[r.rows.start * iqd..r.rows.end * iqd];
            if let Some(rp) = p.rope {
                let table = rope_table(pool, &pos, rp.n_rot, rp.freq_base, rp.freq_scale);
                rope(ks, p.n_kv_head, p.head_dim, rp.n_rot, &table, rp.style);
                rope(qs, p.n_head, p.head_dim, rp.n_rot, &table, rp.style);
            }
            let ir = ix.rope;
            let table = rope_table(pool, &pos, ir.n_rot, ir.freq_base, ir.freq_scale);
            rope(iqs, ix.n_head, ix.head_dim, ir.n_rot, &table, ir.style);
            kv.append(
                layer,
                r.seq,
                r.pos,
                ks,
                &v[r.rows.start * kvd..r.rows.end * kvd],
            )?;
            let iks = &ik[r.rows.start * ix.head_dim..r.rows.end * ix.head_dim];
            kv.append(self.key_layer, r.seq, r.pos, iks, &[])?;
            let no_cells = |l: usize| ModelError::Tensor {
                name: format!("blk.{l}"),
                reason: "memory has no KV cells for this layer".into(),
            };
            let raw = kv
                .view(self.key_layer, r.seq)?
                .ok_or_else(|| no_cells(self.key_layer))?;
            let mut positions = Vec::new();
            let mut offsets = vec![0];
            ix.select(pool, iqs, &pos, &raw.view(), &mut positions, &mut offsets);
            let cells = kv.view(layer, r.seq)?.ok_or_else(|| no_cells(layer))?;
            attention_selected(
                pool,
                qs,
                p.n_head,
                &cells.view(),
                &positions,
                &offsets,
                p.scale,
                &mut att[r.rows.start * qd..r.rows.end * qd],
            );
        }
        self.attn.finish(file, pool, &mut att, &gate, out);
        Ok(())
    }
}
