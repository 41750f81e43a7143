//! Speculative decoding with the model's own NextN / MTP block
//! (tests/fixtures/nextn/: the tiny models of the other fixtures with an
//! MTP block, converted by llama.cpp's converter). The output is the same
//! with and without the block's drafts; the block's memory — its attention
//! cells and the hidden state it reads next — after verifications (whole,
//! partial or no acceptance), rollbacks, forks and sessions is the memory
//! plain decoding leaves; and what it drafts does not depend on how its
//! context was fed.

mod common;

use coil::engine::draft::Drafter;
use coil::engine::generate::{generate_with, GenerateOptions};
use coil::engine::sampling::{argmax, Sampler, SamplingParams};
use coil::engine::speculative::{DraftSource, Speculator};
use coil::engine::{Engine, EngineOptions};
use coil::memory::CheckpointPolicy;
use coil::models::LogitRows;
use coil::tokenizer::Tokenizer;
use common::{llama_cpp_fixture, tool_fixture};
use std::path::PathBuf;

#[path = "../../../tests/support/temp_path.rs"]
mod temp_path;

const CASES: [&str; 4] = ["nemotron_h_moe", "qwen35", "qwen35moe", "qwen3next"];

fn tail_file(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join(format!("../../tests/fixtures/nextn/{name}/model.gguf"))
}

/// The prompt of each case: the tokens of its trunk-only fixture.
fn prompt(name: &str) -> Vec<u32> {
    match name {
        "nemotron_h_moe" => llama_cpp_fixture("nemotron_h_moe").tokens,
        n => tool_fixture(&format!("{n}_tiny")).tokens,
    }
}

fn engine(name: &str, nextn: bool, policy: CheckpointPolicy) -> Engine {
    Engine::load(
        tail_file(name),
        EngineOptions {
            n_seq_max: 2,
            n_threads: 2,
            checkpoints: policy,
            nextn,
            ..Default::default()
        },
    )
    .unwrap()
}

/// The block's memory of `seq`: its hidden state (with the rows of the
/// cells still waiting, none once caught up), then its cells (keys and
/// values, committed positions), the waiting cells written first.
fn block_memory(e: &mut Engine, seq: usize) -> Vec<f32> {
    e.nextn_catch_up(&[seq]).unwrap();
    let rec = e.mem.recurrent.as_ref().unwrap();
    let at = rec.n_layer() - 1;
    let mut out = rec.conv_of(at, seq).unwrap().to_vec();
    let kv = e.mem.kv.as_ref().unwrap();
    let cells = kv.seq_cells(seq).unwrap();
    let last = &cells[kv.n_layer() - 1];
    out.extend(last.k.concat());
    out.extend(last.v.concat());
    out
}

fn assert_bitwise(what: &str, got: &[f32], want: &[f32]) {
    assert_eq!(got.len(), want.len(), "{what}: lengths");
    if let Some(i) = (0..got.len()).find(|&i| got[i].to_bits() != want[i].to_bits()) {
        panic!("{what}: differs first at {i} ({} vs {})", got[i], want[i]);
    }
}

fn assert_close(what: &str, got: &[f32], want: &[f32], tol: f32) {
    assert_eq!(got.len(), want.len(), "{what}: lengths");
    let scale = want.iter().fold(1f32, |m, x| m.max(x.abs()));
    let max = got
        .iter()
        .zip(want)
        .fold(0f32, |m, (a, b)| m.max((a - b).abs()));
    assert!(max <= tol * scale, "{what}: max |Δ| {max} (scale {scale})");
}

fn tokenizer(name: &str) -> Tokenizer {
    let f = coil_gguf::GgufFile::open(tail_file(name)).unwrap();
    Tokenizer::from_gguf(&f).unwrap()
}

fn greedy(n: usize) -> GenerateOptions {
    GenerateOptions {
        max_tokens: n,
        stop: Vec::new(),
        stop_at_eos: false,
    }
}

#[test]
fn greedy_output_is_the_same_with_the_blocks_drafts() {
    for name in CASES {
        let tok = tokenizer(name);
        let p = prompt(name);
        let mut e = engine(name, false, CheckpointPolicy::default());
        let mut s = Sampler::new(SamplingParams::greedy());
        let plain = generate_with(&mut e, &tok, 0, &p, &mut s, &greedy(40), None, |_| true)
            .unwrap()
            .tokens;
        let mut e = engine(name, true, CheckpointPolicy::default());
        for k in [1, 3, 6] {
            e.mem_clear();
            let mut sp = Speculator::with_source(DraftSource::Nextn, k);
            sp.len = coil::engine::draft::AdaptiveLen::fixed(k);
            let mut s = Sampler::new(SamplingParams::greedy());
            let st = generate_with(
                &mut e,
                &tok,
                0,
                &p,
                &mut s,
                &greedy(40),
                Some(&mut sp),
                |_| true,
            )
            .unwrap();
            assert_eq!(st.tokens, plain, "{name}: k = {k}");
            let c = st.spec.unwrap();
            assert!(c.verifications > 0 && c.drafted > 0, "{name}: {c:?}");
            eprintln!("{name}: k = {k}: {c:?}");
        }
    }
}

/// Sampling (temperature, no truncation) with the same seed gives the same
/// tokens with and without the block's drafts: each emitted token is drawn
/// from its position's logits in order, a draft kept when the draw equals
/// it (the speculative sampling rule for a point-mass draft), so the draws
/// are plain decoding's one for one and the output distribution is the
/// model's.
#[test]
fn sampling_draws_the_same_tokens_with_the_blocks_drafts() {
    let params = SamplingParams {
        temperature: 0.9,
        top_k: 0,
        top_p: 1.0,
        min_p: 0.0,
        seed: 11,
        ..Default::default()
    };
    for name in CASES {
        let tok = tokenizer(name);
        let p = prompt(name);
        let mut e = engine(name, false, CheckpointPolicy::default());
        let mut s = Sampler::new(params.clone());
        let plain = generate_with(&mut e, &tok, 0, &p, &mut s, &greedy(40), None, |_| true)
            .unwrap()
            .tokens;
        let mut e = engine(name, true, CheckpointPolicy::default());
        let mut sp = Speculator::with_source(DraftSource::Nextn, 3);
        let mut s = Sampler::new(params.clone());
        let st = generate_with(
            &mut e,
            &tok,
            0,
            &p,
            &mut s,
            &greedy(40),
            Some(&mut sp),
            |_| true,
        )
        .unwrap();
        assert_eq!(st.tokens, plain, "{name}");
    }
}

/// The model's own greedy continuation with the token at `wrong` of each
/// draft replaced (`None`: drafts accepted whole).
struct Oracle {
    prompt_len: usize,
    want: Vec<u32>,
    wrong: Option<usize>,
    n_vocab: u32,
}

impl Drafter for Oracle {
    fn propose(&mut self, history: &[u32], max: usize) -> Vec<u32> {
        let at = history.len().saturating_sub(self.prompt_len);
        let mut d: Vec<u32> = self.want.iter().skip(at).take(max).copied().collect();
        if let Some(w) = self.wrong.filter(|&w| w < d.len()) {
            d[w] = (d[w] + 1) % self.n_vocab;
        }
        d
    }
}

#[test]
fn the_blocks_memory_after_verifications_is_that_of_plain_decoding() {
    for name in CASES {
        let tok = tokenizer(name);
        let p = prompt(name);
        // More tokens than the block's cells may wait for
        // (`NEXTN_LAG`): plain decoding writes them in a pass that
        // overflows, and the rest when caught up.
        let n = 40;
        // Plain decoding with the block's memory: a token per pass.
        let mut a = engine(name, true, CheckpointPolicy::default());
        let mut logits = a.eval(0, &p, LogitRows::Last, 0).unwrap();
        let mut want = Vec::new();
        for _ in 0..n {
            let t = argmax(&logits) as u32;
            want.push(t);
            logits = a.eval(0, &[t], LogitRows::Last, 1).unwrap();
        }
        // `want` fed whole; the last one's pass made the state after it.
        // Its last tokens' cells still wait (the count ends the state).
        let rec = a.mem.recurrent.as_ref().unwrap();
        let waiting = *rec.conv_of(rec.n_layer() - 1, 0).unwrap().last().unwrap();
        assert!(waiting > 0.0, "{name}: no cell waits");
        let plain_mem = block_memory(&mut a, 0);
        let plain_drafts = a.draft_nextn(&[(0, 1, 4)]).unwrap();
        for wrong in [None, Some(0), Some(1), Some(2)] {
            let mut b = engine(name, true, CheckpointPolicy::default());
            let oracle = Oracle {
                prompt_len: p.len(),
                want: want.clone(),
                wrong,
                n_vocab: b.n_vocab() as u32,
            };
            let mut sp = Speculator::new(Box::new(oracle), 4);
            sp.len = coil::engine::draft::AdaptiveLen::fixed(4);
            let mut s = Sampler::new(SamplingParams::greedy());
            // n + 1 tokens: the last is generated, not fed; feed it too.
            let st = generate_with(
                &mut b,
                &tok,
                0,
                &p,
                &mut s,
                &greedy(n),
                Some(&mut sp),
                |_| true,
            )
            .unwrap();
            assert_eq!(st.tokens, want, "{name}: {wrong:?}");
            b.eval(0, &want[n - 1..], LogitRows::Last, 1).unwrap();
            let what = format!("{name}: drafts wrong at {wrong:?}");
            assert_bitwise(&what, &block_memory(&mut b, 0), &plain_mem);
            assert_eq!(b.draft_nextn(&[(0, 1, 4)]).unwrap(), plain_drafts, "{what}");
        }
    }
}

#[test]
fn drafts_do_not_depend_on_how_the_context_was_fed() {
    for name in CASES {
        let p = prompt(name);
        let mut e = engine(name, true, CheckpointPolicy::default());
        let mut want: Option<(Vec<f32>, Vec<Vec<u32>>)> = None;
        for ub in [p.len(), 1, 7] {
            e.mem_clear();
            e.eval(0, &p, LogitRows::Last, ub).unwrap();
            let mem = block_memory(&mut e, 0);
            let d = e.draft_nextn(&[(0, 3, 5)]).unwrap();
            // Drafting changes nothing: again, the same.
            assert_eq!(e.draft_nextn(&[(0, 3, 5)]).unwrap(), d, "{name}");
            assert_bitwise(
                &format!("{name}: after drafting"),
                &block_memory(&mut e, 0),
                &mem,
            );
            match &want {
                None => want = Some((mem, d)),
                Some((m, w)) => {
                    assert_close(&format!("{name}: ubatch {ub}"), &mem, m, 1e-4);
                    assert_eq!(&d, w, "{name}: ubatch {ub}");
                }
            }
        }
        // Two sequences drafting side by side: each as alone.
        e.mem_clear();
        e.eval(0, &p, LogitRows::Last, 0).unwrap();
        e.eval(1, &p[..p.len() - 5], LogitRows::Last, 0).unwrap();
        let alone0 = e.draft_nextn(&[(0, 3, 5)]).unwrap();
        let alone1 = e.draft_nextn(&[(1, 9, 2)]).unwrap();
        let both = e.draft_nextn(&[(1, 9, 2), (0, 3, 5)]).unwrap();
        assert_eq!(both, [alone1[0].clone(), alone0[0].clone()], "{name}");
        assert_eq!(both[0].len(), 2);
    }
}

#[test]
fn rollback_forks_and_sessions_carry_the_blocks_memory() {
    let policy = CheckpointPolicy {
        interval: 8,
        ..Default::default()
    };
    for name in CASES {
        let p = prompt(name);
        let cut = p.len() - 9;
        // The reference: only the first `cut` tokens, fed as the rollback
        // replays them (from the checkpoint at a multiple of 8).
        let mut r = engine(name, true, policy);
        r.eval(0, &p[..cut], LogitRows::Last, 0).unwrap();
        let want = block_memory(&mut r, 0);
        let want_d = r.draft_nextn(&[(0, 5, 4)]).unwrap();

        let mut e = engine(name, true, policy);
        e.eval(0, &p, LogitRows::Last, 0).unwrap();
        e.seq_fork(0, 1).unwrap();
        let whole = block_memory(&mut e, 0);
        e.seq_truncate(0, cut).unwrap();
        assert_close(
            &format!("{name}: rollback"),
            &block_memory(&mut e, 0),
            &want,
            1e-5,
        );
        assert_eq!(e.draft_nextn(&[(0, 5, 4)]).unwrap(), want_d, "{name}");
        assert_bitwise(&format!("{name}: fork"), &block_memory(&mut e, 1), &whole);

        let path = temp_path::TempPath::new("mtp", &format!("{name}.session"));
        e.save_session(1, &path).unwrap();
        let mut f = engine(name, true, policy);
        f.load_session(0, &path).unwrap();
        assert_bitwise(
            &format!("{name}: session"),
            &block_memory(&mut f, 0),
            &whole,
        );
        // A memory without the block does not take it.
        let mut g = engine(name, false, policy);
        let err = g.load_session(0, &path).unwrap_err().to_string();
        assert!(err.contains("does not fit"), "{name}: {err}");
    }
}

#[test]
fn a_model_without_the_block_is_a_clear_error() {
    let f = tool_fixture("qwen35_tiny");
    let opts = EngineOptions {
        nextn: true,
        ..Default::default()
    };
    let err = match Engine::load(&f.model, opts) {
        Ok(_) => panic!("loaded"),
        Err(e) => e.to_string(),
    };
    assert!(err.contains("no NextN / MTP layers"), "{err}");
    let mut e = Engine::load(&f.model, EngineOptions::default()).unwrap();
    e.eval(0, &f.tokens, LogitRows::Last, 0).unwrap();
    let err = e.draft_nextn(&[(0, 1, 3)]).unwrap_err().to_string();
    assert!(err.contains("no NextN / MTP layers"), "{err}");
    // With the block but not its memory.
    let mut e = engine("qwen35", false, CheckpointPolicy::default());
    e.eval(0, &f.tokens, LogitRows::Last, 0).unwrap();
    let err = e.draft_nextn(&[(0, 1, 3)]).unwrap_err().to_string();
    assert!(err.contains("memory made for it"), "{err}");
}
