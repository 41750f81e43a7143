//! Reading hyper-parameters and tensors out of a GGUF file, with errors that
//! name the key or tensor. Matrices stay in their GGUF encoding (a byte
//! range of the memory map); small vectors are widened to f32 at load.

use super::ModelError;
use coil_gguf::{GgmlType, GgufFile, TensorInfo, Value};
use coil_kernels::{Layout, WeightRef};
use std::ops::Range;

/// A weight matrix `[rows, cols]` (ggml ne = [cols, rows]) kept as stored.
#[derive(Clone, Debug)]
pub struct Matrix {
    pub name: String,
    pub ty: GgmlType,
    pub rows: usize,
    pub cols: usize,
    /// [`Layout::Lanes16`] when the loader repacked it ([`coil_kernels::repack`]).
    pub layout: Layout,
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
            layout: self.layout,
        }
    }

    /// Bytes of one row.
    pub fn row_bytes(&self) -> usize {
        (self.range.len()) / self.rows.max(1)
    }

    /// Row `r` widened to f32 (embedding lookup).
    pub fn row_f32(&self, file: &GgufFile, r: usize, out: &mut [f32]) -> Result<(), ModelError> {
        if self.layout != Layout::Rows {
            if r >= self.rows || out.len() != self.cols {
                return Err(ModelError::Tensor {
                    name: self.name.clone(),
                    reason: format!("row {r} of {} into {} values", self.rows, out.len()),
                });
            }
            self.get(file).dequantize_row(r, out);
            return Ok(());
        }
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

    /// A per-layer float (one number for every layer, or an array with at
    /// least `n_layer` entries), where the file has it.
    pub fn f32_per_layer_opt(
        &self,
        suffix: &str,
        n_layer: usize,
    ) -> Result<Option<Vec<f32>>, ModelError> {
        let key = self.key(suffix);
        let bad = |reason: String| ModelError::BadKey {
            key: key.clone(),
            reason,
        };
        match self.file.metadata().get(&key) {
            None => Ok(None),
            Some(Value::Array(_, items)) if items.len() >= n_layer => items[..n_layer]
                .iter()
                .map(|v| {
                    v.as_f32()
                        .ok_or_else(|| bad(format!("entry {v} is not a number")))
                })
                .collect::<Result<Vec<f32>, _>>()
                .map(Some),
            Some(Value::Array(_, items)) => Err(bad(format!(
                "has {} entries for {n_layer} layers",
                items.len()
            ))),
            Some(v) => match v.as_f32() {
                Some(x) => Ok(Some(vec![x; n_layer])),
                None => Err(bad(format!("{v} is not a number"))),
            },
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
            layout: self.layout(info),
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
            layout: self.layout(info),
            range: self.file.data_range(info),
        })
    }

    fn layout(&self, info: &TensorInfo) -> Layout {
        if self.file.is_rewritten(info) {
            Layout::Lanes16
        } else {
            Layout::Rows
        }
    }

    /// Any tensor widened to f32, checking its ggml dims.
    pub fn vector(&self, name: &str, dims: &[usize]) -> Result<Vec<f32>, ModelError> {
        let info = self.info(name)?;
        let want: Vec<u64> = dims.iter().map(|&d| d as u64).collect();
        Self::check_dims(info, &want)?;
        if self.file.is_rewritten(info) {
            let cols = dims.first().copied().unwrap_or(0);
            let rows = dims.iter().skip(1).product::<usize>();
            let m = self
                .matrix3(name, 1, rows, cols)
                .map_err(|_| ModelError::Tensor {
                    name: name.to_string(),
                    reason: "repacked for the kernels; not readable as a vector".into(),
                })?;
            let w = m.get(self.file);
            let mut out = vec![0f32; rows * cols];
            for (r, o) in out.chunks_exact_mut(cols.max(1)).enumerate() {
                w.dequantize_row(r, o);
            }
            return Ok(out);
        }
        self.file
            .view(info)
            .to_f32()
            .map_err(|e| ModelError::Tensor {
                name: name.to_string(),
                reason: e.to_string(),
            })
    }
}

/// Rewrites the file's weight matrices of the types [`coil_kernels::repacks`] takes (Q4_K, Q5_K, Q6_K, Q8_0) in memory into the
/// layout of the AVX-512 rows-in-lanes kernels ([`coil_kernels::repack`]: same
/// bytes, reordered by groups of 16 rows), where this process's kernels
/// use it. Not `token_embd.weight`, whose rows are looked up one by one,
/// unless the file has no `output.weight` (a tied table: the output head
/// multiplies by it, 8 tokens at once a third faster in the layout; a
/// looked-up row is unpacked); 3-D (expert) tensors only when each expert's rows are whole groups.
/// Returns how many tensors were rewritten; a read-only map rewrites none.
pub fn repack_for_kernels(file: &mut GgufFile) -> usize {
    repack_for_kernels_where(file, |_| true)
}

/// [`repack_for_kernels`] for the weight types `take` accepts only.
pub fn repack_for_kernels_where(file: &mut GgufFile, take: impl Fn(GgmlType) -> bool) -> usize {
    let mut done = 0;
    let tied = !file.tensors().iter().any(|t| t.name == "output.weight");
    for i in 0..file.tensors().len() {
        let info = &file.tensors()[i];
        let dims = &info.dims;
        let ty = info.ty;
        if !coil_kernels::repacks(ty)
            || !take(ty)
            || dims.len() < 2
            || (info.name == "token_embd.weight" && !tied)
        {
            continue;
        }
        let (cols, per) = (dims[0] as usize, dims[1] as usize);
        let rows = dims[1..].iter().product::<u64>() as usize;
        if !per.is_multiple_of(16) {
            continue;
        }
        if let Some(data) = file.tensor_data_mut(i) {
            if coil_kernels::repack(ty, data, rows, cols) {
                file.mark_rewritten(i);
                done += 1;
            }
        }
    }
    done
}

#[cfg(test)]
mod tests {
    use super::*;
    use coil_gguf::{GgufWriter, Metadata, TensorSpec, Value};
    use coil_kernels::simd::SimdLevel;
    use coil_kernels::testutil::{random_weights, Rng};

    /// A file with two Q4_K matrices (a weight and `token_embd`), a Q5_K
    /// weight and a Q6_K `output`: repacking rewrites the weights but
    /// `token_embd` (where the AVX-512 kernels run), in memory; without
    /// `output` (a tied table, Q6_K as llama.cpp's quantizer makes it)
    /// `token_embd` is rewritten too (it is the output head's matrix). The loader's matrix decodes to the
    /// file's values, reading it as a vector too, and the file on disk is
    /// untouched.
    #[test]
    fn repacked_matrices_read_back_as_in_the_file() {
        let dir = std::env::temp_dir().join(format!("coil-repack-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        for tied in [false, true] {
            let path = dir.join(format!("m{tied}.gguf"));
            let (rows, cols) = (32usize, 512usize);
            let mut rng = Rng::new(9);
            let embd_ty = if tied { GgmlType::Q6_K } else { GgmlType::Q4_K };
            let mut specs = vec![
                TensorSpec::new(
                    "blk.0.ffn_up.weight",
                    &[cols as u64, rows as u64],
                    GgmlType::Q4_K,
                ),
                TensorSpec::new(
                    "blk.0.ffn_gate.weight",
                    &[cols as u64, rows as u64],
                    GgmlType::Q5_K,
                ),
                TensorSpec::new("token_embd.weight", &[cols as u64, rows as u64], embd_ty),
            ];
            if !tied {
                specs.push(TensorSpec::new(
                    "output.weight",
                    &[cols as u64, rows as u64],
                    GgmlType::Q6_K,
                ));
            }
            let mut md = Metadata::new();
            md.insert("general.architecture", Value::String("test".into()));
            let mut wr = GgufWriter::create(&path, &md, &specs).unwrap();
            for spec in &specs {
                wr.write_tensor_data(&random_weights(&mut rng, spec.ty, rows, cols))
                    .unwrap();
            }
            wr.finish().unwrap();
            let before = std::fs::read(&path).unwrap();

            let plain = GgufFile::open(&path).unwrap();
            let mut file = GgufFile::open_prefaulted_private(&path).unwrap();
            let n = repack_for_kernels(&mut file);
            // (AVX-512, and per type: Q6_K not on a Zen 4, none with
            // COIL_REPACK=0)
            let wanted = |spec: &TensorSpec| {
                coil_kernels::repacks(spec.ty) && (tied || spec.name != "token_embd.weight")
            };
            assert_eq!(n, specs.iter().filter(|s| wanted(s)).count(), "tied {tied}");
            if coil_kernels::simd::level() >= SimdLevel::Avx512 {
                assert!(coil_kernels::repacks(GgmlType::Q4_K));
            }
            let (lp, lr) = (Loader::new(&plain, "test"), Loader::new(&file, "test"));
            for spec in &specs {
                let name = spec.name.as_str();
                let (mp, mr) = (
                    lp.matrix(name, rows, cols).unwrap(),
                    lr.matrix(name, rows, cols).unwrap(),
                );
                let repacked = wanted(spec);
                assert_eq!(mr.layout == Layout::Lanes16, repacked, "{name} tied {tied}");
                let (mut a, mut b) = (vec![0f32; cols], vec![0f32; cols]);
                for r in [0, 5, 16, 31] {
                    mp.row_f32(&plain, r, &mut a).unwrap();
                    mr.row_f32(&file, r, &mut b).unwrap();
                    assert_eq!(a, b, "{name} row {r}");
                }
                let (vp, vr) = (
                    lp.vector(name, &[cols, rows]).unwrap(),
                    lr.vector(name, &[cols, rows]).unwrap(),
                );
                assert_eq!(vp, vr, "{name} as a vector");
            }
            drop(file);
            assert_eq!(std::fs::read(&path).unwrap(), before);
        }
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
