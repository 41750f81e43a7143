//! Gated DeltaNet hybrids against transformers' float32 logits: tiny
//! random-weight Qwen3.5 (`qwen35`), Qwen3.5-MoE (`qwen35moe`) and
//! Qwen3-Next (`qwen3next`) models converted by llama.cpp's own converter
//! (`tools/make_fixtures_qwen35.py`; tests/fixtures/parity/<name>/). Each
//! has 3 DeltaNet layers and 1 gated attention layer, 2 key heads and 4
//! value heads (tiled order in the qwen35 files, grouped in qwen3next).
//! Max |Δ| ≤ 1e-4 · max|logit|, same argmax everywhere: whole prompt,
//! token by token, micro-batches of 7, mixed micro-batch sizes, and
//! several sequences in one batch.

mod common;

use coil::engine::{BatchEntry, Engine, EngineOptions};
use coil::models::LogitRows;
use common::{assert_parity, tool_fixture};

const FIXTURES: [&str; 3] = ["qwen35_tiny", "qwen35moe_tiny", "qwen3next_tiny"];

fn run(name: &str) {
    common::check_parity(name, &tool_fixture(name));
}

#[test]
fn qwen35_matches_transformers() {
    run("qwen35_tiny");
}

#[test]
fn qwen35moe_matches_transformers() {
    run("qwen35moe_tiny");
}

#[test]
fn qwen3next_matches_transformers() {
    run("qwen3next_tiny");
}

/// Three sequences at different points of the prompt in one batch (a
/// decode step, a long continuation, a new sequence): each row matches the
/// reference logits of its position.
#[test]
fn sequences_batched_together_match_transformers() {
    for name in FIXTURES {
        let f = tool_fixture(name);
        let (t, nv) = (&f.tokens, f.n_vocab);
        let opts = EngineOptions {
            n_seq_max: 3,
            n_ubatch: 64,
            ..Default::default()
        };
        let mut e = Engine::load(&f.model, opts).unwrap();
        e.eval(0, &t[..20], LogitRows::None, 0).unwrap();
        e.eval(1, &t[..9], LogitRows::None, 0).unwrap();
        let got = e
            .decode_batch(&[
                BatchEntry {
                    seq: 0,
                    tokens: &t[20..21],
                    logits: LogitRows::All,
                },
                BatchEntry {
                    seq: 1,
                    tokens: &t[9..t.len()],
                    logits: LogitRows::All,
                },
                BatchEntry {
                    seq: 2,
                    tokens: &t[..6],
                    logits: LogitRows::All,
                },
            ])
            .unwrap();
        let want = |r: std::ops::Range<usize>| &f.logits[r.start * nv..r.end * nv];
        assert_parity(&format!("{name} seq 0"), &got[0], want(20..21), nv);
        assert_parity(&format!("{name} seq 1"), &got[1], want(9..t.len()), nv);
        assert_parity(&format!("{name} seq 2"), &got[2], want(0..6), nv);
    }
}
