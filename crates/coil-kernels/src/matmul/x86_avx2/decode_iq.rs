//! Rows of the lattice, ternary and MXFP4 formats decoded to i16 and one
//! float per 32 values, for the integer GEMMs: `w = a·q` with `q` the
//! value's integer form with its integer scale folded in (`vecdot_iq.rs`'s
//! table: IQ2 `(2ls + 1)·±grid`, up to 1333; IQ3_XXS up to 1922; IQ3_S
//! 465; IQ1 `(2ls + 1)·(8g ± 1)`, 135; ternary `t`; MXFP4 the table value)
//! and `a` the block's float (`d/8`, `d/4`, `d`, …) repeated for each of
//! its 32-value groups. Exact: `a·q` is the dequantized value up to one
//! rounding of `a`. 128-bit integer instructions only (any x86-64 level
//! that runs the GEMMs has them).

use crate::matmul::scalar::dequant::rd_f16;
use coil_gguf::quant::grids::{
    IQ1S_GRID, IQ2S_GRID, IQ2XS_GRID, IQ2XXS_GRID, IQ3S_GRID, IQ3XXS_GRID, KSIGNS_IQ2XS,
    KVALUES_MXFP4,
};
use coil_gguf::GgmlType;
use std::arch::x86_64::*;

/// Whether [`decode_row`] decodes `ty`.
pub(super) fn supported(ty: GgmlType) -> bool {
    use GgmlType::*;
    matches!(
        ty,
        IQ2_XXS | IQ2_XS | IQ2_S | IQ3_XXS | IQ3_S | IQ1_S | IQ1_M | TQ1_0 | TQ2_0 | MXFP4
    )
}

/// 8 values `s·(±mag[j])` (`mag` unsigned bytes, bit `j` of `signs` set:
/// negative) as i16 at `out`.
#[inline(always)]
unsafe fn group8(mag: u64, signs: u8, s: i16, out: *mut i16) {
    let bits = _mm_setr_epi16(1, 2, 4, 8, 16, 32, 64, 128);
    let v = _mm_mullo_epi16(
        _mm_cvtepu8_epi16(_mm_cvtsi64_si128(mag as i64)),
        _mm_set1_epi16(s),
    );
    let neg = _mm_cmpeq_epi16(_mm_and_si128(_mm_set1_epi16(signs as i16), bits), bits);
    let v = _mm_sub_epi16(_mm_xor_si128(v, neg), neg);
    _mm_storeu_si128(out as *mut __m128i, v);
}

/// 8 signed byte values `v[j]` times `s` as i16 at `out`.
#[inline(always)]
unsafe fn signed8(v: u64, s: i16, out: *mut i16) {
    let w = _mm_mullo_epi16(
        _mm_cvtepi8_epi16(_mm_cvtsi64_si128(v as i64)),
        _mm_set1_epi16(s),
    );
    _mm_storeu_si128(out as *mut __m128i, w);
}

/// The bytes `8·g[j] + δ` of an IQ1 grid entry (`g` −1, 0, 1; δ = ±1).
#[inline(always)]
fn iq1_bytes(index: usize, neg: bool) -> u64 {
    let g = IQ1S_GRID[index].to_le_bytes();
    let d: i8 = if neg { -1 } else { 1 };
    u64::from_le_bytes(std::array::from_fn(|j| (8 * g[j] as i8 + d) as u8))
}

fn u32_at(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]])
}

/// Decodes one encoded row of `ty` (a [`supported`] one): `q` gets the
/// row's values, `a[g · st]` the float of 32-value group `g` (a panel's
/// `[group][rows]` layout: `st` its row count, `a` at the row's lane).
///
/// # Safety
/// SSE4.1 available; `src` whole blocks of `ty`, `q` its values, `a` valid
/// for its groups at stride `st`.
#[target_feature(enable = "sse4.1")]
pub(super) unsafe fn decode_row(ty: GgmlType, src: &[u8], q: &mut [i16], a: *mut f32, st: usize) {
    use GgmlType::*;
    let (bs, ts) = ty.block_layout();
    for (bi, b) in src.chunks_exact(ts).enumerate() {
        let qo = q.as_mut_ptr().add(bi * bs);
        let groups = bs / 32;
        let set = |v: f32| {
            for g in 0..groups {
                *a.add((bi * groups + g) * st) = v;
            }
        };
        match ty {
            IQ2_XXS => {
                set(0.125 * rd_f16(b, 0));
                for ib in 0..8 {
                    let aux = u32_at(b, 6 + 8 * ib);
                    let s = (2 * (aux >> 28) + 1) as i16;
                    for l in 0..4 {
                        let signs = KSIGNS_IQ2XS[(aux >> (7 * l) & 127) as usize];
                        let mag = IQ2XXS_GRID[b[2 + 8 * ib + l] as usize];
                        group8(mag, signs, s, qo.add(32 * ib + 8 * l));
                    }
                }
            }
            IQ2_XS => {
                set(0.125 * rd_f16(b, 0));
                for ib in 0..8 {
                    let sc = b[66 + ib] as i16;
                    for l in 0..4 {
                        let at = 2 + 2 * (4 * ib + l);
                        let v = u16::from_le_bytes([b[at], b[at + 1]]);
                        let s = 2 * (sc >> (4 * (l / 2)) & 0xf) + 1;
                        let mag = IQ2XS_GRID[(v & 511) as usize];
                        let signs = KSIGNS_IQ2XS[(v >> 9) as usize];
                        group8(mag, signs, s, qo.add(32 * ib + 8 * l));
                    }
                }
            }
            IQ2_S => {
                set(0.125 * rd_f16(b, 0));
                for ib in 0..8 {
                    let (sc, qh) = (b[74 + ib] as i16, b[66 + ib] as usize);
                    for l in 0..4 {
                        let index = b[2 + 4 * ib + l] as usize | (qh << (8 - 2 * l) & 0x300);
                        let s = 2 * (sc >> (4 * (l / 2)) & 0xf) + 1;
                        group8(
                            IQ2S_GRID[index],
                            b[34 + 4 * ib + l],
                            s,
                            qo.add(32 * ib + 8 * l),
                        );
                    }
                }
            }
            IQ3_XXS => {
                set(0.25 * rd_f16(b, 0));
                for ib in 0..8 {
                    let aux = u32_at(b, 66 + 4 * ib);
                    let s = (2 * (aux >> 28) + 1) as i16;
                    for l in 0..4 {
                        let signs = KSIGNS_IQ2XS[(aux >> (7 * l) & 127) as usize];
                        let g = |k: usize| IQ3XXS_GRID[b[2 + 8 * ib + 2 * l + k] as usize] as u64;
                        group8(g(0) | g(1) << 32, signs, s, qo.add(32 * ib + 8 * l));
                    }
                }
            }
            IQ3_S => {
                set(rd_f16(b, 0));
                for ib in 0..8 {
                    let qh = b[66 + ib] as usize;
                    let s = 2 * (b[106 + ib / 2] >> (4 * (ib % 2)) & 0xf) as i16 + 1;
                    for l in 0..4 {
                        let g = |k: usize| {
                            let j = 2 * l + k;
                            IQ3S_GRID[b[2 + 8 * ib + j] as usize | (qh << (8 - j) & 256)] as u64
                        };
                        group8(
                            g(0) | g(1) << 32,
                            b[74 + 4 * ib + l],
                            s,
                            qo.add(32 * ib + 8 * l),
                        );
                    }
                }
            }
            IQ1_S => {
                set(0.125 * rd_f16(b, 0));
                for ib in 0..8 {
                    let qh = u16::from_le_bytes([b[34 + 2 * ib], b[35 + 2 * ib]]) as usize;
                    let s = (2 * (qh >> 12 & 7) + 1) as i16;
                    for l in 0..4 {
                        let index = b[2 + 4 * ib + l] as usize | (qh >> (3 * l) & 7) << 8;
                        let v = iq1_bytes(index, qh & 0x8000 != 0);
                        signed8(v, s, qo.add(32 * ib + 8 * l));
                    }
                }
            }
            IQ1_M => {
                let sc: [u16; 4] =
                    std::array::from_fn(|k| u16::from_le_bytes([b[48 + 2 * k], b[49 + 2 * k]]));
                set(0.125 * coil_gguf::quant::iq1::iq1_m_scale(sc));
                for ib in 0..8 {
                    let ls = sc[ib / 2] >> (6 * (ib % 2));
                    for l in 0..4 {
                        let h = (b[32 + 2 * ib + l / 2] >> (4 * (l % 2))) as usize;
                        let index = b[4 * ib + l] as usize | (h & 7) << 8;
                        let s = (2 * (ls >> (3 * (l / 2)) & 7) + 1) as i16;
                        signed8(iq1_bytes(index, h & 8 != 0), s, qo.add(32 * ib + 8 * l));
                    }
                }
            }
            TQ2_0 => {
                set(rd_f16(b, 64));
                for h in 0..2 {
                    for l in 0..4 {
                        for m in 0..32 {
                            let t = (b[32 * h + m] >> (2 * l) & 3) as i16 - 1;
                            *qo.add(128 * h + 32 * l + m) = t;
                        }
                    }
                }
            }
            TQ1_0 => {
                const POW3: [u8; 5] = [1, 3, 9, 27, 81];
                set(rd_f16(b, 52));
                let mut k = 0;
                for (start, width, n_trits) in [(0, 32, 5), (32, 16, 5), (48, 4, 4)] {
                    for n in 0..n_trits {
                        for m in 0..width {
                            let v = (b[start + m].wrapping_mul(POW3[n]) as u16 * 3) >> 8;
                            *qo.add(k) = v as i16 - 1;
                            k += 1;
                        }
                    }
                }
            }
            MXFP4 => {
                set(coil_gguf::quant::mxfp4::e8m0_to_f32_half(b[0]));
                let tbl = _mm_loadu_si128(KVALUES_MXFP4.as_ptr() as *const __m128i);
                let v = _mm_loadu_si128(b.as_ptr().add(1) as *const __m128i);
                let m4 = _mm_set1_epi8(0xf);
                let lo = _mm_shuffle_epi8(tbl, _mm_and_si128(v, m4));
                let hi = _mm_shuffle_epi8(tbl, _mm_and_si128(_mm_srli_epi16(v, 4), m4));
                for (k, h) in [lo, hi].into_iter().enumerate() {
                    let o = qo.add(16 * k) as *mut __m128i;
                    _mm_storeu_si128(o, _mm_cvtepi8_epi16(h));
                    _mm_storeu_si128(o.add(1), _mm_cvtepi8_epi16(_mm_srli_si128(h, 8)));
                }
            }
            _ => unreachable!("decode_iq: unsupported {ty}"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testutil::{random_weights, Rng};

    /// `a·q` is the dequantized value (coil_gguf's, bit-exact to ggml) up
    /// to the rounding of `a`.
    #[test]
    fn rows_decode_to_the_dequantized_values() {
        if !is_x86_feature_detected!("sse4.1") {
            return;
        }
        let mut rng = Rng::new(3);
        for ty in [
            GgmlType::IQ2_XXS,
            GgmlType::IQ2_XS,
            GgmlType::IQ2_S,
            GgmlType::IQ3_XXS,
            GgmlType::IQ3_S,
            GgmlType::IQ1_S,
            GgmlType::IQ1_M,
            GgmlType::TQ1_0,
            GgmlType::TQ2_0,
            GgmlType::MXFP4,
        ] {
            let cols = 512;
            let w = random_weights(&mut rng, ty, 1, cols);
            let mut want = vec![0f32; cols];
            coil_gguf::quant::dequantize_row(ty, &w, &mut want).unwrap();
            let mut q = vec![0i16; cols];
            let mut a = vec![0f32; cols / 32];
            unsafe { decode_row(ty, &w, &mut q, a.as_mut_ptr(), 1) };
            for c in 0..cols {
                let got = a[c / 32] * q[c] as f32;
                let tol = 1e-6 * want[c].abs();
                assert!(
                    (got - want[c]).abs() <= tol,
                    "{ty} [{c}]: {got} vs {}",
                    want[c]
                );
            }
        }
    }
}
