//! The checkpoint's tensors: one or more `.safetensors` files, memory-mapped,
//! indexed by name. Data is read one tensor at a time, so memory stays
//! bounded by the largest tensor (plus the page cache, which the kernel may
//! drop at will).

use crate::error::{ConvertError, Result};
use memmap2::Mmap;
use std::collections::HashMap;
use std::fs::File;
use std::path::{Path, PathBuf};

/// Element types of the source tensors coil converts.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SrcDtype {
    F32,
    F16,
    BF16,
    /// Anything else (integers, f64, fp8): indexed, rejected when read.
    Other,
}

impl SrcDtype {
    fn from_st(d: safetensors::Dtype) -> SrcDtype {
        match d {
            safetensors::Dtype::F32 => SrcDtype::F32,
            safetensors::Dtype::F16 => SrcDtype::F16,
            safetensors::Dtype::BF16 => SrcDtype::BF16,
            _ => SrcDtype::Other,
        }
    }
}

/// One tensor of the checkpoint.
#[derive(Clone, Debug)]
pub struct SrcTensor {
    pub name: String,
    pub dtype: SrcDtype,
    dtype_name: String,
    /// Row-major (PyTorch) order, outermost first.
    pub shape: Vec<usize>,
    file: usize,
    start: usize,
    end: usize,
}

impl SrcTensor {
    pub fn n_elements(&self) -> usize {
        self.shape.iter().product()
    }
}

struct Part {
    path: PathBuf,
    map: Mmap,
}

/// All tensors of a checkpoint, in llama.cpp's order (files sorted by name,
/// tensors of each file sorted by name).
pub struct Checkpoint {
    parts: Vec<Part>,
    tensors: Vec<SrcTensor>,
    index: HashMap<String, usize>,
}

fn io_err(path: &Path) -> impl FnOnce(std::io::Error) -> ConvertError + '_ {
    move |source| ConvertError::Io {
        path: path.to_path_buf(),
        source,
    }
}

impl Checkpoint {
    /// Opens the weights of `dir`: `model.safetensors.index.json` and its
    /// parts, or every `{prefix}*.safetensors` (prefix `model`, or
    /// `consolidated` for Mistral's layout).
    pub fn open_dir(dir: &Path, prefix: &str) -> Result<Checkpoint> {
        let index_path = dir.join("model.safetensors.index.json");
        let mut expected: Option<Vec<String>> = None;
        let part_names: Vec<String> = if prefix == "model" && index_path.is_file() {
            let index = crate::config::read_json(&index_path)?;
            let map = index
                .get("weight_map")
                .and_then(|m| m.as_object())
                .ok_or_else(|| ConvertError::Json {
                    path: index_path.clone(),
                    reason: "no \"weight_map\" object".into(),
                })?;
            let mut files: Vec<String> = Vec::new();
            for v in map.values() {
                let f = v.as_str().ok_or_else(|| ConvertError::Json {
                    path: index_path.clone(),
                    reason: format!("weight_map value {v} is not a file name"),
                })?;
                if f.contains('/') || f.contains('\\') || f.starts_with("..") {
                    return Err(ConvertError::Json {
                        path: index_path.clone(),
                        reason: format!(
                            "weight_map names {f:?}, which is not a file of this folder"
                        ),
                    });
                }
                if !files.iter().any(|x| x == f) {
                    files.push(f.to_string());
                }
            }
            files.sort();
            let mut names: Vec<String> = map.keys().cloned().collect();
            names.sort();
            expected = Some(names);
            files
        } else {
            let mut files = Vec::new();
            for entry in std::fs::read_dir(dir).map_err(io_err(dir))? {
                let entry = entry.map_err(io_err(dir))?;
                let name = entry.file_name().to_string_lossy().into_owned();
                if name.starts_with(prefix) && name.ends_with(".safetensors") {
                    files.push(name);
                }
            }
            files.sort();
            files
        };
        if part_names.is_empty() {
            return Err(ConvertError::NoWeights {
                dir: dir.to_path_buf(),
            });
        }
        let mut ck = Checkpoint {
            parts: Vec::new(),
            tensors: Vec::new(),
            index: HashMap::new(),
        };
        for name in &part_names {
            let path = dir.join(name);
            if !path.is_file() {
                return Err(ConvertError::MissingTensor {
                    name: format!("(every tensor of part {name})"),
                    hint: format!(
                        ": {} lists {name}, which is not in {}",
                        index_path.display(),
                        dir.display()
                    ),
                });
            }
            ck.add_file(&path)?;
        }
        if let Some(expected) = expected {
            let missing: Vec<&String> = expected
                .iter()
                .filter(|n| !ck.index.contains_key(*n))
                .collect();
            if let Some(first) = missing.first() {
                return Err(ConvertError::MissingTensor {
                    name: first.to_string(),
                    hint: format!(
                        " ({} of the tensors listed in model.safetensors.index.json are not in its parts)",
                        missing.len()
                    ),
                });
            }
        }
        Ok(ck)
    }

    /// Opens one `.safetensors` file.
    pub fn open_file(path: &Path) -> Result<Checkpoint> {
        let mut ck = Checkpoint {
            parts: Vec::new(),
            tensors: Vec::new(),
            index: HashMap::new(),
        };
        ck.add_file(path)?;
        Ok(ck)
    }

    fn add_file(&mut self, path: &Path) -> Result<()> {
        let file = File::open(path).map_err(io_err(path))?;
        // SAFETY: read-only map of a checkpoint file that coil never writes;
        // a concurrent truncation by another process is outside what an
        // mmap reader can defend against.
        let map = unsafe { Mmap::map(&file) }.map_err(io_err(path))?;
        let bad = |reason: String| ConvertError::Safetensors {
            path: path.to_path_buf(),
            reason,
        };
        if map.len() < 8 {
            return Err(bad(format!("{} bytes, too short for a header", map.len())));
        }
        let st = safetensors::SafeTensors::deserialize(&map).map_err(|e| bad(e.to_string()))?;
        let base = map.as_ptr() as usize;
        let mut found: Vec<SrcTensor> = st
            .tensors()
            .into_iter()
            .map(|(name, view)| {
                let start = view.data().as_ptr() as usize - base;
                SrcTensor {
                    dtype: SrcDtype::from_st(view.dtype()),
                    dtype_name: format!("{:?}", view.dtype()),
                    shape: view.shape().to_vec(),
                    file: self.parts.len(),
                    start,
                    end: start + view.data().len(),
                    name,
                }
            })
            .collect();
        found.sort_by(|a, b| a.name.cmp(&b.name));
        for t in found {
            if self.index.contains_key(&t.name) {
                return Err(bad(format!("tensor {:?} appears in two files", t.name)));
            }
            self.index.insert(t.name.clone(), self.tensors.len());
            self.tensors.push(t);
        }
        self.parts.push(Part {
            path: path.to_path_buf(),
            map,
        });
        Ok(())
    }

    /// Every tensor, in conversion order.
    pub fn tensors(&self) -> &[SrcTensor] {
        &self.tensors
    }

    pub fn get(&self, name: &str) -> Option<&SrcTensor> {
        self.index.get(name).map(|&i| &self.tensors[i])
    }

    pub fn contains(&self, name: &str) -> bool {
        self.index.contains_key(name)
    }

    /// The tensor or a [`ConvertError::MissingTensor`].
    pub fn req(&self, name: &str) -> Result<&SrcTensor> {
        self.get(name).ok_or_else(|| ConvertError::MissingTensor {
            name: name.to_string(),
            hint: String::new(),
        })
    }

    /// The tensor's raw bytes (little-endian).
    pub fn bytes(&self, t: &SrcTensor) -> &[u8] {
        &self.parts[t.file].map[t.start..t.end]
    }

    pub fn path_of(&self, t: &SrcTensor) -> &Path {
        &self.parts[t.file].path
    }

    /// Total bytes of tensor data.
    pub fn total_bytes(&self) -> u64 {
        self.tensors.iter().map(|t| (t.end - t.start) as u64).sum()
    }

    /// Lets the kernel drop the tensor's pages from this process's resident
    /// set (they stay in the page cache); a later read faults them back in.
    pub fn release(&self, t: &SrcTensor) {
        #[cfg(unix)]
        {
            let map = &self.parts[t.file].map;
            // SAFETY: `map` is a read-only shared file mapping: after
            // MADV_DONTNEED, reads fault the unchanged file contents back in,
            // so live slices stay valid.
            let _ = unsafe {
                map.unchecked_advise_range(
                    memmap2::UncheckedAdvice::DontNeed,
                    t.start,
                    t.end - t.start,
                )
            };
        }
    }

    /// An int64 tensor's values (Qwen4-Exp's hash constants).
    pub fn read_i64(&self, t: &SrcTensor) -> Result<Vec<i64>> {
        let b = self.bytes(t);
        if t.dtype_name != "I64" || b.len() != 8 * t.n_elements() {
            return Err(ConvertError::tensor(
                &t.name,
                format!("stored as {}, expected int64", t.dtype_name),
            ));
        }
        Ok(b.chunks_exact(8)
            .map(|c| i64::from_le_bytes(c.try_into().unwrap_or([0; 8])))
            .collect())
    }

    /// The tensor widened to f32 (its mapped pages released afterwards).
    pub fn read_f32(&self, t: &SrcTensor) -> Result<Vec<f32>> {
        let v = self.read_f32_inner(t);
        self.release(t);
        v
    }

    /// Elements `e0..e1` of the tensor widened to f32 (pages released).
    pub fn read_f32_range(&self, t: &SrcTensor, e0: usize, e1: usize) -> Result<Vec<f32>> {
        let es = match t.dtype {
            SrcDtype::F32 => 4,
            SrcDtype::F16 | SrcDtype::BF16 => 2,
            SrcDtype::Other => 1,
        };
        let sub = SrcTensor {
            start: t.start + e0 * es,
            end: (t.start + e1 * es).min(t.end),
            ..t.clone()
        };
        self.read_f32(&sub)
    }

    fn read_f32_inner(&self, t: &SrcTensor) -> Result<Vec<f32>> {
        let b = self.bytes(t);
        Ok(match t.dtype {
            SrcDtype::F32 => b
                .chunks_exact(4)
                .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
                .collect(),
            SrcDtype::F16 => b
                .chunks_exact(2)
                .map(|c| half::f16::from_bits(u16::from_le_bytes([c[0], c[1]])).to_f32())
                .collect(),
            SrcDtype::BF16 => b
                .chunks_exact(2)
                .map(|c| half::bf16::from_bits(u16::from_le_bytes([c[0], c[1]])).to_f32())
                .collect(),
            SrcDtype::Other => {
                return Err(ConvertError::tensor(
                    &t.name,
                    format!(
                        "element type {} is not supported (only F32, F16 and BF16 checkpoints)",
                        t.dtype_name
                    ),
                ))
            }
        })
    }
}
