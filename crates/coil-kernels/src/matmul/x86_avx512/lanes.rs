//! Q4_K with the rows in the vector lanes, for 1 to [`MAX_TOKENS`] tokens
//! (batched decode of several sequences, speculative verification, and
//! single tokens in batch-invariant mode).
//!
//! The dot kernels (`dot_k45`, the tiles in `tiles.rs`) put a row's values
//! in the lanes: per 256-value block and token they convert and scale a
//! vector of partial sums, and per row and token they add 16 lanes up, so
//! with 8 tokens the float work outweighs the integer products and the
//! 8-token call costs ~4 single ones. Here 16 rows are transposed on the
//! fly into 16 lanes (`vpdpbusd` then takes 4 columns of 16 rows against
//! one broadcast of 4 activation bytes, as in the prefill GEMM): per
//! 32-value sub-block and token one conversion and two FMAs cover 16 rows,
//! and a token's 16 results come out as one vector. The transposition
//! and the scales' unpacking are shared by the tokens.
//!
//! Batch invariance: a token's result is a chain of operations on its own
//! registers, the same whatever the number of tokens in the call, and a
//! row's lane is computed alone (rows past the end repeat the last row and
//! are not stored), so results do not depend on the token count nor on
//! how the rows are split. They differ from `dot_k45`'s (another order of
//! the float operations), so where the caller needs invariance it sends
//! single tokens here too.
//!
//! Per block and token: `y += dx · Σ_j (d·sc_j · Σ q·qx − dmin·m_j · Σ qx)`
//! over the 8 sub-blocks `j` (`q` the nibbles, `qx` the token's Q8_K
//! values, `dx` its scale per 256).

use super::super::act::{ActPanel, QuantAct, PANEL_LANES};
use std::arch::x86_64::*;

/// Whether Q4_K's one-token and few-token kernels are these (both or
/// neither, so batch invariance holds): `COIL_Q4K_LANES=1` in the
/// environment, read once. Off by default: with 8 tokens a call costs about
/// half the dot tile's, but a single token streams rows of 2048 values at
/// ~70% of the read bandwidth against the dot kernel's ~85% (see
/// docs/PERFORMANCE.md, twelfth session), so decode alone would be slower.
pub(in super::super) fn enabled() -> bool {
    static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *ON.get_or_init(|| std::env::var("COIL_Q4K_LANES").is_ok_and(|v| v == "1"))
}

/// Blocks ahead that each of the 16 rows is prefetched.
const PF_BLOCKS: usize = 1;

/// Most tokens per call (as the other tiles: a verification of 8 drafts).
pub(in super::super) const MAX_TOKENS: usize = 9;

/// The panel [`rows_q4_k`] reads: [`ActPanel::new`]'s chunks of 64 values
/// and scales, plus in `hxd[(i · nt + t) · 8 + j]` the sum of token `t`'s
/// quantized values over sub-block `j` of block `i` (as f32).
pub(in super::super) fn panel(a: &QuantAct, t0: usize, nt: usize) -> ActPanel {
    let mut p = ActPanel::new(a, t0, nt, 256, 16, 64);
    p.hxd = p
        .sums
        .chunks_exact(2)
        .map(|s| f32::from(s[0]) + f32::from(s[1]))
        .collect();
    p
}

/// Transposes 16 rows of 32 bytes (`z[r]` = row `r` in the low half, row
/// `r + 8` in the high half) into 8 vectors: vector `g` holds bytes
/// `4g..4g + 4` of row `r` in dword lane `r`.
#[inline(always)]
unsafe fn transpose_16x8(z: [__m512i; 8]) -> [__m512i; 8] {
    // (loops, not closures: a closure does not inherit the target features
    // and its intrinsics would become calls)
    let mut t = [_mm512_setzero_si512(); 8];
    for i in 0..4 {
        t[2 * i] = _mm512_unpacklo_epi32(z[2 * i], z[2 * i + 1]);
        t[2 * i + 1] = _mm512_unpackhi_epi32(z[2 * i], z[2 * i + 1]);
    }
    let mut u = [_mm512_setzero_si512(); 8];
    for i in 0..8 {
        let (h, d) = (i / 4, i % 4);
        let (a, b) = (t[4 * h + d / 2], t[4 * h + 2 + d / 2]);
        u[i] = if d % 2 == 0 {
            _mm512_unpacklo_epi64(a, b)
        } else {
            _mm512_unpackhi_epi64(a, b)
        };
    }
    let lo_idx = _mm512_setr_epi64(0, 1, 8, 9, 4, 5, 12, 13);
    let hi_idx = _mm512_setr_epi64(2, 3, 10, 11, 6, 7, 14, 15);
    let mut v = [_mm512_setzero_si512(); 8];
    for g in 0..8 {
        let (d, hi) = (g % 4, g >= 4);
        v[g] = _mm512_permutex2var_epi64(u[d], if hi { hi_idx } else { lo_idx }, u[4 + d]);
    }
    v
}

/// Dword `k` (bytes `4k..4k + 4`) of the 16-byte heads of 16 rows, as four
/// vectors with row `r` in lane `r`.
#[inline(always)]
unsafe fn heads(rows: &[*const u8; 16], off: usize) -> [__m512i; 4] {
    let mut z = [_mm512_setzero_si512(); 4];
    for (q, z) in z.iter_mut().enumerate() {
        // rows q, q + 4, q + 8, q + 12 in its four 128-bit lanes
        let ld = |r: usize| rows[r].add(off) as *const __m128i;
        let v = _mm512_castsi128_si512(_mm_loadu_si128(ld(q)));
        let v = _mm512_inserti32x4::<1>(v, _mm_loadu_si128(ld(q + 4)));
        let v = _mm512_inserti32x4::<2>(v, _mm_loadu_si128(ld(q + 8)));
        *z = _mm512_inserti32x4::<3>(v, _mm_loadu_si128(ld(q + 12)));
    }
    let t0 = _mm512_unpacklo_epi32(z[0], z[1]);
    let t1 = _mm512_unpackhi_epi32(z[0], z[1]);
    let t2 = _mm512_unpacklo_epi32(z[2], z[3]);
    let t3 = _mm512_unpackhi_epi32(z[2], z[3]);
    // lane 4c + q of each result is row 4c + q
    [
        _mm512_unpacklo_epi64(t0, t2),
        _mm512_unpackhi_epi64(t0, t2),
        _mm512_unpacklo_epi64(t1, t3),
        _mm512_unpackhi_epi64(t1, t3),
    ]
}

/// One block's shared part for 16 rows: the sub-block scales `d·sc_j`
/// (`a`) and mins `dmin·m_j` (`b`) per row lane, and the nibbles as
/// `w[j][g]`: columns `32j + 4g .. + 4` of the 16 rows, one byte each.
#[repr(C, align(64))]
struct Block {
    a: [__m512; 8],
    b: [__m512; 8],
    w: [[__m512i; 8]; 8],
}

#[inline(always)]
unsafe fn unpack_block(rows: &[*const u8; 16], off: usize, blk: &mut Block) {
    let [h0, u0, u1, u2] = heads(rows, off);
    let d = _mm512_cvtph_ps(_mm512_cvtepi32_epi16(h0));
    let dmin = _mm512_cvtph_ps(_mm512_cvtepi32_epi16(_mm512_srli_epi32::<16>(h0)));
    // the 6-bit scales and mins of each lane, four per dword (as
    // `k4_scales_mins` for one row)
    let m6 = _mm512_set1_epi32(0x3f3f_3f3f);
    let m4 = _mm512_set1_epi32(0x0f0f_0f0f);
    let m2 = _mm512_set1_epi32(0x0303_0303);
    let s_lo = _mm512_and_si512(u0, m6);
    let m_lo = _mm512_and_si512(u1, m6);
    let s_hi = _mm512_or_si512(
        _mm512_and_si512(u2, m4),
        _mm512_slli_epi32::<4>(_mm512_and_si512(_mm512_srli_epi32::<6>(u0), m2)),
    );
    let m_hi = _mm512_or_si512(
        _mm512_and_si512(_mm512_srli_epi32::<4>(u2), m4),
        _mm512_slli_epi32::<4>(_mm512_and_si512(_mm512_srli_epi32::<6>(u1), m2)),
    );
    let (ff, mut sh) = (_mm512_set1_epi32(0xff), _mm512_setzero_si512());
    for k in 0..4 {
        let byte = |v: __m512i| _mm512_srlv_epi32(v, sh);
        let (sl, sh_, ml, mh) = (byte(s_lo), byte(s_hi), byte(m_lo), byte(m_hi));
        let f = |v: __m512i| _mm512_cvtepi32_ps(_mm512_and_si512(v, ff));
        blk.a[k] = _mm512_mul_ps(d, f(sl));
        blk.a[4 + k] = _mm512_mul_ps(d, f(sh_));
        blk.b[k] = _mm512_mul_ps(dmin, f(ml));
        blk.b[4 + k] = _mm512_mul_ps(dmin, f(mh));
        sh = _mm512_add_epi32(sh, _mm512_set1_epi32(8));
    }
    let low = _mm512_set1_epi8(0x0f);
    for s in 0..4 {
        let q = off + 16 + 32 * s;
        let mut z = [_mm512_setzero_si512(); 8];
        for (r, z) in z.iter_mut().enumerate() {
            let a = _mm256_loadu_si256(rows[r].add(q) as *const __m256i);
            let b = _mm256_loadu_si256(rows[r + 8].add(q) as *const __m256i);
            *z = _mm512_inserti64x4::<1>(_mm512_castsi256_si512(a), b);
        }
        // byte k of a step's 32: value k (low nibble), value 32 + k (high)
        let v = transpose_16x8(z);
        for (g, v) in v.iter().enumerate() {
            blk.w[2 * s][g] = _mm512_and_si512(*v, low);
            blk.w[2 * s + 1][g] = _mm512_and_si512(_mm512_srli_epi16::<4>(*v), low);
        }
    }
}

/// Q4_K rows (`out[t].len()` of them, `rb` bytes apart) times `NT`
/// tokens: token `t`'s 64-value chunk `c` at `xq + 64 · (c · NT + t)`, its
/// scale of block `i` at `xd[i · xd_stride + t]` and its sum over sub-block
/// `j` at `xs[(i · NT + t) · 8 + j]` (the layout of [`panel`]; one token:
/// its natural order).
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,avx2,fma,f16c,bmi2")]
#[inline]
unsafe fn rows_q4_k<const NT: usize>(
    w: &[u8],
    rb: usize,
    nb: usize,
    (xq, xd, xd_stride, xs): (*const i8, *const f32, usize, *const f32),
    out: &mut [&mut [f32]],
) {
    assert!(out.len() == NT && NT <= PANEL_LANES);
    let n = out[0].len();
    assert!(out.iter().all(|o| o.len() == n) && w.len() >= n * rb && rb >= nb * 144);
    let mut blk: Block = std::mem::zeroed();
    for r0 in (0..n).step_by(16) {
        let mut rows = [w.as_ptr(); 16];
        for (k, row) in rows.iter_mut().enumerate() {
            *row = w.as_ptr().add((r0 + k).min(n - 1) * rb);
        }
        let mut facc = [_mm512_setzero_ps(); NT];
        for i in 0..nb {
            // The next block of the 16 rows (2.25 lines each), and from
            // the last one the first of the next 16 rows: each group of rows
            // starts with 16 misses at once otherwise (rows of 2048 values:
            // 60% of the read bandwidth against 80% with 8192).
            let ahead = i + PF_BLOCKS;
            for k in 0..16 {
                let nx = if ahead < nb {
                    rows[k].add(144 * ahead)
                } else if r0 + 16 + k < n {
                    rows[k].add(16 * rb + 144 * (ahead - nb))
                } else {
                    continue;
                };
                _mm_prefetch::<_MM_HINT_T0>(nx as *const i8);
                _mm_prefetch::<_MM_HINT_T0>(nx.add(64) as *const i8);
                _mm_prefetch::<_MM_HINT_T0>(nx.add(143) as *const i8);
            }
            unpack_block(&rows, 144 * i, &mut blk);
            let mut fsb = [_mm512_setzero_ps(); NT];
            for j in 0..8 {
                let wv = blk.w[j];
                let (a, b) = (blk.a[j], blk.b[j]);
                for t in 0..NT {
                    // columns 256i + 32j .. of token t: chunk 4i + j/2
                    let x = xq.add(64 * ((4 * i + j / 2) * NT + t) + 32 * (j % 2));
                    let mut acc = _mm512_setzero_si512();
                    for (g, wg) in wv.iter().enumerate() {
                        let xb = _mm512_set1_epi32((x.add(4 * g) as *const i32).read_unaligned());
                        acc = _mm512_dpbusd_epi32(acc, *wg, xb);
                    }
                    let s = _mm512_set1_ps(*xs.add((i * NT + t) * 8 + j));
                    fsb[t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(acc), a, fsb[t]);
                    fsb[t] = _mm512_fnmadd_ps(b, s, fsb[t]);
                }
            }
            for t in 0..NT {
                let dx = _mm512_set1_ps(*xd.add(i * xd_stride + t));
                facc[t] = _mm512_fmadd_ps(fsb[t], dx, facc[t]);
            }
        }
        let left = n - r0;
        let mask: u16 = if left >= 16 {
            0xFFFF
        } else {
            (1u16 << left) - 1
        };
        for (t, o) in out.iter_mut().enumerate() {
            _mm512_mask_storeu_ps(o.as_mut_ptr().add(r0), mask, facc[t]);
        }
    }
}

/// [`rows_q4_k`] for a panel ([`panel`]) of 1 to [`MAX_TOKENS`] tokens.
///
/// # Safety
/// The CPU has the AVX-512 level (F, BW, VL, DQ, VNNI).
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,avx2,fma,f16c,bmi2")]
pub(in super::super) unsafe fn tile_q4_k(
    w: &[u8],
    rb: usize,
    p: &ActPanel,
    out: &mut [&mut [f32]],
) {
    let (nt, nb) = (p.nt, p.n_blocks);
    assert!(out.len() == nt && p.qs.len() >= nt * nb * 256);
    assert!(p.d.len() >= nb * PANEL_LANES && p.hxd.len() >= nb * nt * 8);
    let x = (p.qs.as_ptr(), p.d.as_ptr(), PANEL_LANES, p.hxd.as_ptr());
    match nt {
        1 => rows_q4_k::<1>(w, rb, nb, x, out),
        2 => rows_q4_k::<2>(w, rb, nb, x, out),
        3 => rows_q4_k::<3>(w, rb, nb, x, out),
        4 => rows_q4_k::<4>(w, rb, nb, x, out),
        5 => rows_q4_k::<5>(w, rb, nb, x, out),
        6 => rows_q4_k::<6>(w, rb, nb, x, out),
        7 => rows_q4_k::<7>(w, rb, nb, x, out),
        8 => rows_q4_k::<8>(w, rb, nb, x, out),
        9 => rows_q4_k::<9>(w, rb, nb, x, out),
        n => panic!("tile_q4_k: unsupported token count {n}"),
    }
}

/// One token of Q8_K activations (`q`, scales `d` per 256, sums `s` per
/// 16) against the rows: Q4_K's one-token kernel, each token of
/// [`tile_q4_k`] computed the same way.
///
/// # Safety
/// The CPU has the AVX-512 level (F, BW, VL, DQ, VNNI).
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,avx2,fma,f16c,bmi2")]
pub(in super::super) unsafe fn rows_one_q4_k(
    w: &[u8],
    rb: usize,
    q: &[i8],
    d: &[f32],
    s: &[i16],
    out: &mut [f32],
) {
    let nb = d.len();
    assert!(q.len() >= nb * 256 && s.len() >= nb * 16);
    let xs: Vec<f32> = s[..nb * 16]
        .chunks_exact(2)
        .map(|s| f32::from(s[0]) + f32::from(s[1]))
        .collect();
    rows_q4_k::<1>(
        w,
        rb,
        nb,
        (q.as_ptr(), d.as_ptr(), 1, xs.as_ptr()),
        &mut [out],
    );
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::matmul::dequant::dequant_row;
    use crate::simd::{detected_level, SimdLevel};
    use crate::testutil::{random_weights, Rng};
    use coil_gguf::GgmlType;

    fn run(
        data: &[u8],
        rb: usize,
        rows: usize,
        xa: &QuantAct,
        t0: usize,
        nt: usize,
    ) -> Vec<Vec<f32>> {
        let p = panel(xa, t0, nt);
        let mut ys = vec![vec![f32::NAN; rows]; nt];
        let mut outs: Vec<&mut [f32]> = ys.iter_mut().map(|y| y.as_mut_slice()).collect();
        // SAFETY: AVX-512 checked by the caller.
        unsafe { tile_q4_k(data, rb, &p, &mut outs) };
        ys
    }

    /// Each row and token equals the product of the dequantized weights
    /// with the quantized activations (f64), within f32 rounding; and is the
    /// same bit for bit whatever the token count and wherever the rows start
    /// (batch invariance).
    #[test]
    fn q4_k_rows_in_lanes_match_the_reference_and_are_invariant() {
        if detected_level() < SimdLevel::Avx512 {
            return;
        }
        let cols = 768;
        for rows in [1, 13, 16, 37] {
            let mut rng = Rng::new(5 + rows as u64);
            let data = random_weights(&mut rng, GgmlType::Q4_K, rows, cols);
            let rb = data.len() / rows;
            let x = rng.vec(12 * cols);
            let xa = QuantAct::q8_k(&x, cols);
            let nb = cols / 256;
            let mut wf = vec![0f32; cols];
            let alone: Vec<Vec<f32>> = (0..12)
                .map(|t| run(&data, rb, rows, &xa, t, 1).remove(0))
                .collect();
            for r in 0..rows {
                assert!(dequant_row(
                    GgmlType::Q4_K,
                    &data[r * rb..(r + 1) * rb],
                    &mut wf
                ));
                for (t, y) in alone.iter().enumerate() {
                    let want: f64 = (0..cols)
                        .map(|c| {
                            let dx = f64::from(xa.d[t * nb + c / 256]);
                            f64::from(wf[c]) * f64::from(xa.qs_row(t)[c]) * dx
                        })
                        .sum();
                    let scale: f64 = (0..cols)
                        .map(|c| (f64::from(wf[c]) * f64::from(x[t * cols + c])).abs())
                        .sum();
                    let got = f64::from(y[r]);
                    assert!(
                        (got - want).abs() <= 1e-5 * scale + 1e-6,
                        "row {r} token {t}: {got} against {want}"
                    );
                }
            }
            for nt in 2..=MAX_TOKENS {
                let t0 = 12 - nt;
                for (k, y) in run(&data, rb, rows, &xa, t0, nt).iter().enumerate() {
                    for r in 0..rows {
                        assert_eq!(
                            y[r].to_bits(),
                            alone[t0 + k][r].to_bits(),
                            "{nt} tokens, row {r}"
                        );
                    }
                }
            }
            // rows from 3 on: the lanes shift, the results do not
            if rows > 3 {
                let y = run(&data[3 * rb..], rb, rows - 3, &xa, 4, 5);
                for (k, y) in y.iter().enumerate() {
                    for r in 3..rows {
                        assert_eq!(y[r - 3].to_bits(), alone[4 + k][r].to_bits());
                    }
                }
            }
        }
    }
}
