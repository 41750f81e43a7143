//! Shared by the integration tests: reading the bundled fixtures and
//! comparing logits.
#![allow(dead_code)]

use coil::engine::{Engine, EngineOptions};
use coil::models::LogitRows;
use coil_gguf::npy;
use std::path::PathBuf;

pub mod edit;
#[path = "../../../../tests/support/fixtures.rs"]
mod fixtures;

/// Every architecture, by its llama.cpp-converted fixture under
/// tests/fixtures/models/.
pub const ARCHS: [&str; 9] = fixtures::CONVERTED;

pub struct Fixture {
    pub model: PathBuf,
    pub tokens: Vec<u32>,
    /// transformers' float32 logits `[tokens.len(), n_vocab]`.
    pub logits: Vec<f32>,
    pub n_vocab: usize,
}

fn load(dir: PathBuf, model: &str) -> Fixture {
    let text = std::fs::read_to_string(dir.join("tokens.json")).unwrap();
    let tokens: Vec<u32> = text
        .trim()
        .trim_start_matches('[')
        .trim_end_matches(']')
        .split(',')
        .map(|t| t.trim().parse().unwrap())
        .collect();
    let l = npy::parse_f32(&std::fs::read(dir.join("logits.npy")).unwrap()).unwrap();
    assert_eq!(l.shape[0], tokens.len());
    Fixture {
        model: dir.join(model),
        tokens,
        logits: l.data,
        n_vocab: l.shape[1],
    }
}

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// A llama.cpp-converted fixture (tests/fixtures/models/<arch>).
pub fn llama_cpp_fixture(arch: &str) -> Fixture {
    load(
        repo().join("tests/fixtures/models").join(arch),
        "model.f16.gguf",
    )
}

/// A fixture made by tools/make_fixtures.py (tests/fixtures/parity/<name>).
pub fn tool_fixture(name: &str) -> Fixture {
    load(
        repo().join("tests/fixtures/parity").join(name),
        "model.gguf",
    )
}

/// max |got − want| / max |want|.
pub fn max_rel_diff(got: &[f32], want: &[f32]) -> f32 {
    assert_eq!(got.len(), want.len(), "lengths differ");
    let max = want.iter().fold(0f32, |m, v| m.max(v.abs()));
    let diff = got
        .iter()
        .zip(want)
        .fold(0f32, |m, (a, b)| m.max((a - b).abs()));
    diff / max
}

pub fn assert_close(what: &str, got: &[f32], want: &[f32], tol: f32) {
    let rel = max_rel_diff(got, want);
    assert!(
        rel <= tol,
        "{what}: max |Δ| is {rel:e} of max|logit| (bound {tol:e})"
    );
}

fn argmax(r: &[f32]) -> usize {
    r.iter()
        .enumerate()
        .fold(0, |b, (i, &v)| if v > r[b] { i } else { b })
}

/// The parity bound: max |Δ| ≤ 1e-4 · max|logit| and the same argmax in
/// every row. Returns the relative difference.
pub fn assert_parity(what: &str, got: &[f32], want: &[f32], n_vocab: usize) -> f32 {
    assert_close(what, got, want, 1e-4);
    for (t, (g, w)) in got.chunks(n_vocab).zip(want.chunks(n_vocab)).enumerate() {
        assert_eq!(argmax(g), argmax(w), "{what}: argmax at position {t}");
    }
    max_rel_diff(got, want)
}

/// Full prefill, token by token, micro-batches of 7 and mixed micro-batch
/// sizes, with 1 and 2 threads: each against the reference logits.
pub fn check_parity(name: &str, f: &Fixture) {
    let n = f.tokens.len();
    for threads in [1, 2] {
        let opts = EngineOptions {
            n_threads: threads,
            ..Default::default()
        };
        let mut e = Engine::load(&f.model, opts).unwrap();
        assert_eq!(e.n_vocab(), f.n_vocab);
        for ub in [n, 1, 7] {
            e.mem_clear();
            let got = e.eval(0, &f.tokens, LogitRows::All, ub).unwrap();
            let what = format!("{name}: ubatch {ub}, {threads} threads");
            let rel = assert_parity(&what, &got, &f.logits, f.n_vocab);
            eprintln!("{what}: max rel {rel:e}");
        }
        e.mem_clear();
        let mut got = Vec::new();
        let mut at = 0;
        for len in [5, 1, 17, n - 23] {
            got.extend(
                e.eval(0, &f.tokens[at..at + len], LogitRows::All, len)
                    .unwrap(),
            );
            at += len;
        }
        let what = format!("{name}: mixed micro-batches, {threads} threads");
        assert_parity(&what, &got, &f.logits, f.n_vocab);
    }
}
