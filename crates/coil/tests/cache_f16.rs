//! Attention cells stored in f16 (`--cache-type f16`): logits against the
//! f32 default on the fixtures with attention (a bounded deviation, the
//! same argmax almost everywhere), and rollback, forks and sessions with
//! f16 cells exact — alone and with a bf16 recurrent state.

use coil::engine::{Engine, EngineOptions};
use coil::memory::{CacheType, CheckpointPolicy, SequenceMemory, StateType};
use coil::models::LogitRows;
use std::path::{Path, PathBuf};

mod common;

use common::{llama_cpp_fixture, max_rel_diff, tool_fixture};

/// The fixtures with attention layers.
const ATTENTION: [&str; 13] = [
    "llama",
    "jamba",
    "bamba",
    "granitemoehybrid",
    "falcon_h1",
    "nemotron_h",
    "qwen35_tiny",
    "kimi_linear_tiny",
    "kimi_linear_qlora",
    "bailing_hybrid_tiny",
    "lfm3_tiny",
    "zamba2_tiny",
    "qwen4exp_tiny",
];

fn fixture(arch: &str) -> (PathBuf, Vec<u32>) {
    if arch.ends_with("_tiny") || arch.starts_with("kimi_linear") {
        let f = tool_fixture(arch);
        let tokens = f.tokens.iter().cycle().take(64).copied().collect();
        return (f.model, tokens);
    }
    let f = llama_cpp_fixture(arch);
    (f.model, f.tokens)
}

fn engine(path: &Path, cache: CacheType, state: StateType) -> Engine {
    let mut e = Engine::load(
        path,
        EngineOptions {
            n_seq_max: 4,
            n_ubatch: 16,
            checkpoints: CheckpointPolicy {
                interval: 8,
                every_call: true,
                ..Default::default()
            },
            ..Default::default()
        },
    )
    .unwrap();
    e.set_cache_type(cache);
    e.set_state_type(state);
    assert_eq!(e.mem.cache_type(), cache);
    e
}

fn argmax(r: &[f32]) -> usize {
    r.iter()
        .enumerate()
        .fold(0, |b, (i, &v)| if v > r[b] { i } else { b })
}

/// Measured on these fixtures (printed with `--nocapture`): worst max
/// |Δlogit| / max |logit| 4.5e-4 (llama), every argmax the same (704 of
/// 704 positions). Bounds with margin.
const MAX_REL_DEVIATION: f32 = 1e-2;
const MIN_ARGMAX_AGREEMENT: f64 = 0.95;

#[test]
fn f16_cells_logits_stay_close_to_f32() {
    let (mut agree, mut total) = (0, 0);
    let mut bad = Vec::new();
    for arch in ATTENTION {
        let (path, tokens) = fixture(arch);
        let mut f = engine(&path, CacheType::F32, StateType::F32);
        let mut h = engine(&path, CacheType::F16, StateType::F32);
        let n_vocab = f.n_vocab();
        for ub in [1, tokens.len()] {
            let want = f.eval(0, &tokens, LogitRows::All, ub).unwrap();
            let got = h.eval(0, &tokens, LogitRows::All, ub).unwrap();
            f.mem_clear();
            h.mem_clear();
            let rel = max_rel_diff(&got, &want);
            let same = got
                .chunks(n_vocab)
                .zip(want.chunks(n_vocab))
                .filter(|(g, w)| argmax(g) == argmax(w))
                .count();
            eprintln!(
                "| {arch} | ubatch {ub} | {rel:.2e} | {same}/{} |",
                tokens.len()
            );
            if rel == 0.0 || rel > MAX_REL_DEVIATION {
                bad.push(format!("{arch} ubatch {ub}: {rel:e}"));
            }
            agree += same;
            total += tokens.len();
        }
    }
    assert!(bad.is_empty(), "{}", bad.join("\n"));
    let frac = agree as f64 / total as f64;
    eprintln!("argmax agreement {agree}/{total}");
    assert!(frac >= MIN_ARGMAX_AGREEMENT, "{frac}");
}

/// Back to any earlier position (a checkpoint at every token) and the same
/// tokens again: the same logits, bit for bit; a fork decodes as alone; a
/// session loads into f16 cells exactly and into f32 cells close.
#[test]
fn f16_cells_rollback_fork_and_session_are_exact() {
    for arch in ATTENTION {
        let (path, tokens) = fixture(arch);
        for state in [StateType::F32, StateType::Bf16] {
            let what = format!("{arch} (state {state})");
            let mut e = engine(&path, CacheType::F16, state);
            e.eval(0, &tokens[..12], LogitRows::None, 0).unwrap();
            let mut first = Vec::new();
            for &t in &tokens[12..20] {
                first.push(e.eval(0, &[t], LogitRows::Last, 1).unwrap());
            }
            e.seq_truncate(0, 15).unwrap();
            for (i, &t) in tokens[15..20].iter().enumerate() {
                let again = e.eval(0, &[t], LogitRows::Last, 1).unwrap();
                assert!(
                    again == first[3 + i],
                    "{what}: token {} after rollback",
                    15 + i
                );
            }

            e.seq_fork(0, 1).unwrap();
            let a = e.eval(1, &tokens[30..33], LogitRows::All, 1).unwrap();
            let mut solo = engine(&path, CacheType::F16, state);
            solo.eval(0, &tokens[..12], LogitRows::None, 0).unwrap();
            for &t in &tokens[12..20] {
                solo.eval(0, &[t], LogitRows::Last, 1).unwrap();
            }
            let want = solo.eval(0, &tokens[30..33], LogitRows::All, 1).unwrap();
            assert!(a == want, "{what}: fork");
            assert_eq!(e.mem.seq_len(0).unwrap(), 20);

            let file = std::env::temp_dir().join(format!(
                "coil-f16-test-{}-{arch}-{state}.session",
                std::process::id()
            ));
            e.save_session(0, &file).unwrap();
            let bytes = std::fs::read(&file).unwrap();
            assert_eq!(&bytes[8..12], &2u32.to_le_bytes(), "{what}: version 2");
            assert_eq!(bytes[29], 1, "{what}: cell type recorded as f16");
            let want = e.eval(0, &tokens[40..43], LogitRows::All, 1).unwrap();
            let mut l = engine(&path, CacheType::F16, state);
            l.load_session(2, &file).unwrap();
            let got = l.eval(2, &tokens[40..43], LogitRows::All, 1).unwrap();
            assert!(got == want, "{what}: session into f16 cells");
            let mut w = engine(&path, CacheType::F32, state);
            w.load_session(2, &file).unwrap();
            let got = w.eval(2, &tokens[40..43], LogitRows::All, 1).unwrap();
            let rel = max_rel_diff(&got, &want);
            assert!(
                rel <= MAX_REL_DEVIATION,
                "{what}: session into f32 cells: {rel:e}"
            );
            std::fs::remove_file(&file).ok();
        }
    }
}
