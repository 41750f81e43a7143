//! Batch invariance (what speculative decoding stands on): with
//! `Numerics::BatchInvariant`, the logits of every position are bit for bit
//! those of feeding the tokens one at a time, each sequence alone —
//!
//! * one sequence in micro-batches of 2..=17 tokens (a verification of 16
//!   drafted tokens plus the last accepted one);
//! * a rollback inside a verification batch (replayed with the invariant
//!   kernels), then decoding on;
//! * N = 1..=16 sequences decoding (and prefilling prefixes of different
//!   lengths) in one micro-batch beside a 17-token verification chunk of
//!   another sequence;
//!
//! * a prompt processed whole, in uneven chunks, resumed from a forked
//!   prefix (what a prefix-cache hit does) and beside another sequence's
//!   prompt;
//!
//! for every architecture (the llama.cpp-converted fixtures, the tools'
//! fixtures and the bundled Q8_0 demo model), at every SIMD level this CPU
//! has. The reference is plain one-token decoding (`Numerics::Fast`, one
//! token per call), so the test also pins that one token takes the
//! invariant path. The prompt cases run with `Numerics::CheapInvariant`
//! too (what `coil serve` runs prompts with) wherever the engine says that
//! is batch-invariant for the model (`Engine::prompts_invariant`: the Q8_0
//! llama fixture at the AVX2 level, the fidelity test's trained Llama in
//! Q8_0, Q4_K_M and Q5_K_M at AVX2 and AVX-512, which the test requires).
//!
//! For a model with chunked recurrences (Mamba-2, Gated DeltaNet, KDA) the
//! default's prompts are the chunked forms with chunks at fixed positions
//! of the sequence, so its reference is the prompt in one call:
//! `chunked_prompts` checks that the logits of every prompt position and of
//! the generated tokens after it are those bits bit for bit in micro-batches
//! of any size, in calls cut at chunk boundaries, beside other prompts,
//! resumed from a fork at an unaligned prefix and continued after decoded
//! tokens (rolled back where `Engine::resume_point` says) — on the bundled
//! demo model and the Q8_0 Mamba-2 fixture, which the test requires to be
//! batch-invariant by default at the AVX2 level.

mod common;

use coil::engine::{BatchEntry, Engine, EngineOptions, Numerics};
use coil::models::LogitRows;
use coil_kernels::simd::{available_levels, level_scope};
use std::path::{Path, PathBuf};
use std::sync::Mutex;

/// The SIMD level is process-wide: tests of this binary take turns.
static LEVEL: Mutex<()> = Mutex::new(());

/// Draft-max 16 plus the last accepted token.
const K_MAX: usize = 17;
const N_SEQ: usize = 16;

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn engine(model: &Path) -> Engine {
    let opts = EngineOptions {
        n_threads: 2,
        n_seq_max: N_SEQ + 1,
        n_ctx: 256,
        ..Default::default()
    };
    Engine::load(model, opts).unwrap()
}

/// `[tokens.len(), n_vocab]`: one token per call, the sequence alone.
fn one_at_a_time(e: &mut Engine, tokens: &[u32]) -> Vec<f32> {
    e.mem_clear();
    let mut out = Vec::new();
    for t in tokens {
        out.extend(
            e.eval(0, std::slice::from_ref(t), LogitRows::All, 1)
                .unwrap(),
        );
    }
    out
}

/// Panics at the first position whose logits differ in any bit.
fn assert_bitwise(what: &str, got: &[f32], want: &[f32], n_vocab: usize, pos0: usize) {
    assert_eq!(got.len(), want.len(), "{what}: row count");
    for (i, (g, w)) in got.chunks(n_vocab).zip(want.chunks(n_vocab)).enumerate() {
        if let Some(j) = (0..n_vocab).find(|&j| g[j].to_bits() != w[j].to_bits()) {
            let d = g.iter().zip(w).fold(0f32, |m, (a, b)| m.max((a - b).abs()));
            panic!(
                "{what}: position {} differs (logit {j}: {} vs {} one at a time; max |Δ| {d:e})",
                pos0 + i,
                g[j],
                w[j]
            );
        }
    }
}

fn invariant(e: &mut Engine, entries: &[BatchEntry]) -> Vec<Vec<f32>> {
    e.decode_batch_with(entries, Numerics::BatchInvariant)
        .unwrap()
}

fn check_model(name: &str, model: &Path, tokens: &[u32]) {
    let _turn = LEVEL.lock().unwrap_or_else(|p| p.into_inner());
    let n = tokens.len();
    assert!(n >= K_MAX + 3, "{name}: fixture prompt too short");
    for level in available_levels() {
        let _cap = level_scope(Some(level));
        let what = |s: String| format!("{name} ({}): {s}", level.name());
        let mut e = engine(model);
        let v = e.n_vocab();
        let reference = one_at_a_time(&mut e, tokens);
        let at = |p: usize, len: usize| &reference[p * v..(p + len) * v];

        // One sequence, micro-batches of k tokens.
        for k in 2..=K_MAX {
            e.mem_clear();
            let mut got = Vec::new();
            for chunk in tokens.chunks(k) {
                let entry = BatchEntry {
                    seq: 0,
                    tokens: chunk,
                    logits: LogitRows::All,
                };
                got.extend(invariant(&mut e, &[entry]).remove(0));
            }
            assert_bitwise(&what(format!("chunks of {k}")), &got, &reference, v, 0);
        }

        // N sequences: prefixes of 1..=N tokens prefilled together (and a
        // 3-token prefix of sequence 0), then one token each beside a
        // 17-token verification chunk of sequence 0.
        for n_seq in 1..=N_SEQ {
            e.mem_clear();
            let pre: Vec<BatchEntry> = std::iter::once(0)
                .chain(1..=n_seq)
                .map(|s| BatchEntry {
                    seq: s,
                    tokens: &tokens[..if s == 0 { 3 } else { s }],
                    logits: LogitRows::All,
                })
                .collect();
            let got = invariant(&mut e, &pre);
            for (entry, g) in pre.iter().zip(&got) {
                let w = at(0, entry.tokens.len());
                let s = entry.seq;
                assert_bitwise(
                    &what(format!("{n_seq} seqs, prefill of seq {s}")),
                    g,
                    w,
                    v,
                    0,
                );
            }
            let step: Vec<BatchEntry> = std::iter::once(0)
                .chain(1..=n_seq)
                .map(|s| BatchEntry {
                    seq: s,
                    tokens: if s == 0 {
                        &tokens[3..3 + K_MAX]
                    } else {
                        &tokens[s..s + 1]
                    },
                    logits: LogitRows::All,
                })
                .collect();
            let got = invariant(&mut e, &step);
            for (entry, g) in step.iter().zip(&got) {
                let p0 = if entry.seq == 0 { 3 } else { entry.seq };
                let w = at(p0, entry.tokens.len());
                let s = entry.seq;
                assert_bitwise(&what(format!("{n_seq} seqs, step of seq {s}")), g, w, v, p0);
            }
        }

        // Prompts cut every way a server cuts them.
        prompt_splits(&mut e, tokens, &reference, Numerics::BatchInvariant, &what);
        // (with chunked recurrences the default's reference is the chunked
        // form: `chunked_prompts`)
        if e.prompts_invariant() && e.scan_chunk().is_none() {
            prompt_splits(&mut e, tokens, &reference, Numerics::CheapInvariant, &what);
        }
        if name.starts_with("llama_q") && level == coil_kernels::simd::SimdLevel::Avx2 {
            assert!(
                e.prompts_invariant(),
                "{name}: prompts not invariant at AVX2"
            );
        }
        if name.starts_with("lanes_") && level >= coil_kernels::simd::SimdLevel::Avx2 {
            assert!(
                e.prompts_invariant(),
                "{name}: prompts not invariant at {}",
                level.name()
            );
        }

        // A verification rejected part-way: roll back inside it (restore
        // the checkpoint before it, replay the accepted tokens with the
        // invariant kernels), then decode on: the one-at-a-time logits.
        for accepted in [1, 8, 12] {
            e.mem_clear();
            e.eval(0, &tokens[..3], LogitRows::None, 1).unwrap();
            let entry = BatchEntry {
                seq: 0,
                tokens: &tokens[3..3 + K_MAX],
                logits: LogitRows::All,
            };
            invariant(&mut e, &[entry]);
            let p = 3 + accepted;
            e.seq_truncate_with(0, p, Numerics::BatchInvariant).unwrap();
            let got = e.eval(0, &tokens[p..p + 1], LogitRows::All, 1).unwrap();
            let w = format!("rollback to {p} inside a verification");
            assert_bitwise(&what(w), &got, at(p, 1), v, p);
        }
    }
}

/// The logits of every position of `tokens` equal `reference` (one token
/// at a time) bit for bit with `numerics`, the prompt processed whole, in
/// uneven chunks, from a forked prefix (a prefix-cache resume) and beside
/// another sequence's prompt in one call.
fn prompt_splits(
    e: &mut Engine,
    tokens: &[u32],
    reference: &[f32],
    numerics: Numerics,
    what: &dyn Fn(String) -> String,
) {
    let v = e.n_vocab();
    let n = tokens.len();
    let run =
        |e: &mut Engine, entries: &[BatchEntry]| e.decode_batch_with(entries, numerics).unwrap();
    let entry = |seq, tokens| BatchEntry {
        seq,
        tokens,
        logits: LogitRows::All,
    };
    // whole
    e.mem_clear();
    let got = run(e, &[entry(0, tokens)]).remove(0);
    assert_bitwise(
        &what(format!("{numerics:?} whole prompt")),
        &got,
        reference,
        v,
        0,
    );
    // uneven chunks
    e.mem_clear();
    let mut got = Vec::new();
    let mut at = 0;
    for k in [5, 1, 13, 2, 7].into_iter().cycle() {
        let end = (at + k).min(n);
        got.extend(run(e, &[entry(0, &tokens[at..end])]).remove(0));
        at = end;
        if at == n {
            break;
        }
    }
    assert_bitwise(
        &what(format!("{numerics:?} uneven chunks")),
        &got,
        reference,
        v,
        0,
    );
    // resumed from a forked prefix of each length of a few
    for p in [1, 9, n / 2, n - 1] {
        e.mem_clear();
        let pre = run(e, &[entry(1, &tokens[..p])]).remove(0);
        e.seq_fork(1, 2).unwrap();
        let rest = run(e, &[entry(2, &tokens[p..])]).remove(0);
        let w = what(format!("{numerics:?} resumed at {p}"));
        assert_bitwise(&w, &pre, &reference[..p * v], v, 0);
        assert_bitwise(&w, &rest, &reference[p * v..], v, p);
    }
    // beside another prompt (the same tokens reversed) and a prefix of it
    e.mem_clear();
    let other: Vec<u32> = tokens.iter().rev().copied().collect();
    let got = run(
        e,
        &[
            entry(3, &other),
            entry(0, tokens),
            entry(4, &tokens[..n / 3]),
        ],
    );
    let w = what(format!("{numerics:?} beside other prompts"));
    assert_bitwise(&w, &got[1], reference, v, 0);
    assert_bitwise(&w, &got[2], &reference[..n / 3 * v], v, 0);
}

fn llama_cpp(arch: &str) {
    let f = common::llama_cpp_fixture(arch);
    check_model(arch, &f.model, &f.tokens);
}

fn tool(name: &str) {
    let f = common::tool_fixture(name);
    check_model(name, &f.model, &f.tokens);
}

#[test]
fn mamba() {
    llama_cpp("mamba");
    tool("mamba_dstate8");
}

#[test]
fn mamba2() {
    llama_cpp("mamba2");
    tool("mamba2_g1_hd16");
    tool("mamba2_g4_hd24");
}

#[test]
fn jamba() {
    llama_cpp("jamba");
    tool("jamba_small");
}

#[test]
fn granite_hybrid() {
    llama_cpp("bamba");
    llama_cpp("granitemoehybrid");
    tool("bamba_partial_rope");
    tool("granitemoehybrid_rope");
}

#[test]
fn falcon_h1() {
    llama_cpp("falcon_h1");
}

#[test]
fn nemotron_h() {
    llama_cpp("nemotron_h");
    llama_cpp("nemotron_h_moe");
    tool("nemotron_h_mixed");
    tool("nemotron_h_no_attn");
}

#[test]
fn llama() {
    llama_cpp("llama");
    // quantized to Q8_0: `coil serve`'s default numerics are batch-invariant
    // for it at the AVX2 level
    let f = common::llama_cpp_fixture("llama");
    let model = repo().join("tests/fixtures/models/llama/model.q8_0.gguf");
    check_model("llama_q8_0", &model, &f.tokens);
}

/// The trained Llama of the fidelity tests in Q8_0, Q4_K_M and Q5_K_M
/// (`coil quantize` of the Q8_0 file): every matrix is whole groups of 16 rows of
/// multiples of 256 values, so at the AVX-512 level the loader rewrites
/// them all into rows in lanes, whose integer GEMM keeps tokens — the
/// default numerics are batch-invariant for them there (required), as at
/// the AVX2 level.
#[test]
fn lanes_llama_q8_0_q4_k_m_and_q5_k_m() {
    let dir = repo().join("tests/fixtures/fidelity");
    let tokens: Vec<u32> = (0..40).map(|i| ((i * 53 + 7) % 2048) as u32).collect();
    check_model(
        "lanes_q8_0",
        &dir.join("shakespeare-llama-q8_0.gguf"),
        &tokens,
    );
    check_model(
        "lanes_q4_k_m",
        &dir.join("shakespeare-llama-q4_k_m.gguf"),
        &tokens,
    );
    check_model(
        "lanes_q5_k_m",
        &dir.join("shakespeare-llama-q5_k_m.gguf"),
        &tokens,
    );
}

/// The llama fixture in Q4_0 and in the Q5_K_M mixture (its 32-wide rows
/// fall back to Q5_1, a format with a min): the 32-value formats' GEMM
/// keeps tokens at the AVX2 level too, so the default numerics are
/// batch-invariant for them there.
#[test]
fn llama_q4_0_and_q5_k_m() {
    let f = common::llama_cpp_fixture("llama");
    let dir = repo().join("tests/fixtures/models/llama");
    check_model("llama_q4_0", &dir.join("model.q4_0.gguf"), &f.tokens);
    check_model("llama_q5_k_m", &dir.join("model.q5_k_m.gguf"), &f.tokens);
}

#[test]
fn lfm2() {
    tool("lfm2_small");
    tool("lfm2moe_small");
    tool("lfm3_tiny");
    tool("lfm3_plain");
}

#[test]
fn zamba2() {
    tool("zamba2_tiny");
    tool("zamba2_plain");
}

#[test]
fn gated_delta_net() {
    tool("qwen35_tiny");
    tool("qwen35moe_tiny");
    tool("qwen3next_tiny");
    tool("qwen4exp_tiny");
}

#[test]
fn kimi_delta_attention_and_mla() {
    tool("kimi_linear_tiny");
    tool("kimi_linear_qlora");
    tool("bailing_hybrid_tiny");
}

/// The bundled demo model: Q8_0 weights (the integer dot kernels, one and
/// four tokens at a time), Mamba-2 and attention.
#[test]
fn bundled_q8_0_model() {
    let model = repo().join("models/shakespeare-hybrid-q8_0.gguf");
    // Any text: ids below the 2048-token vocabulary.
    let tokens: Vec<u32> = (0..40u32).map(|i| (i * 37 + 11) % 2048).collect();
    check_model("shakespeare-hybrid-q8_0", &model, &tokens);
}

/// The prompt `tokens` through `CheapInvariant` calls of sequence `seq`
/// (from its current state), then `gen` single tokens through
/// `BatchInvariant` calls as `coil serve` decodes: the prompt rows and the
/// generated tokens' rows.
fn prompt_then_decode(
    e: &mut Engine,
    seq: usize,
    calls: &[&[u32]],
    gen: &[u32],
) -> (Vec<f32>, Vec<f32>) {
    let mut prompt = Vec::new();
    for toks in calls {
        let entry = BatchEntry {
            seq,
            tokens: toks,
            logits: LogitRows::All,
        };
        prompt.extend(
            e.decode_batch_with(&[entry], Numerics::CheapInvariant)
                .unwrap()
                .remove(0),
        );
    }
    let mut out = Vec::new();
    for t in gen {
        let entry = BatchEntry {
            seq,
            tokens: std::slice::from_ref(t),
            logits: LogitRows::All,
        };
        out.extend(invariant(e, &[entry]).remove(0));
    }
    (prompt, out)
}

/// `coil serve`'s default numerics on a model with chunked recurrences
/// (see the module documentation): `n` tokens of prompt, 4 generated.
fn chunked_prompts(name: &str, model: &Path, n: usize) {
    let _turn = LEVEL.lock().unwrap_or_else(|p| p.into_inner());
    for level in available_levels() {
        let _cap = level_scope(Some(level));
        let what = |s: String| format!("{name} ({}): {s}", level.name());
        let mut e = engine(model);
        if level == coil_kernels::simd::SimdLevel::Avx2 {
            assert!(
                e.prompts_invariant(),
                "{name}: prompts not invariant at AVX2"
            );
        }
        if !e.prompts_invariant() {
            continue;
        }
        let c = e.scan_chunk().expect("a model with chunked recurrences");
        assert!(n > 2 * c + 8, "{name}: prompt shorter than two chunks");
        let v = e.n_vocab();
        let tokens: Vec<u32> = (0..n + 4).map(|i| ((i * 37 + 11) % v) as u32).collect();
        let (prompt, gen) = (&tokens[..n], &tokens[n..]);
        e.mem_clear();
        let (reference, ref_gen) = prompt_then_decode(&mut e, 0, &[prompt], gen);
        let check = |w: String, got: &(Vec<f32>, Vec<f32>), from: usize| {
            let w = what(w);
            assert_bitwise(&w, &got.0, &reference[from * v..], v, from);
            assert_bitwise(&format!("{w}, generated"), &got.1, &ref_gen, v, n);
        };
        // micro-batches of every size
        let saved = e.opts.n_ubatch;
        for ub in [1, 3, 7, c - 1, c + 5, 2 * c + 1] {
            e.opts.n_ubatch = ub;
            e.mem_clear();
            let got = prompt_then_decode(&mut e, 0, &[prompt], gen);
            check(format!("micro-batches of {ub}"), &got, 0);
        }
        e.opts.n_ubatch = saved;
        // calls cut at chunk boundaries
        e.mem_clear();
        let calls = [&prompt[..c], &prompt[c..2 * c], &prompt[2 * c..]];
        check(
            "calls cut at chunk boundaries".into(),
            &prompt_then_decode(&mut e, 0, &calls, gen),
            0,
        );
        // beside other prompts (the same tokens reversed, a prefix of them),
        // in one micro-batch and in uneven ones
        for ub in [saved, 11] {
            e.opts.n_ubatch = ub;
            e.mem_clear();
            let other: Vec<u32> = prompt.iter().rev().copied().collect();
            let entries = [
                BatchEntry {
                    seq: 3,
                    tokens: &other,
                    logits: LogitRows::All,
                },
                BatchEntry {
                    seq: 0,
                    tokens: prompt,
                    logits: LogitRows::All,
                },
                BatchEntry {
                    seq: 4,
                    tokens: &prompt[..n / 3],
                    logits: LogitRows::All,
                },
            ];
            let mut got = e
                .decode_batch_with(&entries, Numerics::CheapInvariant)
                .unwrap();
            let (_, g) = prompt_then_decode(&mut e, 0, &[], gen);
            check(
                format!("beside other prompts, micro-batches of {ub}"),
                &(got.remove(1), g),
                0,
            );
        }
        e.opts.n_ubatch = saved;
        // resumed from a fork at a prefix (a prefix-cache hit): rolled back
        // to the last chunk boundary at or before it, the rest one call
        for p in [1, c + 3, 2 * c + 5, n - 1] {
            e.mem_clear();
            prompt_then_decode(&mut e, 1, &[&prompt[..p]], &[]);
            e.seq_fork(1, 2).unwrap();
            let at = e.resume_point(2, p, n);
            assert_eq!(at, p / c * c, "{}", what(format!("resume point of {p}")));
            e.seq_truncate(2, at).unwrap();
            let got = prompt_then_decode(&mut e, 2, &[&prompt[at..]], gen);
            check(format!("resumed at {p} from {at}"), &got, at);
        }
        // continued after decoding (the next turn of a conversation): the
        // prompt of the first turn, tokens decoded one at a time, then the
        // whole conversation as the prompt
        for p in [c + 3, 2 * c] {
            e.mem_clear();
            prompt_then_decode(&mut e, 5, &[&prompt[..p]], &prompt[p..p + 6]);
            let at = e.resume_point(5, p + 6, n);
            assert_eq!(at, p / c * c, "{}", what(format!("resume point after {p}")));
            e.seq_truncate(5, at).unwrap();
            let got = prompt_then_decode(&mut e, 5, &[&prompt[at..]], gen);
            check(
                format!("continued after decoding from {p}, resumed at {at}"),
                &got,
                at,
            );
        }
    }
}

/// The bundled demo model (Q8_0, Mamba-2 and attention) by default.
#[test]
fn bundled_q8_0_model_chunked_by_default() {
    let model = repo().join("models/shakespeare-hybrid-q8_0.gguf");
    chunked_prompts("shakespeare-hybrid-q8_0", &model, 150);
}

/// The Mamba-2 fixture in Q8_0 by default.
#[test]
fn mamba2_q8_0_chunked_by_default() {
    let model = repo().join("tests/fixtures/models/mamba2/model.q8_0.gguf");
    chunked_prompts("mamba2_q8_0", &model, 150);
}
