//! Parity of every architecture's forward pass with transformers'
//! float32 logits on llama.cpp-converted GGUFs (f16 weights that are exactly
//! f16-representable, f32 compute): max |Δ| ≤ 1e-4 · max|logit|, same
//! argmax everywhere — for full prefill, token by token and mixed
//! micro-batch sizes.

use coil::engine::{Engine, EngineOptions};
use coil::models::LogitRows;
use coil_gguf::npy;
use std::path::PathBuf;

fn fixture(arch: &str) -> (PathBuf, Vec<u32>, Vec<f32>, usize) {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../tests/fixtures/models")
        .join(arch);
    let tokens: Vec<u32> =
        serde_json_lite(&std::fs::read_to_string(dir.join("tokens.json")).unwrap());
    let l = npy::parse_f32(&std::fs::read(dir.join("logits.npy")).unwrap()).unwrap();
    assert_eq!(l.shape[0], tokens.len());
    (dir.join("model.f16.gguf"), tokens, l.data, l.shape[1])
}

/// tokens.json is a flat list of integers.
fn serde_json_lite(s: &str) -> Vec<u32> {
    s.trim()
        .trim_start_matches('[')
        .trim_end_matches(']')
        .split(',')
        .map(|t| t.trim().parse().unwrap())
        .collect()
}

fn argmax(r: &[f32]) -> usize {
    r.iter()
        .enumerate()
        .fold(0, |b, (i, &v)| if v > r[b] { i } else { b })
}

/// Compares all rows; returns max |Δ| / max |ref|.
pub fn compare(arch: &str, what: &str, got: &[f32], want: &[f32], n_vocab: usize) -> f32 {
    assert_eq!(got.len(), want.len(), "{arch} {what}: length");
    let max_ref = want.iter().fold(0f32, |m, v| m.max(v.abs()));
    let max_diff = got
        .iter()
        .zip(want)
        .fold(0f32, |m, (a, b)| m.max((a - b).abs()));
    let rel = max_diff / max_ref;
    assert!(
        rel <= 1e-4,
        "{arch} {what}: max |Δ| {max_diff} = {rel:e} of max|logit| {max_ref}"
    );
    for (t, (g, w)) in got.chunks(n_vocab).zip(want.chunks(n_vocab)).enumerate() {
        assert_eq!(
            argmax(g),
            argmax(w),
            "{arch} {what}: argmax at position {t}"
        );
    }
    rel
}

fn run(arch: &str, ubatches: &[usize]) {
    let (path, tokens, want, n_vocab) = fixture(arch);
    for threads in [1, 2] {
        let opts = EngineOptions {
            n_threads: threads,
            ..Default::default()
        };
        let mut e = Engine::load(&path, opts).unwrap();
        assert_eq!(e.n_vocab(), n_vocab);
        for &ub in ubatches {
            e.mem_clear();
            let got = e.eval(0, &tokens, LogitRows::All, ub).unwrap();
            let rel = compare(
                arch,
                &format!("ubatch {ub}, {threads} threads"),
                &got,
                &want,
                n_vocab,
            );
            eprintln!("{arch}: ubatch {ub}, {threads} threads: max rel {rel:e}");
        }
        // Mixed micro-batch sizes: 5, then 1, then 17, then the rest.
        e.mem_clear();
        let mut got = Vec::new();
        let mut at = 0;
        for n in [5, 1, 17, 25] {
            got.extend(e.eval(0, &tokens[at..at + n], LogitRows::All, n).unwrap());
            at += n;
        }
        compare(arch, "mixed micro-batches", &got, &want, n_vocab);
    }
}

#[test]
fn jamba_matches_transformers() {
    run("jamba", &[48, 1, 7]);
}

#[test]
fn bamba_matches_transformers() {
    run("bamba", &[48, 1, 7]);
}

#[test]
fn granitemoehybrid_matches_transformers() {
    run("granitemoehybrid", &[48, 1, 7]);
}

#[test]
fn falcon_h1_matches_transformers() {
    run("falcon_h1", &[48, 1, 7]);
}

#[test]
fn nemotron_h_matches_transformers() {
    run("nemotron_h", &[48, 1, 7]);
}

#[test]
fn nemotron_h_moe_matches_transformers() {
    run("nemotron_h_moe", &[48, 1, 7]);
}

#[test]
fn llama_matches_transformers() {
    run("llama", &[48, 1, 7]);
}

#[test]
fn mamba_matches_transformers() {
    run("mamba", &[48, 1, 7]);
}

#[test]
fn mamba2_matches_transformers() {
    run("mamba2", &[48, 1, 7]);
}

/// The recurrent state after a prompt split anywhere equals the state after
/// one pass (up to f32 rounding of a different summation grouping).
#[test]
fn state_after_split_prompt_equals_one_pass() {
    for arch in ["mamba", "mamba2"] {
        let (path, tokens, _, _) = fixture(arch);
        let mut e = Engine::load(&path, EngineOptions::default()).unwrap();
        e.eval(0, &tokens, LogitRows::None, 0).unwrap();
        let n_layer = e.model.info().plan.layers.len();
        let snapshot = |e: &mut Engine| -> Vec<f32> {
            let rec = e.mem.recurrent.as_mut().unwrap();
            let mut v = Vec::new();
            for l in 0..n_layer {
                let st = rec.state(l, 0).unwrap().unwrap();
                v.extend_from_slice(st.conv);
                v.extend_from_slice(st.ssm);
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
            let max = whole.iter().fold(0f32, |m, v| m.max(v.abs()));
            let diff = whole
                .iter()
                .zip(&parts)
                .fold(0f32, |m, (a, b)| m.max((a - b).abs()));
            assert!(diff <= 1e-5 * max, "{arch} split {split}: {diff} of {max}");
        }
    }
}

/// Several sequences at different positions decoded in one batch give the
/// same logits as each decoded alone (≤ 1e-5 relative).
#[test]
fn batched_sequences_equal_each_alone() {
    use coil::engine::BatchEntry;
    for arch in [
        "mamba",
        "mamba2",
        "jamba",
        "bamba",
        "granitemoehybrid",
        "falcon_h1",
        "nemotron_h",
        "nemotron_h_moe",
        "llama",
    ] {
        let (path, tokens, _, n_vocab) = fixture(arch);
        let opts = EngineOptions {
            n_seq_max: 3,
            n_ubatch: 16,
            ..Default::default()
        };
        // Alone: each sequence in its own engine.
        let alone = |pre: &[u32], step: &[u32]| -> Vec<f32> {
            let mut e = Engine::load(
                &path,
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

        let mut e = Engine::load(&path, opts).unwrap();
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
            let max = w.iter().fold(0f32, |m, v| m.max(v.abs()));
            let diff = g.iter().zip(w).fold(0f32, |m, (x, y)| m.max((x - y).abs()));
            assert!(diff <= 1e-5 * max, "{arch} seq {i}: {diff} of {max}");
            assert_eq!(g.len() / n_vocab, w.len() / n_vocab);
        }
        // Only the rows asked for come back.
        let mut e2 = Engine::load(
            &path,
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
            ])
            .unwrap();
        assert_eq!(got[0].len(), n_vocab);
        assert!(got[1].is_empty());
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
        assert_eq!(e2.mem.seq_len(1).unwrap(), 0);
    }
}
