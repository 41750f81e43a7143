//! Integer GEMM for many tokens (prefill) with AVX-512 VNNI, for the
//! formats made of blocks with one scale (and optionally a min) per 32
//! values (Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, IQ4_NL, Q4_K, Q5_K, IQ4_XS; the
//! lattice, ternary and MXFP4 formats IQ2_XXS, IQ3_XXS, IQ3_S, IQ1_S,
//! TQ1_0, TQ2_0, MXFP4) or per 16 (Q6_K, Q3_K, IQ2_XS, IQ2_S, IQ1_M, and
//! Q2_K with a min per 16 too).
//!
//! A weight block decodes to `w = a·q − b` with `q` small integers (i8).
//! Activations are quantized per 32 values (`x = dx·qx`, as for the dot
//! kernels) and stored offset by 128 as u8, so `vpdpbusd` multiplies
//! `(qx + 128)·q` four at a time into 16 row lanes; the offset is removed with
//! the block sums of `q` (computed when packing):
//! `sum q·qx = dot(qx + 128, q) − 128·sum q`. Q4_K and Q5_K, whose `q` are
//! unsigned, swap the roles instead: their `q` are the unsigned operand and
//! the activations `qx` the signed one, no offset (the accumulators start
//! at zero, not from a copy of `−128·sum q`: Q4_K prefill +3–8% in the
//! kernel bench on an Intel Xeon). Per block and token:
//! `y += a·dx·(sum q·qx) − b·dx·(sum qx)`. For the K-quants (Q4_K, Q5_K,
//! Q6_K) the activations get one scale per 256 values instead (as
//! llama.cpp's Q8_K and coil's decode path), so `dx` is applied once per
//! super-block: fewer float operations per block and token (Q4_K/Q5_K
//! +3–10% here; Q6_K +7–11% in the kernel bench's prefill shapes).
//! Q4_K / Q5_K's min terms `Σ_j m_j·Σqx_j` (6-bit mins, block sums of at
//! most 32 · 127; Q2_K: 4-bit mins, sums per 16) are integer products too,
//! two groups per `vpdpwssd`,
//! which start each super-block's sums (`− dmin · …`, one multiply per row
//! lane and token): one FMA per block and token fewer on the multiply
//! ports the products use (AMD Zen 4, one thread, 4096 × 2048 × 256
//! tokens: 317–334 → 340–345 GFLOP/s; without any min term 351–377).
//!
//! Layout: a work item is two panels of 16 weight rows (a last odd panel
//! is paired with an empty one); a panel's blocks are packed
//! `[block][group of 4 columns][16 rows][4]` (64 bytes per `vpdpbusd`), with
//! `a`, `b` and `−128·sum q` per `[block][16 rows]`. The microkernel keeps
//! `NT` tokens × 32 rows in registers; each broadcast of 4 activation bytes
//! feeds both panels. Output rows of a token are contiguous in `y`, so
//! results are stored as vectors.

use crate::aligned::AlignedVec;
use crate::matmul::weight::WeightRef;
use crate::matmul::x86_avx2::decode_i8::decode_row;
use crate::pool::SendPtr;
use crate::pool::ThreadPool;
use coil_gguf::GgmlType;
use std::arch::x86_64::*;
use std::cell::RefCell;

/// Tokens per microkernel call.
const NT: usize = 4;

/// Whether `ty` has an integer GEMM.
/// (The dispatch table, `plan::FORMATS`, says when it runs; its test
/// checks the two agree.)
#[cfg(test)]
pub fn supported(ty: GgmlType) -> bool {
    use GgmlType::*;
    matches!(
        ty,
        Q8_0 | Q4_0 | Q4_1 | Q5_0 | Q5_1 | IQ4_NL | Q4_K | Q5_K | IQ4_XS | Q6_K | Q3_K | Q2_K
    ) || crate::matmul::x86_avx2::decode_iq::supported(ty)
}

/// Values per scale: 16 for Q6_K, Q3_K, Q2_K, IQ2_XS, IQ2_S and IQ1_M, 32
/// for the others.
fn sub16(ty: GgmlType) -> bool {
    crate::matmul::x86_avx2::decode_i8::group16(ty)
}

/// A min per scale group with one activation scale per 256 (Q4_K, Q5_K;
/// Q2_K per 16 values).
fn has_min(ty: GgmlType) -> bool {
    matches!(ty, GgmlType::Q4_K | GgmlType::Q5_K | GgmlType::Q2_K)
}

/// A min per block of 32 with one activation scale per 32 (Q4_1, Q5_1).
fn has_min32(ty: GgmlType) -> bool {
    matches!(ty, GgmlType::Q4_1 | GgmlType::Q5_1)
}

/// Activations of all tokens: `qx + 128` as u8 `[n][cols]` (`qx` as i8 for
/// Q4_K / Q5_K), one scale `dx`
/// per block of 32 or 256 values, and `sum qx` per 32 (as f32; the min
/// term of Q4_K/Q5_K). Reused between calls (no per-call page faults).
#[derive(Default)]
struct Acts {
    xu: Vec<u8>,
    dx: Vec<f32>,
    sums: Vec<f32>,
    /// `sum qx` per 32 as i16 (`|sum| ≤ 32 · 127`; per 16 in the
    /// [`ActMode::sums16`] mode): the min terms take them two groups at a
    /// time (`vpdpwssd`)
    isums: Vec<i16>,
}

thread_local! {
    static ACTS: RefCell<Acts> = RefCell::new(Acts::default());
}

/// Quantizes the activations of `n` tokens with one scale per `block`
/// values: 256 for the K-quants (their kernel applies the scale once per
/// super-block, as llama.cpp's Q8_K), else 32.
fn quantize_acts(pool: &ThreadPool, x: &[f32], n: usize, cols: usize, mode: ActMode, a: &mut Acts) {
    let (block, biased, sums16) = (mode.block, mode.biased, mode.sums16);
    let nb = cols / 32;
    let ni = if sums16 { 2 * nb } else { nb };
    if a.xu.len() < n * cols {
        a.xu.resize(n * cols, 0);
    }
    if a.dx.len() < n * nb {
        a.dx.resize(n * nb, 0.0);
        a.sums.resize(n * nb, 0.0);
    }
    if a.isums.len() < n * ni {
        a.isums.resize(n * ni, 0);
    }
    let (pu, pd, ps, pi) = (
        SendPtr(a.xu.as_mut_ptr()),
        SendPtr(a.dx.as_mut_ptr()),
        SendPtr(a.sums.as_mut_ptr()),
        SendPtr(a.isums.as_mut_ptr()),
    );
    pool.parallel_for(n, 16, |tr, _| {
        for t in tr {
            // SAFETY: AVX-512 checked by igemm's caller; token t owns its
            // rows of the buffers.
            unsafe {
                quantize_row(
                    &x[t * cols..(t + 1) * cols],
                    block,
                    biased,
                    sums16,
                    pu.get().add(t * cols),
                    pd.get().add(t * (cols / block)),
                    ps.get().add(t * nb),
                    pi.get().add(t * ni),
                )
            };
        }
    });
}

/// One token's activations: `xu = qx + 128`, `dx = amax / 127` per `block`
/// values (a multiple of 32), `sums = sum qx` per 32 (`qx = round(x / dx)`,
/// ties away from zero), `isums` the same as i16 (`sums16`: per 16).
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq")]
#[allow(clippy::too_many_arguments)]
unsafe fn quantize_row(
    x: &[f32],
    block: usize,
    biased: bool,
    sums16: bool,
    xu: *mut u8,
    dx: *mut f32,
    sums: *mut f32,
    isums: *mut i16,
) {
    let absmask = _mm512_set1_epi32(0x7FFF_FFFF);
    let off = _mm512_set1_epi32(if biased { 128 } else { 0 });
    let lim = _mm512_set1_ps(127.0);
    let nlim = _mm512_set1_ps(-127.0);
    let (half, one) = (_mm512_set1_ps(0.5), _mm512_set1_ps(1.0));
    let signmask = _mm512_set1_ps(-0.0);
    let flip = _mm_set1_epi8(-128);
    for (bi, xs) in x.chunks_exact(block).enumerate() {
        let mut m = _mm512_setzero_ps();
        for v in xs.chunks_exact(16) {
            let a = _mm512_and_si512(_mm512_castps_si512(_mm512_loadu_ps(v.as_ptr())), absmask);
            m = _mm512_max_ps(m, _mm512_castsi512_ps(a));
        }
        let amax = _mm512_reduce_max_ps(m);
        let (d, id) = if amax > 0.0 && amax.is_finite() {
            (amax / 127.0, 127.0 / amax)
        } else {
            // Zeros, or a NaN/inf block: the scale carries it to the output.
            (if amax.is_finite() { 0.0 } else { amax }, 0.0)
        };
        let idv = _mm512_set1_ps(id);
        // ties away from zero, as the dot kernels' activations
        // (`act::quantize_blocks_mv`; the rows-in-lanes tiles keep their
        // bits in this GEMM): trunc, plus ±1 where |frac| ≥ 0.5 (p −
        // trunc(p) is exact); clamped; NaN to 0
        let q = |v: __m512| {
            let p = _mm512_mul_ps(v, idv);
            let t = _mm512_roundscale_ps::<{ _MM_FROUND_TO_ZERO | _MM_FROUND_NO_EXC }>(p);
            let up = _mm512_cmp_ps_mask::<_CMP_GE_OQ>(_mm512_abs_ps(_mm512_sub_ps(p, t)), half);
            let step = _mm512_or_ps(one, _mm512_and_ps(p, signmask));
            let r = _mm512_mask_add_ps(t, up, t, step);
            let ord = _mm512_cmp_ps_mask::<_CMP_ORD_Q>(p, p);
            _mm512_maskz_cvtps_epi32(ord, _mm512_max_ps(_mm512_min_ps(r, lim), nlim))
        };
        for (j, xb) in xs.chunks_exact(32).enumerate() {
            let q0 = q(_mm512_loadu_ps(xb.as_ptr()));
            let q1 = q(_mm512_loadu_ps(xb.as_ptr().add(16)));
            let at = bi * block + 32 * j;
            let o = xu.add(at);
            let (b0, b1) = (
                _mm512_cvtepi32_epi8(_mm512_add_epi32(q0, off)),
                _mm512_cvtepi32_epi8(_mm512_add_epi32(q1, off)),
            );
            _mm_storeu_si128(o as *mut __m128i, b0);
            _mm_storeu_si128(o.add(16) as *mut __m128i, b1);
            // Σ qx per 16 from the bytes: q + 128 as unsigned bytes (the
            // stored ones when biased), summed in pairs of 8 by `psadbw`
            // (exact, and cheaper than reducing the 32-bit lanes).
            let (u0, u1) = if biased {
                (b0, b1)
            } else {
                (_mm_xor_si128(b0, flip), _mm_xor_si128(b1, flip))
            };
            let (a0, a1) = (
                _mm_sad_epu8(u0, _mm_setzero_si128()),
                _mm_sad_epu8(u1, _mm_setzero_si128()),
            );
            if sums16 {
                let t = _mm_add_epi64(_mm_unpacklo_epi64(a0, a1), _mm_unpackhi_epi64(a0, a1));
                let s0 = _mm_cvtsi128_si32(t) - 16 * 128;
                let s1 = _mm_extract_epi32::<2>(t) - 16 * 128;
                *sums.add(at / 32) = (s0 + s1) as f32;
                *isums.add(at / 16) = s0 as i16;
                *isums.add(at / 16 + 1) = s1 as i16;
            } else {
                let a = _mm_add_epi64(a0, a1);
                let sum = _mm_cvtsi128_si32(_mm_add_epi64(a, _mm_unpackhi_epi64(a, a))) - 32 * 128;
                *sums.add(at / 32) = sum as f32;
                *isums.add(at / 32) = sum as i16;
            }
        }
        *dx.add(bi) = d;
    }
}

/// One packed panel of 16 rows.
#[derive(Default)]
struct Panel {
    // all on cache lines: the kernel reads them with whole-line loads
    q: AlignedVec<u8>,     // [block][8][16][4]
    a: AlignedVec<f32>,    // [block][16]
    b: AlignedVec<f32>,    // [block][16]
    ws: AlignedVec<i32>,   // [block][16]: −128 · sum q (the accumulators' start)
    mi: AlignedVec<i16>,   // Q4_K / Q5_K: [super-block][4][16][2] the mins m_j, blocks 2p, 2p + 1
    dmin: AlignedVec<f32>, // Q4_K / Q5_K: [super-block][16]
    dq: Vec<i8>,           // [16][cols + 64] decoded rows
}

thread_local! {
    static PANEL: RefCell<Panel> = RefCell::new(Panel::default());
    static PANEL2: RefCell<Panel> = RefCell::new(Panel::default());
}

#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,f16c")]
unsafe fn pack_panel(w: &WeightRef, r0: usize, p: &mut Panel) {
    let cols = w.cols;
    let nb = cols / 32;
    let half = sub16(w.ty);
    let ns = if half { 2 * nb } else { nb }; // scale groups per row
    p.q.resize(nb * 512);
    p.a.resize(ns * 16);
    p.b.resize(ns * 16);
    p.ws.resize(ns * 16);
    // Row stride of the decoded rows, padded so the 16 rows of a gather do
    // not all map to the same L1 set (a power-of-two stride would).
    let st = cols + 64;
    p.dq.resize(16 * st, 0);
    let nr = 16.min(w.rows.saturating_sub(r0)); // 0: an empty panel (zeros)
    if w.layout == crate::matmul::weight::Layout::Lanes16 && nr > 0 {
        return pack_lanes(w, r0, p);
    }
    for r in 0..16 {
        if r < nr {
            // the scales go straight to their [group][16 rows] lanes
            decode_row(
                w.ty,
                w.row(r0 + r),
                &mut p.dq[r * st..r * st + cols],
                p.a.as_mut_ptr().add(r),
                p.b.as_mut_ptr().add(r),
                16,
            );
        } else {
            p.dq[r * st..r * st + cols].fill(0);
            for g in 0..ns {
                p.a[g * 16 + r] = 0.0;
                p.b[g * 16 + r] = 0.0;
            }
        }
    }
    // Transpose 4-byte groups: [r][kb][g] -> [kb][g][r]: per block a 16 x 8
    // dword transpose in registers (rows r and r+8 share a register).
    let ones = _mm512_set1_epi8(1);
    let lo_idx = _mm512_setr_epi64(0, 1, 8, 9, 4, 5, 12, 13);
    let hi_idx = _mm512_setr_epi64(2, 3, 10, 11, 6, 7, 14, 15);
    let dq = p.dq.as_ptr();
    let qo = p.q.as_mut_ptr();
    for kb in 0..nb {
        let z: [__m512i; 8] = std::array::from_fn(|r| {
            let a = _mm256_loadu_si256(dq.add(r * st + 32 * kb) as *const __m256i);
            let b = _mm256_loadu_si256(dq.add((r + 8) * st + 32 * kb) as *const __m256i);
            _mm512_inserti64x4(_mm512_castsi256_si512(a), b, 1)
        });
        let t: [__m512i; 8] = std::array::from_fn(|i| {
            let (a, b) = (z[2 * (i / 2)], z[2 * (i / 2) + 1]);
            if i % 2 == 0 {
                _mm512_unpacklo_epi32(a, b)
            } else {
                _mm512_unpackhi_epi32(a, b)
            }
        });
        // u[4h + d]: dword d (and d + 4) of rows 4h..4h+3 (and +8) per lane.
        let u: [__m512i; 8] = std::array::from_fn(|i| {
            let (h, d) = (i / 4, i % 4);
            let (a, b) = (t[4 * h + d / 2], t[4 * h + 2 + d / 2]);
            if d % 2 == 0 {
                _mm512_unpacklo_epi64(a, b)
            } else {
                _mm512_unpackhi_epi64(a, b)
            }
        });
        let mut ws = [_mm512_setzero_si512(); 2];
        for g in 0..8 {
            let (d, hi) = (g % 4, g >= 4);
            let v = _mm512_permutex2var_epi64(u[d], if hi { hi_idx } else { lo_idx }, u[4 + d]);
            _mm512_storeu_si512(qo.add(kb * 512 + 64 * g) as *mut _, v);
            let h = if half { g / 4 } else { 0 };
            ws[h] = _mm512_dpbusd_epi32(ws[h], ones, v);
        }
        for h in 0..if half { 2 } else { 1 } {
            let sg = if half { 2 * kb + h } else { kb };
            _mm512_storeu_si512(
                p.ws.as_mut_ptr().add(sg * 16) as *mut _,
                _mm512_sub_epi32(_mm512_setzero_si512(), _mm512_slli_epi32(ws[h], 7)),
            );
        }
    }
}

/// [`pack_panel`] from a repacked Q4_K, Q5_K, Q6_K or Q8_0 matrix (16 rows from
/// `r0`, a multiple of 16): its blocks come out of the layout with the
/// rows in the lanes already.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,f16c")]
unsafe fn pack_lanes(w: &WeightRef, r0: usize, p: &mut Panel) {
    let group = w.data.as_ptr().add(r0 * w.row_bytes());
    let ones = _mm512_set1_epi8(1);
    if w.ty == GgmlType::Q8_0 {
        // the quants as i8 again, `d` per block, no min
        for kb in 0..w.cols / 32 {
            let (q, a) = crate::matmul::x86_avx512::lanes_q8_0::packed_block(group, kb);
            let mut ws = _mm512_setzero_si512();
            for (g, v) in q.iter().enumerate() {
                _mm512_storeu_si512(p.q.as_mut_ptr().add(kb * 512 + 64 * g) as *mut _, *v);
                ws = _mm512_dpbusd_epi32(ws, ones, *v);
            }
            _mm512_storeu_ps(p.a.as_mut_ptr().add(kb * 16), a);
            _mm512_storeu_ps(p.b.as_mut_ptr().add(kb * 16), _mm512_setzero_ps());
            _mm512_storeu_si512(
                p.ws.as_mut_ptr().add(kb * 16) as *mut _,
                _mm512_sub_epi32(_mm512_setzero_si512(), _mm512_slli_epi32(ws, 7)),
            );
        }
        return;
    }
    if w.ty == GgmlType::Q6_K {
        // Q6_K's q − 32 as i8, a scale per 16 values and no min
        let off = _mm512_set1_epi8(32);
        for i in 0..w.cols / 256 {
            let (q, a) = crate::matmul::x86_avx512::lanes_q6_k::packed_block(group, i);
            for (s, (qs, a)) in q.iter().zip(a).enumerate() {
                // sub-block s: columns 16s.., the half s % 2 of block 32 s / 2
                let (kb, h) = (8 * i + s / 2, s % 2);
                // Σ q per row lane: the 4 vectors' bytes added first (4 ·
                // [−32, 31] fits i8), one `vpdpbusd` for the 4
                let mut bytes = _mm512_setzero_si512();
                for (v, q) in qs.iter().enumerate() {
                    let q = _mm512_sub_epi8(*q, off);
                    _mm512_storeu_si512(
                        p.q.as_mut_ptr().add(kb * 512 + 64 * (4 * h + v)) as *mut _,
                        q,
                    );
                    bytes = _mm512_add_epi8(bytes, q);
                }
                let ws = _mm512_dpbusd_epi32(_mm512_setzero_si512(), ones, bytes);
                let sg = 2 * kb + h;
                _mm512_storeu_ps(p.a.as_mut_ptr().add(sg * 16), a);
                _mm512_storeu_ps(p.b.as_mut_ptr().add(sg * 16), _mm512_setzero_ps());
                _mm512_storeu_si512(
                    p.ws.as_mut_ptr().add(sg * 16) as *mut _,
                    _mm512_sub_epi32(_mm512_setzero_si512(), _mm512_slli_epi32(ws, 7)),
                );
            }
        }
        return;
    }
    // Q4_K, Q5_K: the kernel multiplies their unsigned values by signed
    // activations, no offset to remove (`ws` unused)
    for i in 0..w.cols / 256 {
        let (q, a, b) = match w.ty {
            GgmlType::Q5_K => crate::matmul::x86_avx512::lanes::packed_block::<true>(group, i),
            _ => crate::matmul::x86_avx512::lanes::packed_block::<false>(group, i),
        };
        for j in 0..8 {
            let kb = 8 * i + j;
            for (g, v) in q[j].iter().enumerate() {
                _mm512_storeu_si512(p.q.as_mut_ptr().add(kb * 512 + 64 * g) as *mut _, *v);
            }
            _mm512_storeu_ps(p.a.as_mut_ptr().add(kb * 16), a[j]);
            _mm512_storeu_ps(p.b.as_mut_ptr().add(kb * 16), b[j]);
        }
    }
}

/// Q4_K / Q5_K / Q2_K: the panel's mins as integers for the kernel's min
/// terms, from the `b = dmin·m_g` [`pack_panel`] left (an f16 times a 6-bit
/// integer: exact in f32, so `b / dmin` is `m_g` exactly) and each row's
/// `dmin` (bytes 2–3 of its blocks, Q2_K's 82–83; in the rows-in-lanes
/// layout, the high halves of a block's first 16 dwords), two consecutive
/// scale groups per i32 lane (8 groups of 32 a super-block, Q2_K 16 of
/// 16). A row with a zero or non-finite `dmin` gets `m = 0` (its min terms
/// are 0 or carried by `dmin`).
#[target_feature(enable = "avx512f,avx512bw,avx512vl,f16c")]
unsafe fn pack_mins(w: &WeightRef, r0: usize, p: &mut Panel) {
    let nsb = w.cols / 256;
    let gps = if sub16(w.ty) { 16 } else { 8 };
    let dmin_at = if w.ty == GgmlType::Q2_K { 82 } else { 2 };
    p.mi.resize(nsb * gps / 2 * 32);
    p.dmin.resize(nsb * 16);
    let nr = 16.min(w.rows.saturating_sub(r0));
    for sb in 0..nsb {
        let dm = if nr == 0 {
            _mm512_setzero_ps()
        } else if w.layout == crate::matmul::weight::Layout::Lanes16 {
            let pb = crate::matmul::x86_avx512::lanes::packed_block_bytes(w.ty == GgmlType::Q5_K);
            let h0 =
                _mm512_loadu_si512(w.data.as_ptr().add(r0 * w.row_bytes() + pb * sb) as *const _);
            _mm512_cvtph_ps(_mm512_cvtepi32_epi16(_mm512_srli_epi32::<16>(h0)))
        } else {
            let bs = w.ty.type_size();
            let mut v = [0f32; 16];
            for (r, v) in v.iter_mut().enumerate().take(nr) {
                *v = crate::matmul::scalar::dequant::rd_f16(w.row(r0 + r), sb * bs + dmin_at);
            }
            _mm512_loadu_ps(v.as_ptr())
        };
        _mm512_storeu_ps(p.dmin.as_mut_ptr().add(sb * 16), dm);
        let ok = _mm512_cmp_ps_mask::<_CMP_NEQ_OQ>(dm, _mm512_setzero_ps())
            & _mm512_cmp_ps_mask::<_CMP_LT_OQ>(_mm512_abs_ps(dm), _mm512_set1_ps(f32::INFINITY));
        let m = |g: usize| {
            let b = _mm512_loadu_ps(p.b.as_ptr().add(g * 16));
            _mm512_maskz_cvtps_epi32(ok, _mm512_maskz_div_ps(ok, b, dm))
        };
        for pr in 0..gps / 2 {
            let g = gps * sb + 2 * pr;
            let v = _mm512_or_si512(
                _mm512_and_si512(m(g), _mm512_set1_epi32(0xFFFF)),
                _mm512_slli_epi32::<16>(m(g + 1)),
            );
            _mm512_storeu_si512(p.mi.as_mut_ptr().add((gps / 2 * sb + pr) * 32) as *mut _, v);
        }
    }
}

/// `y[t, r0..r0+32]` for tokens `ts` (up to `NT`; unused slots repeat the
/// last token and are not stored), two panels at once: each activation
/// broadcast feeds two `vpdpbusd` (loads per product 6/8 against 9/8 with
/// one panel of 8 tokens). `SB`: one activation scale per 256 values,
/// applied once per super-block; `MIN`: Q4_K/Q5_K/Q2_K (`a·Σq·qx` per
/// group, `− dmin·Σ m·Σqx` per super-block from [`pack_mins`], with `SB`);
/// `HALF`: a weight scale per 16 values (Q6_K, Q3_K, Q2_K with `SB`;
/// IQ2_XS, IQ2_S, IQ1_M without); without `SB` one activation scale per 32
/// (`MIN32`: Q4_1/Q5_1, `− b·dx·Σqx` per block).
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,fma")]
#[allow(clippy::too_many_arguments)]
unsafe fn kernel<const MIN: bool, const HALF: bool, const MIN32: bool, const SB: bool>(
    p: [&Panel; 2],
    acts: &Acts,
    cols: usize,
    ts: &[usize],
    nr: [usize; 2],
    y: *mut f32,
    rows: usize,
    r0: usize,
) {
    let nb = cols / 32;
    let nsb = cols / 256;
    let mut tok = [0usize; NT];
    for (i, t) in tok.iter_mut().enumerate() {
        *t = ts[i.min(ts.len() - 1)];
    }
    let xp: [*const u8; NT] = tok.map(|t| acts.xu.as_ptr().add(t * cols));
    let mut facc = [[_mm512_setzero_ps(); NT]; 2];
    // scale groups per block, 4-column groups per scale
    let (nh, gph) = if HALF { (2, 4) } else { (1, 8) };
    // MIN: token `t`'s `Σ qx` per scale group, read two groups at a time
    let sp: [*const i16; NT] = tok.map(|t| acts.isums.as_ptr().add(t * nb * nh));
    let mut fsb = [[_mm512_setzero_ps(); NT]; 2];
    for kb in 0..nb {
        if MIN && kb % 8 == 0 {
            // the super-block's min terms start its sums: `− dmin · Σ_j
            // m_j·Σqx_j` over its 8 blocks, the products in integers (two
            // blocks per `vpdpwssd`), one float multiply per row lane and
            // token (in place of one FMA per block)
            let sb = kb / 8;
            let mut macc = [[_mm512_setzero_si512(); NT]; 2];
            // pairs of scale groups: 4 of 32 values, Q2_K (HALF) 8 of 16
            for pr in 0..4 * nh {
                let at = (4 * nh * sb + pr) * 32;
                let m0 = _mm512_loadu_si512(p[0].mi.as_ptr().add(at) as *const _);
                let m1 = _mm512_loadu_si512(p[1].mi.as_ptr().add(at) as *const _);
                for t in 0..NT {
                    let xs = _mm512_set1_epi32(
                        (sp[t].add(nh * kb + 2 * pr) as *const i32).read_unaligned(),
                    );
                    macc[0][t] = _mm512_dpwssd_epi32(macc[0][t], m0, xs);
                    macc[1][t] = _mm512_dpwssd_epi32(macc[1][t], m1, xs);
                }
            }
            for k in 0..2 {
                let ndm = _mm512_sub_ps(
                    _mm512_setzero_ps(),
                    _mm512_loadu_ps(p[k].dmin.as_ptr().add(sb * 16)),
                );
                for t in 0..NT {
                    fsb[k][t] = _mm512_mul_ps(_mm512_cvtepi32_ps(macc[k][t]), ndm);
                }
            }
        }
        let q = [p[0].q.as_ptr().add(kb * 512), p[1].q.as_ptr().add(kb * 512)];
        for h in 0..nh {
            let sg = kb * nh + h;
            let mut iacc = [[_mm512_setzero_si512(); NT]; 2];
            if !MIN {
                for (k, ia) in iacc.iter_mut().enumerate() {
                    *ia = [_mm512_loadu_si512(p[k].ws.as_ptr().add(sg * 16) as *const _); NT];
                }
            }
            for g in h * gph..(h + 1) * gph {
                let w0 = _mm512_loadu_si512(q[0].add(64 * g) as *const _);
                let w1 = _mm512_loadu_si512(q[1].add(64 * g) as *const _);
                for t in 0..NT {
                    let xb = _mm512_set1_epi32(
                        (xp[t].add(32 * kb + 4 * g) as *const i32).read_unaligned(),
                    );
                    if MIN {
                        // unsigned weights times signed activations
                        iacc[0][t] = _mm512_dpbusd_epi32(iacc[0][t], w0, xb);
                        iacc[1][t] = _mm512_dpbusd_epi32(iacc[1][t], w1, xb);
                    } else {
                        iacc[0][t] = _mm512_dpbusd_epi32(iacc[0][t], xb, w0);
                        iacc[1][t] = _mm512_dpbusd_epi32(iacc[1][t], xb, w1);
                    }
                }
            }
            for k in 0..2 {
                let av = _mm512_loadu_ps(p[k].a.as_ptr().add(sg * 16));
                if SB {
                    // (MIN: the min terms went in above)
                    // one activation scale per super-block: applied below
                    for t in 0..NT {
                        fsb[k][t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(iacc[k][t]), av, fsb[k][t]);
                    }
                } else {
                    let bv = if MIN32 {
                        _mm512_loadu_ps(p[k].b.as_ptr().add(sg * 16))
                    } else {
                        _mm512_setzero_ps()
                    };
                    for t in 0..NT {
                        let dx = *acts.dx.get_unchecked(tok[t] * nb + kb);
                        facc[k][t] = _mm512_fmadd_ps(
                            _mm512_cvtepi32_ps(iacc[k][t]),
                            _mm512_mul_ps(av, _mm512_set1_ps(dx)),
                            facc[k][t],
                        );
                        if MIN32 {
                            let s = *acts.sums.get_unchecked(tok[t] * nb + kb);
                            facc[k][t] = _mm512_fnmadd_ps(bv, _mm512_set1_ps(dx * s), facc[k][t]);
                        }
                    }
                }
            }
        }
        if (MIN || SB) && kb % 8 == 7 {
            let sb = kb / 8;
            for t in 0..NT {
                let dx = _mm512_set1_ps(*acts.dx.get_unchecked(tok[t] * nsb + sb));
                for k in 0..2 {
                    facc[k][t] = _mm512_fmadd_ps(fsb[k][t], dx, facc[k][t]);
                    fsb[k][t] = _mm512_setzero_ps();
                }
            }
        }
    }
    store_pair(&facc, ts, nr, y, rows, r0);
}

/// Stores `acc[k][i]` (rows `r0 + 16k ..`, the first `nr[k]` of them, of
/// token `ts[i]`) into `y` (`[tokens][rows]`): the two-panel microkernels'
/// results.
///
/// # Safety
/// AVX-512 F available; `y` holds rows `r0..r0 + nr[0] + nr[1]` of every
/// token of `ts`.
#[inline(always)]
pub(super) unsafe fn store_pair<const N: usize>(
    acc: &[[__m512; N]; 2],
    ts: &[usize],
    nr: [usize; 2],
    y: *mut f32,
    rows: usize,
    r0: usize,
) {
    for k in 0..2 {
        let mask: u16 = if nr[k] >= 16 {
            0xFFFF
        } else {
            (1u16 << nr[k]) - 1
        };
        for (i, &t) in ts.iter().enumerate() {
            _mm512_mask_storeu_ps(y.add(t * rows + r0 + 16 * k), mask, acc[k][i]);
        }
    }
}

/// `y = x · wᵀ` for `n_tokens` tokens. The caller checks [`supported`] and
/// that the CPU has the AVX-512 level.
pub fn igemm(pool: &ThreadPool, w: &WeightRef, x: &[f32], y: &mut [f32], n_tokens: usize) {
    igemm_many(pool, &[w], x, &mut [y], n_tokens);
}

/// How a format's activations are quantized; matrices with the same mode
/// can share one quantization.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ActMode {
    /// Values per activation scale: 256 for the K-quants, else 32.
    pub block: usize,
    /// Stored as `qx + 128` (the weights are the signed operand); the
    /// formats with a min (unsigned weights) keep `qx` signed.
    pub biased: bool,
    /// The integer sums per 16 values instead of 32 (Q2_K's mins).
    pub sums16: bool,
}

/// The [`ActMode`] of `ty`'s products.
pub fn act_mode(ty: GgmlType) -> ActMode {
    let min = has_min(ty);
    // Q4_K, Q5_K, Q6_K, Q3_K, Q2_K: one activation scale per super-block;
    // with a min: the weights are the unsigned operand, the activations
    // unbiased. The lattice formats with scales per 16 (IQ2_XS, IQ2_S,
    // IQ1_M) keep one per 32 (finer; they have no min).
    let sb = min || matches!(ty, GgmlType::Q6_K | GgmlType::Q3_K);
    ActMode {
        block: if sb { 256 } else { 32 },
        biased: !min,
        sums16: min && sub16(ty),
    }
}

/// `ys[i] = x · ws[i]ᵀ` for every matrix of `ws` (each [`supported`], all
/// with `x`'s column count and the same [`act_mode`]): the activations
/// quantized once for all of them, then each product as [`igemm`] runs it,
/// so each result is bit for bit that of its own [`igemm`] call.
pub fn igemm_many(
    pool: &ThreadPool,
    ws: &[&WeightRef],
    x: &[f32],
    ys: &mut [&mut [f32]],
    n_tokens: usize,
) {
    assert!(!ws.is_empty() && ws.len() == ys.len());
    let cols = ws[0].cols;
    let mode = act_mode(ws[0].ty);
    assert!(
        ws.iter().all(|w| w.cols == cols && act_mode(w.ty) == mode),
        "igemm_many: matrices of different widths or activation modes"
    );
    let mut acts = ACTS.with(|a| std::mem::take(&mut *a.borrow_mut()));
    quantize_acts(pool, x, n_tokens, cols, mode, &mut acts);
    for (w, y) in ws.iter().zip(ys.iter_mut()) {
        run(pool, w, &acts, y, n_tokens);
    }
    ACTS.with(|a| *a.borrow_mut() = acts);
}

/// `y = x · wᵀ` from `x` quantized in `acts` (in `w`'s [`act_mode`]).
fn run(pool: &ThreadPool, w: &WeightRef, acts: &Acts, y: &mut [f32], n_tokens: usize) {
    let (rows, cols) = (w.rows, w.cols);
    let min = has_min(w.ty);
    let half = sub16(w.ty);
    let panels = rows.div_ceil(16);
    let yp = SendPtr(y.as_mut_ptr());
    let min32 = has_min32(w.ty);
    let sb = act_mode(w.ty).block == 256;
    // Work items: pairs of panels; a last odd panel pairs with an empty one.
    let items = panels.div_ceil(2);
    pool.parallel_for(items, 1, |ir, _| {
        PANEL.with(|pa| {
            PANEL2.with(|pb| {
                let (mut pa, mut pb) = (pa.borrow_mut(), pb.borrow_mut());
                let all: Vec<usize> = (0..n_tokens).collect();
                let rb = w.row_bytes();
                for it in ir {
                    let r0 = 32 * it;
                    // SAFETY: AVX-512 checked by the caller.
                    unsafe {
                        pack_panel(w, r0, &mut pa);
                        pack_panel(w, r0 + 16, &mut pb);
                        if min {
                            pack_mins(w, r0, &mut pa);
                            pack_mins(w, r0 + 16, &mut pb);
                        }
                    }
                    // The next item's rows load while this one is multiplied
                    // (its decode otherwise waits on memory).
                    let next = r0 + 32;
                    if next < rows {
                        let end = (next + 32).min(rows);
                        crate::matmul::gemm::prefetch(&w.data[next * rb..end * rb]);
                    }
                    let nr = [16.min(rows - r0), 16.min(rows.saturating_sub(r0 + 16))];
                    for ts in all.chunks(NT) {
                        // SAFETY: AVX-512 checked by the caller; rows
                        // r0..r0+32 of y belong to this item only.
                        unsafe {
                            let pp = [&*pa, &*pb];
                            let y = yp.get();
                            if min && half {
                                kernel::<true, true, false, true>(
                                    pp, acts, cols, ts, nr, y, rows, r0,
                                );
                            } else if min {
                                kernel::<true, false, false, true>(
                                    pp, acts, cols, ts, nr, y, rows, r0,
                                );
                            } else if half && sb {
                                kernel::<false, true, false, true>(
                                    pp, acts, cols, ts, nr, y, rows, r0,
                                );
                            } else if half {
                                kernel::<false, true, false, false>(
                                    pp, acts, cols, ts, nr, y, rows, r0,
                                );
                            } else if min32 {
                                kernel::<false, false, true, false>(
                                    pp, acts, cols, ts, nr, y, rows, r0,
                                );
                            } else {
                                kernel::<false, false, false, false>(
                                    pp, acts, cols, ts, nr, y, rows, r0,
                                );
                            }
                        }
                    }
                }
            })
        })
    });
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::matmul::scalar::dequant::dequant_row;
    use crate::simd::{detected_level, SimdLevel};
    use crate::testutil::{random_weights, Rng};

    /// The integer GEMM is the exact product of the decoded weights with the
    /// activations quantized as it quantizes them (one scale per 256 values
    /// for the K-quants, per 32 for the others; `round(x · 127 / amax)`,
    /// ties away from zero): per row and token, within f32 rounding of the
    /// products' magnitude — every format, the file's layout and the
    /// repacked one, ragged panels (an odd last one), ragged token tiles, one
    /// and two threads. (The f32-activation tolerance of the matmul tests
    /// would not see a wrong min or scale of one block.)
    #[test]
    fn igemm_is_the_exact_product_of_the_quantized_activations() {
        if detected_level() < SimdLevel::Avx512 {
            return;
        }
        use GgmlType::*;
        let mut rng = Rng::new(17);
        for ty in [
            Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, IQ4_NL, IQ4_XS, Q4_K, Q5_K, Q6_K, Q3_K, Q2_K, IQ2_XXS,
            IQ2_XS, IQ2_S, IQ3_XXS, IQ3_S, IQ1_S, IQ1_M, TQ1_0, TQ2_0, MXFP4,
        ] {
            for (rows, cols, n, threads) in [(16, 256, 5, 1), (40, 768, 13, 2), (64, 512, 9, 2)] {
                let mut plain = random_weights(&mut rng, ty, rows, cols);
                if has_min(ty) {
                    // some blocks with a zero `dmin` (their mins count for
                    // nothing, whatever the 6-bit `m`)
                    let bs = ty.type_size();
                    let at = if ty == Q2_K { 82 } else { 2 };
                    for blk in plain.chunks_exact_mut(bs).step_by(3) {
                        blk[at..at + 2].fill(0);
                    }
                }
                let mut packed = plain.clone();
                let repacked = crate::matmul::repack(ty, &mut packed, rows, cols);
                let x = rng.vec(n * cols);
                // the reference quantization
                let block = act_mode(ty).block;
                let mut qx = vec![0f64; n * cols];
                let mut dx = vec![0f64; n * cols];
                for (t, xt) in x.chunks_exact(cols).enumerate() {
                    for (b, xb) in xt.chunks_exact(block).enumerate() {
                        let amax = xb.iter().fold(0f32, |m, v| m.max(v.abs()));
                        let (d, id) = (amax / 127.0, 127.0 / amax);
                        for (i, &v) in xb.iter().enumerate() {
                            let c = t * cols + b * block + i;
                            qx[c] = (v * id).round().clamp(-127.0, 127.0) as f64;
                            dx[c] = d as f64;
                        }
                    }
                }
                let pool = ThreadPool::new(threads);
                for layout in [
                    crate::matmul::weight::Layout::Rows,
                    crate::matmul::weight::Layout::Lanes16,
                ] {
                    if layout == crate::matmul::weight::Layout::Lanes16 && !repacked {
                        continue;
                    }
                    let data = if repacked && layout == crate::matmul::weight::Layout::Lanes16 {
                        &packed
                    } else {
                        &plain
                    };
                    let mut w = WeightRef::new(ty, data, rows, cols).unwrap();
                    w.layout = layout;
                    let mut y = vec![f32::NAN; n * rows];
                    igemm(&pool, &w, &x, &mut y, n);
                    let wp = WeightRef::new(ty, &plain, rows, cols).unwrap();
                    let mut wr = vec![0f32; cols];
                    for r in 0..rows {
                        if !dequant_row(ty, wp.row(r), &mut wr) {
                            coil_gguf::quant::dequantize_row(ty, wp.row(r), &mut wr).unwrap();
                        }
                        for t in 0..n {
                            let (mut want, mut mag) = (0f64, 0f64);
                            for (c, &wv) in wr.iter().enumerate() {
                                let p = wv as f64 * qx[t * cols + c] * dx[t * cols + c];
                                want += p;
                                mag += p.abs();
                            }
                            let got = y[t * rows + r] as f64;
                            assert!(
                                (got - want).abs() <= 1e-6 * mag + 1e-9,
                                "{ty} {layout:?} rows {rows} cols {cols} t {t} r {r}: {got} vs {want}"
                            );
                        }
                    }
                }
            }
        }
    }

    /// The activations are quantized as the dot kernels quantize theirs
    /// (`QuantAct`), ties after scaling included (away from zero): the
    /// GEMMs on the rows-in-lanes layout give each token the tiles' bits.
    #[test]
    fn activations_quantized_as_the_dot_kernels() {
        if detected_level() < SimdLevel::Avx512 {
            return;
        }
        let cols = 512;
        let mut rng = Rng::new(4);
        // block 0: amax 127, so qx = round(x): halves of both signs; then
        // random values
        let mut x: Vec<f32> = (0..256).map(|c| (c as f32 - 128.0) * 0.5).collect();
        x[0] = -127.0;
        x.extend(rng.vec(256));
        let pool = ThreadPool::new(1);
        for ty in [GgmlType::Q4_K, GgmlType::Q8_0] {
            let mode = act_mode(ty);
            let mut a = Acts::default();
            quantize_acts(&pool, &x, 1, cols, mode, &mut a);
            let want = match mode.block {
                256 => crate::matmul::act::QuantAct::q8_k(&x, cols),
                _ => crate::matmul::act::QuantAct::q8_0(&x, cols),
            };
            for (c, &u) in a.xu[..cols].iter().enumerate() {
                let q = if mode.biased {
                    u as i32 - 128
                } else {
                    u as i8 as i32
                };
                assert_eq!(q, i32::from(want.qs[c]), "{ty} column {c} ({})", x[c]);
            }
            assert_eq!(&a.dx[..cols / mode.block], &want.d[..], "{ty}");
        }
    }
}
