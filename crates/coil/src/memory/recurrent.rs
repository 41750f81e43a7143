//! Recurrent-state slots: for each recurrent layer and each sequence, the
//! conv window `[d_conv − 1, channels]` and the SSM state (`[H, P, N]` for
//! Mamba-2, `[d_inner, N]` for Mamba-1), in f32. Sized once; never grows
//! with context. The SSM state may instead be stored in bf16
//! ([`RecurrentMemory::with_state_type`]): half the bytes, computed in f32
//! by the kernels (the conv window stays f32). A slot's flat buffer is then
//! still f32 words, each layer's SSM region packing two bf16 per word (and
//! starting on a 64-byte boundary of the buffer).
//!
//! Each sequence also keeps checkpoints: copies of its whole state at
//! earlier positions, so that it can be rolled back (restore the newest
//! checkpoint ≤ p, then replay the tokens up to p). Checkpoints are shared
//! between forks (`Arc`), and bounded by a byte budget per sequence:
//! eviction thins them out (doubles their spacing) rather than dropping
//! the ability to roll back — position 0 (the zero state) is always there.
//!
//! The current state is shared too until written: a fork takes its source's
//! state by reference, and a checkpoint is a reference to the state it was
//! taken of (no copy). The next forward pass that writes a shared state
//! moves the slot to a buffer of its own (a recycled one when there is one)
//! and copies each layer into it only when that layer is first reached
//! ([`RecurrentMemory::state`]): the copy of a layer (≤ a few MB) is still
//! in cache when the layer's update reads it, so a checkpoint per token
//! costs about what updating the state in place costs anyway.

use super::state_pool::{StateBuf, StatePool};
use super::{MemoryError, SeqId, SequenceMemory};
use coil_kernels::ops::state_elem::{StateMut, StateRef, StateType};
use half::bf16;
use std::borrow::Cow;
use std::ops::Range;
use std::sync::Arc;

/// Sizes of one recurrent layer's state, in values (f32 for the conv
/// window; f32 or bf16 for the SSM state, see [`StateType`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RecurrentLayerShape {
    pub conv: usize,
    pub ssm: usize,
}

/// One layer's state of one sequence in an f32 memory, borrowed (tests and
/// tools; the mixers take [`LayerState`]).
pub struct RecurrentState<'a> {
    pub conv: &'a mut [f32],
    pub ssm: &'a mut [f32],
}

/// One layer's state of one sequence, borrowed for a forward pass: the
/// conv window and the SSM state as stored (f32 or bf16).
pub struct LayerState<'a> {
    pub conv: &'a mut [f32],
    pub ssm: StateMut<'a>,
}

/// A layer's state moving off a shared one: its conv window (copied) and
/// SSM state to write, and the SSM source to write it from, if not yet
/// brought over (see [`RecurrentMemory::state_moving`]).
pub type MovingState<'a> = (LayerState<'a>, Option<StateRef<'a>>);

/// The first `n` bf16 packed in `words` (two per f32 word).
fn as_bf16(words: &[f32], n: usize) -> &[bf16] {
    assert!(n <= words.len() * 2);
    // SAFETY: f32 words are at least as aligned as bf16, `n` bf16 fit in
    // them, and every bit pattern is valid for both types.
    unsafe { std::slice::from_raw_parts(words.as_ptr() as *const bf16, n) }
}

fn as_bf16_mut(words: &mut [f32], n: usize) -> &mut [bf16] {
    assert!(n <= words.len() * 2);
    // SAFETY: as in `as_bf16`; the borrow is exclusive.
    unsafe { std::slice::from_raw_parts_mut(words.as_mut_ptr() as *mut bf16, n) }
}

/// The SSM region `words` of a flat state as `n` values of type `ty`.
fn ssm_ref(ty: StateType, words: &[f32], n: usize) -> StateRef<'_> {
    match ty {
        StateType::F32 => StateRef::F32(&words[..n]),
        StateType::Bf16 => StateRef::Bf16(as_bf16(words, n)),
    }
}

fn ssm_mut(ty: StateType, words: &mut [f32], n: usize) -> StateMut<'_> {
    match ty {
        StateType::F32 => StateMut::F32(&mut words[..n]),
        StateType::Bf16 => StateMut::Bf16(as_bf16_mut(words, n)),
    }
}

/// Where one layer lies in a slot's flat state (f32 words).
#[derive(Clone, Copy, Debug, Default)]
struct LayerAt {
    conv: usize,
    ssm: usize,
    /// Words the SSM state takes.
    ssm_words: usize,
}

/// When to take checkpoints and how much memory they may use.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CheckpointPolicy {
    /// Tokens between periodic checkpoints (the finest spacing). 0 disables
    /// periodic checkpoints.
    pub interval: usize,
    /// Bytes of checkpoints one sequence may hold (at least two always fit).
    pub budget_bytes: usize,
    /// Checkpoints at the ends of decode calls kept regardless of spacing.
    pub keep_recent: usize,
    /// Also checkpoint at the end of single-token calls (every generated
    /// token). Off by default: each is a copy of the whole state, which
    /// costs decode speed; a server that resumes conversations at any
    /// generated token turns it on.
    pub every_call: bool,
    /// With `every_call`: only where the length is a multiple of this
    /// (1: after every generated token; 4: every fourth, a resume between
    /// two processing the ≤ 3 tokens past the earlier one again).
    pub call_spacing: usize,
}

impl Default for CheckpointPolicy {
    /// A checkpoint every 512 tokens: the engine's default micro-batch, so
    /// prompts run in whole 512-token micro-batches (a rollback replays at
    /// most 511 tokens). 256 measured 2-5% slower prefill and one more
    /// whole-state copy per 512 tokens (49 MiB on mamba2-370m).
    fn default() -> Self {
        CheckpointPolicy {
            interval: 512,
            budget_bytes: 256 << 20,
            keep_recent: 2,
            every_call: false,
            call_spacing: 1,
        }
    }
}

/// A sequence's whole recurrent state at `pos`.
#[derive(Clone, Debug)]
pub struct Checkpoint {
    pub pos: usize,
    pub state: Arc<StateBuf>,
    /// The state came from aligned chunked prompt calls only (see
    /// [`RecurrentMemory::set_aligned`]).
    pub aligned: bool,
}

#[derive(Clone)]
struct Slot {
    len: usize,
    /// All layers' conv and SSM state, flat (see `offsets`); shared with
    /// forks (and, before the first write, with the other empty slots)
    /// until written.
    state: Arc<StateBuf>,
    /// Sorted by position, all < or = `len`.
    checkpoints: Vec<Checkpoint>,
    /// Current spacing level: periodic checkpoints are `interval · 2^level`
    /// apart.
    level: u32,
    /// While the slot moves off a shared state: that state, and which
    /// layers were already copied from it into `state`.
    pending: Option<Pending>,
    /// While a speculative verification runs on this sequence: the state
    /// before it and each layer's tape (see [`RecurrentMemory::spec_begin`]).
    spec: Option<Box<Spec>>,
    /// Tape buffers of the last verification, reused by the next.
    spare_tapes: Vec<Vec<f32>>,
    /// See [`RecurrentMemory::set_aligned`].
    aligned: bool,
}

/// A speculative verification in progress: the state and length before the
/// drafted tokens went through, and per layer a tape of what its mixer
/// computed for them (written by mixers that can refold, see
/// [`RecurrentMemory::tape`]).
#[derive(Clone)]
struct Spec {
    base: Arc<StateBuf>,
    base_len: usize,
    tapes: Vec<Vec<f32>>,
}

#[derive(Clone)]
struct Pending {
    from: Arc<StateBuf>,
    copied: Vec<bool>,
}

impl Slot {
    /// Leaves the (shared) state for a buffer of its own — the one given
    /// back to the pool last, when there is one — whose layers are filled
    /// as they are first reached.
    fn begin_move(&mut self, n_layer: usize, pool: &StatePool) {
        let from = Arc::clone(&self.state);
        self.state = Arc::new(pool.take());
        self.pending = Some(Pending {
            from,
            copied: vec![false; n_layer],
        });
    }

    /// Copies the layers not yet moved from the shared state it left.
    fn settle(&mut self, regions: &[Range<usize>]) {
        if let Some(p) = self.pending.take() {
            let st = Arc::make_mut(&mut self.state);
            for (r, done) in regions.iter().zip(&p.copied) {
                if !done {
                    st[r.clone()].copy_from_slice(&p.from[r.clone()]);
                }
            }
        }
    }

    /// Sets the state to a copy of `src`: in place when this slot holds its
    /// state alone, else into a fresh buffer (the sharer keeps its own).
    fn overwrite(&mut self, src: &[f32], pool: &StatePool) {
        self.pending = None;
        match Arc::get_mut(&mut self.state) {
            Some(own) => own.copy_from_slice(src),
            None => self.state = Arc::new(pool.copy_of(src)),
        }
    }
}

pub struct RecurrentMemory {
    shapes: Vec<Option<RecurrentLayerShape>>,
    /// Per layer: where it lies in a slot's flat state.
    offsets: Vec<LayerAt>,
    /// f32 words of a slot's flat state.
    state_len: usize,
    state_type: StateType,
    slots: Vec<Slot>,
    pub policy: CheckpointPolicy,
    /// State buffers no slot uses, given back by any: a new request's
    /// sequence takes them instead of faulting fresh pages in (a checkpoint
    /// per token cycles through `max_checkpoints() + 2` buffers per
    /// sequence, ~250 MB on mamba2-370m, which cost ~5% of a 64-token
    /// request when first touched on a quiet machine; with 8 requests at
    /// once, over half the server's CPU time went to zeroing fresh pages
    /// when only one sequence's worth was kept). Every buffer dropped by
    /// its last holder, inside the memory or not, comes back here, up to
    /// every slot's worth ([`Self::free_cap`]): the most the slots can hold
    /// at once anyway.
    pool: StatePool,
    /// Checkpoints per slot held outside the memory ([`Self::hold_outside`]).
    outside: usize,
}

impl RecurrentMemory {
    /// `shapes[l]` is `None` for a layer without recurrent state.
    pub fn new(shapes: Vec<Option<RecurrentLayerShape>>, n_seq_max: usize) -> Self {
        Self::with_type(shapes, n_seq_max, StateType::F32)
    }

    /// This memory, empty, with its SSM states stored as `ty` (every
    /// sequence forgotten; the checkpoint policy kept).
    pub fn with_state_type(self, ty: StateType) -> Self {
        let (policy, outside) = (self.policy, self.outside);
        let mut m = Self::with_type(self.shapes, self.slots.len(), ty);
        m.policy = policy;
        m.outside = outside;
        m
    }

    pub fn state_type(&self) -> StateType {
        self.state_type
    }

    fn with_type(
        shapes: Vec<Option<RecurrentLayerShape>>,
        n_seq_max: usize,
        state_type: StateType,
    ) -> Self {
        let offsets = layout(&shapes, state_type);
        let at = offsets.last().map_or(0, |l| l.ssm + l.ssm_words);
        // The empty slots share one buffer of zeros, mapped lazily and
        // never written (each slot moves off it on its first pass); it is
        // no pool's, so its unmapped pages never end up on the free list.
        let slot = Slot {
            len: 0,
            state: Arc::new(StateBuf::detached(vec![0.0; at])),
            checkpoints: Vec::new(),
            level: 0,
            pending: None,
            spec: None,
            spare_tapes: Vec::new(),
            aligned: true,
        };
        let m = RecurrentMemory {
            shapes,
            offsets,
            state_len: at,
            state_type,
            slots: vec![slot; n_seq_max.max(1)],
            policy: CheckpointPolicy::default(),
            pool: StatePool::new(at),
            outside: 0,
        };
        m.refresh_cap();
        m
    }

    /// Puts up to `n` state buffers on the free list (at most what the
    /// slots hold together, `(max_checkpoints() + 2)` each), written once
    /// so their pages are resident: a server checkpointing every token
    /// then moves its states into these instead of faulting fresh pages in
    /// (on the 2-core VM of 2026-12-01, zeroing fresh pages took over half
    /// the CPU time of 8 concurrent requests). Returns the buffers added.
    pub fn reserve_buffers(&mut self, n: usize) -> usize {
        self.refresh_cap();
        self.pool.reserve(n)
    }

    /// Free state buffers held for reuse.
    pub fn free_buffers(&self) -> usize {
        self.pool.len()
    }

    /// State buffers allocated so far because none was free (the startup
    /// reserve not counted).
    pub fn fresh_buffers(&self) -> usize {
        self.pool.fresh()
    }

    /// State buffers put aside by [`RecurrentMemory::reserve_buffers`].
    pub fn reserved_buffers(&self) -> usize {
        self.pool.reserved()
    }

    /// Sets the pool's cap to [`Self::free_cap`] (the policy's budget and
    /// the slots it depends on may have changed).
    fn refresh_cap(&self) {
        let cap = self.free_cap();
        if self.pool.cap() != cap {
            self.pool.set_cap(cap);
        }
    }

    /// The most buffers the free list keeps: what the slots can hold at
    /// once (a state, one being moved to, their checkpoints, and the checkpoints held
    /// outside: [`RecurrentMemory::hold_outside`]), so that a full load
    /// reuses resident buffers only.
    fn free_cap(&self) -> usize {
        (self.max_checkpoints() + 2 + self.outside) * self.slots.len()
    }

    /// Says that up to `per_slot` checkpoints per sequence are kept outside
    /// the memory (a server's pinned ones, whose buffers come back to the
    /// pool when dropped there): the free list keeps that many more
    /// buffers per slot for reuse.
    pub fn hold_outside(&mut self, per_slot: usize) {
        self.outside = per_slot;
        self.refresh_cap();
    }

    /// The span of layer `l` in a flat state (conv window, then SSM state).
    fn region(&self, l: usize) -> Range<usize> {
        let at = self.offsets[l];
        at.conv..at.ssm + at.ssm_words
    }

    fn regions(&self) -> Vec<Range<usize>> {
        (0..self.shapes.len()).map(|l| self.region(l)).collect()
    }

    /// Finishes moving `s` off a shared state (copies the layers a pass
    /// did not reach). Called after every micro-batch; cheap when nothing
    /// is pending.
    pub fn settle(&mut self, s: SeqId) -> Result<(), MemoryError> {
        self.check(s)?;
        if self.slots[s].pending.is_some() {
            let regions = self.regions();
            self.slots[s].settle(&regions);
        }
        Ok(())
    }

    fn check(&self, s: SeqId) -> Result<(), MemoryError> {
        if s >= self.slots.len() {
            return Err(MemoryError::SeqOutOfRange {
                seq: s,
                n_seq_max: self.slots.len(),
            });
        }
        Ok(())
    }

    pub fn n_layer(&self) -> usize {
        self.shapes.len()
    }

    pub fn shapes(&self) -> &[Option<RecurrentLayerShape>] {
        &self.shapes
    }

    /// Bytes of state per sequence.
    pub fn bytes_per_seq(&self) -> usize {
        self.state_len * 4
    }

    /// Bytes of current state actually held: each state buffer once,
    /// however many sequences share it (forks that have not written yet).
    /// [`SequenceMemory::bytes`] counts every slot in full instead (what the
    /// slots take once all have written).
    pub fn resident_bytes(&self) -> usize {
        self.resident_bytes_of(0..self.slots.len())
    }

    /// Bytes of the current states of the sequences `seqs` (those out of
    /// range are skipped), each buffer once however many of them share it.
    pub fn resident_bytes_of(&self, seqs: impl IntoIterator<Item = SeqId>) -> usize {
        let mut seen: Vec<*const StateBuf> = seqs
            .into_iter()
            .filter_map(|s| self.slots.get(s))
            .map(|s| Arc::as_ptr(&s.state))
            .collect();
        seen.sort();
        seen.dedup();
        seen.len() * self.bytes_per_seq()
    }

    /// Most checkpoints one sequence may hold under the budget.
    pub fn max_checkpoints(&self) -> usize {
        (self.policy.budget_bytes / self.bytes_per_seq().max(1)).max(2)
    }

    /// The state of `layer` for sequence `s` of an f32 memory, or `None`
    /// if the layer has none (see [`RecurrentMemory::layer_state`] for
    /// either type).
    pub fn state(
        &mut self,
        layer: usize,
        s: SeqId,
    ) -> Result<Option<RecurrentState<'_>>, MemoryError> {
        let Some(st) = self.layer_state(layer, s)? else {
            return Ok(None);
        };
        match st.ssm {
            StateMut::F32(ssm) => Ok(Some(RecurrentState { conv: st.conv, ssm })),
            StateMut::Bf16(_) => Err(MemoryError::StateType {
                want: StateType::F32,
                have: StateType::Bf16,
            }),
        }
    }

    /// The state of `layer` for sequence `s` as stored, or `None` if the
    /// layer has none.
    pub fn layer_state(
        &mut self,
        layer: usize,
        s: SeqId,
    ) -> Result<Option<LayerState<'_>>, MemoryError> {
        Ok(self.state_moving(layer, s)?.map(|(mut st, from)| {
            if let Some(f) = from {
                st.ssm.copy_from(f);
            }
            st
        }))
    }

    /// Like [`RecurrentMemory::state`], but when the layer still has to be
    /// brought over from a shared state, its SSM part is not copied: the
    /// source comes back beside it, and the caller must overwrite all of
    /// `ssm` from it (e.g. `mamba2_scan_from`, which copies each head just
    /// before updating it). The conv window is copied as usual.
    pub fn state_moving(
        &mut self,
        layer: usize,
        s: SeqId,
    ) -> Result<Option<MovingState<'_>>, MemoryError> {
        self.check(s)?;
        let Some(shape) = self.shapes.get(layer).copied().flatten() else {
            return Ok(None);
        };
        let at = self.offsets[layer];
        let n_layer = self.shapes.len();
        Ok(Some(slot_state_moving(
            &mut self.slots[s],
            &self.pool,
            layer,
            n_layer,
            at,
            shape,
            self.state_type,
        )))
    }

    /// [`RecurrentMemory::state_moving`] for several distinct sequences at
    /// once (`out[i]` belongs to `seqs[i]`), so that one pass can update
    /// all their states together; `None` if the layer has no state.
    pub fn states_moving(
        &mut self,
        layer: usize,
        seqs: &[SeqId],
    ) -> Result<Option<Vec<MovingState<'_>>>, MemoryError> {
        for (i, &s) in seqs.iter().enumerate() {
            self.check(s)?;
            if seqs[..i].contains(&s) {
                return Err(MemoryError::DuplicateSeq { seq: s });
            }
        }
        let Some(shape) = self.shapes.get(layer).copied().flatten() else {
            return Ok(None);
        };
        let at = self.offsets[layer];
        let n_layer = self.shapes.len();
        let mut out: Vec<Option<MovingState<'_>>> = (0..seqs.len()).map(|_| None).collect();
        for (s, slot) in self.slots.iter_mut().enumerate() {
            if let Some(i) = seqs.iter().position(|&x| x == s) {
                out[i] = Some(slot_state_moving(
                    slot,
                    &self.pool,
                    layer,
                    n_layer,
                    at,
                    shape,
                    self.state_type,
                ));
            }
        }
        // Every entry is filled: the sequences are distinct and in range.
        Ok(Some(out.into_iter().flatten().collect()))
    }

    /// The conv region of `layer` for `s` as it stands, read without
    /// moving the slot off a shared state (empty for a layer without one).
    pub fn conv_of(&self, layer: usize, s: SeqId) -> Result<&[f32], MemoryError> {
        self.check(s)?;
        let Some(shape) = self.shapes.get(layer).copied().flatten() else {
            return Ok(&[]);
        };
        let at = self.offsets[layer].conv;
        let slot = &self.slots[s];
        let from = match &slot.pending {
            Some(p) if !p.copied[layer] => &p.from,
            _ => &slot.state,
        };
        Ok(&from[at..at + shape.conv])
    }

    /// The whole flat state of `s` (all layers).
    pub fn flat_state(&self, s: SeqId) -> Result<Cow<'_, [f32]>, MemoryError> {
        self.check(s)?;
        let slot = &self.slots[s];
        Ok(match &slot.pending {
            None => Cow::Borrowed(&slot.state[..]),
            Some(p) => {
                let mut v = slot.state.to_vec();
                for (l, done) in p.copied.iter().enumerate() {
                    if !done {
                        let r = self.region(l);
                        v[r.clone()].copy_from_slice(&p.from[r]);
                    }
                }
                Cow::Owned(v)
            }
        })
    }

    /// Replaces the whole state of `s` and its length (loading a session).
    pub fn set_flat_state(
        &mut self,
        s: SeqId,
        len: usize,
        state: &[f32],
    ) -> Result<(), MemoryError> {
        self.check(s)?;
        let slot = &mut self.slots[s];
        slot.overwrite(state, &self.pool);
        slot.len = len;
        // Where a state from outside came from is not known.
        slot.aligned = len == 0;
        Ok(())
    }

    /// A checkpoint of `s`'s memory at `pos` holding a copy of `state` (a
    /// flat state of this memory: loading a session) in a buffer of the
    /// pool — a free one when there is one. (Wrapping the parsed buffer
    /// instead gave the pool one more buffer each time the sequence was
    /// cleared, and nothing took them while only sessions were loaded: the
    /// free list grew to its cap, the whole checkpoint budget.)
    pub fn checkpoint_of(&self, pos: usize, state: &[f32]) -> Checkpoint {
        Checkpoint {
            pos,
            state: Arc::new(self.pool.copy_of(state)),
            aligned: false,
        }
    }

    /// f32 words of one sequence's flat state.
    pub fn state_len(&self) -> usize {
        self.state_len
    }

    /// f32 words a flat state of these layers takes with SSM type `ty`.
    pub fn state_len_of(&self, ty: StateType) -> usize {
        layout(&self.shapes, ty)
            .last()
            .map_or(0, |l| l.ssm + l.ssm_words)
    }

    /// A flat state of these layers stored with SSM type `from` (as
    /// [`RecurrentMemory::flat_state`] gives it), in this memory's type:
    /// widened exactly from bf16, rounded to nearest even from f32. `None`
    /// when `words` is not such a state.
    pub fn convert_flat<'a>(&self, from: StateType, words: &'a [f32]) -> Option<Cow<'a, [f32]>> {
        if words.len() != self.state_len_of(from) {
            return None;
        }
        if from == self.state_type {
            return Some(Cow::Borrowed(words));
        }
        let src = layout(&self.shapes, from);
        let mut out = vec![0f32; self.state_len];
        for ((shape, s), d) in self.shapes.iter().zip(&src).zip(&self.offsets) {
            let Some(shape) = shape else { continue };
            out[d.conv..d.conv + shape.conv].copy_from_slice(&words[s.conv..s.conv + shape.conv]);
            let from_ssm = ssm_ref(from, &words[s.ssm..s.ssm + s.ssm_words], shape.ssm);
            ssm_mut(
                self.state_type,
                &mut out[d.ssm..d.ssm + d.ssm_words],
                shape.ssm,
            )
            .copy_from(from_ssm);
        }
        Some(Cow::Owned(out))
    }

    /// Records that `n` more tokens of `s` went through every layer.
    pub fn advance(&mut self, s: SeqId, n: usize) -> Result<(), MemoryError> {
        self.check(s)?;
        self.slots[s].len += n;
        Ok(())
    }

    /// Records whether the current state of `s` came from aligned chunked
    /// prompt calls only: every call that wrote it started at a multiple of
    /// the model's scan chunk (or at 0) from such a state, and ran the
    /// chunked forms (`Engine::scan_chunk`). Such a state is the one any
    /// other way of cutting the same prompt into aligned calls gives, bit
    /// for bit; a token-by-token step, or a call from an unaligned position,
    /// clears it. Checkpoints keep the flag of the state they hold; a clear
    /// sequence (the zero state) has it.
    pub fn set_aligned(&mut self, s: SeqId, aligned: bool) -> Result<(), MemoryError> {
        self.check(s)?;
        self.slots[s].aligned = aligned;
        Ok(())
    }

    /// See [`RecurrentMemory::set_aligned`].
    pub fn aligned(&self, s: SeqId) -> Result<bool, MemoryError> {
        self.check(s)?;
        Ok(self.slots[s].aligned)
    }

    pub fn checkpoints(&self, s: SeqId) -> Result<&[Checkpoint], MemoryError> {
        self.check(s)?;
        Ok(&self.slots[s].checkpoints)
    }

    /// Thins the checkpoints of `s` for a stay in a cache: keeps those within
    /// `tail` tokens of its end (the newest always), the newest one of
    /// aligned chunked calls ([`RecurrentMemory::set_aligned`]: the state a
    /// batch-invariant prompt resumes from) and, before them, one
    /// per `spacing` positions (the first of each stretch, as the budget's
    /// thinning does); returns how many were dropped. Their buffers go back
    /// to the pool unless something else holds them (a fork, a pin): a
    /// parked conversation then holds a few states instead of one per few
    /// generated tokens, and a rollback into it replays fewer than
    /// `spacing` tokens plus the distance between the checkpoints it had.
    pub fn thin_parked(
        &mut self,
        s: SeqId,
        spacing: usize,
        tail: usize,
    ) -> Result<usize, MemoryError> {
        self.check(s)?;
        let slot = &mut self.slots[s];
        let (len, before) = (slot.len, slot.checkpoints.len());
        let spacing = spacing.max(1);
        // The newest state of aligned chunked calls: where a prompt under
        // fixed chunk positions resumes (`Engine::resumable`).
        let newest_aligned = slot.checkpoints.iter().rposition(|c| c.aligned);
        let mut last: Option<usize> = None;
        let mut i = 0;
        slot.checkpoints.retain(|c| {
            i += 1;
            let keep = i == before
                || Some(i - 1) == newest_aligned
                || c.pos + tail >= len
                || last.is_none_or(|l| c.pos >= l + spacing);
            if keep {
                last = Some(c.pos);
            }
            keep
        });
        Ok(before - slot.checkpoints.len())
    }

    /// Replaces the checkpoints of `s` (loading a session).
    pub fn set_checkpoints(&mut self, s: SeqId, cps: Vec<Checkpoint>) -> Result<(), MemoryError> {
        self.check(s)?;
        self.slots[s].checkpoints = cps;
        Ok(())
    }

    /// Bytes held by the checkpoints of `s` (shared ones counted in full).
    pub fn checkpoint_bytes(&self, s: SeqId) -> Result<usize, MemoryError> {
        Ok(self.checkpoints(s)?.len() * self.bytes_per_seq())
    }

    /// Bytes held by the checkpoints of the sequences `seqs` (those out of
    /// range are skipped), each checkpoint forks share counted once.
    pub fn checkpoint_bytes_of(&self, seqs: impl IntoIterator<Item = SeqId>) -> usize {
        distinct_checkpoint_bytes(
            seqs.into_iter()
                .filter_map(|s| self.slots.get(s))
                .flat_map(|s| &s.checkpoints),
        )
    }

    /// Takes a checkpoint of `s` at its current length (no-op at 0 or if one
    /// exists there), then thins the checkpoints to the budget.
    pub fn checkpoint(&mut self, s: SeqId) -> Result<(), MemoryError> {
        self.settle(s)?;
        let max = self.max_checkpoints();
        let policy = self.policy;
        let slot = &mut self.slots[s];
        if slot.len == 0 || slot.checkpoints.last().is_some_and(|c| c.pos == slot.len) {
            return Ok(());
        }
        // A reference, not a copy: the next pass that writes the state
        // moves the slot to another buffer (see `state`).
        slot.checkpoints.push(Checkpoint {
            pos: slot.len,
            state: Arc::clone(&slot.state),
            aligned: slot.aligned,
        });
        thin(slot, policy, max);
        self.refresh_cap();
        Ok(())
    }

    /// Whether appending `n` tokens to `s` crosses a periodic checkpoint
    /// position; returns how many tokens to take to land on it.
    pub fn tokens_to_next_period(&self, s: SeqId) -> Result<Option<usize>, MemoryError> {
        self.check(s)?;
        let k = self.policy.interval;
        if k == 0 {
            return Ok(None);
        }
        let len = self.slots[s].len;
        Ok(Some(k - len % k))
    }

    /// Starts a speculative verification of `s`: keeps a reference to the
    /// current state (so the next pass moves off it instead of updating it
    /// in place: no copy) and opens an empty tape per layer. Until
    /// [`RecurrentMemory::spec_end`], the mixers that can refold record
    /// their scan inputs with [`RecurrentMemory::tape`] (the engine runs
    /// the verification with batch-invariant numerics: recurrences token by
    /// token).
    pub fn spec_begin(&mut self, s: SeqId) -> Result<(), MemoryError> {
        self.settle(s)?;
        let n_layer = self.shapes.len();
        let slot = &mut self.slots[s];
        let mut tapes = std::mem::take(&mut slot.spare_tapes);
        tapes.resize_with(n_layer, Vec::new);
        tapes.iter_mut().for_each(Vec::clear);
        slot.spec = Some(Box::new(Spec {
            base: Arc::clone(&slot.state),
            base_len: slot.len,
            tapes,
        }));
        Ok(())
    }

    /// The tape of `layer` for `s` while it is being verified (`None`
    /// otherwise): the mixer appends what it needs to refold a prefix of
    /// the verified tokens from the state before them.
    pub fn tape(&mut self, layer: usize, s: SeqId) -> Option<&mut Vec<f32>> {
        let spec = self.slots.get_mut(s)?.spec.as_mut()?;
        spec.tapes.get_mut(layer)
    }

    /// Position where the verification of `s` started, if one runs.
    pub fn spec_base_len(&self, s: SeqId) -> Option<usize> {
        self.slots.get(s)?.spec.as_ref().map(|sp| sp.base_len)
    }

    /// For refolding layer `layer` of `s`: the layer's state before the
    /// verification (conv window, SSM state), its tape, and the current
    /// state to overwrite. `None` when no verification runs or the layer
    /// has no state.
    #[allow(clippy::type_complexity)]
    pub fn refold_parts(
        &mut self,
        layer: usize,
        s: SeqId,
    ) -> Option<(LayerState<'_>, &[f32], StateRef<'_>, &[f32])> {
        let shape = self.shapes.get(layer).copied().flatten()?;
        let at = self.offsets[layer];
        let ty = self.state_type;
        let slot = self.slots.get_mut(s)?;
        slot.pending.as_ref().is_none().then_some(())?;
        let spec = slot.spec.as_ref()?;
        // The verification moved the state off `base` (and no checkpoint
        // refers to it after `spec_drop_checkpoints`); should anything
        // still share it, it is copied here.
        let state = Arc::make_mut(&mut slot.state);
        let (conv, ssm) = layer_parts(state, at, shape, ty);
        Some((
            LayerState { conv, ssm },
            &spec.base[at.conv..at.conv + shape.conv],
            ssm_ref(ty, &spec.base[at.ssm..at.ssm + at.ssm_words], shape.ssm),
            &spec.tapes[layer][..],
        ))
    }

    /// Drops the checkpoints of `s` taken past position `p` (during a
    /// verification whose tokens beyond `p` were rejected).
    pub fn drop_checkpoints_after(&mut self, s: SeqId, p: usize) -> Result<(), MemoryError> {
        self.check(s)?;
        let slot = &mut self.slots[s];
        let keep = slot.checkpoints.partition_point(|c| c.pos <= p);
        slot.checkpoints.truncate(keep);
        Ok(())
    }

    /// Ends the verification of `s` keeping the state as it is, at length
    /// `len` (all verified tokens kept, or a refold brought the state to
    /// `len`).
    pub fn spec_end(&mut self, s: SeqId, len: usize) -> Result<(), MemoryError> {
        self.check(s)?;
        let slot = &mut self.slots[s];
        if let Some(spec) = slot.spec.take() {
            // The state before the verification, unless a checkpoint keeps
            // it, goes back to the pool: a buffer for the next one to move
            // to (no allocation and page faults per verification).
            slot.spare_tapes = spec.tapes;
        }
        slot.len = len;
        Ok(())
    }

    /// Ends the verification of `s` by going back to the state before it
    /// (its checkpoints past that position dropped). Returns that position.
    pub fn spec_abort(&mut self, s: SeqId) -> Result<usize, MemoryError> {
        self.check(s)?;
        let Some(spec) = self.slots[s].spec.take() else {
            return self.seq_len(s);
        };
        let base_len = spec.base_len;
        self.drop_checkpoints_after(s, base_len)?;
        let slot = &mut self.slots[s];
        slot.pending = None;
        // The state it leaves goes back to the pool.
        slot.state = spec.base;
        slot.spare_tapes = spec.tapes;
        slot.len = base_len;
        Ok(base_len)
    }

    /// Restores `s` to the newest checkpoint at or before `p` (the zero
    /// state at 0 when there is none), dropping checkpoints past it.
    /// Returns the restored position.
    pub fn restore(&mut self, s: SeqId, p: usize) -> Result<usize, MemoryError> {
        self.check(s)?;
        let slot = &mut self.slots[s];
        slot.spec = None;
        let keep = slot.checkpoints.partition_point(|c| c.pos <= p);
        slot.checkpoints.truncate(keep);
        match slot.checkpoints.last() {
            Some(c) => {
                // Share the checkpoint's state (the next write moves off
                // it); the state left goes back to the pool.
                slot.pending = None;
                slot.state = Arc::clone(&c.state);
                slot.len = c.pos;
                slot.aligned = c.aligned;
            }
            None => {
                zero(slot, &self.pool);
                slot.len = 0;
                slot.aligned = true;
            }
        }
        Ok(slot.len)
    }
}

/// Bytes of the checkpoints `cps`, each state buffer once however often it
/// appears (checkpoints are shared between forks, and callers may keep
/// clones of their own beside a sequence's list).
pub fn distinct_checkpoint_bytes<'a>(cps: impl IntoIterator<Item = &'a Checkpoint>) -> usize {
    let mut seen: Vec<(*const StateBuf, usize)> = cps
        .into_iter()
        .map(|c| (Arc::as_ptr(&c.state), c.state.len() * 4))
        .collect();
    seen.sort_unstable();
    seen.dedup();
    seen.iter().map(|&(_, b)| b).sum()
}

/// Where each layer lies in a flat state of SSM type `ty`: conv window,
/// then SSM state, layer after layer. In bf16 the SSM state starts on a
/// 16-word (64-byte) boundary, so that its rows can be streamed (the f32
/// layout is packed, as it always was).
fn layout(shapes: &[Option<RecurrentLayerShape>], ty: StateType) -> Vec<LayerAt> {
    let mut out = Vec::with_capacity(shapes.len());
    let mut at = 0;
    for s in shapes {
        let (c, m) = s.map_or((0, 0), |s| (s.conv, s.ssm));
        let conv = at;
        let (ssm, ssm_words) = match ty {
            StateType::F32 => (conv + c, m),
            StateType::Bf16 if m == 0 => (conv + c, 0),
            StateType::Bf16 => ((conv + c).next_multiple_of(16), m.div_ceil(2)),
        };
        out.push(LayerAt {
            conv,
            ssm,
            ssm_words,
        });
        at = ssm + ssm_words;
    }
    out
}

/// The conv window and SSM state of the layer at `at` in a flat state.
fn layer_parts(
    state: &mut [f32],
    at: LayerAt,
    shape: RecurrentLayerShape,
    ty: StateType,
) -> (&mut [f32], StateMut<'_>) {
    let (head, ssm) = state[at.conv..at.ssm + at.ssm_words].split_at_mut(at.ssm - at.conv);
    (&mut head[..shape.conv], ssm_mut(ty, ssm, shape.ssm))
}

/// One slot's part of [`RecurrentMemory::state_moving`]: `at` is where the
/// layer lies in the flat state.
fn slot_state_moving<'a>(
    slot: &'a mut Slot,
    pool: &StatePool,
    layer: usize,
    n_layer: usize,
    at: LayerAt,
    shape: RecurrentLayerShape,
    ty: StateType,
) -> MovingState<'a> {
    let (c, m, mw) = (at.conv, at.ssm, at.ssm_words);
    // A state shared with a checkpoint or a fork: move to a buffer of
    // this slot's own and bring the layers over as they are reached.
    if slot.pending.is_none() && Arc::get_mut(&mut slot.state).is_none() {
        slot.begin_move(n_layer, pool);
    }
    // Unique here (just made, or made earlier in this pass): no copy.
    let state = Arc::make_mut(&mut slot.state);
    let from = match slot.pending.as_mut() {
        Some(p) if !p.copied[layer] => {
            p.copied[layer] = true;
            state[c..m].copy_from_slice(&p.from[c..m]);
            Some(ssm_ref(ty, &p.from[m..m + mw], shape.ssm))
        }
        _ => None,
    };
    let (conv, ssm) = layer_parts(state, at, shape, ty);
    (LayerState { conv, ssm }, from)
}

/// Sets the state of `slot` to zeros: in place when it holds it alone,
/// else in a buffer of the pool, written now. A fresh `vec![0.0; n]`
/// would be mapped lazily: the prompt's scan reads each page (the zero
/// page is mapped) and then writes it, a write-protect fault per page with
/// a TLB shootdown across the pool's threads (measured on a server's first
/// request: most of its 0.4 s to the first token went there).
fn zero(slot: &mut Slot, pool: &StatePool) {
    slot.pending = None;
    if let Some(own) = Arc::get_mut(&mut slot.state) {
        own.fill(0.0);
        return;
    }
    slot.state = Arc::new(pool.zeroed());
}

/// Thins `slot`'s checkpoints to at most `max`: raising the spacing level
/// (periodic checkpoints `interval · 2^level` apart) keeps the older history
/// reachable with longer replays; the most recent ones are kept as they are.
fn thin(slot: &mut Slot, policy: CheckpointPolicy, max: usize) {
    let base = policy.interval.max(1);
    // One checkpoint at a time, so that a checkpoint per token drops one
    // per token in the steady state and its buffer is reused by the next.
    while slot.checkpoints.len() > max {
        let n = slot.checkpoints.len();
        let recent = policy.keep_recent.min(n);
        let spacing = base.saturating_mul(1usize << slot.level.min(40));
        // The oldest checkpoint off the grid: closer than `spacing` to the
        // previous one kept.
        let mut last = 0usize;
        let mut victim = None;
        for (i, c) in slot.checkpoints[..n - recent].iter().enumerate() {
            if c.pos - last >= spacing {
                last = c.pos;
            } else {
                victim = Some(i);
                break;
            }
        }
        let victim = match victim {
            Some(i) => i,
            // Spacing already spans the sequence: drop the oldest.
            None if spacing >= slot.len.max(1) => 0,
            None => {
                slot.level += 1;
                continue;
            }
        };
        // Its buffer goes back to the pool unless something else holds it.
        slot.checkpoints.remove(victim);
    }
}

impl SequenceMemory for RecurrentMemory {
    fn n_seq_max(&self) -> usize {
        self.slots.len()
    }

    fn seq_len(&self, s: SeqId) -> Result<usize, MemoryError> {
        self.check(s)?;
        Ok(self.slots[s].len)
    }

    fn seq_clear(&mut self, s: SeqId) -> Result<(), MemoryError> {
        self.check(s)?;
        let slot = &mut self.slots[s];
        slot.len = 0;
        slot.spec = None;
        // Checkpoints first: the newest may share the state, which can then
        // be zeroed in place instead of reallocated.
        slot.checkpoints.clear();
        zero(slot, &self.pool);
        slot.level = 0;
        slot.aligned = true;
        Ok(())
    }

    /// Without replaying tokens (which needs the model: see
    /// `Engine::seq_truncate`), only positions where the state is known can
    /// be reached: the current length, a checkpoint, or 0.
    fn seq_truncate(&mut self, s: SeqId, p: usize) -> Result<(), MemoryError> {
        let len = self.seq_len(s)?;
        if p >= len {
            return Ok(());
        }
        if p == 0 || self.slots[s].checkpoints.iter().any(|c| c.pos == p) {
            self.restore(s, p)?;
            return Ok(());
        }
        Err(MemoryError::CannotTruncate {
            seq: s,
            pos: p,
            len,
        })
    }

    fn seq_fork(&mut self, src: SeqId, dst: SeqId) -> Result<(), MemoryError> {
        self.check(src)?;
        self.check(dst)?;
        if src != dst {
            // Nothing is copied: the state and the checkpoints are shared
            // (the state until one of the two writes it). What `dst` held
            // goes back to the pool where nothing else holds it.
            self.settle(src)?;
            let from = &self.slots[src];
            let (len, level, aligned) = (from.len, from.level, from.aligned);
            let state = Arc::clone(&from.state);
            let checkpoints = from.checkpoints.clone();
            let to = &mut self.slots[dst];
            to.checkpoints = checkpoints;
            to.pending = None;
            to.spec = None;
            to.state = state;
            to.len = len;
            to.level = level;
            to.aligned = aligned;
        }
        Ok(())
    }

    fn seq_keep(&mut self, s: SeqId) -> Result<(), MemoryError> {
        self.check(s)?;
        for other in 0..self.slots.len() {
            if other != s {
                self.seq_clear(other)?;
            }
        }
        Ok(())
    }

    fn bytes(&self) -> usize {
        self.bytes_per_seq() * self.slots.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn f32s(s: StateRef<'_>) -> &[f32] {
        match s {
            StateRef::F32(s) => s,
            StateRef::Bf16(_) => panic!("an f32 memory gave a bf16 state"),
        }
    }

    fn f32s_mut(s: StateMut<'_>) -> &mut [f32] {
        match s {
            StateMut::F32(s) => s,
            StateMut::Bf16(_) => panic!("an f32 memory gave a bf16 state"),
        }
    }

    fn mem() -> RecurrentMemory {
        let shape = RecurrentLayerShape { conv: 6, ssm: 8 };
        RecurrentMemory::new(vec![Some(shape), None, Some(shape)], 3)
    }

    #[test]
    fn bf16_states_take_half_and_convert_both_ways() {
        let shape = RecurrentLayerShape { conv: 6, ssm: 40 };
        let f = RecurrentMemory::new(vec![Some(shape), None, Some(shape)], 2);
        let mut b = RecurrentMemory::new(vec![Some(shape), None, Some(shape)], 2)
            .with_state_type(StateType::Bf16);
        assert_eq!(f.bytes_per_seq(), 2 * 46 * 4);
        // Per layer: 6 conv words, padding to a multiple of 16, 20 words
        // of bf16: 0..6, 16..36, then 36..42, 48..68.
        assert_eq!(b.state_len(), 68);
        assert_eq!(b.state_len_of(StateType::F32), f.state_len());
        assert!(matches!(
            b.state(0, 0),
            Err(MemoryError::StateType {
                have: StateType::Bf16,
                ..
            })
        ));
        // Write through the typed view; a fork shares it, a checkpoint
        // keeps it.
        {
            let st = b.layer_state(2, 0).unwrap().unwrap();
            st.conv[5] = 0.25;
            let StateMut::Bf16(ssm) = st.ssm else {
                panic!("an f32 state in a bf16 memory")
            };
            ssm[39] = bf16::from_f32(1.5);
        }
        b.advance(0, 3).unwrap();
        b.checkpoint(0).unwrap();
        b.seq_fork(0, 1).unwrap();
        let flat = b.flat_state(1).unwrap().into_owned();
        let wide = f.convert_flat(StateType::Bf16, &flat).unwrap();
        let l2 = f.region(2);
        assert_eq!(wide[l2.start + 5], 0.25);
        assert_eq!(wide[l2.end - 1], 1.5);
        assert_eq!(wide.iter().filter(|v| **v != 0.0).count(), 2);
        // f32 → bf16 rounds to nearest even; back is exact.
        let mut w = wide.into_owned();
        w[l2.end - 2] = f32::from_bits(0x3f81_8000);
        let narrow = b.convert_flat(StateType::F32, &w).unwrap();
        let back = f.convert_flat(StateType::Bf16, &narrow).unwrap();
        assert_eq!(back[l2.end - 2], f32::from_bits(0x3f82_0000));
        assert_eq!(back[l2.end - 1], 1.5);
        assert!(b.convert_flat(StateType::F32, &w[1..]).is_none());
        // Restoring the checkpoint after a write brings the value back.
        if let StateMut::Bf16(ssm) = b.layer_state(2, 0).unwrap().unwrap().ssm {
            ssm[39] = bf16::from_f32(-2.0);
        }
        b.advance(0, 2).unwrap();
        assert_eq!(b.restore(0, 4), Ok(3));
        let again = b.flat_state(0).unwrap().into_owned();
        assert_eq!(again, flat);
    }

    #[test]
    fn sizes_follow_the_layer_plan() {
        let m = mem();
        assert_eq!(m.bytes_per_seq(), 2 * 14 * 4);
        assert_eq!(m.bytes(), 3 * 2 * 14 * 4);
    }

    #[test]
    fn sequence_operations() {
        let mut m = mem();
        m.state(0, 0).unwrap().unwrap().ssm[3] = 1.5;
        assert!(m.state(1, 0).unwrap().is_none());
        m.advance(0, 5).unwrap();
        assert_eq!(m.seq_len(0), Ok(5));
        m.seq_fork(0, 2).unwrap();
        assert_eq!(m.state(0, 2).unwrap().unwrap().ssm[3], 1.5);
        assert_eq!(m.seq_len(2), Ok(5));
        assert!(matches!(
            m.seq_truncate(0, 2),
            Err(MemoryError::CannotTruncate { .. })
        ));
        m.seq_truncate(0, 7).unwrap();
        m.seq_keep(2).unwrap();
        assert_eq!(m.seq_len(0), Ok(0));
        assert_eq!(m.state(0, 0).unwrap().unwrap().ssm[3], 0.0);
        assert_eq!(m.seq_len(2), Ok(5));
        assert!(matches!(
            m.seq_clear(3),
            Err(MemoryError::SeqOutOfRange { .. })
        ));
        m.seq_truncate(2, 0).unwrap();
        assert_eq!(m.seq_pos_range(2), Ok(0..0));
    }

    #[test]
    fn checkpoints_restore_and_are_shared_by_forks() {
        let mut m = mem();
        m.advance(0, 3).unwrap();
        m.state(2, 0).unwrap().unwrap().conv[0] = 3.0;
        m.checkpoint(0).unwrap();
        m.advance(0, 4).unwrap();
        m.state(2, 0).unwrap().unwrap().conv[0] = 7.0;
        m.seq_fork(0, 1).unwrap();
        assert!(Arc::ptr_eq(
            &m.checkpoints(0).unwrap()[0].state,
            &m.checkpoints(1).unwrap()[0].state
        ));
        assert_eq!(m.restore(0, 5), Ok(3));
        assert_eq!(m.state(2, 0).unwrap().unwrap().conv[0], 3.0);
        // The fork is untouched.
        assert_eq!(m.seq_len(1), Ok(7));
        assert_eq!(m.state(2, 1).unwrap().unwrap().conv[0], 7.0);
        assert_eq!(m.restore(1, 2), Ok(0));
        assert_eq!(m.state(2, 1).unwrap().unwrap().conv[0], 0.0);
        // A truncation onto a checkpoint needs no replay.
        m.advance(0, 10).unwrap();
        m.seq_truncate(0, 3).unwrap();
        assert_eq!(m.seq_len(0), Ok(3));
    }

    #[test]
    fn parked_thinning_keeps_the_tail_and_a_coarse_grid() {
        let mut m = mem();
        m.policy.budget_bytes = usize::MAX / 2;
        for t in 0..40 {
            // a pass writes the state: it moves off a checkpointed buffer
            m.state(0, 0).unwrap().unwrap().ssm[0] = t as f32;
            m.advance(0, 1).unwrap();
            let len = m.seq_len(0).unwrap();
            if len.is_multiple_of(4) || len == 39 {
                m.checkpoint(0).unwrap();
            }
        }
        let free = m.free_buffers();
        let dropped = m.thin_parked(0, 16, 8).unwrap();
        let pos: Vec<usize> = m.checkpoints(0).unwrap().iter().map(|c| c.pos).collect();
        // a grid of 16 before the last 8 tokens, all of those, the newest
        assert_eq!(pos, vec![4, 20, 32, 36, 39, 40]);
        assert_eq!(dropped, 5);
        assert_eq!(m.free_buffers(), free + 5, "the dropped buffers are reused");
        assert_eq!(m.thin_parked(0, 16, 8).unwrap(), 0);
    }

    /// The newest checkpoint of aligned chunked calls outlives the
    /// thinning of a parked sequence, even to its first and last.
    #[test]
    fn parked_thinning_keeps_the_newest_aligned_checkpoint() {
        let mut m = mem();
        m.policy.budget_bytes = usize::MAX / 2;
        for t in 0..40 {
            m.state(0, 0).unwrap().unwrap().ssm[0] = t as f32;
            m.advance(0, 1).unwrap();
            let len = m.seq_len(0).unwrap();
            // a prompt of aligned calls up to 32, then decode steps
            m.set_aligned(0, len <= 32).unwrap();
            if len.is_multiple_of(8) || len > 32 {
                m.checkpoint(0).unwrap();
            }
        }
        m.thin_parked(0, usize::MAX / 4, 0).unwrap();
        let cps = m.checkpoints(0).unwrap();
        let kept: Vec<(usize, bool)> = cps.iter().map(|c| (c.pos, c.aligned)).collect();
        assert_eq!(kept, vec![(8, true), (32, true), (40, false)]);
    }

    #[test]
    fn thinning_keeps_rollback_with_coarser_spacing() {
        let mut m = mem();
        m.policy = CheckpointPolicy {
            interval: 4,
            budget_bytes: m.bytes_per_seq() * 6,
            keep_recent: 2,
            every_call: false,
            call_spacing: 1,
        };
        for _ in 0..100 {
            m.advance(0, 4).unwrap();
            m.checkpoint(0).unwrap();
        }
        let cps = m.checkpoints(0).unwrap();
        assert!(cps.len() <= 6, "{}", cps.len());
        let pos: Vec<usize> = cps.iter().map(|c| c.pos).collect();
        // The latest stays; the older ones are spread out over the history.
        assert_eq!(*pos.last().unwrap(), 400);
        assert!(pos[0] <= 200, "{pos:?}");
        assert!(pos.windows(2).all(|w| w[0] < w[1]));
    }

    /// A checkpoint kept outside (a server's pin) outlives its place in
    /// the list; given back once nothing else holds it, its buffer is
    /// reused, and the free list keeps room for the pins declared.
    #[test]
    fn pinned_checkpoints_come_back_for_reuse() {
        let mut m = mem();
        m.hold_outside(1);
        assert_eq!(m.free_cap(), (m.max_checkpoints() + 3) * 3);
        m.state(0, 0).unwrap().unwrap().ssm[0] = 1.0;
        m.advance(0, 1).unwrap();
        m.checkpoint(0).unwrap();
        let pin = m.checkpoints(0).unwrap()[0].clone();
        // Still in the engine's list: shared, nothing comes back.
        drop(pin.clone());
        assert!(m.pool.is_empty());
        m.seq_clear(0).unwrap();
        let free = m.free_buffers();
        let ptr = pin.state.as_ptr();
        // Dropped outside the memory, its buffer comes back all the same.
        drop(pin);
        assert_eq!(m.free_buffers(), free + 1);
        assert!(m.pool.free_ptrs().contains(&ptr));
    }

    /// Whoever drops a state buffer last — a rollback, a fork over a slot,
    /// a cleared slot, a verification — it goes back to the pool: a load
    /// that rolls back, forks and clears over and over allocates nothing
    /// once the pool holds what the slots use at most.
    #[test]
    fn every_dropped_buffer_comes_back() {
        let mut m = mem();
        m.policy.every_call = true;
        m.reserve_buffers(usize::MAX);
        let mut reserved = m.pool.free_ptrs();
        // The zero state the empty slots share (no pool's).
        reserved.push(m.slots[0].state.as_ptr());
        let known = |m: &RecurrentMemory| {
            m.slots.iter().all(|sl| {
                reserved.contains(&sl.state.as_ptr())
                    && sl
                        .checkpoints
                        .iter()
                        .all(|c| reserved.contains(&c.state.as_ptr()))
            })
        };
        for round in 0..20 {
            for s in 0..3 {
                for _ in 0..6 {
                    m.state(0, s).unwrap().unwrap().ssm[0] = round as f32;
                    m.advance(s, 1).unwrap();
                    m.checkpoint(s).unwrap();
                }
            }
            assert!(known(&m), "round {round}: a fresh buffer");
            let pos = m.checkpoints(0).unwrap()[0].pos;
            m.restore(0, pos).unwrap();
            m.seq_fork(0, 1).unwrap();
            m.spec_begin(2).unwrap();
            m.state(0, 2).unwrap().unwrap().ssm[0] = -1.0;
            m.spec_abort(2).unwrap();
            m.seq_clear(2).unwrap();
            assert!(known(&m), "round {round}: a fresh buffer");
        }
    }

    /// Reserved buffers (capped at what the slots hold together) are what
    /// a sequence checkpointing every token moves its state into.
    #[test]
    fn a_checkpoint_per_token_runs_on_reserved_buffers() {
        let mut m = mem();
        let cap = (m.max_checkpoints() + 2) * 3;
        assert_eq!(m.reserve_buffers(usize::MAX), cap);
        assert_eq!(m.reserve_buffers(5), 0, "already full");
        let reserved = m.pool.free_ptrs();
        for t in 0..4 {
            m.state(0, 1).unwrap().unwrap().ssm[0] = t as f32;
            m.advance(1, 1).unwrap();
            m.checkpoint(1).unwrap();
            assert!(
                reserved.contains(&m.slots[1].state.as_ptr()),
                "token {t}: a fresh buffer"
            );
        }
        assert_eq!(m.state(0, 1).unwrap().unwrap().ssm[0], 3.0);
    }

    /// Clearing a sequence whose state is shared (here the zero state
    /// every slot starts from; or a checkpoint, a fork) zeroes a reserved
    /// buffer rather than mapping fresh pages.
    #[test]
    fn clearing_a_shared_state_zeroes_a_reserved_buffer() {
        let mut m = mem();
        m.reserve_buffers(usize::MAX);
        let reserved = m.pool.free_ptrs();
        m.seq_clear(2).unwrap();
        assert!(reserved.contains(&m.slots[2].state.as_ptr()));
        assert!(m.slots[2].state.iter().all(|&v| v == 0.0));
        // A reserved buffer that held another state comes out zero.
        m.pool.fill_free(7.0);
        m.seq_clear(1).unwrap();
        assert!(m.slots[1].state.iter().all(|&v| v == 0.0));
    }

    #[test]
    fn several_sequences_borrowed_at_once_each_get_their_own() {
        let mut m = mem();
        m.state(0, 1).unwrap().unwrap().ssm[0] = 4.0;
        m.advance(1, 2).unwrap();
        m.checkpoint(1).unwrap();
        let states = m.states_moving(0, &[2, 1]).unwrap().unwrap();
        assert_eq!(states.len(), 2);
        // Sequence 2 never wrote (its zero state moves off the shared one),
        // sequence 1 moves off its checkpoint: both come with the source.
        assert_eq!(states[0].1.map(|f| f32s(f)[0]), Some(0.0));
        assert_eq!(states[1].1.map(|f| f32s(f)[0]), Some(4.0));
        for (i, (st, _)) in states.into_iter().enumerate() {
            f32s_mut(st.ssm).fill(i as f32 + 10.0);
        }
        assert_eq!(m.state(0, 2).unwrap().unwrap().ssm[7], 10.0);
        assert_eq!(m.state(0, 1).unwrap().unwrap().ssm[7], 11.0);
        // The checkpoint kept the old state.
        assert_eq!(m.checkpoints(1).unwrap()[0].state[6], 4.0);
        assert!(m.states_moving(1, &[0, 1]).unwrap().is_none());
        assert!(matches!(
            m.states_moving(0, &[1, 1]),
            Err(MemoryError::DuplicateSeq { seq: 1 })
        ));
        assert!(matches!(
            m.states_moving(0, &[0, 5]),
            Err(MemoryError::SeqOutOfRange { .. })
        ));
    }

    #[test]
    fn forks_share_the_state_until_written() {
        let mut m = mem();
        let one = m.bytes_per_seq();
        // Untouched slots share one zero state.
        assert_eq!(m.resident_bytes(), one);
        m.state(0, 0).unwrap().unwrap().ssm[0] = 2.0;
        assert_eq!(m.resident_bytes(), 2 * one);
        m.advance(0, 4).unwrap();
        m.seq_fork(0, 1).unwrap();
        assert_eq!(m.resident_bytes(), 2 * one, "a fork copies no state");
        assert_eq!(m.flat_state(1).unwrap(), m.flat_state(0).unwrap());
        // The fork's first write copies; the source does not change.
        m.state(2, 1).unwrap().unwrap().conv[0] = 5.0;
        assert_eq!(m.resident_bytes(), 3 * one);
        assert_eq!(m.state(2, 0).unwrap().unwrap().conv[0], 0.0);
        assert_eq!(m.state(0, 1).unwrap().unwrap().ssm[0], 2.0);
        // Clearing a shared state leaves the sharer alone.
        m.seq_fork(1, 2).unwrap();
        m.seq_clear(1).unwrap();
        assert_eq!(m.state(2, 2).unwrap().unwrap().conv[0], 5.0);
        assert_eq!(m.state(2, 1).unwrap().unwrap().conv[0], 0.0);
    }

    #[test]
    fn bytes_of_some_sequences_count_shared_buffers_once() {
        let mut m = mem();
        let one = m.bytes_per_seq();
        for _ in 0..3 {
            m.state(0, 0).unwrap().unwrap().ssm[0] += 1.0;
            m.advance(0, 4).unwrap();
            m.checkpoint(0).unwrap();
        }
        m.seq_fork(0, 1).unwrap();
        // The fork shares the state and the three checkpoints.
        assert_eq!(m.resident_bytes_of([0, 1]), one);
        assert_eq!(m.checkpoint_bytes_of([0, 1]), 3 * one);
        assert_eq!(
            m.checkpoint_bytes(0).unwrap() + m.checkpoint_bytes(1).unwrap(),
            6 * one
        );
        // The fork goes on: its own state and one checkpoint of its own.
        m.state(0, 1).unwrap().unwrap().ssm[0] += 1.0;
        m.advance(1, 4).unwrap();
        m.checkpoint(1).unwrap();
        assert_eq!(m.resident_bytes_of([0, 1]), 2 * one);
        assert_eq!(m.checkpoint_bytes_of([0, 1]), 4 * one);
        assert_eq!(m.checkpoint_bytes_of([1, 1, 7]), 4 * one);
        assert_eq!(m.resident_bytes_of([]), 0);
        // Clones kept elsewhere count once with the lists they came from.
        let kept: Vec<Checkpoint> = m.checkpoints(1).unwrap()[2..].to_vec();
        let all = m
            .checkpoints(0)
            .unwrap()
            .iter()
            .chain(m.checkpoints(1).unwrap());
        assert_eq!(distinct_checkpoint_bytes(all.chain(&kept)), 4 * one);
    }

    #[test]
    fn checkpoint_per_token_reuses_buffers() {
        let mut m = mem();
        m.policy = CheckpointPolicy {
            interval: 512,
            budget_bytes: m.bytes_per_seq() * 5,
            keep_recent: 2,
            every_call: true,
            call_spacing: 1,
        };
        let mut ptrs = std::collections::HashSet::new();
        for t in 0..200 {
            let st = m.state(0, 0).unwrap().unwrap();
            st.ssm[0] += 1.0;
            m.state(2, 0).unwrap().unwrap().conv[1] = t as f32;
            m.advance(0, 1).unwrap();
            m.settle(0).unwrap();
            m.checkpoint(0).unwrap();
            ptrs.insert(Arc::as_ptr(&m.slots[0].state) as usize);
        }
        // The state moves between a handful of recycled buffers, never a
        // fresh one per token.
        assert!(ptrs.len() <= 8, "{} distinct state buffers", ptrs.len());
        // Every checkpoint still holds its own exact state.
        for c in m.checkpoints(0).unwrap() {
            assert_eq!(c.state[m.region(0).start + 6], c.pos as f32);
        }
        // A sequence cleared gives its buffers back: the next one to run
        // (another slot) takes them instead of new ones.
        let used: Vec<*const f32> = m.slots[0]
            .checkpoints
            .iter()
            .map(|c| c.state.as_ptr())
            .collect();
        m.seq_clear(0).unwrap();
        // All but the newest (the current state, zeroed in place) are free
        // for any slot.
        let free = m.free_buffers();
        assert!(free >= used.len() - 1, "{free} free");
        let pooled = m.pool.free_ptrs();
        assert!(used[..used.len() - 1].iter().all(|p| pooled.contains(p)));
        for t in 0..free {
            m.state(0, 1).unwrap().unwrap().ssm[0] = t as f32;
            m.advance(1, 1).unwrap();
            m.checkpoint(1).unwrap();
            let p = m.slots[1].state.as_ptr();
            assert!(pooled.contains(&p), "token {t}: a fresh buffer");
        }
    }
    #[test]
    fn verification_keeps_the_state_before_it_and_recycles_buffers() {
        let mut m = mem();
        m.state(0, 0).unwrap().unwrap().ssm[0] = 1.0;
        m.advance(0, 3).unwrap();
        m.spec_begin(0).unwrap();
        assert_eq!(m.spec_base_len(0), Some(3));
        // The pass moves off the kept state; tapes are per layer.
        m.state(0, 0).unwrap().unwrap().ssm[0] = 2.0;
        m.tape(2, 0).unwrap().extend([5.0, 6.0]);
        assert!(m.tape(1, 1).is_none());
        m.advance(0, 4).unwrap();
        m.settle(0).unwrap();
        let (st, base_conv, base_ssm, tape) = m.refold_parts(0, 0).unwrap();
        let now = f32s_mut(st.ssm)[0];
        assert_eq!((now, f32s(base_ssm)[0], base_conv.len()), (2.0, 1.0, 6));
        assert!(tape.is_empty());
        assert_eq!(m.refold_parts(2, 0).unwrap().3, &[5.0, 6.0]);
        // Abort: back to the state and length before.
        assert_eq!(m.spec_abort(0), Ok(3));
        assert_eq!(m.state(0, 0).unwrap().unwrap().ssm[0], 1.0);
        assert!(m.spec_base_len(0).is_none());
        // End: the state stays, the old buffer goes back to the pool, tapes are
        // cleared for the next verification.
        m.spec_begin(0).unwrap();
        assert!(m.tape(2, 0).unwrap().is_empty());
        m.state(0, 0).unwrap().unwrap().ssm[0] = 3.0;
        m.advance(0, 2).unwrap();
        m.settle(0).unwrap();
        let free = m.free_buffers();
        m.spec_end(0, 5).unwrap();
        assert_eq!(m.seq_len(0), Ok(5));
        assert_eq!(m.state(0, 0).unwrap().unwrap().ssm[0], 3.0);
        assert_eq!(m.free_buffers(), free + 1);
        assert!(m.spec_base_len(0).is_none());
    }
}
