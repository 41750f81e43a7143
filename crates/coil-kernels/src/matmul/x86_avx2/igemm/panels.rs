//! What the AVX2 integer GEMMs share: the panels of weight rows over the
//! thread pool (the next panel's rows fetched while one is multiplied),
//! the token tiles, the stores.

use crate::matmul::weight::WeightRef;
use crate::pool::ThreadPool;
use std::arch::x86_64::*;
use std::cell::RefCell;

/// Weight rows per panel (one 256-bit vector of i32 / f32 lanes).
pub(super) const NR: usize = 8;

/// Runs `item(r0, nr, panel)` for every panel of `height` weight rows
/// (`r0..r0 + nr`, `nr < height` only for the last) over the pool, each
/// thread with its own reusable `P` from `key`; the next panel's encoded
/// rows are fetched into L2 when `item` has packed this one (`item` calls
/// `packed()` then; its decode would otherwise wait on memory).
pub(super) fn over_panels<P: Default + 'static>(
    pool: &ThreadPool,
    w: &WeightRef,
    height: usize,
    key: &'static std::thread::LocalKey<RefCell<P>>,
    item: impl Fn(usize, usize, &mut P, &dyn Fn()) + Sync,
) {
    let rows = w.rows;
    let rb = w.row_bytes();
    pool.parallel_for(rows.div_ceil(height), 1, |pr, _| {
        key.with(|p| {
            let mut p = p.borrow_mut();
            for it in pr {
                let r0 = height * it;
                let next = r0 + height;
                let fetch_next = || {
                    if next < rows {
                        let end = (next + height).min(rows);
                        crate::matmul::gemm::prefetch(&w.data[next * rb..end * rb]);
                    }
                };
                item(r0, height.min(rows - r0), &mut p, &fetch_next);
            }
        })
    });
}

/// Stores `acc[i]` (rows `r0..r0 + nr` of token `ts[i]`) into `y`.
///
/// # Safety
/// AVX available; `y` is `[tokens, rows]` and holds every `ts[i]`'s row;
/// `nr ≤ NR`, `r0 + nr ≤ rows`.
#[inline(always)]
pub(super) unsafe fn store_tokens(
    acc: &[__m256],
    ts: &[usize],
    nr: usize,
    y: *mut f32,
    rows: usize,
    r0: usize,
) {
    for (a, &t) in acc.iter().zip(ts) {
        let dst = y.add(t * rows + r0);
        if nr == NR {
            _mm256_storeu_ps(dst, *a);
        } else {
            let mut tmp = [0f32; NR];
            _mm256_storeu_ps(tmp.as_mut_ptr(), *a);
            std::ptr::copy_nonoverlapping(tmp.as_ptr(), dst, nr);
        }
    }
}

/// The `NT` token indices of a tile of `ts` (`1 ≤ ts.len() ≤ NT`): unused
/// slots repeat the last token (computed, not stored).
#[inline(always)]
pub(super) fn tile_tokens<const NT: usize>(ts: &[usize]) -> [usize; NT] {
    std::array::from_fn(|i| ts[i.min(ts.len() - 1)])
}

/// `out[j][i] = v[i][j]` (8 × 8, 32-bit lanes).
#[inline(always)]
pub(super) unsafe fn transpose8(r: [__m256; 8]) -> [__m256; 8] {
    let mut t = [_mm256_setzero_ps(); 8];
    for k in 0..4 {
        t[2 * k] = _mm256_unpacklo_ps(r[2 * k], r[2 * k + 1]);
        t[2 * k + 1] = _mm256_unpackhi_ps(r[2 * k], r[2 * k + 1]);
    }
    let mut u = [_mm256_setzero_ps(); 8];
    for q in 0..2 {
        let (a, b, c, d) = (t[4 * q], t[4 * q + 1], t[4 * q + 2], t[4 * q + 3]);
        u[4 * q] = _mm256_shuffle_ps::<0x44>(a, c);
        u[4 * q + 1] = _mm256_shuffle_ps::<0xee>(a, c);
        u[4 * q + 2] = _mm256_shuffle_ps::<0x44>(b, d);
        u[4 * q + 3] = _mm256_shuffle_ps::<0xee>(b, d);
    }
    std::array::from_fn(|j| {
        if j < 4 {
            _mm256_permute2f128_ps::<0x20>(u[j], u[j + 4])
        } else {
            _mm256_permute2f128_ps::<0x31>(u[j - 4], u[j])
        }
    })
}
