//! Bailing-Hybrid (Ling 3.0: Kimi Delta Attention with the bounded gate and
//! full-rank gate projections, DeepSeek-V3-style MLA with interleaved RoPE
//! and a per-head output gate, group-limited MoE with clipped SwiGLU)
//! against transformers' float32 logits: tiny random-weight
//! `BailingHybridForCausalLM` checkpoints converted by llama.cpp's own
//! converter to `bailingmoe3` (`tools/make_fixtures_bailing.py`;
//! tests/fixtures/parity/<name>/): `bailing_hybrid_tiny` (plain query
//! projection) and `bailing_hybrid_qlora` (a query LoRA). Max |Δ| ≤ 1e-4 ·
//! max|logit|, same argmax everywhere: whole prompt, token by token,
//! micro-batches of 7, mixed micro-batch sizes, several sequences in one
//! batch, and the chunked KDA prefill forced on in small chunks.

mod common;

use coil::engine::{BatchEntry, Engine, EngineOptions};
use coil::models::LogitRows;
use common::{assert_parity, tool_fixture};

const FIXTURES: [&str; 2] = ["bailing_hybrid_tiny", "bailing_hybrid_qlora"];

#[test]
fn bailing_hybrid_matches_transformers() {
    common::check_parity("bailing_hybrid_tiny", &tool_fixture("bailing_hybrid_tiny"));
}

#[test]
fn bailing_hybrid_with_a_query_lora_matches_transformers() {
    common::check_parity(
        "bailing_hybrid_qlora",
        &tool_fixture("bailing_hybrid_qlora"),
    );
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
