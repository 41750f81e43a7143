//! Continuous batching: prompts admitted while other requests generate.
//! The engine thread is driven directly (no HTTP), every request's events
//! going to one channel, so the order in which the engine produced them is
//! the order they are read in. The tests assert progress and order, never
//! time.

mod common;

use coil::engine::sampling::SamplingParams;
use coil::engine::{Engine, EngineOptions};
use coil::tokenizer::Tokenizer;
use coil_server::api::Usage;
use coil_server::scheduler::{Event, GenRequest, Scheduler, SchedulerConfig};
use std::sync::Arc;
use tokio::sync::mpsc::{unbounded_channel, UnboundedReceiver, UnboundedSender};

/// The Granite 4.0-H fixture (Mamba-2, attention, MoE) behind an engine
/// thread with `parallel` slots and `step_tokens` tokens per step.
fn scheduler(parallel: usize, step_tokens: usize) -> Scheduler {
    let opts = EngineOptions {
        n_threads: 1,
        n_seq_max: parallel + 1,
        n_ctx: 1024,
        n_ubatch: 512,
        ..Default::default()
    };
    let engine = Engine::load(common::fixture("granitemoehybrid"), opts).expect("load");
    let tok = Arc::new(Tokenizer::from_gguf(&engine.file).expect("tokenizer"));
    let cfg = SchedulerConfig {
        parallel,
        prefill_chunk: step_tokens,
        log_requests: false,
        ..Default::default()
    };
    Scheduler::start(engine, tok, cfg).expect("start").0
}

/// A prompt of `n` tokens, `seed` making it differ from others (no shared
/// prefix).
fn prompt(n: usize, seed: u32, n_vocab: usize) -> Vec<u32> {
    (0..n as u32)
        .map(|i| 10 + (seed * 7919 + i * 31) % (n_vocab as u32 - 20))
        .collect()
}

fn request(prompt: Vec<u32>, max_tokens: usize, events: &UnboundedSender<Event>) -> GenRequest {
    GenRequest {
        prompt,
        params: SamplingParams::default(),
        max_tokens,
        stop: Vec::new(),
        stop_at_eos: false,
        marks: Vec::new(),
        n: 1,
        logprobs: None,
        constraint: None,
        events: events.clone(),
    }
}

/// The next event; panics on an error event.
fn next(rx: &mut UnboundedReceiver<Event>) -> Event {
    match rx.blocking_recv() {
        Some(Event::Error(e)) => panic!("request failed: {e}"),
        Some(e) => e,
        None => panic!("the engine thread stopped"),
    }
}

/// Reads events until the request with `prompt_tokens` prompt tokens ends;
/// returns the text events read before that and the usage of the requests
/// that ended on the way.
fn until_done(rx: &mut UnboundedReceiver<Event>, prompt_tokens: usize) -> (usize, Vec<Usage>) {
    let (mut texts, mut ended) = (0, Vec::new());
    loop {
        match next(rx) {
            Event::Text { .. } => texts += 1,
            Event::Done { usage, .. } => {
                ended.push(usage);
                if usage.prompt_tokens == prompt_tokens {
                    return (texts, ended);
                }
            }
            Event::Error(_) => unreachable!(),
        }
    }
}

/// A 300-token prompt arrives while a request generates, 16 tokens per
/// step: the prompt goes in over about 20 steps, and the generation gets a
/// token in every one of them (it does not wait for the prompt), while the
/// prompt does not wait for the generation to end either.
#[test]
fn a_long_prompt_goes_in_beside_a_generation_without_stalling_it() {
    let s = scheduler(2, 16);
    let (tx, mut rx) = unbounded_channel();
    assert!(s.submit(request(prompt(8, 1, s.n_vocab), 200, &tx)));
    // The generation has started.
    assert!(matches!(next(&mut rx), Event::Text { .. }));
    assert!(s.submit(request(prompt(300, 2, s.n_vocab), 1, &tx)));
    let (texts, ended) = until_done(&mut rx, 300);
    // Only the long prompt ended: the generation still runs.
    assert_eq!(ended.len(), 1, "{ended:?}");
    // 299 tokens at 15 a step, then the last one: 21 steps, each with a
    // generated token (a token that ends inside a UTF-8 character streams
    // no text of its own, hence some slack; one text is the prompt's own).
    assert!(
        texts >= 15,
        "the generation streamed {texts} texts meanwhile"
    );
    let (_, ended) = until_done(&mut rx, 8);
    assert_eq!(ended[0].completion_tokens, 200);
}

/// More requests generate than a step has tokens for: a new prompt still
/// gets a quarter of every step, and is in (and answered) long before the
/// generations end.
#[test]
fn a_prompt_progresses_however_many_requests_generate() {
    let s = scheduler(5, 4);
    let (tx, mut rx) = unbounded_channel();
    for i in 0..4 {
        assert!(s.submit(request(prompt(3, 10 + i, s.n_vocab), 150, &tx)));
    }
    // Four generate (one token each is the whole 4-token budget): their
    // 3-token prompts are in after five steps, which stream at most 12
    // texts (4 + 4 + 3 + 1).
    let mut started = 0;
    while started < 12 {
        if let Event::Text { .. } = next(&mut rx) {
            started += 1;
        }
    }
    assert!(s.submit(request(prompt(40, 20, s.n_vocab), 1, &tx)));
    let (texts, ended) = until_done(&mut rx, 40);
    // 39 tokens at one a step, then the last: 40 steps with 4 generated
    // tokens each, and none of the generations has ended.
    assert!(ended.len() == 1, "{ended:?}");
    assert!(texts >= 40, "{texts} texts while the prompt went in");
}

/// A prompt that fits one step gets its first token in that step: the
/// chunk up to its last token goes in the step's first call (a checkpoint
/// after it), the last token in the second, beside the generated tokens.
/// Three tokens from a 20-token prompt: 3 steps, not 4 (the prompt's
/// chunk, then its last token, a step each).
#[test]
fn a_short_prompt_is_answered_in_the_step_it_goes_in() {
    use std::sync::atomic::Ordering;
    let s = scheduler(2, 64);
    let (tx, mut rx) = unbounded_channel();
    assert!(s.submit(request(prompt(20, 3, s.n_vocab), 3, &tx)));
    let (_, ended) = until_done(&mut rx, 20);
    assert_eq!(ended[0].completion_tokens, 3);
    assert_eq!(s.metrics.decode_steps.load(Ordering::Relaxed), 3);
    // The same prompt again resumes from the checkpoint before its last
    // token (the prefix cache): one step for that token, two more.
    assert!(s.submit(request(prompt(20, 3, s.n_vocab), 3, &tx)));
    let (_, ended) = until_done(&mut rx, 20);
    assert_eq!(ended[0].cached_tokens, 19);
    assert_eq!(s.metrics.decode_steps.load(Ordering::Relaxed), 6);
}
