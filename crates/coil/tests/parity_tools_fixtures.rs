//! Parity with transformers' float32 logits on the fixtures that
//! `tools/make_fixtures.py` writes (tests/fixtures/parity/<name>/): all-F32
//! GGUFs of tiny random Mamba / Mamba-2 models with shapes the llama.cpp
//! fixtures don't cover (d_inner ≠ 2·d_model, d_state 8 / 12 / 24, d_conv
//! 2 / 3, dt_rank 5, n_groups 1 and 4, head_dim 24, untied output), and of
//! hybrids that llama.cpp's converter gets wrong or refuses: Bamba with
//! partial RoPE permuted correctly (`coil.rope.partial_permute`),
//! GraniteMoeHybrid with RoPE, Nemotron-H mixing dense and MoE layers,
//! Nemotron-H without attention, and a small GQA / top-2 Jamba.
//! Max |Δ| ≤ 1e-4 · max|logit|, same argmax everywhere — for full prefill,
//! token by token, micro-batches of 7 and mixed micro-batch sizes.

use coil::engine::{Engine, EngineOptions};
use coil::models::LogitRows;
use coil_gguf::npy;
use std::path::PathBuf;

fn fixture(name: &str) -> (PathBuf, Vec<u32>, Vec<f32>, usize) {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../tests/fixtures/parity")
        .join(name);
    let tokens = parse_ids(&std::fs::read_to_string(dir.join("tokens.json")).unwrap());
    let l = npy::parse_f32(&std::fs::read(dir.join("logits.npy")).unwrap()).unwrap();
    assert_eq!(l.shape[0], tokens.len());
    (dir.join("model.gguf"), tokens, l.data, l.shape[1])
}

/// tokens.json is a flat list of integers.
fn parse_ids(s: &str) -> Vec<u32> {
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
fn compare(name: &str, what: &str, got: &[f32], want: &[f32], n_vocab: usize) -> f32 {
    assert_eq!(got.len(), want.len(), "{name} {what}: length");
    let max_ref = want.iter().fold(0f32, |m, v| m.max(v.abs()));
    let max_diff = got
        .iter()
        .zip(want)
        .fold(0f32, |m, (a, b)| m.max((a - b).abs()));
    let rel = max_diff / max_ref;
    assert!(
        rel <= 1e-4,
        "{name} {what}: max |Δ| {max_diff} = {rel:e} of max|logit| {max_ref}"
    );
    for (t, (g, w)) in got.chunks(n_vocab).zip(want.chunks(n_vocab)).enumerate() {
        assert_eq!(
            argmax(g),
            argmax(w),
            "{name} {what}: argmax at position {t}"
        );
    }
    rel
}

fn run(name: &str) {
    let (path, tokens, want, n_vocab) = fixture(name);
    let n = tokens.len();
    for threads in [1, 2] {
        let opts = EngineOptions {
            n_threads: threads,
            ..Default::default()
        };
        let mut e = Engine::load(&path, opts).unwrap();
        assert_eq!(e.n_vocab(), n_vocab);
        for ub in [n, 1, 7] {
            e.mem_clear();
            let got = e.eval(0, &tokens, LogitRows::All, ub).unwrap();
            let rel = compare(
                name,
                &format!("ubatch {ub}, {threads} threads"),
                &got,
                &want,
                n_vocab,
            );
            eprintln!("{name}: ubatch {ub}, {threads} threads: max rel {rel:e}");
        }
        // Mixed micro-batch sizes: 5, then 1, then 17, then the rest.
        e.mem_clear();
        let mut got = Vec::new();
        let mut at = 0;
        for len in [5, 1, 17, n - 23] {
            got.extend(
                e.eval(0, &tokens[at..at + len], LogitRows::All, len)
                    .unwrap(),
            );
            at += len;
        }
        let rel = compare(name, "mixed micro-batches", &got, &want, n_vocab);
        eprintln!("{name}: mixed micro-batches, {threads} threads: max rel {rel:e}");
    }
}

#[test]
fn mamba_dstate8_matches_transformers() {
    run("mamba_dstate8");
}

#[test]
fn mamba2_g4_hd24_matches_transformers() {
    run("mamba2_g4_hd24");
}

#[test]
fn mamba2_g1_hd16_matches_transformers() {
    run("mamba2_g1_hd16");
}

// Hybrids whose llama.cpp conversion is wrong or refused (see
// tests/fixtures/parity/README.md).

#[test]
fn bamba_partial_rope_matches_transformers() {
    run("bamba_partial_rope");
}

#[test]
fn granitemoehybrid_rope_matches_transformers() {
    run("granitemoehybrid_rope");
}

#[test]
fn nemotron_h_mixed_matches_transformers() {
    run("nemotron_h_mixed");
}

#[test]
fn nemotron_h_no_attn_matches_transformers() {
    run("nemotron_h_no_attn");
}

#[test]
fn jamba_small_matches_transformers() {
    run("jamba_small");
}
