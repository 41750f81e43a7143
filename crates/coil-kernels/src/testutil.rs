//! Deterministic random data for tests and benchmarks.

use coil_gguf::GgmlType;
use half::f16;

/// xorshift64* generator.
#[derive(Clone, Debug)]
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Self {
        Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1)
    }
    pub fn next_u64(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        self.0 = x;
        x.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
    /// Uniform in [-1, 1).
    pub fn f32(&mut self) -> f32 {
        ((self.next_u64() >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
    }
    pub fn vec(&mut self, n: usize) -> Vec<f32> {
        (0..n).map(|_| self.f32()).collect()
    }
    pub fn bytes(&mut self, n: usize) -> Vec<u8> {
        (0..n).map(|_| self.next_u64() as u8).collect()
    }
}

/// Random encoded weights of `ty`: random bytes with sane scale fields
/// (`rows` rows of `cols` values).
pub fn random_weights(rng: &mut Rng, ty: GgmlType, rows: usize, cols: usize) -> Vec<u8> {
    use GgmlType::*;
    let (bs, ts) = ty.block_layout();
    let n_blocks = rows * cols / bs;
    if ty == F32 {
        return rng
            .vec(rows * cols)
            .iter()
            .flat_map(|v| v.to_le_bytes())
            .collect();
    }
    if ty == F16 {
        return rng
            .vec(rows * cols)
            .iter()
            .flat_map(|v| f16::from_f32(*v).to_le_bytes())
            .collect();
    }
    if ty == BF16 {
        return rng
            .vec(rows * cols)
            .iter()
            .flat_map(|v| half::bf16::from_f32(*v).to_le_bytes())
            .collect();
    }
    let mut data = rng.bytes(n_blocks * ts);
    // (offset of an f16 scale, magnitude)
    let fields: &[(usize, f32)] = match ty {
        Q8_0 | Q4_0 | Q5_0 | IQ4_NL => &[(0, 0.05)],
        Q4_1 | Q5_1 => &[(0, 0.05), (2, 0.5)],
        Q4_K | Q5_K => &[(0, 0.01), (2, 0.01)],
        Q6_K => &[(208, 0.002)],
        Q2_K => &[(80, 0.02), (82, 0.02)],
        Q3_K => &[(108, 0.005)],
        IQ4_XS => &[(0, 0.001)],
        IQ2_XXS | IQ2_XS | IQ2_S | IQ3_XXS | IQ3_S | IQ1_S => &[(0, 0.01)],
        TQ1_0 => &[(52, 0.05)],
        TQ2_0 => &[(64, 0.05)],
        _ => &[],
    };
    for b in data.chunks_exact_mut(ts) {
        for &(off, mag) in fields {
            let v = f16::from_f32(rng.f32() * mag);
            b[off..off + 2].copy_from_slice(&v.to_le_bytes());
        }
        match ty {
            // the f16 `d` in the top nibbles of the four scale words
            IQ1_M => {
                let d = f16::from_f32(rng.f32() * 0.01).to_bits();
                for k in 0..4 {
                    let at = 48 + 2 * k;
                    let w = u16::from_le_bytes([b[at], b[at + 1]]) & 0x0fff;
                    let w = w | (d >> (4 * k) & 0xf) << 12;
                    b[at..at + 2].copy_from_slice(&w.to_le_bytes());
                }
            }
            // an exponent of 2^-10 .. 2^-2
            MXFP4 => b[0] = 118 + (rng.next_u64() % 9) as u8,
            _ => {}
        }
    }
    data
}
