//! Qwen3.5 (`qwen35`, dense SwiGLU) and Qwen3.5-MoE (`qwen35moe`): the
//! Qwen3-Next layer stack (see `qwen3next.rs`) with two differences in
//! llama.cpp's files: the converter re-orders the DeltaNet value heads to
//! the tiled order (value head j reads key head j % Hk), and attention uses
//! interleaved multi-section RoPE (`rope.dimension_sections`, time / height
//! / width sections). For text every section's position is the token's
//! position, so the rotation is NeoX's over the first
//! `rope.dimension_count` lanes; coil accepts the section layouts that
//! cover exactly those lanes with the three text sections.

use super::blocks::stack::DecoderStack;
use super::qwen3next::load_stack;
use super::weights::Loader;
use super::{LayerPlan, ModelError};
use coil_gguf::{GgufFile, Value};
use coil_kernels::ops::delta::HeadOrder;
use std::sync::Arc;

/// Checks `rope.dimension_sections` (required, as in llama.cpp): up to four
/// counts of rotated pairs whose first three sum to `rope.dimension_count /
/// 2` and whose fourth (extra positions, unused by text) is 0.
pub(crate) fn check_rope_sections(ld: &Loader) -> Result<(), ModelError> {
    let key = format!("{}.rope.dimension_sections", ld.arch);
    let bad = |reason: String| ModelError::BadKey {
        key: key.clone(),
        reason,
    };
    let sections: Vec<usize> = match ld.file.metadata().get(&key) {
        None => return Err(ModelError::MissingKey(key.clone())),
        Some(Value::Array(_, items)) if (1..=4).contains(&items.len()) => items
            .iter()
            .map(|v| {
                v.as_u64()
                    .map(|x| x as usize)
                    .ok_or_else(|| bad(format!("entry {v} is not a count")))
            })
            .collect::<Result<_, _>>()?,
        Some(v) => return Err(bad(format!("{v} is not an array of 1 to 4 counts"))),
    };
    let n_rot = match ld.u_opt("rope.dimension_count")? {
        Some(n) => n,
        None => ld.u("attention.key_length")?,
    };
    let text: usize = sections.iter().take(3).sum();
    let extra = sections.get(3).copied().unwrap_or(0);
    if text != n_rot / 2 || extra != 0 {
        return Err(bad(format!(
            "unknown rope section layout {sections:?}: expected three text sections covering the \
             {} rotated pairs (rope.dimension_count {n_rot}) and no fourth",
            n_rot / 2
        )));
    }
    Ok(())
}

pub fn load(file: Arc<GgufFile>, plan: LayerPlan) -> Result<DecoderStack, ModelError> {
    check_rope_sections(&Loader::new(&file, &plan.arch))?;
    load_stack(file, plan, HeadOrder::Tiled)
}
