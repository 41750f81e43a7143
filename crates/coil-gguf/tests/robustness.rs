//! Thousands of truncated and bit-flipped copies of real GGUF files: the
//! reader returns Ok or an error, never panics, and whatever it accepts can
//! be viewed without an out-of-bounds read.

use coil_gguf::{GgufFile, TensorInfo};
use std::path::PathBuf;

fn fixtures() -> Vec<(String, Vec<u8>)> {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures/models");
    let mut out = Vec::new();
    for arch in ["mamba2", "jamba", "nemotron_h_moe"] {
        let p = dir.join(arch).join("model.f16.gguf");
        let bytes = std::fs::read(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display()));
        out.push((arch.to_string(), bytes));
    }
    out
}

/// xorshift64*: a tiny deterministic generator (no extra dependency).
struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }
}

/// Touch everything an accepted file exposes.
fn exercise(f: &GgufFile) {
    for (_, v) in f.metadata().iter() {
        let _ = v.summary(4);
    }
    let infos: Vec<TensorInfo> = f.tensors().to_vec();
    for t in &infos {
        let v = f.view(t);
        assert_eq!(v.data.len() as u64, t.n_bytes);
        // Dequantize small tensors fully; this reads every byte of the view.
        if t.n_elements <= 4096 {
            let _ = v.to_f32();
        } else if let (Some(first), Some(last)) = (v.data.first(), v.data.last()) {
            std::hint::black_box((first, last));
        }
    }
}

fn header_len(bytes: &[u8]) -> usize {
    GgufFile::from_bytes(bytes.to_vec())
        .map(|f| f.data_offset() as usize)
        .unwrap_or(bytes.len())
}

#[test]
fn originals_parse() {
    for (name, bytes) in fixtures() {
        let f = GgufFile::from_bytes(bytes).unwrap_or_else(|e| panic!("{name}: {e}"));
        exercise(&f);
    }
}

#[test]
fn truncated_copies_never_panic() {
    let mut rng = Rng(0x9E37_79B9_7F4A_7C15);
    let mut errors = 0;
    let mut total = 0;
    for (_, bytes) in fixtures() {
        let hl = header_len(&bytes);
        for i in 0..700 {
            // Mostly cut inside the header, where parsing happens.
            let cut = if i % 4 == 0 {
                rng.below(bytes.len())
            } else {
                rng.below(hl + 1)
            };
            total += 1;
            match GgufFile::from_bytes(bytes[..cut].to_vec()) {
                Ok(f) => exercise(&f),
                Err(e) => {
                    errors += 1;
                    assert!(!e.to_string().is_empty());
                }
            }
        }
    }
    // Almost every cut loses data a tensor needs.
    assert!(errors * 10 > total * 9, "{errors} errors of {total}");
}

#[test]
fn bit_flipped_copies_never_panic() {
    let mut rng = Rng(0xD1B5_4A32_D192_ED03);
    let mut ok = 0;
    let mut err = 0;
    for (_, bytes) in fixtures() {
        let hl = header_len(&bytes);
        for _ in 0..1000 {
            let mut copy = bytes.clone();
            let flips = 1 + rng.below(8);
            for _ in 0..flips {
                let at = rng.below(hl);
                copy[at] ^= 1 << rng.below(8);
            }
            // Sometimes also overwrite a whole u64 with an extreme value.
            if rng.below(4) == 0 {
                let at = rng.below(hl.saturating_sub(8).max(1));
                let v = [u64::MAX, 1 << 62, 0, u32::MAX as u64][rng.below(4)];
                copy[at..at + 8].copy_from_slice(&v.to_le_bytes());
            }
            match GgufFile::from_bytes(copy) {
                Ok(f) => {
                    ok += 1;
                    exercise(&f)
                }
                Err(_) => err += 1,
            }
        }
    }
    // Both outcomes occur: flips in string bytes are harmless, flips in
    // counts and offsets are caught.
    assert!(ok > 0 && err > 0, "ok {ok}, err {err}");
}

/// Every block format on random bytes (no byte pattern is outside a
/// format's grids or tables) and every quantizer on random f32 bit
/// patterns, NaNs and infinities included: results or errors, never a
/// panic. (The `blocks` fuzz target does the same at length.)
#[test]
fn block_formats_take_any_bytes() {
    use coil_gguf::quant::{
        can_dequantize, can_quantize, can_quantize_weighted, dequantize_row, quantize_row_weighted,
    };
    use coil_gguf::GgmlType;
    let mut rng = Rng(0x5eed_1234_abcd_0001);
    for ty in GgmlType::ALL {
        let (bs, ts) = ty.block_layout();
        for round in 0..4 {
            let n_blocks = 1 + round * 3;
            let bytes: Vec<u8> = (0..n_blocks * ts).map(|_| rng.next() as u8).collect();
            if can_dequantize(ty) {
                let mut y = vec![0f32; n_blocks * bs];
                dequantize_row(ty, &bytes, &mut y).unwrap_or_else(|e| panic!("{ty}: {e}"));
            }
            if can_quantize(ty) {
                let x: Vec<f32> = (0..n_blocks * bs)
                    .map(|_| f32::from_bits(rng.next() as u32))
                    .collect();
                let w: Vec<f32> = x.iter().map(|v| v.abs()).collect();
                let weights = can_quantize_weighted(ty).then_some(&w[..]);
                let mut q = vec![0u8; n_blocks * ts];
                if quantize_row_weighted(ty, &x, weights, &mut q).is_ok() {
                    let mut y = vec![0f32; x.len()];
                    dequantize_row(ty, &q, &mut y).unwrap_or_else(|e| panic!("{ty}: {e}"));
                }
            }
        }
    }
}
