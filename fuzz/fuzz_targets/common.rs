#![allow(dead_code)]
//! What several targets share: the bundled demo model (loaded once per
//! fuzzing process), a scratch folder, and running a model file loaded.

use coil::engine::{Engine, EngineOptions};
use coil::models::{self, LogitRows};
use coil_gguf::GgufFile;
use std::path::{Path, PathBuf};
use std::sync::{Arc, OnceLock};

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

/// This process's scratch folder (`coil-fuzz-TARGET-PID` in the temp
/// folder; one target per process).
pub fn scratch(target: &str) -> &'static Path {
    static D: OnceLock<PathBuf> = OnceLock::new();
    D.get_or_init(|| {
        let d = std::env::temp_dir().join(format!("coil-fuzz-{target}-{}", std::process::id()));
        std::fs::create_dir_all(&d).unwrap();
        d
    })
}

/// Loads `file` as a model; where that succeeds, an engine evaluates 5
/// tokens in micro-batches of 2, rolls back to 2, evaluates again, forks and
/// evaluates the fork. Errors are fine; a panic is the finding.
pub fn exercise(file: Arc<GgufFile>) {
    if models::load(file.clone()).is_err() {
        return;
    }
    let opts = EngineOptions {
        n_threads: 1,
        n_seq_max: 2,
        n_ctx: 64,
        ..Default::default()
    };
    let Ok(mut engine) = Engine::from_file(file, opts) else {
        return;
    };
    let n_vocab = engine.n_vocab() as u32;
    if n_vocab == 0 {
        return;
    }
    let tokens: Vec<u32> = [1u32, 7, 3, 11, 2].iter().map(|t| t % n_vocab).collect();
    if engine.eval(0, &tokens, LogitRows::All, 2).is_err() {
        return;
    }
    let _ = engine.seq_truncate(0, 2);
    let _ = engine.eval(0, &tokens[..2], LogitRows::Last, 0);
    let _ = engine.seq_fork(0, 1);
    let _ = engine.eval(1, &tokens[..1], LogitRows::Last, 0);
}
