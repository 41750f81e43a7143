//! Batch-invariant numerics: the switch that makes a row's result independent
//! of how many rows share its call.
//!
//! The kernels choose their algorithm by the number of rows they are given:
//! a weight product switches from per-row dot products to a GEMM from a
//! dozen or so tokens on, attention groups queries in blocks, and the
//! sequence mixers switch from the token-by-token recurrence to their
//! chunked forms. Each choice is exact to f32 rounding, not bit for bit, so
//! without this switch the logits of a position move (by ~1e-6 relative)
//! with the size of its micro-batch.
//!
//! Inside an [`invariant_scope`]`(true)` every such choice takes the path a
//! single token takes alone: per-row dot products (with the per-row
//! activation quantization and the fixed reduction order of the one-token
//! kernels; the multi-token dot kernels compute each token with exactly the
//! one-token kernel's operations), attention one query at a time, and the
//! recurrences step by step. A row's result is then bit for bit what it is
//! in a micro-batch of one token, whatever else shares the call — what
//! speculative verification and batched decoding need to reproduce plain
//! decoding exactly. Prefill of long prompts stays outside the scope and
//! keeps the fast paths.
//!
//! The switch is per thread (the thread that calls the kernels, which then
//! decide before they hand work to the pool) and scoped: the model's forward
//! pass enters it from its micro-batch's flag (`coil::models::UBatch::invariant`).

use std::cell::Cell;

thread_local! {
    static INVARIANT: Cell<bool> = const { Cell::new(false) };
}

/// Whether the calling thread is inside an [`invariant_scope`]`(true)`.
#[inline]
pub fn batch_invariant() -> bool {
    INVARIANT.with(Cell::get)
}

/// Restores the previous setting when dropped (not `Send`: the setting
/// belongs to the thread that made it).
#[must_use = "the setting lasts only while the guard lives"]
pub struct InvariantScope {
    prev: bool,
    _not_send: std::marker::PhantomData<*const ()>,
}

/// Sets batch-invariant numerics on (or off) for the calling thread until
/// the returned guard is dropped.
pub fn invariant_scope(on: bool) -> InvariantScope {
    let prev = INVARIANT.with(|c| c.replace(on));
    InvariantScope {
        prev,
        _not_send: std::marker::PhantomData,
    }
}

impl Drop for InvariantScope {
    fn drop(&mut self) {
        INVARIANT.with(|c| c.set(self.prev));
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
            // Other threads are not affected.
            assert!(!std::thread::spawn(batch_invariant).join().unwrap());
        }
        assert!(!batch_invariant());
    }
}
