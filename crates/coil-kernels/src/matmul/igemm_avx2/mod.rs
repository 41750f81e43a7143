//! Integer GEMM for many tokens (prefill) at the AVX2 level (no VNNI): the
//! K-quants (Q4_K, Q5_K, Q6_K, Q2_K, Q3_K, [`kquant`])
//! and the formats of small integers with one scale (and for Q4_1 / Q5_1 a
//! min) per 32 values (Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, IQ4_NL, IQ4_XS:
//! [`scale32`]).
//!
//! Both multiply small integers exactly in i32 per scale group and apply
//! the float scales once per group: weights packed per panel of [`NR`] rows
//! (one 256-bit vector of i32 / f32 lanes), activations quantized once per
//! call, a microkernel holding a few tokens × 8 rows in registers. This
//! file is what they share: the panels over the thread pool, the next
//! panel's rows fetched while one is multiplied, the token tiles, the
//! stores.

mod kquant;
mod quant;
mod scale32;

use super::WeightRef;
use crate::pool::ThreadPool;
use coil_gguf::GgmlType;
use std::arch::x86_64::*;
use std::cell::RefCell;

/// Weight rows per panel (one 256-bit vector of i32 / f32 lanes).
const NR: usize = 8;

/// Whether `ty` has an AVX2 integer GEMM.
/// (The dispatch table, `plan::FORMATS`, says when it runs; its test
/// checks the two agree.)
#[cfg(test)]
pub fn supported(ty: GgmlType) -> bool {
    kquant_format(ty) || scale32::supported(ty)
}

fn kquant_format(ty: GgmlType) -> bool {
    use GgmlType::*;
    matches!(ty, Q4_K | Q5_K | Q6_K | Q2_K | Q3_K)
}

/// `y = x · wᵀ` for `n_tokens` tokens. The caller checks [`supported`] and
/// that the CPU has AVX2 + FMA + F16C.
pub fn igemm(pool: &ThreadPool, w: &WeightRef, x: &[f32], y: &mut [f32], n_tokens: usize) {
    if kquant_format(w.ty) {
        kquant::igemm(pool, w, x, y, n_tokens)
    } else {
        scale32::igemm(pool, w, x, y, n_tokens)
    }
}

/// The activation quantization a matrix needs: matrices with the same one
/// can share it ([`igemm_many`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ActKey {
    /// A K-quant's: one sum per `usize` values ([`kquant::act_group`]).
    KQuant(usize),
    /// The 32-value formats': tiles of i16 pairs, with the block sums of a
    /// min (Q4_1, Q5_1) or without.
    Scale32 { sums: bool },
}

/// The activation quantization `ty`'s products use, `None` where there is
/// no integer GEMM for it.
pub fn shared_acts(ty: GgmlType) -> Option<ActKey> {
    if kquant_format(ty) {
        Some(ActKey::KQuant(kquant::act_group(ty)))
    } else {
        scale32::supported(ty).then(|| ActKey::Scale32 {
            sums: scale32::has_min(ty),
        })
    }
}

/// `ys[i] = x · ws[i]ᵀ` for matrices of one [`shared_acts`] key: the
/// activations quantized once, each result bit for bit its [`igemm`].
pub fn igemm_many(
    pool: &ThreadPool,
    ws: &[&WeightRef],
    x: &[f32],
    ys: &mut [&mut [f32]],
    n_tokens: usize,
) {
    if kquant_format(ws[0].ty) {
        kquant::igemm_many(pool, ws, x, ys, n_tokens, crate::simd::avx_vnni())
    } else {
        scale32::igemm_many(pool, ws, x, ys, n_tokens)
    }
}

/// Runs `item(r0, nr, panel)` for every panel of `height` weight rows
/// (`r0..r0 + nr`, `nr < height` only for the last) over the pool, each
/// thread with its own reusable `P` from `key`; the next panel's encoded
/// rows are fetched into L2 when `item` has packed this one (`item` calls
/// `packed()` then; its decode would otherwise wait on memory).
fn over_panels<P: Default + 'static>(
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
                        super::gemm::prefetch(&w.data[next * rb..end * rb]);
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
unsafe fn store_tokens(
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
fn tile_tokens<const NT: usize>(ts: &[usize]) -> [usize; NT] {
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
