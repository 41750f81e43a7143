//! The ternary formats TQ1_0 and TQ2_0 (BitNet b1.58, TriLM): every value is
//! `d·t` with `t` ∈ {−1, 0, 1} and one f16 `d` per block of 256. Both
//! directions; the quantizers are ggml's `quantize_row_tq{1,2}_0_ref`
//! (`d` = the block's largest magnitude, `t` = round(x/d)).
//!
//! Layouts (little-endian):
//!
//! - **TQ1_0** (54 bytes): `qs[48]` @0, `qh[4]` @48, `d` @52. Trits packed 5
//!   to a byte as a fixed-point fraction: the byte is ⌈256·v/243⌉ for the
//!   base-3 number `v` of its 5 trits (first trit most significant); trit `n`
//!   is read back as `((byte·3ⁿ mod 256)·3) >> 8`. Byte `m` of `qs[0..32]`
//!   holds values `m + 32n` (n < 5) of the first 160; byte `m` of `qs[32..48]`
//!   values `160 + m + 16n`; byte `j` of `qh` values `240 + j + 4n` (n < 4,
//!   the fifth trit 0).
//! - **TQ2_0** (66 bytes): `qs[64]` @0, `d` @64. Two bits per value, `t + 1`:
//!   bits `2l..2l+2` of byte `32h + m` are value `128h + 32l + m`.

use super::float::{read_f16, write_f16};
use super::kquants::QK_K;
use super::{blocks, blocks_mut};

pub const TQ1_0_BYTES: usize = 54;
pub const TQ2_0_BYTES: usize = 66;

const POW3: [u8; 6] = [1, 3, 9, 27, 81, 243];

/// Trit `n` (0, 1 or 2) of a TQ1_0 byte.
#[inline(always)]
fn trit(q: u8, n: usize) -> i32 {
    ((q.wrapping_mul(POW3[n]) as u16 * 3) >> 8) as i32
}

/// Decodes one TQ1_0 block.
pub fn dequantize_block_tq1_0(b: &[u8; TQ1_0_BYTES], y: &mut [f32; QK_K]) {
    let d = read_f16(b, 52);
    let mut out = y.iter_mut();
    let mut put = |t: i32| {
        if let Some(v) = out.next() {
            *v = (t - 1) as f32 * d;
        }
    };
    for (start, width) in [(0, 32), (32, 16)] {
        for n in 0..5 {
            for m in 0..width {
                put(trit(b[start + m], n));
            }
        }
    }
    for n in 0..4 {
        for j in 0..4 {
            put(trit(b[48 + j], n));
        }
    }
}

/// Decodes one TQ2_0 block.
pub fn dequantize_block_tq2_0(b: &[u8; TQ2_0_BYTES], y: &mut [f32; QK_K]) {
    let d = read_f16(b, 64);
    for h in 0..2 {
        for l in 0..4 {
            for m in 0..32 {
                let q = ((b[32 * h + m] >> (2 * l)) & 3) as i32;
                y[128 * h + 32 * l + m] = (q - 1) as f32 * d;
            }
        }
    }
}

/// `d` and `1/d` of a block: its largest magnitude, by ggml's
/// `MAX(amax, |x|)` (a NaN is taken, then passed by the next value).
fn block_scale(x: &[f32; QK_K]) -> (f32, f32) {
    let d = x
        .iter()
        .fold(0f32, |m, v| if m > v.abs() { m } else { v.abs() });
    (d, if d != 0.0 { 1.0 / d } else { 0.0 })
}

/// The low byte of ggml's `lroundf(x·id) + 1` (halves away from zero): 0,
/// 1 or 2 when `|x·id| ≤ 1`, as for finite input. Beyond that it follows
/// x86-64: `lroundf` of a value out of `long`'s range (or NaN) is
/// `LONG_MIN`, whose `+ 1` ends in the byte 1.
#[inline(always)]
fn code(x: f32, id: f32) -> u8 {
    let v = x * id;
    if v.abs() < 9.2e18 {
        (v.round() as i64 + 1) as u8
    } else {
        1
    }
}

/// Packs up to 5 codes, first most significant, as TQ1_0's fraction.
fn pack5(codes: impl Iterator<Item = u8>) -> u8 {
    let v = codes.fold(0u8, |q, c| q.wrapping_mul(3).wrapping_add(c));
    (v as u16 * 256).div_ceil(243) as u8
}

/// Encodes one TQ1_0 block.
pub fn quantize_block_tq1_0(x: &[f32; QK_K], y: &mut [u8; TQ1_0_BYTES]) {
    let (d, id) = block_scale(x);
    for m in 0..32 {
        y[m] = pack5((0..5).map(|n| code(x[m + 32 * n], id)));
    }
    for m in 0..16 {
        y[32 + m] = pack5((0..5).map(|n| code(x[160 + m + 16 * n], id)));
    }
    for j in 0..4 {
        // four trits and a fifth 0 in the least significant place
        let codes = (0..4).map(|n| code(x[240 + j + 4 * n], id)).chain([0]);
        y[48 + j] = pack5(codes);
    }
    write_f16(y, 52, d);
}

/// Encodes one TQ2_0 block.
pub fn quantize_block_tq2_0(x: &[f32; QK_K], y: &mut [u8; TQ2_0_BYTES]) {
    let (d, id) = block_scale(x);
    for h in 0..2 {
        for m in 0..32 {
            y[32 * h + m] = (0..4).fold(0u8, |q, l| {
                q.wrapping_add((code(x[128 * h + 32 * l + m], id) & 3) << (2 * l))
            });
        }
    }
    write_f16(y, 64, d);
}

pub(crate) fn dequantize_tq1_0(src: &[u8], dst: &mut [f32]) {
    for (b, y) in blocks::<TQ1_0_BYTES, u8>(src).zip(blocks_mut::<QK_K, f32>(dst)) {
        dequantize_block_tq1_0(b, y);
    }
}

pub(crate) fn dequantize_tq2_0(src: &[u8], dst: &mut [f32]) {
    for (b, y) in blocks::<TQ2_0_BYTES, u8>(src).zip(blocks_mut::<QK_K, f32>(dst)) {
        dequantize_block_tq2_0(b, y);
    }
}

pub(crate) fn quantize_tq1_0(src: &[f32], dst: &mut [u8]) {
    for (x, y) in blocks::<QK_K, f32>(src).zip(blocks_mut::<TQ1_0_BYTES, u8>(dst)) {
        quantize_block_tq1_0(x, y);
    }
}

pub(crate) fn quantize_tq2_0(src: &[f32], dst: &mut [u8]) {
    for (x, y) in blocks::<QK_K, f32>(src).zip(blocks_mut::<TQ2_0_BYTES, u8>(dst)) {
        quantize_block_tq2_0(x, y);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ternary_values_round_trip_exactly() {
        let x: [f32; QK_K] = std::array::from_fn(|i| ((i * 7 % 3) as f32 - 1.0) * 0.5);
        let mut y1 = [0u8; TQ1_0_BYTES];
        let mut y2 = [0u8; TQ2_0_BYTES];
        quantize_block_tq1_0(&x, &mut y1);
        quantize_block_tq2_0(&x, &mut y2);
        let mut z = [0f32; QK_K];
        dequantize_block_tq1_0(&y1, &mut z);
        assert_eq!(z, x);
        dequantize_block_tq2_0(&y2, &mut z);
        assert_eq!(z, x);
    }

    #[test]
    fn every_five_trit_byte_decodes_to_its_trits() {
        for v in 0..243u16 {
            let digits: Vec<u8> = (0..5).map(|n| ((v / 3u16.pow(4 - n)) % 3) as u8).collect();
            let q = pack5(digits.iter().copied());
            for (n, &t) in digits.iter().enumerate() {
                assert_eq!(trit(q, n), t as i32, "v {v} trit {n}");
            }
        }
    }
}
