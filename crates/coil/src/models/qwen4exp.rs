//! Qwen4-Exp (`qwen4exp`): Qwen3.5-MoE's Gated DeltaNet and gated
//! attention layers with three additions. The residual is `hc` parallel
//! streams mixed by gated hyper-connections in place of every norm; the
//! attention layers are indexed (each query attends to the top-scoring
//! blocks of earlier tokens an indexer picks, plus its own block's tail);
//! and one DeltaNet layer first adds a per-layer embedding of hashed token
//! n-grams. Per layer:
//!
//! ```text
//! X = [x | x | … | x]                        (hc streams of the embedding)
//! X += PLE(X, tokens)                         (the `ple.layers` layer only)
//! h, w = HC_attn(X);   X[s] += w[s]·mixer(h)  (mixer: Gated DeltaNet, or indexed attention)
//! h, w = HC_ffn(X);    X[s] += w[s]·moe(h)    (softmax top-k experts + gated shared expert)
//! logits = output(HC_out(X))                  (the final mixer is the output norm)
//! ```
//!
//! * Gated DeltaNet (`attention.recurrent_layers`): Qwen3.5's, value heads
//!   in llama.cpp's tiled order, the output gate `sigmoid(z)` (silu in
//!   Qwen3.5; llama.cpp's files carry no switch, transformers'
//!   `output_gate_type` of the released model);
//! * attention: [`GatedAttention`] (q/k RMSNorms, sigmoid output gate,
//!   rotation of the first `rope.dimension_count` lanes, NeoX halves:
//!   Qwen3.5's interleaved multi-section RoPE of text), restricted by
//!   [`QsaIndexer`] to blocks of `attention.compress_ratios[l]` tokens; a
//!   ratio of 0 is dense attention, as llama.cpp reads it;
//! * hyper-connections: [`HyperConnection`] (`blk.N.hc_attn_*`,
//!   `blk.N.hc_ffn_*`, `output_hc_*`);
//! * PLE: [`PerLayerEmbedding`] over the hashed n-gram table
//!   `per_layer_token_embd` (one PLE layer, as llama.cpp's files hold one
//!   set of hash constants).
//!
//! Memory: the DeltaNet layers' recurrent states, the attention layers' KV
//! cells, and past the trunk's `L` layers the PLE layer's state (layer `L`:
//! its convolution inputs and last tokens) and each indexed layer `l`'s raw
//! indexer keys (layer `L + 1 + l`, one head of `indexer.key_length` per
//! position).

use super::blocks::common::{check_ubatch, gather_rows, Embedding};
use super::blocks::gated_attention::GatedAttention;
use super::blocks::gated_delta_mixer::{GatedDeltaMixer, GatedDeltaParams};
use super::blocks::hyper_connection::{combine, HyperConnection};
use super::blocks::indexed_attention::{IndexedAttention, QsaIndexer, QsaParams};
use super::blocks::per_layer_embedding::PerLayerEmbedding;
use super::blocks::stack::FfnBlock;
use super::hparams::{attention_params, base_info, norm_eps};
use super::plan::per_layer_u64;
use super::qwen35::check_rope_sections;
use super::qwen3next::qwen_ffn;
use super::weights::{Loader, Matrix};
use super::{LayerPlan, Model, ModelError, ModelInfo, UBatch};
use crate::memory::{KvLayerShape, KvMemory, Memory, RecurrentLayerShape, RecurrentMemory};
use coil_gguf::{GgufFile, Value};
use coil_kernels::ops::delta::HeadOrder;
use coil_kernels::ops::rope::RopeStyle;
use coil_kernels::{matmul, Scratch, ThreadPool};
use std::sync::Arc;

pub enum Qwen4Mixer {
    DeltaNet(Box<GatedDeltaMixer>),
    Indexed(Box<IndexedAttention>),
    /// An attention layer without a block size (`compress_ratios` 0).
    Dense(Box<GatedAttention>),
}

pub struct Qwen4Layer {
    pub ple: Option<PerLayerEmbedding>,
    pub mixer_hc: HyperConnection,
    pub mixer: Qwen4Mixer,
    pub ffn_hc: HyperConnection,
    pub ffn: FfnBlock,
}

pub struct Qwen4Exp {
    pub file: Arc<GgufFile>,
    pub info: ModelInfo,
    pub embed: Embedding,
    pub layers: Vec<Qwen4Layer>,
    pub out_hc: HyperConnection,
    pub output: Matrix,
    pub hc: usize,
}

/// The PLE layer (`ple.layers`, one entry), if the file has one.
fn ple_layer(ld: &Loader, plan: &LayerPlan) -> Result<Option<usize>, ModelError> {
    let key = format!("{}.ple.layers", ld.arch);
    let bad = |reason: String| ModelError::BadKey {
        key: key.clone(),
        reason,
    };
    let items = match ld.file.metadata().get(&key) {
        None => return Ok(None),
        Some(Value::Array(_, items)) => items,
        Some(v) => return Err(bad(format!("{v} is not an array of layers"))),
    };
    let layers: Vec<usize> = items
        .iter()
        .map(|v| {
            v.as_u64()
                .map(|x| x as usize)
                .ok_or_else(|| bad(format!("entry {v} is not a layer")))
        })
        .collect::<Result<_, _>>()?;
    match layers[..] {
        [] => Ok(None),
        [l] if l >= plan.layers.len() => Err(bad(format!("layer {l} is out of range"))),
        [l] if !plan.layers[l].mixer.has_recurrent() => {
            Err(bad(format!("layer {l} is not a Gated DeltaNet layer")))
        }
        [l] => Ok(Some(l)),
        _ => Err(bad(format!(
            "{} layers listed; one set of hash constants serves one PLE layer",
            layers.len()
        ))),
    }
}

pub fn load(file: Arc<GgufFile>, plan: LayerPlan) -> Result<Qwen4Exp, ModelError> {
    let arch = plan.arch.clone();
    let ld = Loader::new(&file, &arch);
    check_rope_sections(&ld)?;
    let info = base_info(&ld, plan)?;
    let eps = norm_eps(&ld)?;
    let d = info.n_embd;
    let key = |s: &str| format!("{arch}.{s}");
    let hc = ld.u_in("hyper_connection.count", 1, 64)?;
    if hc < 2 {
        return Err(ModelError::BadKey {
            key: key("hyper_connection.count"),
            reason: format!("{hc} stream has nothing to mix (at least 2)"),
        });
    }
    let rank = ld.u_in("hyper_connection.low_rank", 1, 1 << 20)?;
    let n_blocks = info.plan.n_blocks();
    let ratios = per_layer_u64(&file, &key("attention.compress_ratios"), n_blocks)?
        .unwrap_or_else(|| vec![0; n_blocks]);
    let qsa = match info
        .plan
        .layers
        .iter()
        .zip(&ratios)
        .any(|(k, &r)| k.mixer.has_attention() && r > 0)
    {
        true => Some(QsaParams::from_gguf(&ld)?),
        false => None,
    };
    let ple_at = ple_layer(&ld, &info.plan)?;
    if ple_at.is_some() && info.n_vocab >= 1 << 24 {
        return Err(ModelError::Tensor {
            name: "token_embd.weight".into(),
            reason: format!(
                "{} tokens: the n-gram state holds ids below 2^24",
                info.n_vocab
            ),
        });
    }
    let n_layer = info.plan.layers.len();
    let mut layers = Vec::with_capacity(n_layer);
    for (l, kind) in info.plan.layers.iter().enumerate() {
        let mixer = if kind.mixer.has_attention() {
            let p = attention_params(&ld, &info, l, Some(RopeStyle::Neox))?;
            let attn = GatedAttention::load(&ld, l, p, eps)?;
            match (ratios[l], qsa, p.rope) {
                (0, _, _) => Qwen4Mixer::Dense(Box::new(attn)),
                (r, Some(q), Some(rope)) => Qwen4Mixer::Indexed(Box::new(IndexedAttention {
                    indexer: QsaIndexer::load(&ld, l, d, q, r as usize, rope, eps)?,
                    attn,
                    key_layer: n_layer + 1 + l,
                })),
                _ => unreachable!("QSA parameters are read where a layer has a ratio; RoPE is on"),
            }
        } else {
            let mut p = GatedDeltaParams::from_gguf(&ld, d, eps, HeadOrder::Tiled)?;
            p.sigmoid_gate = true;
            Qwen4Mixer::DeltaNet(Box::new(GatedDeltaMixer::load(&ld, l, p)?))
        };
        let ple = match ple_at == Some(l) {
            true => Some(PerLayerEmbedding::load(&ld, l, (hc, d), eps)?),
            false => None,
        };
        layers.push(Qwen4Layer {
            ple,
            mixer_hc: HyperConnection::load(
                &ld,
                &format!("blk.{l}.hc_attn"),
                (hc, d, rank),
                eps,
                true,
            )?,
            mixer,
            ffn_hc: HyperConnection::load(
                &ld,
                &format!("blk.{l}.hc_ffn"),
                (hc, d, rank),
                eps,
                true,
            )?,
            ffn: qwen_ffn(&ld, &info, l)?,
        });
    }
    let output = match ld.has("output.weight") {
        true => ld.matrix("output.weight", info.n_vocab, d)?,
        false => ld.matrix("token_embd.weight", info.n_vocab, d)?,
    };
    Ok(Qwen4Exp {
        embed: Embedding::load(&ld, info.n_vocab, d)?,
        out_hc: HyperConnection::load(&ld, "output_hc", (hc, d, rank), eps, false)?,
        output,
        layers,
        hc,
        info,
        file: file.clone(),
    })
}

impl Qwen4Exp {
    /// Where the PLE layer's state lies in the memory.
    fn ple_state_layer(&self) -> usize {
        self.layers.len()
    }
}

impl Model for Qwen4Exp {
    fn info(&self) -> &ModelInfo {
        &self.info
    }

    fn new_memory(&self, n_seq_max: usize, n_ctx: usize) -> Memory {
        let n = self.layers.len();
        let mut rec: Vec<Option<RecurrentLayerShape>> = vec![None; 2 * n + 1];
        let mut kv: Vec<Option<KvLayerShape>> = vec![None; 2 * n + 1];
        for (l, layer) in self.layers.iter().enumerate() {
            match &layer.mixer {
                Qwen4Mixer::DeltaNet(m) => rec[l] = Some(m.p.state_shape()),
                Qwen4Mixer::Dense(a) => {
                    kv[l] = Some(KvLayerShape::heads(a.p.n_kv_head, a.p.head_dim))
                }
                Qwen4Mixer::Indexed(a) => {
                    kv[l] = Some(KvLayerShape::heads(a.attn.p.n_kv_head, a.attn.p.head_dim));
                    kv[a.key_layer] = Some(KvLayerShape::latent(a.indexer.head_dim));
                }
            }
            if let Some(p) = &layer.ple {
                rec[self.ple_state_layer()] = Some(p.state_shape());
            }
        }
        let recurrent = rec
            .iter()
            .any(Option::is_some)
            .then(|| RecurrentMemory::new(rec, n_seq_max));
        let kv = kv
            .iter()
            .any(Option::is_some)
            .then(|| KvMemory::new(kv, n_seq_max, n_ctx));
        Memory::new(recurrent, kv, n_seq_max, n_ctx)
    }

    fn forward(
        &self,
        pool: &ThreadPool,
        ub: &UBatch,
        mem: &mut Memory,
        logits: &mut Vec<f32>,
    ) -> Result<(), ModelError> {
        check_ubatch(ub, mem)?;
        let _numerics = coil_kernels::invariance_scope(ub.invariance);
        let file = &*self.file;
        let (d, hc) = (self.info.n_embd, self.hc);
        let w = hc * d;
        let n = ub.n_tokens();
        let tokens: Vec<u32> = ub
            .chunks
            .iter()
            .flat_map(|c| c.tokens.iter().copied())
            .collect();
        let rows = ub.rows();
        let mut e = Scratch::dirty(n * d);
        self.embed.forward(file, &tokens, &mut e)?;
        // hc copies of each token's embedding
        let mut x = Scratch::dirty(n * w);
        for (xr, er) in x.chunks_exact_mut(w).zip(e.chunks_exact(d)) {
            xr.chunks_exact_mut(d).for_each(|s| s.copy_from_slice(er));
        }
        let mut h = Scratch::dirty(n * d);
        let mut o = Scratch::dirty(n * d);
        let mut inject = Scratch::dirty(n * hc);
        // Past the last layer's mixer (which writes every row's memory) only
        // the rows whose logits are asked for go on.
        let out_rows = ub.logit_rows();
        let last = self.layers.len().saturating_sub(1);
        let mut m = n;
        for (l, layer) in self.layers.iter().enumerate() {
            if let Some(p) = &layer.ple {
                p.forward(
                    file,
                    pool,
                    self.ple_state_layer(),
                    &rows,
                    mem,
                    &tokens,
                    &mut x,
                )?;
            }
            let (hm, om) = (&mut h[..m * d], &mut o[..m * d]);
            layer
                .mixer_hc
                .mix(file, pool, &x[..m * w], hm, Some(&mut inject[..m * hc]));
            match &layer.mixer {
                Qwen4Mixer::DeltaNet(g) => g.forward(file, pool, l, &rows, mem, hm, om)?,
                Qwen4Mixer::Indexed(a) => a.forward(file, pool, l, &rows, mem, hm, om)?,
                Qwen4Mixer::Dense(a) => a.forward(file, pool, l, &rows, mem, hm, None, om)?,
            }
            combine(pool, &mut x[..m * w], om, &inject[..m * hc], hc, d);
            if l == last && out_rows.len() < m {
                x = gather_rows(&x[..m * w], &out_rows, w);
                m = out_rows.len();
            }
            if m == 0 {
                continue;
            }
            let (hm, om) = (&mut h[..m * d], &mut o[..m * d]);
            layer
                .ffn_hc
                .mix(file, pool, &x[..m * w], hm, Some(&mut inject[..m * hc]));
            match &layer.ffn {
                FfnBlock::MoeGatedShared(f) => f.forward(file, pool, hm, om),
                FfnBlock::Dense(f) => f.forward(file, pool, hm, om),
                FfnBlock::Moe(f) => f.forward(file, pool, hm, om),
                FfnBlock::None => om.fill(0.0),
            }
            combine(pool, &mut x[..m * w], om, &inject[..m * hc], hc, d);
        }
        for c in &ub.chunks {
            mem.advance(c.seq, c.tokens)?;
        }
        let kept: Vec<usize> = if m == n { out_rows } else { (0..m).collect() };
        let xs = gather_rows(&x[..m * w], &kept, w);
        let mut hk = Scratch::dirty(kept.len() * d);
        self.out_hc.mix(file, pool, &xs, &mut hk, None);
        let len = kept.len() * self.info.n_vocab;
        logits.truncate(len);
        logits.resize(len, 0.0);
        if !kept.is_empty() {
            matmul(pool, &self.output.get(file), &hk, logits, kept.len());
        }
        Ok(())
    }
}
