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
//! 4. run one `decode_batch` holding a chunk of every new prompt (within a
//!    per-step token budget) and one token of every generating sequence;
//! 5. sample, send text to each request's channel, finish the ones that
//!    stop; a finished sequence is *parked* (kept, indexed by its tokens)
//!    instead of cleared, and evicted least-recently-used first when slots
//!    or the byte budget run out. Forks share memory (attention pages,
//!    recurrent states and checkpoints until written), so the budget is
//!    checked against what the parked sequences hold together, each shared
//!    buffer once, and less what running sequences share with them.
//!
//! The prompt's last token is always processed (never taken from the
//! cache) so that its logits exist; it goes through the model in a step
//! after the rest of the prompt, which puts a recurrent checkpoint right
//! before it (checkpoints are taken at the end of every decode call).

use crate::api::{FinishReason, Usage};
use crate::metrics::{self, Metrics};
use crate::prefix_cache::PrefixCache;
use coil::engine::generate::StopMatcher;
use coil::engine::sampling::{Sampler, SamplingParams};
use coil::engine::{BatchEntry, Engine};
use coil::memory::recurrent::distinct_checkpoint_bytes;
use coil::memory::{Checkpoint, SeqId, SequenceMemory};
use coil::models::LogitRows;
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
    /// Prompt tokens processed per step over all new requests, so that
    /// running generations keep streaming while a long prompt goes in.
    pub prefill_chunk: usize,
    /// Extend a cached prefix where the prompt spells the cached tokens'
    /// text with other tokens (see [`align_by_text`]).
    pub reuse_by_text: bool,
    /// A line on stderr per finished request.
    pub log_requests: bool,
}

impl Default for SchedulerConfig {
    fn default() -> Self {
        SchedulerConfig {
            parallel: 4,
            cache_bytes: 2 << 30,
            prefill_chunk: 512,
            reuse_by_text: true,
            log_requests: false,
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
    /// Where events go; when the receiver is dropped (client gone) the
    /// request is cancelled and its slot freed.
    pub events: UnboundedSender<Event>,
}

/// What the engine thread tells a request.
#[derive(Clone, Debug, PartialEq)]
pub enum Event {
    /// Generated text, final (stop strings already cut).
    Text(String),
    Done {
        finish: FinishReason,
        usage: Usage,
    },
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
        mut engine: Engine,
        tokenizer: Arc<Tokenizer>,
        cfg: SchedulerConfig,
    ) -> Result<(Scheduler, std::thread::JoinHandle<()>), SchedulerError> {
        // A conversation resumes right after its last generated token:
        // checkpoint every decode step, not only prompts.
        if let Some(r) = &mut engine.mem.recurrent {
            r.policy.every_call = true;
        }
        if cfg.parallel == 0 {
            return Err(SchedulerError::NoParallel);
        }
        if cfg.prefill_chunk == 0 {
            return Err(SchedulerError::NoChunk);
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
            alive,
        };
        let worker = Worker {
            busy: vec![false; have],
            engine,
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

/// A request holding a slot.
struct Active {
    seq: SeqId,
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

enum Outcome {
    Continue,
    Finished(FinishReason, bool),
    Gone,
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
}

/// Pinned checkpoints per slot.
const MAX_PINNED: usize = 4;

fn common_len(a: &[u32], b: &[u32]) -> usize {
    a.iter().zip(b).take_while(|(x, y)| x == y).count()
}

impl Worker {
    fn run(mut self) {
        loop {
            if self.active.is_empty() && self.queue.is_empty() {
                self.publish_rates();
                self.gauges();
                match self.rx.recv() {
                    Ok(r) => self.enqueue(r),
                    Err(_) => return,
                }
            }
            while let Ok(r) = self.rx.try_recv() {
                self.enqueue(r);
            }
            self.drop_gone();
            while self.active.len() < self.cfg.parallel {
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

    fn enqueue(&mut self, r: GenRequest) {
        metrics::add(&self.metrics.requests, 1);
        self.queue.push_back(r);
    }

    fn gauges(&self) {
        let m = &self.metrics;
        metrics::set(&m.queue_length, self.queue.len());
        metrics::set(&m.active_sequences, self.active.len());
        metrics::set(&m.cached_sequences, self.cache.len());
        metrics::set(&m.cached_bytes, self.cached_bytes);
    }

    /// Cancels requests whose client is gone: queued ones are dropped,
    /// running ones give their slot back at once (their sequence is
    /// parked: what it processed stays reusable).
    fn drop_gone(&mut self) {
        let before = self.queue.len();
        self.queue.retain(|r| !r.events.is_closed());
        let n = before - self.queue.len();
        metrics::add(&self.metrics.requests_cancelled, n);
        let mut i = 0;
        while i < self.active.len() {
            if self.active[i].events.is_closed() {
                let a = self.active.remove(i);
                metrics::add(&self.metrics.requests_cancelled, 1);
                metrics::add(&self.metrics.completion_tokens, a.usage.completion_tokens);
                if self.cfg.log_requests {
                    log_request(&a, "client gone");
                }
                self.release(a.seq, true);
            } else {
                i += 1;
            }
        }
    }

    /// Bytes the sequences `seqs` hold together — attention pages,
    /// recurrent states, the engine's checkpoints and the pinned ones —
    /// each buffer once however many of them share it.
    fn footprint(&self, seqs: &[SeqId]) -> usize {
        let mem = &self.engine.mem;
        let kv = mem
            .kv
            .as_ref()
            .map_or(0, |k| k.page_stats_of(seqs.iter().copied()).bytes);
        let rec = mem.recurrent.as_ref().map_or(0, |r| {
            let engine = seqs
                .iter()
                .flat_map(|&s| r.checkpoints(s).unwrap_or_default());
            let pinned = seqs.iter().flat_map(|&s| &self.pinned[s]);
            r.resident_bytes_of(seqs.iter().copied())
                + distinct_checkpoint_bytes(engine.chain(pinned))
        });
        kv + rec
    }

    /// Bytes the parked sequences hold beyond what the running ones do:
    /// what clearing all of them would free. A fork shares its source's
    /// memory until it writes, so parked conversations with a common
    /// prefix take that prefix once, not once each.
    fn cache_footprint(&self) -> usize {
        let running: Vec<SeqId> = (0..self.busy.len()).filter(|&s| self.busy[s]).collect();
        let mut all = running.clone();
        all.extend(self.cache.seqs());
        self.footprint(&all)
            .saturating_sub(self.footprint(&running))
    }

    /// Recomputes [`Worker::cached_bytes`] after the cache changed.
    fn refresh_cache_bytes(&mut self) {
        self.cached_bytes = self.cache_footprint();
        metrics::set(&self.metrics.cached_bytes, self.cached_bytes);
    }

    /// Gives slot `s` back: parked in the cache (`keep`) or cleared.
    fn release(&mut self, s: SeqId, keep: bool) {
        self.busy[s] = false;
        let tokens = match self.engine.mem.seq_tokens(s) {
            Ok(t) if keep && !t.is_empty() => t.to_vec(),
            _ => {
                let _ = self.engine.seq_clear(s);
                self.pinned[s].clear();
                self.refresh_cache_bytes();
                return;
            }
        };
        self.cache.insert(s, &tokens);
        // Evicting a sequence frees only what nothing else shares, so the
        // total is measured again after each one.
        self.refresh_cache_bytes();
        while self.cached_bytes > self.cfg.cache_bytes {
            let Some(victim) = self.cache.lru(None) else {
                break;
            };
            self.evict(victim);
        }
    }

    fn evict(&mut self, s: SeqId) {
        self.cache.remove(s);
        let _ = self.engine.seq_clear(s);
        self.pinned[s].clear();
        metrics::add(&self.metrics.cache_evictions, 1);
        self.refresh_cache_bytes();
    }

    /// Keeps the engine's checkpoint of slot `s` at `pos` (if it has one)
    /// beside it, whatever the engine's thinning does later.
    fn pin(&mut self, s: SeqId, pos: usize) {
        let Some(r) = &self.engine.mem.recurrent else {
            return;
        };
        if pos == 0 || self.pinned[s].iter().any(|c| c.pos == pos) {
            return;
        }
        let Some(cp) = r
            .checkpoints(s)
            .ok()
            .and_then(|cps| cps.iter().find(|c| c.pos == pos).cloned())
        else {
            return;
        };
        let pins = &mut self.pinned[s];
        pins.push(cp);
        pins.sort_by_key(|c| c.pos);
        if pins.len() > MAX_PINNED {
            pins.remove(0);
        }
    }

    /// Puts the pinned checkpoint of slot `s` at `pos` back into the
    /// engine's list (where thinning dropped it), so that a rollback to
    /// `pos` restores it.
    fn unpin_into_engine(&mut self, s: SeqId, pos: usize) -> Result<(), String> {
        let Some(pin) = self.pinned[s].iter().find(|c| c.pos == pos).cloned() else {
            return Ok(());
        };
        let Some(r) = &mut self.engine.mem.recurrent else {
            return Ok(());
        };
        let mut cps = r.checkpoints(s).map_err(|e| e.to_string())?.to_vec();
        if cps.iter().any(|c| c.pos == pos) {
            return Ok(());
        }
        cps.push(pin);
        cps.sort_by_key(|c| c.pos);
        r.set_checkpoints(s, cps).map_err(|e| e.to_string())
    }

    /// A slot neither running nor parked.
    fn unused_slot(&self) -> Option<SeqId> {
        (0..self.busy.len()).find(|&s| !self.busy[s] && !self.cache.contains(s))
    }

    /// An unused slot, evicting the least recently used parked sequence
    /// (other than `keep`) when there is none.
    fn take_slot(&mut self, keep: Option<SeqId>) -> Option<SeqId> {
        if let Some(s) = self.unused_slot() {
            return Some(s);
        }
        let victim = self.cache.lru(keep)?;
        self.evict(victim);
        Some(victim)
    }

    /// Gives `req` a slot holding the longest cached prefix of its prompt.
    fn admit(&mut self, mut req: GenRequest) {
        match self.prepare(&mut req) {
            Ok((seq, cached, branch)) => {
                let mut marks = std::mem::take(&mut req.marks);
                marks.push(branch);
                marks.retain(|&m| m > cached && m + 1 < req.prompt.len());
                marks.sort_unstable();
                marks.dedup();
                let n = req.prompt.len();
                let m = &self.metrics;
                metrics::add(&m.prompt_tokens, n);
                metrics::add(&m.prompt_tokens_cached, cached);
                metrics::add(&m.prompt_tokens_processed, n - cached);
                let mut sampler = Sampler::new(req.params);
                for &t in &req.prompt {
                    sampler.accept(t);
                }
                self.busy[seq] = true;
                self.active.push(Active {
                    seq,
                    events: req.events,
                    done: seq_len_or_zero(&self.engine, seq),
                    prompt: req.prompt,
                    max_tokens: req.max_tokens,
                    stop_at_eos: req.stop_at_eos,
                    sampler,
                    decoder: self.tok.stream_decoder(),
                    stops: StopMatcher::new(&req.stop),
                    next: None,
                    usage: Usage {
                        prompt_tokens: n,
                        cached_tokens: cached,
                        completion_tokens: 0,
                    },
                    id: self.n_admitted,
                    started: Instant::now(),
                    first_token: None,
                    marks,
                });
                self.n_admitted += 1;
            }
            Err(msg) => {
                metrics::add(&self.metrics.requests_failed, 1);
                let _ = req.events.send(Event::Error(msg));
            }
        }
        // A parked sequence may have been adopted, forked (what the fork
        // shares is now a running sequence's) or evicted.
        self.refresh_cache_bytes();
    }

    /// Where sequence `s`, sharing `len` tokens with a prompt, can resume
    /// with nothing replayed: its end if it holds no more than that, else
    /// its newest recurrent checkpoint at or before `len` (attention-only
    /// memory is simply cut at `len`).
    fn resume_point(&self, s: SeqId, len: usize) -> usize {
        let have = seq_len_or_zero(&self.engine, s);
        if len >= have {
            return have;
        }
        match &self.engine.mem.recurrent {
            None => len,
            Some(r) => {
                let engine = r.checkpoints(s).unwrap_or_default();
                engine
                    .iter()
                    .chain(&self.pinned[s])
                    .map(|c| c.pos)
                    .filter(|&p| p <= len)
                    .max()
                    .unwrap_or(0)
            }
        }
    }

    /// Picks the slot and rolls it back to the reused prefix; returns the
    /// slot and how many prompt tokens it already holds.
    ///
    /// Candidates are the parked sequences (from the radix tree) and the
    /// running ones; the best is the one that resumes furthest. The tokens
    /// between its resume point (a checkpoint) and the shared length are
    /// processed with the rest of the prompt, batched like any prefill,
    /// rather than replayed here.
    /// Also returns the branch position (see `Active::marks`; 0: none).
    fn prepare(&mut self, req: &mut GenRequest) -> Result<(SeqId, usize, usize), String> {
        let n = req.prompt.len();
        if n == 0 {
            return Err("the prompt has no tokens".into());
        }
        let query = &req.prompt[..n - 1];
        let mut cands: Vec<(SeqId, usize, bool)> = self
            .cache
            .matches(query)
            .into_iter()
            .map(|m| (m.seq, m.len, true))
            .collect();
        for a in &self.active {
            let toks = self
                .engine
                .mem
                .seq_tokens(a.seq)
                .map_err(|e| e.to_string())?;
            let l = common_len(toks, query);
            if l > 0 {
                cands.push((a.seq, l, false));
            }
        }
        struct Pick {
            seq: SeqId,
            len: usize,
            at: usize,
            parked: bool,
            prompt: Option<Vec<u32>>,
            key: (usize, bool, u64),
        }
        let n_ctx = self.engine.mem.n_ctx();
        // The longest prefix shared with anything in memory.
        let shared = cands.iter().map(|&(_, len, _)| len).max().unwrap_or(0);
        let mut best: Option<Pick> = None;
        for (seq, len, parked) in cands {
            let held = self.engine.mem.seq_tokens(seq).map_err(|e| e.to_string())?;
            let (mut len, mut prompt) = (len, None);
            if self.cfg.reuse_by_text {
                let bytes = |t: u32| self.tok.token_to_bytes_with(t, true);
                if let Some((p, l)) = align_by_text(&req.prompt, held, len, bytes) {
                    if p.len() + req.max_tokens <= n_ctx {
                        prompt = Some(p);
                        len = l;
                    }
                }
            }
            let at = self.resume_point(seq, len);
            if at == 0 {
                continue;
            }
            let recency = match parked {
                true => self.cache.last_used(seq).unwrap_or(0),
                false => u64::MAX,
            };
            let key = (at, len == held.len(), recency);
            if best.as_ref().is_none_or(|b| key > b.key) {
                best = Some(Pick {
                    seq,
                    len,
                    at,
                    parked,
                    prompt,
                    key,
                });
            }
        }
        let Some(mut pick) = best else {
            let slot = self.take_slot(None).ok_or("no free sequence slot")?;
            self.engine.seq_clear(slot).map_err(|e| e.to_string())?;
            self.pinned[slot].clear();
            return Ok((slot, 0, shared));
        };
        if let Some(p) = pick.prompt.take() {
            req.prompt = p;
        }
        let src = pick.seq;
        let src_len = seq_len_or_zero(&self.engine, src);
        // Adopt a parked sequence (no copy) when nothing is lost by it, or
        // when a slot must be freed anyway and it is the one to go; fork it
        // otherwise.
        let adopt = pick.parked
            && (pick.at == src_len
                || (self.unused_slot().is_none()
                    && (self.cache.lru(None) == Some(src) || 2 * pick.at >= src_len)));
        let slot = if adopt {
            self.cache.remove(src);
            src
        } else {
            let slot = self.take_slot(Some(src)).ok_or("no free sequence slot")?;
            self.engine.seq_fork(src, slot).map_err(|e| e.to_string())?;
            self.pinned[slot] = self.pinned[src].clone();
            if pick.parked {
                self.cache.touch(src);
            }
            slot
        };
        self.pinned[slot].retain(|c| c.pos <= pick.at);
        if pick.at < seq_len_or_zero(&self.engine, slot) {
            if let Err(e) = self.unpin_into_engine(slot, pick.at) {
                let _ = self.engine.seq_clear(slot);
                self.pinned[slot].clear();
                return Err(e);
            }
        }
        // A checkpoint (or the end, or a cut of attention cells): nothing
        // is replayed here.
        let stats = match self.engine.seq_truncate(slot, pick.at) {
            Ok(s) => s,
            Err(e) => {
                let _ = self.engine.seq_clear(slot);
                self.pinned[slot].clear();
                return Err(e.to_string());
            }
        };
        self.pin(slot, pick.at);
        metrics::add(&self.metrics.prefix_tokens_recomputed, pick.len - pick.at);
        let branch = if shared > pick.at { shared } else { 0 };
        Ok((slot, pick.at - stats.replayed.min(pick.at), branch))
    }

    /// One batched forward pass over every active request.
    fn step(&mut self) {
        let mut budget = self.cfg.prefill_chunk;
        // (active index, tokens, logits wanted, is a prompt chunk)
        let mut plan: Vec<(usize, Vec<u32>, LogitRows, bool)> = Vec::new();
        for (i, a) in self.active.iter().enumerate() {
            if let Some(t) = a.next {
                plan.push((i, vec![t], LogitRows::Last, false));
            } else if a.done < a.prompt.len() && budget > 0 {
                // The last prompt token goes in a call of its own, so that a
                // checkpoint lands right before it: the same prompt sent
                // again then reuses all but that token.
                let n = a.prompt.len();
                let mut target = if a.done + 1 < n { n - 1 } else { n };
                // End a call at the next mark: a checkpoint lands there.
                if let Some(&m) = a.marks.iter().find(|&&m| m > a.done && m < target) {
                    target = m;
                }
                let take = (target - a.done).min(budget);
                budget -= take;
                let end = a.done + take == n;
                let rows = if end && a.max_tokens > 0 {
                    LogitRows::Last
                } else {
                    LogitRows::None
                };
                plan.push((i, a.prompt[a.done..a.done + take].to_vec(), rows, true));
            }
        }
        if plan.is_empty() {
            return;
        }
        let entries: Vec<BatchEntry> = plan
            .iter()
            .map(|(i, toks, rows, _)| BatchEntry {
                seq: self.active[*i].seq,
                tokens: toks,
                logits: *rows,
            })
            .collect();
        let t0 = Instant::now();
        let result = self.engine.decode_batch(&entries);
        let secs = t0.elapsed().as_secs_f64();
        drop(entries);
        metrics::add(&self.metrics.decode_steps, 1);
        metrics::add(&self.metrics.busy_us, (secs * 1e6) as usize);
        let logits = match result {
            Ok(l) => l,
            Err(e) => {
                // A failed pass may leave its sequences half-advanced:
                // fail those requests and clear their slots.
                let msg = format!("the model failed: {e}");
                let mut idx: Vec<usize> = plan.iter().map(|p| p.0).collect();
                idx.sort_unstable();
                for &i in idx.iter().rev() {
                    let a = self.active.remove(i);
                    metrics::add(&self.metrics.requests_failed, 1);
                    let _ = a.events.send(Event::Error(msg.clone()));
                    self.release(a.seq, false);
                }
                return;
            }
        };
        let n_prompt: usize = plan.iter().filter(|p| p.3).map(|p| p.1.len()).sum();
        if n_prompt > 0 {
            self.rates.prompt += n_prompt;
            self.rates.prompt_secs += secs;
        } else {
            self.rates.gen += plan.len();
            self.rates.gen_secs += secs;
        }
        if self.rates.prompt_secs + self.rates.gen_secs >= 1.0 {
            self.publish_rates();
        }

        let mut ended: Vec<(usize, Option<(FinishReason, bool)>)> = Vec::new();
        let mut pins = Vec::new();
        for ((i, toks, rows, is_prompt), row) in plan.into_iter().zip(logits) {
            let a = &mut self.active[i];
            if is_prompt {
                a.done += toks.len();
                // Keep the prompt's last checkpoints, and the one at the
                // branch point, whatever thinning does to the engine's list.
                if a.done + 1 >= a.prompt.len() || a.marks.contains(&a.done) {
                    pins.push((a.seq, a.done));
                }
            } else {
                a.next = None;
            }
            if a.done == a.prompt.len() && a.max_tokens == 0 {
                ended.push((i, Some((FinishReason::Length, true))));
                continue;
            }
            if rows == LogitRows::None {
                continue;
            }
            match sample(a, &self.tok, &row) {
                Outcome::Continue => {}
                Outcome::Finished(reason, flush) => ended.push((i, Some((reason, flush)))),
                Outcome::Gone => ended.push((i, None)),
            }
        }
        for (seq, pos) in pins {
            self.pin(seq, pos);
        }
        ended.sort_unstable_by_key(|e| e.0);
        let mut replies = Vec::new();
        for (i, how) in ended.into_iter().rev() {
            let mut a = self.active.remove(i);
            metrics::add(&self.metrics.completion_tokens, a.usage.completion_tokens);
            match how {
                Some((reason, flush)) => {
                    let mut rest = String::new();
                    if flush {
                        rest = a.stops.push(&a.decoder.flush()).0;
                        rest.push_str(&a.stops.flush());
                    }
                    if self.cfg.log_requests {
                        log_request(&a, reason.as_str());
                    }
                    let done = Event::Done {
                        finish: reason,
                        usage: a.usage,
                    };
                    replies.push((a.events, rest, done));
                }
                None => {
                    metrics::add(&self.metrics.requests_cancelled, 1);
                    if self.cfg.log_requests {
                        log_request(&a, "client gone");
                    }
                }
            }
            self.release(a.seq, true);
        }
        // Counters and gauges are current before a client hears the end.
        self.gauges();
        for (events, rest, done) in replies {
            if !rest.is_empty() {
                let _ = events.send(Event::Text(rest));
            }
            let _ = events.send(done);
        }
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

/// Extends a token-level match by text: past the `len` tokens that
/// `prompt` and `held` share, the prompt may spell the same text with other
/// tokens (a model's own output re-tokenized differently, e.g. six `\n`
/// tokens read back as one `\n\n\n\n\n\n`). Finds the furthest point
/// where both token lists end on the same byte offset with equal bytes,
/// and returns the prompt rewritten to use `held`'s tokens up to there
/// (the same text, so the same request) and the new common length. The
/// prompt keeps at least its last token. `None` when nothing is gained.
pub fn align_by_text<'t>(
    prompt: &[u32],
    held: &[u32],
    len: usize,
    bytes: impl Fn(u32) -> &'t [u8],
) -> Option<(Vec<u32>, usize)> {
    let n = prompt.len();
    if len >= n.saturating_sub(1) || len >= held.len() {
        return None;
    }
    // The prompt's text past the match (but its last token), and where its
    // tokens end in it.
    let mut text = Vec::new();
    let mut ends = Vec::new();
    for &t in &prompt[len..n - 1] {
        text.extend_from_slice(bytes(t));
        ends.push(text.len());
    }
    let mut at = 0;
    let mut best = None;
    for (j, &t) in held[len..].iter().enumerate() {
        let b = bytes(t);
        if b.is_empty() || text.get(at..at + b.len()) != Some(b) {
            break;
        }
        at += b.len();
        if let Ok(i) = ends.binary_search(&at) {
            best = Some((len + i + 1, len + j + 1));
        }
    }
    let (i, j) = best?;
    if j - len <= i - len && held[len..j] == prompt[len..i] {
        return None;
    }
    let mut out = Vec::with_capacity(j + n - i);
    out.extend_from_slice(&held[..j]);
    out.extend_from_slice(&prompt[i..]);
    Some((out, j))
}

fn seq_len_or_zero(engine: &Engine, s: SeqId) -> usize {
    engine.mem.seq_len(s).unwrap_or(0)
}

/// One line per request: prompt reuse, speed, how it ended.
fn log_request(a: &Active, end: &str) {
    let u = &a.usage;
    let total = a.started.elapsed().as_secs_f64();
    let (ttft, gen_secs) = match a.first_token {
        Some(t) => {
            let first = t.duration_since(a.started).as_secs_f64();
            (first, total - first)
        }
        None => (total, 0.0),
    };
    let tps = if gen_secs > 0.0 && u.completion_tokens > 1 {
        (u.completion_tokens - 1) as f64 / gen_secs
    } else {
        0.0
    };
    eprintln!(
        "request {}: prompt {} tokens ({} cached, {} processed), first token after {:.3} s, {} generated ({:.1} tokens/s), {end}",
        a.id,
        u.prompt_tokens,
        u.cached_tokens,
        u.prompt_tokens - u.cached_tokens,
        ttft,
        u.completion_tokens,
        tps
    );
}

/// Samples the next token of `a` from `logits` and streams its text.
fn sample(a: &mut Active, tok: &Tokenizer, logits: &[f32]) -> Outcome {
    let t = a.sampler.sample(logits);
    if a.first_token.is_none() {
        a.first_token = Some(Instant::now());
    }
    if a.stop_at_eos && tok.is_eog(t) {
        return Outcome::Finished(FinishReason::Stop, true);
    }
    a.sampler.accept(t);
    a.usage.completion_tokens += 1;
    let (text, hit) = a.stops.push(&a.decoder.push(tok, t));
    if !text.is_empty() && a.events.send(Event::Text(text)).is_err() {
        return Outcome::Gone;
    }
    if hit {
        return Outcome::Finished(FinishReason::Stop, false);
    }
    if a.usage.completion_tokens >= a.max_tokens {
        return Outcome::Finished(FinishReason::Length, true);
    }
    a.next = Some(t);
    Outcome::Continue
}

#[cfg(test)]
mod tests {
    use super::*;

    fn piece(t: u32) -> &'static [u8] {
        // Token ids 1..=3: "a", "b", "\n"; 10: "ab"; 11: "\n\n"; 0: "".
        match t {
            1 => b"a",
            2 => b"b",
            3 => b"\n",
            10 => b"ab",
            11 => b"\n\n",
            _ => b"",
        }
    }

    #[test]
    fn text_alignment_reuses_held_tokens() {
        // Held: a b \n \n (the model's own tokens); the prompt re-tokenized
        // them as "ab" "\n\n", then goes on with "a".
        let held = [1, 2, 3, 3];
        let prompt = [10, 11, 1, 2];
        assert_eq!(
            align_by_text(&prompt, &held, 0, piece),
            Some((vec![1, 2, 3, 3, 1, 2], 4))
        );
        // Only the part that ends on a shared boundary is reused.
        let held = [1, 2, 3, 1];
        let prompt = [10, 11, 2];
        assert_eq!(
            align_by_text(&prompt, &held, 0, piece),
            Some((vec![1, 2, 11, 2], 2))
        );
        // Identical tokens: nothing to gain; a different text: nothing.
        assert_eq!(align_by_text(&[1, 2, 3], &[1, 2, 3], 2, piece), None);
        assert_eq!(align_by_text(&[1, 2, 2], &[1, 3, 3], 1, piece), None);
        // The prompt's last token is never taken from the cache.
        assert_eq!(align_by_text(&[1, 11], &[1, 3, 3], 1, piece), None);
    }
}
