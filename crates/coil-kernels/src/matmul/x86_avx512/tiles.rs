//! AVX-512 (VNNI) integer dot products of a range of K-quant or 32-value
//! block (Q8_0, Q4_0, IQ4_NL, Q5_0, Q4_1, Q5_1) weight rows with up to [`MAX_TOKENS`] tokens
//! at once (batched decode of several sequences, speculative
//! verification): each row's 256 values are fetched and unpacked once
//! (nibbles, high bits, scales) and multiplied with every token's
//! quantized activations while they sit in registers.
//!
//! Batch invariance: each token's result is computed with exactly the
//! floating-point operations, in the same order and lanes, of the
//! one-token kernel in `dots.rs` (`dot_k45`, `dot_q6k`, `dot_b32`; the integer
//! parts are exact), so a token's output does not depend on how many
//! tokens share the call. The per-block scales of all the tokens
//! (`d · xd`, `dmin · xd`) are formed in one vector multiply: lane by lane
//! the products the one-token kernel forms one at a time.
//!
//! Activations come in an [`ActPanel`] of 64-value chunks: chunk `c` of
//! token `t` at `(c · nt + t) · 64`, one `zmm` load per token and step.
//! Register use (32 zmm): per token an i32 block accumulator, an f32 row
//! accumulator and (Q4_K/Q5_K) the mins' accumulator; the unpacked weights
//! of one 64-value step and its scale vector. An empty `asm!` (`pin!`)
//! marks where each step's unpacked weights must be ready, so the compiler
//! does not hoist a whole block's unpacking ahead of the token loop.

use super::super::act::{ActPanel, QuantAct, PANEL_LANES};
use super::super::x86_avx2::dots::{f16c, PF_STREAM};
use super::dots::{
    b32_min, hsum256, k45_pair_idx, k45_step, k4_scales_mins, pair_dot, prefetch_ahead, q6k_half,
    q6k_offset, q6k_pair_idx, rd16, transpose4, B32,
};
use std::arch::x86_64::*;

/// Most tokens per call: a verification of 8 drafts is 9 tokens. Q4_K/Q5_K
/// keep three accumulators per token and spill a little past 8, yet the
/// ninth token in the same call is cheaper than a call of its own (kernel
/// bench, 4096 × 4096 Q4_K from memory, time ÷ one token: 8 tokens 4.50,
/// 9 tokens 5.22).
pub(in super::super) const MAX_TOKENS: usize = 9;

/// Keeps each `v` in a register at this point of the program (see the
/// AVX2 tiles).
macro_rules! pin {
    ($($v:expr),+) => {
        $(
            // SAFETY: an empty instruction template; the register is unchanged.
            core::arch::asm!("/* {0} */", inout(zmm_reg) $v, options(nostack, preserves_flags));
        )+
    };
}

/// Checks the shapes every kernel relies on (as the AVX2 tiles' `check`)
/// and returns the row count.
#[inline(always)]
fn check<const NT: usize>(w: &[u8], rb: usize, p: &ActPanel, out: &[&mut [f32]]) -> usize {
    assert!(p.nt == NT && out.len() == NT && NT <= PANEL_LANES);
    let n = out[0].len();
    assert!(out.iter().all(|o| o.len() == n) && w.len() >= n * rb);
    let nb = p.n_blocks;
    assert!(
        p.qs.len() >= NT * nb * 256
            && p.d.len() >= nb * PANEL_LANES
            && p.sums.len() >= nb * NT * 16
    );
    n
}

/// Token `t`'s 64 values of chunk `c` in a panel of `NT` tokens.
#[inline(always)]
unsafe fn chunk<const NT: usize>(xq: *const i8, c: usize, t: usize) -> __m512i {
    _mm512_loadu_si512(xq.add(64 * (c * NT + t)) as *const _)
}

/// Q4_K (`HIGH` false) / Q5_K (`HIGH` true), as `dot_k45`, for `NT` tokens.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,avx2,fma,f16c,bmi2")]
#[inline]
unsafe fn rows_k45<const HIGH: bool, const NT: usize>(
    w: &[u8],
    rb: usize,
    p: &ActPanel,
    out: &mut [&mut [f32]],
) {
    let n = check::<NT>(w, rb, p, out);
    let nb = p.n_blocks;
    let (xq, xd, xs) = (p.qs.as_ptr(), p.d.as_ptr(), p.sums.as_ptr());
    let bsz = if HIGH { 176 } else { 144 };
    let idx = [k45_pair_idx(0), k45_pair_idx(1)];
    let idx_m = _mm512_castsi256_si512(_mm256_setr_epi16(
        8, 8, 9, 9, 10, 10, 11, 11, 12, 12, 13, 13, 14, 14, 15, 15,
    ));
    for r in 0..n {
        let row = w.as_ptr().add(r * rb);
        let mut facc = [_mm512_setzero_ps(); NT];
        let mut macc = [_mm256_setzero_ps(); NT];
        for i in 0..nb {
            let b = row.add(bsz * i);
            prefetch_ahead::<PF_STREAM>(b, bsz);
            let sm = _mm512_cvtepu8_epi16(_mm256_zextsi128_si256(k4_scales_mins(b.add(4))));
            let qs = b.add(if HIGH { 48 } else { 16 });
            let mut hbits = if HIGH {
                _mm256_loadu_si256(b.add(16) as *const __m256i)
            } else {
                _mm256_setzero_si256()
            };
            let mut iacc = [_mm512_setzero_si512(); NT];
            for (p, ix) in idx.iter().enumerate() {
                let mut wa = k45_step::<HIGH>(qs, 2 * p, &mut hbits);
                let mut wb = k45_step::<HIGH>(qs, 2 * p + 1, &mut hbits);
                let mut sc = _mm512_permutexvar_epi16(*ix, sm);
                pin!(wa, wb, sc);
                for t in 0..NT {
                    let xv = chunk::<NT>(xq, 4 * i + 2 * p, t);
                    let xw = chunk::<NT>(xq, 4 * i + 2 * p + 1, t);
                    iacc[t] = pair_dot(iacc[t], wa, wb, xv, xw, sc);
                }
                for a in iacc.iter_mut() {
                    pin!(*a);
                }
            }
            let mins = _mm512_castsi512_si256(_mm512_permutexvar_epi16(idx_m, sm));
            // every token's d·xd and dmin·xd, as dot_k45's `dxd` lanes 0 and 1
            let (wd, wm) = (f16c(rd16(b)), f16c(rd16(b.add(2))));
            let xdv = _mm512_loadu_ps(xd.add(i * PANEL_LANES));
            let mut d = [0f32; PANEL_LANES];
            let mut dm = [0f32; PANEL_LANES];
            _mm512_storeu_ps(d.as_mut_ptr(), _mm512_mul_ps(_mm512_set1_ps(wd), xdv));
            _mm512_storeu_ps(dm.as_mut_ptr(), _mm512_mul_ps(_mm512_set1_ps(wm), xdv));
            for t in 0..NT {
                facc[t] =
                    _mm512_fmadd_ps(_mm512_cvtepi32_ps(iacc[t]), _mm512_set1_ps(d[t]), facc[t]);
                let bs = _mm256_loadu_si256(xs.add(16 * (i * NT + t)) as *const __m256i);
                let mprod = _mm256_madd_epi16(mins, bs);
                macc[t] =
                    _mm256_fmadd_ps(_mm256_cvtepi32_ps(mprod), _mm256_set1_ps(dm[t]), macc[t]);
            }
        }
        for t in 0..NT {
            *out[t].get_unchecked_mut(r) = _mm512_reduce_add_ps(facc[t]) - hsum256(macc[t]);
        }
    }
}

/// Q6_K, as `dot_q6k`, for `NT` tokens.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,avx2,fma,f16c,bmi2")]
#[inline]
unsafe fn rows_q6_k<const NT: usize>(w: &[u8], rb: usize, p: &ActPanel, out: &mut [&mut [f32]]) {
    let n = check::<NT>(w, rb, p, out);
    let nb = p.n_blocks;
    let (xq, xd, xs) = (p.qs.as_ptr(), p.d.as_ptr(), p.sums.as_ptr());
    let idx = [q6k_pair_idx(0), q6k_pair_idx(1)];
    for r in 0..n {
        let row = w.as_ptr().add(r * rb);
        let mut facc = [_mm512_setzero_ps(); NT];
        for i in 0..nb {
            let b = row.add(210 * i);
            prefetch_ahead::<PF_STREAM>(b, 210);
            let sc16 = _mm256_cvtepi8_epi16(_mm_loadu_si128(b.add(192) as *const __m128i));
            let sc = _mm512_castsi256_si512(sc16);
            let mut iacc = [_mm512_setzero_si512(); NT];
            for (nn, ix) in idx.iter().enumerate() {
                let [mut q12, mut q34] = q6k_half(b, nn);
                let mut s = _mm512_permutexvar_epi16(*ix, sc);
                pin!(q12, q34, s);
                for t in 0..NT {
                    let x12 = chunk::<NT>(xq, 4 * i + 2 * nn, t);
                    let x34 = chunk::<NT>(xq, 4 * i + 2 * nn + 1, t);
                    iacc[t] = pair_dot(iacc[t], q12, q34, x12, x34, s);
                }
                for a in iacc.iter_mut() {
                    pin!(*a);
                }
            }
            // every token's d·xd, as dot_q6k's `dv`
            let wd = f16c(rd16(b.add(208)));
            let mut d = [0f32; PANEL_LANES];
            let xdv = _mm512_loadu_ps(xd.add(i * PANEL_LANES));
            _mm512_storeu_ps(d.as_mut_ptr(), _mm512_mul_ps(_mm512_set1_ps(wd), xdv));
            for t in 0..NT {
                let bs = _mm256_loadu_si256(xs.add(16 * (i * NT + t)) as *const __m256i);
                let ia = q6k_offset(iacc[t], sc16, bs);
                facc[t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(ia), _mm512_set1_ps(d[t]), facc[t]);
            }
        }
        for t in 0..NT {
            *out[t].get_unchecked_mut(r) = _mm512_reduce_add_ps(facc[t]);
        }
    }
}

/// How far ahead the 32-value formats' tiles prefetch their rows (and
/// `PF_FAR` beyond): with the work per token cut to 4 `vpdpbusd` and 3
/// float operations per 8 blocks, the 8-token tile outran `PF_STREAM`
/// (hybrid-350m-like Q8_0, 8-sequence step on a Zen 5: 26.6–27.2 ms at 2 KB,
/// 23.0–23.9 at 4 KB, 22.2–24.7 at 8 KB).
const PF_B32: usize = 4096;

/// The 32-value formats (`KIND` as `dot_b32`'s, blocks of `BYTES`), as
/// `dot_b32`, for `NT` tokens; rows of a multiple of 256 values. Per group
/// of 8 blocks the weights' 4 steps are unpacked and transposed once
/// ([`transpose4`]) for all the tokens, so each token's exact half-block
/// dots come out of 4 `vpdpbusd` on its activations transposed the same way
/// in the panel ([`panel_b32`]), starting from its offset terms; then one
/// conversion and FMA per token ([`B32::finish`]; Q4_1, Q5_1: then
/// [`B32::min_term`]), as `dot_b32` does with the sums it adds up from its
/// natural-order products.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,avx2,fma,f16c,bmi2")]
#[inline]
unsafe fn rows_b32<const BYTES: usize, const KIND: u8, const NT: usize>(
    w: &[u8],
    rb: usize,
    p: &ActPanel,
    out: &mut [&mut [f32]],
) {
    assert!(p.nt == NT && out.len() == NT && NT <= PANEL_LANES);
    let n = out[0].len();
    assert!(out.iter().all(|o| o.len() == n) && w.len() >= n * rb);
    let nb = p.n_blocks;
    assert!(nb.is_multiple_of(8) && rb >= nb * BYTES);
    let ng = nb / 8;
    assert!(
        p.hq.len() >= NT * nb * 32 && p.hoff.len() >= NT * ng * 16 && p.hxd.len() >= NT * ng * 16
    );
    let (hq, ho, hx) = (p.hq.as_ptr(), p.hoff.as_ptr(), p.hxd.as_ptr());
    let c = B32::new::<BYTES, KIND>();
    for r in 0..n {
        let row = w.as_ptr().add(r * rb);
        let mut acc = [_mm512_setzero_ps(); NT];
        for g in 0..ng {
            let base = row.add(BYTES * 8 * g);
            prefetch_ahead::<PF_B32>(base, 8 * BYTES);
            let d16 = c.spread(c.d8(base));
            let m16 = if b32_min(KIND) {
                c.spread(c.m8(base))
            } else {
                d16
            };
            let mut wt = transpose4(std::array::from_fn(|k| c.step::<BYTES, KIND>(base, k)));
            pin!(wt[0], wt[1], wt[2], wt[3]);
            for (t, acc) in acc.iter_mut().enumerate() {
                // −128·Σx in the panel: Q4_0's offset is 8, Q5_0's 16 and
                // the mins' term takes −Σx (exact: Σx·128 / 16, / 8, / 128)
                let off = _mm512_loadu_si512(ho.add((t * ng + g) * 16) as *const _);
                let mut sums = match KIND {
                    1 => _mm512_srai_epi32::<4>(off),
                    3 => _mm512_srai_epi32::<3>(off),
                    4 | 5 => _mm512_setzero_si512(),
                    _ => off,
                };
                for (cc, wc) in wt.iter().enumerate() {
                    let xv = _mm512_loadu_si512(hq.add(((g * 4 + cc) * NT + t) * 64) as *const _);
                    sums = _mm512_dpbusd_epi32(sums, *wc, xv);
                }
                let xd16 = _mm512_loadu_ps(hx.add((t * ng + g) * 16));
                B32::finish(sums, _mm512_mul_ps(d16, xd16), acc);
                if b32_min(KIND) {
                    let nxs = _mm512_srai_epi32::<7>(off);
                    B32::min_term(nxs, _mm512_mul_ps(m16, xd16), acc);
                }
            }
        }
        for (t, acc) in acc.iter().enumerate() {
            *out[t].get_unchecked_mut(r) = _mm512_reduce_add_ps(*acc);
        }
    }
}

/// The panel [`rows_b32`] reads, for tokens `t0..t0 + nt` of `a` (Q8_0
/// activations, rows a multiple of 256 values; only these fields, the
/// others empty): per group of 8
/// blocks `g`, `hq[g][c][t]` the 64 values of [`transpose4`] `c` of the
/// token's 4 steps, `hoff[t][g]` the offset terms `−128 · Σx` in the
/// half-block lanes ([`B32::offset16`]), `hxd[t][g]` the scales spread
/// ([`B32::spread`]).
///
/// # Safety
/// The CPU has the AVX-512 level.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,avx2,fma,f16c,bmi2")]
pub(in super::super) unsafe fn panel_b32(a: &QuantAct, t0: usize, nt: usize) -> ActPanel {
    let nb = a.cols / 32;
    assert!((1..=PANEL_LANES).contains(&nt) && nb.is_multiple_of(8) && a.cols == nb * 32);
    assert!(a.qs.len() >= (t0 + nt) * nb * 32 && a.d.len() >= (t0 + nt) * nb);
    assert!(a.sums.len() >= (t0 + nt) * nb);
    let ng = nb / 8;
    let mut p = ActPanel {
        nt,
        n_blocks: nb,
        qs: Vec::new(),
        d: Vec::new(),
        sums: Vec::new(),
        hq: vec![0; nt * nb * 32],
        hoff: vec![0; nt * ng * 16],
        hxd: vec![0.0; nt * ng * 16],
        hxs: Vec::new(),
    };
    let c = B32::new::<34, 0>();
    for t in 0..nt {
        let q = a.qs.as_ptr().add((t0 + t) * nb * 32);
        for g in 0..ng {
            let x: [__m512i; 4] =
                std::array::from_fn(|k| _mm512_loadu_si512(q.add(256 * g + 64 * k) as *const _));
            for (cc, v) in transpose4(x).iter().enumerate() {
                _mm512_storeu_si512(
                    p.hq.as_mut_ptr().add(((g * 4 + cc) * nt + t) * 64) as *mut _,
                    *v,
                );
            }
            let at = (t0 + t) * nb + 8 * g;
            let xs8 = _mm256_cvtepi16_epi32(_mm_loadu_si128(a.sums.as_ptr().add(at) as *const _));
            _mm512_storeu_si512(
                p.hoff.as_mut_ptr().add((t * ng + g) * 16) as *mut _,
                c.offset16(xs8),
            );
            _mm512_storeu_ps(
                p.hxd.as_mut_ptr().add((t * ng + g) * 16),
                c.spread(_mm256_loadu_ps(a.d.as_ptr().add(at))),
            );
        }
    }
    p
}

/// Defines a `#[target_feature]` entry point `$name` that serves 1 to
/// [`MAX_TOKENS`] tokens by choosing the instantiation of `$kernel` for
/// their count.
macro_rules! tile_entry {
    ($name:ident, $kernel:ident $(, $c:expr)*) => {
        #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,avx2,fma,f16c,bmi2")]
        pub(in super::super) unsafe fn $name(
            w: &[u8],
            rb: usize,
            p: &ActPanel,
            out: &mut [&mut [f32]],
        ) {
            match p.nt {
                1 => $kernel::<$($c,)* 1>(w, rb, p, out),
                2 => $kernel::<$($c,)* 2>(w, rb, p, out),
                3 => $kernel::<$($c,)* 3>(w, rb, p, out),
                4 => $kernel::<$($c,)* 4>(w, rb, p, out),
                5 => $kernel::<$($c,)* 5>(w, rb, p, out),
                6 => $kernel::<$($c,)* 6>(w, rb, p, out),
                7 => $kernel::<$($c,)* 7>(w, rb, p, out),
                8 => $kernel::<$($c,)* 8>(w, rb, p, out),
                9 => $kernel::<$($c,)* 9>(w, rb, p, out),
                n => panic!("{}: unsupported token count {n}", stringify!($name)),
            }
        }
    };
}
tile_entry!(tile_q4_k, rows_k45, false);
tile_entry!(tile_q5_k, rows_k45, true);
tile_entry!(tile_q6_k, rows_q6_k);
tile_entry!(tile_q8_0, rows_b32, 34, 0);
tile_entry!(tile_q4_0, rows_b32, 18, 1);
tile_entry!(tile_iq4_nl, rows_b32, 18, 2);
tile_entry!(tile_q5_0, rows_b32, 22, 3);
tile_entry!(tile_q4_1, rows_b32, 20, 4);
tile_entry!(tile_q5_1, rows_b32, 24, 5);

#[cfg(test)]
mod tests {
    use super::super::super::act::QuantAct;
    use super::super::super::VecKernel;
    use crate::simd::{detected_level, SimdLevel};
    use crate::testutil::{random_weights, Rng};
    use coil_gguf::GgmlType;

    /// Each token's result from the tile kernels (1 to 9 tokens, row counts
    /// below and above a prefetch distance) equals the one-token dot kernel's
    /// bit for bit (batch invariance of decode).
    #[test]
    fn tiles_equal_one_token_each_bit_for_bit() {
        if detected_level() < SimdLevel::Avx512 {
            return;
        }
        for (ty, cols) in [
            (GgmlType::Q4_K, 512),
            (GgmlType::Q5_K, 768),
            (GgmlType::Q6_K, 512),
            (GgmlType::Q8_0, 512),
            (GgmlType::Q4_0, 768),
            (GgmlType::IQ4_NL, 256),
            (GgmlType::Q5_0, 512),
            (GgmlType::Q4_1, 768),
            (GgmlType::Q5_1, 256),
        ] {
            let (block, group) = match ty.block_size() {
                32 => (32, 32),
                _ => (256, 16),
            };
            for rows in [1, 5, 13] {
                let mut rng = Rng::new(11 + rows as u64);
                let data = random_weights(&mut rng, ty, rows, cols);
                let rb = data.len() / rows;
                let x = rng.vec(12 * cols);
                let Some(VecKernel::Quant(_, one, _)) = super::super::vec_kernel(ty) else {
                    panic!("{ty}: no AVX-512 dot kernel");
                };
                let tk = super::super::tile_kernel(ty).expect("tile kernel");
                let xa = match block {
                    32 => QuantAct::q8_0(&x, cols),
                    _ => QuantAct::q8_k(&x, cols),
                };
                let (nd, ns) = (cols / block, cols / group);
                for nt in 1..=tk.max_tokens {
                    // tokens 12 - nt .. 12: a panel that does not start at token 0
                    let t0 = 12 - nt;
                    let panel = tk.panel(&xa, t0, nt, block, block / group);
                    let mut ys = vec![vec![f32::NAN; rows]; nt];
                    let mut outs: Vec<&mut [f32]> =
                        ys.iter_mut().map(|y| y.as_mut_slice()).collect();
                    (tk.f)(&data, rb, &panel, &mut outs);
                    for (t, y) in ys.iter().enumerate() {
                        let tt = t0 + t;
                        let (q, d, s) = (
                            xa.qs_row(tt),
                            &xa.d[tt * nd..(tt + 1) * nd],
                            &xa.sums[tt * ns..(tt + 1) * ns],
                        );
                        for (r, g) in y.iter().enumerate() {
                            let want = one(&data[r * rb..(r + 1) * rb], q, d, s);
                            assert!(want.is_finite());
                            assert_eq!(
                                g.to_bits(),
                                want.to_bits(),
                                "{ty} {nt} tokens row {r} token {t}"
                            );
                        }
                    }
                }
            }
        }
    }
}
