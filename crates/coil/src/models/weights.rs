//! Reading hyper-parameters and tensors out of a GGUF file, with errors that
//! name the key or tensor. Matrices stay in their GGUF encoding (a byte
//! range of the memory map); small vectors are widened to f32 at load.

use super::ModelError;
use coil_gguf::{GgmlType, GgufFile, TensorInfo};
use coil_kernels::WeightRef;
use std::ops::Range;

/// A weight matrix `[rows, cols]` (ggml ne = [cols, rows]) kept as stored.
#[derive(Clone, Debug)]
pub struct Matrix {
    pub name: String,
    pub ty: GgmlType,
    pub rows: usize,
    pub cols: usize,
    range: Range<usize>,
}

impl Matrix {
    /// The kernel view of this matrix in `file` (the file it was loaded from).
    pub fn get<'a>(&self, file: &'a GgufFile) -> WeightRef<'a> {
        WeightRef {
            ty: self.ty,
            data: &file.bytes()[self.range.clone()],
            rows: self.rows,
            cols: self.cols,
        }
    }

    /// Bytes of one row.
    pub fn row_bytes(&self) -> usize {
        (self.range.len()) / self.rows.max(1)
    }

    /// Row `r` widened to f32 (embedding lookup).
    pub fn row_f32(&self, file: &GgufFile, r: usize, out: &mut [f32]) -> Result<(), ModelError> {
        let rb = self.row_bytes();
        let start = self.range.start + r * rb;
        let bytes = &file.bytes()[start..start + rb];
        coil_gguf::quant::dequantize_row(self.ty, bytes, out).map_err(|e| ModelError::Tensor {
            name: self.name.clone(),
            reason: e.to_string(),
        })
    }

    pub fn n_bytes(&self) -> usize {
        self.range.len()
    }
}

/// Typed access to one architecture's keys (`{arch}.…`) and tensors.
pub struct Loader<'a> {
    pub file: &'a GgufFile,
    pub arch: &'a str,
}

impl<'a> Loader<'a> {
    pub fn new(file: &'a GgufFile, arch: &'a str) -> Self {
        Loader { file, arch }
    }

    fn key(&self, suffix: &str) -> String {
        format!("{}.{suffix}", self.arch)
    }

    /// A required count, e.g. `u("block_count")` reads `{arch}.block_count`.
    pub fn u(&self, suffix: &str) -> Result<usize, ModelError> {
        let key = self.key(suffix);
        match self.file.metadata().get(&key) {
            None => Err(ModelError::MissingKey(key)),
            Some(v) => v
                .as_u64()
                .and_then(|x| usize::try_from(x).ok())
                .ok_or_else(|| ModelError::BadKey {
                    key,
                    reason: format!("{v} is not a count"),
                }),
        }
    }

    /// A required count that must lie in `lo..=hi`.
    pub fn u_in(&self, suffix: &str, lo: usize, hi: usize) -> Result<usize, ModelError> {
        let v = self.u(suffix)?;
        if v < lo || v > hi {
            return Err(ModelError::BadKey {
                key: self.key(suffix),
                reason: format!("{v} is outside {lo}..={hi}"),
            });
        }
        Ok(v)
    }

    pub fn u_opt(&self, suffix: &str) -> Result<Option<usize>, ModelError> {
        if self.file.metadata().contains_key(&self.key(suffix)) {
            self.u(suffix).map(Some)
        } else {
            Ok(None)
        }
    }

    pub fn f32_opt(&self, suffix: &str) -> Result<Option<f32>, ModelError> {
        let key = self.key(suffix);
        match self.file.metadata().get(&key) {
            None => Ok(None),
            Some(v) => v.as_f32().map(Some).ok_or_else(|| ModelError::BadKey {
                key,
                reason: format!("{v} is not a number"),
            }),
        }
    }

    pub fn bool_opt(&self, suffix: &str) -> Option<bool> {
        self.file.metadata().get_bool(&self.key(suffix))
    }

    fn info(&self, name: &str) -> Result<&'a TensorInfo, ModelError> {
        self.file
            .tensor_info(name)
            .ok_or_else(|| ModelError::MissingTensor(name.to_string()))
    }

    pub fn has(&self, name: &str) -> bool {
        self.file.tensor_info(name).is_some()
    }

    fn check_dims(info: &TensorInfo, want: &[u64]) -> Result<(), ModelError> {
        // Trailing 1s are equivalent in ggml.
        let trim = |d: &[u64]| {
            let mut v = d.to_vec();
            while v.len() > 1 && v.last() == Some(&1) {
                v.pop();
            }
            v
        };
        if trim(&info.dims) != trim(want) {
            return Err(ModelError::BadShape {
                name: info.name.clone(),
                expected: want.to_vec(),
                found: info.dims.clone(),
            });
        }
        Ok(())
    }

    /// A matrix `[rows, cols]` (ggml ne = [cols, rows]).
    pub fn matrix(&self, name: &str, rows: usize, cols: usize) -> Result<Matrix, ModelError> {
        let info = self.info(name)?;
        Self::check_dims(info, &[cols as u64, rows as u64])?;
        WeightRef::new(info.ty, self.file.view(info).data, rows, cols).map_err(|e| {
            ModelError::Tensor {
                name: name.to_string(),
                reason: e.to_string(),
            }
        })?;
        Ok(Matrix {
            name: name.to_string(),
            ty: info.ty,
            rows,
            cols,
            range: self.file.data_range(info),
        })
    }

    /// `n` matrices `[rows, cols]` stored back to back (ggml ne = [cols,
    /// rows, n]), as one matrix of `n · rows` rows.
    pub fn matrix3(
        &self,
        name: &str,
        n: usize,
        rows: usize,
        cols: usize,
    ) -> Result<Matrix, ModelError> {
        let info = self.info(name)?;
        Self::check_dims(info, &[cols as u64, rows as u64, n as u64])?;
        let total = n * rows;
        WeightRef::new(info.ty, self.file.view(info).data, total, cols).map_err(|e| {
            ModelError::Tensor {
                name: name.to_string(),
                reason: e.to_string(),
            }
        })?;
        Ok(Matrix {
            name: name.to_string(),
            ty: info.ty,
            rows: total,
            cols,
            range: self.file.data_range(info),
        })
    }

    /// Any tensor widened to f32, checking its ggml dims.
    pub fn vector(&self, name: &str, dims: &[usize]) -> Result<Vec<f32>, ModelError> {
        let info = self.info(name)?;
        let want: Vec<u64> = dims.iter().map(|&d| d as u64).collect();
        Self::check_dims(info, &want)?;
        self.file
            .view(info)
            .to_f32()
            .map_err(|e| ModelError::Tensor {
                name: name.to_string(),
                reason: e.to_string(),
            })
    }
}
