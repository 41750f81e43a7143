//! One-token F16 / BF16 rows four at a time (decode at the AVX2 level):
//! four rows share each load of the token's f32 activations, and each
//! row's floating-point operations are [`super::dots::dot_f16`]'s /
//! [`super::dots::dot_bf16`]'s in the same order: the same bits, grouped or not.
//!
//! The four are row `r` of each quarter of the call's rows: four streams,
//! each reading consecutive rows, far apart in memory, each prefetched
//! ahead in its own quarter. On an AMD EPYC Zen 3 (kernel bench
//! `decode-f16`, 2 threads, % of the read bandwidth measured beside it),
//! neighbouring rows in pairs (one 4 KB stretch read as two streams 2 KB
//! apart on 1024-wide rows) read 1024 → 248320 at 77–78%, pairs from the
//! two halves at 90–97%, quarters at 92–107%; 2048-wide matrices 82–96%
//! (halves) → 96–107% (quarters); eight streams (32 accumulators, spilled)
//! fell back to 85–95%.

use super::dots::{f16c, hsum256, PF_BYTES_16, PF_FAR};
use std::arch::x86_64::*;

/// Eight 16-bit floats at `w` as f32 (bf16 when `BF16`, else f16).
#[target_feature(enable = "avx2,f16c")]
#[inline]
unsafe fn load8<const BF16: bool>(w: *const u8) -> __m256 {
    let h = _mm_loadu_si128(w as *const __m128i);
    if BF16 {
        _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16))
    } else {
        _mm256_cvtph_ps(h)
    }
}

/// One 16-bit float as f32.
#[target_feature(enable = "f16c")]
#[inline]
unsafe fn scalar<const BF16: bool>(h: u16) -> f32 {
    if BF16 {
        f32::from_bits((h as u32) << 16)
    } else {
        f16c(h)
    }
}

/// Rows at `w[k]` (`x.len()` 16-bit floats each) against `x`.
///
/// # Safety
/// AVX2, FMA and F16C available; each `w[k]` holds `2 · x.len()` bytes.
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
unsafe fn dot_k<const BF16: bool, const K: usize>(w: [*const u8; K], x: &[f32]) -> [f32; K] {
    let n = x.len();
    let xp = x.as_ptr();
    let ld = |w: *const u8, i: usize| load8::<BF16>(w.add(2 * i));
    let mut acc = [[_mm256_setzero_ps(); 4]; K];
    let mut i = 0;
    while i + 32 <= n {
        for w in w {
            _mm_prefetch::<_MM_HINT_T0>(w.wrapping_add(2 * i + PF_BYTES_16) as *const i8);
            _mm_prefetch::<_MM_HINT_T1>(w.wrapping_add(2 * i + PF_FAR) as *const i8);
        }
        for j in 0..4 {
            let o = i + 8 * j;
            let xv = _mm256_loadu_ps(xp.add(o));
            for k in 0..K {
                acc[k][j] = _mm256_fmadd_ps(ld(w[k], o), xv, acc[k][j]);
            }
        }
        i += 32;
    }
    while i + 8 <= n {
        let xv = _mm256_loadu_ps(xp.add(i));
        for k in 0..K {
            acc[k][0] = _mm256_fmadd_ps(ld(w[k], i), xv, acc[k][0]);
        }
        i += 8;
    }
    let sum = |v: &[__m256; 4]| {
        hsum256(_mm256_add_ps(
            _mm256_add_ps(v[0], v[1]),
            _mm256_add_ps(v[2], v[3]),
        ))
    };
    let mut s: [f32; K] = std::array::from_fn(|k| sum(&acc[k]));
    while i < n {
        for k in 0..K {
            let h = u16::from_le_bytes([*w[k].add(2 * i), *w[k].add(2 * i + 1)]);
            s[k] += scalar::<BF16>(h) * x[i];
        }
        i += 1;
    }
    s
}

/// `out[r]` = row `r` of `w` (F16 or BF16 rows of `2 · x.len()` bytes,
/// consecutive) against `x`, four at a time (`r + k·n/4`, `k` = 0..4), the
/// last `n mod 4` as a pair and one alone.
///
/// # Safety
/// AVX2, FMA and F16C available; `w` holds `out.len()` rows.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn rows<const BF16: bool>(w: &[u8], x: &[f32], out: &mut [f32]) {
    let (n, rb) = (out.len(), 2 * x.len());
    assert!(w.len() >= n * rb);
    let p = w.as_ptr();
    // four streams, one per quarter of the rows
    let q = n / 4;
    for r in 0..q {
        let y = dot_k::<BF16, 4>(std::array::from_fn(|k| p.add((r + k * q) * rb)), x);
        for (k, y) in y.into_iter().enumerate() {
            out[r + k * q] = y;
        }
    }
    // the last 0-3 rows: a pair, then one alone
    let mut r = 4 * q;
    if r + 2 <= n {
        let [ya, yb] = dot_k::<BF16, 2>([p.add(r * rb), p.add((r + 1) * rb)], x);
        out[r] = ya;
        out[r + 1] = yb;
        r += 2;
    }
    if r < n {
        let row = &w[r * rb..(r + 1) * rb];
        out[r] = if BF16 {
            super::dots::dot_bf16(row, x)
        } else {
            super::dots::dot_f16(row, x)
        };
    }
}

/// The grouped one-token kernel of `ty` (F16 or BF16), bit for bit its dot
/// product's results.
pub(in crate::matmul) fn rows_kernel(
    ty: coil_gguf::GgmlType,
) -> Option<crate::matmul::kernel::FloatRows> {
    // SAFETY (both): selected only at the AVX2 level, which checks the
    // CPU's features.
    match ty {
        coil_gguf::GgmlType::F16 => Some(|w, x, o| unsafe { rows::<false>(w, x, o) }),
        coil_gguf::GgmlType::BF16 => Some(|w, x, o| unsafe { rows::<true>(w, x, o) }),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testutil::{random_weights, Rng};
    use coil_gguf::GgmlType;

    /// Rows four or two at a time equal the one-row kernel bit for bit (row
    /// counts from 1 to 13, widths with and without tails, both formats).
    #[test]
    fn pairs_equal_single_rows_bit_for_bit() {
        if !(is_x86_feature_detected!("avx2")
            && is_x86_feature_detected!("fma")
            && is_x86_feature_detected!("f16c"))
        {
            return;
        }
        let mut rng = Rng::new(17);
        for ty in [GgmlType::F16, GgmlType::BF16] {
            let k = rows_kernel(ty).unwrap();
            for (rows, cols) in [
                (1, 32),
                (2, 40),
                (7, 2048),
                (6, 101),
                (5, 3),
                (3, 8192),
                (13, 72),
            ] {
                let data = random_weights(&mut rng, ty, rows, cols);
                let rb = 2 * cols;
                let x: Vec<f32> = (0..cols).map(|_| rng.f32() * 4.0 - 2.0).collect();
                let mut out = vec![f32::NAN; rows];
                k(&data, &x, &mut out);
                for (r, y) in out.iter().enumerate() {
                    // SAFETY: features checked above.
                    let row = &data[r * rb..(r + 1) * rb];
                    let one = unsafe {
                        match ty {
                            GgmlType::BF16 => super::super::dot_bf16(row, &x),
                            _ => super::super::dot_f16(row, &x),
                        }
                    };
                    assert_eq!(
                        y.to_bits(),
                        one.to_bits(),
                        "{ty:?} rows {rows} cols {cols} row {r}"
                    );
                }
            }
        }
    }
}
