//! Speculative decoding with a draft model (`--model-draft`): the output
//! is the target's own, greedy and sampled with a seed, whether the draft
//! model agrees with it always (the target drafting for itself) or rarely
//! (another architecture's random weights over the same vocabulary), for
//! several sequences taking turns in one draft model; a draft model with
//! another vocabulary or a smaller context is a clear error.

mod common;

use coil::engine::generate::{generate_with, GenerateOptions};
use coil::engine::sampling::{Sampler, SamplingParams};
use coil::engine::speculative::{DraftModel, DraftSource, Speculator};
use coil::engine::{Engine, EngineOptions};
use common::{llama_cpp_fixture, tool_fixture};
use std::path::{Path, PathBuf};

fn engine(path: &Path, n_seq: usize, n_ctx: usize) -> Engine {
    Engine::load(
        path,
        EngineOptions {
            n_seq_max: n_seq,
            n_threads: 2,
            n_ctx,
            batched_layout: true,
            ..Default::default()
        },
    )
    .unwrap()
}

fn opts(n: usize) -> GenerateOptions {
    GenerateOptions {
        max_tokens: n,
        stop: Vec::new(),
        stop_at_eos: false,
    }
}

fn model(arch: &str) -> PathBuf {
    llama_cpp_fixture(arch).model
}

/// Generates from `prompt` in sequence `seq` of `e`, with `sp` drafting.
fn run(
    e: &mut Engine,
    seq: usize,
    prompt: &[u32],
    params: &SamplingParams,
    sp: Option<&mut Speculator>,
) -> (Vec<u32>, Option<coil::engine::speculative::SpecCounts>) {
    let tok = coil::tokenizer::Tokenizer::from_gguf(&e.file).unwrap();
    let mut s = Sampler::new(params.clone());
    let st = generate_with(e, &tok, seq, prompt, &mut s, &opts(24), sp, |_| true).unwrap();
    (st.tokens, st.spec)
}

#[test]
fn the_output_is_the_targets_with_any_draft_model() {
    let target = llama_cpp_fixture("granitemoehybrid");
    let prompts = [target.tokens.clone(), target.tokens[..5].to_vec()];
    let seeded = SamplingParams {
        temperature: 0.8,
        seed: 7,
        ..SamplingParams::greedy()
    };
    for params in [SamplingParams::greedy(), seeded] {
        let mut plain = engine(&target.model, 2, 256);
        let want: Vec<_> = prompts
            .iter()
            .enumerate()
            .map(|(seq, p)| run(&mut plain, seq, p, &params, None).0)
            .collect();
        // The target drafting for itself accepts every draft; Mamba-2 with
        // other random weights hardly any.
        for (draft, all_kept) in [("granitemoehybrid", true), ("mamba2", false)] {
            let mut e = engine(&target.model, 2, 256);
            let dm = DraftModel::new(engine(&model(draft), 2, 256), &e).unwrap();
            let mut sp = Speculator::with_source(DraftSource::Model(Box::new(dm)), 3);
            // Two sequences in turn, twice: the draft model's sequences
            // follow the target's wherever they went in between.
            for round in 0..2 {
                for (seq, p) in prompts.iter().enumerate() {
                    e.seq_clear(seq).unwrap();
                    let (got, counts) = run(&mut e, seq, p, &params, Some(&mut sp));
                    let what = format!("{draft}, seq {seq}, round {round}, {params:?}");
                    assert_eq!(got, want[seq], "{what}");
                    let c = counts.unwrap();
                    assert!(c.drafted > 0, "{what}: nothing drafted");
                    if all_kept && params.temperature == 0.0 {
                        assert_eq!(c.accepted, c.drafted, "{what}: {c:?}");
                    }
                }
            }
        }
    }
}

#[test]
fn a_draft_model_with_another_vocabulary_or_a_smaller_context_is_an_error() {
    let target = engine(&model("granitemoehybrid"), 1, 256);
    // 1,024 tokens against 4,096.
    let other = engine(&tool_fixture("qwen35_tiny").model, 1, 256);
    let err = DraftModel::new(other, &target).err().unwrap().to_string();
    assert!(err.contains("vocabulary"), "{err}");
    let small = engine(&model("mamba2"), 1, 64);
    let err = DraftModel::new(small, &target).err().unwrap().to_string();
    assert!(err.contains("context"), "{err}");
    let few = engine(&model("mamba2"), 1, 256);
    let two = engine(&model("granitemoehybrid"), 2, 256);
    let err = DraftModel::new(few, &two).err().unwrap().to_string();
    assert!(err.contains("sequences"), "{err}");
}

/// The architectures with an MTP block (tests/fixtures/nextn/, the block
/// loaded and its memory kept beside), each with a draft model of another
/// architecture over the same vocabulary, greedy and sampled with a seed:
/// the target's own output.
#[test]
fn every_mtp_architecture_keeps_its_output_with_a_draft_model() {
    let nextn = |name: &str| {
        PathBuf::from(env!("CARGO_MANIFEST_DIR"))
            .join(format!("../../tests/fixtures/nextn/{name}/model.gguf"))
    };
    let load = |path: &Path, block: bool| {
        Engine::load(
            path,
            EngineOptions {
                n_seq_max: 1,
                n_threads: 2,
                n_ctx: 256,
                nextn: block,
                ..Default::default()
            },
        )
        .unwrap()
    };
    let cases = [
        ("qwen35", nextn("qwen35moe")),
        ("qwen35moe", nextn("qwen3next")),
        ("qwen3next", nextn("qwen35")),
        ("nemotron_h_moe", model("mamba2")),
    ];
    let seeded = SamplingParams {
        temperature: 0.8,
        seed: 5,
        ..SamplingParams::greedy()
    };
    for (name, draft) in cases {
        let target = nextn(name);
        let prompt: Vec<u32> = (1..12).map(|i| (i * 37) % 1000).collect();
        for params in [SamplingParams::greedy(), seeded.clone()] {
            for block in [false, true] {
                let want = run(&mut load(&target, block), 0, &prompt, &params, None).0;
                let mut e = load(&target, block);
                let dm = DraftModel::new(load(&draft, false), &e).unwrap();
                let mut sp = Speculator::with_source(DraftSource::Model(Box::new(dm)), 4);
                let (got, c) = run(&mut e, 0, &prompt, &params, Some(&mut sp));
                let what = format!("{name}, block loaded {block}, {params:?}");
                assert_eq!(got, want, "{what}");
                assert!(c.unwrap().drafted > 0, "{what}: nothing drafted");
            }
        }
    }
}
