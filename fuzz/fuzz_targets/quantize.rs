//! `coil quantize` on model files edited as the `model` target edits them
//! (every parity fixture, its metadata and tensor table changed by the
//! input's edit records, see `gguf_edits::apply`), written to a scratch
//! folder and quantized with one of the mixtures (`Q8_0` … `Q4_K_M`,
//! `Q6_K`); where that succeeds, the output is loaded and run as the `model`
//! target runs its files. What must hold: an error, never a panic (nor an
//! overflow); no output (`.gguf` or `.partial`) left by a failed run.
//!
//! Input: byte 0 picks the fixture, byte 1 the mixture, then the edit
//! records.
#![no_main]

#[path = "common.rs"]
mod common;
mod gguf_edits;

use coil_convert::{quantize, QuantMix, QuantizeOptions};
use coil_gguf::GgufFile;
use libfuzzer_sys::fuzz_target;
use std::sync::Arc;

fuzz_target!(|data: &[u8]| {
    let scratch = || common::scratch("quantize");
    let [which, mix, edits @ ..] = data else {
        return;
    };
    let Some(file) = gguf_edits::edited(*which, edits) else {
        return;
    };
    let input = scratch().join("in.gguf");
    std::fs::write(&input, file.bytes()).unwrap();
    let out = scratch().join("out.gguf");
    let partial = scratch().join("out.gguf.partial");
    let _ = std::fs::remove_file(&out);
    let opts = QuantizeOptions::new(QuantMix::ALL[*mix as usize % QuantMix::ALL.len()]);
    if quantize(&input, &out, &opts).is_err() {
        assert!(
            !out.exists() && !partial.exists(),
            "a failed quantization left its output behind"
        );
        return;
    }
    let Ok(q) = GgufFile::open(&out) else {
        panic!("coil quantize wrote a GGUF it cannot read back");
    };
    common::exercise(Arc::new(q));
});
