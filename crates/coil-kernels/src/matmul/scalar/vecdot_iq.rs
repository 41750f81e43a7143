//! Scalar row · activation dot products of the lattice and ternary formats
//! (IQ2_XXS, IQ2_XS, IQ2_S, IQ3_XXS, IQ3_S, IQ1_S, IQ1_M, TQ1_0, TQ2_0) and
//! of MXFP4: the specification for the SIMD versions.
//!
//! Every format here is, per group of 8 or 16 or 32 values, small integers
//! `q` times an integer scale `s` times one float per block: the sums
//! `Σ s·Σ q·qx` are exact in i32 and the floats are applied once per block
//! (per 32 values for MXFP4), as ggml's `ggml_vec_dot_*_q8_K` do. The
//! 256-value formats take Q8_K-style activations (`xd` one scale per 256,
//! `xs` sums per 16), MXFP4 Q8_0-style ones (one scale per 32).
//!
//! The values, in ggml's terms (`d` the block's f16; grids and sign
//! patterns of `coil_gguf::quant::grids`):
//!
//! | format  | value                             | integer form `s·q`, float      |
//! |---------|-----------------------------------|--------------------------------|
//! | IQ2_XXS | `d·(0.5 + ls)/4 · ±grid`          | `(2ls + 1)·±grid`, `d/8`       |
//! | IQ2_XS, IQ2_S | the same, `ls` per 16 values| the same                       |
//! | IQ3_XXS | `d·(0.5 + ls)/2 · ±grid`          | `(2ls + 1)·±grid`, `d/4`       |
//! | IQ3_S   | `d·(1 + 2ls) · ±grid`             | `(2ls + 1)·±grid`, `d`         |
//! | IQ1_S   | `d·(2ls + 1)·(grid ± 1/8)`        | `(2ls + 1)·(8·grid ± 1)`, `d/8`|
//! | IQ1_M   | the same, `ls` per 16 values, the `±` per 8 | the same         |
//! | TQ1_0, TQ2_0 | `d·t`, `t` ∈ {−1, 0, 1`}     | `t`, `d`                       |
//! | MXFP4   | `2^(e−128)·kvalue` (per 32)       | `kvalue`, `2^(e−128)`          |

use super::dequant::rd_f16;
use coil_gguf::quant::grids::{
    IQ1S_GRID, IQ2S_GRID, IQ2XS_GRID, IQ2XXS_GRID, IQ3S_GRID, IQ3XXS_GRID, KSIGNS_IQ2XS,
    KVALUES_MXFP4,
};

/// `Σ ±g[j]·x[j]` over 8 values: `g` the grid entry's bytes (unsigned
/// magnitudes), bit `j` of `signs` set: negated.
#[inline(always)]
fn signed8(g: [u8; 8], signs: u8, x: &[i8]) -> i32 {
    let mut s = 0;
    for j in 0..8 {
        let v = g[j] as i32 * x[j] as i32;
        s += if signs >> j & 1 != 0 { -v } else { v };
    }
    s
}

/// Two 4-vectors of a 3-bit grid as one group of 8.
#[inline(always)]
fn join4(a: u32, b: u32) -> [u8; 8] {
    (a as u64 | (b as u64) << 32).to_le_bytes()
}

fn u32_at(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]])
}

/// IQ2_XXS (66 bytes: `d`, then per sub-block of 32 a u32 of 4 grid
/// indices and a u32 of 4 sign indices and the scale).
pub fn dot_iq2_xxs(row: &[u8], xq: &[i8], xd: &[f32], _xs: &[i16]) -> f32 {
    let mut s = 0f32;
    for (i, b) in row.chunks_exact(66).enumerate() {
        let q8 = &xq[256 * i..256 * i + 256];
        let mut acc = 0i32;
        for ib in 0..8 {
            let q = &b[2 + 8 * ib..10 + 8 * ib];
            let aux = u32_at(q, 4);
            let mut isum = 0;
            for l in 0..4 {
                let signs = KSIGNS_IQ2XS[(aux >> (7 * l) & 127) as usize];
                let x = &q8[32 * ib + 8 * l..32 * ib + 8 * l + 8];
                isum += signed8(IQ2XXS_GRID[q[l] as usize].to_le_bytes(), signs, x);
            }
            acc += (2 * (aux >> 28) as i32 + 1) * isum;
        }
        s += 0.125 * rd_f16(b, 0) * xd[i] * acc as f32;
    }
    s
}

/// IQ2_XS (74 bytes: `d`, 32 u16 of a 9-bit grid index and a 7-bit sign
/// index, 8 bytes of two 4-bit scales).
pub fn dot_iq2_xs(row: &[u8], xq: &[i8], xd: &[f32], _xs: &[i16]) -> f32 {
    let mut s = 0f32;
    for (i, b) in row.chunks_exact(74).enumerate() {
        let q8 = &xq[256 * i..256 * i + 256];
        let mut acc = 0i32;
        for ib in 0..8 {
            let sc = b[66 + ib];
            for h in 0..2 {
                let mut isum = 0;
                for l in 2 * h..2 * h + 2 {
                    let at = 2 + 2 * (4 * ib + l);
                    let q = u16::from_le_bytes([b[at], b[at + 1]]);
                    let x = &q8[32 * ib + 8 * l..32 * ib + 8 * l + 8];
                    let g = IQ2XS_GRID[(q & 511) as usize].to_le_bytes();
                    isum += signed8(g, KSIGNS_IQ2XS[(q >> 9) as usize], x);
                }
                acc += (2 * (sc >> (4 * h) & 0xf) as i32 + 1) * isum;
            }
        }
        s += 0.125 * rd_f16(b, 0) * xd[i] * acc as f32;
    }
    s
}

/// IQ2_S (82 bytes: `d`, 32 low index bytes, 32 sign bytes, 8 bytes of
/// index bits 8–9, 8 bytes of two 4-bit scales).
pub fn dot_iq2_s(row: &[u8], xq: &[i8], xd: &[f32], _xs: &[i16]) -> f32 {
    let mut s = 0f32;
    for (i, b) in row.chunks_exact(82).enumerate() {
        let q8 = &xq[256 * i..256 * i + 256];
        let mut acc = 0i32;
        for ib in 0..8 {
            let (sc, qh) = (b[74 + ib], b[66 + ib] as usize);
            for h in 0..2 {
                let mut isum = 0;
                for l in 2 * h..2 * h + 2 {
                    let index = b[2 + 4 * ib + l] as usize | (qh << (8 - 2 * l) & 0x300);
                    let x = &q8[32 * ib + 8 * l..32 * ib + 8 * l + 8];
                    isum += signed8(IQ2S_GRID[index].to_le_bytes(), b[34 + 4 * ib + l], x);
                }
                acc += (2 * (sc >> (4 * h) & 0xf) as i32 + 1) * isum;
            }
        }
        s += 0.125 * rd_f16(b, 0) * xd[i] * acc as f32;
    }
    s
}

/// IQ3_XXS (98 bytes: `d`, 64 grid index bytes, then per sub-block a u32
/// of 4 sign indices and the scale).
pub fn dot_iq3_xxs(row: &[u8], xq: &[i8], xd: &[f32], _xs: &[i16]) -> f32 {
    let mut s = 0f32;
    for (i, b) in row.chunks_exact(98).enumerate() {
        let q8 = &xq[256 * i..256 * i + 256];
        let mut acc = 0i32;
        for ib in 0..8 {
            let qs = &b[2 + 8 * ib..10 + 8 * ib];
            let aux = u32_at(b, 66 + 4 * ib);
            let mut isum = 0;
            for l in 0..4 {
                let signs = KSIGNS_IQ2XS[(aux >> (7 * l) & 127) as usize];
                let g = join4(
                    IQ3XXS_GRID[qs[2 * l] as usize],
                    IQ3XXS_GRID[qs[2 * l + 1] as usize],
                );
                isum += signed8(g, signs, &q8[32 * ib + 8 * l..32 * ib + 8 * l + 8]);
            }
            acc += (2 * (aux >> 28) as i32 + 1) * isum;
        }
        s += 0.25 * rd_f16(b, 0) * xd[i] * acc as f32;
    }
    s
}

/// IQ3_S (110 bytes: `d`, 64 low index bytes, 8 bytes of 9th bits, 32 sign
/// bytes, 4 bytes of 4-bit scales).
pub fn dot_iq3_s(row: &[u8], xq: &[i8], xd: &[f32], _xs: &[i16]) -> f32 {
    let mut s = 0f32;
    for (i, b) in row.chunks_exact(110).enumerate() {
        let q8 = &xq[256 * i..256 * i + 256];
        let mut acc = 0i32;
        for ib in 0..8 {
            let qs = &b[2 + 8 * ib..10 + 8 * ib];
            let qh = b[66 + ib] as usize;
            let mut isum = 0;
            for l in 0..4 {
                let i1 = qs[2 * l] as usize | (qh << (8 - 2 * l) & 256);
                let i2 = qs[2 * l + 1] as usize | (qh << (7 - 2 * l) & 256);
                let g = join4(IQ3S_GRID[i1], IQ3S_GRID[i2]);
                let x = &q8[32 * ib + 8 * l..32 * ib + 8 * l + 8];
                isum += signed8(g, b[74 + 4 * ib + l], x);
            }
            let sc = b[106 + ib / 2] >> (4 * (ib % 2)) & 0xf;
            acc += (2 * sc as i32 + 1) * isum;
        }
        s += rd_f16(b, 0) * xd[i] * acc as f32;
    }
    s
}

/// `Σ (8·g[j] + δ)·x[j]` over 8 values of a {−1, 0, 1} grid entry, `δ` = ±1.
#[inline(always)]
fn iq1_group(index: usize, neg: bool, x: &[i8]) -> i32 {
    let g = IQ1S_GRID[index].to_le_bytes();
    let delta = if neg { -1 } else { 1 };
    (0..8)
        .map(|j| (8 * g[j] as i8 as i32 + delta) * x[j] as i32)
        .sum()
}

/// IQ1_S (50 bytes: `d`, 32 low index bytes, per sub-block a u16 of index
/// bits 8–10, the scale and the sign of δ).
pub fn dot_iq1_s(row: &[u8], xq: &[i8], xd: &[f32], _xs: &[i16]) -> f32 {
    let mut s = 0f32;
    for (i, b) in row.chunks_exact(50).enumerate() {
        let q8 = &xq[256 * i..256 * i + 256];
        let mut acc = 0i32;
        for ib in 0..8 {
            let qh = u16::from_le_bytes([b[34 + 2 * ib], b[35 + 2 * ib]]) as usize;
            let mut isum = 0;
            for l in 0..4 {
                let index = b[2 + 4 * ib + l] as usize | (qh >> (3 * l) & 7) << 8;
                let x = &q8[32 * ib + 8 * l..32 * ib + 8 * l + 8];
                isum += iq1_group(index, qh & 0x8000 != 0, x);
            }
            acc += (2 * (qh >> 12 & 7) as i32 + 1) * isum;
        }
        s += 0.125 * rd_f16(b, 0) * xd[i] * acc as f32;
    }
    s
}

/// IQ1_M (56 bytes: 32 low index bytes, 16 bytes of index bits 8–10 and δ
/// signs, 4 u16 of 3-bit scales per 16 values with the f16 `d` in their top
/// nibbles).
pub fn dot_iq1_m(row: &[u8], xq: &[i8], xd: &[f32], _xs: &[i16]) -> f32 {
    let mut s = 0f32;
    for (i, b) in row.chunks_exact(56).enumerate() {
        let q8 = &xq[256 * i..256 * i + 256];
        let sc: [u16; 4] =
            std::array::from_fn(|k| u16::from_le_bytes([b[48 + 2 * k], b[49 + 2 * k]]));
        let d = coil_gguf::quant::iq1::iq1_m_scale(sc);
        let mut acc = 0i32;
        for ib in 0..8 {
            let ls = sc[ib / 2] >> (6 * (ib % 2));
            for h in 0..2 {
                let mut isum = 0;
                for l in 2 * h..2 * h + 2 {
                    let hb = (b[32 + 2 * ib + l / 2] >> (4 * (l % 2))) as usize;
                    let index = b[4 * ib + l] as usize | (hb & 7) << 8;
                    let x = &q8[32 * ib + 8 * l..32 * ib + 8 * l + 8];
                    isum += iq1_group(index, hb & 8 != 0, x);
                }
                acc += (2 * (ls >> (3 * h) & 7) as i32 + 1) * isum;
            }
        }
        s += 0.125 * d * xd[i] * acc as f32;
    }
    s
}

/// TQ1_0 (54 bytes: 48 bytes of 5 trits, 4 of 4, `d` last): `Σ (t − 1)·x`
/// with `t` the stored 0..2.
pub fn dot_tq1_0(row: &[u8], xq: &[i8], xd: &[f32], xs: &[i16]) -> f32 {
    const POW3: [u8; 5] = [1, 3, 9, 27, 81];
    let trit = |q: u8, n: usize| ((q.wrapping_mul(POW3[n]) as u16 * 3) >> 8) as i32;
    let mut s = 0f32;
    for (i, b) in row.chunks_exact(54).enumerate() {
        let q8 = &xq[256 * i..256 * i + 256];
        let mut acc = 0i32;
        let mut k = 0;
        for (start, width, n_trits) in [(0, 32, 5), (32, 16, 5), (48, 4, 4)] {
            for n in 0..n_trits {
                for m in 0..width {
                    acc += trit(b[start + m], n) * q8[k] as i32;
                    k += 1;
                }
            }
        }
        let sum: i32 = xs[16 * i..16 * i + 16].iter().map(|&v| v as i32).sum();
        s += rd_f16(b, 52) * xd[i] * (acc - sum) as f32;
    }
    s
}

/// TQ2_0 (66 bytes: 64 bytes of 2-bit `t + 1`, `d` last).
pub fn dot_tq2_0(row: &[u8], xq: &[i8], xd: &[f32], xs: &[i16]) -> f32 {
    let mut s = 0f32;
    for (i, b) in row.chunks_exact(66).enumerate() {
        let q8 = &xq[256 * i..256 * i + 256];
        let mut acc = 0i32;
        for h in 0..2 {
            for l in 0..4 {
                for m in 0..32 {
                    let t = (b[32 * h + m] >> (2 * l) & 3) as i32;
                    acc += t * q8[128 * h + 32 * l + m] as i32;
                }
            }
        }
        let sum: i32 = xs[16 * i..16 * i + 16].iter().map(|&v| v as i32).sum();
        s += rd_f16(b, 64) * xd[i] * (acc - sum) as f32;
    }
    s
}

/// MXFP4 (17 bytes: an E8M0 exponent, 16 bytes of 4-bit indices into
/// [`KVALUES_MXFP4`], low nibbles values 0..16) with Q8_0-style activations.
pub fn dot_mxfp4(row: &[u8], xq: &[i8], xd: &[f32], _xs: &[i16]) -> f32 {
    let mut s = 0f32;
    for (i, b) in row.chunks_exact(17).enumerate() {
        let q = &xq[32 * i..32 * i + 32];
        let mut isum = 0i32;
        for j in 0..16 {
            isum += KVALUES_MXFP4[(b[1 + j] & 0xf) as usize] as i32 * q[j] as i32;
            isum += KVALUES_MXFP4[(b[1 + j] >> 4) as usize] as i32 * q[16 + j] as i32;
        }
        s += coil_gguf::quant::mxfp4::e8m0_to_f32_half(b[0]) * xd[i] * isum as f32;
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::matmul::act::QuantAct;
    use crate::testutil::{random_weights, Rng};
    use coil_gguf::GgmlType;

    type Dot = fn(&[u8], &[i8], &[f32], &[i16]) -> f32;

    /// Each dot against the f64 product of the dequantized row (by
    /// `coil_gguf::quant`, bit-exact to ggml) with the dequantized
    /// activations: the same up to f32 rounding.
    #[test]
    fn dots_match_the_dequantized_rows() {
        let formats: [(GgmlType, Dot); 10] = [
            (GgmlType::IQ2_XXS, dot_iq2_xxs),
            (GgmlType::IQ2_XS, dot_iq2_xs),
            (GgmlType::IQ2_S, dot_iq2_s),
            (GgmlType::IQ3_XXS, dot_iq3_xxs),
            (GgmlType::IQ3_S, dot_iq3_s),
            (GgmlType::IQ1_S, dot_iq1_s),
            (GgmlType::IQ1_M, dot_iq1_m),
            (GgmlType::TQ1_0, dot_tq1_0),
            (GgmlType::TQ2_0, dot_tq2_0),
            (GgmlType::MXFP4, dot_mxfp4),
        ];
        let mut rng = Rng::new(5);
        for (ty, dot) in formats {
            let cols = 768;
            let w = random_weights(&mut rng, ty, 1, cols);
            let mut wf = vec![0f32; cols];
            coil_gguf::quant::dequantize_row(ty, &w, &mut wf).unwrap();
            let x = rng.vec(cols);
            let a = if ty.block_size() == 32 {
                QuantAct::q8_0(&x, cols)
            } else {
                QuantAct::q8_k(&x, cols)
            };
            let block = cols / a.d.len();
            let (mut want, mut mag) = (0f64, 0f64);
            for (c, &w) in wf.iter().enumerate() {
                let xv = a.qs[c] as f64 * a.d[c / block] as f64;
                want += w as f64 * xv;
                mag += (w as f64 * xv).abs();
            }
            let got = dot(&w, &a.qs, &a.d, &a.sums) as f64;
            assert!(
                (got - want).abs() <= 1e-5 * mag + 1e-9,
                "{ty}: {got} vs {want} (mag {mag})"
            );
        }
    }
}
