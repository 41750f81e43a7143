#![allow(dead_code)]
//! The bundled demo model, loaded once per fuzzing process.

use coil::engine::{Engine, EngineOptions};
use std::path::PathBuf;

pub fn demo_path() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../models/shakespeare-hybrid-q8_0.gguf")
}

pub fn demo_engine() -> Engine {
    let opts = EngineOptions {
        n_threads: 1,
        n_seq_max: 2,
        n_ctx: 256,
        ..Default::default()
    };
    Engine::load(demo_path(), opts).expect("the demo model loads")
}
