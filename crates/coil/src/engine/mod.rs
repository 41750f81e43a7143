//! Layer 4: the engine a Rust user embeds — a loaded model, its memory and a
//! thread pool; feeding tokens of sequences through micro-batches.

pub mod constraint;
pub mod cuts;
pub mod draft;
mod draft_model;
pub mod dry;
pub mod generate;
pub mod imatrix;
pub mod kld;
pub mod logprobs;
pub mod nucleus;
pub mod sampling;
pub mod speculative;
pub mod top_k;
mod weights_memory;

pub use weights_memory::WeightMemory;

use crate::memory::session::{self, SessionError};
use crate::memory::{CacheType, CheckpointPolicy, Memory, SeqId, SequenceMemory, StateType};
use crate::models::{self, LogitRows, Model, ModelError, SeqChunk, UBatch};
use coil_gguf::{GgufError, GgufFile};
use coil_kernels::{Invariance, Layout, ThreadPool};
use std::path::Path;
use std::sync::Arc;

#[derive(Debug, thiserror::Error)]
pub enum EngineError {
    #[error(transparent)]
    Gguf(#[from] GgufError),
    #[error(transparent)]
    Model(#[from] ModelError),
    #[error(transparent)]
    Memory(#[from] crate::memory::MemoryError),
    #[error(transparent)]
    Constraint(#[from] constraint::ConstraintError),
    #[error("{0}")]
    Invalid(String),
}

/// What a rollback did.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct RollbackStats {
    pub from: usize,
    pub to: usize,
    /// Tokens re-processed from the restored checkpoint.
    pub replayed: usize,
    pub secs: f64,
}

/// Rollbacks are logged to stderr when `COIL_LOG=rollback` (or `all`).
fn log_rollback(s: &RollbackStats, seq: SeqId) {
    let on = std::env::var("COIL_LOG").is_ok_and(|v| v.contains("rollback") || v == "all");
    if on {
        eprintln!(
            "rollback: sequence {seq} from {} to {} tokens, replayed {} in {:.3} ms",
            s.from,
            s.to,
            s.replayed,
            s.secs * 1e3
        );
    }
}

/// One sequence's part of a [`Engine::decode_batch`] call.
#[derive(Clone, Copy, Debug)]
pub struct BatchEntry<'a> {
    pub seq: SeqId,
    pub tokens: &'a [u32],
    pub logits: LogitRows,
}

/// How [`Engine::decode_batch_with`] computes a micro-batch.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Numerics {
    /// The fastest kernels for the micro-batch's size (a GEMM for the
    /// weight products of many tokens, chunked scans for long chunks):
    /// equal to token-at-a-time decoding up to f32 rounding. For prompts.
    #[default]
    Fast,
    /// Batch-invariant wherever that costs no speed (what `coil serve`
    /// runs prompts with): as [`Numerics::BatchInvariant`], except that the
    /// weight products whose GEMM does not give each token its one-token
    /// bits take that GEMM, and that the Mamba-2, Gated DeltaNet and KDA
    /// mixers take their chunked forms at every length
    /// (`coil_kernels::Invariance::Cheap`), the engine cutting micro-batches
    /// at multiples of their chunk ([`Engine::scan_chunk`]) so that chunks
    /// lie at fixed positions of each sequence (token by token, a
    /// mamba2-370m-like prompt takes ~1.5× as long). Batch-invariant where
    /// [`Engine::prompts_invariant`] says so: bit for bit `BatchInvariant`
    /// for a model without chunked recurrences; for one with them, the
    /// same bits however the prompt shares and is cut into calls that
    /// start at multiples of the chunk (or resume where
    /// [`Engine::resume_point`] allows).
    CheapInvariant,
    /// Batch-invariant: every entry's logits and state are bit for bit
    /// those of feeding its tokens one at a time with the sequence alone,
    /// whatever else shares the call (see [`UBatch::invariance`]). For
    /// speculative verification and batched decoding, where a greedy
    /// output must not depend on the batch. Slower than `Fast` for long
    /// chunks (no chunked scan; no GEMM but where it keeps tokens), the
    /// same speed for a token each.
    BatchInvariant,
}

#[derive(Clone, Debug)]
pub struct EngineOptions {
    /// Worker threads (default: physical cores).
    pub n_threads: usize,
    /// Sequences the memory holds at once.
    pub n_seq_max: usize,
    /// Most tokens one sequence may hold.
    pub n_ctx: usize,
    /// Most tokens per micro-batch.
    pub n_ubatch: usize,
    /// Recurrent-state checkpoints for rollback.
    pub checkpoints: CheckpointPolicy,
    /// Where the weights live (a map of the file, or read into huge pages).
    pub weights: WeightMemory,
    /// Rewrite the Q6_K matrices at load into the AVX-512 rows-in-lanes
    /// layout ([`crate::models::weights::repack_for_kernels`]), which
    /// several tokens per step — sequences decoding together, speculative
    /// verification — run fastest on (Q4_K, Q5_K and Q8_0 are rewritten either
    /// way). With the weights in huge pages one token per step runs Q6_K
    /// faster on the file's layout (kernel bench 32.6–34.9 GB/s against
    /// 30.7–33.5; qwen35-0.8b-like Q4_K_M, whose output head is Q6_K, ~7%
    /// faster decoding; see docs/PERFORMANCE.md, "Weight memory and layout"),
    /// so `coil run` and `coil bench` without `--parallel` or `--spec`
    /// leave Q6_K as in the file. Off, or with `n_seq_max` 1 (speculative
    /// decoding's verification, prompt-only tools), the pool runs one
    /// sequence at a time ([`ThreadPool::set_single_stream`]): F16 / BF16
    /// weights take the 256-bit products at the AVX-512 level (one token
    /// 5–16% faster on an Intel host, eight at once ~18% slower) and Q8_0 at
    /// the AVX2 level its row-at-a-time products (one token 5–20% faster on
    /// an AMD Zen 3). One sequence's products then have the same kernels
    /// with and without `--spec`, so speculation cannot change a sampled
    /// token through them.
    pub batched_layout: bool,
    /// Also keep the memory the model's first NextN / MTP block drafts
    /// from ([`crate::models::Model::new_memory_nextn`]): every pass then
    /// gives the block's attention cells too (a few positions' cells wait
    /// until drafting needs them), and [`Engine::draft_nextn`]
    /// drafts (`--spec mtp`). Loading fails with a clear error on a model
    /// without such a block.
    pub nextn: bool,
}

impl Default for EngineOptions {
    fn default() -> Self {
        EngineOptions {
            n_threads: ThreadPool::default_threads(),
            n_seq_max: 1,
            n_ctx: 4096,
            n_ubatch: 512,
            checkpoints: CheckpointPolicy::default(),
            weights: WeightMemory::default(),
            batched_layout: true,
            nextn: false,
        }
    }
}

pub struct Engine {
    pub file: Arc<GgufFile>,
    pub model: Box<dyn Model>,
    pub mem: Memory,
    pub pool: ThreadPool,
    pub opts: EngineOptions,
    /// A logits buffer handed back by [`Engine::recycle`], written by the
    /// next pass instead of a fresh one.
    spare: Vec<f32>,
    /// See [`Engine::scan_chunk`].
    scan_chunk: Option<usize>,
}

/// The chunk length of the model's chunked recurrences (see
/// [`Engine::scan_chunk`]): the least common multiple of its layers'.
fn model_scan_chunk(model: &dyn Model) -> Option<usize> {
    use crate::models::blocks::{gated_delta_mixer, kda_mixer};
    use crate::models::plan::Mixer;
    fn gcd(a: usize, b: usize) -> usize {
        if b == 0 {
            a
        } else {
            gcd(b, a % b)
        }
    }
    let mut c: Option<usize> = None;
    for l in &model.info().plan.layers {
        let k = match l.mixer {
            Mixer::Mamba2 | Mixer::AttentionParallelMamba2 | Mixer::SharedBlockMamba2 => {
                coil_kernels::ops::ssm::ssd::DEFAULT_CHUNK
            }
            Mixer::GatedDeltaNet => gated_delta_mixer::chunk_len(),
            Mixer::Kda => kda_mixer::chunk_len(),
            _ => continue,
        };
        c = Some(c.map_or(k, |c| c / gcd(c, k) * k));
    }
    c
}

/// How many of the `left` tokens an entry of a sequence at `pos` takes into
/// a [`Numerics::CheapInvariant`] micro-batch of a model whose chunked
/// recurrences have chunks of `c` (see [`Engine::scan_chunk`]), `take`
/// being what the budget allows (`first`: the micro-batch is still
/// empty). A piece ends at a multiple of `c` unless it ends the entry, so
/// that the next call starts on a chunk boundary of the sequence; more
/// than the budget (less than `c` more) where the micro-batch would
/// otherwise hold nothing, 0 where the entry waits for the next one. An
/// entry from an aligned position that ends past one more boundary stops
/// at that boundary first (the second value: true), so that a checkpoint
/// lands there, from which a longer prompt continues.
fn aligned_take(pos: usize, take: usize, left: usize, c: usize, first: bool) -> (usize, bool) {
    let a = (pos + take) / c * c;
    if take == left {
        if pos.is_multiple_of(c) && a > pos && a < pos + take {
            return (a - pos, true);
        }
        return (take, false);
    }
    if a > pos {
        return (a - pos, false);
    }
    if first {
        return ((c - pos % c).min(left), false);
    }
    (0, false)
}

/// The memory `opts` ask of `model` (with the NextN block's or without),
/// its checkpoint policy set.
fn new_memory(model: &dyn Model, opts: &EngineOptions) -> Result<Memory, EngineError> {
    let mut mem = match opts.nextn {
        false => model.new_memory(opts.n_seq_max, opts.n_ctx),
        true => model
            .new_memory_nextn(opts.n_seq_max, opts.n_ctx)
            .ok_or(ModelError::NoNextn)?,
    };
    if let Some(r) = &mut mem.recurrent {
        r.policy = opts.checkpoints;
    }
    Ok(mem)
}

/// Logits buffers up to this many values are kept for reuse (64 MB: an
/// 8-sequence step on a 248k-token vocabulary is 8 MB); a whole prompt's
/// rows are freed.
const SPARE_MAX: usize = 16 << 20;

/// The logits of one [`Engine::decode_batch_logits`] call, stacked: entry
/// `i`'s rows are `rows(i)` (`[rows, n_vocab]`).
#[derive(Debug, Default)]
pub struct BatchLogits {
    data: Vec<f32>,
    n_vocab: usize,
    /// Entry `i`'s rows: `starts[i]..starts[i + 1]`.
    starts: Vec<usize>,
}

impl BatchLogits {
    /// Entry `i`'s logits rows (empty for an entry that asked for none).
    pub fn rows(&self, i: usize) -> &[f32] {
        &self.data[self.starts[i] * self.n_vocab..self.starts[i + 1] * self.n_vocab]
    }

    /// Entries.
    pub fn len(&self) -> usize {
        self.starts.len().saturating_sub(1)
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// One vector per entry (one entry: the buffer itself, no copy).
    pub fn into_vecs(mut self) -> Vec<Vec<f32>> {
        if self.len() == 1 {
            self.data.truncate(self.starts[1] * self.n_vocab);
            return vec![self.data];
        }
        (0..self.len()).map(|i| self.rows(i).to_vec()).collect()
    }
}

impl Engine {
    pub fn load(path: impl AsRef<Path>, opts: EngineOptions) -> Result<Engine, EngineError> {
        let mut file = weights_memory::open(path.as_ref(), opts.weights)?;
        // One token per step: Q6_K decodes faster as in the file; Q4_K and
        // Q8_0 as fast in the layout, and their prompts skip the unpacking.
        crate::models::weights::repack_for_kernels_where(&mut file, |ty| {
            opts.batched_layout || ty != coil_gguf::GgmlType::Q6_K
        });
        Self::from_file(Arc::new(file), opts)
    }

    /// Where the weights are, in words: read into memory
    /// ([`WeightMemory::Auto`] took huge pages) or mapped from the file.
    pub fn weights_where(&self) -> &'static str {
        if self.file.is_read_into_memory() {
            "read into memory (transparent huge pages)"
        } else {
            "mapped from the file"
        }
    }

    pub fn from_file(file: Arc<GgufFile>, opts: EngineOptions) -> Result<Engine, EngineError> {
        if opts.n_ubatch == 0 || opts.n_ctx == 0 || opts.n_seq_max == 0 || opts.n_threads == 0 {
            return Err(EngineError::Invalid(
                "threads, sequences, context and micro-batch size must be at least 1".into(),
            ));
        }
        let model = models::load(file.clone())?;
        let mem = new_memory(model.as_ref(), &opts)?;
        let scan_chunk = model_scan_chunk(model.as_ref());
        let pool = ThreadPool::new(opts.n_threads);
        pool.set_single_stream(!opts.batched_layout || opts.n_seq_max == 1);
        Ok(Engine {
            file,
            model,
            mem,
            pool,
            opts,
            spare: Vec::new(),
            scan_chunk,
        })
    }

    /// Stores the recurrent SSM states as `ty` from now on (`Bf16`: half
    /// the state's memory and per-token traffic, computed in f32; the
    /// logits move a little from the f32 default). Forgets every sequence.
    pub fn set_state_type(&mut self, ty: StateType) {
        let mem = std::mem::replace(&mut self.mem, Memory::new(None, None, 1, 1));
        self.mem = mem.with_state_type(ty);
    }

    /// Stores the attention cells as `ty` from now on (`F16`: half the
    /// bytes per token, attention computed in f32). Forgets every sequence.
    pub fn set_cache_type(&mut self, ty: CacheType) {
        let mem = std::mem::replace(&mut self.mem, Memory::new(None, None, 1, 1));
        self.mem = mem.with_cache_type(ty);
    }

    /// Sets the context to `n_ctx` tokens per sequence (new memory with
    /// the same state and cell types and checkpoint policy). Forgets every
    /// sequence.
    pub fn set_context(&mut self, n_ctx: usize) -> Result<(), EngineError> {
        if n_ctx == 0 {
            return Err(EngineError::Invalid("context must be at least 1".into()));
        }
        self.remake_memory(EngineOptions {
            n_ctx,
            ..self.opts.clone()
        })
    }

    /// Keeps (or drops) the memory the model's NextN / MTP block drafts
    /// from from now on ([`EngineOptions::nextn`]); the state and cache
    /// types and the checkpoint policy stay. Forgets every sequence.
    pub fn set_nextn(&mut self, on: bool) -> Result<(), EngineError> {
        if on == self.opts.nextn {
            return Ok(());
        }
        self.remake_memory(EngineOptions {
            nextn: on,
            ..self.opts.clone()
        })
    }

    /// A new memory for `opts`, with the state and cell types and the
    /// checkpoint policy of the one it replaces.
    fn remake_memory(&mut self, opts: EngineOptions) -> Result<(), EngineError> {
        let state = self.mem.recurrent.as_ref().map(|r| r.state_type());
        let cells = self.mem.kv.as_ref().map(|k| k.cache_type());
        let mut mem = new_memory(self.model.as_ref(), &opts)?;
        if let (Some(r), Some(old)) = (&mut mem.recurrent, &self.mem.recurrent) {
            r.policy = old.policy;
        }
        if let Some(ty) = state.filter(|&t| t != StateType::F32) {
            mem = mem.with_state_type(ty);
        }
        if let Some(ty) = cells.filter(|&t| t != CacheType::F32) {
            mem = mem.with_cache_type(ty);
        }
        self.mem = mem;
        self.opts = opts;
        Ok(())
    }

    /// Forgets every sequence.
    pub fn mem_clear(&mut self) {
        for s in 0..self.mem.n_seq_max() {
            // In range by construction.
            let _ = self.mem.seq_clear(s);
        }
    }

    /// Whether [`Numerics::CheapInvariant`] is batch-invariant for this
    /// model at the running SIMD level: every weight matrix is in a format
    /// whose products give each token its one-token bits whatever the
    /// number of tokens ([`coil_kernels::matmul::keeps_tokens`]: Q4_K and
    /// Q6_K at the AVX2 level, and in a batched engine Q5_K and the 32-value
    /// formats Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, IQ4_NL; at AVX-512 the Q4_K,
    /// Q5_K, Q6_K and Q8_0 matrices the loader rewrote into rows in lanes), and, for a
    /// model with chunked recurrences (Mamba-2, Gated DeltaNet, KDA), the
    /// recurrent state is f32 (a bf16 state is rounded at the end of each
    /// call). A prompt's logits and state are then the same bits however
    /// its sequence shares micro-batches, however its prompt is cut into
    /// calls at multiples of [`Engine::scan_chunk`] (the engine cuts its
    /// micro-batches there itself), and wherever a resume starts that
    /// [`Engine::resume_point`] allows: bit for bit
    /// [`Numerics::BatchInvariant`] for a model without chunked
    /// recurrences; with them, the chunked forms with chunks at fixed
    /// positions of the sequence (multiples of the chunk from position 0).
    pub fn prompts_invariant(&self) -> bool {
        if self.scan_chunk.is_some()
            && self
                .mem
                .recurrent
                .as_ref()
                .is_some_and(|r| r.state_type() != StateType::F32)
        {
            return false;
        }
        let single = self.pool.single_stream();
        // The matrices that are not weight products: convolution windows,
        // norm weights, per-head constants.
        let product = |name: &str| {
            !(name.contains("conv1d")
                || name.contains(".conv.")
                || name.contains("norm")
                || name.ends_with("ssm_a")
                || name.ends_with("ssm_d"))
        };
        // The token embeddings are rows looked up, and a product only as a
        // tied output head.
        let tied = self.file.tensor_info("output.weight").is_none();
        self.file
            .tensors()
            .iter()
            .filter(|t| t.dims.iter().filter(|&&d| d > 1).count() >= 2 && product(&t.name))
            .filter(|t| tied || t.name != "token_embd.weight")
            .all(|t| {
                let layout = if self.file.is_rewritten(t) {
                    Layout::Lanes16
                } else {
                    Layout::Rows
                };
                coil_kernels::matmul::keeps_tokens(t.ty, layout, single)
            })
    }

    pub fn n_vocab(&self) -> usize {
        self.model.info().n_vocab
    }

    /// The chunk length of the model's chunked recurrences (Mamba-2: 64,
    /// Gated DeltaNet and KDA: 16; the least common multiple where layers
    /// differ), `None` for a model without any. In a
    /// [`Numerics::CheapInvariant`] call every prompt entry of such a model
    /// takes the chunked forms at every length, chunks counted from the
    /// call's first token: a call that starts at a multiple of it, from a
    /// state that calls like it made (see
    /// [`crate::memory::RecurrentMemory::set_aligned`]), has its chunks at
    /// fixed positions of the sequence, and gives the bits of the prompt
    /// processed in one call. The engine cuts the micro-batches of such a
    /// call at multiples of it only (and, where an entry from a multiple
    /// ends past another one, at the last one first, which takes a
    /// checkpoint there).
    pub fn scan_chunk(&self) -> Option<usize> {
        self.scan_chunk
    }

    /// Whether a [`Numerics::CheapInvariant`] prompt call may start from a
    /// recurrent state at `pos` (`aligned`: its flag, see
    /// [`crate::memory::RecurrentMemory::set_aligned`]) and give the bits of
    /// the prompt processed from position 0, when the prompt's calls end at
    /// `end`: always for a model without chunked recurrences; else an
    /// aligned state at a multiple of [`Engine::scan_chunk`], or at `end`
    /// itself (nothing is left to process).
    pub fn resumable(&self, pos: usize, aligned: bool, end: usize) -> bool {
        match self.scan_chunk {
            None => true,
            Some(c) => aligned && (pos.is_multiple_of(c) || pos == end),
        }
    }

    /// The furthest position at or before `len` that sequence `seq` can be
    /// rolled back to with nothing replayed ([`Engine::seq_truncate`]: its
    /// length, or a recurrent checkpoint) from which a
    /// [`Numerics::CheapInvariant`] prompt ending at `end` continues
    /// batch-invariantly ([`Engine::resumable`]); 0 where none is.
    /// Attention-only memory is cut anywhere: `len` (at most the length).
    pub fn resume_point(&self, seq: SeqId, len: usize, end: usize) -> usize {
        let have = self.mem.seq_len(seq).unwrap_or(0);
        let Some(r) = &self.mem.recurrent else {
            return len.min(have);
        };
        if len >= have && self.resumable(have, r.aligned(seq).unwrap_or(false), end) {
            return have;
        }
        r.checkpoints(seq)
            .unwrap_or_default()
            .iter()
            .filter(|c| c.pos <= len && self.resumable(c.pos, c.aligned, end))
            .map(|c| c.pos)
            .max()
            .unwrap_or(0)
    }

    /// Decodes tokens of several sequences in one call: each entry appends
    /// its tokens to its sequence (a prompt for one, single tokens for
    /// others). The work is split into micro-batches of at most `n_ubatch`
    /// tokens, each holding every sequence at most once. Returns, per entry,
    /// the logits rows it asked for (`[rows, n_vocab]`). Everything is
    /// checked before anything runs: a bad entry changes no sequence.
    ///
    /// A sequence under speculative verification (see
    /// [`Engine::spec_verify`]) is not cut at checkpoint positions and takes
    /// no checkpoint (its commit takes what the policy asks for at the kept
    /// length), and a micro-batch holding one runs with
    /// [`Numerics::BatchInvariant`].
    pub fn decode_batch(&mut self, entries: &[BatchEntry]) -> Result<Vec<Vec<f32>>, EngineError> {
        self.decode_batch_with(entries, Numerics::Fast)
    }

    /// [`Engine::decode_batch`] with the given [`Numerics`]. With
    /// [`Numerics::BatchInvariant`] each entry's logits rows are bit for bit
    /// those of [`Engine::eval`]`(seq, tokens, rows, 1)` on the sequence
    /// alone: what a speculative verification of k drafted tokens needs to
    /// reproduce plain greedy decoding exactly.
    pub fn decode_batch_with(
        &mut self,
        entries: &[BatchEntry],
        numerics: Numerics,
    ) -> Result<Vec<Vec<f32>>, EngineError> {
        Ok(self.decode_batch_logits(entries, numerics)?.into_vecs())
    }

    /// [`Engine::decode_batch_with`] with the logits in one buffer: where
    /// the call runs as one micro-batch (a decode step), the model's output
    /// as it is, with no copy per entry. Give it back with
    /// [`Engine::recycle`] once read, and the next call writes into it.
    pub fn decode_batch_logits(
        &mut self,
        entries: &[BatchEntry],
        numerics: Numerics,
    ) -> Result<BatchLogits, EngineError> {
        let n_vocab = self.n_vocab();
        for (i, e) in entries.iter().enumerate() {
            if entries[..i].iter().any(|o| o.seq == e.seq) {
                return Err(EngineError::Invalid(format!(
                    "sequence {} appears twice in one batch",
                    e.seq
                )));
            }
            let pos = self.mem.seq_len(e.seq)?;
            self.mem.check_append(e.seq, pos, e.tokens.len())?;
            if let Some(&t) = e.tokens.iter().find(|&&t| t as usize >= n_vocab) {
                return Err(EngineError::Invalid(format!(
                    "token id {t} is outside the vocabulary of {n_vocab}"
                )));
            }
        }
        let mut done = vec![0usize; entries.len()];
        // Per entry, its rows from the micro-batches so far; the first
        // micro-batch's buffer is kept whole when it turns out to be the
        // only one.
        let mut out: Vec<Vec<f32>> = vec![Vec::new(); entries.len()];
        let mut first: Option<(Vec<f32>, Vec<usize>, Vec<usize>)> = None;
        // Chunk boundaries at fixed positions of each sequence (see
        // `scan_chunk`).
        let align = match numerics {
            Numerics::CheapInvariant => self.scan_chunk,
            _ => None,
        };
        loop {
            let mut budget = self.opts.n_ubatch;
            let mut chunks = Vec::new();
            let mut owners = Vec::new();
            // Entries cut where a checkpoint must land (see `aligned_take`).
            let mut marks = Vec::new();
            for (i, e) in entries.iter().enumerate() {
                let left = e.tokens.len() - done[i];
                if left == 0 || budget == 0 {
                    continue;
                }
                let mut take = left.min(budget);
                // End the micro-batch on the next periodic checkpoint position.
                let verify = self.mem.spec_base(e.seq).is_some();
                if let (false, Some(k)) = (verify, self.mem.tokens_to_checkpoint(e.seq)?) {
                    take = take.min(k);
                }
                if let (false, Some(c)) = (verify, align) {
                    let pos = self.mem.seq_len(e.seq)?;
                    let first = chunks.is_empty();
                    let (t, mark) = aligned_take(pos, take, left, c, first);
                    if t == 0 {
                        continue;
                    }
                    if mark {
                        marks.push(e.seq);
                    }
                    take = t;
                }
                budget = budget.saturating_sub(take);
                let part = &e.tokens[done[i]..done[i] + take];
                let is_end = done[i] + take == e.tokens.len();
                let logits = match e.logits {
                    LogitRows::All => LogitRows::All,
                    LogitRows::Last if is_end => LogitRows::Last,
                    _ => LogitRows::None,
                };
                chunks.push(SeqChunk {
                    seq: e.seq,
                    pos: self.mem.seq_len(e.seq)?,
                    tokens: part,
                    logits,
                });
                owners.push(i);
                done[i] += take;
            }
            if chunks.is_empty() {
                break;
            }
            let rows: Vec<usize> = chunks.iter().map(|c| c.n_logit_rows()).collect();
            let verifying = chunks.iter().any(|c| self.mem.spec_base(c.seq).is_some());
            let ub = UBatch {
                chunks,
                invariance: match numerics {
                    _ if verifying => Invariance::Full,
                    Numerics::Fast => Invariance::Off,
                    Numerics::CheapInvariant => Invariance::Cheap,
                    Numerics::BatchInvariant => Invariance::Full,
                },
            };
            // Whether each sequence's state stays one of aligned chunked
            // calls (see `RecurrentMemory::set_aligned`), read before the
            // pass moves it on.
            let aligned: Vec<(SeqId, bool)> = match &self.mem.recurrent {
                None => Vec::new(),
                Some(r) => ub
                    .chunks
                    .iter()
                    .map(|c| {
                        let ok = ub.invariance == Invariance::Cheap
                            && align.is_some_and(|a| c.pos.is_multiple_of(a))
                            && r.aligned(c.seq)?;
                        Ok((c.seq, ok))
                    })
                    .collect::<Result<_, crate::memory::MemoryError>>()?,
            };
            let mut logits = std::mem::take(&mut self.spare);
            self.model
                .forward(&self.pool, &ub, &mut self.mem, &mut logits)?;
            if let Some(r) = &mut self.mem.recurrent {
                for &(seq, ok) in &aligned {
                    r.set_aligned(seq, ok)?;
                }
            }
            for &i in &owners {
                let e = &entries[i];
                if self.mem.spec_base(e.seq).is_some() {
                    if let Some(r) = &mut self.mem.recurrent {
                        r.settle(e.seq)?;
                    }
                } else {
                    self.mem
                        .after_ubatch(e.seq, done[i] == e.tokens.len(), e.tokens.len())?;
                    if let (true, Some(r)) = (marks.contains(&e.seq), &mut self.mem.recurrent) {
                        r.checkpoint(e.seq)?;
                    }
                }
            }
            match first.take() {
                None if out.iter().all(Vec::is_empty) => first = Some((logits, owners, rows)),
                prev => {
                    // More than one micro-batch: gathered per entry.
                    if let Some((l, o, r)) = prev {
                        self.spread(&l, &o, &r, &mut out);
                        self.recycle_buf(l);
                    }
                    self.spread(&logits, &owners, &rows, &mut out);
                    self.recycle_buf(logits);
                }
            }
        }
        let mut starts = vec![0];
        if let Some((data, owners, rows)) = first {
            // One micro-batch: every entry at most once, in entry order.
            let mut per = vec![0usize; entries.len()];
            for (&i, &r) in owners.iter().zip(&rows) {
                per[i] = r;
            }
            for r in per {
                starts.push(starts[starts.len() - 1] + r);
            }
            return Ok(BatchLogits {
                data,
                n_vocab,
                starts,
            });
        }
        let mut data = Vec::with_capacity(out.iter().map(Vec::len).sum());
        for o in &out {
            data.extend_from_slice(o);
            starts.push(data.len() / n_vocab.max(1));
        }
        Ok(BatchLogits {
            data,
            n_vocab,
            starts,
        })
    }

    /// Appends each owner's rows of one micro-batch's `logits` to its entry.
    fn spread(&self, logits: &[f32], owners: &[usize], rows: &[usize], out: &mut [Vec<f32>]) {
        let n_vocab = self.n_vocab();
        let mut at = 0;
        for (&i, &r) in owners.iter().zip(rows) {
            out[i].extend_from_slice(&logits[at * n_vocab..(at + r) * n_vocab]);
            at += r;
        }
    }

    /// Hands a [`BatchLogits`] back: the next call writes its logits into
    /// this buffer (kept up to 64 MB) instead of a fresh one.
    pub fn recycle(&mut self, logits: BatchLogits) {
        self.recycle_buf(logits.data);
    }

    fn recycle_buf(&mut self, buf: Vec<f32>) {
        if buf.capacity() <= SPARE_MAX && buf.capacity() > self.spare.capacity() {
            self.spare = buf;
        }
    }

    /// Appends `tokens` to sequence `seq`, `ubatch` tokens per micro-batch
    /// at most (0: the engine's default), and returns the logits asked for:
    /// `[tokens.len(), n_vocab]` for `All`, `[1, n_vocab]` for `Last`.
    pub fn eval(
        &mut self,
        seq: SeqId,
        tokens: &[u32],
        rows: LogitRows,
        ubatch: usize,
    ) -> Result<Vec<f32>, EngineError> {
        let saved = self.opts.n_ubatch;
        if ubatch > 0 {
            self.opts.n_ubatch = ubatch;
        }
        let entry = BatchEntry {
            seq,
            tokens,
            logits: rows,
        };
        let out = self.decode_batch(&[entry]);
        self.opts.n_ubatch = saved;
        Ok(out?.pop().unwrap_or_default())
    }

    /// Rolls sequence `seq` back to position `p` (drops positions ≥ p):
    /// restores the newest recurrent checkpoint at or before `p` and
    /// replays the tokens from there. Exact: the state equals that of a
    /// sequence that only ever saw the first `p` tokens.
    pub fn seq_truncate(&mut self, seq: SeqId, p: usize) -> Result<RollbackStats, EngineError> {
        self.seq_truncate_with(seq, p, Numerics::Fast)
    }

    /// [`Engine::seq_truncate`] replaying with the given [`Numerics`]. With
    /// [`Numerics::BatchInvariant`] the replayed positions get bit for bit
    /// the state of decoding them one at a time (a rejected speculative
    /// draft rolled back inside its verification batch leaves the state
    /// plain greedy decoding has); `Fast` replays them like a prompt.
    pub fn seq_truncate_with(
        &mut self,
        seq: SeqId,
        p: usize,
        numerics: Numerics,
    ) -> Result<RollbackStats, EngineError> {
        let t0 = std::time::Instant::now();
        let from = self.mem.seq_len(seq)?;
        let replay = self.mem.rollback(seq, p)?;
        if !replay.is_empty() {
            let entry = BatchEntry {
                seq,
                tokens: &replay,
                logits: LogitRows::None,
            };
            self.decode_batch_with(&[entry], numerics)?;
        }
        let stats = RollbackStats {
            from,
            to: p.min(from),
            replayed: replay.len(),
            secs: t0.elapsed().as_secs_f64(),
        };
        log_rollback(&stats, seq);
        Ok(stats)
    }

    /// Makes `dst` a copy of `src`; they then evolve independently
    /// (checkpoints are shared, not copied).
    pub fn seq_fork(&mut self, src: SeqId, dst: SeqId) -> Result<(), EngineError> {
        Ok(self.mem.seq_fork(src, dst)?)
    }

    /// A fingerprint of the model file (its header: architecture, metadata,
    /// tensor table; every part's, for a split model) that session files
    /// carry.
    pub fn model_identity(&self) -> u64 {
        let h = self
            .file
            .headers()
            .fold(session::FNV_OFFSET, |h, header| session::fnv1a(header, h));
        session::fnv1a(&self.file.file_len().to_le_bytes(), h)
    }

    /// Saves sequence `seq` (tokens, recurrent state, checkpoints, attention
    /// cells) to `path`, atomically (temporary file, then rename).
    /// The NextN block's waiting cells are written first (the file holds
    /// every cell of every position).
    pub fn save_session(&mut self, seq: SeqId, path: &Path) -> Result<(), SessionError> {
        self.nextn_catch_up(&[seq])
            .map_err(|e| SessionError::Unsynced(e.to_string()))?;
        let mut tmp = path.as_os_str().to_owned();
        tmp.push(".partial");
        let tmp = std::path::PathBuf::from(tmp);
        let result = (|| {
            let f = std::fs::File::create(&tmp)?;
            let mut w = std::io::BufWriter::new(f);
            session::save(&self.mem, seq, self.model_identity(), &mut w)?;
            let f = w.into_inner().map_err(|e| e.into_error())?;
            f.sync_all()?;
            std::fs::rename(&tmp, path)?;
            Ok(())
        })();
        if result.is_err() {
            let _ = std::fs::remove_file(&tmp);
        }
        result
    }

    /// Loads a session saved by [`Engine::save_session`] into `seq`. On any
    /// error (truncated, corrupted, another model's) the memory is untouched.
    pub fn load_session(&mut self, seq: SeqId, path: &Path) -> Result<(), SessionError> {
        let f = std::fs::File::open(path)?;
        let id = self.model_identity();
        session::load(&mut self.mem, seq, id, &mut std::io::BufReader::new(f))
    }

    /// Greedy drafts of the model's first NextN / MTP block (the engine
    /// loaded with [`EngineOptions::nextn`]): for each `(seq, token, k)`
    /// with `token` just sampled for `seq` and not yet fed, up to `k`
    /// tokens that may follow it, all sequences side by side. Nothing of
    /// the sequences changes.
    pub fn draft_nextn(
        &mut self,
        seqs: &[(SeqId, u32, usize)],
    ) -> Result<Vec<Vec<u32>>, EngineError> {
        if seqs.iter().all(|s| s.2 == 0) {
            return Ok(vec![Vec::new(); seqs.len()]);
        }
        Ok(self.model.draft_nextn(&self.pool, &mut self.mem, seqs)?)
    }

    /// Writes the NextN block's cells that still wait for `seqs` (see
    /// [`crate::models::Model::nextn_catch_up`]; drafting does it itself).
    pub fn nextn_catch_up(&mut self, seqs: &[SeqId]) -> Result<(), EngineError> {
        Ok(self.model.nextn_catch_up(&self.pool, &mut self.mem, seqs)?)
    }

    /// [`Engine::draft_nextn`] of one sequence, with the logits each draft
    /// came from (`[drafts, n_vocab]`).
    pub fn draft_nextn_logits(
        &mut self,
        seq: SeqId,
        token: u32,
        k: usize,
    ) -> Result<(Vec<u32>, Vec<f32>), EngineError> {
        Ok(self
            .model
            .draft_nextn_logits(&self.pool, &mut self.mem, seq, token, k)?)
    }

    /// Forgets sequence `seq`.
    pub fn seq_clear(&mut self, seq: SeqId) -> Result<(), EngineError> {
        Ok(self.mem.seq_clear(seq)?)
    }
}
