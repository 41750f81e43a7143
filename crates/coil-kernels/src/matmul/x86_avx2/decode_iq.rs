//! Rows of the lattice, ternary and MXFP4 formats decoded to small integers
//! and floats, for the integer GEMMs, in two forms from one body
//! ([`decode`] over a [`Sink`]):
//!
//! * [`decode_row`] (the AVX2 GEMM): i16 and one float per 32 values, `w =
//!   a·q` with `q` the value's integer form with its integer scale folded
//!   in (`vecdot_iq.rs`'s table: IQ2 `(2ls + 1)·±grid`, up to 1333;
//!   IQ3_XXS up to 1922; IQ3_S 465; IQ1 `(2ls + 1)·(8g ± 1)`, 135; ternary
//!   `t`; MXFP4 the table value) and `a` the block's float (`d/8`, `d/4`,
//!   `d`, …) repeated for each of its 32-value groups;
//! * [`decode_row_i8`] (the AVX-512 VNNI GEMM, whose products take i8): the
//!   value's integer form without the integer scale (`±grid` up to 62, `8g
//!   ± 1`, `t`, the MXFP4 table value: all within i8) and one float per
//!   scale group, the block's float times the group's integer scale
//!   (groups of 16 values for IQ2_XS, IQ2_S and IQ1_M, whose scales are per
//!   16, [`group16`]; else 32).
//!
//! Exact: `a·q` is the dequantized value up to one rounding of `a`. 128-bit
//! integer instructions only (any x86-64 level that runs the GEMMs has
//! them).

use crate::matmul::scalar::dequant::rd_f16;
use coil_gguf::quant::grids::{
    IQ1S_GRID, IQ2S_GRID, IQ2XS_GRID, IQ2XXS_GRID, IQ3S_GRID, IQ3XXS_GRID, KSIGNS_IQ2XS,
    KVALUES_MXFP4,
};
use coil_gguf::GgmlType;
use std::arch::x86_64::*;

/// Whether [`decode_row`] decodes `ty`.
pub(in crate::matmul) fn supported(ty: GgmlType) -> bool {
    use GgmlType::*;
    matches!(
        ty,
        IQ2_XXS | IQ2_XS | IQ2_S | IQ3_XXS | IQ3_S | IQ1_S | IQ1_M | TQ1_0 | TQ2_0 | MXFP4
    )
}

/// Where [`decode`] puts a block's values: 8 at a time at value `at` of the
/// row, each group of 8 with its integer scale `s`, and the block's float.
trait Sink {
    /// The float of block `bi` of `bs` values (the value every scale
    /// multiplies).
    unsafe fn block(&mut self, bi: usize, bs: usize, d: f32);
    /// 8 values `±mag[j]` (`mag` unsigned bytes, bit `j` of `signs` set:
    /// negative), scale `s`.
    unsafe fn mag8(&mut self, at: usize, mag: u64, signs: u8, s: i16);
    /// 8 signed byte values, scale `s`.
    unsafe fn signed8(&mut self, at: usize, v: u64, s: i16);
    /// 16 signed byte values, scale 1.
    unsafe fn bytes16(&mut self, at: usize, v: __m128i);
}

/// The 8 signed bytes `±mag[j]` (bit `j` of `signs` set: negative).
#[inline(always)]
unsafe fn signed_mag8(mag: u64, signs: u8) -> __m128i {
    let bits = _mm_set1_epi64x(0x8040_2010_0804_0201u64 as i64);
    let neg = _mm_cmpeq_epi8(_mm_and_si128(_mm_set1_epi8(signs as i8), bits), bits);
    let v = _mm_cvtsi64_si128(mag as i64);
    _mm_sub_epi8(_mm_xor_si128(v, neg), neg)
}

/// [`decode_row`]'s sink: i16 values with the scale folded in, the block's
/// float per 32-value group.
struct Folded {
    q: *mut i16,
    a: *mut f32,
    st: usize,
}

impl Sink for Folded {
    #[inline(always)]
    unsafe fn block(&mut self, bi: usize, bs: usize, d: f32) {
        let groups = bs / 32;
        for g in 0..groups {
            *self.a.add((bi * groups + g) * self.st) = d;
        }
    }
    #[inline(always)]
    unsafe fn mag8(&mut self, at: usize, mag: u64, signs: u8, s: i16) {
        let v = _mm_cvtepi8_epi16(signed_mag8(mag, signs));
        let v = _mm_mullo_epi16(v, _mm_set1_epi16(s));
        _mm_storeu_si128(self.q.add(at) as *mut __m128i, v);
    }
    #[inline(always)]
    unsafe fn signed8(&mut self, at: usize, v: u64, s: i16) {
        let w = _mm_mullo_epi16(
            _mm_cvtepi8_epi16(_mm_cvtsi64_si128(v as i64)),
            _mm_set1_epi16(s),
        );
        _mm_storeu_si128(self.q.add(at) as *mut __m128i, w);
    }
    #[inline(always)]
    unsafe fn bytes16(&mut self, at: usize, v: __m128i) {
        let o = self.q.add(at) as *mut __m128i;
        _mm_storeu_si128(o, _mm_cvtepi8_epi16(v));
        _mm_storeu_si128(o.add(1), _mm_cvtepi8_epi16(_mm_srli_si128(v, 8)));
    }
}

/// [`decode_row_i8`]'s sink: i8 values, the block's float times each
/// group's integer scale per group of `gsize` values.
struct Scaled {
    q: *mut i8,
    a: *mut f32,
    st: usize,
    gsize: usize,
    d: f32,
}

impl Scaled {
    #[inline(always)]
    unsafe fn scale(&mut self, at: usize, s: i16) {
        *self.a.add(at / self.gsize * self.st) = self.d * s as f32;
    }
}

impl Sink for Scaled {
    #[inline(always)]
    unsafe fn block(&mut self, bi: usize, bs: usize, d: f32) {
        self.d = d;
        let groups = bs / self.gsize;
        for g in 0..groups {
            *self.a.add((bi * groups + g) * self.st) = d;
        }
    }
    #[inline(always)]
    unsafe fn mag8(&mut self, at: usize, mag: u64, signs: u8, s: i16) {
        _mm_storel_epi64(self.q.add(at) as *mut __m128i, signed_mag8(mag, signs));
        self.scale(at, s);
    }
    #[inline(always)]
    unsafe fn signed8(&mut self, at: usize, v: u64, s: i16) {
        (self.q.add(at) as *mut u64).write_unaligned(v);
        self.scale(at, s);
    }
    #[inline(always)]
    unsafe fn bytes16(&mut self, at: usize, v: __m128i) {
        _mm_storeu_si128(self.q.add(at) as *mut __m128i, v);
    }
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

/// Whether `ty`'s scales are per 16 values (IQ2_XS, IQ2_S, IQ1_M): the
/// scale groups of [`decode_row_i8`].
pub(in crate::matmul) fn group16(ty: GgmlType) -> bool {
    matches!(ty, GgmlType::IQ2_XS | GgmlType::IQ2_S | GgmlType::IQ1_M)
}

/// Decodes one encoded row of `ty` (a [`supported`] one): `q` gets the
/// row's values with their integer scales folded in, `a[g · st]` the float
/// of 32-value group `g` (a panel's `[group][rows]` layout: `st` its row
/// count, `a` at the row's lane).
///
/// # Safety
/// SSE4.1 available; `src` whole blocks of `ty`, `q` its values, `a` valid
/// for its groups at stride `st`.
#[target_feature(enable = "sse4.1")]
pub(super) unsafe fn decode_row(ty: GgmlType, src: &[u8], q: &mut [i16], a: *mut f32, st: usize) {
    assert!(q.len() >= src.len() / ty.type_size() * ty.block_size());
    let mut o = Folded {
        q: q.as_mut_ptr(),
        a,
        st,
    };
    decode(ty, src, &mut o)
}

/// Decodes one encoded row of `ty` (a [`supported`] one) for the AVX-512
/// GEMM: `q` gets the row's values as i8 (no integer scale), `a[g · st]`
/// the float of scale group `g` (16 values where [`group16`], else 32).
///
/// # Safety
/// SSE4.1 available; `src` whole blocks of `ty`, `a` valid for its groups
/// at stride `st`.
#[target_feature(enable = "sse4.1")]
pub(in crate::matmul) unsafe fn decode_row_i8(
    ty: GgmlType,
    src: &[u8],
    q: &mut [i8],
    a: *mut f32,
    st: usize,
) {
    assert!(q.len() >= src.len() / ty.type_size() * ty.block_size());
    let mut o = Scaled {
        q: q.as_mut_ptr(),
        a,
        st,
        gsize: if group16(ty) { 16 } else { 32 },
        d: 0.0,
    };
    decode(ty, src, &mut o)
}

/// The one body of both forms: each block's float, then its values 8 (or
/// 16) at a time with their integer scales.
#[inline(always)]
unsafe fn decode<S: Sink>(ty: GgmlType, src: &[u8], o: &mut S) {
    use GgmlType::*;
    let (bs, ts) = ty.block_layout();
    for (bi, b) in src.chunks_exact(ts).enumerate() {
        let q0 = bi * bs;
        match ty {
            IQ2_XXS => {
                o.block(bi, bs, 0.125 * rd_f16(b, 0));
                for ib in 0..8 {
                    let aux = u32_at(b, 6 + 8 * ib);
                    let s = (2 * (aux >> 28) + 1) as i16;
                    for l in 0..4 {
                        let signs = KSIGNS_IQ2XS[(aux >> (7 * l) & 127) as usize];
                        let mag = IQ2XXS_GRID[b[2 + 8 * ib + l] as usize];
                        o.mag8(q0 + 32 * ib + 8 * l, mag, signs, s);
                    }
                }
            }
            IQ2_XS => {
                o.block(bi, bs, 0.125 * rd_f16(b, 0));
                for ib in 0..8 {
                    let sc = b[66 + ib] as i16;
                    for l in 0..4 {
                        let at = 2 + 2 * (4 * ib + l);
                        let v = u16::from_le_bytes([b[at], b[at + 1]]);
                        let s = 2 * (sc >> (4 * (l / 2)) & 0xf) + 1;
                        let mag = IQ2XS_GRID[(v & 511) as usize];
                        let signs = KSIGNS_IQ2XS[(v >> 9) as usize];
                        o.mag8(q0 + 32 * ib + 8 * l, mag, signs, s);
                    }
                }
            }
            IQ2_S => {
                o.block(bi, bs, 0.125 * rd_f16(b, 0));
                for ib in 0..8 {
                    let (sc, qh) = (b[74 + ib] as i16, b[66 + ib] as usize);
                    for l in 0..4 {
                        let index = b[2 + 4 * ib + l] as usize | (qh << (8 - 2 * l) & 0x300);
                        let s = 2 * (sc >> (4 * (l / 2)) & 0xf) + 1;
                        o.mag8(
                            q0 + 32 * ib + 8 * l,
                            IQ2S_GRID[index],
                            b[34 + 4 * ib + l],
                            s,
                        );
                    }
                }
            }
            IQ3_XXS => {
                o.block(bi, bs, 0.25 * rd_f16(b, 0));
                for ib in 0..8 {
                    let aux = u32_at(b, 66 + 4 * ib);
                    let s = (2 * (aux >> 28) + 1) as i16;
                    for l in 0..4 {
                        let signs = KSIGNS_IQ2XS[(aux >> (7 * l) & 127) as usize];
                        let g = |k: usize| IQ3XXS_GRID[b[2 + 8 * ib + 2 * l + k] as usize] as u64;
                        o.mag8(q0 + 32 * ib + 8 * l, g(0) | g(1) << 32, signs, s);
                    }
                }
            }
            IQ3_S => {
                o.block(bi, bs, rd_f16(b, 0));
                for ib in 0..8 {
                    let qh = b[66 + ib] as usize;
                    let s = 2 * (b[106 + ib / 2] >> (4 * (ib % 2)) & 0xf) as i16 + 1;
                    for l in 0..4 {
                        let g = |k: usize| {
                            let j = 2 * l + k;
                            IQ3S_GRID[b[2 + 8 * ib + j] as usize | (qh << (8 - j) & 256)] as u64
                        };
                        o.mag8(
                            q0 + 32 * ib + 8 * l,
                            g(0) | g(1) << 32,
                            b[74 + 4 * ib + l],
                            s,
                        );
                    }
                }
            }
            IQ1_S => {
                o.block(bi, bs, 0.125 * rd_f16(b, 0));
                for ib in 0..8 {
                    let qh = u16::from_le_bytes([b[34 + 2 * ib], b[35 + 2 * ib]]) as usize;
                    let s = (2 * (qh >> 12 & 7) + 1) as i16;
                    for l in 0..4 {
                        let index = b[2 + 4 * ib + l] as usize | (qh >> (3 * l) & 7) << 8;
                        let v = iq1_bytes(index, qh & 0x8000 != 0);
                        o.signed8(q0 + 32 * ib + 8 * l, v, s);
                    }
                }
            }
            IQ1_M => {
                let sc: [u16; 4] =
                    std::array::from_fn(|k| u16::from_le_bytes([b[48 + 2 * k], b[49 + 2 * k]]));
                o.block(bi, bs, 0.125 * coil_gguf::quant::iq1::iq1_m_scale(sc));
                for ib in 0..8 {
                    let ls = sc[ib / 2] >> (6 * (ib % 2));
                    for l in 0..4 {
                        let h = (b[32 + 2 * ib + l / 2] >> (4 * (l % 2))) as usize;
                        let index = b[4 * ib + l] as usize | (h & 7) << 8;
                        let s = (2 * (ls >> (3 * (l / 2)) & 7) + 1) as i16;
                        o.signed8(q0 + 32 * ib + 8 * l, iq1_bytes(index, h & 8 != 0), s);
                    }
                }
            }
            TQ2_0 => {
                o.block(bi, bs, rd_f16(b, 64));
                let mut t = [0i8; 256];
                for h in 0..2 {
                    for l in 0..4 {
                        for m in 0..32 {
                            t[128 * h + 32 * l + m] = (b[32 * h + m] >> (2 * l) & 3) as i8 - 1;
                        }
                    }
                }
                ternary(o, q0, &t);
            }
            TQ1_0 => {
                const POW3: [u8; 5] = [1, 3, 9, 27, 81];
                o.block(bi, bs, rd_f16(b, 52));
                let mut t = [0i8; 256];
                let mut k = 0;
                for (start, width, n_trits) in [(0, 32, 5), (32, 16, 5), (48, 4, 4)] {
                    for n in 0..n_trits {
                        for m in 0..width {
                            let v = (b[start + m].wrapping_mul(POW3[n]) as u16 * 3) >> 8;
                            t[k] = v as i8 - 1;
                            k += 1;
                        }
                    }
                }
                ternary(o, q0, &t);
            }
            MXFP4 => {
                o.block(bi, bs, coil_gguf::quant::mxfp4::e8m0_to_f32_half(b[0]));
                let tbl = _mm_loadu_si128(KVALUES_MXFP4.as_ptr() as *const __m128i);
                let v = _mm_loadu_si128(b.as_ptr().add(1) as *const __m128i);
                let m4 = _mm_set1_epi8(0xf);
                let lo = _mm_shuffle_epi8(tbl, _mm_and_si128(v, m4));
                let hi = _mm_shuffle_epi8(tbl, _mm_and_si128(_mm_srli_epi16(v, 4), m4));
                o.bytes16(q0, lo);
                o.bytes16(q0 + 16, hi);
            }
            _ => unreachable!("decode_iq: unsupported {ty}"),
        }
    }
}

/// A ternary block's 256 values `t` (−1..2), scale 1.
#[inline(always)]
unsafe fn ternary<S: Sink>(o: &mut S, q0: usize, t: &[i8; 256]) {
    for (k, c) in t.chunks_exact(16).enumerate() {
        o.bytes16(q0 + 16 * k, _mm_loadu_si128(c.as_ptr() as *const __m128i));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testutil::{random_weights, Rng};

    /// `a·q` is the dequantized value (coil_gguf's, bit-exact to ggml) up
    /// to the rounding of `a`, in both forms.
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
            let mut q8 = vec![0i8; cols];
            let g = if group16(ty) { 16 } else { 32 };
            let mut a8 = vec![f32::NAN; cols / g];
            unsafe { decode_row_i8(ty, &w, &mut q8, a8.as_mut_ptr(), 1) };
            for c in 0..cols {
                let tol = 1e-6 * want[c].abs();
                for (form, got) in [
                    ("i16", a[c / 32] * q[c] as f32),
                    ("i8", a8[c / g] * q8[c] as f32),
                ] {
                    assert!(
                        (got - want[c]).abs() <= tol,
                        "{ty} {form} [{c}]: {got} vs {}",
                        want[c]
                    );
                }
            }
        }
    }
}
