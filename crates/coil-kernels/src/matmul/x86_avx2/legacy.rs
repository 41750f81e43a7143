//! AVX2 dot products of the 32-value formats with a fifth bit or an offset
//! — Q5_0, Q5_1, Q4_1 — against Q8_0-style activations (one token; their
//! few-token tiles, the same operations per token, are `tiles::rows_b32`'s).
//!
//! They matter because llama.cpp's K-quant mixtures fall back to them for
//! matrices whose rows are not a multiple of 256 values (Q4_K → Q5_0,
//! Q5_K → Q5_1): e.g. the 160-wide expert down projections of a small
//! Qwen3.5-MoE, where the scalar decode-then-dot path took a quarter of a
//! decoded token.
//!
//! A block of 32 weights is `d · (q − 16)` (Q5_0) or `d · q + m` (Q5_1,
//! Q4_1) with `q` unsigned (5 or 4 bits), so with the activations
//! `xd · xq` and their block sums `xs = Σ xq`:
//! `Σ w·x = d·xd · Σ q·xq − 16·d·xd·xs` (Q5_0) or `+ m·xd·xs` (Q5_1, Q4_1).
//! `Σ q·xq` is exact in integers (`vpmaddubsw`, q ≤ 31).

use super::dots::{dot_us, f16c, hsum256, nibbles, rd16, PF_STREAM};
use std::arch::x86_64::*;

/// Bit `k` of `bits` as `0x10` in byte `k` of a vector (the fifth bit of
/// value `k`, values in `nibbles` order: low nibbles 0..16, high 16..32).
#[inline(always)]
pub(super) unsafe fn fifth_bits(bits: u32) -> __m256i {
    // byte k takes byte k / 8 of `bits`, then keeps bit k % 8 of it
    let spread = _mm256_shuffle_epi8(
        _mm256_set1_epi32(bits as i32),
        _mm256_set_epi64x(
            0x0303_0303_0303_0303,
            0x0202_0202_0202_0202,
            0x0101_0101_0101_0101,
            0,
        ),
    );
    let sel = _mm256_set1_epi64x(0x8040_2010_0804_0201u64 as i64);
    let set = _mm256_cmpeq_epi8(_mm256_and_si256(spread, sel), sel);
    _mm256_and_si256(set, _mm256_set1_epi8(0x10))
}

/// One block (`i`) of [`dot`]: returns `acc` plus its product and adds the
/// block's offset term to `corr`.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
unsafe fn block<const BYTES: usize, const OFFSET: bool, const FIFTH: bool, const PF: usize>(
    row: *const u8,
    i: usize,
    xq: &[i8],
    xd: &[f32],
    xs: &[i16],
    acc: __m256,
    corr: &mut f32,
) -> __m256 {
    let head = if OFFSET { 4 } else { 2 };
    let qs = head + if FIFTH { 4 } else { 0 };
    let b = row.add(BYTES * i);
    // blocks of 20-24 bytes: a prefetch every other block covers each line
    if PF > 0 && i.is_multiple_of(2) {
        _mm_prefetch::<_MM_HINT_T0>(b.wrapping_add(PF) as *const i8);
        _mm_prefetch::<_MM_HINT_T1>(b.wrapping_add(super::dots::PF_FAR) as *const i8);
    }
    let xv = _mm256_loadu_si256(xq.as_ptr().add(32 * i) as *const __m256i);
    let mut q = nibbles(b.add(qs));
    if FIFTH {
        let bits = (b.add(head) as *const u32).read_unaligned();
        q = _mm256_or_si256(q, fifth_bits(bits));
    }
    let xdi = *xd.get_unchecked(i);
    let xsi = *xs.get_unchecked(i) as f32;
    let s = f16c(rd16(b)) * xdi;
    if OFFSET {
        *corr += f16c(rd16(b.add(2))) * xdi * xsi;
    } else {
        *corr += s * xsi;
    }
    _mm256_fmadd_ps(_mm256_cvtepi32_ps(dot_us(q, xv)), _mm256_set1_ps(s), acc)
}

/// A row of `xd.len()` blocks of `BYTES` bytes. `OFFSET`: Q5_1 / Q4_1
/// (`d`, `m` then the bits) or Q5_0 (`d`, values − 16); `FIFTH`: a 32-bit
/// word of fifth bits before the nibbles; `PF`: prefetch distance in bytes
/// (0: none). Blocks go in pairs so both accumulators stay in registers.
/// (The AVX-512 level's kernels finish a row's last `nb % 8` blocks here.)
///
/// # Safety
/// `row` holds `xd.len()` blocks, `xq` as many 32-value chunks and `xs` as
/// many sums; AVX2, FMA and F16C are available.
#[inline(always)]
pub(in crate::matmul) unsafe fn dot<
    const BYTES: usize,
    const OFFSET: bool,
    const FIFTH: bool,
    const PF: usize,
>(
    row: *const u8,
    xq: &[i8],
    xd: &[f32],
    xs: &[i16],
) -> f32 {
    let nb = xd.len();
    let (mut even, mut odd) = (_mm256_setzero_ps(), _mm256_setzero_ps());
    let mut corr = 0f32;
    let mut i = 0;
    while i + 2 <= nb {
        even = block::<BYTES, OFFSET, FIFTH, PF>(row, i, xq, xd, xs, even, &mut corr);
        odd = block::<BYTES, OFFSET, FIFTH, PF>(row, i + 1, xq, xd, xs, odd, &mut corr);
        i += 2;
    }
    if i < nb {
        even = block::<BYTES, OFFSET, FIFTH, PF>(row, i, xq, xd, xs, even, &mut corr);
    }
    let sum = hsum256(_mm256_add_ps(even, odd));
    if OFFSET {
        sum + corr
    } else {
        sum - 16.0 * corr
    }
}

/// The one-token dot of a row and the decode kernel over consecutive rows
/// (prefetching [`PF_STREAM`] ahead as it goes) of one format.
macro_rules! format_entry {
    ($dot:ident, $rows:ident, $bytes:literal, $offset:literal, $fifth:literal) => {
        #[target_feature(enable = "avx2,fma,f16c")]
        pub(super) unsafe fn $dot(row: &[u8], xq: &[i8], xd: &[f32], xs: &[i16]) -> f32 {
            let nb = xd.len();
            assert!(row.len() >= $bytes * nb && xq.len() >= 32 * nb && xs.len() >= nb);
            dot::<$bytes, $offset, $fifth, 0>(row.as_ptr(), xq, xd, xs)
        }

        #[target_feature(enable = "avx2,fma,f16c")]
        pub(super) unsafe fn $rows(
            w: &[u8],
            rb: usize,
            xq: &[i8],
            xd: &[f32],
            xs: &[i16],
            out: &mut [f32],
        ) {
            let nb = xd.len();
            assert!(w.len() >= out.len() * rb && rb == $bytes * nb);
            assert!(xq.len() >= 32 * nb && xs.len() >= nb);
            for (r, o) in out.iter_mut().enumerate() {
                *o = dot::<$bytes, $offset, $fifth, PF_STREAM>(w.as_ptr().add(r * rb), xq, xd, xs);
            }
        }
    };
}
format_entry!(dot_q5_0, rows_q5_0, 22, false, true);
format_entry!(dot_q5_1, rows_q5_1, 24, true, true);
format_entry!(dot_q4_1, rows_q4_1, 20, true, false);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fifth_bits_land_on_their_values() {
        if !std::is_x86_feature_detected!("avx2") {
            return;
        }
        for bits in [0u32, 1, 0x8000_0000, 0xdead_beef, 0x0001_0000, u32::MAX] {
            let mut out = [0u8; 32];
            // SAFETY: AVX2 checked above.
            unsafe {
                _mm256_storeu_si256(out.as_mut_ptr() as *mut __m256i, fifth_bits(bits));
            }
            for (k, &v) in out.iter().enumerate() {
                assert_eq!(
                    v,
                    if bits >> k & 1 == 1 { 0x10 } else { 0 },
                    "bits {bits:#x}, value {k}"
                );
            }
        }
    }
}
