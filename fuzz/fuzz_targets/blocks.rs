//! Every tensor block format on arbitrary bytes: byte 0 picks the type; the
//! rest is read as whole blocks and dequantized, and read as f32 values
//! (NaNs, infinities and subnormals included) and quantized, with the
//! importance weights the type takes made from the same bits. What must
//! hold: whole blocks always decode (no byte pattern is out of a format's
//! tables), quantization gives an error or blocks that decode, never a
//! panic.
#![no_main]

use coil_gguf::quant::{
    can_dequantize, can_quantize, can_quantize_weighted, dequantize_row, quantize_row_weighted,
};
use coil_gguf::GgmlType;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let [which, rest @ ..] = data else {
        return;
    };
    let ty = GgmlType::ALL[*which as usize % GgmlType::ALL.len()];
    let (bs, ts) = ty.block_layout();
    if can_dequantize(ty) {
        let n_blocks = rest.len() / ts;
        let mut y = vec![0f32; n_blocks * bs];
        dequantize_row(ty, &rest[..n_blocks * ts], &mut y).expect("whole blocks decode");
    }
    if can_quantize(ty) {
        let x: Vec<f32> = rest
            .chunks_exact(4)
            .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .collect();
        let n = x.len() / bs * bs;
        let x = &x[..n];
        let w: Vec<f32> = x.iter().map(|v| v.abs()).collect();
        let mut q = vec![0u8; n / bs * ts];
        let weights = can_quantize_weighted(ty).then_some(&w[..]);
        if quantize_row_weighted(ty, x, weights, &mut q).is_ok() {
            let mut back = vec![0f32; n];
            dequantize_row(ty, &q, &mut back).expect("what was written decodes");
        }
    }
});
