//! Model files edited as a bad converter or a damaged download would edit
//! them: every parity fixture in `tests/fixtures/parity` (each architecture
//! coil loads, a tiny GGUF each), with its metadata and tensor table changed
//! by the edits the input spells out, rebuilt in memory, then loaded by
//! `models::load`; where that succeeds, an engine evaluates a few tokens,
//! rolls back and evaluates again. What must hold: an error, never a panic
//! (nor an overflow: cargo-fuzz builds with debug assertions).
//!
//! Input: byte 0 picks the fixture, then 8-byte records, one edit each:
//! `[op, a (u16), b, v (u32)]` (see `gguf_edits::apply`). The values come mostly
//! small (dims, counts, indices around the real ones) and sometimes from
//! the whole u32 range, so that both "plausible but inconsistent" and
//! "absurd" files are tried.
#![no_main]

#[path = "common.rs"]
mod common;
mod gguf_edits;

use libfuzzer_sys::fuzz_target;
use std::sync::Arc;

fuzz_target!(|data: &[u8]| {
    let Some((&which, edits)) = data.split_first() else {
        return;
    };
    if let Some(file) = gguf_edits::edited(which, edits) {
        common::exercise(Arc::new(file));
    }
});
