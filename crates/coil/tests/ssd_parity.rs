//! The chunked SSD prefill path (forced on for this process) agrees with
//! the token-by-token recurrence and with transformers on every Mamba-2
//! family fixture: max |Δ| ≤ 1e-4 · max|logit|.

use coil::engine::{Engine, EngineOptions};
use coil::models::LogitRows;
use coil_gguf::npy;
use std::path::PathBuf;

#[test]
fn chunked_ssd_prefill_matches_recurrence_and_reference() {
    // This test file is its own process: setting the variable here affects
    // only the engines it loads.
    std::env::set_var("COIL_SSD_MIN_TOKENS", "2");
    for arch in [
        "mamba2",
        "bamba",
        "granitemoehybrid",
        "falcon_h1",
        "nemotron_h",
        "nemotron_h_moe",
    ] {
        let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
            .join("../../tests/fixtures/models")
            .join(arch);
        let t = std::fs::read_to_string(dir.join("tokens.json")).unwrap();
        let tokens: Vec<u32> = t
            .trim()
            .trim_start_matches('[')
            .trim_end_matches(']')
            .split(',')
            .map(|x| x.trim().parse().unwrap())
            .collect();
        let want = npy::parse_f32(&std::fs::read(dir.join("logits.npy")).unwrap()).unwrap();
        let mut e = Engine::load(dir.join("model.f16.gguf"), EngineOptions::default()).unwrap();
        let chunked = e.eval(0, &tokens, LogitRows::All, 0).unwrap();
        e.seq_clear(0).unwrap();
        let stepped = e.eval(0, &tokens, LogitRows::All, 1).unwrap();
        let max = want.data.iter().fold(0f32, |m, v| m.max(v.abs()));
        for (what, got) in [
            ("chunked vs transformers", &chunked),
            ("chunked vs recurrence", &stepped),
        ] {
            let reference = if what.ends_with("transformers") {
                &want.data
            } else {
                &chunked
            };
            let other = if what.ends_with("transformers") {
                got
            } else {
                &stepped
            };
            let d = other
                .iter()
                .zip(reference)
                .fold(0f32, |m, (a, b)| m.max((a - b).abs()));
            assert!(d <= 1e-4 * max, "{arch} {what}: {d} of {max}");
        }
    }
}
