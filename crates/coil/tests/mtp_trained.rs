//! The trained MTP fixture (tests/fixtures/mtp/: a small Qwen3.5 model
//! trained with its MTP block on Tiny Shakespeare by `tools/train_demo.py
//! --model qwen35-mtp`, Q8_0, the checkpoint's weights exactly): the
//! trunk's logits and the block's greedy drafts with the logits of each
//! draft step against the training code's own (tools/qwen35_mtp.py,
//! float32 torch), and the block's drafts accepted well above chance in
//! speculative decoding, with the output of plain decoding.

use coil::engine::generate::{generate_with, GenerateOptions};
use coil::engine::sampling::{Sampler, SamplingParams};
use coil::engine::speculative::{DraftSource, Speculator};
use coil::engine::{Engine, EngineOptions};
use coil::models::LogitRows;
use coil::tokenizer::Tokenizer;
use coil_gguf::npy;
use serde_json::Value;
use std::path::PathBuf;

fn dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures/mtp")
}

fn engine(nextn: bool) -> Engine {
    Engine::load(
        dir().join("model.q8_0.gguf"),
        EngineOptions {
            n_seq_max: 1,
            n_threads: 2,
            nextn,
            ..Default::default()
        },
    )
    .unwrap()
}

fn npy_rows(name: &str) -> (Vec<f32>, usize) {
    let a = npy::parse_f32(&std::fs::read(dir().join(name)).unwrap()).unwrap();
    (a.data, a.shape[1])
}

fn argmax(r: &[f32]) -> usize {
    r.iter()
        .enumerate()
        .fold(0, |b, (i, &v)| if v > r[b] { i } else { b })
}

/// max |got − want| over max |want| of each row, the worst row.
fn worst_rel(got: &[f32], want: &[f32], n: usize) -> f32 {
    assert_eq!(got.len(), want.len());
    got.chunks(n)
        .zip(want.chunks(n))
        .map(|(g, w)| {
            let scale = w.iter().fold(0f32, |m, v| m.max(v.abs()));
            let d = g.iter().zip(w).fold(0f32, |m, (a, b)| m.max((a - b).abs()));
            d / scale
        })
        .fold(0f32, f32::max)
}

/// coil's rows against the reference: close (the weights are the same;
/// coil's Q8_0 products round the activations to 8 bits as well), and the
/// same argmax wherever the reference's top two are apart by more than
/// that error could move them.
fn assert_rows(what: &str, got: &[f32], want: &[f32], n: usize, tol: f32) {
    let rel = worst_rel(got, want, n);
    eprintln!("{what}: worst row max |Δ| / max |logit| = {rel:e}");
    assert!(rel <= tol, "{what}: {rel:e} > {tol:e}");
    for (i, (g, w)) in got.chunks(n).zip(want.chunks(n)).enumerate() {
        let top = argmax(w);
        let scale = w.iter().fold(0f32, |m, v| m.max(v.abs()));
        let second = w
            .iter()
            .enumerate()
            .filter(|&(j, _)| j != top)
            .fold(f32::MIN, |m, (_, &v)| m.max(v));
        if w[top] - second > 2.0 * tol * scale {
            assert_eq!(argmax(g), top, "{what}: row {i}");
        }
    }
}

fn reference() -> Value {
    serde_json::from_str(&std::fs::read_to_string(dir().join("reference.json")).unwrap()).unwrap()
}

fn ids(v: &Value) -> Vec<u32> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|t| t.as_u64().unwrap() as u32)
        .collect()
}

const TOL: f32 = 3e-2;

#[test]
fn trunk_logits_match_the_training_code() {
    let r = reference();
    let tokens = ids(&r["tokens"]);
    let (want, n) = npy_rows("logits.npy");
    let mut e = engine(true);
    assert_eq!(e.n_vocab(), n);
    for ub in [tokens.len(), 1] {
        e.mem_clear();
        let got = e.eval(0, &tokens, LogitRows::All, ub).unwrap();
        assert_rows(&format!("trunk, ubatch {ub}"), &got, &want, n, TOL);
    }
}

#[test]
fn the_blocks_drafts_match_the_training_code() {
    let r = reference();
    let tokens = ids(&r["tokens"]);
    let k = r["k"].as_u64().unwrap() as usize;
    let (want, n) = npy_rows("reference_logits.npy");
    let cases = r["cases"].as_array().unwrap();
    assert_eq!(want.len(), cases.len() * k * n);
    let mut e = engine(true);
    let mut same = 0;
    for (c, case) in cases.iter().enumerate() {
        let fed = case["fed"].as_u64().unwrap() as usize;
        let next = case["next"].as_u64().unwrap() as u32;
        assert_eq!(tokens[fed], next);
        let drafts = ids(&case["drafts"]);
        for ub in [fed, 5] {
            e.mem_clear();
            e.eval(0, &tokens[..fed], LogitRows::Last, ub).unwrap();
            let (got, rows) = e.draft_nextn_logits(0, next, k).unwrap();
            let what = format!("drafts after {fed} tokens + {next}, ubatch {ub}");
            // The first step reads the trunk's state only: its logits
            // must match whatever the drafts are.
            assert_rows(&what, &rows[..n], &want[c * k * n..][..n], n, TOL);
            // The next steps read the drafts before them: compared where
            // the drafts are the reference's.
            let agree = got.iter().zip(&drafts).take_while(|(a, b)| a == b).count();
            let upto = (agree + 1).min(got.len());
            assert_rows(
                &what,
                &rows[..upto * n],
                &want[c * k * n..][..upto * n],
                n,
                TOL,
            );
            if got == drafts {
                same += 1;
            }
        }
    }
    assert!(same > 0, "no case drafted the reference's tokens");
}

/// Greedy speculative decoding with the block's drafts: the tokens of
/// plain decoding, and the drafts accepted far above chance (a random
/// block's drafts are almost never kept; the training code measures how
/// often the block's argmax equals the trunk's on held-out text in
/// metrics.json).
#[test]
fn the_trained_blocks_drafts_are_mostly_accepted() {
    let r = reference();
    let prompt = ids(&r["tokens"]);
    let tok =
        Tokenizer::from_gguf(&coil_gguf::GgufFile::open(dir().join("model.q8_0.gguf")).unwrap())
            .unwrap();
    let opts = GenerateOptions {
        max_tokens: 96,
        stop: Vec::new(),
        stop_at_eos: false,
    };
    let mut e = engine(false);
    let mut s = Sampler::new(SamplingParams::greedy());
    let plain = generate_with(&mut e, &tok, 0, &prompt, &mut s, &opts, None, |_| true)
        .unwrap()
        .tokens;
    let mut e = engine(true);
    for k in [1, 3] {
        e.mem_clear();
        let mut sp = Speculator::with_source(DraftSource::Nextn, k);
        sp.len = coil::engine::draft::AdaptiveLen::fixed(k);
        let mut s = Sampler::new(SamplingParams::greedy());
        let st = generate_with(
            &mut e,
            &tok,
            0,
            &prompt,
            &mut s,
            &opts,
            Some(&mut sp),
            |_| true,
        )
        .unwrap();
        assert_eq!(st.tokens, plain, "k = {k}");
        let c = st.spec.unwrap();
        eprintln!("k = {k}: {c:?}, acceptance {:.3}", c.acceptance());
        assert!(c.acceptance() >= 0.4, "k = {k}: {c:?}");
    }
}
