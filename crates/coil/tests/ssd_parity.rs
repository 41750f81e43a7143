//! The chunked SSD prefill path (forced on for this process) agrees with
//! the token-by-token recurrence and with transformers on every Mamba-2
//! family fixture: max |Δ| ≤ 1e-4 · max|logit|.

use coil::engine::{Engine, EngineOptions};
use coil::models::LogitRows;

mod common;

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
        let f = common::llama_cpp_fixture(arch);
        let tokens = &f.tokens;
        let mut e = Engine::load(&f.model, EngineOptions::default()).unwrap();
        let chunked = e.eval(0, tokens, LogitRows::All, 0).unwrap();
        e.seq_clear(0).unwrap();
        let stepped = e.eval(0, tokens, LogitRows::All, 1).unwrap();
        common::assert_parity(
            &format!("{arch} chunked vs transformers"),
            &chunked,
            &f.logits,
            f.n_vocab,
        );
        common::assert_parity(
            &format!("{arch} chunked vs recurrence"),
            &stepped,
            &chunked,
            f.n_vocab,
        );
    }
}
