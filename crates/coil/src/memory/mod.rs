//! Layer 2: per-sequence memory. Attention layers keep KV cells (one per
//! token); recurrent layers keep a fixed-size state slot per sequence (conv
//! window + SSM state). A layer of one kind takes no memory of the other.

pub mod kv;
pub mod pages;
pub mod recurrent;
pub mod session;
pub mod state_pool;

pub use coil_kernels::ops::state_elem::{StateMut, StateRef, StateType};
pub use kv::{CacheType, KvLayerShape, KvMemory, UnknownCacheType};
pub use recurrent::{
    Checkpoint, CheckpointPolicy, LayerState, MovingState, RecurrentLayerShape, RecurrentMemory,
    RecurrentState,
};

/// A sequence's index in a memory (0..n_seq_max).
pub type SeqId = usize;

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum MemoryError {
    #[error("sequence {seq} is out of range: this memory holds {n_seq_max} sequences (raise --parallel)")]
    SeqOutOfRange { seq: SeqId, n_seq_max: usize },
    #[error(
        "sequence {seq} would grow to {len} tokens, beyond the context size {n_ctx} (raise --ctx)"
    )]
    ContextFull {
        seq: SeqId,
        len: usize,
        n_ctx: usize,
    },
    #[error("sequence {seq} is at position {have}, but the batch starts at {want}")]
    PositionMismatch {
        seq: SeqId,
        have: usize,
        want: usize,
    },
    #[error("cannot truncate sequence {seq} to position {pos} (it holds {len}): recurrent state cannot go back without rollback checkpoints")]
    CannotTruncate { seq: SeqId, pos: usize, len: usize },
    #[error("sequence {seq} appears twice in one batch")]
    DuplicateSeq { seq: SeqId },
    #[error("the recurrent state is stored as {have}, not {want}")]
    StateType { want: StateType, have: StateType },
}

/// The sequence operations every memory supports.
pub trait SequenceMemory {
    fn n_seq_max(&self) -> usize;
    /// Number of tokens sequence `s` holds (= its next position).
    fn seq_len(&self, s: SeqId) -> Result<usize, MemoryError>;
    /// Forgets everything of `s`.
    fn seq_clear(&mut self, s: SeqId) -> Result<(), MemoryError>;
    /// Drops positions ≥ `p` of `s`.
    fn seq_truncate(&mut self, s: SeqId, p: usize) -> Result<(), MemoryError>;
    /// Makes `dst` a copy of `src`.
    fn seq_fork(&mut self, src: SeqId, dst: SeqId) -> Result<(), MemoryError>;
    /// Clears every sequence but `s`.
    fn seq_keep(&mut self, s: SeqId) -> Result<(), MemoryError>;
    /// Positions held by `s` (empty range when it holds none).
    fn seq_pos_range(&self, s: SeqId) -> Result<std::ops::Range<usize>, MemoryError> {
        Ok(0..self.seq_len(s)?)
    }
    /// Bytes of state this memory holds.
    fn bytes(&self) -> usize;
}

/// The memory of one model: recurrent slots for recurrent layers (and, with
/// the hybrid architectures, KV cells for attention layers), sized from the
/// layer plan.
pub struct Memory {
    pub recurrent: Option<RecurrentMemory>,
    pub kv: Option<KvMemory>,
    /// Each sequence's tokens, for replaying after a rollback.
    tokens: Vec<Vec<u32>>,
    /// Per sequence, while a speculative verification runs on it: the
    /// position it started at.
    spec_base: Vec<Option<usize>>,
    n_seq_max: usize,
    n_ctx: usize,
}

impl Memory {
    pub fn new(
        recurrent: Option<RecurrentMemory>,
        kv: Option<KvMemory>,
        n_seq_max: usize,
        n_ctx: usize,
    ) -> Self {
        Memory {
            recurrent,
            kv,
            tokens: vec![Vec::new(); n_seq_max.max(1)],
            spec_base: vec![None; n_seq_max.max(1)],
            n_seq_max: n_seq_max.max(1),
            n_ctx,
        }
    }

    pub fn n_ctx(&self) -> usize {
        self.n_ctx
    }

    /// This memory, empty, with its recurrent SSM states stored as `ty`
    /// (see [`RecurrentMemory::with_state_type`]).
    pub fn with_state_type(self, ty: StateType) -> Self {
        let (n_seq_max, n_ctx) = (self.n_seq_max, self.n_ctx);
        let recurrent = self.recurrent.map(|r| r.with_state_type(ty));
        let mut kv = self.kv;
        if let Some(k) = &mut kv {
            for s in 0..n_seq_max {
                // In range by construction.
                let _ = k.seq_clear(s);
            }
        }
        Memory::new(recurrent, kv, n_seq_max, n_ctx)
    }

    /// This memory, empty, with its attention cells stored as `ty` (see
    /// [`KvMemory::with_cache_type`]).
    pub fn with_cache_type(self, ty: CacheType) -> Self {
        let (n_seq_max, n_ctx) = (self.n_seq_max, self.n_ctx);
        let kv = self.kv.map(|k| k.with_cache_type(ty));
        let mut recurrent = self.recurrent;
        if let Some(r) = &mut recurrent {
            for s in 0..n_seq_max {
                // In range by construction.
                let _ = r.seq_clear(s);
            }
        }
        Memory::new(recurrent, kv, n_seq_max, n_ctx)
    }

    /// How the attention cells are stored (f32 without any).
    pub fn cache_type(&self) -> CacheType {
        self.kv.as_ref().map_or(CacheType::F32, |k| k.cache_type())
    }

    /// How the recurrent SSM states are stored (f32 without any).
    pub fn state_type(&self) -> StateType {
        self.recurrent
            .as_ref()
            .map_or(StateType::F32, |r| r.state_type())
    }

    fn parts(&self) -> impl Iterator<Item = &dyn SequenceMemory> {
        let r = self.recurrent.iter().map(|r| r as &dyn SequenceMemory);
        r.chain(self.kv.iter().map(|k| k as &dyn SequenceMemory))
    }

    fn parts_mut(&mut self) -> impl Iterator<Item = &mut dyn SequenceMemory> {
        let r = self
            .recurrent
            .iter_mut()
            .map(|r| r as &mut dyn SequenceMemory);
        r.chain(self.kv.iter_mut().map(|k| k as &mut dyn SequenceMemory))
    }

    /// A line for logs: what this memory holds and may grow to.
    pub fn describe(&self) -> String {
        let mib = |b: usize| b as f64 / (1024.0 * 1024.0);
        let mut parts = Vec::new();
        if let Some(r) = &self.recurrent {
            let ty = match r.state_type() {
                StateType::F32 => String::new(),
                t => format!(", SSM state in {t}"),
            };
            parts.push(format!(
                "recurrent state {:.2} MiB ({:.2} MiB per sequence{ty})",
                mib(r.bytes()),
                mib(r.bytes_per_seq())
            ));
        }
        if let Some(k) = &self.kv {
            let st = k.page_stats();
            parts.push(format!(
                "KV cells {:.2} MiB in use ({:.2} MiB of it shared between sequences), up to {:.2} MiB ({} bytes per token{}{}, pages of {} positions)",
                mib(st.bytes),
                mib(st.shared_bytes),
                mib(k.max_bytes()),
                k.bytes_per_token(),
                match k.cache_type() {
                    CacheType::F32 => String::new(),
                    t => format!(" in {t}"),
                },
                match k.n_latent_layers() {
                    0 => String::new(),
                    n => format!("; {n} MLA layer(s) keep the compressed latent only"),
                },
                k.page_len()
            ));
        }
        format!(
            "{} for {} sequence(s) of up to {} tokens",
            parts.join(" + "),
            self.n_seq_max,
            self.n_ctx
        )
    }

    fn check(&self, s: SeqId) -> Result<(), MemoryError> {
        if s >= self.n_seq_max {
            return Err(MemoryError::SeqOutOfRange {
                seq: s,
                n_seq_max: self.n_seq_max,
            });
        }
        Ok(())
    }

    /// Checks that `n` tokens at `pos` can be appended to `s`.
    pub fn check_append(&self, s: SeqId, pos: usize, n: usize) -> Result<(), MemoryError> {
        let have = self.seq_len(s)?;
        if pos != have {
            return Err(MemoryError::PositionMismatch {
                seq: s,
                have,
                want: pos,
            });
        }
        if have + n > self.n_ctx {
            return Err(MemoryError::ContextFull {
                seq: s,
                len: have + n,
                n_ctx: self.n_ctx,
            });
        }
        Ok(())
    }

    /// Records that `tokens` of `s` went through every layer.
    pub fn advance(&mut self, s: SeqId, tokens: &[u32]) -> Result<(), MemoryError> {
        self.check(s)?;
        let n = tokens.len();
        if let Some(r) = &mut self.recurrent {
            r.advance(s, n)?;
        }
        if let Some(k) = &mut self.kv {
            k.advance(s, n)?;
        }
        self.tokens[s].extend_from_slice(tokens);
        Ok(())
    }

    /// Sets the token history of `s` (loading a session).
    pub(crate) fn set_tokens(&mut self, s: SeqId, tokens: Vec<u32>) -> Result<(), MemoryError> {
        self.check(s)?;
        self.tokens[s] = tokens;
        Ok(())
    }

    /// The tokens sequence `s` holds.
    pub fn seq_tokens(&self, s: SeqId) -> Result<&[u32], MemoryError> {
        self.check(s)?;
        Ok(&self.tokens[s])
    }

    /// After a micro-batch: takes a recurrent checkpoint of `s` when it sits
    /// on a periodic position, or at the end of a decode call of
    /// `call_tokens` tokens (a prompt; single tokens only with
    /// `CheckpointPolicy::every_call`, at multiples of its `call_spacing`).
    pub fn after_ubatch(
        &mut self,
        s: SeqId,
        call_end: bool,
        call_tokens: usize,
    ) -> Result<(), MemoryError> {
        if let Some(r) = &mut self.recurrent {
            r.settle(s)?;
            let len = r.seq_len(s)?;
            let k = r.policy.interval;
            let single = r.policy.every_call && len % r.policy.call_spacing.max(1) == 0;
            let at_end = call_end && (call_tokens > 1 || single);
            if at_end || (k > 0 && len % k == 0) {
                r.checkpoint(s)?;
            }
        }
        Ok(())
    }

    /// How many tokens `s` may take before it reaches its next periodic
    /// checkpoint position (micro-batches are cut there).
    pub fn tokens_to_checkpoint(&self, s: SeqId) -> Result<Option<usize>, MemoryError> {
        match &self.recurrent {
            Some(r) => r.tokens_to_next_period(s),
            None => Ok(None),
        }
    }

    /// Starts a speculative verification of `s` at its current length:
    /// the tokens appended next are drafts, of which
    /// [`Memory::spec_cut`] keeps a prefix (see `engine::speculative`).
    pub fn spec_begin(&mut self, s: SeqId) -> Result<usize, MemoryError> {
        let len = self.seq_len(s)?;
        if let Some(r) = &mut self.recurrent {
            r.spec_begin(s)?;
        }
        self.spec_base[s] = Some(len);
        Ok(len)
    }

    /// The position the verification of `s` started at, if one runs.
    pub fn spec_base(&self, s: SeqId) -> Option<usize> {
        self.spec_base.get(s).copied().flatten()
    }

    /// Cuts the token history and attention cells of `s` to `p` tokens (the
    /// recurrent state is the caller's: a refold or a replay).
    pub fn spec_cut(&mut self, s: SeqId, p: usize) -> Result<(), MemoryError> {
        self.check(s)?;
        if let Some(k) = &mut self.kv {
            k.seq_truncate(s, p)?;
        }
        self.tokens[s].truncate(p);
        Ok(())
    }

    /// Ends the verification of `s` with the state as it is, at `len`
    /// tokens.
    pub fn spec_end(&mut self, s: SeqId, len: usize) -> Result<(), MemoryError> {
        self.check(s)?;
        if let Some(r) = &mut self.recurrent {
            r.spec_end(s, len)?;
        }
        self.spec_base[s] = None;
        Ok(())
    }

    /// First half of a rollback of `s` to position `p`: restores the newest
    /// recurrent checkpoint at or before `p` (attention cells are cut
    /// there too) and returns the tokens that must be replayed through the
    /// model to reach `p`. Positions ≥ the length are a no-op.
    pub fn rollback(&mut self, s: SeqId, p: usize) -> Result<Vec<u32>, MemoryError> {
        self.check(s)?;
        let len = self.seq_len(s)?;
        if p >= len {
            return Ok(Vec::new());
        }
        self.spec_base[s] = None;
        let c = match &mut self.recurrent {
            Some(r) => r.restore(s, p)?,
            None => p,
        };
        if let Some(k) = &mut self.kv {
            k.seq_truncate(s, c)?;
        }
        let replay = self.tokens[s][c..p].to_vec();
        self.tokens[s].truncate(c);
        Ok(replay)
    }
}

impl SequenceMemory for Memory {
    fn n_seq_max(&self) -> usize {
        self.n_seq_max
    }

    fn seq_len(&self, s: SeqId) -> Result<usize, MemoryError> {
        self.check(s)?;
        let mut len = 0;
        for p in self.parts() {
            len = len.max(p.seq_len(s)?);
        }
        Ok(len)
    }

    fn seq_clear(&mut self, s: SeqId) -> Result<(), MemoryError> {
        self.check(s)?;
        self.tokens[s].clear();
        self.spec_base[s] = None;
        self.parts_mut().try_for_each(|p| p.seq_clear(s))
    }

    /// Without the model, a recurrent memory can only go back to a position
    /// whose state it holds (a checkpoint or 0); `Engine::seq_truncate`
    /// replays tokens to reach any position.
    fn seq_truncate(&mut self, s: SeqId, p: usize) -> Result<(), MemoryError> {
        self.check(s)?;
        let len = self.seq_len(s)?;
        if p >= len {
            return Ok(());
        }
        if let Some(r) = &self.recurrent {
            let known = p == 0 || r.checkpoints(s)?.iter().any(|c| c.pos == p);
            if !known {
                return Err(MemoryError::CannotTruncate {
                    seq: s,
                    pos: p,
                    len,
                });
            }
        }
        let replay = self.rollback(s, p)?;
        debug_assert!(replay.is_empty());
        Ok(())
    }

    fn seq_fork(&mut self, src: SeqId, dst: SeqId) -> Result<(), MemoryError> {
        self.check(src)?;
        self.check(dst)?;
        if src != dst {
            self.tokens[dst] = self.tokens[src].clone();
        }
        self.parts_mut().try_for_each(|p| p.seq_fork(src, dst))
    }

    fn seq_keep(&mut self, s: SeqId) -> Result<(), MemoryError> {
        self.check(s)?;
        for (i, t) in self.tokens.iter_mut().enumerate() {
            if i != s {
                t.clear();
            }
        }
        self.parts_mut().try_for_each(|p| p.seq_keep(s))
    }

    fn bytes(&self) -> usize {
        self.parts().map(|p| p.bytes()).sum()
    }
}
