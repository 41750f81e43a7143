//! One-token F16 / BF16 rows two at a time (decode at the AVX2 level): two
//! rows share each load of the token's f32 activations, and each row's
//! floating-point operations are [`super::dot_f16`]'s / [`super::dot_bf16`]'s
//! in the same order: the same bits, paired or not.
//!
//! The pair is row `r` of the first half of the call's rows and row `r` of
//! the second: two streams each reading consecutive rows, far apart in
//! memory. Pairs of neighbouring rows (one 4 KB stretch read as two streams
//! 2 KB apart on 1024-wide rows) read DRAM at 66–91% of the bandwidth on an
//! AMD EPYC Zen 3 where the halves read it at 92–117% (kernel bench
//! `decode-f16`, 2 threads, 1024 → 248320: 23.1–23.2 → 29.2–29.9 GB/s;
//! 2048 → 65536: 24.5–25.3 → 31.1–32.5). Each stream is prefetched ahead in
//! its own half.

use super::{f16c, hsum256, PF_BYTES_16, PF_FAR};
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

/// Rows at `a` and `b` (`x.len()` 16-bit floats each) against `x`.
///
/// # Safety
/// AVX2, FMA and F16C available; `a` and `b` hold `2 · x.len()` bytes.
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
unsafe fn dot2<const BF16: bool>(a: *const u8, b: *const u8, x: &[f32]) -> (f32, f32) {
    let n = x.len();
    let xp = x.as_ptr();
    let ld = |w: *const u8, i: usize| load8::<BF16>(w.add(2 * i));
    let mut acc = [[_mm256_setzero_ps(); 4]; 2];
    let mut i = 0;
    while i + 32 <= n {
        for w in [a, b] {
            _mm_prefetch::<_MM_HINT_T0>(w.wrapping_add(2 * i + PF_BYTES_16) as *const i8);
            _mm_prefetch::<_MM_HINT_T1>(w.wrapping_add(2 * i + PF_FAR) as *const i8);
        }
        for j in 0..4 {
            let o = i + 8 * j;
            let xv = _mm256_loadu_ps(xp.add(o));
            acc[0][j] = _mm256_fmadd_ps(ld(a, o), xv, acc[0][j]);
            acc[1][j] = _mm256_fmadd_ps(ld(b, o), xv, acc[1][j]);
        }
        i += 32;
    }
    while i + 8 <= n {
        let xv = _mm256_loadu_ps(xp.add(i));
        acc[0][0] = _mm256_fmadd_ps(ld(a, i), xv, acc[0][0]);
        acc[1][0] = _mm256_fmadd_ps(ld(b, i), xv, acc[1][0]);
        i += 8;
    }
    let sum = |v: &[__m256; 4]| {
        hsum256(_mm256_add_ps(
            _mm256_add_ps(v[0], v[1]),
            _mm256_add_ps(v[2], v[3]),
        ))
    };
    let (mut sa, mut sb) = (sum(&acc[0]), sum(&acc[1]));
    while i < n {
        let h = |w: *const u8| u16::from_le_bytes([*w.add(2 * i), *w.add(2 * i + 1)]);
        sa += scalar::<BF16>(h(a)) * x[i];
        sb += scalar::<BF16>(h(b)) * x[i];
        i += 1;
    }
    (sa, sb)
}

/// `out[r]` = row `r` of `w` (F16 or BF16 rows of `2 · x.len()` bytes,
/// consecutive) against `x`, in pairs `(r, r + n/2)` (a last odd row alone).
///
/// # Safety
/// AVX2, FMA and F16C available; `w` holds `out.len()` rows.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn rows<const BF16: bool>(w: &[u8], x: &[f32], out: &mut [f32]) {
    let (n, rb) = (out.len(), 2 * x.len());
    assert!(w.len() >= n * rb);
    let p = w.as_ptr();
    let h = n / 2;
    for r in 0..h {
        let (ya, yb) = dot2::<BF16>(p.add(r * rb), p.add((r + h) * rb), x);
        out[r] = ya;
        out[r + h] = yb;
    }
    let r = 2 * h;
    if r < n {
        let row = &w[r * rb..(r + 1) * rb];
        out[r] = if BF16 {
            super::dot_bf16(row, x)
        } else {
            super::dot_f16(row, x)
        };
    }
}

/// The paired one-token kernel of `ty` (F16 or BF16), bit for bit its dot
/// product's results.
pub(in crate::matmul) fn rows_kernel(ty: coil_gguf::GgmlType) -> Option<crate::matmul::FloatRows> {
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

    /// Paired rows equal the one-row kernel bit for bit (odd and even row
    /// counts, widths with and without tails, both formats).
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
            for (rows, cols) in [(1, 32), (2, 40), (7, 2048), (6, 101), (5, 3), (3, 8192)] {
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
