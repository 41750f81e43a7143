//! The engine's memory contract on runs of operations the input spells
//! out (tests/support/engine_ops.rs: prompts and decode steps of several
//! sequences in one batch, rollbacks to any position, forks, clears,
//! sessions, with the checkpoint spacing, budget and micro-batch size the
//! input picks), on one of the fixtures of every architecture (the first
//! byte): each sequence's logits must stay those a fresh engine computes
//! from its tokens, its tokens the reference's. A broken promise panics
//! with the operations that led to it.
#![no_main]

#[path = "common.rs"]
mod common;
#[path = "../../tests/support/engine_ops.rs"]
mod engine_ops;

use libfuzzer_sys::fuzz_target;
use std::path::PathBuf;
use std::sync::LazyLock;

/// Every architecture's fixture: the llama.cpp-converted ones
/// (tests/fixtures/models) and the tools' (tests/fixtures/parity).
static MODELS: LazyLock<Vec<PathBuf>> = LazyLock::new(|| {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures");
    let mut v: Vec<PathBuf> = [
        "mamba",
        "mamba2",
        "jamba",
        "bamba",
        "granitemoehybrid",
        "falcon_h1",
        "nemotron_h",
        "nemotron_h_moe",
        "llama",
    ]
    .iter()
    .map(|a| root.join("models").join(a).join("model.f16.gguf"))
    .collect();
    for a in [
        "qwen35_tiny",
        "qwen35moe_tiny",
        "qwen3next_tiny",
        "lfm2_small",
        "lfm2moe_small",
    ] {
        v.push(root.join("parity").join(a).join("model.gguf"));
    }
    v
});

fuzz_target!(|data: &[u8]| {
    let Some((&pick, ops)) = data.split_first() else {
        return;
    };
    let model = &MODELS[pick as usize % MODELS.len()];
    if let Err(e) = engine_ops::run(model, ops, common::scratch("engine_ops")) {
        panic!("{}: {e}", model.display());
    }
});
