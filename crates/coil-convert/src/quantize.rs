//! `coil quantize`: llama.cpp's per-tensor type mixtures (`llama-quant.cpp`,
//! `llama_tensor_get_type`, without an importance matrix) over a GGUF file.
//!
//! Left as they are (llama.cpp's `tensor_allows_quantization`): tensors
//! with fewer than 2 dimensions, names not ending in `weight` (`ssm_a`,
//! `ssm_d`, biases), norms (`*_norm.weight`), routers (`ffn_gate_inp`),
//! `ssm_conv1d`, position / token-type embeddings. The mixtures:
//!
//! | mix    | default | output (and tied token_embd) | attn_v, ffn_down                         |
//! |--------|---------|------------------------------|------------------------------------------|
//! | Q8_0   | Q8_0    | Q8_0                         | —                                        |
//! | Q4_0.. | Q4_0..  | Q6_K                         | —                                        |
//! | Q4_K_M | Q4_K    | Q6_K                         | Q6_K on `use_more_bits` layers           |
//! | Q5_K_M | Q5_K    | Q6_K                         | Q6_K on `use_more_bits` layers           |
//! | Q6_K   | Q6_K    | Q6_K                         | —                                        |
//!
//! plus 8-expert models' attn_v/attn_k → Q8_0 (and attn_output → Q5_K for
//! Q4_K_M), and the shape fallbacks (row length not a multiple of 256:
//! Q4_K → Q5_0, Q5_K → Q5_1, Q6_K → Q8_0; of 32: F16).

use crate::error::{ConvertError, Result};
use coil_gguf::{GgmlType, GgufFile, GgufWriter, TensorInfo, TensorSpec, Value};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// A quantization mixture (llama.cpp's `llama_ftype`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[allow(non_camel_case_types)]
pub enum QuantMix {
    Q8_0,
    Q4_0,
    Q4_1,
    Q5_0,
    Q5_1,
    Q4_K_M,
    Q5_K_M,
    Q6_K,
}

impl QuantMix {
    pub const ALL: [QuantMix; 8] = [
        QuantMix::Q8_0,
        QuantMix::Q4_0,
        QuantMix::Q4_1,
        QuantMix::Q5_0,
        QuantMix::Q5_1,
        QuantMix::Q4_K_M,
        QuantMix::Q5_K_M,
        QuantMix::Q6_K,
    ];

    pub fn name(self) -> &'static str {
        match self {
            QuantMix::Q8_0 => "Q8_0",
            QuantMix::Q4_0 => "Q4_0",
            QuantMix::Q4_1 => "Q4_1",
            QuantMix::Q5_0 => "Q5_0",
            QuantMix::Q5_1 => "Q5_1",
            QuantMix::Q4_K_M => "Q4_K_M",
            QuantMix::Q5_K_M => "Q5_K_M",
            QuantMix::Q6_K => "Q6_K",
        }
    }

    /// Case-insensitive; `Q4_K` / `Q5_K` mean the `_M` mixtures.
    pub fn parse(s: &str) -> Option<QuantMix> {
        let u = s.to_ascii_uppercase();
        let u = match u.as_str() {
            "Q4_K" => "Q4_K_M",
            "Q5_K" => "Q5_K_M",
            other => other,
        };
        QuantMix::ALL.into_iter().find(|m| m.name() == u)
    }

    /// The type of most tensors.
    pub fn default_type(self) -> GgmlType {
        match self {
            QuantMix::Q8_0 => GgmlType::Q8_0,
            QuantMix::Q4_0 => GgmlType::Q4_0,
            QuantMix::Q4_1 => GgmlType::Q4_1,
            QuantMix::Q5_0 => GgmlType::Q5_0,
            QuantMix::Q5_1 => GgmlType::Q5_1,
            QuantMix::Q4_K_M => GgmlType::Q4_K,
            QuantMix::Q5_K_M => GgmlType::Q5_K,
            QuantMix::Q6_K => GgmlType::Q6_K,
        }
    }

    /// `general.file_type` (llama.cpp's `llama_ftype`).
    pub fn file_type(self) -> u32 {
        match self {
            QuantMix::Q4_0 => 2,
            QuantMix::Q4_1 => 3,
            QuantMix::Q8_0 => 7,
            QuantMix::Q5_0 => 8,
            QuantMix::Q5_1 => 9,
            QuantMix::Q4_K_M => 15,
            QuantMix::Q5_K_M => 17,
            QuantMix::Q6_K => 18,
        }
    }
}

/// Options of [`quantize`].
#[derive(Clone, Debug)]
pub struct QuantizeOptions {
    pub mix: QuantMix,
    pub progress: bool,
}

/// What [`quantize`] wrote.
#[derive(Clone, Debug)]
pub struct QuantizeReport {
    pub output: PathBuf,
    pub bytes_in: u64,
    pub bytes_out: u64,
    /// Output tensor count per type.
    pub types: BTreeMap<String, usize>,
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Category {
    TokenEmbd,
    AttnQ,
    AttnV,
    AttnK,
    AttnOutput,
    FfnUp,
    FfnGate,
    FfnDown,
    Output,
    Other,
}

fn category(name: &str) -> Category {
    use Category::*;
    if name == "output.weight" {
        Output
    } else if name == "token_embd.weight" || name == "per_layer_token_embd.weight" {
        TokenEmbd
    } else if name.contains("attn_qkv.weight")
        || name.contains("attn_kv_b.weight")
        || name.contains("attn_v.weight")
    {
        AttnV
    } else if name.contains("attn_k.weight") {
        AttnK
    } else if name.contains("attn_q.weight") {
        AttnQ
    } else if name.contains("attn_output.weight") {
        AttnOutput
    } else if name.contains("ffn_up") {
        FfnUp
    } else if name.contains("ffn_gate") {
        FfnGate
    } else if name.contains("ffn_down") {
        FfnDown
    } else {
        Other
    }
}

/// llama.cpp's `tensor_allows_quantization` (the parts that concern the
/// supported architectures).
fn allows_quantization(t: &TensorInfo) -> bool {
    let n_dims = t.dims.iter().rposition(|&d| d > 1).map_or(1, |i| i + 1);
    if n_dims < 2 {
        return false;
    }
    let n = t.name.as_str();
    n.ends_with("weight")
        && !n.contains("_norm.weight")
        && !n.contains("ffn_gate_inp.weight")
        && !n.contains("ssm_conv1d")
        && !n.contains("shortconv.conv.weight")
        && !n.contains(".position_embd")
        && n != "position_embd.weight"
        && n != "token_types.weight"
        && !n.contains("attn_rel_b.weight")
}

fn use_more_bits(i: i64, n: i64) -> bool {
    i < n / 8 || i >= 7 * n / 8 || (i - n / 8) % 3 == 2
}

fn fallback(t: &TensorInfo, ty: GgmlType) -> GgmlType {
    let ncols = t.dims.first().copied().unwrap_or(1);
    if ncols % ty.block_size() as u64 == 0 {
        return ty;
    }
    let f = match ty {
        GgmlType::Q2_K | GgmlType::Q3_K => GgmlType::Q4_0,
        GgmlType::Q4_K => GgmlType::Q5_0,
        GgmlType::Q5_K => GgmlType::Q5_1,
        GgmlType::Q6_K => GgmlType::Q8_0,
        other => other,
    };
    if ncols % f.block_size() as u64 != 0 {
        GgmlType::F16
    } else {
        f
    }
}

/// The output type of every tensor of `file` under `mix`, in file order
/// (decided in llama-quantize's order, which its layer counters follow).
pub fn plan_types(file: &GgufFile, mix: QuantMix) -> Vec<GgmlType> {
    let md = file.metadata();
    let arch = file.architecture().unwrap_or("");
    let key_u = |k: &str| {
        md.get(&format!("{arch}.{k}"))
            .and_then(Value::as_u64)
            .unwrap_or(0) as i64
    };
    let n_layer = key_u("block_count");
    let n_expert = key_u("expert_count").max(1);
    let tensors = file.tensors();
    let n_attention_wv = tensors
        .iter()
        .filter(|t| category(&t.name) == Category::AttnV)
        .count() as i64;
    let tied = !tensors.iter().any(|t| t.name == "output.weight");
    let (mut i_wv, mut i_down) = (0i64, 0i64);
    let default = mix.default_type();
    let mut types: Vec<GgmlType> = tensors.iter().map(|t| t.ty).collect();
    // Counters run in llama-quantize's order (by layer, then name).
    for i in llama_order(tensors) {
        let t = &tensors[i];
        types[i] = {
            if !allows_quantization(t) {
                continue;
            }
            let cat = category(&t.name);
            let mut ty = default;
            let layer_of = |counter: i64| -> i64 {
                if n_expert > 1 {
                    t.name
                        .strip_prefix("blk.")
                        .and_then(|r| r.split('.').next())
                        .and_then(|s| s.parse().ok())
                        .unwrap_or(counter)
                } else {
                    counter
                }
            };
            let km = matches!(mix, QuantMix::Q4_K_M | QuantMix::Q5_K_M);
            match cat {
                Category::Output | Category::TokenEmbd if cat == Category::Output || tied => {
                    let nx = t.dims.first().copied().unwrap_or(1);
                    if nx % ty.block_size() as u64 != 0 {
                        ty = GgmlType::Q8_0;
                    } else if ty != GgmlType::Q8_0 {
                        ty = GgmlType::Q6_K;
                    }
                }
                Category::AttnV => {
                    if km && use_more_bits(i_wv, n_attention_wv) {
                        ty = GgmlType::Q6_K;
                    }
                    if n_expert == 8 {
                        ty = GgmlType::Q8_0;
                    }
                    i_wv += 1;
                }
                Category::AttnK if n_expert == 8 => ty = GgmlType::Q8_0,
                Category::FfnDown => {
                    let i_layer = layer_of(i_down);
                    if km && use_more_bits(i_layer, n_layer) {
                        ty = GgmlType::Q6_K;
                    }
                    i_down += 1;
                }
                Category::AttnOutput if n_expert == 8 && mix == QuantMix::Q4_K_M => {
                    ty = GgmlType::Q5_K
                }
                _ => {}
            }
            fallback(t, ty)
        };
    }
    types
}

/// llama-quantize's tensor order: by layer (`blk.N.`; other tensors first),
/// then by name.
pub fn llama_order(tensors: &[TensorInfo]) -> Vec<usize> {
    let layer = |n: &str| -> i64 {
        n.strip_prefix("blk.")
            .and_then(|r| r.split('.').next())
            .and_then(|s| s.parse().ok())
            .unwrap_or(-1)
    };
    let mut idx: Vec<usize> = (0..tensors.len()).collect();
    idx.sort_by(|&a, &b| {
        let (na, nb) = (tensors[a].name.as_str(), tensors[b].name.as_str());
        (layer(na), na.as_bytes()).cmp(&(layer(nb), nb.as_bytes()))
    });
    idx
}

/// Quantizes whole rows of `f` into `q` on all cores.
fn quantize_parallel(
    ty: GgmlType,
    f: &[f32],
    q: &mut [u8],
    ne0: usize,
    row_out: usize,
) -> Result<(), coil_gguf::quant::QuantError> {
    let n_rows = f.len().checked_div(ne0).unwrap_or(0);
    let threads = std::thread::available_parallelism()
        .map_or(1, |n| n.get())
        .min(n_rows)
        .max(1);
    if threads == 1 {
        return coil_gguf::quant::quantize_row(ty, f, q);
    }
    let per = n_rows.div_ceil(threads);
    std::thread::scope(|s| {
        let handles: Vec<_> = f
            .chunks(per * ne0)
            .zip(q.chunks_mut(per * row_out))
            .map(|(fx, qx)| s.spawn(move || coil_gguf::quant::quantize_row(ty, fx, qx)))
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().unwrap_or_else(|e| std::panic::resume_unwind(e)))
            .collect::<Result<Vec<()>, _>>()
            .map(|_| ())
    })
}

/// Elements converted per step, bounding memory for huge tensors.
const CHUNK_ELEMENTS: usize = 1 << 22;

/// Quantizes `input` into `output` with mixture `opts.mix`.
pub fn quantize(input: &Path, output: &Path, opts: &QuantizeOptions) -> Result<QuantizeReport> {
    let same = match (std::fs::canonicalize(input), std::fs::canonicalize(output)) {
        (Ok(a), Ok(b)) => a == b,
        _ => false,
    };
    if same {
        return Err(ConvertError::Quant(
            "the output file must differ from the input file".into(),
        ));
    }
    let file = GgufFile::open(input)?;
    // A second map of the same file for the tensor data, whose pages are
    // released after each tensor (the GgufFile's own map is only used for
    // the header), so memory stays near one block of rows.
    let io = |source| ConvertError::Io {
        path: input.to_path_buf(),
        source,
    };
    let f = std::fs::File::open(input).map_err(io)?;
    // SAFETY: read-only map of a file coil does not write.
    let map = unsafe { memmap2::Mmap::map(&f) }.map_err(io)?;
    let release = |r: std::ops::Range<usize>| {
        #[cfg(unix)]
        {
            // SAFETY: read-only shared file mapping: dropped pages fault the
            // unchanged contents back in.
            let _ = unsafe {
                map.unchecked_advise_range(
                    memmap2::UncheckedAdvice::DontNeed,
                    r.start,
                    r.end - r.start,
                )
            };
        }
        #[cfg(not(unix))]
        let _ = r;
    };
    let types = plan_types(&file, opts.mix);
    let mut md = file.metadata().clone();
    // llama-quantize re-appends these two keys at the end.
    md.remove("general.quantization_version");
    md.remove("general.file_type");
    md.insert("general.quantization_version", Value::U32(2));
    md.insert("general.file_type", Value::U32(opts.mix.file_type()));
    // Written in llama-quantize's order, so the files are identical.
    let order = llama_order(file.tensors());
    let specs: Vec<TensorSpec> = order
        .iter()
        .map(|&i| {
            let t = &file.tensors()[i];
            // ggml drops trailing 1-dims ({512, 1} is written as {512}).
            let n = t.dims.iter().rposition(|&d| d != 1).map_or(1, |p| p + 1);
            TensorSpec::new(t.name.clone(), &t.dims[..n], types[i])
        })
        .collect();
    for (t, &ty) in file.tensors().iter().zip(&types) {
        if ty != t.ty && !coil_gguf::quant::can_dequantize(t.ty) {
            return Err(ConvertError::Quant(format!(
                "tensor {:?}: coil cannot read its type {} to requantize it",
                t.name, t.ty
            )));
        }
    }
    let total: u64 = file.tensors().iter().map(|t| t.n_bytes).sum();
    let pb = crate::progress::bar(total, opts.progress, "quantizing");
    let mut w = GgufWriter::create(output, &md, &specs)?;
    let mut counts: BTreeMap<String, usize> = BTreeMap::new();
    let mut bytes_out = 0u64;
    for &i in &order {
        let (t, ty) = (&file.tensors()[i], types[i]);
        pb.set_message(t.name.clone());
        *counts.entry(ty.name().to_string()).or_default() += 1;
        let range = file.data_range(t);
        let data = map.get(range.clone()).ok_or_else(|| {
            ConvertError::Quant(format!(
                "tensor {:?}: data past the end of the file",
                t.name
            ))
        })?;
        if ty == t.ty {
            w.write_tensor_data(data)?;
            bytes_out += data.len() as u64;
            release(range);
        } else {
            let ne0 = t.dims.first().copied().unwrap_or(1) as usize;
            let row_in = t.ty.bytes_for(ne0 as u64).unwrap_or(0) as usize;
            let row_out = ty.bytes_for(ne0 as u64).unwrap_or(0) as usize;
            let rows_per_chunk = (CHUNK_ELEMENTS / ne0.max(1)).max(1);
            let n_rows = (t.n_elements as usize).checked_div(ne0).unwrap_or(0);
            let mut f = vec![0f32; rows_per_chunk.min(n_rows.max(1)) * ne0];
            let mut q = vec![0u8; rows_per_chunk.min(n_rows.max(1)) * row_out];
            let mut r = 0;
            while r < n_rows {
                let n = rows_per_chunk.min(n_rows - r);
                let src = &data[r * row_in..(r + n) * row_in];
                let fx = &mut f[..n * ne0];
                let qx = &mut q[..n * row_out];
                let err = |e: coil_gguf::quant::QuantError| {
                    ConvertError::Quant(format!("tensor {:?}: {e}", t.name))
                };
                coil_gguf::quant::dequantize_row(t.ty, src, fx).map_err(err)?;
                quantize_parallel(ty, fx, qx, ne0, row_out).map_err(err)?;
                w.write_tensor_data(qx)?;
                bytes_out += qx.len() as u64;
                release(range.start + r * row_in..range.start + (r + n) * row_in);
                r += n;
            }
        }
        pb.inc(t.n_bytes);
    }
    let output = w.finish()?;
    pb.finish_and_clear();
    Ok(QuantizeReport {
        output,
        bytes_in: total,
        bytes_out,
        types: counts,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mixture_names() {
        assert_eq!(QuantMix::parse("q4_k_m"), Some(QuantMix::Q4_K_M));
        assert_eq!(QuantMix::parse("Q5_K"), Some(QuantMix::Q5_K_M));
        assert_eq!(QuantMix::parse("Q3_K_S"), None);
        assert_eq!(QuantMix::Q6_K.file_type(), 18);
    }

    /// A llama-shaped file: 8 layers, dims multiples of 256, plus SSM-style
    /// extras; the plan must follow llama.cpp's rules.
    fn synthetic() -> GgufFile {
        use coil_gguf::{Metadata, TensorSpec};
        let mut md = Metadata::new();
        md.insert("general.architecture", Value::String("llama".into()));
        md.insert("llama.block_count", Value::U32(8));
        let mut t = vec![
            TensorSpec::new("token_embd.weight", &[256, 1000], GgmlType::F16),
            TensorSpec::new("output.weight", &[256, 1000], GgmlType::F16),
            TensorSpec::new("blk.0.ssm_conv1d.weight", &[4, 256], GgmlType::F32),
            TensorSpec::new("blk.0.ssm_a", &[1, 8], GgmlType::F32),
            TensorSpec::new("blk.0.ssm_norm.weight", &[32, 8], GgmlType::F32),
            TensorSpec::new("blk.0.ssm_dt.weight", &[48, 256], GgmlType::F16),
            TensorSpec::new("blk.0.ssm_x.weight", &[512, 288], GgmlType::F16),
            TensorSpec::new("blk.0.ffn_gate_inp.weight", &[256, 8], GgmlType::F32),
        ];
        for b in 0..8 {
            for (n, d) in [
                ("attn_norm.weight", vec![256]),
                ("attn_q.weight", vec![256, 256]),
                ("attn_k.weight", vec![256, 64]),
                ("attn_v.weight", vec![256, 64]),
                ("attn_output.weight", vec![256, 256]),
                ("ffn_down.weight", vec![512, 256]),
                ("ffn_up.weight", vec![256, 512]),
            ] {
                t.push(TensorSpec::new(format!("blk.{b}.{n}"), &d, GgmlType::F16));
            }
        }
        let (mut bytes, sizes) = coil_gguf::gguf::encode_header(&md, &t).unwrap();
        for s in sizes {
            bytes.extend(vec![0u8; (s as usize).div_ceil(32) * 32]);
        }
        GgufFile::from_bytes(bytes).unwrap()
    }

    #[test]
    fn q4_k_m_plan_follows_llama_cpp() {
        let f = synthetic();
        let types = plan_types(&f, QuantMix::Q4_K_M);
        let ty = |name: &str| {
            let i = f.tensors().iter().position(|t| t.name == name).unwrap();
            types[i]
        };
        use GgmlType::*;
        assert_eq!(ty("output.weight"), Q6_K);
        assert_eq!(ty("token_embd.weight"), Q4_K); // untied
        assert_eq!(ty("blk.0.ssm_conv1d.weight"), F32);
        assert_eq!(ty("blk.0.ssm_a"), F32);
        assert_eq!(ty("blk.0.ssm_norm.weight"), F32);
        assert_eq!(ty("blk.0.ffn_gate_inp.weight"), F32);
        assert_eq!(ty("blk.0.ssm_dt.weight"), F16); // 48 columns: Q4_K → Q5_0 → F16
        assert_eq!(ty("blk.0.ssm_x.weight"), Q4_K); // 512 columns
        for b in 0..8 {
            let more = [0, 3, 6, 7].contains(&b);
            let want = if more { Q6_K } else { Q4_K };
            assert_eq!(ty(&format!("blk.{b}.attn_v.weight")), want, "layer {b}");
            assert_eq!(ty(&format!("blk.{b}.ffn_down.weight")), want, "layer {b}");
            assert_eq!(ty(&format!("blk.{b}.attn_q.weight")), Q4_K);
            assert_eq!(ty(&format!("blk.{b}.attn_norm.weight")), F16); // 1-D: kept as is
        }
        // Q4_0: only the output changes; Q8_0: nothing but the default.
        let t0 = plan_types(&f, QuantMix::Q4_0);
        assert_eq!(t0[1], Q6_K);
        assert!(t0.iter().filter(|&&t| t == Q4_0).count() > 40);
        let t8 = plan_types(&f, QuantMix::Q8_0);
        assert_eq!(t8[1], Q8_0);
        assert_eq!(t8[5], F16); // ssm_dt: rows of 48 are not whole 32-blocks
    }

    #[test]
    fn more_bits_layers() {
        // llama.cpp: first and last eighth, then every third layer.
        let n = 24;
        let picked: Vec<i64> = (0..n).filter(|&i| use_more_bits(i, n)).collect();
        assert_eq!(picked, [0, 1, 2, 5, 8, 11, 14, 17, 20, 21, 22, 23]);
    }
}
