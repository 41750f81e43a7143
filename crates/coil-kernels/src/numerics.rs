//! Batch-invariant numerics: the switch that makes a row's result independent
//! of how many rows share its call.
//!
//! The kernels choose their algorithm by the number of rows they are given:
//! a weight product switches from per-row dot products to a GEMM from a
//! dozen or so tokens on, attention groups queries in blocks, and the
//! sequence mixers switch from the token-by-token recurrence to their
//! chunked forms. Some of these choices give every row the bits it gets
//! alone — the GEMMs that round as the one-token kernels do
//! (`matmul::plan::gemm_keeps_tokens`), the tiled attention kernel — and
//! the others are exact to f32 rounding, not bit for bit: without this
//! switch the logits of a position can move (by ~1e-6 relative) with the
//! size of its micro-batch.
//!
//! Inside an [`invariant_scope`]`(true)` ([`Invariance::Full`]) every such
//! choice gives the bits a single token gets alone: per-row dot products
//! where the GEMM does not (with the per-row activation quantization and
//! the fixed reduction order of the one-token kernels; the multi-token dot
//! kernels compute each token with exactly the one-token kernel's
//! operations), attention one query at a time where the kernel's rows
//! depend on each other, and the recurrences step by step. A row's result
//! is then bit for bit what it is in a micro-batch of one token, whatever
//! else shares the call — what speculative verification and batched
//! decoding need to reproduce plain decoding exactly.
//!
//! [`Invariance::Cheap`] (what `coil serve` runs prompts with) keeps every
//! invariant choice that costs no speed — attention as in `Full`, weight
//! products whose GEMM keeps tokens — and takes the fast choice for the
//! rest: the GEMM of the other weight products (their per-row kernels
//! would cost a prompt its GEMM) and the chunked recurrences (Mamba-2's
//! token by token cost a mamba2-370m-like prompt ~1.5×): batch-invariant
//! for a model
//! without chunked recurrences whose weights are all in formats whose GEMM
//! keeps tokens at the running SIMD level.
//!
//! The switch is per thread (the thread that calls the kernels, which then
//! decide before they hand work to the pool) and scoped: the model's forward
//! pass enters it from its micro-batch's setting (`coil::models::UBatch::invariance`).

use std::cell::Cell;

/// How far the kernels of the calling thread keep rows independent of their
/// call (see the module documentation).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Invariance {
    /// The fastest kernels for each call's size.
    #[default]
    Off,
    /// Every invariant choice that costs no speed; the fast GEMM for the
    /// weight products whose GEMM does not keep tokens, the chunked
    /// recurrences.
    Cheap,
    /// Every row bit for bit its one-token result.
    Full,
}

thread_local! {
    static INVARIANCE: Cell<Invariance> = const { Cell::new(Invariance::Off) };
}

/// The calling thread's [`Invariance`].
#[inline]
pub fn invariance() -> Invariance {
    INVARIANCE.with(Cell::get)
}

/// Whether the calling thread is inside an [`invariant_scope`]`(true)`
/// ([`Invariance::Full`]).
#[inline]
pub fn batch_invariant() -> bool {
    invariance() == Invariance::Full
}

/// Restores the previous setting when dropped (not `Send`: the setting
/// belongs to the thread that made it).
#[must_use = "the setting lasts only while the guard lives"]
pub struct InvariantScope {
    prev: Invariance,
    _not_send: std::marker::PhantomData<*const ()>,
}

/// Sets batch-invariant numerics on ([`Invariance::Full`]) or off for the
/// calling thread until the returned guard is dropped.
pub fn invariant_scope(on: bool) -> InvariantScope {
    invariance_scope(if on {
        Invariance::Full
    } else {
        Invariance::Off
    })
}

/// Sets `mode` for the calling thread until the returned guard is dropped.
pub fn invariance_scope(mode: Invariance) -> InvariantScope {
    let prev = INVARIANCE.with(|c| c.replace(mode));
    InvariantScope {
        prev,
        _not_send: std::marker::PhantomData,
    }
}

impl Drop for InvariantScope {
    fn drop(&mut self) {
        INVARIANCE.with(|c| c.set(self.prev));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scopes_nest_and_restore() {
        assert!(!batch_invariant());
        {
            let _a = invariant_scope(true);
            assert!(batch_invariant());
            {
                let _b = invariant_scope(false);
                assert!(!batch_invariant());
            }
            assert!(batch_invariant());
            {
                let _c = invariance_scope(Invariance::Cheap);
                assert_eq!(invariance(), Invariance::Cheap);
                assert!(!batch_invariant());
            }
            assert_eq!(invariance(), Invariance::Full);
            // Other threads are not affected.
            assert!(!std::thread::spawn(batch_invariant).join().unwrap());
        }
        assert!(!batch_invariant());
    }
}
