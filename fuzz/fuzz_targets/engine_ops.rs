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

/// Every architecture's fixture.
static MODELS: LazyLock<Vec<PathBuf>> = LazyLock::new(|| {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures");
    engine_ops::fixtures(&root).into_iter().map(|(_, p)| p).collect()
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
