//! Zamba2 (`zamba2`), Zyphra's Mamba-2 hybrid with shared transformer
//! blocks (Glorioso et al. 2024, "The Zamba2 Suite"). Every layer is a
//! Mamba-2 layer; a few transformer blocks (attention + MLP) are shared by
//! all the hybrid layers, which run one of them on the stream concatenated
//! with the token embedding and add a projection of its output to the
//! Mamba-2 mixer's input:
//!
//! ```text
//! e = embed(tokens);  x = e
//! per layer l:
//!   if l runs shared block b (its use u):
//!       c = RMSNorm_b([x, e])                                   [n, 2d]
//!       a = Attention_b(c), q, k, v each += B_u·A_u·c           [n, d]
//!       t = MLP_b(RMSNorm'_b(a)), gate, up each += B_u·A_u·(·)  GeGLU
//!       x_in = x + W_u·t                                       (shared_out)
//!   else x_in = x
//!   x = x + Mamba2_l(RMSNorm_l(x_in))
//! logits = output(RMSNorm(x))
//! ```
//!
//! * The shared block has no residual of its own: its output reaches the
//!   stream only through `W_u` and the Mamba-2 mixer.
//! * Each use of a block has its own attention cells (those of its layer
//!   `l`), its own adapters (`blk.l.attn_{q,k,v}.weight.lora_{a,b}`,
//!   `blk.l.ffn_{gate,up}.weight.lora_{a,b}`; the attention ones optional)
//!   and its own `W_u` (`blk.l.shared_out.weight`); the block's weights are
//!   `shared.b.*`.
//! * Attention: heads of `attention.key_length` (2d / n_head in the released
//!   models) over the 2d-wide input, scale `attention.scale`
//!   (1/√(head_dim/2)), RoPE (NeoX halves) where the file has
//!   `rope.dimension_count`, none otherwise.
//! * MLP: `down(gelu(gate·x) ⊙ up·x)` with the exact GELU.
//! * Mamba-2: the shared mixer; its gated norm's ε is 1e-5 whatever the
//!   model's RMSNorm ε (as transformers hard-codes it).

use super::blocks::attention::Attention;
use super::blocks::common::{check_ubatch, Embedding, OutputHead};
use super::blocks::ffn::{Activation, DenseFfn};
use super::blocks::lora::Lora;
use super::blocks::mamba2_mixer::{Mamba2Mixer, Mamba2Params};
use super::blocks::stack::{norm_rows, norm_rows_inplace};
use super::hparams::{attention_params, base_info, n_ff, norm_eps};
use super::weights::{Loader, Matrix};
use super::{LayerPlan, Model, ModelError, ModelInfo, Rows, UBatch};
use crate::memory::{KvLayerShape, KvMemory, Memory, RecurrentMemory, SeqId};
use coil_gguf::GgufFile;
use coil_kernels::ops::rope::RopeStyle;
use coil_kernels::{matmul, Scratch, ThreadPool};
use std::sync::Arc;

/// The ε of the Mamba-2 gated norm (transformers' `Zamba2RMSNormGated`).
const GATED_NORM_EPS: f32 = 1e-5;

/// The weights of one shared block that are not per use: its two norms
/// (the attention and MLP matrices live in each use's blocks, read from
/// the same tensors).
struct SharedBlock {
    /// `shared.b.attn_norm.weight` `[2d]`
    attn_norm: Vec<f32>,
    /// `shared.b.ffn_norm.weight` `[d]`
    ffn_norm: Vec<f32>,
}

/// One use of a shared block: the block's attention and MLP with this
/// use's adapters, and this use's projection back to the stream.
struct SharedUse {
    block: usize,
    attn: Attention,
    mlp: DenseFfn,
    /// `blk.l.shared_out.weight` `[d, d]`
    out: Matrix,
}

struct Zamba2Layer {
    /// `blk.l.attn_norm.weight` `[d]`: the norm before the Mamba-2 mixer.
    norm: Vec<f32>,
    mamba: Mamba2Mixer,
    shared: Option<SharedUse>,
}

pub struct Zamba2 {
    file: Arc<GgufFile>,
    info: ModelInfo,
    embed: Embedding,
    blocks: Vec<SharedBlock>,
    layers: Vec<Zamba2Layer>,
    head: OutputHead,
    eps: f32,
}

/// The adapters `{weight}.lora_{a,b}` of each of `weights` (`(name, out,
/// in)`), all or none.
fn adapters<const N: usize>(
    ld: &Loader,
    weights: [(&str, usize, usize); N],
) -> Result<Option<Box<[Lora; N]>>, ModelError> {
    let present = weights.map(|(w, _, _)| ld.has(&format!("{w}.lora_a")));
    if !present.iter().any(|&p| p) {
        return Ok(None);
    }
    if let Some(i) = present.iter().position(|&p| !p) {
        let have = weights[present.iter().position(|&p| p).unwrap_or(0)].0;
        return Err(ModelError::Tensor {
            name: format!("{}.lora_a", weights[i].0),
            reason: format!("missing, although {have} has an adapter (all or none)"),
        });
    }
    let mut out = Vec::with_capacity(N);
    for (w, o, i) in weights {
        out.push(Lora::load(ld, w, o, i)?);
    }
    Ok(out.try_into().ok().map(Box::new))
}

/// Layer `l`'s use of shared block `b`.
fn shared_use(ld: &Loader, info: &ModelInfo, l: usize, b: usize) -> Result<SharedUse, ModelError> {
    let d = info.n_embd;
    let rope = ld.u_opt("rope.dimension_count")?.map(|_| RopeStyle::Neox);
    let mut p = attention_params(ld, info, l, rope)?;
    p.d_model = 2 * d;
    let prefix = format!("shared.{b}");
    let mut attn = Attention::load_prefixed(ld, &prefix, p, d)?;
    let (qd, kvd) = (p.n_head * p.head_dim, p.n_kv_head * p.head_dim);
    let lw = |t: &str| format!("blk.{l}.{t}.weight");
    let (lq, lk, lv) = (lw("attn_q"), lw("attn_k"), lw("attn_v"));
    attn.lora = adapters(ld, [(&lq, qd, 2 * d), (&lk, kvd, 2 * d), (&lv, kvd, 2 * d)])?;
    let ff = n_ff(ld, info, 0)?;
    let mut mlp = DenseFfn::load_prefixed(ld, &prefix, "", d, ff, Activation::GeGlu)?;
    let (lg, lu) = (lw("ffn_gate"), lw("ffn_up"));
    mlp.lora = adapters(ld, [(&lg, ff, d), (&lu, ff, d)])?;
    Ok(SharedUse {
        block: b,
        attn,
        mlp,
        out: ld.matrix(&format!("blk.{l}.shared_out.weight"), d, d)?,
    })
}

/// An error where a layer holds per-use tensors but the schedule runs no
/// shared block there.
fn check_unscheduled(ld: &Loader, l: usize) -> Result<(), ModelError> {
    let name = format!("blk.{l}.shared_out.weight");
    if ld.has(&name) {
        return Err(ModelError::Tensor {
            name,
            reason: format!(
                "layer {l} runs no shared block by {}.shared_block_schedule, but holds this tensor",
                ld.arch
            ),
        });
    }
    Ok(())
}

pub fn load(file: Arc<GgufFile>, plan: LayerPlan) -> Result<Zamba2, ModelError> {
    let ld = Loader::new(&file, "zamba2");
    let info = base_info(&ld, plan)?;
    let eps = norm_eps(&ld)?;
    let d = info.n_embd;
    let mut mp = Mamba2Params::from_gguf(&ld, d, eps)?;
    mp.eps = GATED_NORM_EPS;
    let blocks = (0..info.plan.n_shared_blocks)
        .map(|b| {
            Ok(SharedBlock {
                attn_norm: ld.vector(&format!("shared.{b}.attn_norm.weight"), &[2 * d])?,
                ffn_norm: ld.vector(&format!("shared.{b}.ffn_norm.weight"), &[d])?,
            })
        })
        .collect::<Result<Vec<_>, ModelError>>()?;
    let mut layers = Vec::with_capacity(info.plan.layers.len());
    for l in 0..info.plan.layers.len() {
        let shared = match info.plan.shared.get(l).copied().flatten() {
            Some(b) => Some(shared_use(&ld, &info, l, b)?),
            None => {
                check_unscheduled(&ld, l)?;
                None
            }
        };
        layers.push(Zamba2Layer {
            norm: ld.vector(&format!("blk.{l}.attn_norm.weight"), &[d])?,
            mamba: Mamba2Mixer::load(&ld, l, mp)?,
            shared,
        });
    }
    Ok(Zamba2 {
        embed: Embedding::load(&ld, info.n_vocab, d)?,
        head: OutputHead::load(&ld, info.n_vocab, d, eps)?,
        file: file.clone(),
        info,
        blocks,
        layers,
        eps,
    })
}

impl Zamba2 {
    /// `W_u·MLP(RMSNorm'(Attention(RMSNorm([x, e]))))` of layer `l`'s use
    /// `u` into `out` (`[n, d]`); the attention's keys and values go to
    /// layer `l`'s cells.
    #[allow(clippy::too_many_arguments)]
    fn shared_block(
        &self,
        pool: &ThreadPool,
        l: usize,
        u: &SharedUse,
        rows: &[Rows],
        mem: &mut Memory,
        x: &[f32],
        e: &[f32],
        out: &mut [f32],
    ) -> Result<(), ModelError> {
        let file = &self.file;
        let b = &self.blocks[u.block];
        let d = self.info.n_embd;
        let n = x.len() / d;
        let mut c = Scratch::dirty(n * 2 * d);
        for ((c, x), e) in c
            .chunks_exact_mut(2 * d)
            .zip(x.chunks_exact(d))
            .zip(e.chunks_exact(d))
        {
            c[..d].copy_from_slice(x);
            c[d..].copy_from_slice(e);
        }
        norm_rows_inplace(pool, &mut c, &b.attn_norm, self.eps, 2 * d);
        let mut a = Scratch::dirty(n * d);
        u.attn.forward(file, pool, l, rows, mem, &c, None, &mut a)?;
        norm_rows_inplace(pool, &mut a, &b.ffn_norm, self.eps, d);
        let mut t = Scratch::dirty(n * d);
        u.mlp.forward(file, pool, &a, &mut t);
        matmul(pool, &u.out.get(file), &t, out, n);
        Ok(())
    }
}

impl Model for Zamba2 {
    fn info(&self) -> &ModelInfo {
        &self.info
    }

    /// Per layer a Mamba-2 state, and attention cells where a shared block
    /// is used.
    fn new_memory(&self, n_seq_max: usize, n_ctx: usize) -> Memory {
        let rec = self
            .layers
            .iter()
            .map(|l| Some(l.mamba.p.state_shape()))
            .collect();
        let kv: Vec<Option<KvLayerShape>> = self
            .layers
            .iter()
            .map(|l| {
                l.shared
                    .as_ref()
                    .map(|u| KvLayerShape::heads(u.attn.p.n_kv_head, u.attn.p.head_dim))
            })
            .collect();
        let kv = kv
            .iter()
            .any(Option::is_some)
            .then(|| KvMemory::new(kv, n_seq_max, n_ctx));
        Memory::new(
            Some(RecurrentMemory::new(rec, n_seq_max)),
            kv,
            n_seq_max,
            n_ctx,
        )
    }

    fn forward(
        &self,
        pool: &ThreadPool,
        ub: &UBatch,
        mem: &mut Memory,
        logits: &mut Vec<f32>,
    ) -> Result<(), ModelError> {
        check_ubatch(ub, mem)?;
        // Every kernel called below on this thread reads it.
        let _numerics = coil_kernels::invariance_scope(ub.invariance);
        let d = self.info.n_embd;
        let n = ub.n_tokens();
        let tokens: Vec<u32> = ub
            .chunks
            .iter()
            .flat_map(|c| c.tokens.iter().copied())
            .collect();
        let rows = ub.rows();
        let mut x = Scratch::dirty(n * d);
        self.embed.forward(&self.file, &tokens, &mut x)?;
        let mut e = Scratch::dirty(n * d);
        e.copy_from_slice(&x);
        let mut x_in = Scratch::dirty(n * d);
        let mut h = Scratch::dirty(n * d);
        let mut o = Scratch::dirty(n * d);
        for (l, layer) in self.layers.iter().enumerate() {
            let src: &[f32] = match &layer.shared {
                Some(u) => {
                    self.shared_block(pool, l, u, &rows, mem, &x, &e, &mut x_in)?;
                    x_in.iter_mut().zip(x.iter()).for_each(|(a, b)| *a += b);
                    &x_in
                }
                None => &x,
            };
            norm_rows(pool, src, &layer.norm, self.eps, &mut h, d);
            layer
                .mamba
                .forward(&self.file, pool, l, &rows, mem, &h, &mut o)?;
            x.iter_mut().zip(o.iter()).for_each(|(a, b)| *a += b);
        }
        for c in &ub.chunks {
            mem.advance(c.seq, c.tokens)?;
        }
        self.head
            .forward(&self.file, pool, &ub.logit_rows(), &x, logits);
        Ok(())
    }

    /// Every recurrent layer is a Mamba-2 mixer: each refolds from its
    /// verification tape; the attention cells past the kept tokens are
    /// cut by the memory.
    fn refold(
        &self,
        pool: &ThreadPool,
        mem: &mut Memory,
        seq: SeqId,
        n: usize,
    ) -> Result<bool, ModelError> {
        for (l, layer) in self.layers.iter().enumerate() {
            layer.mamba.refold(pool, l, seq, mem, n)?;
        }
        Ok(true)
    }
}
