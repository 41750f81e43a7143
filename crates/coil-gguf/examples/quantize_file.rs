//! Quantizes a raw little-endian f32 file with coil's quantizers, for
//! comparisons with other implementations (`tools/kquant_rmse.py`).
//!
//!     cargo run --release -p coil-gguf --example quantize_file -- Q4_K in.f32 out.bin

use coil_gguf::{quant, GgmlType};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().collect();
    if args.len() != 4 {
        return Err("usage: quantize_file TYPE IN.f32 OUT.bin".into());
    }
    let ty = GgmlType::from_name(&args[1]).ok_or("unknown type")?;
    let bytes = std::fs::read(&args[2])?;
    let x: Vec<f32> = bytes
        .chunks_exact(4)
        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect();
    let q = quant::quantize(ty, &x)?;
    std::fs::write(&args[3], q)?;
    Ok(())
}
