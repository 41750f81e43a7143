//! Per-layer embedding (PLE, Qwen4-Exp): before its layer, each token's
//! hashed n-gram embedding e (see [`super::ngram_embedding`]) is injected
//! into every hyper-connection stream x_s (`[n, hc·d]`):
//!
//! ```text
//! k_s = RMSNorm_d(key(e))_s · w_k       q_s = RMSNorm_d(x)_s · w_q      (per stream of d)
//! g_s = sign(k_s·q_s/√d)·√max(|k_s·q_s/√d|, 1e-6)
//! u_s = sigmoid(g_s) · value(e)                                        ([n, hc·d])
//! x += u + silu(conv(RMSNorm_d(u)·w_c))
//! ```
//!
//! `conv` is a causal depthwise convolution over the `hc·d` channels with
//! `K` taps (`ple.conv_kernel`) spaced `n` tokens apart (the n-gram size):
//! `out[t] = Σ_k w[k]·in[t − (K − 1 − k)·n]`.
//!
//! Its recurrent state per sequence: the last `(K − 1)·n` convolution
//! inputs and the last `n − 1` tokens (for the hash; stored as token + 1,
//! 0 before the sequence start), in the recurrent memory's conv slot.

use super::common::{layer_state, recurrent_memory};
use super::hyper_connection::{grouped_rms_norm, grouped_weight};
use super::ngram_embedding::{NgramEmbedding, NgramHash};
use crate::memory::{Memory, RecurrentLayerShape};
use crate::models::weights::{Loader, Matrix};
use crate::models::{ModelError, Rows};
use coil_gguf::GgufFile;
use coil_kernels::{matmul, Scratch, ThreadPool};

pub struct PerLayerEmbedding {
    pub embedding: NgramEmbedding,
    pub hc: usize,
    pub d: usize,
    pub eps: f32,
    /// `[hc·d, width]`
    pub key: Matrix,
    /// `[d, width]`
    pub value: Matrix,
    /// `[hc·d]` each
    pub norm_key: Vec<f32>,
    pub norm_query: Vec<f32>,
    pub norm_conv: Vec<f32>,
    /// `[hc·d, K]`
    pub conv: Vec<f32>,
    pub kernel: usize,
}

impl PerLayerEmbedding {
    /// Loads layer `layer`'s `ple_*` tensors and the shared table.
    pub fn load(
        ld: &Loader,
        layer: usize,
        (hc, d): (usize, usize),
        eps: f32,
    ) -> Result<Self, ModelError> {
        let hash = NgramHash::from_gguf(ld)?;
        let head_dim = ld.u_in("embedding_length_per_layer_input", 1, 1 << 20)?;
        let embedding = NgramEmbedding::load(ld, hash, head_dim)?;
        let kernel = ld.u_in("ple.conv_kernel", 1, 64)?;
        let width = embedding.width();
        let n = |t: &str| format!("blk.{layer}.{t}.weight");
        Ok(PerLayerEmbedding {
            key: ld.matrix(&n("ple_key"), hc * d, width)?,
            value: ld.matrix(&n("ple_value"), d, width)?,
            norm_key: grouped_weight(ld, &n("ple_norm_key"), d, hc)?,
            norm_query: grouped_weight(ld, &n("ple_norm_query"), d, hc)?,
            norm_conv: grouped_weight(ld, &n("ple_norm_conv"), d, hc)?,
            conv: ld.vector(&n("ple_conv1d"), &[kernel, hc * d])?,
            embedding,
            hc,
            d,
            eps,
            kernel,
        })
    }

    /// Convolution inputs kept: `(K − 1)·n`.
    fn history(&self) -> usize {
        (self.kernel - 1) * self.embedding.hash.ngram
    }

    /// Tokens kept for the hash: `n − 1`.
    fn context(&self) -> usize {
        self.embedding.hash.ngram - 1
    }

    pub fn state_shape(&self) -> RecurrentLayerShape {
        RecurrentLayerShape {
            conv: self.history() * self.hc * self.d + self.context(),
            ssm: 0,
        }
    }

    /// `x += PLE(x, tokens)` for the streams `x` (`[n, hc·d]`) of the
    /// chunks `rows`; `state_layer`: where its state lies in the memory.
    #[allow(clippy::too_many_arguments)]
    pub fn forward(
        &self,
        file: &GgufFile,
        pool: &ThreadPool,
        state_layer: usize,
        rows: &[Rows],
        mem: &mut Memory,
        tokens: &[u32],
        x: &mut [f32],
    ) -> Result<(), ModelError> {
        let (hc, d) = (self.hc, self.d);
        let w = hc * d;
        let n = x.len() / w;
        let width = self.embedding.width();
        let (hist, ctx) = (self.history(), self.context());
        let rec = recurrent_memory(mem, state_layer)?;
        // The hashed embeddings, each chunk after its sequence's last tokens.
        let mut e = Scratch::dirty(n * width);
        for r in rows {
            let st = layer_state(rec, state_layer, r.seq)?;
            let before: Vec<Option<u32>> = st.conv[hist * w..]
                .iter()
                .map(|&v| (v >= 1.0).then(|| v as u32 - 1))
                .collect();
            self.embedding.forward(
                file,
                &before,
                &tokens[r.rows.clone()],
                &mut e[r.rows.start * width..r.rows.end * width],
            )?;
        }
        let mut key = Scratch::dirty(n * w);
        matmul(pool, &self.key.get(file), &e, &mut key, n);
        let mut value = Scratch::dirty(n * d);
        matmul(pool, &self.value.get(file), &e, &mut value, n);
        let mut kn = Scratch::dirty(n * w);
        grouped_rms_norm(pool, &key, &self.norm_key, self.eps, d, &mut kn);
        let mut qn = Scratch::dirty(n * w);
        grouped_rms_norm(pool, x, &self.norm_query, self.eps, d, &mut qn);
        // u = sigmoid(gate) · value, per stream.
        let mut u = Scratch::dirty(n * w);
        let inv = 1.0 / (d as f32).sqrt();
        pool.rows_mut(&mut u, w, 16, |r0, part| {
            for (i, ur) in part.chunks_exact_mut(w).enumerate() {
                let r = r0 + i;
                let v = &value[r * d..(r + 1) * d];
                for (s, us) in ur.chunks_exact_mut(d).enumerate() {
                    let at = r * w + s * d;
                    let dot: f32 = kn[at..at + d]
                        .iter()
                        .zip(&qn[at..at + d])
                        .map(|(a, b)| a * b)
                        .sum();
                    let g = dot * inv;
                    let g = g.signum() * g.abs().max(1e-6).sqrt() * (g != 0.0) as u8 as f32;
                    let sg = 1.0 / (1.0 + (-g).exp());
                    us.iter_mut().zip(v).for_each(|(o, &vi)| *o = sg * vi);
                }
            }
        });
        let mut un = Scratch::dirty(n * w);
        grouped_rms_norm(pool, &u, &self.norm_conv, self.eps, d, &mut un);
        // The dilated causal conv per chunk, with its sequence's history.
        let dil = self.embedding.hash.ngram;
        let k = self.kernel;
        let mut conv_out = Scratch::dirty(n * w);
        for r in rows {
            let st = layer_state(rec, state_layer, r.seq)?;
            let t = r.rows.len();
            // [hist + t, w]: the kept inputs, then this chunk's.
            let mut input = Vec::with_capacity((hist + t) * w);
            input.extend_from_slice(&st.conv[..hist * w]);
            input.extend_from_slice(&un[r.rows.start * w..r.rows.end * w]);
            let out = &mut conv_out[r.rows.start * w..r.rows.end * w];
            pool.rows_mut(out, w, 16, |t0, part| {
                for (i, o) in part.chunks_exact_mut(w).enumerate() {
                    let at = hist + t0 + i;
                    for (c, oc) in o.iter_mut().enumerate() {
                        let taps = &self.conv[c * k..(c + 1) * k];
                        let mut acc = 0f32;
                        for (j, &wt) in taps.iter().enumerate() {
                            acc += wt * input[(at - (k - 1 - j) * dil) * w + c];
                        }
                        *oc = acc / (1.0 + (-acc).exp());
                    }
                }
            });
            // New state: the last `hist` inputs and the last `n − 1` tokens.
            st.conv[..hist * w].copy_from_slice(&input[t * w..]);
            let toks = &tokens[r.rows.clone()];
            let old: Vec<f32> = st.conv[hist * w..].to_vec();
            let all: Vec<f32> = old
                .into_iter()
                .chain(toks.iter().map(|&t| t as f32 + 1.0))
                .collect();
            st.conv[hist * w..].copy_from_slice(&all[all.len() - ctx..]);
        }
        pool.rows_mut(x, w, 16, |r0, part| {
            let at = r0 * w;
            for (i, xv) in part.iter_mut().enumerate() {
                *xv += u[at + i] + conv_out[at + i];
            }
        });
        Ok(())
    }
}
