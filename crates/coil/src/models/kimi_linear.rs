//! Kimi-Linear (`kimi-linear`; Kimi Team, "Kimi Linear: An Expressive,
//! Efficient Attention Architecture", 2025): Kimi Delta Attention layers
//! and multi-head latent attention layers (per-layer `head_count_kv`: 0 =
//! KDA), 3 : 1 in the released model. Each layer:
//!
//! ```text
//! x += mixer(RMSNorm(x))                 (attn_norm)
//! x += ffn(RMSNorm(x))                   (ffn_norm)
//! ```
//!
//! The mixer is KDA (`blocks/kda_mixer.rs`) or MLA without any positional
//! encoding ("NoPE": the d_rope part of each head is not rotated,
//! `blocks/mla.rs`; llama.cpp's files record the MLA layers as one KV head
//! of `kv_lora_rank + d_rope`). The first `leading_dense_block_count`
//! feed-forwards are dense SwiGLU; the others a DeepSeek-V3-style mixture
//! of experts: sigmoid scores, experts chosen by score plus a correction
//! bias (`exp_probs_b`), their unbiased scores renormalised and scaled by
//! the routed scaling factor (`expert_weights_scale`), plus always-on
//! shared experts. All RMSNorm weights are plain (`w·x`).
//!
//! llama.cpp builds the query from `attn_q` alone; checkpoints with a query
//! LoRA (`q_lora_rank`: `attn_q_a`, `attn_q_a_norm`, `attn_q_b`) load here
//! too.

use super::blocks::ffn::{Activation, DenseFfn, ExpertGroups, Experts, Gating, Moe};
use super::blocks::kda_mixer::{KdaMixer, KdaParams};
use super::blocks::mla::{Mla, MlaParams};
use super::blocks::stack::{DecoderStack, FfnBlock, MixerBlock, Scales, StackLayer};
use super::hparams::{base_info, n_ff, norm_eps};
use super::plan::per_layer_u64;
use super::weights::Loader;
use super::{LayerPlan, ModelError, ModelInfo};
use coil_gguf::GgufFile;
use std::sync::Arc;

/// The heads of layer `l` (`attention.head_count`, scalar or per layer).
pub(crate) fn n_head(ld: &Loader, info: &ModelInfo, l: usize) -> Result<usize, ModelError> {
    let key = format!("{}.attention.head_count", ld.arch);
    let heads = per_layer_u64(ld.file, &key, info.plan.layers.len())?
        .ok_or_else(|| ModelError::MissingKey(key.clone()))?;
    match heads[l] as usize {
        h @ 1..=4096 => Ok(h),
        h => Err(ModelError::BadKey {
            key,
            reason: format!("layer {l} has {h} heads"),
        }),
    }
}

/// MLA's widths, from llama.cpp's keys: `attention.kv_lora_rank` = r,
/// `rope.dimension_count` = d_rope, `attention.key_length_mla` = d_nope +
/// d_rope, `attention.value_length_mla` = d_v, `attention.q_lora_rank`
/// where the query has a LoRA; `attention.key_length`, where present, is
/// the cached row r + d_rope.
pub(crate) fn mla_params(
    ld: &Loader,
    info: &ModelInfo,
    l: usize,
    eps: f32,
) -> Result<MlaParams, ModelError> {
    let key = |s: &str| format!("{}.{s}", ld.arch);
    let r = ld.u_in("attention.kv_lora_rank", 1, 1 << 16)?;
    let d_rope = ld.u_in("rope.dimension_count", 0, 1 << 12)?;
    let k_mla = ld.u_in("attention.key_length_mla", 1, 1 << 12)?;
    let d_v = ld.u_in("attention.value_length_mla", 1, 1 << 12)?;
    if d_rope >= k_mla || d_rope % 2 != 0 {
        return Err(ModelError::BadKey {
            key: key("rope.dimension_count"),
            reason: format!(
                "{d_rope} must be even and below the MLA key length {k_mla} \
                 (attention.key_length_mla = no-RoPE + RoPE lanes)"
            ),
        });
    }
    if let Some(kl) = ld.u_opt("attention.key_length")? {
        if kl != r + d_rope {
            return Err(ModelError::BadKey {
                key: key("attention.key_length"),
                reason: format!(
                    "{kl} is not the cached latent row kv_lora_rank + rope.dimension_count = {}",
                    r + d_rope
                ),
            });
        }
    }
    let q_lora_rank = match ld.u_opt("attention.q_lora_rank")? {
        Some(0) | None => None,
        Some(q) if q <= 1 << 16 => Some(q),
        Some(q) => {
            return Err(ModelError::BadKey {
                key: key("attention.q_lora_rank"),
                reason: format!("{q} is out of range"),
            })
        }
    };
    Ok(MlaParams {
        d_model: info.n_embd,
        n_head: n_head(ld, info, l)?,
        kv_lora_rank: r,
        q_lora_rank,
        d_nope: k_mla - d_rope,
        d_rope,
        d_v,
        scale: 1.0 / (k_mla as f32).sqrt(),
        rope: None,
        eps,
        head_gate: false,
    })
}

/// What differs between the DeepSeek-style mixtures of experts.
pub(crate) struct MoeStyle {
    /// Width of the shared experts together.
    pub shared_ff: usize,
    /// Renormalise the chosen experts' weights.
    pub norm_weights: bool,
    pub act: Activation,
    pub shared_act: Activation,
}

/// The DeepSeek-style mixture of experts of layer `l`: SwiGLU experts
/// (`expert_feed_forward_length`), the gating function llama.cpp records
/// (`expert_gating_func`: 1 softmax, 2 sigmoid), the selection bias
/// `exp_probs_b`, weights scaled by `expert_weights_scale`, group-limited
/// where `expert_group_count` > 1, plus `expert_shared_count` shared
/// experts (`style`: their width, renormalisation, activations).
pub(crate) fn deepseek_moe(
    ld: &Loader,
    l: usize,
    d: usize,
    style: impl FnOnce(usize) -> Result<MoeStyle, ModelError>,
) -> Result<Moe, ModelError> {
    let key = |s: &str| format!("{}.{s}", ld.arch);
    let n_expert = ld.u_in("expert_count", 1, 1 << 16)?;
    let n_used = ld.u_in("expert_used_count", 1, n_expert)?;
    let ff = ld.u_in("expert_feed_forward_length", 1, 1 << 20)?;
    let gating = match ld.u("expert_gating_func")? {
        1 => Gating::Softmax,
        2 => Gating::Sigmoid,
        g => {
            return Err(ModelError::BadKey {
                key: key("expert_gating_func"),
                reason: format!("gating function {g} is not supported (1 softmax, 2 sigmoid)"),
            })
        }
    };
    let groups = match ld.u_opt("expert_group_count")? {
        None | Some(0) | Some(1) => None,
        Some(g) => {
            let used = ld.u_in("expert_group_used_count", 1, g)?;
            if !n_expert.is_multiple_of(g) {
                return Err(ModelError::BadKey {
                    key: key("expert_group_count"),
                    reason: format!("{g} groups do not divide {n_expert} experts"),
                });
            }
            if n_expert / g * used < n_used {
                return Err(ModelError::BadKey {
                    key: key("expert_group_used_count"),
                    reason: format!(
                        "{used} of {g} groups hold fewer than the {n_used} experts each token uses"
                    ),
                });
            }
            Some(ExpertGroups {
                n_group: g,
                n_used: used,
            })
        }
    };
    let n_shared = ld.u_opt("expert_shared_count")?.unwrap_or(0);
    let style = style(ff)?;
    let n = |t: &str| format!("blk.{l}.ffn_{t}.weight");
    let shared = match n_shared {
        0 => None,
        _ => Some(DenseFfn::load(
            ld,
            l,
            "_shexp",
            d,
            style.shared_ff,
            style.shared_act,
        )?),
    };
    Ok(Moe {
        router: ld.matrix(&n("gate_inp"), n_expert, d)?,
        up: Experts::load(ld, &n("up_exps"), n_expert, ff, d)?,
        gate: Some(Experts::load(ld, &n("gate_exps"), n_expert, ff, d)?),
        down: Experts::load(ld, &n("down_exps"), n_expert, d, ff)?,
        gating,
        select_bias: Some(ld.vector(&format!("blk.{l}.exp_probs_b.bias"), &[n_expert])?),
        groups,
        n_used,
        norm_weights: style.norm_weights,
        weights_scale: ld.f32_opt("expert_weights_scale")?.unwrap_or(0.0),
        act: style.act,
        shared,
    })
}

/// Kimi-Linear's experts: weights always renormalised (as llama.cpp's
/// graph does), `expert_shared_count` shared experts as wide as one.
fn kimi_moe(ld: &Loader, l: usize, d: usize) -> Result<Moe, ModelError> {
    let n_shared = ld.u_opt("expert_shared_count")?.unwrap_or(0);
    deepseek_moe(ld, l, d, |ff| {
        Ok(MoeStyle {
            shared_ff: ff * n_shared,
            norm_weights: true,
            act: Activation::SwiGlu,
            shared_act: Activation::SwiGlu,
        })
    })
}

pub fn load(file: Arc<GgufFile>, plan: LayerPlan) -> Result<DecoderStack, ModelError> {
    let arch = plan.arch.clone();
    let ld = Loader::new(&file, &arch);
    let info = base_info(&ld, plan)?;
    let eps = norm_eps(&ld)?;
    let d = info.n_embd;
    let n_dense = ld.u_opt("leading_dense_block_count")?.unwrap_or(0);
    let mut layers = Vec::new();
    for (l, kind) in info.plan.layers.iter().enumerate() {
        let mixer = if kind.mixer.has_attention() {
            MixerBlock::Mla(Box::new(Mla::load(
                &ld,
                l,
                mla_params(&ld, &info, l, eps)?,
            )?))
        } else {
            let p = KdaParams::new(
                d,
                n_head(&ld, &info, l)?,
                ld.u_in("kda.head_dim", 1, 4096)?,
                ld.u_in("ssm.conv_kernel", 1, 64)?,
                eps,
            );
            MixerBlock::Kda(Box::new(KdaMixer::load(&ld, l, p)?))
        };
        let ffn = if l < n_dense {
            FfnBlock::Dense(Box::new(DenseFfn::load(
                &ld,
                l,
                "",
                d,
                n_ff(&ld, &info, l)?,
                Activation::SwiGlu,
            )?))
        } else {
            FfnBlock::Moe(Box::new(kimi_moe(&ld, l, d)?))
        };
        layers.push(StackLayer {
            sandwich: None,
            norm: ld.vector(&format!("blk.{l}.attn_norm.weight"), &[d])?,
            mixer,
            ffn_norm: Some(ld.vector(&format!("blk.{l}.ffn_norm.weight"), &[d])?),
            ffn,
        });
    }
    DecoderStack::build(file.clone(), info, layers, eps, Scales::default())
}
