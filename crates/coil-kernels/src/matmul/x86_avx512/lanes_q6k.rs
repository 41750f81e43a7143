//! Q6_K with the rows in the vector lanes: the layout [`repack`] gives a
//! Q6_K weight matrix at load and the kernel for 1 to 9 tokens
//! that reads it, as `lanes.rs` does for Q4_K (see there for why, and for
//! the batch invariance).
//!
//! A Q6_K block (256 values, 210 bytes): `ql[128]` (low 4 bits), `qh[64]`
//! (high 2 bits), `scales[16]` (i8, one per 16 values), `d` (f16). In half
//! `n` (values `128n..`), byte `l < 32` of `ql` holds values `l` (low
//! nibble) and `l + 64` (high), byte `32 + l` values `l + 32` and `l + 96`,
//! and `qh` byte `l` their top bits, two each. `w = d·sc·(q − 32)`.
//!
//! Per block and token: `y += dx · Σ_s d·sc_s · (Σ q·qx − 32 · Σ qx)` over
//! the 16 sub-blocks `s` of 16 values (the offset enters the integer sum:
//! it starts from `−32 · Σ qx`).

use super::super::act::{ActPanel, QuantAct, PANEL_LANES};
use super::lanes::{heads, load16, rows32};
use std::arch::x86_64::*;

/// Bytes of one block of 16 rows in the repacked layout: `ql` as 2 halves
/// of 16 vectors (dword `k` of the half's 64 bytes, row `r` in lane `r`),
/// `qh` as 2 halves of 8, the scales as 4, then the 16 rows' `d` (f16).
pub(in crate::matmul) const PACKED_BLOCK: usize = 16 * 210;
const QH: usize = 2048;
const SC: usize = 3072;
const D: usize = 3328;

/// The panel [`rows_q6_k`] reads: [`ActPanel::new`]'s chunks of 64 values
/// and scales, plus in `hoff[(i · nt + t) · 16 + s]` the start of token
/// `t`'s integer sum over sub-block `s` of block `i`: `−32 · Σ qx`.
pub(super) fn panel(a: &QuantAct, t0: usize, nt: usize) -> ActPanel {
    let mut p = ActPanel::new(a, t0, nt, 256, 16, 64);
    p.hoff = p.sums.iter().map(|&s| -32 * i32::from(s)).collect();
    p
}

/// One block's shared part for 16 rows: `a[s]` = `d·sc_s` per row lane,
/// and `w[s][v]`: columns `16s + 4v .. + 4` of the 16 rows (0..63).
#[repr(C, align(64))]
struct Block {
    a: [__m512; 16],
    w: [[__m512i; 4]; 16],
}

/// One block of 16 repacked rows at `b`.
#[inline(always)]
unsafe fn unpack_packed(b: *const u8, blk: &mut Block) {
    let d = _mm512_cvtph_ps(_mm256_loadu_si256(b.add(D) as *const __m256i));
    let sc = load16::<4>(b.add(SC));
    for (s, a) in blk.a.iter_mut().enumerate() {
        // byte s % 4 of dword s / 4, sign-extended
        let v = _mm512_sllv_epi32(sc[s / 4], _mm512_set1_epi32(24 - 8 * (s % 4) as i32));
        *a = _mm512_mul_ps(d, _mm512_cvtepi32_ps(_mm512_srai_epi32::<24>(v)));
    }
    let m4 = _mm512_set1_epi8(0x0f);
    let m2 = _mm512_set1_epi8(0x03);
    for n in 0..2 {
        let ql = load16::<16>(b.add(1024 * n));
        let qh = load16::<8>(b.add(QH + 512 * n));
        for lg in 0..8 {
            let (lo, hi, h) = (ql[lg], ql[8 + lg], qh[lg]);
            let top = |k: u32| {
                let hk = match k {
                    0 => h,
                    1 => _mm512_srli_epi16::<2>(h),
                    2 => _mm512_srli_epi16::<4>(h),
                    _ => _mm512_srli_epi16::<6>(h),
                };
                _mm512_slli_epi16::<4>(_mm512_and_si512(hk, m2))
            };
            let q = [
                _mm512_or_si512(_mm512_and_si512(lo, m4), top(0)),
                _mm512_or_si512(_mm512_and_si512(hi, m4), top(1)),
                _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi16::<4>(lo), m4), top(2)),
                _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi16::<4>(hi), m4), top(3)),
            ];
            // q[k]: columns 128n + 32k + 4lg: sub-block 8n + 2k + lg / 4
            for (k, q) in q.iter().enumerate() {
                blk.w[8 * n + 2 * k + lg / 4][lg % 4] = *q;
            }
        }
    }
}

/// Repacked Q6_K rows (`out[t].len()` of them, a multiple of 16; `rb`
/// bytes per row) times `NT` tokens of a [`panel`].
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,avx2,fma,f16c,bmi2")]
#[inline]
unsafe fn rows_q6_k<const NT: usize>(w: &[u8], rb: usize, p: &ActPanel, out: &mut [&mut [f32]]) {
    let nb = p.n_blocks;
    assert!(p.nt == NT && out.len() == NT && NT <= PANEL_LANES);
    assert!(p.qs.len() >= NT * nb * 256 && p.d.len() >= nb * PANEL_LANES);
    assert!(p.hoff.len() >= nb * NT * 16);
    let n = out[0].len();
    assert!(out.iter().all(|o| o.len() == n) && n.is_multiple_of(16));
    assert!(rb == nb * 210 && w.len() >= n * rb);
    let (xq, xd, xo) = (p.qs.as_ptr(), p.d.as_ptr(), p.hoff.as_ptr());
    let mut blk: Block = std::mem::zeroed();
    for r0 in (0..n).step_by(16) {
        let mut facc = [_mm512_setzero_ps(); NT];
        for i in 0..nb {
            let b = w.as_ptr().add(r0 * rb + PACKED_BLOCK * i);
            super::prefetch_ahead::<{ super::super::x86_avx2::PF_STREAM }>(b, PACKED_BLOCK);
            unpack_packed(b, &mut blk);
            let mut fsb = [_mm512_setzero_ps(); NT];
            for s in 0..16 {
                let wv = blk.w[s];
                let a = blk.a[s];
                for t in 0..NT {
                    // columns 256i + 16s .. of token t: chunk 4i + s/4
                    let x = xq.add(64 * ((4 * i + s / 4) * NT + t) + 16 * (s % 4));
                    let mut acc = _mm512_set1_epi32(*xo.add((i * NT + t) * 16 + s));
                    for (v, wq) in wv.iter().enumerate() {
                        let xb = _mm512_set1_epi32((x.add(4 * v) as *const i32).read_unaligned());
                        acc = _mm512_dpbusd_epi32(acc, *wq, xb);
                    }
                    fsb[t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(acc), a, fsb[t]);
                }
            }
            for t in 0..NT {
                let dx = _mm512_set1_ps(*xd.add(i * PANEL_LANES + t));
                facc[t] = _mm512_fmadd_ps(fsb[t], dx, facc[t]);
            }
        }
        for (t, o) in out.iter_mut().enumerate() {
            _mm512_storeu_ps(o.as_mut_ptr().add(r0), facc[t]);
        }
    }
}

/// [`rows_q6_k`] for a panel of 1 to 9 tokens.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,avx2,fma,f16c,bmi2")]
pub(super) unsafe fn tile_packed(w: &[u8], rb: usize, p: &ActPanel, out: &mut [&mut [f32]]) {
    match p.nt {
        1 => rows_q6_k::<1>(w, rb, p, out),
        2 => rows_q6_k::<2>(w, rb, p, out),
        3 => rows_q6_k::<3>(w, rb, p, out),
        4 => rows_q6_k::<4>(w, rb, p, out),
        5 => rows_q6_k::<5>(w, rb, p, out),
        6 => rows_q6_k::<6>(w, rb, p, out),
        7 => rows_q6_k::<7>(w, rb, p, out),
        8 => rows_q6_k::<8>(w, rb, p, out),
        9 => rows_q6_k::<9>(w, rb, p, out),
        n => panic!("tile_packed (Q6_K): unsupported token count {n}"),
    }
}

/// For the integer GEMM's panels: block `i` of 16 repacked rows at `g`:
/// per 16-value sub-block `s`, its 4 vectors of values (0..63) and `d·sc_s`
/// per row lane.
///
/// # Safety
/// AVX-512 available; `g` points at a group of a repacked matrix with more
/// than `i` blocks.
#[inline(always)]
pub(in crate::matmul) unsafe fn packed_block(
    g: *const u8,
    i: usize,
) -> ([[__m512i; 4]; 16], [__m512; 16]) {
    let mut blk: Block = std::mem::zeroed();
    unpack_packed(g.add(PACKED_BLOCK * i), &mut blk);
    (blk.w, blk.a)
}

/// Rewrites a Q6_K matrix in place into the layout above (see
/// `lanes::repack` for the conditions).
pub fn repack(data: &mut [u8], rows: usize, cols: usize) {
    assert!(super::lanes::can_repack(rows) && cols.is_multiple_of(256));
    let nb = cols / 256;
    let rb = nb * 210;
    assert_eq!(
        data.len(),
        rows * rb,
        "repack: not {rows} Q6_K rows of {cols}"
    );
    // SAFETY: AVX-512 checked by the caller.
    super::lanes::for_each_group(data, rb, |g, out| unsafe { repack_group(g, rb, nb, out) });
}

#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,avx2,fma,f16c,bmi2")]
unsafe fn repack_group(group: &[u8], rb: usize, nb: usize, out: &mut [u8]) {
    let mut rows = [group.as_ptr(); 16];
    for (k, row) in rows.iter_mut().enumerate() {
        *row = group.as_ptr().add(k * rb);
    }
    let store = |o: *mut u8, v: &[__m512i]| {
        for (k, v) in v.iter().enumerate() {
            _mm512_storeu_si512(o.add(64 * k) as *mut _, *v);
        }
    };
    for i in 0..nb {
        let (src, o) = (210 * i, out.as_mut_ptr().add(PACKED_BLOCK * i));
        for n in 0..2 {
            store(o.add(1024 * n), &rows32(&rows, src + 64 * n));
            store(o.add(1024 * n + 512), &rows32(&rows, src + 64 * n + 32));
            store(o.add(QH + 512 * n), &rows32(&rows, src + 128 + 32 * n));
        }
        store(o.add(SC), &heads(&rows, src + 192));
        for (k, row) in rows.iter().enumerate() {
            std::ptr::copy_nonoverlapping(row.add(src + 208), o.add(D + 2 * k), 2);
        }
    }
}

/// Row `r` of a repacked Q6_K matrix back in its GGUF encoding (`out`: 210
/// bytes per block).
pub fn unpack_row(data: &[u8], cols: usize, r: usize, out: &mut [u8]) {
    let nb = cols / 256;
    let rb = nb * 210;
    assert_eq!(out.len(), rb);
    let (g, lane) = (r / 16, r % 16);
    let group = &data[g * 16 * rb..(g + 1) * 16 * rb];
    // dword `k` of lane `lane` in the vectors from `at`
    let dw = |b: &[u8], at: usize, k: usize| {
        let v = at + 64 * k + 4 * lane;
        [b[v], b[v + 1], b[v + 2], b[v + 3]]
    };
    for i in 0..nb {
        let b = &group[PACKED_BLOCK * i..PACKED_BLOCK * (i + 1)];
        let o = &mut out[210 * i..210 * (i + 1)];
        for k in 0..32 {
            o[4 * k..4 * k + 4].copy_from_slice(&dw(b, 0, k));
        }
        for k in 0..16 {
            o[128 + 4 * k..132 + 4 * k].copy_from_slice(&dw(b, QH, k));
        }
        for k in 0..4 {
            o[192 + 4 * k..196 + 4 * k].copy_from_slice(&dw(b, SC, k));
        }
        o[208..210].copy_from_slice(&b[D + 2 * lane..D + 2 * lane + 2]);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::matmul::dequant::dequant_row;
    use crate::matmul::{matmul, Layout, WeightRef};
    use crate::simd::{detected_level, SimdLevel};
    use crate::testutil::{random_weights, Rng};
    use coil_gguf::GgmlType;

    fn run(
        packed: &[u8],
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
        unsafe { tile_packed(packed, rb, &p, &mut outs) };
        ys
    }

    /// As Q4_K's: the f64 reference of the quantized product, the same
    /// bits for 1–9 tokens and shifted groups, rows unpacked as they were,
    /// and through `matmul` the kernel's bits up to 13 tokens and the
    /// integer GEMM's on the plain rows from 12.
    #[test]
    fn q6_k_rows_in_lanes() {
        if detected_level() < SimdLevel::Avx512 {
            return;
        }
        let (rows, cols) = (48, 768);
        let mut rng = Rng::new(21);
        let plain = random_weights(&mut rng, GgmlType::Q6_K, rows, cols);
        let rb = plain.len() / rows;
        let mut packed = plain.clone();
        assert!(crate::matmul::repack(
            GgmlType::Q6_K,
            &mut packed,
            rows,
            cols
        ));
        assert_ne!(packed, plain);
        let mut row = vec![0u8; rb];
        for r in 0..rows {
            unpack_row(&packed, cols, r, &mut row);
            assert_eq!(row, plain[r * rb..(r + 1) * rb], "row {r}");
        }
        let x = rng.vec(40 * cols);
        let xa = QuantAct::q8_k(&x, cols);
        let nb = cols / 256;
        let alone: Vec<Vec<f32>> = (0..40)
            .map(|t| run(&packed, rb, rows, &xa, t, 1).remove(0))
            .collect();
        let mut wf = vec![0f32; cols];
        for r in 0..rows {
            assert!(dequant_row(
                GgmlType::Q6_K,
                &plain[r * rb..(r + 1) * rb],
                &mut wf
            ));
            for (t, y) in alone.iter().enumerate().take(6) {
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
        for nt in 2..=9 {
            for (k, y) in run(&packed, rb, rows, &xa, 12 - nt, nt).iter().enumerate() {
                for r in 0..rows {
                    assert_eq!(
                        y[r].to_bits(),
                        alone[12 - nt + k][r].to_bits(),
                        "{nt} tokens, row {r}"
                    );
                }
            }
        }
        let y = run(&packed[16 * rb..], rb, rows - 16, &xa, 4, 5);
        for (k, y) in y.iter().enumerate() {
            for r in 16..rows {
                assert_eq!(y[r - 16].to_bits(), alone[4 + k][r].to_bits());
            }
        }
        let pool = crate::ThreadPool::new(2);
        let wp = WeightRef::new(GgmlType::Q6_K, &plain, rows, cols).unwrap();
        let wl = WeightRef {
            layout: Layout::Lanes16,
            ..WeightRef::new(GgmlType::Q6_K, &packed, rows, cols).unwrap()
        };
        let (mut a, mut b) = (vec![0f32; cols], vec![0f32; cols]);
        wp.dequantize_row(33, &mut a);
        wl.dequantize_row(33, &mut b);
        assert_eq!(a, b);
        for (n, invariant) in [(1, false), (4, false), (11, false), (13, true)] {
            let _scope = crate::invariant_scope(invariant);
            let mut y = vec![0f32; n * rows];
            matmul(&pool, &wl, &x[..n * cols], &mut y, n);
            for t in 0..n {
                for r in 0..rows {
                    assert_eq!(
                        y[t * rows + r].to_bits(),
                        alone[t][r].to_bits(),
                        "{n} tokens"
                    );
                }
            }
        }
        let (mut yp, mut yl) = (vec![0f32; 40 * rows], vec![0f32; 40 * rows]);
        matmul(&pool, &wp, &x, &mut yp, 40);
        matmul(&pool, &wl, &x, &mut yl, 40);
        assert_eq!(yp, yl);
    }
}
