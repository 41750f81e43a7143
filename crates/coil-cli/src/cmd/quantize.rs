//! `coil quantize IN.gguf OUT.gguf TYPE`.

use anyhow::{bail, Context, Result};
use coil_convert::{quantize, QuantMix, QuantizeOptions};
use std::io::IsTerminal;
use std::path::PathBuf;

#[derive(clap::Args)]
pub struct Args {
    /// The GGUF file to quantize (any type coil reads).
    input: PathBuf,
    /// The GGUF file to write.
    output: PathBuf,
    /// Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, Q2_K, Q3_K_S, Q3_K_M, Q3_K_L, Q4_K_S,
    /// Q4_K_M, Q5_K_S, Q5_K_M, Q6_K, IQ4_NL or IQ4_XS (llama.cpp's per-tensor
    /// mixtures; Q3_K, Q4_K, Q5_K mean the _M ones).
    #[arg(value_name = "TYPE")]
    ty: String,
    /// No progress bar.
    #[arg(long)]
    quiet: bool,
}

pub fn run(a: Args) -> Result<()> {
    let Some(mix) = QuantMix::parse(&a.ty) else {
        let names: Vec<&str> = QuantMix::ALL.iter().map(|m| m.name()).collect();
        bail!(
            "unknown quantization type {:?}: expected one of {}",
            a.ty,
            names.join(", ")
        );
    };
    let opts = QuantizeOptions {
        mix,
        progress: !a.quiet && std::io::stderr().is_terminal(),
    };
    let r = quantize(&a.input, &a.output, &opts)
        .with_context(|| format!("quantizing {}", a.input.display()))?;
    let types: Vec<String> = r.types.iter().map(|(t, n)| format!("{n} {t}")).collect();
    eprintln!(
        "{} → {} ({}): {:.1} MiB → {:.1} MiB; tensors: {}",
        a.input.display(),
        r.output.display(),
        mix.name(),
        r.bytes_in as f64 / (1 << 20) as f64,
        r.bytes_out as f64 / (1 << 20) as f64,
        types.join(", ")
    );
    Ok(())
}
