//! Every architecture's test fixture under `tests/fixtures`, by name: one
//! list for the tests of every crate and the fuzz targets (each includes
//! this file with `#[path]`), so that a new architecture's fixture reaches
//! all of them at once.
#![allow(dead_code)]

use std::path::{Path, PathBuf};

/// Made by llama.cpp's converter: `models/<name>/model.f16.gguf`.
pub const CONVERTED: [&str; 9] = [
    "mamba",
    "mamba2",
    "jamba",
    "bamba",
    "granitemoehybrid",
    "falcon_h1",
    "nemotron_h",
    "nemotron_h_moe",
    "llama",
];

/// Made by `tools/make_fixtures_*.py` (transformers' reference logits
/// beside them): `parity/<name>/model.gguf`.
pub const PARITY: [&str; 14] = [
    "qwen35_tiny",
    "qwen35moe_tiny",
    "qwen3next_tiny",
    "lfm2_small",
    "lfm2moe_small",
    "kimi_linear_tiny",
    "kimi_linear_qlora",
    "bailing_hybrid_tiny",
    "bailing_hybrid_qlora",
    "lfm3_tiny",
    "lfm3_plain",
    "zamba2_tiny",
    "zamba2_plain",
    "qwen4exp_tiny",
];

/// The llama fixture quantized to Q8_0 (`coil quantize model.f16.gguf
/// model.q8_0.gguf Q8_0`): every weight in a format whose GEMM keeps tokens
/// at the AVX2 level, so that `coil serve`'s default numerics are
/// batch-invariant for it there (the batch-invariance and server tests).
pub const LLAMA_Q8_0: &str = "llama_q8_0";

/// The Mamba-2 fixture quantized to Q8_0 the same way: a model with chunked
/// recurrences for which the default numerics are batch-invariant at the
/// AVX2 level (chunks at fixed positions of each sequence).
pub const MAMBA2_Q8_0: &str = "mamba2_q8_0";

/// The model file of fixture `name` under `root` (the repository's
/// `tests/fixtures`); other `parity/` fixtures (`mamba2_g1_hd16`, …) by
/// their directory name too.
pub fn path(root: &Path, name: &str) -> PathBuf {
    if name == LLAMA_Q8_0 {
        root.join("models/llama/model.q8_0.gguf")
    } else if name == MAMBA2_Q8_0 {
        root.join("models/mamba2/model.q8_0.gguf")
    } else if CONVERTED.contains(&name) {
        root.join("models").join(name).join("model.f16.gguf")
    } else {
        root.join("parity").join(name).join("model.gguf")
    }
}

/// Every architecture's fixture, converted ones first.
pub fn all(root: &Path) -> Vec<(&'static str, PathBuf)> {
    CONVERTED
        .iter()
        .chain(&PARITY)
        .map(|&a| (a, path(root, a)))
        .collect()
}
