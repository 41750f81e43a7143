//! AVX2 (+FMA, F16C) kernels: float-format dot products and decoding.

use crate::matmul::scalar::dequant::{iq4xs_scales, KVALUES_IQ4NL};
use crate::simd::SimdLevel;
use coil_gguf::GgmlType;
use std::arch::x86_64::*;

macro_rules! rows_entry {
    ($name:ident, $dot:expr) => {
        #[target_feature(enable = "avx2,fma,f16c")]
        pub(in crate::matmul) unsafe fn $name(
            w: &[u8],
            rb: usize,
            xq: &[i8],
            xd: &[f32],
            xs: &[i16],
            out: &mut [f32],
        ) {
            let n = out.len();
            debug_assert!(w.len() >= n * rb);
            let pf = |r: usize| {
                let mut off = 0;
                while off < rb {
                    _mm_prefetch::<_MM_HINT_T0>(w.as_ptr().add(r * rb + off) as *const i8);
                    off += 64;
                }
            };
            let pfr = crate::matmul::kernel::pf_rows(rb);
            for r in 0..pfr.min(n) {
                pf(r);
            }
            for (r, o) in out.iter_mut().enumerate() {
                if r + pfr < n {
                    pf(r + pfr);
                }
                *o = $dot(&w[r * rb..(r + 1) * rb], xq, xd, xs);
            }
        }
    };
}
/// One-token rows of the 32-value formats: the rows of a chunk are
/// consecutive in memory and walked in order, each block prefetching the
/// line [`PF_STREAM`] ahead (see [`dot_b32`]).
#[target_feature(enable = "avx2,fma,f16c")]
pub(in crate::matmul) unsafe fn rows_b32<const BYTES: usize, const KIND: u8>(
    w: &[u8],
    rb: usize,
    xq: &[i8],
    xd: &[f32],
    xs: &[i16],
    out: &mut [f32],
) {
    assert!(w.len() >= out.len() * rb && rb == BYTES * xd.len() && xq.len() >= 32 * xd.len());
    let xs = &xs[..if KIND == 1 { xd.len() } else { 0 }];
    for (r, o) in out.iter_mut().enumerate() {
        *o = dot_b32::<BYTES, KIND, PF_STREAM>(w.as_ptr().add(r * rb), xq, xd, xs);
    }
}

macro_rules! rows_stream {
    ($name:ident, $dot:ident $(, $c:expr)*) => {
        /// One-token rows of a K-quant: consecutive rows walked in order,
        /// each block prefetching the block [`PF_STREAM`] bytes ahead, a
        /// steady stream whatever the row length (whole rows fetched
        /// `pf_rows` ahead at each row start came in bursts). tg64 A/B,
        /// AVX2, 2 threads: lfm2-1.2b-like Q4_K_M 15.9-17.2 -> 19.3-19.4
        /// tokens/s, mamba2-370m-like Q4_K_M 46.4-47.4 -> 49.6-51.1.
        #[target_feature(enable = "avx2,fma,f16c")]
        pub(in crate::matmul) unsafe fn $name(w: &[u8], rb: usize, xq: &[i8], xd: &[f32], xs: &[i16], out: &mut [f32]) {
            assert!(w.len() >= out.len() * rb);
            for (r, o) in out.iter_mut().enumerate() {
                // the row's slice may end before the prefetched lines: they are
                // only hints (a prefetch never faults)
                *o = $dot::<$($c,)* PF_STREAM>(&w[r * rb..(r + 1) * rb], xq, xd, xs);
            }
        }
    };
}
rows_stream!(rows_q4_k, dot_k45, false);
rows_stream!(rows_q5_k, dot_k45, true);
rows_stream!(rows_q6_k, dot_q6_k);
rows_entry!(rows_iq4_xs, dot_iq4_xs);

/// SIMD decoding of the plain float formats and Q8_0; false = not handled.
pub(in crate::matmul) fn decode(
    ty: GgmlType,
    src: &[u8],
    dst: &mut [f32],
    _level: SimdLevel,
) -> bool {
    // SAFETY: called only at level >= Avx2.
    unsafe {
        match ty {
            GgmlType::F16 => decode_f16(src, dst),
            GgmlType::BF16 => decode_bf16(src, dst),
            GgmlType::F32 => {
                for (d, b) in dst.iter_mut().zip(src.chunks_exact(4)) {
                    *d = f32::from_le_bytes([b[0], b[1], b[2], b[3]]);
                }
            }
            GgmlType::Q8_0 => decode_q8_0(src, dst),
            GgmlType::Q4_K => decode_k45::<false>(src, dst),
            GgmlType::Q5_K => decode_k45::<true>(src, dst),
            GgmlType::Q6_K => decode_q6_k(src, dst),
            GgmlType::Q4_0 => decode_q4_0_nl::<false>(src, dst),
            GgmlType::IQ4_NL => decode_q4_0_nl::<true>(src, dst),
            GgmlType::IQ4_XS => decode_iq4_xs(src, dst),
            _ => return false,
        }
    }
    true
}

#[inline(always)]
pub(in crate::matmul) unsafe fn hsum256(v: __m256) -> f32 {
    let s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    let s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    let s = _mm_add_ss(s, _mm_movehdup_ps(s));
    _mm_cvtss_f32(s)
}

/// f16 bits → f32 in all eight lanes, with F16C. Where a kernel multiplies
/// a vector by the value, this form also keeps the conversion off the
/// accumulators' dependency chains: for [`f16c`]'s one lane LLVM loads the
/// bits with `vpinsrw` into whatever register it picks (often an
/// accumulator), so each block's scale waited on the previous block's sums
/// (Q2_K one token: ~28 cycles a block where its operations need ~17).
#[inline(always)]
pub(in crate::matmul) unsafe fn f16_lanes(bits: u16) -> __m256 {
    _mm256_cvtph_ps(_mm_set1_epi16(bits as i16))
}

/// f16 bits → f32 with F16C.
#[inline(always)]
pub(in crate::matmul) unsafe fn f16c(bits: u16) -> f32 {
    _mm_cvtss_f32(_mm_cvtph_ps(_mm_cvtsi32_si128(bits as i32)))
}

#[target_feature(enable = "avx2,fma")]
pub(in crate::matmul) unsafe fn dot_f32(row: &[u8], x: &[f32]) -> f32 {
    let n = x.len();
    debug_assert!(row.len() >= 4 * n);
    let (w, xp) = (row.as_ptr() as *const f32, x.as_ptr());
    let mut a = [_mm256_setzero_ps(); 4];
    let mut i = 0;
    while i + 32 <= n {
        for (j, acc) in a.iter_mut().enumerate() {
            let o = i + 8 * j;
            *acc = _mm256_fmadd_ps(_mm256_loadu_ps(w.add(o)), _mm256_loadu_ps(xp.add(o)), *acc);
        }
        i += 32;
    }
    while i + 8 <= n {
        a[0] = _mm256_fmadd_ps(_mm256_loadu_ps(w.add(i)), _mm256_loadu_ps(xp.add(i)), a[0]);
        i += 8;
    }
    let mut s = hsum256(_mm256_add_ps(
        _mm256_add_ps(a[0], a[1]),
        _mm256_add_ps(a[2], a[3]),
    ));
    while i < n {
        s += w.add(i).read_unaligned() * x[i];
        i += 1;
    }
    s
}

/// Bytes ahead that the F16 / BF16 dot products prefetch, one line per 32
/// values. Against the hardware prefetchers alone (2-core AVX2 EPYC, 2
/// threads, tg64, interleaved rounds on a busy machine): mamba2-370m-like
/// F16 1.04-1.10x, hybrid-350m-like F16 1.06-1.14x, lfm2-1.2b-like F16
/// 1.04-1.10x; 2 KB ahead was no better than none.
pub(in crate::matmul) const PF_BYTES_16: usize = 1024;

#[target_feature(enable = "avx2,fma,f16c")]
pub(in crate::matmul) unsafe fn dot_f16(row: &[u8], x: &[f32]) -> f32 {
    let n = x.len();
    debug_assert!(row.len() >= 2 * n);
    let (w, xp) = (row.as_ptr(), x.as_ptr());
    let ld = |i: usize| _mm256_cvtph_ps(_mm_loadu_si128(w.add(2 * i) as *const __m128i));
    let mut a = [_mm256_setzero_ps(); 4];
    let mut i = 0;
    while i + 32 <= n {
        _mm_prefetch::<_MM_HINT_T0>(w.wrapping_add(2 * i + PF_BYTES_16) as *const i8);
        _mm_prefetch::<_MM_HINT_T1>(w.wrapping_add(2 * i + PF_FAR) as *const i8);
        for (j, acc) in a.iter_mut().enumerate() {
            let o = i + 8 * j;
            *acc = _mm256_fmadd_ps(ld(o), _mm256_loadu_ps(xp.add(o)), *acc);
        }
        i += 32;
    }
    while i + 8 <= n {
        a[0] = _mm256_fmadd_ps(ld(i), _mm256_loadu_ps(xp.add(i)), a[0]);
        i += 8;
    }
    let mut s = hsum256(_mm256_add_ps(
        _mm256_add_ps(a[0], a[1]),
        _mm256_add_ps(a[2], a[3]),
    ));
    while i < n {
        s += f16c(u16::from_le_bytes([row[2 * i], row[2 * i + 1]])) * x[i];
        i += 1;
    }
    s
}

#[target_feature(enable = "avx2,fma")]
pub(in crate::matmul) unsafe fn dot_bf16(row: &[u8], x: &[f32]) -> f32 {
    let n = x.len();
    debug_assert!(row.len() >= 2 * n);
    let (w, xp) = (row.as_ptr(), x.as_ptr());
    let ld = |i: usize| {
        let h = _mm_loadu_si128(w.add(2 * i) as *const __m128i);
        _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16))
    };
    let mut a = [_mm256_setzero_ps(); 4];
    let mut i = 0;
    while i + 32 <= n {
        _mm_prefetch::<_MM_HINT_T0>(w.wrapping_add(2 * i + PF_BYTES_16) as *const i8);
        _mm_prefetch::<_MM_HINT_T1>(w.wrapping_add(2 * i + PF_FAR) as *const i8);
        for (j, acc) in a.iter_mut().enumerate() {
            let o = i + 8 * j;
            *acc = _mm256_fmadd_ps(ld(o), _mm256_loadu_ps(xp.add(o)), *acc);
        }
        i += 32;
    }
    while i + 8 <= n {
        a[0] = _mm256_fmadd_ps(ld(i), _mm256_loadu_ps(xp.add(i)), a[0]);
        i += 8;
    }
    let mut s = hsum256(_mm256_add_ps(
        _mm256_add_ps(a[0], a[1]),
        _mm256_add_ps(a[2], a[3]),
    ));
    while i < n {
        s += f32::from_bits((u16::from_le_bytes([row[2 * i], row[2 * i + 1]]) as u32) << 16) * x[i];
        i += 1;
    }
    s
}

#[target_feature(enable = "avx2,fma,f16c")]
pub(in crate::matmul) unsafe fn decode_f16(src: &[u8], dst: &mut [f32]) {
    let n = dst.len();
    let mut i = 0;
    while i + 8 <= n {
        let h = _mm_loadu_si128(src.as_ptr().add(2 * i) as *const __m128i);
        _mm256_storeu_ps(dst.as_mut_ptr().add(i), _mm256_cvtph_ps(h));
        i += 8;
    }
    while i < n {
        dst[i] = f16c(u16::from_le_bytes([src[2 * i], src[2 * i + 1]]));
        i += 1;
    }
}

#[target_feature(enable = "avx2")]
pub(in crate::matmul) unsafe fn decode_bf16(src: &[u8], dst: &mut [f32]) {
    let n = dst.len();
    let mut i = 0;
    while i + 8 <= n {
        let h = _mm_loadu_si128(src.as_ptr().add(2 * i) as *const __m128i);
        let v = _mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16);
        _mm256_storeu_si256(dst.as_mut_ptr().add(i) as *mut __m256i, v);
        i += 8;
    }
    while i < n {
        dst[i] = f32::from_bits((u16::from_le_bytes([src[2 * i], src[2 * i + 1]]) as u32) << 16);
        i += 1;
    }
}

#[target_feature(enable = "avx2,fma,f16c")]
pub(in crate::matmul) unsafe fn decode_q8_0(src: &[u8], dst: &mut [f32]) {
    for (b, y) in src.chunks_exact(34).zip(dst.chunks_exact_mut(32)) {
        let d = _mm256_set1_ps(f16c(u16::from_le_bytes([b[0], b[1]])));
        for k in 0..4 {
            let q = _mm_loadl_epi64(b.as_ptr().add(2 + 8 * k) as *const __m128i);
            let v = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(q));
            _mm256_storeu_ps(y.as_mut_ptr().add(8 * k), _mm256_mul_ps(v, d));
        }
    }
}

// ---- integer dot products (maddubs: u8 x i8 -> i16 pairs, madd -> i32) ----

#[inline(always)]
pub(in crate::matmul) unsafe fn rd16(p: *const u8) -> u16 {
    (p as *const u16).read_unaligned()
}

/// 16 packed nibbles → 32 u8 `[lo | hi]`.
#[inline(always)]
pub(in crate::matmul) unsafe fn nibbles(p: *const u8) -> __m256i {
    let q = _mm_loadu_si128(p as *const __m128i);
    let m = _mm_set1_epi8(0xF);
    _mm256_set_m128i(_mm_and_si128(_mm_srli_epi16(q, 4), m), _mm_and_si128(q, m))
}

/// `sum u[i]*s[i]` as 8 i32 lanes (`u` ≤ 128 unsigned so pairs fit in i16).
#[inline(always)]
pub(in crate::matmul) unsafe fn dot_us(u: __m256i, s: __m256i) -> __m256i {
    _mm256_madd_epi16(_mm256_maddubs_epi16(u, s), _mm256_set1_epi16(1))
}

/// One 32-value block of a Q8_0 / Q4_0 / IQ4_NL row (`KIND` 0 / 1 / 2, `b`
/// the block) times the activations `xv`: eight i32 lane sums (Q4_0: of the
/// unsigned nibbles, corrected by the caller).
#[inline(always)]
pub(in crate::matmul) unsafe fn b32_idot<const KIND: u8>(
    b: *const u8,
    xv: __m256i,
    tbl: __m256i,
) -> __m256i {
    match KIND {
        0 => {
            let wv = _mm256_loadu_si256(b.add(2) as *const __m256i);
            dot_us(_mm256_abs_epi8(wv), _mm256_sign_epi8(xv, wv))
        }
        1 => dot_us(nibbles(b.add(2)), xv),
        _ => {
            let v = _mm256_shuffle_epi8(tbl, nibbles(b.add(2)));
            dot_us(_mm256_abs_epi8(v), _mm256_sign_epi8(xv, v))
        }
    }
}

/// The IQ4_NL value table in both 128-bit lanes (for [`b32_idot`]).
#[inline(always)]
pub(in crate::matmul) unsafe fn iq4nl_table() -> __m256i {
    _mm256_broadcastsi128_si256(_mm_loadu_si128(KVALUES_IQ4NL.as_ptr() as *const __m128i))
}

/// Bytes ahead of the block being multiplied that the one-token kernels of
/// the 32-value formats prefetch, one prefetch per block (or pair of 18-byte
/// blocks): a steady stream of requests a few rows' worth ahead whatever the
/// row length. (Whole rows 8 ahead, fetched in a burst at each row start,
/// ran 34 KB ahead on Q8_0 rows of 2048 values and 70 KB, more than L1, on
/// rows of 8192; measured on a 2-core AVX2 EPYC, 2 threads, Q8_0 matrices
/// streamed from memory: 60-70% of the read bandwidth before, 95-100% with
/// this and no prefetch 80%.)
pub(in crate::matmul) const PF_STREAM: usize = 2048;

/// Bytes ahead of the block being multiplied that the stream kernels
/// prefetch a second time, into L2 ([`prefetch_far`]): requests to memory
/// start twice as early, so more lines are in flight than the ~12 L1 fill
/// buffers that the near prefetches wait in allow (one core's share of the
/// bandwidth is bounded by lines in flight × latency). Measured on a 2-core
/// Intel Xeon (AVX-512), 2 threads, lfm2-1.2b-like Q4_K_M decode, A/B ×2:
/// 20.2–21.1 → 24.3–26.4 tokens/s (T1 or T2, 4–10 KB ahead, all within
/// noise of each other; without any software prefetch 15.4–15.8).
pub(in crate::matmul) const PF_FAR: usize = 4096;

/// The far prefetch of the `bytes`-byte block at `b`: its lines
/// [`PF_FAR`] ahead, into L2.
#[inline(always)]
pub(in crate::matmul) unsafe fn prefetch_far(b: *const u8, bytes: usize) {
    let p = b.wrapping_add(PF_FAR);
    let mut off = 0;
    while off < bytes {
        _mm_prefetch::<_MM_HINT_T1>(p.wrapping_add(off) as *const i8);
        off += 64;
    }
}

/// Q8_0 / Q4_0 / IQ4_NL row (`BYTES` per block, `KIND` as [`b32_idot`])
/// against Q8_0-style activations (`xd.len()` blocks), prefetching the
/// line `PF` bytes ahead of each block (`PF` = 0: none). The row's
/// floating-point operations, in order: per block `s = d_w * d_x`, (Q4_0)
/// `corr += s * sum_x`, and an FMA into the accumulator of the even or of
/// the odd blocks; then `hsum(even + odd) - 8 * corr` (the few-token tiles
/// repeat them exactly). The blocks go in pairs so both accumulators stay in
/// registers: indexed by `i % 2` they lived on the stack, a store-to-load
/// round trip per block (8 cycles a block, 12.7 GB/s from L2 on one core,
/// against 19 now).
///
/// # Safety
/// `row` holds `xd.len()` blocks, `xq` as many 32-value chunks, `xs` (Q4_0)
/// as many sums; AVX2, FMA and F16C are available.
#[inline(always)]
pub(in crate::matmul) unsafe fn dot_b32<const BYTES: usize, const KIND: u8, const PF: usize>(
    row: *const u8,
    xq: &[i8],
    xd: &[f32],
    xs: &[i16],
) -> f32 {
    let nb = xd.len();
    let tbl = iq4nl_table();
    let (mut even, mut odd) = (_mm256_setzero_ps(), _mm256_setzero_ps());
    let mut corr = 0f32;
    let mut i = 0;
    while i + 2 <= nb {
        even = b32_block::<BYTES, KIND, PF>(row, xq, xd, xs, tbl, i, even, &mut corr);
        odd = b32_block::<BYTES, KIND, PF>(row, xq, xd, xs, tbl, i + 1, odd, &mut corr);
        i += 2;
    }
    if i < nb {
        even = b32_block::<BYTES, KIND, PF>(row, xq, xd, xs, tbl, i, even, &mut corr);
    }
    hsum256(_mm256_add_ps(even, odd)) - 8.0 * corr
}

/// Block `i` of [`dot_b32`]: returns `acc` plus its product.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
pub(in crate::matmul) unsafe fn b32_block<const BYTES: usize, const KIND: u8, const PF: usize>(
    row: *const u8,
    xq: &[i8],
    xd: &[f32],
    xs: &[i16],
    tbl: __m256i,
    i: usize,
    acc: __m256,
    corr: &mut f32,
) -> __m256 {
    let b = row.add(BYTES * i);
    // 34-byte blocks: every block; 18-byte ones: every other (36 bytes)
    if PF > 0 && (BYTES > 32 || i.is_multiple_of(2)) {
        _mm_prefetch::<_MM_HINT_T0>(b.wrapping_add(PF) as *const i8);
        _mm_prefetch::<_MM_HINT_T1>(b.wrapping_add(PF_FAR) as *const i8);
    }
    let xv = _mm256_loadu_si256(xq.as_ptr().add(32 * i) as *const __m256i);
    let dot = b32_idot::<KIND>(b, xv, tbl);
    let s = f16c(rd16(b)) * *xd.get_unchecked(i);
    if KIND == 1 {
        *corr += s * *xs.get_unchecked(i) as f32;
    }
    _mm256_fmadd_ps(_mm256_cvtepi32_ps(dot), _mm256_set1_ps(s), acc)
}

#[target_feature(enable = "avx2,fma,f16c")]
pub(in crate::matmul) unsafe fn dot_q8_0(row: &[u8], xq: &[i8], xd: &[f32], xs: &[i16]) -> f32 {
    assert!(row.len() >= 34 * xd.len() && xq.len() >= 32 * xd.len());
    dot_b32::<34, 0, 0>(row.as_ptr(), xq, xd, xs)
}

#[target_feature(enable = "avx2,fma,f16c")]
pub(in crate::matmul) unsafe fn dot_q4_0(row: &[u8], xq: &[i8], xd: &[f32], xs: &[i16]) -> f32 {
    assert!(row.len() >= 18 * xd.len() && xq.len() >= 32 * xd.len() && xs.len() >= xd.len());
    dot_b32::<18, 1, 0>(row.as_ptr(), xq, xd, xs)
}

#[target_feature(enable = "avx2,fma,f16c")]
pub(in crate::matmul) unsafe fn dot_iq4_nl(row: &[u8], xq: &[i8], xd: &[f32], xs: &[i16]) -> f32 {
    assert!(row.len() >= 18 * xd.len() && xq.len() >= 32 * xd.len());
    dot_b32::<18, 2, 0>(row.as_ptr(), xq, xd, xs)
}

#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
pub(in crate::matmul) unsafe fn dot_k45<const HIGH: bool, const PF: usize>(
    row: &[u8],
    xq: &[i8],
    xd: &[f32],
    xs: &[i16],
) -> f32 {
    let nb = xd.len();
    let bsz = if HIGH { 176 } else { 144 };
    let mut facc = _mm256_setzero_ps();
    let mut msum = 0f32;
    for i in 0..nb {
        let b = row.as_ptr().add(bsz * i);
        if PF > 0 {
            prefetch_block(b.wrapping_add(PF), bsz);
            prefetch_far(b, bsz);
        }
        let (sc, mn) = crate::matmul::scalar::dequant::scales_mins_k4_words(
            std::slice::from_raw_parts(b.add(4), 12),
        );
        let sp = k4_scale_lanes(sc);
        let x = xq.as_ptr().add(256 * i);
        let qs = b.add(if HIGH { 48 } else { 16 });
        let mut hbits = if HIGH {
            _mm256_loadu_si256(b.add(16) as *const __m256i)
        } else {
            _mm256_setzero_si256()
        };
        let mut iacc = _mm256_setzero_si256();
        for j in 0..4 {
            let q = _mm256_loadu_si256(qs.add(32 * j) as *const __m256i);
            let (lo, hi) = k45_nibbles::<HIGH>(q, &mut hbits);
            let xl = _mm256_loadu_si256(x.add(64 * j) as *const __m256i);
            let xh = _mm256_loadu_si256(x.add(64 * j + 32) as *const __m256i);
            let pl = _mm256_madd_epi16(_mm256_maddubs_epi16(lo, xl), k4_scale(sp, 2 * j));
            let ph = _mm256_madd_epi16(_mm256_maddubs_epi16(hi, xh), k4_scale(sp, 2 * j + 1));
            iacc = _mm256_add_epi32(iacc, _mm256_add_epi32(pl, ph));
        }
        let mins = k4_mins(mn, xs.as_ptr().add(16 * i));
        let d = f16c(rd16(b)) * xd[i];
        facc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(iacc), _mm256_set1_ps(d), facc);
        msum += f16c(rd16(b.add(2))) * xd[i] * mins as f32;
    }
    hsum256(facc) - msum
}

/// A 32-byte chunk `q` of Q4_K / Q5_K quants as its low and high nibbles
/// (sub-blocks `2j`, `2j + 1`); `HIGH` (Q5_K): with their fifth bits, bits
/// 0 and 1 of each byte of `hbits`, which moves on to the next chunk's.
#[inline(always)]
pub(in crate::matmul) unsafe fn k45_nibbles<const HIGH: bool>(
    q: __m256i,
    hbits: &mut __m256i,
) -> (__m256i, __m256i) {
    let m4 = _mm256_set1_epi8(0xF);
    let lo = _mm256_and_si256(q, m4);
    let hi = _mm256_and_si256(_mm256_srli_epi16(q, 4), m4);
    if !HIGH {
        return (lo, hi);
    }
    let bit4 = _mm256_set1_epi8(0x10);
    let h = *hbits;
    *hbits = _mm256_srli_epi16(h, 2);
    (
        _mm256_or_si256(lo, _mm256_and_si256(_mm256_slli_epi16(h, 4), bit4)),
        _mm256_or_si256(hi, _mm256_and_si256(_mm256_slli_epi16(h, 3), bit4)),
    )
}

/// Prefetches the lines of the `bytes` bytes at `p` (a block `PF` ahead).
#[inline(always)]
pub(in crate::matmul) unsafe fn prefetch_block(p: *const u8, bytes: usize) {
    let mut off = 0;
    while off < bytes {
        _mm_prefetch::<_MM_HINT_T0>(p.wrapping_add(off) as *const i8);
        off += 64;
    }
    _mm_prefetch::<_MM_HINT_T0>(p.wrapping_add(bytes - 1) as *const i8);
}

/// `_mm256_shuffle_epi8` mask byte pair picking 16-bit word `w` (0..8) of a
/// 128-bit lane.
#[inline(always)]
pub(in crate::matmul) const fn word_mask(w: usize) -> i16 {
    (((2 * w + 1) << 8) | (2 * w)) as i16
}

/// A Q4_K/Q5_K block's eight scales (bytes of `sc`) as i16 in both 128-bit
/// lanes, for [`k4_scale`].
#[target_feature(enable = "avx2")]
#[inline]
pub(in crate::matmul) unsafe fn k4_scale_lanes(sc: u64) -> __m256i {
    _mm256_broadcastsi128_si256(_mm_cvtepu8_epi16(_mm_cvtsi64_si128(sc as i64)))
}

/// Scale `w` of a block in all sixteen i16 lanes: one byte shuffle instead
/// of a scalar load and broadcast.
#[target_feature(enable = "avx2")]
#[inline]
pub(in crate::matmul) unsafe fn k4_scale(lanes: __m256i, w: usize) -> __m256i {
    _mm256_shuffle_epi8(lanes, _mm256_set1_epi16(word_mask(w)))
}

/// Q6_K's sixteen scales of a block (sign-extended to i16,
/// `[s0..s8 | s8..s16]`) rearranged as `[s0..s8 | s0..s8]` and
/// `[s8..s16 | s8..s16]`, for [`q6k_scale`].
#[target_feature(enable = "avx2")]
#[inline]
pub(in crate::matmul) unsafe fn q6k_scale_lanes(sc16: __m256i) -> [__m256i; 2] {
    [
        _mm256_permute2x128_si256(sc16, sc16, 0x00),
        _mm256_permute2x128_si256(sc16, sc16, 0x11),
    ]
}

/// The multiplier of 16-groups `g` (low lane) and `g + 1` (high lane) of a
/// Q6_K block, `g = 8 n + 2 k`.
#[target_feature(enable = "avx2")]
#[inline]
pub(in crate::matmul) unsafe fn q6k_scale(lanes: &[__m256i; 2], n: usize, k: usize) -> __m256i {
    let mask = _mm256_set_m128i(
        _mm_set1_epi16(word_mask(2 * k + 1)),
        _mm_set1_epi16(word_mask(2 * k)),
    );
    _mm256_shuffle_epi8(lanes[n], mask)
}

/// `sum_j mn[j] * (bs[2j] + bs[2j + 1])`: a Q4_K/Q5_K block's eight mins
/// (bytes of `mn`) times the sums of the activations' 16-value groups (`bs`:
/// 16 i16), exact.
#[target_feature(enable = "avx2")]
#[inline]
pub(in crate::matmul) unsafe fn k4_mins(mn: u64, bs: *const i16) -> i32 {
    let m = _mm_cvtepu8_epi16(_mm_cvtsi64_si128(mn as i64));
    // [m0 m0 m1 m1 m2 m2 m3 m3 | m4 m4 m5 m5 m6 m6 m7 m7]
    let mdup = _mm256_set_m128i(_mm_unpackhi_epi16(m, m), _mm_unpacklo_epi16(m, m));
    let p = _mm256_madd_epi16(_mm256_loadu_si256(bs as *const __m256i), mdup);
    let s = _mm_add_epi32(_mm256_castsi256_si128(p), _mm256_extracti128_si256(p, 1));
    let s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0b01_00_11_10));
    let s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0b10_11_00_01));
    _mm_cvtsi128_si32(s)
}

/// Half `n` (0, 1) of a Q6_K block's quants, unsigned 0..64: four vectors of
/// 32, the 16-groups `8n + 2k` and `8n + 2k + 1` in vector `k`.
#[target_feature(enable = "avx2")]
#[inline]
pub(in crate::matmul) unsafe fn q6k_quants(b: *const u8, n: usize) -> [__m256i; 4] {
    std::array::from_fn(|k| q6k_quant(b, n, k))
}

/// Vector `k` (0..4) of [`q6k_quants`] alone.
#[target_feature(enable = "avx2")]
#[inline]
pub(in crate::matmul) unsafe fn q6k_quant(b: *const u8, n: usize, k: usize) -> __m256i {
    let (m4, m3) = (_mm256_set1_epi8(0xF), _mm256_set1_epi8(3));
    // low nibbles of bytes 64n.. (k even) or 64n+32.. (k odd); k >= 2: high nibbles
    let l = _mm256_loadu_si256(b.add(64 * n + 32 * (k % 2)) as *const __m256i);
    let h = _mm256_loadu_si256(b.add(128 + 32 * n) as *const __m256i);
    let (l, h) = match k {
        0 => (l, h),
        1 => (l, _mm256_srli_epi16(h, 2)),
        2 => (_mm256_srli_epi16(l, 4), _mm256_srli_epi16(h, 4)),
        _ => (_mm256_srli_epi16(l, 4), _mm256_srli_epi16(h, 6)),
    };
    _mm256_or_si256(
        _mm256_and_si256(l, m4),
        _mm256_slli_epi16(_mm256_and_si256(h, m3), 4),
    )
}

#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
pub(in crate::matmul) unsafe fn dot_q6_k<const PF: usize>(
    row: &[u8],
    xq: &[i8],
    xd: &[f32],
    xs: &[i16],
) -> f32 {
    let nb = xd.len();
    let mut facc = _mm256_setzero_ps();
    for i in 0..nb {
        let b = row.as_ptr().add(210 * i);
        if PF > 0 {
            prefetch_block(b.wrapping_add(PF), 210);
            prefetch_far(b, 210);
        }
        let sc = b.add(192) as *const i8;
        let x = xq.as_ptr().add(256 * i);
        let sc16 = _mm256_cvtepi8_epi16(_mm_loadu_si128(sc as *const __m128i));
        let lanes = q6k_scale_lanes(sc16);
        let mut iacc = _mm256_setzero_si256();
        for n in 0..2 {
            let q = q6k_quants(b, n);
            for (k, qk) in q.iter().enumerate() {
                // 32 values = 16-groups g, g+1 with g = 8n + 2k
                let xv = _mm256_loadu_si256(x.add(128 * n + 32 * k) as *const __m256i);
                let p = _mm256_maddubs_epi16(*qk, xv);
                iacc = _mm256_add_epi32(iacc, _mm256_madd_epi16(p, q6k_scale(&lanes, n, k)));
            }
        }
        // minus 32 * sum_g sc_g * bsum_g
        let bs16 = _mm256_loadu_si256(xs.as_ptr().add(16 * i) as *const __m256i);
        let corr = _mm256_slli_epi32(_mm256_madd_epi16(sc16, bs16), 5);
        iacc = _mm256_sub_epi32(iacc, corr);
        let d = f16c(rd16(b.add(208))) * xd[i];
        facc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(iacc), _mm256_set1_ps(d), facc);
    }
    hsum256(facc)
}

#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
pub(in crate::matmul) unsafe fn dot_iq4_xs(row: &[u8], xq: &[i8], xd: &[f32], _xs: &[i16]) -> f32 {
    let nb = xd.len();
    let tbl =
        _mm256_broadcastsi128_si256(_mm_loadu_si128(KVALUES_IQ4NL.as_ptr() as *const __m128i));
    let mut facc = _mm256_setzero_ps();
    for i in 0..nb {
        let b = row.as_ptr().add(136 * i);
        let ls = iq4xs_scales(std::slice::from_raw_parts(b, 136));
        let x = xq.as_ptr().add(256 * i);
        let mut iacc = _mm256_setzero_si256();
        for (ib, &l) in ls.iter().enumerate() {
            let v = _mm256_shuffle_epi8(tbl, nibbles(b.add(8 + 16 * ib)));
            let xv = _mm256_loadu_si256(x.add(32 * ib) as *const __m256i);
            let p = _mm256_maddubs_epi16(_mm256_abs_epi8(v), _mm256_sign_epi8(xv, v));
            iacc = _mm256_add_epi32(iacc, _mm256_madd_epi16(p, _mm256_set1_epi16(l as i16)));
        }
        let d = f16c(rd16(b)) * xd[i];
        facc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(iacc), _mm256_set1_ps(d), facc);
    }
    hsum256(facc)
}

// ---- decoding to f32 (GEMM panels) ----

/// 16 u8 → f32 at `out[0..16]`, as `v * d - m`.
#[inline(always)]
pub(in crate::matmul) unsafe fn store_u8x16(out: *mut f32, v: __m128i, d: __m256, m: __m256) {
    let a = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(v));
    let b = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_srli_si128(v, 8)));
    _mm256_storeu_ps(out, _mm256_fmsub_ps(a, d, m));
    _mm256_storeu_ps(out.add(8), _mm256_fmsub_ps(b, d, m));
}

/// 16 i8 → f32 at `out[0..16]`, as `v * d`.
#[inline(always)]
pub(in crate::matmul) unsafe fn store_i8x16(out: *mut f32, v: __m128i, d: __m256) {
    let a = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(v));
    let b = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(v, 8)));
    _mm256_storeu_ps(out, _mm256_mul_ps(a, d));
    _mm256_storeu_ps(out.add(8), _mm256_mul_ps(b, d));
}

#[target_feature(enable = "avx2,fma,f16c")]
pub(in crate::matmul) unsafe fn decode_k45<const HIGH: bool>(src: &[u8], dst: &mut [f32]) {
    let bsz = if HIGH { 176 } else { 144 };
    let m4 = _mm_set1_epi8(0xF);
    let bit4 = _mm_set1_epi8(0x10);
    for (bi, y) in dst.chunks_exact_mut(256).enumerate() {
        let blk = &src[bsz * bi..bsz * (bi + 1)];
        let b = blk.as_ptr();
        let d = f16c(rd16(b));
        let dmin = f16c(rd16(b.add(2)));
        let mut sm = [(0u8, 0u8); 8];
        for (j, v) in sm.iter_mut().enumerate() {
            *v = crate::matmul::scalar::dequant::scale_min_k4(j, &blk[4..16]);
        }
        let qs = b.add(if HIGH { 48 } else { 16 });
        let yp = y.as_mut_ptr();
        for h in 0..2 {
            let mut hb = if HIGH {
                _mm_loadu_si128(b.add(16 + 16 * h) as *const __m128i)
            } else {
                _mm_setzero_si128()
            };
            for j in 0..4 {
                let (s1, n1) = sm[2 * j];
                let (s2, n2) = sm[2 * j + 1];
                let q = _mm_loadu_si128(qs.add(32 * j + 16 * h) as *const __m128i);
                let mut lo = _mm_and_si128(q, m4);
                let mut hi = _mm_and_si128(_mm_srli_epi16(q, 4), m4);
                if HIGH {
                    lo = _mm_or_si128(lo, _mm_and_si128(_mm_slli_epi16(hb, 4), bit4));
                    hi = _mm_or_si128(hi, _mm_and_si128(_mm_slli_epi16(hb, 3), bit4));
                    hb = _mm_srli_epi16(hb, 2);
                }
                let (d1, m1) = (
                    _mm256_set1_ps(d * s1 as f32),
                    _mm256_set1_ps(dmin * n1 as f32),
                );
                let (d2, m2) = (
                    _mm256_set1_ps(d * s2 as f32),
                    _mm256_set1_ps(dmin * n2 as f32),
                );
                store_u8x16(yp.add(64 * j + 16 * h), lo, d1, m1);
                store_u8x16(yp.add(64 * j + 32 + 16 * h), hi, d2, m2);
            }
        }
    }
}

#[target_feature(enable = "avx2,fma,f16c")]
pub(in crate::matmul) unsafe fn decode_q6_k(src: &[u8], dst: &mut [f32]) {
    let m4 = _mm_set1_epi8(0xF);
    let m3 = _mm_set1_epi8(3);
    let off = _mm_set1_epi8(32);
    for (bi, y) in dst.chunks_exact_mut(256).enumerate() {
        let b = src.as_ptr().add(210 * bi);
        let d = f16c(rd16(b.add(208)));
        let yp = y.as_mut_ptr();
        for n in 0..2 {
            let ql = b.add(64 * n);
            let qh = b.add(128 + 32 * n);
            let sc = b.add(192 + 8 * n) as *const i8;
            for l in [0usize, 16] {
                let is = l / 16;
                let a = _mm_loadu_si128(ql.add(l) as *const __m128i);
                let c = _mm_loadu_si128(ql.add(l + 32) as *const __m128i);
                let h = _mm_loadu_si128(qh.add(l) as *const __m128i);
                let h0 = _mm_slli_epi16(_mm_and_si128(h, m3), 4);
                let h2 = _mm_slli_epi16(_mm_and_si128(_mm_srli_epi16(h, 2), m3), 4);
                let h4 = _mm_slli_epi16(_mm_and_si128(_mm_srli_epi16(h, 4), m3), 4);
                let h6 = _mm_slli_epi16(_mm_and_si128(_mm_srli_epi16(h, 6), m3), 4);
                let q1 = _mm_sub_epi8(_mm_or_si128(_mm_and_si128(a, m4), h0), off);
                let q2 = _mm_sub_epi8(_mm_or_si128(_mm_and_si128(c, m4), h2), off);
                let q3 = _mm_sub_epi8(
                    _mm_or_si128(_mm_and_si128(_mm_srli_epi16(a, 4), m4), h4),
                    off,
                );
                let q4 = _mm_sub_epi8(
                    _mm_or_si128(_mm_and_si128(_mm_srli_epi16(c, 4), m4), h6),
                    off,
                );
                let base = yp.add(128 * n + l);
                let s = |k: usize| _mm256_set1_ps(d * *sc.add(is + 2 * k) as f32);
                store_i8x16(base, q1, s(0));
                store_i8x16(base.add(32), q2, s(1));
                store_i8x16(base.add(64), q3, s(2));
                store_i8x16(base.add(96), q4, s(3));
            }
        }
    }
}

#[target_feature(enable = "avx2,fma,f16c")]
pub(in crate::matmul) unsafe fn decode_q4_0_nl<const NL: bool>(src: &[u8], dst: &mut [f32]) {
    let m4 = _mm_set1_epi8(0xF);
    let tbl = _mm_loadu_si128(KVALUES_IQ4NL.as_ptr() as *const __m128i);
    let eight = _mm_set1_epi8(8);
    for (bi, y) in dst.chunks_exact_mut(32).enumerate() {
        let b = src.as_ptr().add(18 * bi);
        let d = _mm256_set1_ps(f16c(rd16(b)));
        let q = _mm_loadu_si128(b.add(2) as *const __m128i);
        let lo = _mm_and_si128(q, m4);
        let hi = _mm_and_si128(_mm_srli_epi16(q, 4), m4);
        let (lo, hi) = if NL {
            (_mm_shuffle_epi8(tbl, lo), _mm_shuffle_epi8(tbl, hi))
        } else {
            (_mm_sub_epi8(lo, eight), _mm_sub_epi8(hi, eight))
        };
        store_i8x16(y.as_mut_ptr(), lo, d);
        store_i8x16(y.as_mut_ptr().add(16), hi, d);
    }
}

#[target_feature(enable = "avx2,fma,f16c")]
pub(in crate::matmul) unsafe fn decode_iq4_xs(src: &[u8], dst: &mut [f32]) {
    let m4 = _mm_set1_epi8(0xF);
    let tbl = _mm_loadu_si128(KVALUES_IQ4NL.as_ptr() as *const __m128i);
    for (bi, y) in dst.chunks_exact_mut(256).enumerate() {
        let blk = &src[136 * bi..136 * bi + 136];
        let d = f16c(rd16(blk.as_ptr()));
        let ls = iq4xs_scales(blk);
        for (ib, &l) in ls.iter().enumerate() {
            let dl = _mm256_set1_ps(d * l as f32);
            let q = _mm_loadu_si128(blk.as_ptr().add(8 + 16 * ib) as *const __m128i);
            let lo = _mm_shuffle_epi8(tbl, _mm_and_si128(q, m4));
            let hi = _mm_shuffle_epi8(tbl, _mm_and_si128(_mm_srli_epi16(q, 4), m4));
            store_i8x16(y.as_mut_ptr().add(32 * ib), lo, dl);
            store_i8x16(y.as_mut_ptr().add(32 * ib + 16), hi, dl);
        }
    }
}
