//! `coil quantize IN.gguf OUT.gguf TYPE`.

use anyhow::{bail, Context, Result};
use coil_convert::{quantize, QuantMix, QuantizeOptions, TensorTypeRule};
use coil_gguf::quant::can_quantize;
use coil_gguf::GgmlType;
use std::io::IsTerminal;
use std::path::PathBuf;

#[derive(clap::Args)]
pub struct Args {
    /// The GGUF file to quantize (any type coil reads).
    input: PathBuf,
    /// The GGUF file to write.
    output: PathBuf,
    /// Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, Q2_K, Q2_K_S, Q3_K_S, Q3_K_M, Q3_K_L,
    /// Q4_K_S, Q4_K_M, Q5_K_S, Q5_K_M, Q6_K, IQ4_NL, IQ4_XS, IQ3_M, IQ3_S,
    /// IQ3_XS, IQ3_XXS, IQ2_M, IQ2_S, IQ2_XS, IQ2_XXS, IQ1_M, IQ1_S, TQ1_0,
    /// TQ2_0 or MXFP4_MOE (llama.cpp's per-tensor mixtures; Q3_K, Q4_K, Q5_K
    /// mean the _M ones; IQ1_*, IQ2_*, IQ3_XXS and Q2_K_S need --imatrix).
    #[arg(value_name = "TYPE")]
    ty: String,
    /// No progress bar.
    #[arg(long)]
    quiet: bool,
    /// The type of output.weight (and of tied token embeddings), e.g. Q8_0
    /// or F16, instead of the mixture's choice (as llama-quantize's flag).
    #[arg(long, value_name = "TYPE")]
    output_tensor_type: Option<String>,
    /// The type of token_embd.weight, instead of the mixture's choice.
    #[arg(long, value_name = "TYPE")]
    token_embedding_type: Option<String>,
    /// Leave output.weight as it is in the input.
    #[arg(long)]
    leave_output_tensor: bool,
    /// Every quantizable tensor in the mixture's default type (no
    /// per-tensor rules; the shape fallbacks still apply).
    #[arg(long)]
    pure: bool,
    /// PATTERN=TYPE: tensors whose name matches the regular expression get
    /// TYPE (repeatable; the first match wins), e.g.
    /// `--tensor-type 'ffn_down=q6_k'`.
    #[arg(long, value_name = "PATTERN=TYPE")]
    tensor_type: Vec<String>,
    /// A file of PATTERN=TYPE rules separated by white space, applied after
    /// the --tensor-type ones (llama-quantize's flag).
    #[arg(long, value_name = "FILE")]
    tensor_type_file: Option<PathBuf>,
    /// An importance matrix (from `coil imatrix` or llama-imatrix, GGUF or
    /// legacy .dat): every tensor it has an entry for is quantized with its
    /// weights, as llama-quantize's flag does.
    #[arg(long, value_name = "FILE")]
    imatrix: Option<PathBuf>,
    #[command(flatten)]
    split: super::split_args::SplitArgs,
}

/// The `--tensor-type` rules, then those of `--tensor-type-file`.
fn tensor_rules(rules: &[String], file: Option<&std::path::Path>) -> Result<Vec<TensorTypeRule>> {
    let text = match file {
        Some(f) => std::fs::read_to_string(f)
            .with_context(|| format!("--tensor-type-file {}", f.display()))?,
        None => String::new(),
    };
    let from_file = text.split_whitespace().map(str::to_string);
    rules
        .iter()
        .cloned()
        .chain(from_file)
        .map(|r| TensorTypeRule::parse(&r).map_err(anyhow::Error::from))
        .collect()
}

/// A tensor type named on the command line: one coil can write.
fn tensor_type(flag: &str, name: &str) -> Result<GgmlType> {
    let ty = GgmlType::ALL
        .into_iter()
        .find(|t| t.name().eq_ignore_ascii_case(name));
    match ty {
        Some(t) if can_quantize(t) => Ok(t),
        _ => {
            let ok: Vec<&str> = GgmlType::ALL
                .into_iter()
                .filter(|&t| can_quantize(t))
                .map(|t| t.name())
                .collect();
            bail!(
                "{flag} {name:?}: not a type coil writes (one of {})",
                ok.join(", ")
            )
        }
    }
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
        progress: !a.quiet && std::io::stderr().is_terminal(),
        pure: a.pure,
        leave_output: a.leave_output_tensor,
        output_type: a
            .output_tensor_type
            .as_deref()
            .map(|n| tensor_type("--output-tensor-type", n))
            .transpose()?,
        token_embd_type: a
            .token_embedding_type
            .as_deref()
            .map(|n| tensor_type("--token-embedding-type", n))
            .transpose()?,
        tensor_types: tensor_rules(&a.tensor_type, a.tensor_type_file.as_deref())?,
        split: a.split.limits(),
        imatrix: match &a.imatrix {
            Some(p) => Some((
                p.display().to_string(),
                coil_convert::imatrix::Imatrix::read(p)?,
            )),
            None => None,
        },
        ..QuantizeOptions::new(mix)
    };
    let r = quantize(&a.input, &a.output, &opts)
        .with_context(|| format!("quantizing {}", a.input.display()))?;
    let types: Vec<String> = r.types.iter().map(|(t, n)| format!("{n} {t}")).collect();
    eprintln!(
        "{} → {} ({}): {:.1} MiB → {:.1} MiB; tensors: {}",
        a.input.display(),
        super::split_args::files_written(&r.files),
        mix.name(),
        r.bytes_in as f64 / (1 << 20) as f64,
        r.bytes_out as f64 / (1 << 20) as f64,
        types.join(", ")
    );
    if r.requantized > 0 {
        eprintln!(
            "note: {} tensors were already quantized in the input and carry both roundings; \
             quantize from the F16 / BF16 / F32 file for the best result",
            r.requantized
        );
    }
    Ok(())
}
