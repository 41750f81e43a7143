//! Parity of every architecture's forward pass with transformers'
//! float32 logits on llama.cpp-converted GGUFs (f16 weights that are exactly
//! f16-representable, f32 compute): max |Δ| ≤ 1e-4 · max|logit|, same
//! argmax everywhere — for full prefill, token by token and mixed
//! micro-batch sizes.

mod common;

use coil::engine::{Engine, EngineOptions};
use coil::models::LogitRows;
use common::{assert_close, llama_cpp_fixture, ARCHS};

fn run(arch: &str) {
    common::check_parity(arch, &llama_cpp_fixture(arch));
}

#[test]
fn jamba_matches_transformers() {
    run("jamba");
}

#[test]
fn bamba_matches_transformers() {
    run("bamba");
}

#[test]
fn granitemoehybrid_matches_transformers() {
    run("granitemoehybrid");
}

#[test]
fn falcon_h1_matches_transformers() {
    run("falcon_h1");
}

#[test]
fn nemotron_h_matches_transformers() {
    run("nemotron_h");
}

#[test]
fn nemotron_h_moe_matches_transformers() {
    run("nemotron_h_moe");
}

#[test]
fn llama_matches_transformers() {
    run("llama");
}

#[test]
fn mamba_matches_transformers() {
    run("mamba");
}

#[test]
fn mamba2_matches_transformers() {
    run("mamba2");
}

/// The recurrent state after a prompt split anywhere equals the state after
/// one pass (up to f32 rounding of a different summation grouping).
#[test]
fn state_after_split_prompt_equals_one_pass() {
    for arch in ARCHS.into_iter().filter(|a| *a != "llama") {
        let f = llama_cpp_fixture(arch);
        let (path, tokens) = (&f.model, &f.tokens);
        let mut e = Engine::load(path, EngineOptions::default()).unwrap();
        e.eval(0, tokens, LogitRows::None, 0).unwrap();
        let n_layer = e.model.info().plan.layers.len();
        let snapshot = |e: &mut Engine| -> Vec<f32> {
            let rec = e.mem.recurrent.as_mut().unwrap();
            let mut v = Vec::new();
            for l in 0..n_layer {
                if let Some(st) = rec.state(l, 0).unwrap() {
                    v.extend_from_slice(st.conv);
                    v.extend_from_slice(st.ssm);
                }
            }
            v
        };
        let whole = snapshot(&mut e);
        assert!(whole.iter().any(|v| *v != 0.0));
        for split in [1, 2, 3, 13, 24, 47] {
            e.mem_clear();
            e.eval(0, &tokens[..split], LogitRows::None, 0).unwrap();
            e.eval(0, &tokens[split..], LogitRows::Last, 0).unwrap();
            let parts = snapshot(&mut e);
            assert_close(&format!("{arch} split {split}"), &parts, &whole, 1e-5);
        }
    }
}

/// Several sequences at different positions decoded in one batch give the
/// same logits as each decoded alone (≤ 1e-5 relative).
#[test]
fn batched_sequences_equal_each_alone() {
    use coil::engine::BatchEntry;
    for arch in ARCHS {
        let f = llama_cpp_fixture(arch);
        let (path, tokens, n_vocab) = (&f.model, &f.tokens, f.n_vocab);
        let opts = EngineOptions {
            n_seq_max: 3,
            n_ubatch: 16,
            ..Default::default()
        };
        // Alone: each sequence in its own engine.
        let alone = |pre: &[u32], step: &[u32]| -> Vec<f32> {
            let mut e = Engine::load(
                path,
                EngineOptions {
                    n_seq_max: 1,
                    ..opts.clone()
                },
            )
            .unwrap();
            if !pre.is_empty() {
                e.eval(0, pre, LogitRows::None, 0).unwrap();
            }
            e.eval(0, step, LogitRows::All, 0).unwrap()
        };
        let a = (&tokens[..20], &tokens[20..21]); // decoding one token
        let b = (&tokens[5..15], &tokens[15..40]); // a long prompt continuation
        let c = (&tokens[..0], &tokens[30..35]); // a new sequence
        let want = [alone(a.0, a.1), alone(b.0, b.1), alone(c.0, c.1)];

        let mut e = Engine::load(path, opts.clone()).unwrap();
        e.eval(0, a.0, LogitRows::None, 0).unwrap();
        e.eval(1, b.0, LogitRows::None, 0).unwrap();
        let got = e
            .decode_batch(&[
                BatchEntry {
                    seq: 0,
                    tokens: a.1,
                    logits: LogitRows::All,
                },
                BatchEntry {
                    seq: 1,
                    tokens: b.1,
                    logits: LogitRows::All,
                },
                BatchEntry {
                    seq: 2,
                    tokens: c.1,
                    logits: LogitRows::All,
                },
            ])
            .unwrap();
        for (i, (g, w)) in got.iter().zip(&want).enumerate() {
            assert_eq!(g.len(), w.len(), "{arch} seq {i}");
            assert_close(&format!("{arch} seq {i}"), g, w, 1e-5);
            assert_eq!(g.len() / n_vocab, w.len() / n_vocab);
        }
        // Only the rows asked for come back.
        let mut e2 = Engine::load(
            path,
            EngineOptions {
                n_seq_max: 3,
                n_ubatch: 16,
                ..Default::default()
            },
        )
        .unwrap();
        let got = e2
            .decode_batch(&[
                BatchEntry {
                    seq: 0,
                    tokens: &tokens[..20],
                    logits: LogitRows::Last,
                },
                BatchEntry {
                    seq: 2,
                    tokens: &tokens[..3],
                    logits: LogitRows::None,
                },
                BatchEntry {
                    seq: 1,
                    tokens: &tokens[5..12],
                    logits: LogitRows::All,
                },
            ])
            .unwrap();
        assert_eq!(got[0].len(), n_vocab);
        assert!(got[1].is_empty());
        // The last layer's feed-forward runs for the rows asked for alone:
        // their logits are still those of every row computed.
        let all20 = alone(&[], &tokens[..20]);
        assert_close(
            &format!("{arch} last row among others"),
            &got[0],
            &all20[19 * n_vocab..],
            1e-5,
        );
        assert_close(
            &format!("{arch} all rows beside others"),
            &got[2],
            &alone(&[], &tokens[5..12]),
            1e-5,
        );
        // Errors leave every sequence untouched.
        assert!(e2
            .decode_batch(&[
                BatchEntry {
                    seq: 0,
                    tokens: &tokens[..1],
                    logits: LogitRows::Last
                },
                BatchEntry {
                    seq: 0,
                    tokens: &tokens[..1],
                    logits: LogitRows::Last
                },
            ])
            .is_err());
        assert!(e2
            .decode_batch(&[BatchEntry {
                seq: 3,
                tokens: &tokens[..1],
                logits: LogitRows::Last
            }])
            .is_err());
        assert!(e2
            .decode_batch(&[
                BatchEntry {
                    seq: 1,
                    tokens: &tokens[..2],
                    logits: LogitRows::Last
                },
                BatchEntry {
                    seq: 0,
                    tokens: &[999_999],
                    logits: LogitRows::Last
                },
            ])
            .is_err());
        use coil::memory::SequenceMemory;
        assert_eq!(e2.mem.seq_len(0).unwrap(), 20);
        assert_eq!(e2.mem.seq_len(1).unwrap(), 7);
    }
}

/// `decode_batch_logits` hands each entry its rows in place (an entry that
/// asks for none gets none), a recycled buffer is overwritten rather than
/// added to, and the rows equal `decode_batch`'s, step after step and when
/// a prompt spans several micro-batches.
#[test]
fn batch_logits_in_place_and_recycled() {
    use coil::engine::{BatchEntry, Numerics};
    let f = llama_cpp_fixture("mamba2");
    let (tokens, n_vocab) = (&f.tokens, f.n_vocab);
    let opts = EngineOptions {
        n_seq_max: 3,
        n_ubatch: 8,
        ..Default::default()
    };
    let mut flat = Engine::load(&f.model, opts.clone()).unwrap();
    let mut vecs = Engine::load(&f.model, opts).unwrap();
    for step in 0..4 {
        // step 0: a 12-token prompt (two micro-batches) beside two single
        // tokens; then one token each, the middle one asking for no rows.
        let t = |s: usize| -> &[u32] {
            if step == 0 && s == 1 {
                &tokens[..12]
            } else {
                &tokens[10 * s + step..10 * s + step + 1]
            }
        };
        let rows = |s: usize| match (step, s) {
            (0, 1) => LogitRows::All,
            (_, 1) => LogitRows::None,
            _ => LogitRows::Last,
        };
        let entries: Vec<BatchEntry> = (0..3)
            .map(|s| BatchEntry {
                seq: s,
                tokens: t(s),
                logits: rows(s),
            })
            .collect();
        let got = flat.decode_batch_logits(&entries, Numerics::Fast).unwrap();
        let want = vecs.decode_batch_with(&entries, Numerics::Fast).unwrap();
        assert_eq!(got.len(), 3);
        for (s, w) in want.iter().enumerate() {
            let g = got.rows(s);
            assert_eq!(g.len(), w.len(), "step {step} seq {s}");
            let n_rows = match rows(s) {
                LogitRows::All => t(s).len(),
                LogitRows::Last => 1,
                LogitRows::None => 0,
            };
            assert_eq!(g.len(), n_rows * n_vocab, "step {step} seq {s}");
            assert!(g.iter().zip(w).all(|(a, b)| a.to_bits() == b.to_bits()));
        }
        flat.recycle(got);
    }
}
