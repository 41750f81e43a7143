//! Scalar row · activation dot products: the specification for the SIMD
//! versions. `row` is one weight row of `cols` values in the given format;
//! `xq`/`xd`/`xs` are one token's quantized activations (values, scales,
//! group sums) from [`super::act::QuantAct`].

use super::dequant::{iq4xs_scales, q3k_scales, rd_bf16, rd_f16, scale_min_k4, KVALUES_IQ4NL};

pub fn dot_f32(a: &[f32], b: &[f32]) -> f32 {
    // 8 partial sums: same association on every run, vectorizable.
    let mut acc = [0f32; 8];
    let ca = a.chunks_exact(8);
    let cb = b.chunks_exact(8);
    let (ra, rb) = (ca.remainder(), cb.remainder());
    for (x, y) in ca.zip(cb) {
        for i in 0..8 {
            acc[i] += x[i] * y[i];
        }
    }
    let mut s: f32 = acc.iter().sum();
    for (x, y) in ra.iter().zip(rb) {
        s += x * y;
    }
    s
}

pub fn dot_f32_bytes(row: &[u8], x: &[f32]) -> f32 {
    let mut s = 0f32;
    for (b, v) in row.chunks_exact(4).zip(x) {
        s += f32::from_le_bytes([b[0], b[1], b[2], b[3]]) * v;
    }
    s
}

pub fn dot_f16(row: &[u8], x: &[f32]) -> f32 {
    let mut s = 0f32;
    for (i, v) in x.iter().enumerate() {
        s += rd_f16(row, 2 * i) * v;
    }
    s
}

pub fn dot_bf16(row: &[u8], x: &[f32]) -> f32 {
    let mut s = 0f32;
    for (i, v) in x.iter().enumerate() {
        s += rd_bf16(row, 2 * i) * v;
    }
    s
}

#[inline]
fn idot(a: impl Iterator<Item = i32>, b: &[i8]) -> i32 {
    a.zip(b).map(|(a, &b)| a * b as i32).sum()
}

pub fn dot_q8_0(row: &[u8], xq: &[i8], xd: &[f32], _xs: &[i16]) -> f32 {
    let mut s = 0f32;
    for (i, b) in row.chunks_exact(34).enumerate() {
        let q = &xq[32 * i..32 * i + 32];
        let isum = idot(b[2..34].iter().map(|&v| v as i8 as i32), q);
        s += rd_f16(b, 0) * xd[i] * isum as f32;
    }
    s
}

pub fn dot_q4_0(row: &[u8], xq: &[i8], xd: &[f32], xs: &[i16]) -> f32 {
    let mut s = 0f32;
    for (i, b) in row.chunks_exact(18).enumerate() {
        let q = &xq[32 * i..32 * i + 32];
        let lo = idot(b[2..18].iter().map(|&v| (v & 0xF) as i32), &q[..16]);
        let hi = idot(b[2..18].iter().map(|&v| (v >> 4) as i32), &q[16..]);
        s += rd_f16(b, 0) * xd[i] * (lo + hi - 8 * xs[i] as i32) as f32;
    }
    s
}

/// Q5_0 (22 bytes: `d`, 32 fifth bits, 16 bytes of nibbles), weights
/// `d · (q − 16)`: `Σ = d·xd · (Σ q·xq − 16·xs)`.
pub fn dot_q5_0(row: &[u8], xq: &[i8], xd: &[f32], xs: &[i16]) -> f32 {
    let mut s = 0f32;
    for (i, b) in row.chunks_exact(22).enumerate() {
        let isum = idot(q5_values(u32_at(b, 2), &b[6..22]), &xq[32 * i..32 * i + 32]);
        s += rd_f16(b, 0) * xd[i] * (isum - 16 * xs[i] as i32) as f32;
    }
    s
}

/// Q5_1 (24 bytes: `d`, `m`, 32 fifth bits, nibbles), weights `d · q + m`.
pub fn dot_q5_1(row: &[u8], xq: &[i8], xd: &[f32], xs: &[i16]) -> f32 {
    let mut s = 0f32;
    for (i, b) in row.chunks_exact(24).enumerate() {
        let isum = idot(q5_values(u32_at(b, 4), &b[8..24]), &xq[32 * i..32 * i + 32]);
        s += rd_f16(b, 0) * xd[i] * isum as f32 + rd_f16(b, 2) * xd[i] * xs[i] as f32;
    }
    s
}

/// Q4_1 (20 bytes: `d`, `m`, nibbles), weights `d · q + m`.
pub fn dot_q4_1(row: &[u8], xq: &[i8], xd: &[f32], xs: &[i16]) -> f32 {
    let mut s = 0f32;
    for (i, b) in row.chunks_exact(20).enumerate() {
        let isum = idot(q5_values(0, &b[4..20]), &xq[32 * i..32 * i + 32]);
        s += rd_f16(b, 0) * xd[i] * isum as f32 + rd_f16(b, 2) * xd[i] * xs[i] as f32;
    }
    s
}

fn u32_at(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]])
}

/// The 32 unsigned values of a block: low nibbles are values 0..16, high
/// nibbles 16..32, bit `k` of `qh` the fifth bit of value `k`.
fn q5_values(qh: u32, qs: &[u8]) -> impl Iterator<Item = i32> + '_ {
    (0..32).map(move |k| {
        let nib = if k < 16 { qs[k] & 0xF } else { qs[k - 16] >> 4 };
        nib as i32 | ((qh >> k & 1) as i32) << 4
    })
}

pub fn dot_iq4_nl(row: &[u8], xq: &[i8], xd: &[f32], _xs: &[i16]) -> f32 {
    let mut s = 0f32;
    for (i, b) in row.chunks_exact(18).enumerate() {
        let q = &xq[32 * i..32 * i + 32];
        let lo = idot(
            b[2..18]
                .iter()
                .map(|&v| KVALUES_IQ4NL[(v & 0xF) as usize] as i32),
            &q[..16],
        );
        let hi = idot(
            b[2..18]
                .iter()
                .map(|&v| KVALUES_IQ4NL[(v >> 4) as usize] as i32),
            &q[16..],
        );
        s += rd_f16(b, 0) * xd[i] * (lo + hi) as f32;
    }
    s
}

/// K-quant activations: `xd` one scale per 256, `xs` sums per 16.
/// Q2_K (84 bytes: 16 scale bytes, 64 bytes of 2-bit values, `d`, `dmin`):
/// 16-value group `g` weighs `d · (sc_g & 15) · q − dmin · (sc_g >> 4)`,
/// so `Σ w·x = xd · (d · Σ_g sc·Σ q·xq − dmin · Σ_g m·xs_g)`. Group `g = 8n
/// + 2j + h` holds bits `2j..2j+2` of bytes `32n + 16h .. + 16`.
pub fn dot_q2_k(row: &[u8], xq: &[i8], xd: &[f32], xs: &[i16]) -> f32 {
    let mut s = 0f32;
    for (i, b) in row.chunks_exact(84).enumerate() {
        let q8 = &xq[256 * i..256 * i + 256];
        let bs = &xs[16 * i..16 * i + 16];
        let (mut acc, mut macc) = (0i32, 0i32);
        for g in 0..16 {
            let (n, j, h) = (g / 8, (g / 2) % 4, g % 2);
            let q = &b[16 + 32 * n + 16 * h..16 + 32 * n + 16 * h + 16];
            let isum = idot(
                q.iter().map(|&v| ((v >> (2 * j)) & 3) as i32),
                &q8[16 * g..16 * g + 16],
            );
            acc += (b[g] & 0xF) as i32 * isum;
            macc += (b[g] >> 4) as i32 * bs[g] as i32;
        }
        s += xd[i] * (rd_f16(b, 80) * acc as f32 - rd_f16(b, 82) * macc as f32);
    }
    s
}

/// Q3_K (110 bytes: 32 bytes of high bits, 64 bytes of 2-bit values, 12
/// bytes of 6-bit scales, `d`): value `l` of group `g = 8n + 2j + h` is
/// `d · sc_g · (q − 4·[high bit clear])` with `q` bits `2j..2j+2` of byte
/// `32 + 32n + 16h + l` and the high bit `4n + j` of byte `16h + l`.
pub fn dot_q3_k(row: &[u8], xq: &[i8], xd: &[f32], _xs: &[i16]) -> f32 {
    let mut s = 0f32;
    for (i, b) in row.chunks_exact(110).enumerate() {
        let q8 = &xq[256 * i..256 * i + 256];
        let sc = q3k_scales(&b[96..108]);
        let mut acc = 0i32;
        for g in 0..16 {
            let (n, j, h) = (g / 8, (g / 2) % 4, g % 2);
            let isum = idot(
                (0..16).map(|l| {
                    let q = (b[32 + 32 * n + 16 * h + l] >> (2 * j)) & 3;
                    let high = (b[16 * h + l] >> (4 * n + j)) & 1;
                    q as i32 - if high == 0 { 4 } else { 0 }
                }),
                &q8[16 * g..16 * g + 16],
            );
            acc += sc[g] as i32 * isum;
        }
        s += xd[i] * rd_f16(b, 108) * acc as f32;
    }
    s
}

pub fn dot_q4_k(row: &[u8], xq: &[i8], xd: &[f32], xs: &[i16]) -> f32 {
    let mut s = 0f32;
    for (i, b) in row.chunks_exact(144).enumerate() {
        let q8 = &xq[256 * i..256 * i + 256];
        let bs = &xs[16 * i..16 * i + 16];
        let scales = &b[4..16];
        let (mut acc, mut macc) = (0i32, 0i32);
        for j in 0..4 {
            let q = &b[16 + 32 * j..16 + 32 * j + 32];
            let (s1, m1) = scale_min_k4(2 * j, scales);
            let (s2, m2) = scale_min_k4(2 * j + 1, scales);
            let lo = idot(
                q.iter().map(|&v| (v & 0xF) as i32),
                &q8[64 * j..64 * j + 32],
            );
            let hi = idot(
                q.iter().map(|&v| (v >> 4) as i32),
                &q8[64 * j + 32..64 * j + 64],
            );
            acc += s1 as i32 * lo + s2 as i32 * hi;
            macc += m1 as i32 * (bs[4 * j] as i32 + bs[4 * j + 1] as i32)
                + m2 as i32 * (bs[4 * j + 2] as i32 + bs[4 * j + 3] as i32);
        }
        s += xd[i] * (rd_f16(b, 0) * acc as f32 - rd_f16(b, 2) * macc as f32);
    }
    s
}

pub fn dot_q5_k(row: &[u8], xq: &[i8], xd: &[f32], xs: &[i16]) -> f32 {
    let mut s = 0f32;
    for (i, b) in row.chunks_exact(176).enumerate() {
        let q8 = &xq[256 * i..256 * i + 256];
        let bs = &xs[16 * i..16 * i + 16];
        let scales = &b[4..16];
        let qh = &b[16..48];
        let (mut acc, mut macc) = (0i32, 0i32);
        for j in 0..4 {
            let ql = &b[48 + 32 * j..48 + 32 * j + 32];
            let (s1, m1) = scale_min_k4(2 * j, scales);
            let (s2, m2) = scale_min_k4(2 * j + 1, scales);
            let lo = idot(
                (0..32).map(|l| ((ql[l] & 0xF) | (((qh[l] >> (2 * j)) & 1) << 4)) as i32),
                &q8[64 * j..64 * j + 32],
            );
            let hi = idot(
                (0..32).map(|l| ((ql[l] >> 4) | (((qh[l] >> (2 * j + 1)) & 1) << 4)) as i32),
                &q8[64 * j + 32..64 * j + 64],
            );
            acc += s1 as i32 * lo + s2 as i32 * hi;
            macc += m1 as i32 * (bs[4 * j] as i32 + bs[4 * j + 1] as i32)
                + m2 as i32 * (bs[4 * j + 2] as i32 + bs[4 * j + 3] as i32);
        }
        s += xd[i] * (rd_f16(b, 0) * acc as f32 - rd_f16(b, 2) * macc as f32);
    }
    s
}

pub fn dot_q6_k(row: &[u8], xq: &[i8], xd: &[f32], xs: &[i16]) -> f32 {
    let mut s = 0f32;
    for (i, b) in row.chunks_exact(210).enumerate() {
        let q8 = &xq[256 * i..256 * i + 256];
        let bs = &xs[16 * i..16 * i + 16];
        let mut q = [0i32; 256];
        for n in 0..2 {
            let ql = &b[64 * n..64 * n + 64];
            let qh = &b[128 + 32 * n..128 + 32 * n + 32];
            for l in 0..32 {
                q[128 * n + l] = ((ql[l] & 0xF) | ((qh[l] & 3) << 4)) as i32;
                q[128 * n + l + 32] = ((ql[l + 32] & 0xF) | (((qh[l] >> 2) & 3) << 4)) as i32;
                q[128 * n + l + 64] = ((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) as i32;
                q[128 * n + l + 96] = ((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) as i32;
            }
        }
        let mut acc = 0i32;
        for g in 0..16 {
            let isum = idot(
                q[16 * g..16 * g + 16].iter().copied(),
                &q8[16 * g..16 * g + 16],
            );
            acc += (b[192 + g] as i8) as i32 * (isum - 32 * bs[g] as i32);
        }
        s += xd[i] * rd_f16(b, 208) * acc as f32;
    }
    s
}

pub fn dot_iq4_xs(row: &[u8], xq: &[i8], xd: &[f32], _xs: &[i16]) -> f32 {
    let mut s = 0f32;
    for (i, b) in row.chunks_exact(136).enumerate() {
        let q8 = &xq[256 * i..256 * i + 256];
        let ls = iq4xs_scales(b);
        let mut acc = 0i32;
        for (ib, l) in ls.iter().enumerate() {
            let qs = &b[8 + 16 * ib..8 + 16 * ib + 16];
            let lo = idot(
                qs.iter().map(|&v| KVALUES_IQ4NL[(v & 0xF) as usize] as i32),
                &q8[32 * ib..32 * ib + 16],
            );
            let hi = idot(
                qs.iter().map(|&v| KVALUES_IQ4NL[(v >> 4) as usize] as i32),
                &q8[32 * ib + 16..32 * ib + 32],
            );
            acc += l * (lo + hi);
        }
        s += xd[i] * rd_f16(b, 0) * acc as f32;
    }
    s
}
