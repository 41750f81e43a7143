//! The engine thread: continuous batching over the engine's sequence slots,
//! with the prefix cache.
//!
//! The engine is not `Sync`, so one thread owns it and loops:
//! 1. take new requests from a channel (blocking only when idle);
//! 2. drop requests whose client went away (their receiver is gone);
//! 3. give waiting requests a slot while fewer than `parallel` run: find
//!    the longest cached prefix of the prompt (parked sequences in the
//!    radix tree, and running sequences), fork or adopt that sequence and
//!    roll it back to the common length (restore the nearest recurrent
//!    checkpoint, replay the few tokens past it);
//! 4. run one `decode_batch` holding one token of every generating
//!    sequence and prompt chunks within what the step's token budget
//!    leaves (`plan`);
//! 5. sample, send text to each request's channel, finish the ones that
//!    stop; a finished sequence is *parked* (kept, indexed by its tokens)
//!    instead of cleared, and evicted least-recently-used first when slots
//!    or the byte budget run out. Forks share memory (attention pages,
//!    recurrent states and checkpoints until written), so the budget is
//!    checked against what the parked sequences hold together, each shared
//!    buffer once, and less what running sequences share with them.
//!
//! The prompt's last token is always processed (never taken from the
//! cache) so that its logits exist; it goes through the model in a call
//! after the rest of the prompt, which puts a recurrent checkpoint right
//! before it (checkpoints are taken at the end of every decode call): the
//! step's second call, beside the generated tokens, when the rest of the
//! prompt goes in the same step.
//!
//! The worker's parts, one job each: `admit` (queue, admission,
//! cancellation), `plan` (the step's token budget), `resume` (the
//! longest cached prefix, rollback to it, pinned checkpoints), `slots`
//! (parking, eviction, the cache's byte budget), `step` (planning and
//! running one batched forward pass) and `finish` (sampling, streaming,
//! ending requests).

mod admit;
mod finish;
mod plan;
mod resume;
mod slots;
mod speculate;
mod step;

pub use resume::align_by_text;

use crate::api::{FinishReason, Usage};
use crate::metrics::{self, Metrics};
use crate::prefix_cache::PrefixCache;
use coil::engine::constraint::Constraint;
use coil::engine::generate::StopMatcher;
use coil::engine::logprobs::TokenLogprob;
use coil::engine::sampling::{Sampler, SamplingParams};
use coil::engine::speculative::DraftModel;
use coil::engine::Engine;
use coil::memory::{Checkpoint, SeqId, SequenceMemory};
use coil::tokenizer::{StreamDecoder, Tokenizer};
use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc;
use std::sync::Arc;
use std::time::Instant;
use tokio::sync::mpsc::UnboundedSender;

/// Scheduling settings.
#[derive(Clone, Debug)]
pub struct SchedulerConfig {
    /// Requests processed at once (the rest wait in a queue).
    pub parallel: usize,
    /// Bytes the parked sequences may hold (attention cells, recurrent
    /// state and checkpoints); beyond it the least recently used go.
    /// Memory that sequences share is counted once, and what a parked
    /// sequence shares with a running one is the running one's: this is
    /// what clearing every parked sequence would free.
    pub cache_bytes: usize,
    /// Tokens per step over all running requests: one for each generating
    /// request, the rest (at least a quarter) for prompts, in chunks, so
    /// that generations keep streaming while a long prompt goes in (see
    /// `plan`).
    pub prefill_chunk: usize,
    /// Extend a cached prefix where the prompt spells the cached tokens'
    /// text with other tokens (see [`align_by_text`]).
    pub reuse_by_text: bool,
    /// A line on stderr per finished request.
    pub log_requests: bool,
    /// Speculative decoding, per request (n-gram drafts, the NextN block
    /// or a draft model; see `speculate`; with
    /// [`coil::engine::draft::SpecKind::Nextn`] the engine must keep the
    /// NextN block's memory, with [`coil::engine::draft::SpecKind::Model`]
    /// the scheduler starts with a draft model,
    /// [`Scheduler::start_with_draft`]); `None`: off.
    pub spec: Option<coil::engine::draft::SpecParams>,
    /// Prompts too through the strictly batch-invariant kernels
    /// (`Numerics::BatchInvariant`): every output is then bit for bit that
    /// of the request alone, whatever the load and the prefix cache, for
    /// every model (see `Worker::forward`). Without it that holds for the
    /// models without chunked recurrences whose weights' GEMMs keep tokens
    /// (`Engine::prompts_invariant`); generated tokens always are
    /// batch-invariant.
    pub batch_invariant: bool,
    /// Generated tokens between two recurrent checkpoints (where the
    /// sequence's length is a multiple of it): a conversation resuming
    /// between two processes the tokens past the earlier one again; each
    /// checkpoint moves the state to another buffer instead of updating it
    /// in place. 4 by default: one request decodes at ~0.95× the engine's
    /// pace, against ~0.91× with a checkpoint per token (mamba2-370m-like
    /// Q4_K_M, docs/PERFORMANCE.md, "Checkpoints and rollback").
    pub checkpoint_spacing: usize,
    /// State buffers to have on the recurrent memory's free list (see
    /// `coil::memory::RecurrentMemory::reserve_buffers`), filled while the
    /// worker is idle, one buffer at a time between requests: the server
    /// answers at once instead of after writing them all (mamba2-370m-like,
    /// `--parallel 16`: 112 buffers, 5.5 GB, ~8 s), and generation later
    /// moves its states into resident pages. 0: none.
    pub reserve_state_buffers: usize,
}

impl Default for SchedulerConfig {
    fn default() -> Self {
        SchedulerConfig {
            parallel: 4,
            cache_bytes: 2 << 30,
            prefill_chunk: 128,
            reuse_by_text: true,
            log_requests: false,
            spec: None,
            batch_invariant: false,
            checkpoint_spacing: 4,
            reserve_state_buffers: 0,
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum SchedulerError {
    #[error("--parallel must be at least 1")]
    NoParallel,
    #[error("the engine holds {have} sequences; {want} are needed (parallel {parallel})")]
    TooFewSlots {
        have: usize,
        want: usize,
        parallel: usize,
    },
    #[error("the prefill chunk must be at least 1 token")]
    NoChunk,
    #[error("speculation with the model's NextN / MTP block needs an engine loaded with its memory (EngineOptions::nextn)")]
    NoNextnMemory,
    #[error("speculation with a draft model needs the draft model (Scheduler::start_with_draft)")]
    NoDraftModel,
    #[error("a draft model was given, but speculation is not set to draft with it")]
    UnusedDraftModel,
    #[error("cannot start the engine thread: {0}")]
    Thread(#[from] std::io::Error),
}

/// One generation request, as the engine thread sees it.
#[derive(Debug)]
pub struct GenRequest {
    /// The prompt's tokens (at least one).
    pub prompt: Vec<u32>,
    pub params: SamplingParams,
    pub max_tokens: usize,
    pub stop: Vec<String>,
    /// Stop at an end-of-generation token.
    pub stop_at_eos: bool,
    /// Prompt positions worth a checkpoint (ends of chat messages): a later
    /// prompt that shares the conversation up to one of them, then differs,
    /// resumes there.
    pub marks: Vec<usize>,
    /// Choices to generate (at least 1, at most `parallel`): the prompt is
    /// processed once, and its sequence forked (`seq_fork`, copy-free)
    /// into one per choice when its last token's logits are there; choice
    /// `i` draws with seed `params.seed + i`.
    pub n: usize,
    /// Report each sampled token's log-probability and those of the `k`
    /// most likely tokens (`Some(k)`).
    pub logprobs: Option<usize>,
    /// What the output must be (structured outputs: JSON, a grammar, a
    /// tool call), compiled and at its first position
    /// ([`coil::engine::constraint::Constraints::compile`]): it advances
    /// with the request's sequence, every sampled token drawn among those
    /// it allows, and the request ends when the output is complete.
    pub constraint: Option<Constraint>,
    /// Where events go; when the receiver is dropped (client gone) the
    /// request is cancelled and its slot freed.
    pub events: UnboundedSender<Event>,
}

impl GenRequest {
    /// A request for one choice without log-probabilities.
    pub fn new(
        prompt: Vec<u32>,
        params: SamplingParams,
        max_tokens: usize,
        events: UnboundedSender<Event>,
    ) -> Self {
        GenRequest {
            prompt,
            params,
            max_tokens,
            stop: Vec::new(),
            stop_at_eos: true,
            marks: Vec::new(),
            n: 1,
            logprobs: None,
            constraint: None,
            events,
        }
    }
}

/// What the engine thread tells a request.
#[derive(Clone, Debug, PartialEq)]
pub enum Event {
    /// Generated text of one choice, final (stop strings already cut),
    /// and the log-probabilities of the tokens sampled since its last
    /// event (when asked for).
    Text {
        choice: usize,
        text: String,
        logprobs: Vec<TokenLogprob>,
    },
    /// A choice ended: its own completion tokens, the prompt's counts, and
    /// the stop string that ended it (if one did).
    Done {
        choice: usize,
        finish: FinishReason,
        usage: Usage,
        stop: Option<String>,
    },
    /// The request failed (every choice).
    Error(String),
}

/// A handle to the engine thread; cheap to clone. The thread ends when every
/// handle is gone and its work is done.
#[derive(Clone, Debug)]
pub struct Scheduler {
    tx: mpsc::Sender<GenRequest>,
    pub metrics: Arc<Metrics>,
    pub n_ctx: usize,
    pub n_vocab: usize,
    /// Requests (choices) generated at once.
    pub parallel: usize,
    alive: Arc<AtomicBool>,
}

/// Clears the liveness flag when the engine thread ends, panics included.
struct AliveGuard(Arc<AtomicBool>);

impl Drop for AliveGuard {
    fn drop(&mut self) {
        self.0.store(false, Ordering::Relaxed);
    }
}

impl Scheduler {
    /// Starts the engine thread. The engine must hold at least
    /// `cfg.parallel` sequences; those beyond `parallel` are room for the
    /// prefix cache.
    pub fn start(
        engine: Engine,
        tokenizer: Arc<Tokenizer>,
        cfg: SchedulerConfig,
    ) -> Result<(Scheduler, std::thread::JoinHandle<()>), SchedulerError> {
        Self::start_with_draft(engine, None, tokenizer, cfg)
    }

    /// [`Scheduler::start`] with a draft model that drafts for every
    /// speculating request (`cfg.spec` of kind
    /// [`coil::engine::draft::SpecKind::Model`]; its sequences follow the
    /// engine's of the same ids).
    pub fn start_with_draft(
        mut engine: Engine,
        draft: Option<DraftModel>,
        tokenizer: Arc<Tokenizer>,
        cfg: SchedulerConfig,
    ) -> Result<(Scheduler, std::thread::JoinHandle<()>), SchedulerError> {
        // A conversation resumes right after its last generated token (the
        // sequence's own state), or within its generation: checkpoint decode
        // steps too, not only prompts, every `checkpoint_spacing` tokens.
        // Pinned checkpoints (below) come back to the memory for reuse.
        if let Some(r) = &mut engine.mem.recurrent {
            r.policy.every_call = true;
            r.policy.call_spacing = cfg.checkpoint_spacing.max(1);
            r.hold_outside(MAX_PINNED);
        }
        if cfg.parallel == 0 {
            return Err(SchedulerError::NoParallel);
        }
        if cfg.prefill_chunk == 0 {
            return Err(SchedulerError::NoChunk);
        }
        let nextn = cfg.spec.map(|p| p.kind) == Some(coil::engine::draft::SpecKind::Nextn);
        if nextn && !engine.opts.nextn {
            return Err(SchedulerError::NoNextnMemory);
        }
        let with_model = cfg.spec.map(|p| p.kind) == Some(coil::engine::draft::SpecKind::Model);
        match (with_model, draft.is_some()) {
            (true, false) => return Err(SchedulerError::NoDraftModel),
            (false, true) => return Err(SchedulerError::UnusedDraftModel),
            _ => {}
        }
        let have = engine.mem.n_seq_max();
        if have < cfg.parallel {
            return Err(SchedulerError::TooFewSlots {
                have,
                want: cfg.parallel,
                parallel: cfg.parallel,
            });
        }
        let (tx, rx) = mpsc::channel();
        let metrics = Arc::new(Metrics::default());
        let alive = Arc::new(AtomicBool::new(true));
        let guard = AliveGuard(alive.clone());
        let handle = Scheduler {
            tx,
            metrics: metrics.clone(),
            n_ctx: engine.mem.n_ctx(),
            n_vocab: engine.n_vocab(),
            parallel: cfg.parallel,
            alive,
        };
        // Published before anything can read it: a client waiting for the
        // reserve must not see 0 before the worker's first look at it.
        metrics::set(
            &metrics.state_buffers_reserving,
            usize::from(cfg.reserve_state_buffers > 0),
        );
        let chunk_align = engine
            .scan_chunk()
            .filter(|_| !cfg.batch_invariant && engine.prompts_invariant());
        let worker = Worker {
            chunk_align,
            busy: vec![false; have],
            engine,
            draft,
            tok: tokenizer,
            cfg,
            metrics,
            cache: PrefixCache::new(),
            active: Vec::new(),
            queue: VecDeque::new(),
            rx,
            rates: Rates::default(),
            n_admitted: 0,
            pinned: vec![Vec::new(); have],
            cached_bytes: 0,
            reserving: true,
        };
        let join = std::thread::Builder::new()
            .name("coil-engine".into())
            .spawn(move || {
                let _guard = guard;
                worker.run()
            })?;
        Ok((handle, join))
    }

    /// Whether the engine thread is running.
    pub fn is_alive(&self) -> bool {
        self.alive.load(Ordering::Relaxed)
    }

    /// Queues a request; `false` when the engine thread has stopped.
    pub fn submit(&self, req: GenRequest) -> bool {
        self.tx.send(req).is_ok()
    }
}

/// A request's choice holding a slot.
struct Active {
    seq: SeqId,
    /// Which choice of its request (0 until the prompt is forked).
    choice: usize,
    /// Choices still to fork from this one once its prompt is processed.
    forks: usize,
    /// Top log-probabilities to report per token (see
    /// [`GenRequest::logprobs`]).
    logprobs: Option<usize>,
    events: UnboundedSender<Event>,
    prompt: Vec<u32>,
    /// Prompt tokens in memory.
    done: usize,
    max_tokens: usize,
    stop_at_eos: bool,
    sampler: Sampler,
    decoder: StreamDecoder,
    stops: StopMatcher,
    /// A sampled token not yet fed to the model.
    next: Option<u32>,
    /// Drafts and their adaptive length, when speculative decoding is on.
    spec: Option<coil::engine::speculative::Speculator>,
    /// The request's output constraint (see [`GenRequest::constraint`]).
    constraint: Option<Constraint>,
    usage: Usage,
    /// Request number, for logs.
    id: u64,
    started: Instant,
    /// When the first token was sampled.
    first_token: Option<Instant>,
    /// Prompt positions where the prefill ends a call, so that a
    /// checkpoint lands there (sorted): the request's `marks`, and where
    /// this prompt leaves the longest prefix it shares with a cached or
    /// running sequence that could not be resumed there — the next prompt
    /// sharing that prefix resumes at the branch (e.g. one system prompt,
    /// many different questions).
    marks: Vec<usize>,
}

impl Active {
    /// Whether the checkpoint at prompt position `at` is pinned (kept
    /// whatever thinning does to the engine's list): the prompt's last
    /// ones, and the branch points.
    fn pins_at(&self, at: usize) -> bool {
        at + 1 >= self.prompt.len() || self.marks.contains(&at)
    }
}

/// Tokens and busy time since the speeds were last published.
/// Steps that processed prompt tokens count for the prompt speed; steps
/// that only generated count for the generation speed.
#[derive(Default)]
struct Rates {
    prompt: usize,
    prompt_secs: f64,
    gen: usize,
    gen_secs: f64,
}

struct Worker {
    engine: Engine,
    /// The draft model of [`coil::engine::draft::SpecKind::Model`]
    /// speculation.
    draft: Option<DraftModel>,
    tok: Arc<Tokenizer>,
    cfg: SchedulerConfig,
    metrics: Arc<Metrics>,
    cache: PrefixCache,
    /// Slots held by active requests.
    busy: Vec<bool>,
    active: Vec<Active>,
    queue: VecDeque<GenRequest>,
    rx: mpsc::Receiver<GenRequest>,
    rates: Rates,
    n_admitted: u64,
    /// Per slot: recurrent checkpoints kept beside the engine's own (which
    /// thins them out as a sequence grows) — at the end of a prompt, right
    /// before its last token, and where it resumed from the cache: the
    /// positions the next request most likely shares (a regenerated or
    /// edited last turn, a common system prompt).
    pinned: Vec<Vec<Checkpoint>>,
    /// What the parked sequences hold (see [`Worker::cache_footprint`]),
    /// as of the last change to the cache.
    cached_bytes: usize,
    /// Whether [`SchedulerConfig::reserve_state_buffers`] is still being
    /// filled (cleared once it is, or the pool is full).
    reserving: bool,
    /// The chunk of the model's chunked recurrences where its prompts are
    /// batch-invariant with `Numerics::CheapInvariant`
    /// (`Engine::prompts_invariant`, `Engine::scan_chunk`) and
    /// `batch_invariant` is off: prompt calls then start at multiples of it
    /// only (the marks rounded down to one, the step's budget cut there),
    /// and a resume starts where `Engine::resumable` allows.
    chunk_align: Option<usize>,
}

/// Pinned checkpoints per slot.
const MAX_PINNED: usize = 4;

/// Most state buffers reserved per running sequence. A sequence whose
/// checkpoints fill the budget holds `max_checkpoints()` of them, its
/// current state, the one it moves into at the next checkpoint, and the
/// checkpoint pinned before its prompt's last token; a finished sequence's
/// buffers go back once its slot is taken again: [`RESERVE_SLACK`] beyond
/// the checkpoints. Counted on `coil serve --parallel 8`'s first burst of
/// 8 requests of 128 tokens (`coil_state_buffers_allocated_total`):
/// mamba2-370m-like (5 checkpoints of 49 MB) 68 buffers, qwen35-0.8b-like
/// (13 of 19 MB) 134, where the reserve was `max_checkpoints() + 2`, at
/// most 8, per sequence: the buffers beyond it were fresh pages faulted in
/// during decode steps (two steps of ~830 ms on mamba2, a 3 s gap on
/// qwen35). A small state's budget allows thousands (the bundled demo
/// model: 3,666), which come from the pool as they are first needed.
pub const RESERVE_PER_SEQ: usize = 24;

/// Buffers a running sequence holds beyond its checkpoints (see
/// [`RESERVE_PER_SEQ`]).
pub const RESERVE_SLACK: usize = 4;

/// The state buffers to reserve (as [`SchedulerConfig::reserve_state_buffers`])
/// for `running` sequences of `engine` under its checkpoint budget: what
/// they hold at most, so that generation never waits on fresh pages (0
/// without recurrent layers).
pub fn state_buffers_wanted(engine: &mut Engine, running: usize) -> usize {
    match engine.mem.recurrent.as_mut() {
        Some(r) => (r.max_checkpoints() + RESERVE_SLACK).min(RESERVE_PER_SEQ) * running,
        None => 0,
    }
}

impl Worker {
    fn run(mut self) {
        loop {
            if self.active.is_empty() && self.queue.is_empty() {
                self.publish_rates();
                self.gauges();
                let next = if self.reserving {
                    match self.rx.try_recv() {
                        Ok(r) => Ok(r),
                        Err(mpsc::TryRecvError::Empty) => {
                            self.reserve_one();
                            continue;
                        }
                        Err(mpsc::TryRecvError::Disconnected) => return,
                    }
                } else {
                    self.rx.recv().map_err(|_| ())
                };
                match next {
                    Ok(r) => self.enqueue(r),
                    Err(_) => return,
                }
            }
            while let Ok(r) = self.rx.try_recv() {
                self.enqueue(r);
            }
            self.drop_gone();
            // A request of n choices takes n of the `parallel` places (its
            // forks get theirs once its prompt is in); first come, first
            // served.
            while let Some(n) = self.queue.front().map(|r| r.n.max(1)) {
                if n <= self.cfg.parallel && self.running() + n > self.cfg.parallel {
                    break;
                }
                let Some(req) = self.queue.pop_front() else {
                    break;
                };
                self.admit(req);
            }
            self.gauges();
            if !self.active.is_empty() {
                self.step();
            }
        }
    }

    /// Places taken by the running requests: each choice, and the forks
    /// still to come.
    fn running(&self) -> usize {
        self.active.iter().map(|a| 1 + a.forks).sum()
    }

    /// One more state buffer on the free list, while fewer than
    /// [`SchedulerConfig::reserve_state_buffers`] are there; stops reserving
    /// once they are, or the pool is full.
    fn reserve_one(&mut self) {
        let want = self.cfg.reserve_state_buffers;
        let added = match self.engine.mem.recurrent.as_mut() {
            Some(r) if r.free_buffers() < want => r.reserve_buffers(r.free_buffers() + 1),
            _ => 0,
        };
        if added == 0 {
            self.reserving = false;
        }
    }

    fn gauges(&self) {
        let m = &self.metrics;
        metrics::set(&m.queue_length, self.queue.len());
        metrics::set(&m.active_sequences, self.active.len());
        metrics::set(&m.cached_sequences, self.cache.len());
        metrics::set(&m.cached_bytes, self.cached_bytes);
        if let Some(r) = &self.engine.mem.recurrent {
            metrics::set(&m.state_buffers_free, r.free_buffers());
            metrics::set(&m.state_buffers_allocated, r.fresh_buffers());
        }
        metrics::set(&m.state_buffers_reserving, self.reserving as usize);
    }

    fn publish_rates(&mut self) {
        let r = std::mem::take(&mut self.rates);
        if r.prompt > 0 && r.prompt_secs > 0.0 {
            metrics::set_f64(&self.metrics.prompt_tps, r.prompt as f64 / r.prompt_secs);
        }
        if r.gen > 0 && r.gen_secs > 0.0 {
            metrics::set_f64(&self.metrics.generation_tps, r.gen as f64 / r.gen_secs);
        }
    }
}

fn seq_len_or_zero(engine: &Engine, s: SeqId) -> usize {
    engine.mem.seq_len(s).unwrap_or(0)
}
