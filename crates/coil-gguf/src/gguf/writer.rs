//! Writing GGUF files: the header first, then each tensor's data streamed in
//! order, into a temporary file that is renamed into place only when
//! complete (a failed or abandoned write leaves nothing behind).

use super::reader::DEFAULT_ALIGNMENT;
use super::value::{Metadata, Value};
use super::{GgufError, GGUF_MAGIC, MAX_DIMS};
use crate::dtype::GgmlType;
use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};

/// A tensor to be written: name, ggml dims (ne0 first) and type.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TensorSpec {
    pub name: String,
    pub dims: Vec<u64>,
    pub ty: GgmlType,
}

impl TensorSpec {
    pub fn new(name: impl Into<String>, dims: &[u64], ty: GgmlType) -> Self {
        TensorSpec {
            name: name.into(),
            dims: dims.to_vec(),
            ty,
        }
    }

    pub(crate) fn n_bytes(&self) -> Result<u64, GgufError> {
        let bad = |reason: String| GgufError::Tensor {
            name: self.name.clone(),
            reason,
        };
        if self.dims.len() > MAX_DIMS {
            return Err(bad(format!(
                "{} dimensions (at most {MAX_DIMS})",
                self.dims.len()
            )));
        }
        let n = self
            .dims
            .iter()
            .try_fold(1u64, |a, &d| a.checked_mul(d))
            .ok_or_else(|| bad("element count overflows".into()))?;
        let ne0 = self.dims.first().copied().unwrap_or(1);
        if ne0 % self.ty.block_size() as u64 != 0 {
            return Err(bad(format!(
                "first dimension {ne0} is not a multiple of the {} block size {}",
                self.ty,
                self.ty.block_size()
            )));
        }
        self.ty
            .bytes_for(n)
            .ok_or_else(|| bad("byte size overflows".into()))
    }
}

fn put_string(out: &mut Vec<u8>, s: &str) {
    out.extend_from_slice(&(s.len() as u64).to_le_bytes());
    out.extend_from_slice(s.as_bytes());
}

fn put_value(out: &mut Vec<u8>, v: &Value) -> Result<(), GgufError> {
    match v {
        Value::U8(x) => out.push(*x),
        Value::I8(x) => out.push(*x as u8),
        Value::U16(x) => out.extend_from_slice(&x.to_le_bytes()),
        Value::I16(x) => out.extend_from_slice(&x.to_le_bytes()),
        Value::U32(x) => out.extend_from_slice(&x.to_le_bytes()),
        Value::I32(x) => out.extend_from_slice(&x.to_le_bytes()),
        Value::F32(x) => out.extend_from_slice(&x.to_bits().to_le_bytes()),
        Value::U64(x) => out.extend_from_slice(&x.to_le_bytes()),
        Value::I64(x) => out.extend_from_slice(&x.to_le_bytes()),
        Value::F64(x) => out.extend_from_slice(&x.to_bits().to_le_bytes()),
        Value::Bool(x) => out.push(*x as u8),
        Value::String(s) => put_string(out, s),
        Value::Array(t, items) => {
            out.extend_from_slice(&(*t as u32).to_le_bytes());
            out.extend_from_slice(&(items.len() as u64).to_le_bytes());
            for item in items {
                if item.value_type() != *t {
                    return Err(GgufError::Invalid {
                        field: "array".into(),
                        offset: out.len() as u64,
                        reason: format!(
                            "element of type {} in an array of {}",
                            item.value_type().name(),
                            t.name()
                        ),
                    });
                }
                put_value(out, item)?;
            }
        }
    }
    Ok(())
}

fn alignment_of(metadata: &Metadata) -> Result<u64, GgufError> {
    match metadata.get("general.alignment") {
        None => Ok(DEFAULT_ALIGNMENT),
        Some(Value::U32(a)) if *a > 0 && a.is_power_of_two() => Ok(*a as u64),
        Some(v) => Err(GgufError::Invalid {
            field: "general.alignment".into(),
            offset: 0,
            reason: format!("must be a u32 power of two, found {v}"),
        }),
    }
}

/// Encodes a complete GGUF header (version 3), padded to the alignment.
/// Returns the header bytes and each tensor's data size.
pub fn encode_header(
    metadata: &Metadata,
    tensors: &[TensorSpec],
) -> Result<(Vec<u8>, Vec<u64>), GgufError> {
    let alignment = alignment_of(metadata)?;
    let mut out = Vec::new();
    out.extend_from_slice(&GGUF_MAGIC);
    out.extend_from_slice(&3u32.to_le_bytes());
    out.extend_from_slice(&(tensors.len() as u64).to_le_bytes());
    out.extend_from_slice(&(metadata.len() as u64).to_le_bytes());
    for (k, v) in metadata.iter() {
        put_string(&mut out, k);
        out.extend_from_slice(&(v.value_type() as u32).to_le_bytes());
        put_value(&mut out, v)?;
    }
    let mut sizes = Vec::with_capacity(tensors.len());
    let mut offset = 0u64;
    for t in tensors {
        let n = t.n_bytes()?;
        put_string(&mut out, &t.name);
        out.extend_from_slice(&(t.dims.len() as u32).to_le_bytes());
        for d in &t.dims {
            out.extend_from_slice(&d.to_le_bytes());
        }
        out.extend_from_slice(&t.ty.id().to_le_bytes());
        out.extend_from_slice(&offset.to_le_bytes());
        offset = (offset + n).div_ceil(alignment) * alignment;
        sizes.push(n);
    }
    let padded = (out.len() as u64).div_ceil(alignment) * alignment;
    out.resize(padded as usize, 0);
    Ok((out, sizes))
}

/// Streams a GGUF file to disk. Create it with the complete metadata and
/// tensor list, then feed each tensor's bytes in order (in as many pieces as
/// convenient) and call [`GgufWriter::finish`].
pub struct GgufWriter {
    out: Option<BufWriter<File>>,
    tmp_path: PathBuf,
    final_path: PathBuf,
    names: Vec<String>,
    sizes: Vec<u64>,
    alignment: u64,
    current: usize,
    written: u64,
}

impl GgufWriter {
    /// Writes the header to a temporary file next to `path`.
    pub fn create(
        path: impl AsRef<Path>,
        metadata: &Metadata,
        tensors: &[TensorSpec],
    ) -> Result<GgufWriter, GgufError> {
        let final_path = path.as_ref().to_path_buf();
        let (header, sizes) = encode_header(metadata, tensors)?;
        let alignment = alignment_of(metadata)?;
        let mut tmp_name = final_path
            .file_name()
            .map(|n| n.to_os_string())
            .unwrap_or_default();
        tmp_name.push(".partial");
        let tmp_path = final_path.with_file_name(tmp_name);
        let io = |error| GgufError::Io {
            path: tmp_path.clone(),
            error,
        };
        let file = File::create(&tmp_path).map_err(io)?;
        let mut w = GgufWriter {
            out: Some(BufWriter::with_capacity(1 << 20, file)),
            tmp_path: tmp_path.clone(),
            final_path,
            names: tensors.iter().map(|t| t.name.clone()).collect(),
            sizes,
            alignment,
            current: 0,
            written: 0,
        };
        w.sink()?.write_all(&header).map_err(io)?;
        w.skip_empty()?;
        Ok(w)
    }

    fn sink(&mut self) -> Result<&mut BufWriter<File>, GgufError> {
        self.out.as_mut().ok_or_else(|| GgufError::Invalid {
            field: "writer".into(),
            offset: 0,
            reason: "already finished".into(),
        })
    }

    fn io_err(&self, error: std::io::Error) -> GgufError {
        GgufError::Io {
            path: self.tmp_path.clone(),
            error,
        }
    }

    /// Advances past tensors whose data is complete, writing padding.
    fn skip_empty(&mut self) -> Result<(), GgufError> {
        while self.current < self.sizes.len() && self.written == self.sizes[self.current] {
            let pad = self.written.div_ceil(self.alignment) * self.alignment - self.written;
            if self.current + 1 < self.sizes.len() && pad > 0 {
                let zeros = vec![0u8; pad as usize];
                let r = self.sink()?.write_all(&zeros);
                r.map_err(|e| self.io_err(e))?;
            }
            self.current += 1;
            self.written = 0;
        }
        Ok(())
    }

    /// Name of the tensor whose data is expected next, if any.
    pub fn next_tensor(&self) -> Option<&str> {
        self.names.get(self.current).map(String::as_str)
    }

    /// Appends `bytes` to the data of the current tensor. A piece may not
    /// cross into the next tensor.
    pub fn write_tensor_data(&mut self, bytes: &[u8]) -> Result<(), GgufError> {
        let Some(&size) = self.sizes.get(self.current) else {
            return Err(GgufError::Invalid {
                field: "tensor data".into(),
                offset: 0,
                reason: "more tensor data than the header declares".into(),
            });
        };
        if self.written + bytes.len() as u64 > size {
            return Err(GgufError::Tensor {
                name: self.names[self.current].clone(),
                reason: format!(
                    "{} bytes given, {} expected",
                    self.written + bytes.len() as u64,
                    size
                ),
            });
        }
        let r = self.sink()?.write_all(bytes);
        r.map_err(|e| self.io_err(e))?;
        self.written += bytes.len() as u64;
        self.skip_empty()
    }

    /// Checks every tensor was written, flushes, syncs and renames the file
    /// into place.
    pub fn finish(mut self) -> Result<PathBuf, GgufError> {
        if let Some(name) = self.next_tensor() {
            return Err(GgufError::Tensor {
                name: name.to_string(),
                reason: "data not written before finish".into(),
            });
        }
        let result = self.close_and_rename();
        if result.is_err() {
            let _ = std::fs::remove_file(&self.tmp_path);
        }
        result?;
        Ok(self.final_path.clone())
    }
}

impl GgufWriter {
    fn close_and_rename(&mut self) -> Result<(), GgufError> {
        if let Some(out) = self.out.take() {
            let file = out.into_inner().map_err(|e| self.io_err(e.into_error()))?;
            file.sync_all().map_err(|e| self.io_err(e))?;
        }
        std::fs::rename(&self.tmp_path, &self.final_path).map_err(|error| GgufError::Io {
            path: self.final_path.clone(),
            error,
        })
    }
}

impl Drop for GgufWriter {
    fn drop(&mut self) {
        // Not finished: remove the partial file.
        if self.out.take().is_some() {
            let _ = std::fs::remove_file(&self.tmp_path);
        }
    }
}
