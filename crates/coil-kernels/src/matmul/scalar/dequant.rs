//! Scalar block decoding for the weight formats the kernels handle natively
//! (ggml's layouts, bit-exact with ggml's `dequantize_row_*`). Formats not
//! listed here go through `coil_gguf::quant::dequantize_row`.

use coil_gguf::GgmlType;
use half::{bf16, f16};

pub const QK_K: usize = 256;

/// The 16 non-linear values of IQ4_NL / IQ4_XS.
pub const KVALUES_IQ4NL: [i8; 16] = [
    -127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113,
];

#[inline]
pub fn rd_f16(b: &[u8], off: usize) -> f32 {
    f16::from_le_bytes([b[off], b[off + 1]]).to_f32()
}

#[inline]
pub fn rd_bf16(b: &[u8], off: usize) -> f32 {
    bf16::from_le_bytes([b[off], b[off + 1]]).to_f32()
}

/// Whether [`dequant_row`] decodes `ty` itself.
pub fn native(ty: GgmlType) -> bool {
    use GgmlType::*;
    matches!(
        ty,
        F32 | F16
            | BF16
            | Q4_0
            | Q4_1
            | Q5_0
            | Q5_1
            | Q8_0
            | IQ4_NL
            | Q2_K
            | Q3_K
            | Q4_K
            | Q5_K
            | Q6_K
            | IQ4_XS
    )
}

/// Q4_K / Q5_K packed 6-bit scale and min of sub-block `j` (0..8).
#[inline]
pub fn scale_min_k4(j: usize, q: &[u8]) -> (u8, u8) {
    if j < 4 {
        (q[j] & 63, q[j + 4] & 63)
    } else {
        (
            (q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4),
            (q[j + 4] >> 4) | ((q[j] >> 6) << 4),
        )
    }
}

/// Q4_K / Q5_K: all eight 6-bit scales and mins of a block at once, from
/// its 12 packed bytes, as two little-endian words of eight bytes (byte `j`:
/// what [`scale_min_k4`] gives for `j`), with word operations instead of
/// eight branchy byte lookups.
#[inline(always)]
pub fn scales_mins_k4_words(q: &[u8]) -> (u64, u64) {
    const M6: u32 = 0x3f3f_3f3f;
    const M4: u32 = 0x0f0f_0f0f;
    const M2: u32 = 0x0303_0303;
    let w = |i: usize| u32::from_le_bytes([q[4 * i], q[4 * i + 1], q[4 * i + 2], q[4 * i + 3]]);
    let (a, b, c) = (w(0), w(1), w(2));
    // j < 4: the low six bits of bytes 0..4 (scales) and 4..8 (mins);
    // j >= 4: a nibble of bytes 8..12 below the top two bits of bytes 0..8.
    let sc_hi = (c & M4) | (((a >> 6) & M2) << 4);
    let mn_hi = ((c >> 4) & M4) | (((b >> 6) & M2) << 4);
    let join = |lo: u32, hi: u32| u64::from(lo) | u64::from(hi) << 32;
    (join(a & M6, sc_hi), join(b & M6, mn_hi))
}

/// [`scales_mins_k4_words`] as byte arrays: (scales, mins).
#[inline(always)]
pub fn scales_mins_k4(q: &[u8]) -> ([u8; 8], [u8; 8]) {
    let (s, m) = scales_mins_k4_words(q);
    (s.to_le_bytes(), m.to_le_bytes())
}

/// Q3_K: the 16 signed 6-bit scales (already minus 32).
#[inline]
pub fn q3k_scales(sc: &[u8]) -> [i8; 16] {
    const KMASK1: u32 = 0x0303_0303;
    const KMASK2: u32 = 0x0f0f_0f0f;
    let a0 = u32::from_le_bytes([sc[0], sc[1], sc[2], sc[3]]);
    let a1 = u32::from_le_bytes([sc[4], sc[5], sc[6], sc[7]]);
    let tmp = u32::from_le_bytes([sc[8], sc[9], sc[10], sc[11]]);
    let aux = [
        (a0 & KMASK2) | ((tmp & KMASK1) << 4),
        (a1 & KMASK2) | (((tmp >> 2) & KMASK1) << 4),
        ((a0 >> 4) & KMASK2) | (((tmp >> 4) & KMASK1) << 4),
        ((a1 >> 4) & KMASK2) | (((tmp >> 6) & KMASK1) << 4),
    ];
    let mut out = [0i8; 16];
    for (i, a) in aux.iter().enumerate() {
        for (k, b) in a.to_le_bytes().iter().enumerate() {
            out[i * 4 + k] = (*b as i8).wrapping_sub(32);
        }
    }
    out
}

/// IQ4_XS: the 8 sub-block scales (already minus 32).
#[inline]
pub fn iq4xs_scales(b: &[u8]) -> [i32; 8] {
    let sh = u16::from_le_bytes([b[2], b[3]]);
    let mut out = [0i32; 8];
    for (ib, o) in out.iter_mut().enumerate() {
        let lo = (b[4 + ib / 2] >> (4 * (ib % 2))) & 0xF;
        let hi = ((sh >> (2 * ib)) & 3) as u8;
        *o = (lo | (hi << 4)) as i32 - 32;
    }
    out
}

/// Decodes `dst.len()` elements from `src` (whole blocks of `ty`).
/// Returns false if `ty` is not a native format (nothing written then).
pub fn dequant_row(ty: GgmlType, src: &[u8], dst: &mut [f32]) -> bool {
    use GgmlType::*;
    let (bs, ts) = ty.block_layout();
    debug_assert_eq!(dst.len() % bs, 0);
    debug_assert!(src.len() >= dst.len() / bs * ts);
    let blocks = src.chunks_exact(ts).zip(dst.chunks_exact_mut(bs));
    match ty {
        F32 => {
            for (b, y) in blocks {
                y[0] = f32::from_le_bytes([b[0], b[1], b[2], b[3]]);
            }
        }
        F16 => {
            for (b, y) in blocks {
                y[0] = rd_f16(b, 0);
            }
        }
        BF16 => {
            for (b, y) in blocks {
                y[0] = rd_bf16(b, 0);
            }
        }
        Q8_0 => {
            for (b, y) in blocks {
                let d = rd_f16(b, 0);
                for j in 0..32 {
                    y[j] = d * (b[2 + j] as i8) as f32;
                }
            }
        }
        Q4_0 => {
            for (b, y) in blocks {
                let d = rd_f16(b, 0);
                for j in 0..16 {
                    let q = b[2 + j];
                    y[j] = d * ((q & 0xF) as i32 - 8) as f32;
                    y[j + 16] = d * ((q >> 4) as i32 - 8) as f32;
                }
            }
        }
        Q4_1 => {
            for (b, y) in blocks {
                let (d, m) = (rd_f16(b, 0), rd_f16(b, 2));
                for j in 0..16 {
                    let q = b[4 + j];
                    y[j] = d * (q & 0xF) as f32 + m;
                    y[j + 16] = d * (q >> 4) as f32 + m;
                }
            }
        }
        Q5_0 => {
            for (b, y) in blocks {
                let d = rd_f16(b, 0);
                let qh = u32::from_le_bytes([b[2], b[3], b[4], b[5]]);
                for j in 0..16 {
                    let h0 = (((qh >> j) << 4) & 0x10) as u8;
                    let h1 = ((qh >> (j + 12)) & 0x10) as u8;
                    let q = b[6 + j];
                    y[j] = d * (((q & 0xF) | h0) as i32 - 16) as f32;
                    y[j + 16] = d * (((q >> 4) | h1) as i32 - 16) as f32;
                }
            }
        }
        Q5_1 => {
            for (b, y) in blocks {
                let (d, m) = (rd_f16(b, 0), rd_f16(b, 2));
                let qh = u32::from_le_bytes([b[4], b[5], b[6], b[7]]);
                for j in 0..16 {
                    let h0 = (((qh >> j) << 4) & 0x10) as u8;
                    let h1 = ((qh >> (j + 12)) & 0x10) as u8;
                    let q = b[8 + j];
                    y[j] = d * ((q & 0xF) | h0) as f32 + m;
                    y[j + 16] = d * ((q >> 4) | h1) as f32 + m;
                }
            }
        }
        IQ4_NL => {
            for (b, y) in blocks {
                let d = rd_f16(b, 0);
                for j in 0..16 {
                    let q = b[2 + j];
                    y[j] = d * KVALUES_IQ4NL[(q & 0xF) as usize] as f32;
                    y[j + 16] = d * KVALUES_IQ4NL[(q >> 4) as usize] as f32;
                }
            }
        }
        Q2_K => {
            for (b, y) in blocks {
                let (d, dmin) = (rd_f16(b, 80), rd_f16(b, 82));
                let scales = &b[0..16];
                let mut is = 0;
                let mut yi = 0;
                for n in 0..2 {
                    let q = &b[16 + 32 * n..16 + 32 * n + 32];
                    for shift in [0u32, 2, 4, 6] {
                        for half in 0..2 {
                            let sc = scales[is];
                            is += 1;
                            let dl = d * (sc & 0xF) as f32;
                            let ml = dmin * (sc >> 4) as f32;
                            for l in 0..16 {
                                y[yi] = dl * ((q[l + 16 * half] >> shift) & 3) as f32 - ml;
                                yi += 1;
                            }
                        }
                    }
                }
            }
        }
        Q3_K => {
            for (b, y) in blocks {
                let hm = &b[0..32];
                let d_all = rd_f16(b, 108);
                let sc = q3k_scales(&b[96..108]);
                let mut is = 0;
                let mut yi = 0;
                let mut m = 1u8;
                for n in 0..2 {
                    let q = &b[32 + 32 * n..32 + 32 * n + 32];
                    for shift in [0u32, 2, 4, 6] {
                        for half in 0..2 {
                            let dl = d_all * sc[is] as f32;
                            is += 1;
                            for l in 0..16 {
                                let li = l + 16 * half;
                                let v = ((q[li] >> shift) & 3) as i32
                                    - if hm[li] & m != 0 { 0 } else { 4 };
                                y[yi] = dl * v as f32;
                                yi += 1;
                            }
                        }
                        m <<= 1;
                    }
                }
            }
        }
        Q4_K => {
            for (b, y) in blocks {
                let (d, dmin) = (rd_f16(b, 0), rd_f16(b, 2));
                let scales = &b[4..16];
                for j in 0..4 {
                    let q = &b[16 + 32 * j..16 + 32 * j + 32];
                    let (s1, m1) = scale_min_k4(2 * j, scales);
                    let (s2, m2) = scale_min_k4(2 * j + 1, scales);
                    let (d1, m1) = (d * s1 as f32, dmin * m1 as f32);
                    let (d2, m2) = (d * s2 as f32, dmin * m2 as f32);
                    for l in 0..32 {
                        y[64 * j + l] = d1 * (q[l] & 0xF) as f32 - m1;
                        y[64 * j + 32 + l] = d2 * (q[l] >> 4) as f32 - m2;
                    }
                }
            }
        }
        Q5_K => {
            for (b, y) in blocks {
                let (d, dmin) = (rd_f16(b, 0), rd_f16(b, 2));
                let scales = &b[4..16];
                let qh = &b[16..48];
                for j in 0..4 {
                    let ql = &b[48 + 32 * j..48 + 32 * j + 32];
                    let (s1, m1) = scale_min_k4(2 * j, scales);
                    let (s2, m2) = scale_min_k4(2 * j + 1, scales);
                    let (d1, m1) = (d * s1 as f32, dmin * m1 as f32);
                    let (d2, m2) = (d * s2 as f32, dmin * m2 as f32);
                    let (u1, u2) = (1u8 << (2 * j), 2u8 << (2 * j));
                    for l in 0..32 {
                        let h1 = if qh[l] & u1 != 0 { 16 } else { 0 };
                        let h2 = if qh[l] & u2 != 0 { 16 } else { 0 };
                        y[64 * j + l] = d1 * ((ql[l] & 0xF) + h1) as f32 - m1;
                        y[64 * j + 32 + l] = d2 * ((ql[l] >> 4) + h2) as f32 - m2;
                    }
                }
            }
        }
        Q6_K => {
            for (b, y) in blocks {
                let d = rd_f16(b, 208);
                for n in 0..2 {
                    let ql = &b[64 * n..64 * n + 64];
                    let qh = &b[128 + 32 * n..128 + 32 * n + 32];
                    let sc = &b[192 + 8 * n..192 + 8 * n + 8];
                    let yb = &mut y[128 * n..128 * n + 128];
                    for l in 0..32 {
                        let is = l / 16;
                        let q1 = ((ql[l] & 0xF) | ((qh[l] & 3) << 4)) as i32 - 32;
                        let q2 = ((ql[l + 32] & 0xF) | (((qh[l] >> 2) & 3) << 4)) as i32 - 32;
                        let q3 = ((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) as i32 - 32;
                        let q4 = ((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) as i32 - 32;
                        yb[l] = d * (sc[is] as i8) as f32 * q1 as f32;
                        yb[l + 32] = d * (sc[is + 2] as i8) as f32 * q2 as f32;
                        yb[l + 64] = d * (sc[is + 4] as i8) as f32 * q3 as f32;
                        yb[l + 96] = d * (sc[is + 6] as i8) as f32 * q4 as f32;
                    }
                }
            }
        }
        IQ4_XS => {
            for (b, y) in blocks {
                let d = rd_f16(b, 0);
                let ls = iq4xs_scales(b);
                for ib in 0..8 {
                    let dl = d * ls[ib] as f32;
                    let qs = &b[8 + 16 * ib..8 + 16 * ib + 16];
                    for j in 0..16 {
                        y[32 * ib + j] = dl * KVALUES_IQ4NL[(qs[j] & 0xF) as usize] as f32;
                        y[32 * ib + 16 + j] = dl * KVALUES_IQ4NL[(qs[j] >> 4) as usize] as f32;
                    }
                }
            }
        }
        _ => return false,
    }
    true
}
