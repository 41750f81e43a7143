//! LFM3 (`lfm3`), Liquid AI's 2026 short-convolution hybrid: LFM2's layers
//! with sandwich norms, a per-head attention gate and two kinds of
//! attention layer. Every layer is
//!
//! ```text
//! x += RMSNorm_post(mixer(RMSNorm(x)))    mixer: gated short conv, full or
//!                                         sliding-window attention
//! x += RMSNorm_post_ffn(ffn(RMSNorm_ffn(x)))   ffn: SwiGLU
//! logits = output(RMSNorm(x))
//! ```
//!
//! * short conv (`head_count_kv` 0 in the per-layer array): LFM2's
//!   [`ShortConv`], window `shortconv.l_cache` (7 in the released models);
//! * attention: grouped-query, per-head RMSNorms of q and k before RoPE
//!   (NeoX halves), scale 1/√head_dim, each head's output times
//!   `sigmoid(x·g_h)` (`attn_gate`, `[n_head, d_model]`) before
//!   `attn_output`;
//! * full-attention layers: RoPE θ `rope.freq_base` over
//!   `rope.dimension_count` lanes, with per-pair frequency divisors
//!   `rope_freqs` where the checkpoint uses "proportional" RoPE (only the
//!   first `partial_rotary_factor·head_dim/2` pairs rotate, at frequencies
//!   `θ^(−2i/head_dim)`; the others' divisor 1e30 leaves them still, as
//!   llama.cpp writes Gemma 4's);
//! * sliding-window layers (`attention.sliding_window_pattern` true): RoPE
//!   θ `rope.freq_base_swa` over `rope.dimension_count_swa` lanes (divisors
//!   `rope_freqs_swa` if present), each query seeing its own position and
//!   the `attention.sliding_window − 1` before it;
//! * sandwich norms `post_attention_norm` (after every mixer, the short
//!   convolution's too) and `post_ffw_norm`: both or neither (transformers'
//!   `use_sandwich_norm`);
//! * the final norm is `token_embd_norm.weight`, as in LFM2 files.

use super::blocks::attention::{Attention, QkNorm, Rope};
use super::blocks::ffn::{Activation, DenseFfn};
use super::blocks::short_conv::{ShortConv, ShortConvParams};
use super::blocks::stack::{DecoderStack, FfnBlock, MixerBlock, SandwichNorms, Scales, StackLayer};
use super::hparams::{attention_params, base_info, n_ff, norm_eps};
use super::plan::{FeedForward, Mixer};
use super::weights::Loader;
use super::{LayerPlan, ModelError};
use coil_gguf::{GgufFile, Value};
use coil_kernels::ops::rope::RopeStyle;
use std::sync::Arc;

/// The final norm's name (LFM2's).
const OUTPUT_NORM: &str = "token_embd_norm.weight";

/// Per layer, whether it is a sliding-window attention layer
/// (`attention.sliding_window_pattern`, all false when absent).
fn sliding_layers(ld: &Loader, plan: &LayerPlan) -> Result<Vec<bool>, ModelError> {
    let n = plan.layers.len();
    let key = format!("{}.attention.sliding_window_pattern", ld.arch);
    let bad = |reason: String| ModelError::BadKey {
        key: key.clone(),
        reason,
    };
    let v: Vec<bool> = match ld.file.metadata().get(&key) {
        None => vec![false; n],
        Some(Value::Array(_, items)) => items
            .iter()
            .map(|x| match x {
                Value::Bool(b) => Ok(*b),
                other => Err(bad(format!("{other} is not a bool"))),
            })
            .collect::<Result<_, _>>()?,
        Some(other) => return Err(bad(format!("{other} is not an array of bools"))),
    };
    if v.len() < n {
        return Err(bad(format!("{} entries for {n} layers", v.len())));
    }
    for (l, kind) in plan.layers.iter().enumerate() {
        if v[l] && !kind.mixer.has_attention() {
            return Err(bad(format!(
                "layer {l} is a sliding-window layer, but a short-convolution layer by {}.attention.head_count_kv",
                ld.arch
            )));
        }
    }
    Ok(v[..n].to_vec())
}

/// An error when the layer plan (from `attention.head_count_kv`) says one
/// mixer and the file holds the other's tensors.
fn check_mixer_tensors(ld: &Loader, l: usize, mixer: Mixer) -> Result<(), ModelError> {
    let (wrong, want) = match mixer {
        Mixer::Attention => ("shortconv.in_proj", "an attention"),
        _ => ("attn_q", "a short-convolution"),
    };
    let name = format!("blk.{l}.{wrong}.weight");
    if ld.has(&name) {
        return Err(ModelError::Tensor {
            name,
            reason: format!(
                "layer {l} is {want} layer by {}.attention.head_count_kv, but holds this tensor",
                ld.arch
            ),
        });
    }
    Ok(())
}

/// The RoPE frequency divisors `name` (`[n_rot / 2]`), if the file has them.
fn rope_freqs(ld: &Loader, name: &str, rope: Option<Rope>) -> Result<Option<Vec<f32>>, ModelError> {
    match rope {
        Some(r) if ld.has(name) => ld.vector(name, &[r.n_rot / 2]).map(Some),
        _ => Ok(None),
    }
}

/// The sliding-window layers' rotation: `rope.dimension_count_swa` lanes
/// (the head by default) at θ `rope.freq_base_swa` (`rope.freq_base` by
/// default).
fn swa_rope(ld: &Loader, full: Rope, head_dim: usize) -> Result<Rope, ModelError> {
    let n_rot = ld.u_opt("rope.dimension_count_swa")?.unwrap_or(head_dim);
    if n_rot > head_dim || !n_rot.is_multiple_of(2) {
        return Err(ModelError::BadKey {
            key: format!("{}.rope.dimension_count_swa", ld.arch),
            reason: format!("{n_rot} must be even and at most the head dimension {head_dim}"),
        });
    }
    Ok(Rope {
        n_rot,
        freq_base: ld.f32_opt("rope.freq_base_swa")?.unwrap_or(full.freq_base),
        ..full
    })
}

/// Layer `l`'s sandwich norms: both tensors or neither.
fn sandwich(ld: &Loader, l: usize, d: usize) -> Result<Option<SandwichNorms>, ModelError> {
    let (m, f) = (
        format!("blk.{l}.post_attention_norm.weight"),
        format!("blk.{l}.post_ffw_norm.weight"),
    );
    match (ld.has(&m), ld.has(&f)) {
        (false, false) => Ok(None),
        (true, true) => Ok(Some(SandwichNorms {
            mixer: ld.vector(&m, &[d])?,
            ffn: ld.vector(&f, &[d])?,
        })),
        (has_m, _) => {
            let (name, other) = if has_m { (f, m) } else { (m, f) };
            Err(ModelError::Tensor {
                name,
                reason: format!(
                    "missing, although layer {l} has {other} (sandwich norms come in pairs)"
                ),
            })
        }
    }
}

pub fn load(file: Arc<GgufFile>, plan: LayerPlan) -> Result<DecoderStack, ModelError> {
    let arch = plan.arch.clone();
    let ld = Loader::new(&file, &arch);
    if ld.bool_opt("attention.causal") == Some(false) {
        return Err(ModelError::BadKey {
            key: format!("{arch}.attention.causal"),
            reason: "non-causal (embedding) LFM3 models are not supported".into(),
        });
    }
    let info = base_info(&ld, plan)?;
    let eps = norm_eps(&ld)?;
    let d = info.n_embd;
    let sliding = sliding_layers(&ld, &info.plan)?;
    let window = match sliding.iter().any(|&s| s) {
        true => Some(ld.u_in("attention.sliding_window", 1, 1 << 24)?),
        false => None,
    };
    let conv = ShortConvParams::from_gguf(&ld, d)?;
    let mut layers = Vec::with_capacity(info.plan.layers.len());
    for (l, kind) in info.plan.layers.iter().enumerate() {
        check_mixer_tensors(&ld, l, kind.mixer)?;
        let mixer = if kind.mixer.has_attention() {
            let mut p = attention_params(&ld, &info, l, Some(RopeStyle::Neox))?;
            let freqs = if sliding[l] {
                p.rope = p.rope.map(|r| swa_rope(&ld, r, p.head_dim)).transpose()?;
                p.window = window;
                rope_freqs(&ld, "rope_freqs_swa.weight", p.rope)?
            } else {
                rope_freqs(&ld, "rope_freqs.weight", p.rope)?
            };
            let mut a = Attention::load(&ld, l, p)?;
            a.qk_norm = Some(QkNorm::load(&ld, l, p.head_dim, eps)?);
            a.rope_freqs = freqs;
            let gate = format!("blk.{l}.attn_gate.weight");
            if ld.has(&gate) {
                a.head_gate = Some(ld.matrix(&gate, p.n_head, d)?);
            }
            MixerBlock::Attention(Box::new(a))
        } else {
            MixerBlock::ShortConv(Box::new(ShortConv::load(&ld, l, conv)?))
        };
        if kind.ffn != FeedForward::Dense {
            return Err(ModelError::Tensor {
                name: format!("blk.{l}.ffn_down.weight"),
                reason: format!(
                    "layer {l} needs a dense feed-forward (ffn_gate, ffn_up, ffn_down)"
                ),
            });
        }
        let ffn = DenseFfn::load(&ld, l, "", d, n_ff(&ld, &info, l)?, Activation::SwiGlu)?;
        layers.push(StackLayer {
            norm: ld.vector(&format!("blk.{l}.attn_norm.weight"), &[d])?,
            mixer,
            ffn_norm: Some(ld.vector(&format!("blk.{l}.ffn_norm.weight"), &[d])?),
            ffn: FfnBlock::Dense(Box::new(ffn)),
            sandwich: sandwich(&ld, l, d)?,
        });
    }
    DecoderStack::build_with_output_norm(
        file.clone(),
        info,
        layers,
        eps,
        Scales::default(),
        OUTPUT_NORM,
    )
}
