//! Q8_0 with the rows in the vector lanes: the layout [`repack`] gives a
//! Q8_0 weight matrix at load and the kernel for 1 to 9 tokens that reads
//! it, as `lanes.rs` does for Q4_K (see there for why, and for the batch
//! invariance).
//!
//! A Q8_0 block (32 values, 34 bytes): `d` (f16), then 32 i8 quants;
//! `w = d·q`. Per group of 16 rows and per block, the layout holds 8
//! vectors whose lane `r` has bytes `4g..4g + 4` of row `r`'s quants, each
//! offset by 128 (`q ^ 0x80`: unsigned, `vpdpbusd`'s unsigned operand
//! against the signed activations), then the 16 rows' `d`. That is the
//! integer GEMM's panel already (rows in lanes, 4 values per lane), the
//! offset taken back off. The few-token tile of the plain rows transposed
//! 4 vectors per 8 blocks and summed each row's lanes per token; here a
//! block's 8 products per token land in the rows' own lanes.
//!
//! Per block and token: `y += d·dx · (Σ (q + 128)·qx − 128·Σ qx)`, the
//! integer sum starting from `−128·Σ qx`.
use super::super::act::{ActPanel, QuantAct, PANEL_LANES};
use super::lanes::rows32;
use std::arch::x86_64::*;

/// Bytes of one block of 16 rows in the repacked layout: 8 vectors of
/// quants, then 16 f16 scales.
pub(in crate::matmul) const PACKED_BLOCK: usize = 16 * 34;
const D: usize = 512;

/// The panel [`rows_q8_0`] reads: [`ActPanel::new`]'s chunks of 32 values
/// (one block) per token, their scales and sums.
pub(super) fn panel(a: &QuantAct, t0: usize, nt: usize) -> ActPanel {
    ActPanel::new(a, t0, nt, 32, 1, 32)
}

/// Repacked Q8_0 rows (`out[t].len()` of them, a multiple of 16; `rb`
/// bytes per row) times `NT` tokens of a [`panel`].
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,avx2,fma,f16c,bmi2")]
#[inline]
unsafe fn rows_q8_0<const NT: usize>(w: &[u8], rb: usize, p: &ActPanel, out: &mut [&mut [f32]]) {
    let nb = p.n_blocks;
    assert!(p.nt == NT && out.len() == NT && NT <= PANEL_LANES);
    assert!(p.qs.len() >= NT * nb * 32 && p.d.len() >= nb * PANEL_LANES);
    assert!(p.sums.len() >= nb * NT);
    let n = out[0].len();
    assert!(out.iter().all(|o| o.len() == n) && n.is_multiple_of(16));
    assert!(rb == nb * 34 && w.len() >= n * rb);
    let (xq, xd, xs) = (p.qs.as_ptr(), p.d.as_ptr(), p.sums.as_ptr());
    for r0 in (0..n).step_by(16) {
        let mut facc = [_mm512_setzero_ps(); NT];
        for i in 0..nb {
            // one stream: the group's blocks follow each other
            let b = w.as_ptr().add(r0 * rb + PACKED_BLOCK * i);
            super::dots::prefetch_ahead::<{ super::super::x86_avx2::dots::PF_STREAM }>(
                b,
                PACKED_BLOCK,
            );
            let dw = _mm512_cvtph_ps(_mm256_loadu_si256(b.add(D) as *const __m256i));
            let wv: [__m512i; 8] =
                std::array::from_fn(|g| _mm512_loadu_si512(b.add(64 * g) as *const _));
            for (t, facc) in facc.iter_mut().enumerate() {
                let x = xq.add(32 * (i * NT + t));
                let xb =
                    |g: usize| _mm512_set1_epi32((x.add(4 * g) as *const i32).read_unaligned());
                let mut acc = _mm512_set1_epi32(-128 * i32::from(*xs.add(i * NT + t)));
                if NT <= 2 {
                    // two chains of products (integer sums: the same bits),
                    // half the latency where few tokens hide it
                    let mut odd = _mm512_setzero_si512();
                    for g in (0..8).step_by(2) {
                        acc = _mm512_dpbusd_epi32(acc, wv[g], xb(g));
                        odd = _mm512_dpbusd_epi32(odd, wv[g + 1], xb(g + 1));
                    }
                    acc = _mm512_add_epi32(acc, odd);
                } else {
                    for (g, wg) in wv.iter().enumerate() {
                        acc = _mm512_dpbusd_epi32(acc, *wg, xb(g));
                    }
                }
                let s = _mm512_mul_ps(dw, _mm512_set1_ps(*xd.add(i * PANEL_LANES + t)));
                *facc = _mm512_fmadd_ps(_mm512_cvtepi32_ps(acc), s, *facc);
            }
        }
        for (t, o) in out.iter_mut().enumerate() {
            _mm512_storeu_ps(o.as_mut_ptr().add(r0), facc[t]);
        }
    }
}

/// [`rows_q8_0`] for a panel of 1 to 9 tokens.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,avx2,fma,f16c,bmi2")]
pub(super) unsafe fn tile_packed(w: &[u8], rb: usize, p: &ActPanel, out: &mut [&mut [f32]]) {
    match p.nt {
        1 => rows_q8_0::<1>(w, rb, p, out),
        2 => rows_q8_0::<2>(w, rb, p, out),
        3 => rows_q8_0::<3>(w, rb, p, out),
        4 => rows_q8_0::<4>(w, rb, p, out),
        5 => rows_q8_0::<5>(w, rb, p, out),
        6 => rows_q8_0::<6>(w, rb, p, out),
        7 => rows_q8_0::<7>(w, rb, p, out),
        8 => rows_q8_0::<8>(w, rb, p, out),
        9 => rows_q8_0::<9>(w, rb, p, out),
        n => panic!("tile_packed (Q8_0): unsupported token count {n}"),
    }
}

/// For the integer GEMM's panels: block `i` of 16 repacked rows at `g`:
/// its 8 vectors of signed quants (the offset removed) and `d` per row lane.
///
/// # Safety
/// AVX-512 available; `g` points at a group of a repacked matrix with more
/// than `i` blocks.
#[inline(always)]
pub(in crate::matmul) unsafe fn packed_block(g: *const u8, i: usize) -> ([__m512i; 8], __m512) {
    let b = g.add(PACKED_BLOCK * i);
    let off = _mm512_set1_epi8(-128);
    let q = std::array::from_fn(|k| {
        _mm512_xor_si512(_mm512_loadu_si512(b.add(64 * k) as *const _), off)
    });
    (
        q,
        _mm512_cvtph_ps(_mm256_loadu_si256(b.add(D) as *const __m256i)),
    )
}

/// Rewrites a Q8_0 matrix in place into the layout above (see
/// `lanes::repack` for the conditions; rows of a multiple of 256 values).
pub fn repack(data: &mut [u8], rows: usize, cols: usize) {
    assert!(super::lanes::can_repack(rows) && cols.is_multiple_of(256));
    let nb = cols / 32;
    let rb = nb * 34;
    assert_eq!(
        data.len(),
        rows * rb,
        "repack: not {rows} Q8_0 rows of {cols}"
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
    let off = _mm512_set1_epi8(-128);
    for i in 0..nb {
        let o = out.as_mut_ptr().add(PACKED_BLOCK * i);
        for (g, v) in rows32(&rows, 34 * i + 2).iter().enumerate() {
            _mm512_storeu_si512(o.add(64 * g) as *mut _, _mm512_xor_si512(*v, off));
        }
        for (r, row) in rows.iter().enumerate() {
            std::ptr::copy_nonoverlapping(row.add(34 * i), o.add(D + 2 * r), 2);
        }
    }
}

/// Row `r` of a repacked Q8_0 matrix back in its GGUF encoding (`out`: 34
/// bytes per block).
pub fn unpack_row(data: &[u8], cols: usize, r: usize, out: &mut [u8]) {
    let nb = cols / 32;
    let rb = nb * 34;
    assert_eq!(out.len(), rb);
    let (g, lane) = (r / 16, r % 16);
    let group = &data[g * 16 * rb..(g + 1) * 16 * rb];
    for i in 0..nb {
        let b = &group[PACKED_BLOCK * i..PACKED_BLOCK * (i + 1)];
        let o = &mut out[34 * i..34 * (i + 1)];
        o[..2].copy_from_slice(&b[D + 2 * lane..D + 2 * lane + 2]);
        for k in 0..8 {
            for j in 0..4 {
                o[2 + 4 * k + j] = b[64 * k + 4 * lane + j] ^ 0x80;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::simd::{detected_level, SimdLevel};
    use coil_gguf::GgmlType;

    /// The checks of every rows-in-lanes format (`lanes_check::check`).
    #[test]
    fn q8_0_rows_in_lanes() {
        if detected_level() < SimdLevel::Avx512 {
            return;
        }
        let f = super::super::lanes_check::Format {
            ty: GgmlType::Q8_0,
            repack,
            unpack_row,
            quantize: QuantAct::q8_0,
            act_block: 32,
            panel,
            tile: tile_packed,
        };
        super::super::lanes_check::check(&f, 512, 23);
    }
}
