//! The attention kernel for head dims that are a multiple of 16 (prompt
//! processing and decoding alike): per block of [`PB`] positions, the
//! scores of `MR` (query, head) rows at a time are one register-tile
//! product with the transposed K block, and `P·V` another, so the FMAs run
//! in independent chains instead of one dependent chain per row. Same
//! online softmax as [`super::item`], which serves the other head dims.

// Only the x86 SIMD levels instantiate it (see `supports`).
#![cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
use super::call::{Call, Item, Scratch};
use super::kv::{kv_block, PB};
use crate::simd::math::exp_fast;
use crate::simd::tile::{fma_tile, store_tile, transpose, V16};
use crate::simd::{level, SimdLevel};

/// Whether [`item`] handles rows of `head_dim` values.
/// (At the portable level the per-row kernel, which the compiler
/// vectorizes for the target as a whole, measured faster: 59 against 44
/// GFLOP/s at 64 queries × 4096 positions with SSE2 only.)
pub(super) fn supports(head_dim: usize) -> bool {
    head_dim.is_multiple_of(16) && level() >= SimdLevel::Avx2
}

/// `acc[r][j] += Σ_k a[r·lda + k] · b[k·ldb + 16j]` for a runtime number
/// of vectors `nv` in 1..=4.
#[inline(always)]
unsafe fn fma_cols<V: V16, const MR: usize>(
    nv: usize,
    o: *mut f32,
    ldo: usize,
    a: *const f32,
    lda: usize,
    b: *const f32,
    ldb: usize,
    depth: usize,
) {
    macro_rules! run {
        ($nv:literal) => {{
            let mut acc = [[V::zero(); $nv]; MR];
            for (r, row) in acc.iter_mut().enumerate() {
                for (j, v) in row.iter_mut().enumerate() {
                    *v = V::load(o.add(r * ldo + 16 * j));
                }
            }
            fma_tile::<V, MR, $nv>(&mut acc, a, lda, b, ldb, depth);
            store_tile::<V, MR, $nv>(&acc, o, ldo, MR);
        }};
    }
    match nv {
        1 => run!(1),
        2 => run!(2),
        3 => run!(3),
        _ => run!(4),
    }
}

/// The largest of `x` (−∞ if empty), in 16 independent lanes so it vectorizes.
#[inline(always)]
fn lanes_max(x: &[f32]) -> f32 {
    let mut acc = [f32::NEG_INFINITY; 16];
    let c = x.chunks_exact(16);
    let rest = c
        .remainder()
        .iter()
        .fold(f32::NEG_INFINITY, |m, v| m.max(*v));
    for blk in c {
        for i in 0..16 {
            acc[i] = if blk[i] > acc[i] { blk[i] } else { acc[i] };
        }
    }
    acc.iter().fold(rest, |m, v| m.max(*v))
}

/// The sum of `x`, in 16 independent lanes so it vectorizes.
#[inline(always)]
fn lanes_sum(x: &[f32]) -> f32 {
    let mut acc = [0f32; 16];
    let c = x.chunks_exact(16);
    let rest: f32 = c.remainder().iter().sum();
    for blk in c {
        for i in 0..16 {
            acc[i] += blk[i];
        }
    }
    acc.iter().sum::<f32>() + rest
}

/// Work item `it` (see [`super::item`]); `head_dim` must pass [`supports`].
///
/// # Safety
/// As [`Scratch::finish`].
#[inline(always)]
/// `NV`: vectors of 16 output columns per `P·V` tile (4 with 32 zmm
/// registers; 2 at AVX2, whose 16 ymm registers hold a 2-row tile of 2
/// vectors — 8 ymm — and its operands, where 4 spilled).
unsafe fn item_body<V: V16, const MR: usize, const NV: usize>(
    call: &Call,
    it: Item,
    sc: &mut Scratch,
) {
    let kv = call.kv;
    let hd = kv.head_dim;
    debug_assert!(supports(hd));
    let rows = call.rows(it);
    // Rows padded to whole tiles (padding rows: zero queries, never read).
    let rp = rows.next_multiple_of(MR);
    sc.begin(call, it, rp);
    sc.p.clear();
    sc.p.resize(rp * PB, 0.0);
    let limit = |r: usize| call.limit(it, r);
    let max_len = call.max_len(it);
    let nvec = hd / 16;
    let mut p0 = call.first_block(it);
    while p0 < max_len {
        let nb = PB.min(max_len - p0);
        // Kᵀ of the block, [hd][PB] (columns past nb zero).
        let kr = kv_block(&kv.k, kv, it.kvh, p0, nb, &mut sc.kb);
        if nb < PB {
            sc.kt.fill(0.0);
        }
        transpose::<V>(kr.data.as_ptr(), kr.stride, nb, hd, sc.kt.as_mut_ptr(), PB);
        let vr = kv_block(&kv.v, kv, it.kvh, p0, nb, &mut sc.vb);
        let mut r0 = 0;
        while r0 < rows {
            let tile_rows = MR.min(rows - r0);
            // Rows of the tile that see this block at all.
            if (r0..r0 + tile_rows).all(|r| limit(r) <= p0 || call.start(it, r) >= p0 + nb) {
                r0 += MR;
                continue;
            }
            // S = Q·Kᵀ for the tile, [MR][PB].
            let mut acc = [[V::zero(); 2]; MR];
            fma_tile::<V, MR, 2>(
                &mut acc,
                sc.q.as_ptr().add(r0 * hd),
                hd,
                sc.kt.as_ptr(),
                PB,
                hd,
            );
            let p = sc.p.as_mut_ptr().add(r0 * PB);
            store_tile::<V, MR, 2>(&acc, p, PB, MR);
            // Online softmax per row: P = exp(S − m), rescaling o and l.
            for i in 0..tile_rows {
                let r = r0 + i;
                let prow = std::slice::from_raw_parts_mut(p.add(i * PB), PB);
                let valid = limit(r).saturating_sub(p0).min(nb);
                // Lanes before `lo`: below the row's sliding window.
                let lo = call.start(it, r).saturating_sub(p0);
                if lo >= valid {
                    prow.fill(0.0);
                    continue;
                }
                let bmax = lanes_max(&prow[lo..valid]);
                let m_old = sc.m[r];
                let m_new = m_old.max(bmax);
                let corr = exp_fast(m_old - m_new);
                if corr != 1.0 {
                    sc.o[r * hd..(r + 1) * hd]
                        .iter_mut()
                        .for_each(|v| *v *= corr);
                    sc.l[r] *= corr;
                }
                sc.m[r] = m_new;
                prow[lo..valid]
                    .iter_mut()
                    .for_each(|v| *v = exp_fast(*v - m_new));
                prow[..lo].fill(0.0);
                prow[valid..].fill(0.0);
                sc.l[r] += lanes_sum(&prow[lo..valid]);
            }
            for i in tile_rows..MR {
                std::slice::from_raw_parts_mut(p.add(i * PB), PB).fill(0.0);
            }
            // o += P·V for the tile, up to NV vectors of columns at a time.
            let mut j0 = 0;
            while j0 < nvec {
                let nv = NV.min(nvec - j0);
                fma_cols::<V, MR>(
                    nv,
                    sc.o.as_mut_ptr().add(r0 * hd + 16 * j0),
                    hd,
                    p,
                    PB,
                    vr.data.as_ptr().add(16 * j0),
                    vr.stride,
                    nb,
                );
                j0 += nv;
            }
            r0 += MR;
        }
        p0 += nb;
    }
    sc.finish(call, it);
}

const NV_AVX2: usize = 2;

#[cfg(target_arch = "x86_64")]
mod levels {
    use super::{item_body, Call, Item, Scratch};
    use crate::simd::tile::x86::Pair;
    use std::arch::x86_64::__m512;

    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq,avx2,fma,f16c")]
    pub unsafe fn item_avx512<const MR: usize>(call: &Call, it: Item, sc: &mut Scratch) {
        item_body::<__m512, MR, 4>(call, it, sc)
    }

    #[target_feature(enable = "avx2,fma,f16c")]
    pub unsafe fn item_avx2<const MR: usize>(call: &Call, it: Item, sc: &mut Scratch) {
        item_body::<Pair, MR, { super::NV_AVX2 }>(call, it, sc)
    }
}

/// [`item_body`] at the current SIMD level.
///
/// # Safety
/// As [`item_body`].
pub(super) unsafe fn item(call: &Call, it: Item, sc: &mut Scratch) {
    // Few rows (one query's heads while decoding): tiles of 2 rows waste
    // less on padding.
    let few = call.rows(it) < 6;
    #[cfg(target_arch = "x86_64")]
    match (level(), few) {
        // SAFETY: level() only reports features the CPU has.
        (SimdLevel::Avx512, false) => return levels::item_avx512::<6>(call, it, sc),
        (SimdLevel::Avx512, true) => return levels::item_avx512::<2>(call, it, sc),
        (SimdLevel::Avx2, _) => return levels::item_avx2::<2>(call, it, sc),
        (SimdLevel::Scalar, _) => {}
    }
    unreachable!(
        "tiled attention at the {:?} level (see `supports`)",
        level()
    )
}
