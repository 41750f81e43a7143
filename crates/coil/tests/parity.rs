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
