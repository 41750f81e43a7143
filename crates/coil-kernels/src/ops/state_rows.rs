//! State rows in memory, for the recurrent scans of every family (`ssm/`,
//! `delta/`): a state of tens of MB streams from memory once per token, so
//! its rows are prefetched far ahead, and a state moving to a new buffer
//! (a checkpoint keeps the old one) is written with non-temporal stores
//! (each family's `moving.rs`), ordered by [`fence`] before the pool hands
//! the work back.

/// Prefetches the state values 2 KB past the `n`-value row at `row` into L1
/// and 4 KB past it into L2 (as the decode dot kernels do with weights: a
/// state of tens of MB streams from memory every token, and one core's
/// share of the bandwidth needs requests started that early). Prefetching
/// past the end of the state is harmless.
#[inline(always)]
pub(crate) fn prefetch_rows_ahead(row: *const f32, n: usize) {
    #[cfg(target_arch = "x86_64")]
    {
        use std::arch::x86_64::{_mm_prefetch, _MM_HINT_T0, _MM_HINT_T1};
        let b = row as *const i8;
        let mut off = 0;
        while off < 4 * n {
            // SAFETY: prefetches never fault, whatever the address.
            unsafe {
                _mm_prefetch::<_MM_HINT_T0>(b.wrapping_add(2048 + off));
                _mm_prefetch::<_MM_HINT_T1>(b.wrapping_add(4096 + off));
            }
            off += 64;
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = (row, n);
}

/// Whether rows of `n` f32 can be streamed into `dst` (the kernels' moving
/// rows: AVX2, rows a whole number of 16-lane steps, the destination 16-byte
/// aligned).
#[inline]
pub(crate) fn can_stream(dst: &[f32], n: usize) -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        n.is_multiple_of(16)
            && (dst.as_ptr() as usize).is_multiple_of(16)
            && std::arch::is_x86_feature_detected!("avx2")
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        let _ = (dst, n);
        false
    }
}

/// Orders the streamed stores before what follows (the pool's hand-back).
#[inline]
pub(crate) fn fence() {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: SSE is part of x86-64.
    unsafe {
        std::arch::x86_64::_mm_sfence()
    };
}
