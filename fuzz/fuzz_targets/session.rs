//! The session-file reader (`coil::memory::session::load`) on arbitrary
//! bytes, into the demo model's memory. The first byte chooses: raw bytes,
//! or the bytes as the payload of a well-formed header (right magic,
//! version, model identity and checksum) so the fuzzer reaches the payload
//! parser. An error must leave the sequence as it was.
#![no_main]

#[path = "common.rs"]
mod common;

use coil::engine::Engine;
use coil::memory::session::{fnv1a, load, FNV_OFFSET};
use libfuzzer_sys::fuzz_target;
use std::sync::{LazyLock, Mutex};

static ENGINE: LazyLock<Mutex<Engine>> = LazyLock::new(|| Mutex::new(common::demo_engine()));

fuzz_target!(|data: &[u8]| {
    let Some((&mode, rest)) = data.split_first() else {
        return;
    };
    let mut engine = ENGINE.lock().unwrap_or_else(|e| e.into_inner());
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
