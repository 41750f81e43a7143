//! Hyper-parameters shared by several architectures, read from GGUF with
//! llama.cpp's keys and defaults.

use super::blocks::attention::{AttentionParams, Rope};
use super::plan::per_layer_u64;
use super::weights::Loader;
use super::{LayerPlan, ModelError, ModelInfo};
use coil_kernels::ops::rope::RopeStyle;

/// RMSNorm epsilon: `attention.layer_norm_rms_epsilon`, or (Nemotron-H)
/// `attention.layer_norm_epsilon`; 1e-5 when absent.
pub fn norm_eps(ld: &Loader) -> Result<f32, ModelError> {
    Ok(match ld.f32_opt("attention.layer_norm_rms_epsilon")? {
        Some(e) => e,
        None => ld.f32_opt("attention.layer_norm_epsilon")?.unwrap_or(1e-5),
    })
}

/// Name, vocabulary, width and context length.
pub fn base_info(ld: &Loader, plan: LayerPlan) -> Result<ModelInfo, ModelError> {
    let n_embd = ld.u_in("embedding_length", 1, 1 << 20)?;
    let n_vocab = match ld.file.tensor_info("token_embd.weight") {
        Some(t) if t.dims.len() == 2 && t.dims[0] == n_embd as u64 => t.dims[1] as usize,
        Some(t) => {
            return Err(ModelError::BadShape {
                name: t.name.clone(),
                expected: vec![n_embd as u64, t.dims.get(1).copied().unwrap_or(0)],
                found: t.dims.clone(),
            })
        }
        None => return Err(ModelError::MissingTensor("token_embd.weight".into())),
    };
    Ok(ModelInfo {
        arch: plan.arch.clone(),
        name: ld
            .file
            .metadata()
            .get_str("general.name")
            .unwrap_or("")
            .to_string(),
        n_vocab,
        n_embd,
        n_ctx_train: ld.u_opt("context_length")?.unwrap_or(0),
        plan,
    })
}

/// Attention hyper-parameters of layer `layer`; `rope_style` is `None` for
/// models without positional encoding.
pub fn attention_params(
    ld: &Loader,
    info: &ModelInfo,
    layer: usize,
    rope_style: Option<RopeStyle>,
) -> Result<AttentionParams, ModelError> {
    let n_layer = info.plan.n_blocks();
    let key = |s: &str| format!("{}.{s}", ld.arch);
    let heads = per_layer_u64(ld.file, &key("attention.head_count"), n_layer)?
        .ok_or_else(|| ModelError::MissingKey(key("attention.head_count")))?;
    let kv_heads = per_layer_u64(ld.file, &key("attention.head_count_kv"), n_layer)?;
    let n_head = heads[layer] as usize;
    let n_kv_head = kv_heads.map_or(n_head, |v| v[layer] as usize);
    if n_head == 0 || n_head > 4096 {
        return Err(ModelError::BadKey {
            key: key("attention.head_count"),
            reason: format!("layer {layer} has {n_head} heads"),
        });
    }
    let head_dim = match ld.u_opt("attention.key_length")? {
        Some(k) => k,
        None => info.n_embd / n_head,
    };
    if let Some(v) = ld.u_opt("attention.value_length")? {
        if v != head_dim {
            return Err(ModelError::BadKey {
                key: key("attention.value_length"),
                reason: format!("{v} differs from the key length {head_dim} (not supported)"),
            });
        }
    }
    if head_dim == 0 {
        return Err(ModelError::BadKey {
            key: key("attention.key_length"),
            reason: "head dimension is 0".into(),
        });
    }
    let scale = match ld.f32_opt("attention.scale")? {
        Some(s) if s != 0.0 => s,
        _ => 1.0 / (head_dim as f32).sqrt(),
    };
    let rope = match rope_style {
        None => None,
        Some(style) => {
            let n_rot = ld.u_opt("rope.dimension_count")?.unwrap_or(head_dim);
            if n_rot > head_dim || n_rot % 2 != 0 {
                return Err(ModelError::BadKey {
                    key: key("rope.dimension_count"),
                    reason: format!(
                        "{n_rot} must be even and at most the head dimension {head_dim}"
                    ),
                });
            }
            let freq_base = ld.f32_opt("rope.freq_base")?.unwrap_or(10000.0);
            let freq_scale = match ld.f32_opt("rope.scale_linear")? {
                Some(s) if s != 0.0 => 1.0 / s,
                _ => 1.0,
            };
            Some(Rope {
                n_rot,
                freq_base,
                freq_scale,
                style,
            })
        }
    };
    Ok(AttentionParams {
        d_model: info.n_embd,
        n_head,
        n_kv_head,
        head_dim,
        scale,
        rope,
        window: None,
    })
}

/// The feed-forward width of layer `layer` (`feed_forward_length`, scalar
/// or per layer).
pub fn n_ff(ld: &Loader, info: &ModelInfo, layer: usize) -> Result<usize, ModelError> {
    let key = format!("{}.feed_forward_length", ld.arch);
    let v =
        per_layer_u64(ld.file, &key, info.plan.n_blocks())?.ok_or(ModelError::MissingKey(key))?;
    Ok(v[layer] as usize)
}
