//! The conversion pipeline: config → architecture plan → metadata →
//! streamed tensor data.

use crate::arch::{self, Ctx, Kv};
use crate::config::{read_json, Config};
use crate::error::{ConvertError, Result};
use crate::plan::{output_type, OutTensor};
use crate::safetensors_src::Checkpoint;
use crate::tokenizer;
use coil_gguf::{GgmlType, Metadata, SplitLimits, SplitWriter, TensorSpec, Value};
use std::path::{Path, PathBuf};

/// The element type of the converted weights (`--type`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum OutType {
    F32,
    F16,
    Bf16,
    Q8_0,
}

impl OutType {
    pub fn parse(s: &str) -> Option<OutType> {
        Some(match s.to_ascii_lowercase().as_str() {
            "f32" => OutType::F32,
            "f16" => OutType::F16,
            "bf16" => OutType::Bf16,
            "q8_0" => OutType::Q8_0,
            _ => return None,
        })
    }

    pub fn ggml(self) -> GgmlType {
        match self {
            OutType::F32 => GgmlType::F32,
            OutType::F16 => GgmlType::F16,
            OutType::Bf16 => GgmlType::BF16,
            OutType::Q8_0 => GgmlType::Q8_0,
        }
    }

    /// llama.cpp's `LlamaFileType` number (`general.file_type`).
    pub fn file_type(self) -> u32 {
        match self {
            OutType::F32 => 0,
            OutType::F16 => 1,
            OutType::Q8_0 => 7,
            OutType::Bf16 => 32,
        }
    }
}

/// Options of [`convert`].
#[derive(Clone, Debug)]
pub struct ConvertOptions {
    pub out_type: OutType,
    /// `general.name`; default: the input folder's name in title case, as
    /// llama.cpp's converter does.
    pub name: Option<String>,
    /// Draw a progress bar on stderr.
    pub progress: bool,
    /// `--split-max-size` / `--split-max-tensors`: write llama.cpp's split
    /// parts (`OUT-00001-of-0000n.gguf`, …) of at most this much tensor
    /// data / this many tensors each.
    pub split: SplitLimits,
    /// Leave out the multi-token-prediction (NextN / MTP) layers a
    /// checkpoint carries (llama.cpp's `--no-mtp`); by default they are
    /// written after the trunk as `blk.N.nextn.*` blocks.
    pub no_mtp: bool,
}

impl Default for ConvertOptions {
    fn default() -> Self {
        ConvertOptions {
            out_type: OutType::F16,
            name: None,
            progress: false,
            split: SplitLimits::default(),
            no_mtp: false,
        }
    }
}

/// What [`convert`] wrote.
#[derive(Clone, Debug)]
pub struct ConvertReport {
    pub hf_arch: String,
    pub arch: String,
    pub n_tensors: usize,
    pub n_params: u64,
    /// The file written (the first part of a split output).
    pub output: PathBuf,
    /// Every file written: `output` alone, or every part in order.
    pub files: Vec<PathBuf>,
}

/// Python's `str.title()` for the simple names folder names are, plus
/// llama.cpp's rule of leaving versions, numbers and acronyms alone.
fn id_to_title(s: &str) -> String {
    s.trim()
        .replace('-', " ")
        .split_whitespace()
        .map(|w| {
            let lower = w.chars().all(|c| !c.is_uppercase());
            let versionish = w.starts_with(|c: char| c.is_ascii_digit())
                || (w.starts_with('v')
                    && w[1..].chars().next().is_some_and(|c| c.is_ascii_digit()));
            if lower && !versionish {
                let mut out = String::new();
                let mut prev_alpha = false;
                for c in w.chars() {
                    if c.is_alphabetic() {
                        if prev_alpha {
                            out.extend(c.to_lowercase());
                        } else {
                            out.extend(c.to_uppercase());
                        }
                        prev_alpha = true;
                    } else {
                        out.push(c);
                        prev_alpha = false;
                    }
                }
                out
            } else {
                w.to_string()
            }
        })
        .collect::<Vec<_>>()
        .join(" ")
}

/// gguf-py's `model_weight_count_rounded_notation`.
fn rounded_count(n: u64, min_digits: usize) -> String {
    let n = n as f64;
    let (scaled, suffix) = if n > 1e12 {
        (n * 1e-12, "T")
    } else if n > 1e9 {
        (n * 1e-9, "B")
    } else if n > 1e6 {
        (n * 1e-6, "M")
    } else {
        (n * 1e-3, "K")
    };
    let rounded = format!("{}", scaled.round() as u64);
    let digits = rounded.trim_start_matches('0').len();
    let fix = min_digits.saturating_sub(digits);
    format!("{scaled:.fix$}{suffix}")
}

/// gguf-py's parameter count and size label (`6x226K` for MoE models).
pub(crate) fn size_label(tensors: &[(String, Vec<u64>)]) -> (u64, String) {
    let (mut total, mut shared, mut expert) = (0u64, 0u64, 0u64);
    let (mut expert_sum, mut n_expert_tensors) = (0u64, 0u64);
    for (name, dims) in tensors {
        let size: u64 = dims.iter().product();
        if name.contains("_exps.") && dims.len() >= 3 {
            // dims are ggml order; the expert count is numpy's shape[-3] = ne2
            // (shape[-2] = ne1 for biases).
            let count = if name.contains(".bias") {
                dims[1]
            } else {
                dims[2]
            };
            if let Some(per) = size.checked_div(count) {
                expert += per;
                expert_sum += count;
                n_expert_tensors += 1;
            }
        } else {
            shared += size;
        }
        total += size;
    }
    let count = expert_sum.checked_div(n_expert_tensors).unwrap_or(0);
    let label = if count > 0 {
        format!("{count}x{}", rounded_count(shared + expert, 2))
    } else {
        rounded_count(total, 2)
    };
    (total, label)
}

/// Sampling defaults from `generation_config.json` (`general.sampling.*`).
fn sampling_keys(dir: &Path, md: &mut Metadata) {
    let Ok(gen) = read_json(&dir.join("generation_config.json")) else {
        return;
    };
    let int = |k: &str| {
        gen.get(k)
            .and_then(|v| v.as_u64())
            .and_then(|v| i32::try_from(v).ok())
    };
    let float = |k: &str| gen.get(k).and_then(crate::config::as_f64);
    if let Some(v) = int("top_k") {
        md.insert("general.sampling.top_k", Value::I32(v));
    }
    if let Some(v) = float("top_p") {
        md.insert("general.sampling.top_p", Value::F32(v as f32));
    }
    if let Some(v) = float("min_p") {
        md.insert("general.sampling.min_p", Value::F32(v as f32));
    }
    if let Some(v) = float("temperature") {
        md.insert("general.sampling.temp", Value::F32(v as f32));
    }
    if let Some(v) = float("repetition_penalty") {
        md.insert("general.sampling.penalty_repeat", Value::F32(v as f32));
    }
}

/// The HF architecture, its config, and whether the layout is Mistral's.
fn load_config(dir: &Path) -> Result<(String, Config, bool)> {
    let cfg_path = dir.join("config.json");
    if cfg_path.is_file() {
        let cfg = Config::load(&cfg_path)?;
        let arch = cfg
            .get("architectures")
            .and_then(|a| a.as_array())
            .and_then(|a| a.first())
            .and_then(|a| a.as_str())
            .ok_or_else(|| {
                ConvertError::config(
                    "architectures",
                    "config.json has no \"architectures\" list naming the model class",
                )
            })?
            .to_string();
        return Ok((arch, cfg, false));
    }
    let params = dir.join("params.json");
    if params.is_file() {
        let cfg = Config::load(&params)?;
        // Mistral's own layout: Mamba-Codestral carries SSM settings, the
        // rest are Llama-style transformers.
        let arch = if cfg.contains("ssm_cfg") || cfg.contains("d_state") || cfg.contains("n_groups")
        {
            "Mamba2ForCausalLM"
        } else {
            "MistralForCausalLM"
        };
        return Ok((arch.to_string(), cfg, true));
    }
    if !dir.is_dir() {
        return Err(ConvertError::Io {
            path: dir.to_path_buf(),
            source: std::io::Error::new(std::io::ErrorKind::NotFound, "no such folder"),
        });
    }
    Err(ConvertError::NoArch {
        path: dir.to_path_buf(),
    })
}

/// Converts the Hugging Face checkpoint in `dir` to a GGUF file at `out`.
pub fn convert(dir: &Path, out: &Path, opts: &ConvertOptions) -> Result<ConvertReport> {
    let (hf_arch, cfg, mistral) = load_config(dir)?;
    // Fail on the architecture before touching the weights.
    if !arch::SUPPORTED.contains(&hf_arch.as_str()) && hf_arch != "MambaLMHeadModel" {
        return Err(ConvertError::UnsupportedArch {
            arch: hf_arch,
            supported: arch::SUPPORTED.join(", "),
        });
    }
    let ck = Checkpoint::open_dir(dir, if mistral { "consolidated" } else { "model" })?;
    let ctx = Ctx {
        cfg: &cfg,
        ck: &ck,
        file_type: opts.out_type.file_type(),
        mistral,
        no_mtp: opts.no_mtp,
    };
    let mut conv = arch::for_arch(&hf_arch, &ctx)?;
    let mut plan: Vec<OutTensor> = Vec::new();
    conv.extra(&mut plan)?;
    for t in ck.tensors() {
        if arch::skipped(&t.name) {
            continue;
        }
        let bid = arch::block_id(&t.name);
        conv.tensor(t, bid, &mut plan)?;
    }
    conv.finish(&mut plan)?;
    let planned: std::collections::HashSet<&str> = plan.iter().map(|t| t.name.as_str()).collect();
    if let Some(missing) = conv
        .required()
        .into_iter()
        .find(|n| !planned.contains(n.as_str()))
    {
        return Err(ConvertError::MissingTensor {
            hint: format!(" (GGUF name; no tensor of {} maps to it)", dir.display()),
            name: missing,
        });
    }
    if let Some(dup) = first_duplicate(&plan) {
        return Err(ConvertError::tensor(
            dup,
            "two checkpoint tensors map to this GGUF name",
        ));
    }

    // Metadata, in llama.cpp's order.
    let arch_name = conv.arch().to_string();
    let mut md = Metadata::new();
    md.insert("general.architecture", Value::String(arch_name.clone()));
    md.insert("general.type", Value::String("model".into()));
    sampling_keys(dir, &mut md);
    let name = match &opts.name {
        Some(n) => n.clone(),
        None => {
            let folder = std::fs::canonicalize(dir)
                .ok()
                .and_then(|p| p.file_name().map(|n| n.to_string_lossy().into_owned()))
                .unwrap_or_else(|| "model".into());
            id_to_title(&folder)
        }
    };
    md.insert("general.name", Value::String(name));
    let shapes: Vec<(String, Vec<u64>)> = plan.iter().map(|t| (t.name.clone(), t.dims())).collect();
    let (n_params, label) = size_label(&shapes);
    md.insert("general.size_label", Value::String(label));
    let mut kv = Kv::new(&arch_name);
    kv.md = md;
    conv.params(&mut kv)?;
    let mut md = kv.md;
    md.insert("general.quantization_version", Value::U32(2));
    let vspec = conv.vocab();
    let vocab_size = cfg.uint(&["vocab_size"])?.unwrap_or(0) as usize;
    check_vocab_size(&plan, vocab_size, vspec.pad_multiple)?;
    tokenizer::write_vocab(dir, &cfg, vspec, vocab_size, &mut md)?;

    // Tensor specs and types.
    let requested = opts.out_type.ggml();
    let specs: Vec<TensorSpec> = plan
        .iter()
        .map(|t| {
            TensorSpec::new(
                t.name.clone(),
                &t.dims(),
                output_type(&t.name, &t.shape, requested),
            )
        })
        .collect();
    let total: u64 = plan.iter().map(|t| t.n_elements() as u64 * 4).sum();
    let pb = crate::progress::bar(total, opts.progress, "converting");
    let mut w = SplitWriter::create(out, &md, &specs, opts.split)?;
    for (t, spec) in plan.iter().zip(&specs) {
        pb.set_message(t.name.clone());
        write_tensor(&ck, t, spec.ty, &mut w)?;
        pb.inc(t.n_elements() as u64 * 4);
    }
    let files = w.finish()?;
    pb.finish_and_clear();
    Ok(ConvertReport {
        hf_arch,
        arch: arch_name,
        n_tensors: plan.len(),
        n_params,
        output: files[0].clone(),
        files,
    })
}

/// Rows per step when a tensor is streamed (about 4 M elements).
const CHUNK_ELEMENTS: usize = 1 << 22;

/// Makes one output tensor and writes it, a block of rows at a time when
/// its recipe allows, so memory stays near one block rather than one tensor.
fn write_tensor(ck: &Checkpoint, t: &OutTensor, ty: GgmlType, w: &mut SplitWriter) -> Result<()> {
    let n_rows = t.shape.first().copied().unwrap_or(1).max(1);
    let row_len = t.n_elements() / n_rows;
    let encode = |data: &[f32], w: &mut SplitWriter| -> Result<()> {
        let n = ty.bytes_for(data.len() as u64).unwrap_or(0) as usize;
        let mut bytes = vec![0u8; n];
        coil_gguf::quant::quantize_row(ty, data, &mut bytes)
            .map_err(|e| ConvertError::tensor(&t.name, e.to_string()))?;
        w.write_tensor_data(&bytes)?;
        Ok(())
    };
    if t.streamable() && t.shape.len() > 1 && row_len > 0 {
        let step = (CHUNK_ELEMENTS / row_len).max(1);
        let mut r = 0;
        while r < n_rows {
            let e = (r + step).min(n_rows);
            let data = t.materialize_rows(ck, r, e)?;
            encode(&data, w)?;
            r = e;
        }
        Ok(())
    } else {
        let data = t.materialize(ck)?;
        encode(&data, w)
    }
}

/// config.json's `vocab_size`, padded as the tokenizer pads it, against
/// the rows of the embedding: the vocabulary is padded to `vocab_size`
/// with placeholder tokens, so more than the embedding has rows would
/// make a file no engine loads — and a `vocab_size` in the billions, a
/// token list that cannot be allocated.
fn check_vocab_size(plan: &[OutTensor], vocab_size: usize, pad: usize) -> Result<()> {
    let Some(rows) = plan
        .iter()
        .find(|t| t.name == "token_embd.weight")
        .and_then(|t| t.shape.first().copied())
    else {
        return Ok(());
    };
    let pad = pad.max(1);
    let padded = vocab_size.div_ceil(pad).checked_mul(pad);
    if padded.is_none_or(|p| p > rows) {
        return Err(ConvertError::config(
            "vocab_size",
            format!(
                "{vocab_size}{} tokens, but the embedding has {rows} rows",
                if pad > 1 {
                    format!(" (padded to a multiple of {pad})")
                } else {
                    String::new()
                }
            ),
        ));
    }
    Ok(())
}

fn first_duplicate(plan: &[OutTensor]) -> Option<&str> {
    let mut seen = std::collections::HashSet::new();
    plan.iter()
        .find(|t| !seen.insert(t.name.as_str()))
        .map(|t| t.name.as_str())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn titles_and_labels() {
        assert_eq!(id_to_title("hf"), "Hf");
        assert_eq!(id_to_title("mamba-130m-hf"), "Mamba 130m Hf");
        assert_eq!(rounded_count(172_000, 2), "172K");
        assert_eq!(rounded_count(1_500_000, 2), "1.5M");
        assert_eq!(rounded_count(8_030_000_000, 2), "8.0B");
    }
}
