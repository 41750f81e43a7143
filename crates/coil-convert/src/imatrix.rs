//! Importance matrices: the per-column statistics of the activations that
//! meet each weight matrix, in llama.cpp's file formats (`llama-imatrix`
//! writes them, `llama-quantize --imatrix` reads them).
//!
//! - GGUF (llama.cpp's current format): `general.type = "imatrix"`,
//!   `imatrix.datasets` (string array), `imatrix.chunk_count`,
//!   `imatrix.chunk_size` (u32); per weight matrix `NAME`, in name order, a
//!   tensor `NAME.in_sum2` of f32 `{cols, n_mat}` (the sums of the squared
//!   activations of each input column, one row per expert of an expert
//!   tensor) and `NAME.counts` of f32 `{1, n_mat}` (the activation rows
//!   summed: tokens, or tokens routed to the expert).
//! - The legacy `.dat` format (read): `i32` entry count; per entry `i32`
//!   name length, the name, `i32` ncall, `i32` nval, nval f32 values (the
//!   mean squared activation times ncall); then optionally `i32` chunk count
//!   and an `i32`-length-prefixed dataset name.
//!
//! [`Imatrix::importance`] gives the weights llama-quantize passes to
//! ggml's quantizers: per column the mean squared activation (sums /
//! counts per expert; 1 for an expert that no token reached).

use crate::error::{ConvertError, Result};
use coil_gguf::{GgmlType, GgufFile, GgufWriter, Metadata, TensorSpec, Value, ValueType};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// One weight matrix's statistics.
#[derive(Clone, Debug, PartialEq)]
pub struct ImatrixEntry {
    /// `n_mat × cols` sums of squared activations (legacy files: the means
    /// times ncall).
    pub sums: Vec<f32>,
    /// One count per matrix (per expert; legacy files: `[ncall]`).
    pub counts: Vec<f64>,
}

impl ImatrixEntry {
    /// Columns per matrix.
    pub fn cols(&self) -> usize {
        self.sums.len() / self.counts.len().max(1)
    }
}

/// An importance matrix file's contents.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Imatrix {
    /// By weight name (`blk.0.attn_q.weight`), in name order.
    pub entries: BTreeMap<String, ImatrixEntry>,
    /// The calibration texts.
    pub datasets: Vec<String>,
    pub chunk_count: u32,
    /// Tokens per chunk (0 in legacy files).
    pub chunk_size: u32,
    /// Read from the legacy `.dat` format.
    pub legacy: bool,
}

const KEY_DATASETS: &str = "imatrix.datasets";
const KEY_CHUNK_COUNT: &str = "imatrix.chunk_count";
const KEY_CHUNK_SIZE: &str = "imatrix.chunk_size";
const SUM2: &str = ".in_sum2";
const COUNTS: &str = ".counts";

fn bad(path: &Path, why: impl Into<String>) -> ConvertError {
    ConvertError::Quant(format!(
        "{}: not a usable importance matrix: {}",
        path.display(),
        why.into()
    ))
}

impl Imatrix {
    /// Reads a GGUF or legacy `.dat` importance matrix (told apart by the
    /// GGUF magic).
    pub fn read(path: &Path) -> Result<Imatrix> {
        let bytes = std::fs::read(path).map_err(|source| ConvertError::Io {
            path: path.to_path_buf(),
            source,
        })?;
        Self::parse(path, bytes)
    }

    /// [`Imatrix::read`] of a file's bytes (`path` names it in errors).
    pub fn parse(path: &Path, bytes: Vec<u8>) -> Result<Imatrix> {
        if bytes.starts_with(b"GGUF") {
            Self::from_gguf(path, bytes)
        } else {
            Self::from_legacy(path, &bytes)
        }
    }

    fn from_gguf(path: &Path, bytes: Vec<u8>) -> Result<Imatrix> {
        let file = GgufFile::from_bytes(bytes)
            .map_err(|e| bad(path, format!("invalid GGUF file: {e}")))?;
        let md = file.metadata();
        for key in [KEY_DATASETS, KEY_CHUNK_COUNT, KEY_CHUNK_SIZE] {
            if !md.contains_key(key) {
                return Err(bad(
                    path,
                    format!("the key {key} is missing (llama-quantize requires it)"),
                ));
            }
        }
        let datasets = md
            .get_array(KEY_DATASETS)
            .ok_or_else(|| bad(path, format!("{KEY_DATASETS} is not an array")))?
            .iter()
            .map(|v| {
                v.as_str()
                    .map(str::to_string)
                    .ok_or_else(|| bad(path, format!("{KEY_DATASETS} holds a non-string")))
            })
            .collect::<Result<Vec<_>>>()?;
        let u32_key = |k: &str| -> Result<u32> {
            md.get_u64(k)
                .and_then(|v| u32::try_from(v).ok())
                .ok_or_else(|| bad(path, format!("{k} is not a 32-bit count")))
        };
        let mut out = Imatrix {
            entries: BTreeMap::new(),
            datasets,
            chunk_count: u32_key(KEY_CHUNK_COUNT)?,
            chunk_size: u32_key(KEY_CHUNK_SIZE)?,
            legacy: false,
        };
        let mut sums: BTreeMap<String, Vec<f32>> = BTreeMap::new();
        let mut counts: BTreeMap<String, Vec<f32>> = BTreeMap::new();
        for t in file.tensors() {
            let (base, into) = if let Some(b) = t.name.strip_suffix(SUM2) {
                (b, &mut sums)
            } else if let Some(b) = t.name.strip_suffix(COUNTS) {
                (b, &mut counts)
            } else {
                continue;
            };
            if t.ty != GgmlType::F32 {
                return Err(bad(
                    path,
                    format!("tensor {:?} is {}, not F32", t.name, t.ty),
                ));
            }
            let view = file
                .tensor(&t.name)
                .map_err(|e| bad(path, format!("tensor {:?}: {e}", t.name)))?;
            let values: Vec<f32> = view
                .data
                .chunks_exact(4)
                .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
                .collect();
            into.insert(base.to_string(), values);
        }
        if sums.is_empty() && counts.is_empty() {
            return Err(bad(path, "it holds no .in_sum2 / .counts tensors"));
        }
        for name in counts.keys() {
            if !sums.contains_key(name) {
                return Err(bad(path, format!("{name}{COUNTS} has no {name}{SUM2}")));
            }
        }
        for (name, s) in sums {
            let c = counts
                .remove(&name)
                .ok_or_else(|| bad(path, format!("{name}{SUM2} has no {name}{COUNTS}")))?;
            if c.is_empty() || s.len() % c.len() != 0 {
                return Err(bad(
                    path,
                    format!(
                        "{name}: {} sums are not whole rows for {} counts",
                        s.len(),
                        c.len()
                    ),
                ));
            }
            // llama.cpp reads the counts with lround
            let c = c.iter().map(|&v| (v as f64).round()).collect();
            out.entries
                .insert(name, ImatrixEntry { sums: s, counts: c });
        }
        Ok(out)
    }

    fn from_legacy(path: &Path, bytes: &[u8]) -> Result<Imatrix> {
        let mut r = Reader { bytes, at: 0 };
        let short = |what: &str| {
            bad(
                path,
                format!("{what} (neither GGUF nor a complete legacy .dat file)"),
            )
        };
        let n = r.i32().ok_or_else(|| short("no entry count"))?;
        if n < 1 {
            return Err(short(&format!("entry count {n}")));
        }
        let mut out = Imatrix {
            legacy: true,
            ..Imatrix::default()
        };
        for i in 0..n {
            let len = r
                .len()
                .ok_or_else(|| short(&format!("entry {i}: bad name length")))?;
            let name = r
                .take(len)
                .and_then(|b| std::str::from_utf8(b).ok())
                .ok_or_else(|| short(&format!("entry {i}: bad name")))?
                .to_string();
            let ncall = r
                .i32()
                .ok_or_else(|| short(&format!("{name}: no call count")))?;
            let nval = r
                .len()
                .filter(|&v| v > 0)
                .ok_or_else(|| short(&format!("{name}: bad value count")))?;
            let sums = r
                .take(
                    nval.checked_mul(4)
                        .ok_or_else(|| short(&format!("{name}: bad value count")))?,
                )
                .ok_or_else(|| short(&format!("{name}: {nval} values past the end")))?
                .chunks_exact(4)
                .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
                .collect();
            out.entries.insert(
                name,
                ImatrixEntry {
                    sums,
                    counts: vec![ncall as f64],
                },
            );
        }
        // optional trailer: chunk count, dataset name
        if let Some(calls) = r.i32() {
            out.chunk_count = calls.max(0) as u32;
            if let Some(len) = r.len().filter(|&l| l > 0) {
                if let Some(d) = r.take(len) {
                    out.datasets.push(
                        String::from_utf8_lossy(d)
                            .trim_end_matches('\0')
                            .to_string(),
                    );
                }
            }
        }
        Ok(out)
    }

    /// Writes the GGUF format, as llama-imatrix does (metadata in its order,
    /// entries by name, each `in_sum2` then `counts`).
    pub fn write(&self, path: &Path) -> Result<PathBuf> {
        let mut md = Metadata::new();
        md.insert("general.type", Value::String("imatrix".into()));
        md.insert(
            KEY_DATASETS,
            Value::Array(
                ValueType::String,
                self.datasets.iter().cloned().map(Value::String).collect(),
            ),
        );
        md.insert(KEY_CHUNK_COUNT, Value::U32(self.chunk_count));
        md.insert(KEY_CHUNK_SIZE, Value::U32(self.chunk_size));
        let mut specs = Vec::new();
        // ggml writes no trailing 1-dims ({cols, 1} as {cols})
        let dims = |d: [u64; 2]| -> Vec<u64> {
            let n = d.iter().rposition(|&x| x != 1).map_or(1, |p| p + 1);
            d[..n].to_vec()
        };
        for (name, e) in &self.entries {
            let n_mat = e.counts.len() as u64;
            specs.push(TensorSpec::new(
                format!("{name}{SUM2}"),
                &dims([e.cols() as u64, n_mat]),
                GgmlType::F32,
            ));
            specs.push(TensorSpec::new(
                format!("{name}{COUNTS}"),
                &dims([1, n_mat]),
                GgmlType::F32,
            ));
        }
        let mut w = GgufWriter::create(path, &md, &specs)?;
        let le = |v: &mut dyn Iterator<Item = f32>| -> Vec<u8> {
            v.flat_map(f32::to_le_bytes).collect()
        };
        for e in self.entries.values() {
            w.write_tensor_data(&le(&mut e.sums.iter().copied()))?;
            w.write_tensor_data(&le(&mut e.counts.iter().map(|&c| c as f32)))?;
        }
        let path = w.finish()?;
        // ggml pads the last tensor's data to the alignment too
        let io = |source| ConvertError::Io {
            path: path.clone(),
            source,
        };
        let len = std::fs::metadata(&path).map_err(io)?.len();
        let pad = len.next_multiple_of(32) - len;
        if pad > 0 {
            use std::io::Write;
            let mut f = std::fs::OpenOptions::new()
                .append(true)
                .open(&path)
                .map_err(io)?;
            f.write_all(&vec![0u8; pad as usize]).map_err(io)?;
        }
        Ok(path)
    }

    /// The importance weights of weight matrix `name` as llama-quantize
    /// makes them: per matrix (expert) and column the mean squared
    /// activation; 1 for a matrix that no token reached. Legacy files:
    /// the values over ncall.
    pub fn importance(&self, name: &str) -> Option<Vec<f32>> {
        let e = self.entries.get(name)?;
        if self.legacy {
            let ncall = e.counts.first().copied().unwrap_or(0.0) as i64;
            return Some(if ncall > 0 {
                e.sums.iter().map(|&s| s / ncall as f32).collect()
            } else {
                e.sums.clone()
            });
        }
        let cols = e.cols();
        let mut out = Vec::with_capacity(e.sums.len());
        for (j, &c) in e.counts.iter().enumerate() {
            let row = &e.sums[j * cols..(j + 1) * cols];
            let c = c as f32;
            if c > 0.0 {
                out.extend(row.iter().map(|&s| s / c));
            } else {
                out.extend(std::iter::repeat_n(1.0, cols));
            }
        }
        Some(out)
    }
}

struct Reader<'a> {
    bytes: &'a [u8],
    at: usize,
}

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Option<&'a [u8]> {
        let s = self.bytes.get(self.at..self.at.checked_add(n)?)?;
        self.at += n;
        Some(s)
    }
    fn i32(&mut self) -> Option<i32> {
        self.take(4)
            .map(|b| i32::from_le_bytes([b[0], b[1], b[2], b[3]]))
    }
    /// A non-negative `i32` length.
    fn len(&mut self) -> Option<usize> {
        self.i32().and_then(|v| usize::try_from(v).ok())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> Imatrix {
        let mut m = Imatrix {
            datasets: vec!["text.txt".into()],
            chunk_count: 3,
            chunk_size: 512,
            ..Imatrix::default()
        };
        m.entries.insert(
            "blk.0.attn_q.weight".into(),
            ImatrixEntry {
                sums: vec![4.0, 8.0, 0.5, 2.0],
                counts: vec![2.0],
            },
        );
        m.entries.insert(
            "blk.0.ffn_up_exps.weight".into(),
            ImatrixEntry {
                sums: vec![3.0, 6.0, 9.0, 9.0],
                counts: vec![3.0, 0.0],
            },
        );
        m
    }

    #[test]
    fn gguf_round_trip_and_means() {
        let dir = std::env::temp_dir().join(format!("coil-imatrix-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let p = dir.join("m.gguf");
        let m = sample();
        m.write(&p).unwrap();
        let back = Imatrix::read(&p).unwrap();
        assert_eq!(back, m);
        assert_eq!(
            back.importance("blk.0.attn_q.weight").unwrap(),
            [2.0, 4.0, 0.25, 1.0]
        );
        // an expert no token reached weighs 1
        assert_eq!(
            back.importance("blk.0.ffn_up_exps.weight").unwrap(),
            [1.0, 2.0, 1.0, 1.0]
        );
        assert_eq!(back.importance("blk.1.attn_q.weight"), None);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn legacy_dat() {
        let mut b = Vec::new();
        b.extend(1i32.to_le_bytes());
        let name = b"blk.0.ffn_down.weight";
        b.extend((name.len() as i32).to_le_bytes());
        b.extend(name);
        b.extend(4i32.to_le_bytes()); // ncall
        b.extend(2i32.to_le_bytes()); // nval
        b.extend(8f32.to_le_bytes());
        b.extend(2f32.to_le_bytes());
        b.extend(4i32.to_le_bytes()); // chunks
        b.extend(5i32.to_le_bytes());
        b.extend(b"a.txt");
        let dir = std::env::temp_dir().join(format!("coil-imatrix-dat-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let p = dir.join("m.dat");
        std::fs::write(&p, &b).unwrap();
        let m = Imatrix::read(&p).unwrap();
        assert!(m.legacy);
        assert_eq!(m.chunk_count, 4);
        assert_eq!(m.datasets, ["a.txt"]);
        assert_eq!(m.importance("blk.0.ffn_down.weight").unwrap(), [2.0, 0.5]);
        // truncated: an error naming the file, no panic
        for cut in [0, 3, 10, 30, 40] {
            std::fs::write(&p, &b[..cut]).unwrap();
            let e = Imatrix::read(&p).unwrap_err().to_string();
            assert!(e.contains("m.dat"), "{cut}: {e}");
        }
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
