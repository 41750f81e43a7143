//! The K-quants: Q4_K, Q5_K, Q6_K (the Q4_K_M / Q5_K_M mixtures), Q2_K and
//! Q3_K (the Q2_K / Q3_K_* ones).
//!
//! Their weights are small unsigned integers `q` (Q4_K 0..15, Q5_K 0..31,
//! Q6_K 0..63, Q2_K 0..3, Q3_K 0..7 with its high bit) with an integer
//! scale `s` per group of 32 (Q6_K, Q2_K, Q3_K: 16) values and a float
//! scale per 256: `w = d·s·q − dmin·m` (Q6_K: `d·s·(q − 32)`, i.e. `m =
//! 32·s`, `dmin = d`; Q3_K the same with 4). Activations are quantized as for the decode
//! path (Q8_K style: `x = dx·qx`, `qx` in −127..127, one `dx` per 256, sums
//! of `qx` per 16). Then, per row, token and super-block of 256,
//! `y += dx·(d·Σ_g s_g·Σ q·qx − dmin·Σ_g m_g·Σ_g qx)` with both sums exact
//! in i32 — the same integers as the decode dot products.
//!
//! `vpmaddubsw` multiplies the unsigned `q` by the signed `qx` and adds
//! pairs into i16 (no overflow: `2·63·127 < 2^15`); a few of those add up in
//! i16 before `vpmaddwd` by the group scale widens them to i32 (Q4_K: 8,
//! Q5_K: 4, Q6_K: 2, Q2_K / Q3_K: 4, a whole group — the most that cannot
//! overflow and stay in one group).
//!
//! Layout: a panel of 8 weight rows is packed
//! `[32-col block][group of 4 cols][8 rows][4]` (32 bytes per
//! `vpmaddubsw`); a broadcast of 4 activation bytes feeds it. The
//! microkernel keeps 4 tokens × 8 rows in registers ([`kernel`]; without
//! AVX-VNNI two panels, 16 rows, per call: [`kernel2`]). A work item is
//! [`PG`] panels, each token tile multiplied by all of them in turn (the
//! tile's activations read from L2 / L3 once, then from L1).

use super::panels::{over_panels, store_tokens, tile_tokens, NR};
use crate::aligned::AlignedVec;
use crate::matmul::scalar::dequant::{q3k_scales, rd_f16, scale_min_k4};
use crate::matmul::weight::WeightRef;
use crate::matmul::x86_avx2::decode_i8::{unpack_k45, unpack_q2k, unpack_q3k, unpack_q6k};
use crate::pool::SendPtr;
use crate::pool::ThreadPool;
use coil_gguf::GgmlType;
use std::arch::x86_64::*;
use std::cell::RefCell;

/// Tokens per microkernel call.
const NT: usize = 4;

/// One packed panel of [`NR`] rows.
#[derive(Default)]
struct Panel {
    /// `[block of 32][8 groups of 4 cols][NR rows][4]`
    q: AlignedVec<u8>,
    /// Group scales, `[scale group][NR]`, each i16 repeated in both halves
    /// of its i32 lane (the `vpmaddwd` operand).
    s: AlignedVec<i32>,
    /// Mins of two consecutive groups, `[super-block][pair][NR]`, as
    /// `m_2p | m_2p+1 << 16`.
    m: AlignedVec<i32>,
    /// `d` and `dmin` per `[super-block][NR]`.
    d: AlignedVec<f32>,
    dmin: AlignedVec<f32>,
    /// The panel's rows decoded, `q` as u8 (`[NR][cols]`), before the
    /// transpose.
    row: Vec<u8>,
    /// Q6_K, Q3_K: the mins are an integer offset of the quants (`m =
    /// o·s`, `dmin = d`), subtracted in i32 before the float scales.
    offset: bool,
}

/// Panels per work item.
const PG: usize = 4;

thread_local! {
    static PANELS: RefCell<Vec<Panel>> = const { RefCell::new(Vec::new()) };
}

/// Scale groups per super-block: 16 for Q6_K, Q2_K and Q3_K, 8 otherwise.
fn groups_per_sb(ty: GgmlType) -> usize {
    if sub16(ty) {
        16
    } else {
        8
    }
}

/// A scale per 16 values (else per 32).
fn sub16(ty: GgmlType) -> bool {
    matches!(ty, GgmlType::Q6_K | GgmlType::Q2_K | GgmlType::Q3_K)
}

/// Decodes one encoded row: `q` (u8, unsigned) into row `r` of `row`
/// (`cols` wide), per super-block `d`, `dmin` and per group `s`, `m`
/// (integers) into the panel at row `r`.
///
/// # Safety
/// AVX2 available; `src` holds `cols / 256` blocks of `ty`.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn decode_row(ty: GgmlType, src: &[u8], r: usize, cols: usize, p: &mut Panel) {
    use GgmlType::*;
    let ts = ty.block_layout().1;
    let gps = groups_per_sb(ty);
    for (sb, blk) in src.chunks_exact(ts).enumerate() {
        let qo = p.row.as_mut_ptr().add(r * cols + 256 * sb);
        let bp = blk.as_ptr();
        let mut sm = [(0i32, 0i32); 16];
        match ty {
            Q4_K | Q5_K => {
                p.d[sb * NR + r] = rd_f16(blk, 0);
                p.dmin[sb * NR + r] = rd_f16(blk, 2);
                for (j, v) in sm.iter_mut().take(8).enumerate() {
                    let (s, m) = scale_min_k4(j, &blk[4..16]);
                    *v = (s as i32, m as i32);
                }
                unpack_k45(bp, ty == Q5_K, qo);
            }
            Q6_K => {
                let d = rd_f16(blk, 208);
                p.d[sb * NR + r] = d;
                p.dmin[sb * NR + r] = d;
                for (g, v) in sm.iter_mut().enumerate() {
                    let s = (blk[192 + g] as i8) as i32;
                    *v = (s, 32 * s);
                }
                unpack_q6k::<0>(bp, qo);
            }
            Q2_K => {
                p.d[sb * NR + r] = rd_f16(blk, 80);
                p.dmin[sb * NR + r] = rd_f16(blk, 82);
                for (g, v) in sm.iter_mut().enumerate() {
                    *v = ((blk[g] & 0xF) as i32, (blk[g] >> 4) as i32);
                }
                unpack_q2k(bp, qo);
            }
            Q3_K => {
                let d = rd_f16(blk, 108);
                p.d[sb * NR + r] = d;
                p.dmin[sb * NR + r] = d;
                for (v, &s) in sm.iter_mut().zip(&q3k_scales(&blk[96..108])) {
                    *v = (s as i32, 4 * s as i32);
                }
                unpack_q3k::<0>(bp, qo);
            }
            _ => unreachable!("igemm_avx2: unsupported {ty}"),
        }
        for (g, &(s, _)) in sm.iter().take(gps).enumerate() {
            p.s[(sb * gps + g) * NR + r] = (s & 0xFFFF) | (s << 16);
        }
        for pr in 0..gps / 2 {
            let (m0, m1) = (sm[2 * pr].1, sm[2 * pr + 1].1);
            p.m[(sb * gps / 2 + pr) * NR + r] = (m0 & 0xFFFF) | (m1 << 16);
        }
    }
}

/// Packs rows `r0..r0 + NR` of `w` (rows past the end: zeros).
///
/// # Safety
/// AVX2 available.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn pack_panel(w: &WeightRef, r0: usize, p: &mut Panel) {
    let cols = w.cols;
    let (nsb, nb) = (cols / 256, cols / 32);
    let gps = groups_per_sb(w.ty);
    p.q.resize(nb * 32 * NR);
    p.s.resize(nsb * gps * NR);
    p.m.resize(nsb * gps / 2 * NR);
    p.d.resize(nsb * NR);
    p.dmin.resize(nsb * NR);
    p.row.resize(NR * cols, 0);
    p.offset = matches!(w.ty, GgmlType::Q6_K | GgmlType::Q3_K);
    let nr = NR.min(w.rows - r0);
    for r in 0..NR {
        if r < nr {
            decode_row(w.ty, w.row(r0 + r), r, cols, p);
        } else {
            p.row[r * cols..(r + 1) * cols].fill(0);
            for sb in 0..nsb {
                p.d[sb * NR + r] = 0.0;
                p.dmin[sb * NR + r] = 0.0;
            }
            for g in 0..nsb * gps {
                p.s[g * NR + r] = 0;
            }
            for pr in 0..nsb * gps / 2 {
                p.m[pr * NR + r] = 0;
            }
        }
    }
    // [r][cols] -> [block][group][r][4]: per block of 32 columns an 8 x 8
    // transpose of 4-byte groups
    let src = p.row.as_ptr();
    let dst = p.q.as_mut_ptr() as *mut __m256;
    for b in 0..nb {
        let v: [__m256; NR] =
            std::array::from_fn(|r| _mm256_loadu_ps(src.add(r * cols + 32 * b) as *const f32));
        for (g, t) in super::panels::transpose8(v).into_iter().enumerate() {
            _mm256_storeu_ps(dst.add(b * 8 + g) as *mut f32, t);
        }
    }
}

/// Activations of all tokens, Q8_K style: `qx` (i8) `[n][cols]`, `dx` per
/// 256, and the sums of `qx` of two consecutive scale groups packed as
/// `lo | hi << 16` (`[n][pairs]`, groups of 16 or 32).
#[derive(Default)]
struct Acts {
    qx: AlignedVec<i8>,
    dx: AlignedVec<f32>,
    pairs: AlignedVec<i32>,
}

thread_local! {
    static ACTS: RefCell<Acts> = RefCell::new(Acts::default());
}

fn quantize_acts(pool: &ThreadPool, x: &[f32], n: usize, cols: usize, group: usize, a: &mut Acts) {
    let (nsb, npairs) = (cols / 256, cols / group / 2);
    a.qx.resize(n * cols);
    a.dx.resize(n * nsb);
    a.pairs.resize(n * npairs);
    let (pq, pd, pp) = (
        SendPtr(a.qx.as_mut_ptr()),
        SendPtr(a.dx.as_mut_ptr()),
        SendPtr(a.pairs.as_mut_ptr()),
    );
    pool.parallel_for(n, 16, |tr, _| {
        for t in tr {
            // SAFETY: token t owns its rows of the three buffers.
            let (qx, dx, pairs) = unsafe {
                (
                    std::slice::from_raw_parts_mut(pq.get().add(t * cols), cols),
                    std::slice::from_raw_parts_mut(pd.get().add(t * nsb), nsb),
                    std::slice::from_raw_parts_mut(pp.get().add(t * npairs), npairs),
                )
            };
            // SAFETY: AVX2 checked by igemm's caller.
            unsafe { quantize_row(&x[t * cols..(t + 1) * cols], group, qx, dx, pairs) };
        }
    });
}

/// One token, as [`crate::matmul::act::QuantAct::q8_k`] quantizes it.
///
/// # Safety
/// AVX2 available.
#[target_feature(enable = "avx2,fma")]
unsafe fn quantize_row(x: &[f32], group: usize, qx: &mut [i8], dx: &mut [f32], pairs: &mut [i32]) {
    crate::matmul::act::quantize_blocks_mv(x, qx, dx, 256);
    for (p, g2) in pairs.iter_mut().zip(qx.chunks_exact(2 * group)) {
        let lo: i32 = g2[..group].iter().map(|&q| q as i32).sum();
        let hi: i32 = g2[group..].iter().map(|&q| q as i32).sum();
        *p = (lo & 0xFFFF) | (hi << 16);
    }
}

/// `y[t, r0..r0+nr]` for tokens `ts` (up to [`NT`]; unused slots repeat the
/// last token and are not stored). `ACC`: `vpmaddubsw` results summed in
/// i16 before widening; `GC`: 4-column groups per scale group.
///
/// # Safety
/// AVX2 available; `p` packed from `cols` columns; `y` valid for the
/// stored elements.
#[target_feature(enable = "avx2,fma,f16c")]
#[allow(clippy::too_many_arguments)]
unsafe fn kernel<const ACC: usize, const GC: usize>(
    p: &Panel,
    acts: &Acts,
    cols: usize,
    ts: &[usize],
    nr: usize,
    y: *mut f32,
    rows: usize,
    r0: usize,
) {
    kernel_body::<ACC, GC, false>(p, acts, cols, ts, nr, y, rows, r0)
}

/// [`kernel`] with AVX-VNNI: a scale group's products go into i32 by
/// `vpdpbusd` (one instruction per `vpmaddubsw` + `vpaddw` pair), and the
/// group scale multiplies the i32 sums (`vpmulld`) instead of the i16 ones
/// (`vpmaddwd`): the same exact integers, so the same result.
///
/// # Safety
/// AVX2 and AVX-VNNI available; as [`kernel`].
#[target_feature(enable = "avx2,fma,f16c,avxvnni")]
#[allow(clippy::too_many_arguments)]
unsafe fn kernel_vnni<const ACC: usize, const GC: usize>(
    p: &Panel,
    acts: &Acts,
    cols: usize,
    ts: &[usize],
    nr: usize,
    y: *mut f32,
    rows: usize,
    r0: usize,
) {
    kernel_body::<ACC, GC, true>(p, acts, cols, ts, nr, y, rows, r0)
}

/// The body of [`kernel`] (`VNNI`: of [`kernel_vnni`]).
#[inline(always)]
#[allow(clippy::too_many_arguments)]
unsafe fn kernel_body<const ACC: usize, const GC: usize, const VNNI: bool>(
    p: &Panel,
    acts: &Acts,
    cols: usize,
    ts: &[usize],
    nr: usize,
    y: *mut f32,
    rows: usize,
    r0: usize,
) {
    let nsb = cols / 256;
    let gps = 64 / GC; // scale groups per super-block
    let npairs = cols / (4 * GC) / 2;
    let tok = tile_tokens::<NT>(ts);
    let xp: [*const i8; NT] = tok.map(|t| acts.qx.as_ptr().add(t * cols));
    let mut facc = [_mm256_setzero_ps(); NT];
    for sb in 0..nsb {
        let mut iacc = [_mm256_setzero_si256(); NT];
        let qsb = p.q.as_ptr().add(sb * 256 * NR);
        // one broadcast of 4 activation bytes of token t, column group g
        let xb = |t: usize, g: usize| {
            _mm256_set1_epi32((xp[t].add(256 * sb + 4 * g) as *const i32).read_unaligned())
        };
        if VNNI {
            // Two scale groups at a time: 2·NT independent `vpdpbusd`
            // chains (one group's NT chains wait on its latency).
            let scale = |g0: usize| {
                // each row's scale is in both i16 halves of its lane: the
                // high half, sign-extended, is the scale as i32 (Q6_K's are
                // signed)
                _mm256_srai_epi32::<16>(_mm256_loadu_si256(
                    p.s.as_ptr().add((sb * gps + g0 / GC) * NR) as *const _,
                ))
            };
            for g0 in (0..64).step_by(2 * GC) {
                let mut ga = [_mm256_setzero_si256(); NT];
                let mut gb = [_mm256_setzero_si256(); NT];
                for k in 0..GC {
                    let (a, b) = (g0 + k, g0 + GC + k);
                    let wa = _mm256_loadu_si256(qsb.add(32 * a) as *const __m256i);
                    let wb = _mm256_loadu_si256(qsb.add(32 * b) as *const __m256i);
                    for t in 0..NT {
                        ga[t] = _mm256_dpbusd_avx_epi32(ga[t], wa, xb(t, a));
                        gb[t] = _mm256_dpbusd_avx_epi32(gb[t], wb, xb(t, b));
                    }
                }
                let (sa, sbv) = (scale(g0), scale(g0 + GC));
                for t in 0..NT {
                    let v = _mm256_add_epi32(
                        _mm256_mullo_epi32(ga[t], sa),
                        _mm256_mullo_epi32(gb[t], sbv),
                    );
                    iacc[t] = _mm256_add_epi32(iacc[t], v);
                }
            }
        } else {
            for g0 in (0..64).step_by(ACC) {
                let mut p16 = [_mm256_setzero_si256(); NT];
                for g in g0..g0 + ACC {
                    let wv = _mm256_loadu_si256(qsb.add(32 * g) as *const __m256i);
                    for (t, a) in p16.iter_mut().enumerate() {
                        *a = _mm256_add_epi16(*a, _mm256_maddubs_epi16(wv, xb(t, g)));
                    }
                }
                let sv =
                    _mm256_loadu_si256(p.s.as_ptr().add((sb * gps + g0 / GC) * NR) as *const _);
                for t in 0..NT {
                    iacc[t] = _mm256_add_epi32(iacc[t], _mm256_madd_epi16(p16[t], sv));
                }
            }
        }
        finish_sb(p, acts, &tok, sb, nsb, gps, npairs, &iacc, &mut facc);
    }
    store_tokens(&facc, ts, nr, y, rows, r0);
}

/// The end of super-block `sb` for one panel and the tokens `tok`: the
/// mins' term `Σ_g m_g · Σ_g qx` (two groups per `vpmaddwd`), then
/// `facc += dx · (d · iacc − dmin · macc)` (Q6_K, Q3_K: `facc += cvt(iacc −
/// macc) · (d · dx)`), rounded as the AVX2 rows-in-lanes kernels round it,
/// so that a token's result here is bit for bit its one-token result where
/// those kernels serve one token (Q4_K, Q6_K). Shared by [`kernel_body`] and
/// [`kernel2`], so both round alike.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
unsafe fn finish_sb<const NT: usize>(
    p: &Panel,
    acts: &Acts,
    tok: &[usize; NT],
    sb: usize,
    nsb: usize,
    gps: usize,
    npairs: usize,
    iacc: &[__m256i; NT],
    facc: &mut [__m256; NT],
) {
    let mut macc = [_mm256_setzero_si256(); NT];
    for pr in 0..gps / 2 {
        let mv = _mm256_loadu_si256(p.m.as_ptr().add((sb * gps / 2 + pr) * NR) as *const _);
        for t in 0..NT {
            let sp = *acts
                .pairs
                .get_unchecked(tok[t] * npairs + sb * gps / 2 + pr);
            macc[t] = _mm256_add_epi32(macc[t], _mm256_madd_epi16(mv, _mm256_set1_epi32(sp)));
        }
    }
    let dv = _mm256_loadu_ps(p.d.as_ptr().add(sb * NR));
    let mdv = _mm256_loadu_ps(p.dmin.as_ptr().add(sb * NR));
    for t in 0..NT {
        let dx = _mm256_set1_ps(*acts.dx.get_unchecked(tok[t] * nsb + sb));
        facc[t] = if p.offset {
            // `w = d·s·(q − o)`: `Σ s·(q − o)·qx` exact in i32, then
            // `acc + cvt(Σ) · (d · dx)` — the rounding order of the
            // rows-in-lanes Q6_K kernels (`lanes_q6_k::finish`).
            let isum = _mm256_sub_epi32(iacc[t], macc[t]);
            _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum), _mm256_mul_ps(dv, dx), facc[t])
        } else {
            // `acc + dx · (d · isum − dmin · imin)` rounded as the
            // rows-in-lanes Q4_K kernels round it (`lanes::finish`).
            let v = _mm256_mul_ps(dv, _mm256_cvtepi32_ps(iacc[t]));
            let v = _mm256_fnmadd_ps(mdv, _mm256_cvtepi32_ps(macc[t]), v);
            _mm256_fmadd_ps(v, dx, facc[t])
        };
    }
}

/// Tokens per call of [`kernel2`].
const NT2: usize = 4;

/// [`kernel`] on two panels at once (16 rows) for up to [`NT2`] tokens:
/// each broadcast of 4 activation bytes feeds two `vpmaddubsw` instead of
/// one. Per panel, row and token the same integers and the same float
/// operations in the same order as [`kernel`]: the same bits.
///
/// # Safety
/// AVX2 available; both panels packed from `cols` columns; `y` valid for
/// the stored elements.
#[target_feature(enable = "avx2,fma,f16c")]
#[allow(clippy::too_many_arguments)]
unsafe fn kernel2<const ACC: usize, const GC: usize>(
    p: [&Panel; 2],
    acts: &Acts,
    cols: usize,
    ts: &[usize],
    nr: [usize; 2],
    y: *mut f32,
    rows: usize,
    r0: [usize; 2],
) {
    let nsb = cols / 256;
    let gps = 64 / GC; // scale groups per super-block
    let npairs = cols / (4 * GC) / 2;
    let tok = tile_tokens::<NT2>(ts);
    let xp: [*const i8; NT2] = tok.map(|t| acts.qx.as_ptr().add(t * cols));
    let mut facc = [[_mm256_setzero_ps(); NT2]; 2];
    for sb in 0..nsb {
        let mut iacc = [[_mm256_setzero_si256(); NT2]; 2];
        let qsb = p.map(|p| p.q.as_ptr().add(sb * 256 * NR));
        let xb = |t: usize, g: usize| {
            _mm256_set1_epi32((xp[t].add(256 * sb + 4 * g) as *const i32).read_unaligned())
        };
        for g0 in (0..64).step_by(ACC) {
            let mut p16 = [[_mm256_setzero_si256(); NT2]; 2];
            for g in g0..g0 + ACC {
                let w0 = _mm256_loadu_si256(qsb[0].add(32 * g) as *const __m256i);
                let w1 = _mm256_loadu_si256(qsb[1].add(32 * g) as *const __m256i);
                for t in 0..NT2 {
                    let x = xb(t, g);
                    p16[0][t] = _mm256_add_epi16(p16[0][t], _mm256_maddubs_epi16(w0, x));
                    p16[1][t] = _mm256_add_epi16(p16[1][t], _mm256_maddubs_epi16(w1, x));
                }
            }
            for k in 0..2 {
                let sv =
                    _mm256_loadu_si256(p[k].s.as_ptr().add((sb * gps + g0 / GC) * NR) as *const _);
                for t in 0..NT2 {
                    iacc[k][t] = _mm256_add_epi32(iacc[k][t], _mm256_madd_epi16(p16[k][t], sv));
                }
            }
        }
        for k in 0..2 {
            finish_sb(
                p[k],
                acts,
                &tok,
                sb,
                nsb,
                gps,
                npairs,
                &iacc[k],
                &mut facc[k],
            );
        }
    }
    for k in 0..2 {
        store_tokens(&facc[k], ts, nr[k], y, rows, r0[k]);
    }
}

/// The microkernels a product runs: all give the same bits.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Micro {
    /// [`kernel`], one panel at a time.
    Plain,
    /// [`kernel2`], panels two at a time (an odd last one by [`kernel`]).
    Pairs,
    /// [`kernel_vnni`] (the CPU has AVX-VNNI).
    Vnni,
}

impl Micro {
    /// AVX-VNNI's where the CPU has it (`vnni`), else panels in pairs
    /// unless `COIL_KQ_PAIRS=0`. Two panels × 4 tokens against one × 4
    /// (`gemm_cpu -- Q4_K Q6_K 512 3584 1024`, one thread, AMD EPYC Zen 3):
    /// Q4_K 190 → 204–209 G integer ops/s, Q6_K 146–152 → 156–165 (× 3
    /// tokens: 196–199 / 159–163).
    fn of(vnni: bool) -> Micro {
        static PAIRS: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
        let pairs =
            *PAIRS.get_or_init(|| std::env::var("COIL_KQ_PAIRS").map_or(true, |v| v != "0"));
        match (vnni, pairs) {
            (true, _) => Micro::Vnni,
            (false, true) => Micro::Pairs,
            (false, false) => Micro::Plain,
        }
    }
}

/// `y = x · wᵀ` for `n_tokens` tokens (Q4_K, Q5_K, Q6_K, Q2_K or Q3_K weights; the
/// CPU has AVX2 + FMA + F16C).
pub(super) fn igemm(pool: &ThreadPool, w: &WeightRef, x: &[f32], y: &mut [f32], n_tokens: usize) {
    igemm_with(pool, w, x, y, n_tokens, Micro::of(crate::simd::avx_vnni()))
}

/// [`igemm`] with the microkernels `micro` (AVX-VNNI's only where the CPU
/// has it).
fn igemm_with(
    pool: &ThreadPool,
    w: &WeightRef,
    x: &[f32],
    y: &mut [f32],
    n_tokens: usize,
    micro: Micro,
) {
    igemm_many_with(pool, &[w], x, &mut [y], n_tokens, micro)
}

/// Values per activation sum of `ty` (a K-quant's scale group): matrices
/// with the same group can share one quantization.
pub(super) fn act_group(ty: GgmlType) -> usize {
    if sub16(ty) {
        16
    } else {
        32
    }
}

/// `ys[i] = x · ws[i]ᵀ` (K-quants of one [`act_group`], `x`'s width): the
/// activations quantized once, each product as [`igemm`] runs it.
pub(super) fn igemm_many(
    pool: &ThreadPool,
    ws: &[&WeightRef],
    x: &[f32],
    ys: &mut [&mut [f32]],
    n_tokens: usize,
    vnni: bool,
) {
    igemm_many_with(pool, ws, x, ys, n_tokens, Micro::of(vnni))
}

/// [`igemm_many`] with the microkernels `micro`.
fn igemm_many_with(
    pool: &ThreadPool,
    ws: &[&WeightRef],
    x: &[f32],
    ys: &mut [&mut [f32]],
    n_tokens: usize,
    micro: Micro,
) {
    let (cols, group) = (ws[0].cols, act_group(ws[0].ty));
    assert!(
        ws.len() == ys.len()
            && ws
                .iter()
                .all(|w| w.cols == cols && act_group(w.ty) == group),
        "igemm_many: matrices of different widths or groups"
    );
    let mut acts = ACTS.with(|a| std::mem::take(&mut *a.borrow_mut()));
    quantize_acts(pool, x, n_tokens, cols, group, &mut acts);
    for (w, y) in ws.iter().zip(ys.iter_mut()) {
        run(pool, w, &acts, y, n_tokens, micro);
    }
    ACTS.with(|a| *a.borrow_mut() = acts);
}

/// `y = x · wᵀ` from `x` quantized in `acts`.
fn run(
    pool: &ThreadPool,
    w: &WeightRef,
    acts: &Acts,
    y: &mut [f32],
    n_tokens: usize,
    micro: Micro,
) {
    let (rows, cols) = (w.rows, w.cols);
    let yp = SendPtr(y.as_mut_ptr());
    let all: Vec<usize> = (0..n_tokens).collect();
    // A work item is PG panels: each tile's activations, read from L2 or
    // L3 for the first panel, are in L1 for the others.
    over_panels(pool, w, PG * NR, &PANELS, |r0, nr, ps, packed| {
        let np = nr.div_ceil(NR);
        ps.resize_with(np.max(ps.len()), Panel::default);
        for (k, p) in ps.iter_mut().take(np).enumerate() {
            // SAFETY: AVX2 checked by the caller.
            unsafe { pack_panel(w, r0 + k * NR, p) };
        }
        packed();
        if micro == Micro::Pairs {
            run_pairs(w.ty, ps, np, acts, cols, &all, nr, yp.get(), rows, r0);
            return;
        }
        let vnni = micro == Micro::Vnni;
        for ts in all.chunks(NT) {
            for (k, p) in ps.iter().take(np).enumerate() {
                let (r0, nr) = (r0 + k * NR, NR.min(nr - k * NR));
                // SAFETY: AVX2 (and AVX-VNNI with `vnni`) checked by the
                // caller; rows r0..r0+nr of y belong to this panel only.
                unsafe { one_panel(w.ty, vnni, p, acts, cols, ts, nr, yp.get(), rows, r0) }
            }
        }
    });
}

/// One panel against the tokens `ts` (up to [`NT`]) by the kernel of `ty`,
/// AVX-VNNI's with `vnni`.
///
/// # Safety
/// AVX2 available (and AVX-VNNI with `vnni`); as [`kernel`].
#[allow(clippy::too_many_arguments)]
unsafe fn one_panel(
    ty: GgmlType,
    vnni: bool,
    p: &Panel,
    acts: &Acts,
    cols: usize,
    ts: &[usize],
    nr: usize,
    y: *mut f32,
    rows: usize,
    r0: usize,
) {
    match (ty, vnni) {
        (GgmlType::Q4_K, false) => kernel::<8, 8>(p, acts, cols, ts, nr, y, rows, r0),
        (GgmlType::Q5_K, false) => kernel::<4, 8>(p, acts, cols, ts, nr, y, rows, r0),
        (GgmlType::Q2_K | GgmlType::Q3_K, false) => {
            kernel::<4, 4>(p, acts, cols, ts, nr, y, rows, r0)
        }
        (_, false) => kernel::<2, 4>(p, acts, cols, ts, nr, y, rows, r0),
        (t, true) if sub16(t) => kernel_vnni::<2, 4>(p, acts, cols, ts, nr, y, rows, r0),
        (_, true) => kernel_vnni::<8, 8>(p, acts, cols, ts, nr, y, rows, r0),
    }
}

/// A work item's `np` packed panels (rows `r0..r0 + nr`) against every
/// token: panels in pairs through [`kernel2`], an odd last one through
/// [`kernel`], [`NT2`] tokens at a time.
#[allow(clippy::too_many_arguments)]
fn run_pairs(
    ty: GgmlType,
    ps: &[Panel],
    np: usize,
    acts: &Acts,
    cols: usize,
    all: &[usize],
    nr: usize,
    y: *mut f32,
    rows: usize,
    r0: usize,
) {
    let at = |k: usize| (r0 + k * NR, NR.min(nr - k * NR));
    for ts in all.chunks(NT2) {
        let mut k = 0;
        while k + 2 <= np {
            let ((ra, na), (rb, nb)) = (at(k), at(k + 1));
            let pair = [&ps[k], &ps[k + 1]];
            // SAFETY: AVX2 checked by igemm's caller; rows ra..ra+na and
            // rb..rb+nb of y belong to these panels only.
            unsafe {
                match ty {
                    GgmlType::Q4_K => {
                        kernel2::<8, 8>(pair, acts, cols, ts, [na, nb], y, rows, [ra, rb])
                    }
                    GgmlType::Q5_K => {
                        kernel2::<4, 8>(pair, acts, cols, ts, [na, nb], y, rows, [ra, rb])
                    }
                    GgmlType::Q2_K | GgmlType::Q3_K => {
                        kernel2::<4, 4>(pair, acts, cols, ts, [na, nb], y, rows, [ra, rb])
                    }
                    _ => kernel2::<2, 4>(pair, acts, cols, ts, [na, nb], y, rows, [ra, rb]),
                }
            }
            k += 2;
        }
        if k < np {
            let (ra, na) = at(k);
            // SAFETY: as above.
            unsafe { one_panel(ty, false, &ps[k], acts, cols, ts, na, y, rows, ra) }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testutil::{random_weights, Rng};

    /// The GEMM computes the decode dot products' integers (the same
    /// activation quantization, the same exact sums per group): each
    /// output within f32 rounding of the scalar specification's dot
    /// product on every K-quant — a wrong scale, min or value of one block
    /// would be far outside it (the matmul tests' tolerance, set by the
    /// activations' quantization, would not see one).
    #[test]
    fn gemm_is_the_dot_products_integers() {
        use crate::matmul::act::QuantAct;
        use crate::matmul::scalar::dequant::dequant_row;
        use crate::matmul::scalar::vecdot;
        if !std::arch::is_x86_feature_detected!("avx2")
            || !std::arch::is_x86_feature_detected!("fma")
            || !std::arch::is_x86_feature_detected!("f16c")
        {
            return;
        }
        let mut rng = Rng::new(31);
        let pool = ThreadPool::new(2);
        for ty in [
            GgmlType::Q4_K,
            GgmlType::Q5_K,
            GgmlType::Q6_K,
            GgmlType::Q2_K,
            GgmlType::Q3_K,
        ] {
            let dot = match ty {
                GgmlType::Q4_K => vecdot::dot_q4_k,
                GgmlType::Q5_K => vecdot::dot_q5_k,
                GgmlType::Q6_K => vecdot::dot_q6_k,
                GgmlType::Q2_K => vecdot::dot_q2_k,
                _ => vecdot::dot_q3_k,
            };
            for (rows, cols, n) in [(8, 256, 3), (37, 768, 13)] {
                let data = random_weights(&mut rng, ty, rows, cols);
                let w = WeightRef::new(ty, &data, rows, cols).unwrap();
                let x = rng.vec(n * cols);
                let mut y = vec![f32::NAN; n * rows];
                igemm_with(&pool, &w, &x, &mut y, n, Micro::of(false));
                let mut wr = vec![0f32; cols];
                for t in 0..n {
                    let xt = &x[t * cols..(t + 1) * cols];
                    let a = QuantAct::q8_k(xt, cols);
                    for r in 0..rows {
                        let want = dot(w.row(r), &a.qs, &a.d, &a.sums);
                        assert!(dequant_row(ty, w.row(r), &mut wr));
                        let mag: f32 = wr.iter().zip(xt).map(|(a, b)| (a * b).abs()).sum();
                        let got = y[t * rows + r];
                        assert!(
                            (got - want).abs() <= 1e-5 * mag,
                            "{ty} {rows}x{cols} t {t} r {r}: {got} vs {want} (mag {mag})"
                        );
                    }
                }
            }
        }
    }

    /// Panels in pairs give the one-panel kernel's floats bit for bit:
    /// every K-quant, an odd panel left over (37 and 40 rows: 5 panels, the
    /// last ragged or not), a single panel, token counts off the tile size.
    #[test]
    fn panel_pairs_are_the_one_panel_kernel_bit_for_bit() {
        if !std::arch::is_x86_feature_detected!("avx2")
            || !std::arch::is_x86_feature_detected!("fma")
            || !std::arch::is_x86_feature_detected!("f16c")
        {
            return;
        }
        let mut rng = Rng::new(29);
        let pool = ThreadPool::new(2);
        for ty in [
            GgmlType::Q4_K,
            GgmlType::Q5_K,
            GgmlType::Q6_K,
            GgmlType::Q2_K,
            GgmlType::Q3_K,
        ] {
            for (rows, cols, n) in [(8, 256, 3), (37, 768, 13), (40, 512, 9), (64, 512, 30)] {
                let data = random_weights(&mut rng, ty, rows, cols);
                let w = WeightRef::new(ty, &data, rows, cols).unwrap();
                let x = rng.vec(n * cols);
                let (mut a, mut b) = (vec![f32::NAN; n * rows], vec![f32::NAN; n * rows]);
                igemm_with(&pool, &w, &x, &mut a, n, Micro::Plain);
                igemm_with(&pool, &w, &x, &mut b, n, Micro::Pairs);
                for (i, (u, v)) in a.iter().zip(&b).enumerate() {
                    assert_eq!(
                        u.to_bits(),
                        v.to_bits(),
                        "{ty} {rows}x{cols} n {n}: y[{i}] {u} vs {v}"
                    );
                }
            }
        }
    }

    /// The AVX-VNNI kernel computes the same integers as the plain AVX2 one:
    /// the same floats, bit for bit (random weights: Q6_K's scales of both
    /// signs), ragged panels and token tiles.
    #[test]
    fn vnni_kernel_is_the_avx2_kernel_bit_for_bit() {
        if !std::arch::is_x86_feature_detected!("avx2")
            || !std::arch::is_x86_feature_detected!("fma")
            || !std::arch::is_x86_feature_detected!("f16c")
            || !std::arch::is_x86_feature_detected!("avxvnni")
        {
            return;
        }
        let mut rng = Rng::new(23);
        let pool = ThreadPool::new(2);
        for ty in [
            GgmlType::Q4_K,
            GgmlType::Q5_K,
            GgmlType::Q6_K,
            GgmlType::Q2_K,
            GgmlType::Q3_K,
        ] {
            for (rows, cols, n) in [(8, 256, 4), (37, 768, 13), (64, 512, 30)] {
                let data = random_weights(&mut rng, ty, rows, cols);
                let w = WeightRef::new(ty, &data, rows, cols).unwrap();
                let x = rng.vec(n * cols);
                let (mut a, mut b) = (vec![f32::NAN; n * rows], vec![f32::NAN; n * rows]);
                igemm_with(&pool, &w, &x, &mut a, n, Micro::Plain);
                igemm_with(&pool, &w, &x, &mut b, n, Micro::Vnni);
                for (i, (u, v)) in a.iter().zip(&b).enumerate() {
                    assert_eq!(
                        u.to_bits(),
                        v.to_bits(),
                        "{ty} {rows}x{cols} n {n}: y[{i}] {u} vs {v}"
                    );
                }
            }
        }
    }
}
