//! The original 32-element block formats: Q4_0, Q4_1, Q5_0, Q5_1, Q8_0.
//!
//! Layouts (little-endian; `d`, `m` are f16; element `j` of a block):
//!
//! | type | bytes | fields (in order)            | value of element j |
//! |------|-------|------------------------------|--------------------|
//! | Q4_0 | 18    | `d, qs[16]`                  | `(q_j − 8)·d`      |
//! | Q4_1 | 20    | `d, m, qs[16]`               | `q_j·d + m`        |
//! | Q5_0 | 22    | `d, qh: u32, qs[16]`         | `(q_j − 16)·d`     |
//! | Q5_1 | 24    | `d, m, qh: u32, qs[16]`      | `q_j·d + m`        |
//! | Q8_0 | 34    | `d, qs: [i8; 32]`            | `q_j·d`            |
//!
//! 4-bit parts: element `j < 16` is the low nibble of `qs[j]`, element
//! `j + 16` the high nibble of `qs[j]`. 5-bit formats take bit 4 of element
//! `j` from bit `j` of `qh`.
//!
//! Quantization is bit-identical to the `gguf` Python package (`gguf.quants`),
//! which mirrors ggml's reference C code:
//! - Q4_0/Q5_0: `max` = the element of largest magnitude (first one on ties),
//!   `d = max / -8` (`-16`), `q = min(15 (31), trunc(x·id + 8.5 (16.5)))`.
//! - Q4_1/Q5_1: `d = (max − min) / 15` (`31`), `q = min(15 (31), trunc((x − min)·id + 0.5))`.
//! - Q8_0: `d = max|x| / 127`, `q = round_half_away(x·id)`.
//! - always `id = if d == 0 { 0 } else { 1 / d }`, everything in f32, scales
//!   stored rounded to f16 (nearest even).
//! - float → integer casts behave like numpy's (and C's) on x86-64: a value
//!   that does not fit an i32 (±inf, NaN — which happens when `d` is a tiny
//!   f32 subnormal and `1 / d` overflows) becomes 0; others wrap to 8 bits.
//! - ±inf inputs are matched too. NaN inputs never panic, but the bytes are
//!   unspecified (numpy's NaN handling in max/min/argmax is not pinned down),
//!   as is the sign of a zero `m` when a block's minimum is both +0.0 and -0.0.

use super::float::{read_f16, write_f16};
use super::{blocks, blocks_mut};

pub const QK4_0: usize = 32;
pub const QK4_1: usize = 32;
pub const QK5_0: usize = 32;
pub const QK5_1: usize = 32;
pub const QK8_0: usize = 32;
/// Bytes per block of each format.
pub const Q4_0_BYTES: usize = 18;
pub const Q4_1_BYTES: usize = 20;
pub const Q5_0_BYTES: usize = 22;
pub const Q5_1_BYTES: usize = 24;
pub const Q8_0_BYTES: usize = 34;

// ---- dequantization ----

/// Decodes one Q4_0 block.
#[inline]
pub fn dequantize_block_q4_0(b: &[u8; Q4_0_BYTES], y: &mut [f32; QK4_0]) {
    let d = read_f16(b, 0);
    let qs = &b[2..18];
    for j in 0..16 {
        y[j] = ((qs[j] & 0x0f) as i32 - 8) as f32 * d;
        y[j + 16] = ((qs[j] >> 4) as i32 - 8) as f32 * d;
    }
}

/// Decodes one Q4_1 block.
#[inline]
pub fn dequantize_block_q4_1(b: &[u8; Q4_1_BYTES], y: &mut [f32; QK4_1]) {
    let d = read_f16(b, 0);
    let m = read_f16(b, 2);
    let qs = &b[4..20];
    for j in 0..16 {
        y[j] = (qs[j] & 0x0f) as f32 * d + m;
        y[j + 16] = (qs[j] >> 4) as f32 * d + m;
    }
}

/// Decodes one Q5_0 block.
#[inline]
pub fn dequantize_block_q5_0(b: &[u8; Q5_0_BYTES], y: &mut [f32; QK5_0]) {
    let d = read_f16(b, 0);
    let qh = u32::from_le_bytes([b[2], b[3], b[4], b[5]]);
    let qs = &b[6..22];
    for j in 0..16 {
        let h0 = (((qh >> j) & 1) << 4) as i32;
        let h1 = (((qh >> (j + 16)) & 1) << 4) as i32;
        y[j] = (((qs[j] & 0x0f) as i32 | h0) - 16) as f32 * d;
        y[j + 16] = (((qs[j] >> 4) as i32 | h1) - 16) as f32 * d;
    }
}

/// Decodes one Q5_1 block.
#[inline]
pub fn dequantize_block_q5_1(b: &[u8; Q5_1_BYTES], y: &mut [f32; QK5_1]) {
    let d = read_f16(b, 0);
    let m = read_f16(b, 2);
    let qh = u32::from_le_bytes([b[4], b[5], b[6], b[7]]);
    let qs = &b[8..24];
    for j in 0..16 {
        let h0 = ((qh >> j) & 1) << 4;
        let h1 = ((qh >> (j + 16)) & 1) << 4;
        y[j] = ((qs[j] & 0x0f) as u32 | h0) as f32 * d + m;
        y[j + 16] = ((qs[j] >> 4) as u32 | h1) as f32 * d + m;
    }
}

/// Decodes one Q8_0 block.
#[inline]
pub fn dequantize_block_q8_0(b: &[u8; Q8_0_BYTES], y: &mut [f32; QK8_0]) {
    let d = read_f16(b, 0);
    for (yj, &q) in y.iter_mut().zip(&b[2..34]) {
        *yj = q as i8 as f32 * d;
    }
}

// ---- quantization ----

/// numpy's `np.trunc(v).astype(np.uint8)` on x86-64: truncation through
/// i32, wrapping to 8 bits; out of i32 range (±inf) and NaN give 0.
/// (Casting truncates by itself, so no separate `trunc` — which would be a
/// libm call on baseline x86-64.)
#[inline]
fn np_trunc_u8(v: f32) -> u8 {
    if v > -2_147_483_904.0 && v < 2_147_483_648.0 {
        v as i32 as u8
    } else {
        0
    }
}

/// gguf's `np_roundf(v).astype(np.int8)` on x86-64: round half away from
/// zero, then the cast of [`np_trunc_u8`] (out of range and NaN give 0).
#[inline]
fn np_round_i8(v: f32) -> i8 {
    if !(v > -2_147_483_904.0 && v < 2_147_483_648.0) {
        return 0;
    }
    let t = v as i32; // toward zero
    let frac = v - t as f32; // exact
    let r = t
        .wrapping_add((frac >= 0.5) as i32)
        .wrapping_sub((frac <= -0.5) as i32);
    r as i8
}

/// numpy's `x.max()`: the first NaN if there is one.
#[inline]
fn np_max(x: &[f32]) -> f32 {
    let mut m = f32::NEG_INFINITY;
    for &v in x {
        if v.is_nan() {
            return v;
        }
        if v > m {
            m = v;
        }
    }
    m
}

/// numpy's `x.min()`: the first NaN if there is one. (Between +0.0 and -0.0
/// the first one wins, as in ggml; numpy leaves that choice unspecified.)
#[inline]
fn np_min(x: &[f32]) -> f32 {
    let mut m = f32::INFINITY;
    for &v in x {
        if v.is_nan() {
            return v;
        }
        if v < m {
            m = v;
        }
    }
    m
}

/// The element of largest magnitude, the first one on ties (numpy's
/// `take(argmax(abs(x)))`; the first NaN if there is one).
#[inline]
fn signed_absmax(x: &[f32]) -> f32 {
    let mut best = x.first().copied().unwrap_or(0.0);
    if best.is_nan() {
        return best;
    }
    let mut amax = best.abs();
    for &v in x.iter().skip(1) {
        if v.is_nan() {
            return v;
        }
        if v.abs() > amax {
            amax = v.abs();
            best = v;
        }
    }
    best
}

#[inline]
fn inverse(d: f32) -> f32 {
    if d == 0.0 {
        0.0
    } else {
        1.0 / d
    }
}

/// Encodes 32 values as one Q4_0 block.
pub fn quantize_block_q4_0(x: &[f32; QK4_0], b: &mut [u8; Q4_0_BYTES]) {
    let d = signed_absmax(x) / -8.0;
    let id = inverse(d);
    write_f16(b, 0, d);
    let q = |v: f32| np_trunc_u8(v * id + 8.5).min(15);
    for j in 0..16 {
        b[2 + j] = q(x[j]) | (q(x[j + 16]) << 4);
    }
}

/// Encodes 32 values as one Q4_1 block.
pub fn quantize_block_q4_1(x: &[f32; QK4_1], b: &mut [u8; Q4_1_BYTES]) {
    let max = np_max(x);
    let min = np_min(x);
    let d = (max - min) / 15.0;
    let id = inverse(d);
    write_f16(b, 0, d);
    write_f16(b, 2, min);
    let q = |v: f32| np_trunc_u8((v - min) * id + 0.5).min(15);
    for j in 0..16 {
        b[4 + j] = q(x[j]) | (q(x[j + 16]) << 4);
    }
}

/// Encodes 32 values as one Q5_0 block.
pub fn quantize_block_q5_0(x: &[f32; QK5_0], b: &mut [u8; Q5_0_BYTES]) {
    let d = signed_absmax(x) / -16.0;
    let id = inverse(d);
    write_f16(b, 0, d);
    let q = |v: f32| np_trunc_u8(v * id + 16.5).min(31);
    let mut qh = 0u32;
    for j in 0..16 {
        let (q0, q1) = (q(x[j]), q(x[j + 16]));
        b[6 + j] = (q0 & 0x0f) | (q1 << 4);
        qh |= ((q0 as u32 >> 4) << j) | ((q1 as u32 >> 4) << (j + 16));
    }
    b[2..6].copy_from_slice(&qh.to_le_bytes());
}

/// Encodes 32 values as one Q5_1 block.
pub fn quantize_block_q5_1(x: &[f32; QK5_1], b: &mut [u8; Q5_1_BYTES]) {
    let max = np_max(x);
    let min = np_min(x);
    let d = (max - min) / 31.0;
    let id = inverse(d);
    write_f16(b, 0, d);
    write_f16(b, 2, min);
    let q = |v: f32| np_trunc_u8((v - min) * id + 0.5).min(31);
    let mut qh = 0u32;
    for j in 0..16 {
        let (q0, q1) = (q(x[j]), q(x[j + 16]));
        b[8 + j] = (q0 & 0x0f) | (q1 << 4);
        qh |= ((q0 as u32 >> 4) << j) | ((q1 as u32 >> 4) << (j + 16));
    }
    b[4..8].copy_from_slice(&qh.to_le_bytes());
}

/// Encodes 32 values as one Q8_0 block.
pub fn quantize_block_q8_0(x: &[f32; QK8_0], b: &mut [u8; Q8_0_BYTES]) {
    let mut amax = 0.0f32;
    let mut nan = false;
    for &v in x {
        let a = v.abs();
        amax = if a > amax { a } else { amax };
        nan |= v.is_nan();
    }
    if nan {
        amax = f32::NAN;
    }
    let d = amax / 127.0;
    let id = inverse(d);
    write_f16(b, 0, d);
    for (o, &v) in b[2..34].iter_mut().zip(x.iter()) {
        *o = np_round_i8(v * id) as u8;
    }
}

// ---- rows (lengths checked by the caller) ----

macro_rules! rows {
    ($deq:ident, $q:ident, $dblock:ident, $qblock:ident, $bytes:expr, $qk:expr) => {
        pub(crate) fn $deq(src: &[u8], dst: &mut [f32]) {
            for (b, y) in blocks::<$bytes, u8>(src).zip(blocks_mut::<$qk, f32>(dst)) {
                $dblock(b, y);
            }
        }
        pub(crate) fn $q(src: &[f32], dst: &mut [u8]) {
            for (x, b) in blocks::<$qk, f32>(src).zip(blocks_mut::<$bytes, u8>(dst)) {
                $qblock(x, b);
            }
        }
    };
}

rows!(
    dequantize_q4_0,
    quantize_q4_0,
    dequantize_block_q4_0,
    quantize_block_q4_0,
    Q4_0_BYTES,
    QK4_0
);
rows!(
    dequantize_q4_1,
    quantize_q4_1,
    dequantize_block_q4_1,
    quantize_block_q4_1,
    Q4_1_BYTES,
    QK4_1
);
rows!(
    dequantize_q5_0,
    quantize_q5_0,
    dequantize_block_q5_0,
    quantize_block_q5_0,
    Q5_0_BYTES,
    QK5_0
);
rows!(
    dequantize_q5_1,
    quantize_q5_1,
    dequantize_block_q5_1,
    quantize_block_q5_1,
    Q5_1_BYTES,
    QK5_1
);
rows!(
    dequantize_q8_0,
    quantize_q8_0,
    dequantize_block_q8_0,
    quantize_block_q8_0,
    Q8_0_BYTES,
    QK8_0
);

#[cfg(test)]
mod tests {
    use super::*;

    fn ramp() -> [f32; 32] {
        let mut x = [0f32; 32];
        for (i, v) in x.iter_mut().enumerate() {
            *v = (i as f32 - 15.5) * 0.37;
        }
        x
    }

    fn max_err(x: &[f32; 32], y: &[f32; 32]) -> f32 {
        x.iter()
            .zip(y)
            .map(|(a, b)| (a - b).abs())
            .fold(0.0, f32::max)
    }

    #[test]
    fn round_trips_within_one_step() {
        let x = ramp(); // spans 11.47; |x| ≤ 5.74
        let mut y = [0f32; 32];

        let mut b = [0u8; Q4_0_BYTES];
        quantize_block_q4_0(&x, &mut b);
        dequantize_block_q4_0(&b, &mut y);
        assert!(max_err(&x, &y) <= 5.74 / 8.0 + 1e-2, "{}", max_err(&x, &y));

        let mut b = [0u8; Q4_1_BYTES];
        quantize_block_q4_1(&x, &mut b);
        dequantize_block_q4_1(&b, &mut y);
        assert!(max_err(&x, &y) <= 11.47 / 15.0 * 0.5 + 1e-2);

        let mut b = [0u8; Q5_0_BYTES];
        quantize_block_q5_0(&x, &mut b);
        dequantize_block_q5_0(&b, &mut y);
        assert!(max_err(&x, &y) <= 5.74 / 16.0 + 1e-2);

        let mut b = [0u8; Q5_1_BYTES];
        quantize_block_q5_1(&x, &mut b);
        dequantize_block_q5_1(&b, &mut y);
        assert!(max_err(&x, &y) <= 11.47 / 31.0 * 0.5 + 1e-2);

        let mut b = [0u8; Q8_0_BYTES];
        quantize_block_q8_0(&x, &mut b);
        dequantize_block_q8_0(&b, &mut y);
        assert!(max_err(&x, &y) <= 5.74 / 127.0 * 0.5 + 1e-2);
    }

    #[test]
    fn zeros_stay_zero() {
        let x = [0f32; 32];
        let mut y = [1f32; 32];
        let mut b = [0xffu8; Q8_0_BYTES];
        quantize_block_q8_0(&x, &mut b);
        assert_eq!(&b[..], &[0u8; Q8_0_BYTES][..]);
        dequantize_block_q8_0(&b, &mut y);
        assert_eq!(y, [0f32; 32]);
        let mut b = [0u8; Q4_0_BYTES];
        quantize_block_q4_0(&x, &mut b);
        // d = 0 / -8 = -0.0; all q = 8
        assert_eq!(&b[..2], &[0x00, 0x80]);
        assert!(b[2..].iter().all(|&q| q == 0x88));
    }

    #[test]
    fn non_finite_inputs_do_not_panic() {
        let mut x = ramp();
        x[3] = f32::INFINITY;
        x[9] = f32::NAN;
        let mut b = [0u8; Q5_1_BYTES];
        quantize_block_q5_1(&x, &mut b);
        let mut b = [0u8; Q8_0_BYTES];
        quantize_block_q8_0(&x, &mut b);
        let mut b = [0u8; Q4_0_BYTES];
        quantize_block_q4_0(&[1e-40; 32], &mut b);
        // 1/d overflows to -inf; numpy's cast gives 0
        assert!(b[2..].iter().all(|&q| q == 0));
    }

    #[test]
    fn np_casts() {
        assert_eq!(np_trunc_u8(300.7), 44);
        assert_eq!(np_trunc_u8(-3.2), 253);
        assert_eq!(np_trunc_u8(0.99), 0);
        assert_eq!(np_trunc_u8(f32::INFINITY), 0);
        assert_eq!(np_trunc_u8(f32::NEG_INFINITY), 0);
        assert_eq!(np_trunc_u8(f32::NAN), 0);
        assert_eq!(np_round_i8(f32::NAN), 0);
        assert_eq!(np_round_i8(f32::INFINITY), 0);
        assert_eq!(np_round_i8(-127.0), -127);
    }

    #[test]
    fn round_half_away_matches_f32_round() {
        let mut v = -300.0f32;
        while v < 300.0 {
            for x in [
                v,
                f32::from_bits(v.to_bits() + 1),
                f32::from_bits(v.to_bits().wrapping_sub(1)),
            ] {
                assert_eq!(np_round_i8(x), x.round() as i32 as i8, "{x}");
            }
            v += 0.125;
        }
        for x in [
            0.49999997f32,
            -0.49999997,
            0.5,
            -0.5,
            1.5,
            -2.5,
            8388607.5,
            8388609.0,
            2147483520.0,
            -2147483648.0,
        ] {
            assert_eq!(np_round_i8(x), x.round() as i64 as i8, "{x}");
        }
    }
}
