//! `coil convert HF_DIR -o OUT.gguf [--type f32|f16|bf16|q8_0]`.

use anyhow::{bail, Context, Result};
use coil_convert::{convert, ConvertOptions, OutType};
use std::io::IsTerminal;
use std::path::PathBuf;

#[derive(clap::Args)]
pub struct Args {
    /// The Hugging Face checkpoint folder (config.json + safetensors, or
    /// Mistral's params.json + consolidated.safetensors).
    dir: PathBuf,
    /// The GGUF file to write.
    #[arg(short, long)]
    output: PathBuf,
    /// Weight type: f32, f16, bf16 or q8_0 (norms, SSM A/D, conv and biases
    /// stay f32, as llama.cpp's converter does).
    #[arg(long = "type", default_value = "f16")]
    ty: String,
    /// general.name (default: the folder's name).
    #[arg(long)]
    name: Option<String>,
    /// No progress bar.
    #[arg(long)]
    quiet: bool,
    #[command(flatten)]
    split: super::split_args::SplitArgs,
    /// Leave out the model's multi-token-prediction (MTP / NextN) layers
    /// (kept by default: `--spec mtp` drafts with them).
    #[arg(long = "no-mtp")]
    no_mtp: bool,
}

pub fn run(a: Args) -> Result<()> {
    let Some(out_type) = OutType::parse(&a.ty) else {
        bail!("--type {:?}: expected f32, f16, bf16 or q8_0", a.ty);
    };
    let opts = ConvertOptions {
        out_type,
        name: a.name,
        progress: !a.quiet && std::io::stderr().is_terminal(),
        split: a.split.limits(),
        no_mtp: a.no_mtp,
    };
    let r = convert(&a.dir, &a.output, &opts)
        .with_context(|| format!("converting {}", a.dir.display()))?;
    eprintln!(
        "{} ({}) → {}: {} tensors, {} parameters",
        r.hf_arch,
        r.arch,
        super::split_args::files_written(&r.files),
        r.n_tensors,
        r.n_params
    );
    Ok(())
}
