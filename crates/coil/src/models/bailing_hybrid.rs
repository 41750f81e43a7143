//! Bailing-Hybrid (Ling 3.0; transformers' `BailingHybridForCausalLM`, the
//! released `BailingMoeV3ForCausalLM`; llama.cpp's GGUF arch `bailingmoe3`):
//! Kimi Delta Attention layers and multi-head latent attention layers
//! (per-layer `head_count_kv`: 0 = KDA), the last of every
//! `layer_group_size` layers MLA. Each layer:
//!
//! ```text
//! x += mixer(RMSNorm(x))                 (attn_norm)
//! x += ffn(RMSNorm(x))                   (ffn_norm)
//! ```
//!
//! * KDA as GLM-5-Next writes it (`blocks/kda_mixer.rs`): full-rank forget
//!   and output gate projections (`ssm_f_a`, `ssm_g_a`: `[H·d, d_model]`)
//!   and the bounded forget gate `g = lower·sigmoid(exp(A_log)·(f +
//!   dt_bias))` (`kda.gate_lower_bound`; `ssm_a` holds exp(A_log));
//! * MLA as DeepSeek-V3 writes it (`blocks/mla.rs`): RoPE over the
//!   `rope.dimension_count` lanes of q_rope and k_r, in adjacent pairs
//!   (DeepSeek's interleaved rotation, llama.cpp's "normal" RoPE), and a
//!   sigmoid gate per head on the attention output (`attn_gate`);
//! * the first `leading_dense_block_count` feed-forwards dense SwiGLU, the
//!   others DeepSeek-V3's mixture of experts: sigmoid scores, chosen by
//!   score plus correction bias (`exp_probs_b`) within the best
//!   `expert_group_used_count` of `expert_group_count` groups, renormalised
//!   where `expert_weights_norm`, scaled by `expert_weights_scale`, plus a
//!   shared expert of `expert_shared_feed_forward_length`; the experts'
//!   and the shared expert's SwiGLU clipped per layer
//!   (`swiglu_clamp_exp`, `swiglu_clamp_shexp`: `min(silu(g), c) ·
//!   clamp(u, −c, c)`, 0 = none).
//!
//! All RMSNorm weights are plain (`w·x`). The multi-token-prediction block
//! after the trunk (`nextn_predict_layers`) is not part of the forward pass.

use super::blocks::attention::Rope;
use super::blocks::ffn::{Activation, DenseFfn};
use super::blocks::kda_mixer::{KdaGate, KdaMixer, KdaParams};
use super::blocks::mla::Mla;
use super::blocks::stack::{DecoderStack, FfnBlock, MixerBlock, Scales, StackLayer};
use super::hparams::{base_info, n_ff, norm_eps};
use super::kimi_linear::{deepseek_moe, mla_params, MoeStyle};
use super::weights::Loader;
use super::{LayerPlan, ModelError};
use coil_gguf::GgufFile;
use coil_kernels::ops::rope::RopeStyle;
use std::sync::Arc;

/// The bounded forget gate's lower bound (`kda.gate_lower_bound`, below 0;
/// llama.cpp's runtime takes no other gate: `kda.safe_gate` must not be
/// false).
fn kda_gate(ld: &Loader) -> Result<KdaGate, ModelError> {
    let key = |s: &str| format!("{}.{s}", ld.arch);
    if ld.bool_opt("kda.safe_gate") == Some(false) {
        return Err(ModelError::BadKey {
            key: key("kda.safe_gate"),
            reason: "false: only the bounded (\"safe\") KDA gate is defined for this \
                     architecture"
                .into(),
        });
    }
    match ld.f32_opt("kda.gate_lower_bound")? {
        Some(lower_bound) if lower_bound < 0.0 && lower_bound.is_finite() => {
            Ok(KdaGate::Bounded { lower_bound })
        }
        Some(v) => Err(ModelError::BadKey {
            key: key("kda.gate_lower_bound"),
            reason: format!("{v} is not a negative number"),
        }),
        None => Err(ModelError::MissingKey(key("kda.gate_lower_bound"))),
    }
}

/// MLA's rotation: `rope.freq_base`, adjacent pairs. Multi-section RoPE
/// (`rope.dimension_sections`, the vision-language files) is refused.
fn mla_rope(ld: &Loader, n_rot: usize) -> Result<Rope, ModelError> {
    let key = format!("{}.rope.dimension_sections", ld.arch);
    if ld.file.metadata().contains_key(&key) {
        return Err(ModelError::BadKey {
            key,
            reason: "multi-section RoPE (the vision-language model) is not supported".into(),
        });
    }
    Ok(Rope {
        n_rot,
        freq_base: ld.f32_opt("rope.freq_base")?.unwrap_or(10000.0),
        freq_scale: 1.0,
        style: RopeStyle::Normal,
    })
}

pub fn load(file: Arc<GgufFile>, plan: LayerPlan) -> Result<DecoderStack, ModelError> {
    let arch = plan.arch.clone();
    let ld = Loader::new(&file, &arch);
    let info = base_info(&ld, plan)?;
    let eps = norm_eps(&ld)?;
    let d = info.n_embd;
    let n_blocks = info.plan.n_blocks();
    let n_dense = ld.u_opt("leading_dense_block_count")?.unwrap_or(0);
    let gate = kda_gate(&ld)?;
    let clamp_exp = ld.f32_per_layer_opt("swiglu_clamp_exp", n_blocks)?;
    let clamp_shexp = ld.f32_per_layer_opt("swiglu_clamp_shexp", n_blocks)?;
    let limit = |c: &Option<Vec<f32>>, l: usize| c.as_ref().map_or(0.0, |c| c[l]);
    let n_shared = ld.u_opt("expert_shared_count")?.unwrap_or(0);
    // (0 or absent: the experts' width times their count, as llama.cpp reads it)
    let shared_ff = ld
        .u_opt("expert_shared_feed_forward_length")?
        .filter(|&f| f > 0);
    let mut layers = Vec::new();
    for (l, kind) in info.plan.layers.iter().enumerate() {
        let mixer = if kind.mixer.has_attention() {
            let mut p = mla_params(&ld, &info, l, eps)?;
            p.rope = Some(mla_rope(&ld, p.d_rope)?);
            p.head_gate = true;
            MixerBlock::Mla(Box::new(Mla::load(&ld, l, p)?))
        } else {
            let mut p = KdaParams::new(
                d,
                super::kimi_linear::n_head(&ld, &info, l)?,
                ld.u_in("kda.head_dim", 1, 4096)?,
                ld.u_in("ssm.conv_kernel", 1, 64)?,
                eps,
            );
            p.gate = gate;
            p.low_rank_gates = false;
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
            FfnBlock::Moe(Box::new(deepseek_moe(&ld, l, d, |ff| {
                Ok(MoeStyle {
                    shared_ff: shared_ff.unwrap_or(ff * n_shared.max(1)),
                    norm_weights: ld.bool_opt("expert_weights_norm").unwrap_or(false),
                    act: Activation::swiglu_limit(limit(&clamp_exp, l)),
                    shared_act: Activation::swiglu_limit(limit(&clamp_shexp, l)),
                })
            })?))
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
