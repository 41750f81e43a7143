//! The chunked KDA prefill (forced on from 2 tokens, in chunks of 8 so that
//! the 37-token prompts cross chunk boundaries) agrees with the
//! token-by-token recurrence and with transformers on the Kimi-Linear
//! fixtures: max |Δ| ≤ 1e-4 · max|logit|.

use coil::engine::{Engine, EngineOptions};
use coil::models::LogitRows;

mod common;

#[test]
fn chunked_prefill_matches_recurrence_and_reference() {
    // This test file is its own process: the variables affect only the
    // engines it loads.
    std::env::set_var("COIL_KDA_MIN_TOKENS", "2");
    std::env::set_var("COIL_KDA_CHUNK", "8");
    for name in [
        "kimi_linear_tiny",
        "kimi_linear_qlora",
        "bailing_hybrid_tiny",
        "bailing_hybrid_qlora",
    ] {
        let f = common::tool_fixture(name);
        let mut e = Engine::load(&f.model, EngineOptions::default()).unwrap();
        let chunked = e.eval(0, &f.tokens, LogitRows::All, 0).unwrap();
        e.seq_clear(0).unwrap();
        let stepped = e.eval(0, &f.tokens, LogitRows::All, 1).unwrap();
        let what = format!("{name} chunked vs transformers");
        common::assert_parity(&what, &chunked, &f.logits, f.n_vocab);
        let what = format!("{name} chunked vs recurrence");
        common::assert_parity(&what, &stepped, &chunked, f.n_vocab);
        e.seq_clear(0).unwrap();
        let mut got = Vec::new();
        let mut at = 0;
        for len in [13, 1, 9, f.tokens.len() - 23] {
            let piece = &f.tokens[at..at + len];
            got.extend(e.eval(0, piece, LogitRows::All, 0).unwrap());
            at += len;
        }
        common::assert_parity(&format!("{name} pieces"), &got, &f.logits, f.n_vocab);
    }
}
