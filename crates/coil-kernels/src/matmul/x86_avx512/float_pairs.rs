//! One-token F16 / BF16 rows two at a time (decode at the AVX-512 level).
//!
//! A row's dot product reads its 16-bit weights from memory and the
//! token's f32 activations — twice the weights' bytes — from L1 or L2 (an
//! 8192-wide row's 32 KB of activations do not stay in L1). Two rows share
//! each activation load. Each row's floating-point operations are the
//! one-row kernel's ([`super::dot_f16`], [`super::dot_bf16`]) in the same
//! order: the same bits, paired or not.
//!
//! Measured on an AMD Zen 4 (2 threads, interleaved): lfm2-1.2b-like F16
//! decode 17.1–17.8 → 19.2–19.3 tokens/s.

use super::dots::PF_BYTES_16;
use crate::matmul::x86_avx2::dots::PF_FAR;
use coil_gguf::GgmlType;
use std::arch::x86_64::*;

/// The address `off` bytes into the stream of the row at `w` (`rb` bytes):
/// walked in pairs, a row's bytes continue in the row two below it (the
/// next pair's row in the same place), not in the next one, which its
/// pair partner reads. (Prefetching straight past the row's end fetched
/// the partner's bytes again and left the next pair's second row cold:
/// 2048-wide rows ran 30% slower paired than alone.)
#[inline(always)]
fn ahead(w: *const u8, off: usize, rb: usize) -> *const u8 {
    // `off` reaches `k` rows of this stream on: row `2k` below, at
    // `off - k·rb`
    let k = off / rb;
    w.wrapping_add(k * rb + off)
}

/// 16 values of a 16-bit float row from value `i`, as f32.
#[inline(always)]
unsafe fn load<const BF16: bool>(w: *const u8, i: usize) -> __m512 {
    let h = _mm256_loadu_si256(w.add(2 * i) as *const __m256i);
    if BF16 {
        _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16))
    } else {
        _mm512_cvtph_ps(h)
    }
}

/// The one-row kernel of the format.
#[inline(always)]
unsafe fn one<const BF16: bool>(row: &[u8], x: &[f32]) -> f32 {
    if BF16 {
        super::dots::dot_bf16(row, x)
    } else {
        super::dots::dot_f16(row, x)
    }
}

/// Rows at `a` and `b` (`x.len()` values each) against `x`.
///
/// # Safety
/// AVX-512 F/BW/VL and F16C available; `a` and `b` hold `2 · x.len()`
/// bytes.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,f16c")]
#[inline]
unsafe fn dot2<const BF16: bool>(a: *const u8, b: *const u8, x: &[f32]) -> (f32, f32) {
    let n = x.len();
    let rb = 2 * n;
    let xp = x.as_ptr();
    let mut acc = [[_mm512_setzero_ps(); 4]; 2];
    let mut i = 0;
    while i + 64 <= n {
        for w in [a, b] {
            let near = ahead(w, 2 * i + PF_BYTES_16, rb);
            _mm_prefetch::<_MM_HINT_T0>(near as *const i8);
            _mm_prefetch::<_MM_HINT_T0>(near.wrapping_add(64) as *const i8);
            let far = ahead(w, 2 * i + PF_FAR, rb);
            _mm_prefetch::<_MM_HINT_T1>(far as *const i8);
            _mm_prefetch::<_MM_HINT_T1>(far.wrapping_add(64) as *const i8);
        }
        for j in 0..4 {
            let o = i + 16 * j;
            let xv = _mm512_loadu_ps(xp.add(o));
            acc[0][j] = _mm512_fmadd_ps(load::<BF16>(a, o), xv, acc[0][j]);
            acc[1][j] = _mm512_fmadd_ps(load::<BF16>(b, o), xv, acc[1][j]);
        }
        i += 64;
    }
    while i + 16 <= n {
        let xv = _mm512_loadu_ps(xp.add(i));
        acc[0][0] = _mm512_fmadd_ps(load::<BF16>(a, i), xv, acc[0][0]);
        acc[1][0] = _mm512_fmadd_ps(load::<BF16>(b, i), xv, acc[1][0]);
        i += 16;
    }
    let sum = |a: &[__m512; 4]| {
        let s = _mm512_add_ps(_mm512_add_ps(a[0], a[1]), _mm512_add_ps(a[2], a[3]));
        _mm512_reduce_add_ps(s)
    };
    let (mut sa, mut sb) = (sum(&acc[0]), sum(&acc[1]));
    if i < n {
        let tail = |w: *const u8| std::slice::from_raw_parts(w.add(2 * i), 2 * (n - i));
        if BF16 {
            sa += crate::matmul::scalar::vecdot::dot_bf16(tail(a), &x[i..]);
            sb += crate::matmul::scalar::vecdot::dot_bf16(tail(b), &x[i..]);
        } else {
            sa += crate::matmul::scalar::vecdot::dot_f16(tail(a), &x[i..]);
            sb += crate::matmul::scalar::vecdot::dot_f16(tail(b), &x[i..]);
        }
    }
    (sa, sb)
}

/// `out[r]` = row `r` of `w` (rows of `2 · x.len()` bytes, consecutive)
/// against `x`, in pairs (a last odd row alone).
///
/// # Safety
/// AVX-512 F/BW/VL and F16C available; `w` holds `out.len()` rows.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,f16c")]
unsafe fn rows<const BF16: bool>(w: &[u8], x: &[f32], out: &mut [f32]) {
    let (n, rb) = (out.len(), 2 * x.len());
    assert!(w.len() >= n * rb);
    let p = w.as_ptr();
    let mut r = 0;
    while r + 2 <= n {
        let (ya, yb) = dot2::<BF16>(p.add(r * rb), p.add((r + 1) * rb), x);
        out[r] = ya;
        out[r + 1] = yb;
        r += 2;
    }
    if r < n {
        out[r] = one::<BF16>(&w[r * rb..(r + 1) * rb], x);
    }
}

/// The paired one-token kernel of `ty` (F16, BF16), bit for bit its dot
/// product's results.
pub(in crate::matmul) fn rows_kernel(ty: GgmlType) -> Option<crate::matmul::kernel::FloatRows> {
    // SAFETY (both): selected only at the AVX-512 level, which checks the
    // CPU's features.
    match ty {
        GgmlType::F16 => Some(|w, x, o| unsafe { rows::<false>(w, x, o) }),
        GgmlType::BF16 => Some(|w, x, o| unsafe { rows::<true>(w, x, o) }),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testutil::{random_weights, Rng};

    /// Paired rows equal the one-row kernel bit for bit (odd and even row
    /// counts, widths with and without a tail, both formats).
    #[test]
    fn pairs_equal_single_rows_bit_for_bit() {
        if !(is_x86_feature_detected!("avx512f")
            && is_x86_feature_detected!("avx512bw")
            && is_x86_feature_detected!("avx512vl")
            && is_x86_feature_detected!("f16c"))
        {
            return;
        }
        let mut rng = Rng::new(16);
        for ty in [GgmlType::F16, GgmlType::BF16] {
            let k = rows_kernel(ty).unwrap();
            for (rows, cols) in [(1, 64), (2, 80), (7, 2048), (6, 100), (5, 8), (3, 8192)] {
                let data = random_weights(&mut rng, ty, rows, cols);
                let rb = 2 * cols;
                let x: Vec<f32> = (0..cols).map(|_| rng.f32() * 4.0 - 2.0).collect();
                let mut out = vec![f32::NAN; rows];
                k(&data, &x, &mut out);
                for (r, y) in out.iter().enumerate() {
                    // SAFETY: features checked above.
                    let single = unsafe {
                        if ty == GgmlType::BF16 {
                            one::<true>(&data[r * rb..(r + 1) * rb], &x)
                        } else {
                            one::<false>(&data[r * rb..(r + 1) * rb], &x)
                        }
                    };
                    assert_eq!(
                        y.to_bits(),
                        single.to_bits(),
                        "{ty} rows {rows} cols {cols} row {r}"
                    );
                }
            }
        }
    }
}
