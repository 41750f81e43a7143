//! Speculative decoding is exact: for every architecture, greedy decoding
//! with drafts (accepted whole, in part, or not at all; short and long,
//! one sequence or several in one batch) yields, bit for bit, the logits
//! and the recurrent state of plain one-token-at-a-time decoding, hence the
//! same tokens. Bitwise, not within a tolerance: a verification whose
//! numerics depend on how many tokens share its micro-batch fails here.

use coil::engine::draft::Drafter;
use coil::engine::generate::{generate, generate_with, GenerateOptions};
use coil::engine::sampling::{argmax, Sampler, SamplingParams};
use coil::engine::speculative::Speculator;
use coil::engine::{BatchEntry, Engine, EngineOptions};
use coil::memory::{CheckpointPolicy, SequenceMemory};
use coil::models::LogitRows;
use std::path::PathBuf;

mod common;

use common::{llama_cpp_fixture, tool_fixture, ARCHS};

const TOOL_FIXTURES: [&str; 11] = [
    "qwen35_tiny",
    "qwen35moe_tiny",
    "qwen3next_tiny",
    "lfm2_small",
    "lfm2moe_small",
    "lfm3_tiny",
    "qwen4exp_tiny",
    "kimi_linear_tiny",
    "kimi_linear_qlora",
    "bailing_hybrid_tiny",
    "zamba2_tiny",
];

fn all_archs() -> impl Iterator<Item = &'static str> {
    ARCHS.into_iter().chain(TOOL_FIXTURES)
}

fn fixture(arch: &str) -> (PathBuf, Vec<u32>) {
    if TOOL_FIXTURES.contains(&arch) {
        let f = tool_fixture(arch);
        return (f.model, f.tokens);
    }
    let f = llama_cpp_fixture(arch);
    (f.model, f.tokens)
}

fn engine(path: &PathBuf, n_seq: usize, policy: CheckpointPolicy) -> Engine {
    Engine::load(
        path,
        EngineOptions {
            n_seq_max: n_seq,
            n_threads: 2,
            checkpoints: policy,
            ..Default::default()
        },
    )
    .unwrap()
}

/// Panics unless `got` and `want` are equal bit for bit (naming the first
/// difference, not printing the rows).
fn assert_bitwise(what: &str, got: &[f32], want: &[f32]) {
    assert_eq!(got.len(), want.len(), "{what}: lengths");
    if let Some(i) = (0..got.len()).find(|&i| got[i].to_bits() != want[i].to_bits()) {
        let max = got
            .iter()
            .zip(want)
            .fold(0f32, |m, (a, b)| m.max((a - b).abs()));
        panic!(
            "{what}: differs first at {i} ({} vs {}), max |Δ| {max:e}",
            got[i], want[i]
        );
    }
}

/// Plain greedy decoding of `n` tokens after `prompt` by an engine of
/// `n_seq` sequences (the one under test's: an engine of one sequence runs
/// its pool single-stream, whose F16 / BF16 products at the AVX-512 level
/// differ in their bits from a batched engine's, see
/// `EngineOptions::batched_layout`), the sequence alone: the tokens, the
/// logits row before each, and the recurrent state after feeding all but
/// the last.
struct Plain {
    tokens: Vec<u32>,
    rows: Vec<Vec<f32>>,
    state: Option<Vec<f32>>,
}

fn plain(
    path: &PathBuf,
    n_seq: usize,
    prompt: &[u32],
    n: usize,
    policy: CheckpointPolicy,
) -> Plain {
    let mut e = engine(path, n_seq, policy);
    let mut logits = e.eval(0, prompt, LogitRows::Last, 0).unwrap();
    let (mut tokens, mut rows) = (Vec::new(), Vec::new());
    for i in 0..n {
        let t = argmax(&logits) as u32;
        tokens.push(t);
        rows.push(logits.clone());
        if i + 1 < n {
            logits = e.eval(0, &[t], LogitRows::Last, 1).unwrap();
        }
    }
    let state = e
        .mem
        .recurrent
        .as_ref()
        .map(|r| r.flat_state(0).unwrap().into_owned());
    Plain {
        tokens,
        rows,
        state,
    }
}

/// Drafts for step `i`: the plain continuation, `len` tokens (never its
/// last token: the sequences stop where plain decoding's does), with the
/// token at `wrong` (if any) replaced.
fn draft(p: &Plain, i: usize, len: usize, wrong: Option<usize>, n_vocab: usize) -> Vec<u32> {
    let end = (i + 1 + len).min(p.tokens.len() - 1).max(i + 1);
    let mut d: Vec<u32> = p.tokens[i + 1..end].to_vec();
    if let Some(w) = wrong.filter(|&w| w < d.len()) {
        d[w] = (d[w] + 1) % n_vocab as u32;
    }
    d
}

/// One sequence: drafts of 1..=9 tokens, wrong at various places (so that
/// both the single-step path and what would be the chunked one at ≥ 8
/// tokens run, and every kind of commit: whole, partial, none).
#[test]
fn greedy_speculation_is_bitwise_plain_decoding() {
    let schedule: [(usize, Option<usize>); 8] = [
        (3, None),
        (9, Some(4)),
        (1, Some(0)),
        (7, None),
        (5, Some(2)),
        (9, None),
        (2, Some(1)),
        (4, Some(0)),
    ];
    for arch in all_archs() {
        let (path, tokens) = fixture(arch);
        let prompt = &tokens[..12];
        let n = 48;
        for policy in [
            CheckpointPolicy::default(),
            CheckpointPolicy {
                interval: 8,
                every_call: true,
                ..Default::default()
            },
        ] {
            // Checkpoint positions cut the prompt's micro-batches: the
            // reference runs under the same policy.
            let p = plain(&path, 1, prompt, n, policy);
            let mut e = engine(&path, 1, policy);
            let n_vocab = e.n_vocab();
            let mut logits = e.eval(0, prompt, LogitRows::Last, 0).unwrap();
            // `i`: index of the next token to sample.
            let mut i = 0;
            let mut step = 0;
            let mut replayed = 0;
            while i < n {
                assert_bitwise(
                    &format!("{arch}: logits before token {i}"),
                    &logits,
                    &p.rows[i],
                );
                let t = argmax(&logits) as u32;
                assert_eq!(t, p.tokens[i], "{arch}: token {i}");
                if i + 1 == n {
                    break;
                }
                let (len, wrong) = schedule[step % schedule.len()];
                step += 1;
                let room = e.spec_room(0).unwrap();
                let d = draft(&p, i, len.min(room), wrong, n_vocab);
                if d.is_empty() {
                    logits = e.eval(0, &[t], LogitRows::Last, 1).unwrap();
                    i += 1;
                    continue;
                }
                let mut fed = vec![t];
                fed.extend(&d);
                let rows = e.spec_verify(0, &fed).unwrap();
                let mut keep = fed.len();
                for j in 0..fed.len() {
                    let row = &rows[j * n_vocab..(j + 1) * n_vocab];
                    let got = argmax(row) as u32;
                    let at = i + 1 + j;
                    if at < n {
                        assert_bitwise(
                            &format!("{arch}: verified logits before token {at} (draft {len}, {policy:?})"),
                            row,
                            &p.rows[at],
                        );
                    }
                    if j < d.len() && got == d[j] {
                        continue;
                    }
                    keep = j + 1;
                    logits = row.to_vec();
                    break;
                }
                if keep == fed.len() {
                    logits = rows[(fed.len() - 1) * n_vocab..].to_vec();
                }
                let c = e.spec_commit(0, keep).unwrap();
                replayed += c.replayed;
                i += keep;
                assert_eq!(e.mem.seq_len(0).unwrap(), prompt.len() + i);
                assert_eq!(
                    &e.mem.seq_tokens(0).unwrap()[prompt.len()..],
                    &p.tokens[..i]
                );
            }
            if let (Some(r), Some(want)) = (&e.mem.recurrent, &p.state) {
                let got = r.flat_state(0).unwrap();
                assert_bitwise(
                    &format!("{arch}: recurrent state after speculation"),
                    &got,
                    want,
                );
            }
            eprintln!("{arch}: {step} steps, {replayed} tokens replayed");
        }
    }
}

/// Several sequences verified in one batch beside one decoding plainly.
#[test]
fn several_sequences_at_once() {
    for arch in all_archs() {
        let (path, tokens) = fixture(arch);
        let prompts = [&tokens[..10], &tokens[3..15], &tokens[7..12]];
        let n = 20;
        let plains: Vec<Plain> = prompts
            .iter()
            .map(|pr| plain(&path, 3, pr, n, CheckpointPolicy::default()))
            .collect();
        let mut e = engine(&path, 3, CheckpointPolicy::default());
        let n_vocab = e.n_vocab();
        let mut logits: Vec<Vec<f32>> = (0..3)
            .map(|s| e.eval(s, prompts[s], LogitRows::Last, 0).unwrap())
            .collect();
        let mut at = [0usize; 3];
        let wrongs = [None, Some(1), Some(0)];
        let mut round = 0;
        while at.iter().all(|&i| i + 10 < n) {
            round += 1;
            let mut fed: Vec<Vec<u32>> = Vec::new();
            let mut drafts = Vec::new();
            for s in 0..3 {
                let i = at[s];
                assert_bitwise(
                    &format!("{arch} seq {s} at {i}"),
                    &logits[s],
                    &plains[s].rows[i],
                );
                let t = argmax(&logits[s]) as u32;
                // Sequence 2 decodes plainly every other round.
                let len = if s == 2 && round % 2 == 0 {
                    0
                } else {
                    2 + s + round % 3
                };
                let d = draft(&plains[s], i, len, wrongs[(s + round) % 3], n_vocab);
                if !d.is_empty() {
                    e.spec_begin(s).unwrap();
                }
                let mut f = vec![t];
                f.extend(&d);
                fed.push(f);
                drafts.push(d);
            }
            let entries: Vec<BatchEntry> = (0..3)
                .map(|s| BatchEntry {
                    seq: s,
                    tokens: &fed[s],
                    logits: LogitRows::All,
                })
                .collect();
            let rows = e.decode_batch(&entries).unwrap();
            for s in 0..3 {
                let d = &drafts[s];
                let mut keep = fed[s].len();
                for j in 0..fed[s].len() {
                    let row = &rows[s][j * n_vocab..(j + 1) * n_vocab];
                    if j < d.len() && argmax(row) as u32 == d[j] {
                        continue;
                    }
                    keep = j + 1;
                    logits[s] = row.to_vec();
                    break;
                }
                if !d.is_empty() {
                    e.spec_commit(s, keep).unwrap();
                }
                at[s] += keep;
            }
        }
        for s in 0..3 {
            let i = at[s];
            assert_bitwise(
                &format!("{arch} seq {s} at {i}"),
                &logits[s],
                &plains[s].rows[i],
            );
        }
    }
}

/// An oracle drafter (the plain continuation, wrong every fifth token) for
/// the generation loop.
struct Oracle {
    prompt_len: usize,
    want: Vec<u32>,
}

impl Drafter for Oracle {
    fn propose(&mut self, history: &[u32], max: usize) -> Vec<u32> {
        let i = history.len() - self.prompt_len;
        let mut d: Vec<u32> = self.want.iter().skip(i).take(max).copied().collect();
        if i % 5 == 3 && d.len() > 1 {
            d[1] ^= 1;
        }
        d
    }
}

#[test]
fn generation_loop_gives_the_same_tokens_greedy_and_sampled() {
    for arch in ["mamba2", "granitemoehybrid", "jamba", "qwen35_tiny"] {
        let (path, tokens) = fixture(arch);
        let prompt = &tokens[..9];
        let tok = coil::tokenizer::Tokenizer::from_gguf(&engine(&path, 1, Default::default()).file)
            .unwrap();
        let opts = GenerateOptions {
            max_tokens: 40,
            stop: Vec::new(),
            stop_at_eos: false,
        };
        for params in [
            SamplingParams::greedy(),
            SamplingParams {
                temperature: 1.0,
                top_k: 0,
                top_p: 1.0,
                min_p: 0.0,
                seed: 7,
                ..Default::default()
            },
        ] {
            let mut e = engine(&path, 1, Default::default());
            let want = generate(
                &mut e,
                &tok,
                0,
                prompt,
                &mut Sampler::new(params.clone()),
                &opts,
                |_| true,
            )
            .unwrap()
            .tokens;
            let mut e = engine(&path, 1, Default::default());
            let mut sp = Speculator::new(
                Box::new(Oracle {
                    prompt_len: prompt.len(),
                    want: want.clone(),
                }),
                6,
            );
            let got = generate_with(
                &mut e,
                &tok,
                0,
                prompt,
                &mut Sampler::new(params.clone()),
                &opts,
                Some(&mut sp),
                |_| true,
            )
            .unwrap();
            assert_eq!(got.tokens, want, "{arch} {params:?}");
            let c = got.spec.unwrap();
            assert!(
                c.verifications > 0 && c.accepted > 0 && c.accepted < c.drafted,
                "{arch}: {c:?}"
            );
        }
    }
}

#[test]
fn bad_commits_are_errors() {
    let (path, tokens) = fixture("mamba2");
    let mut e = engine(&path, 2, Default::default());
    e.eval(0, &tokens[..5], LogitRows::None, 0).unwrap();
    assert!(e.spec_commit(0, 0).is_err(), "no verification running");
    e.spec_verify(0, &tokens[5..8]).unwrap();
    assert!(e.spec_begin(0).is_err(), "already verifying");
    assert!(e.spec_commit(0, 4).is_err(), "keeps more than verified");
    e.spec_commit(0, 1).unwrap();
    assert_eq!(e.mem.seq_len(0).unwrap(), 6);
    // A failing verification leaves the sequence as it was.
    assert!(e.spec_verify(0, &[u32::MAX]).is_err());
    assert_eq!(e.mem.seq_len(0).unwrap(), 6);
    assert!(e.mem.spec_base(0).is_none());
    assert!(e.spec_verify(0, &[]).is_err());
}
