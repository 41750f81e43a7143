//! The session-file reader (`coil::memory::session::load`) on arbitrary
//! bytes, into a model's memory: the demo model (Mamba-2 + attention), or
//! a tiny parity fixture with other state kinds (Gated DeltaNet matrices
//! and gated attention, LFM2's short-convolution tails, Jamba's Mamba-1 +
//! MoE). The first byte chooses: bit 0 raw bytes, or the bytes as the
//! payload of a well-formed header (right magic, version, model identity
//! and checksum) so the fuzzer reaches the payload parser; the rest of it
//! the model. An error must leave the sequence as it was.
#![no_main]

#[path = "common.rs"]
mod common;

use coil::engine::{Engine, EngineOptions};
use coil::memory::session::{fnv1a, load, FNV_OFFSET};
use libfuzzer_sys::fuzz_target;
use std::path::PathBuf;
use std::sync::{LazyLock, Mutex};

/// The parity fixtures besides the demo model (`tests/fixtures/parity/NAME`).
const FIXTURES: [&str; 7] = [
    "qwen35_tiny",
    "lfm2_small",
    "jamba_small",
    "kimi_linear_tiny",
    "bailing_hybrid_tiny",
    "lfm3_tiny",
    "zamba2_tiny",
];

static ENGINES: LazyLock<Vec<Mutex<Engine>>> = LazyLock::new(|| {
    let mut v = vec![Mutex::new(common::demo_engine())];
    for name in FIXTURES {
        let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
            .join("../tests/fixtures/parity")
            .join(name)
            .join("model.gguf");
        let opts = EngineOptions {
            n_threads: 1,
            n_seq_max: 2,
            n_ctx: 256,
            ..Default::default()
        };
        v.push(Mutex::new(
            Engine::load(path, opts).expect("a parity fixture loads"),
        ));
    }
    v
});

fuzz_target!(|data: &[u8]| {
    let Some((&mode, rest)) = data.split_first() else {
        return;
    };
    let engines = &*ENGINES;
    let mut engine = engines[(mode >> 1) as usize % engines.len()]
        .lock()
        .unwrap_or_else(|e| e.into_inner());
    let id = engine.model_identity();
    let bytes = if mode % 2 == 0 {
        rest.to_vec()
    } else {
        let mut b = b"COILSESS".to_vec();
        b.extend_from_slice(&1u32.to_le_bytes());
        b.extend_from_slice(&id.to_le_bytes());
        b.extend_from_slice(&(rest.len() as u64).to_le_bytes());
        b.extend_from_slice(rest);
        b.extend_from_slice(&fnv1a(rest, FNV_OFFSET).to_le_bytes());
        b
    };
    let before = engine.mem.seq_tokens(0).map(|t| t.to_vec()).ok();
    let result = load(&mut engine.mem, 0, id, &mut bytes.as_slice());
    if result.is_err() {
        let after = engine.mem.seq_tokens(0).map(|t| t.to_vec()).ok();
        assert_eq!(before, after, "a failed load changed the sequence");
    }
    let _ = engine.seq_clear(0);
});
