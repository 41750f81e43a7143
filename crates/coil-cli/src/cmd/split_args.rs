//! `--split-max-size` / `--split-max-tensors` of the commands that write a
//! model (`coil convert`, `coil quantize`), as llama.cpp's tools spell them.

use coil_gguf::gguf::split::parse_size;
use coil_gguf::SplitLimits;

#[derive(clap::Args, Clone, Debug, Default)]
pub struct SplitArgs {
    /// Write the model as parts of at most SIZE of tensor data each
    /// (`OUT-00001-of-0000n.gguf`, …, as llama-gguf-split names them), SIZE
    /// a whole number of M (10⁶ bytes) or G (10⁹ bytes), e.g. 2G.
    #[arg(long = "split-max-size", value_name = "SIZE", value_parser = parse_size)]
    pub max_size: Option<u64>,
    /// Write the model as parts of at most N tensors each.
    #[arg(long = "split-max-tensors", value_name = "N",
          value_parser = clap::value_parser!(u64).range(1..))]
    pub max_tensors: Option<u64>,
}

impl SplitArgs {
    pub fn limits(&self) -> SplitLimits {
        SplitLimits {
            max_bytes: self.max_size,
            max_tensors: self.max_tensors.map(|n| n as usize),
        }
    }
}

/// The files a writer made, for a message: one path, or the first and how
/// many parts.
pub fn files_written(files: &[std::path::PathBuf]) -> String {
    match files {
        [one] => one.display().to_string(),
        [first, ..] => format!(
            "{} (and the other {} parts)",
            first.display(),
            files.len() - 1
        ),
        [] => String::new(),
    }
}
