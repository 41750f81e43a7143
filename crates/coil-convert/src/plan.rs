//! What to write: each output tensor's GGUF name, shape and the recipe that
//! makes its data from checkpoint tensors (stack, split, `−exp`, scale, Q/K
//! row permutation, reshape). Recipes run one tensor at a time.

use crate::error::{ConvertError, Result};
use crate::safetensors_src::{Checkpoint, SrcDtype};
use coil_gguf::GgmlType;

/// Where an output tensor's elements come from.
#[derive(Clone, Debug)]
pub enum Source {
    One(String),
    /// `torch.stack(tensors, dim=0)` (MoE experts).
    Stack(Vec<String>),
    /// `torch.cat(tensors, dim=0)` of matrices of one width (the shards of
    /// Qwen4-Exp's n-gram table).
    Concat(Vec<String>),
    /// `t.split(n_rows, dim=-2)[part]`: rows `part·n_rows ..` of every
    /// trailing matrix (merged gate/up projections).
    SplitRows {
        name: String,
        part: usize,
        n_rows: usize,
    },
    /// Values computed by the converter (e.g. Llama 3's RoPE factors).
    Data(Vec<f32>),
    /// The tensor viewed as a matrix `[shape[0], rest]`, its rows and then
    /// its columns picked in the given orders (`None`: all, in order):
    /// head reorders and the split of fused projections (Gated DeltaNet).
    Gather {
        name: String,
        rows: Option<Vec<usize>>,
        cols: Option<Vec<usize>>,
    },
    /// The tensor viewed as `n_head` blocks of rows `[n_head, rows / n_head,
    /// cols]`; from each block, rows `first..first + n_rows`, transposed:
    /// `[n_head, cols, n_rows]` (MLA's `kv_b_proj` → `attn_k_b`).
    HeadRowsTransposed {
        name: String,
        n_head: usize,
        first: usize,
        n_rows: usize,
    },
}

/// An element-wise or row transform, applied in order.
#[derive(Clone, Debug)]
pub enum Op {
    /// `A = −exp(A_log)`.
    NegExp,
    /// `exp(A_log)`.
    Exp,
    /// Multiply everything by a constant.
    Scale(f64),
    /// Add a constant to everything (zero-centred RMSNorm weights, `w + 1`).
    Add(f64),
    /// Multiply rows `start..end` (outermost dimension) by a constant.
    ScaleRows {
        start: usize,
        end: usize,
        factor: f64,
    },
    /// Reorder the rows of each of `n_head` heads from transformers'
    /// rotate-half layout to ggml's adjacent pairs, over the first `rot`
    /// rows of each head (llama.cpp's `LlamaModel.permute` when `rot` is the
    /// whole head).
    PermuteQk { n_head: usize, rot: usize },
}

/// One tensor of the output file.
#[derive(Clone, Debug)]
pub struct OutTensor {
    pub name: String,
    /// Row-major shape, outermost first (the GGUF dims are its reverse).
    pub shape: Vec<usize>,
    pub src: Source,
    pub ops: Vec<Op>,
}

impl OutTensor {
    pub fn one(name: impl Into<String>, src: &str, shape: &[usize]) -> OutTensor {
        OutTensor {
            name: name.into(),
            shape: shape.to_vec(),
            src: Source::One(src.to_string()),
            ops: Vec::new(),
        }
    }

    pub fn with(mut self, op: Op) -> OutTensor {
        self.ops.push(op);
        self
    }

    pub fn n_elements(&self) -> usize {
        self.shape.iter().product()
    }

    /// GGUF dims (ne0 first).
    pub fn dims(&self) -> Vec<u64> {
        self.shape.iter().rev().map(|&d| d as u64).collect()
    }

    fn sources(&self) -> Vec<&str> {
        match &self.src {
            Source::One(n)
            | Source::SplitRows { name: n, .. }
            | Source::Gather { name: n, .. }
            | Source::HeadRowsTransposed { name: n, .. } => vec![n.as_str()],
            Source::Stack(v) | Source::Concat(v) => v.iter().map(String::as_str).collect(),
            Source::Data(_) => Vec::new(),
        }
    }

    /// Computes the data as f32, rounding after each arithmetic step to the
    /// source's precision the way the reference converter (PyTorch) does:
    /// f16 stays f16, bf16 and f32 work in f32.
    pub fn materialize(&self, ck: &Checkpoint) -> Result<Vec<f32>> {
        let mut half_work = true;
        for s in self.sources() {
            let t = ck.req(s)?;
            if t.dtype != SrcDtype::F16 {
                half_work = false;
            }
        }
        let mut data = match &self.src {
            Source::Data(v) => v.clone(),
            Source::One(n) => ck.read_f32(ck.req(n)?)?,
            Source::Stack(names) => {
                let first = ck.req(&names[0])?;
                let mut out = Vec::with_capacity(first.n_elements() * names.len());
                for n in names {
                    let t = ck.req(n)?;
                    if t.shape != first.shape {
                        return Err(ConvertError::Shape {
                            name: n.clone(),
                            actual: t.shape.clone(),
                            expected: first.shape.clone(),
                        });
                    }
                    out.extend(ck.read_f32(t)?);
                }
                out
            }
            Source::Concat(names) => {
                let mut out = Vec::new();
                for n in names {
                    out.extend(ck.read_f32(ck.req(n)?)?);
                }
                out
            }
            Source::SplitRows { name, part, n_rows } => {
                let t = ck.req(name)?;
                let all = ck.read_f32(t)?;
                let nd = t.shape.len();
                // (zero-sized rows or parts would leave nothing to take)
                if nd < 2
                    || t.shape[nd - 1] == 0
                    || *n_rows == 0
                    || (part + 1)
                        .checked_mul(*n_rows)
                        .is_none_or(|need| t.shape[nd - 2] < need)
                {
                    return Err(ConvertError::tensor(
                        name,
                        format!(
                            "shape {:?} cannot be split into parts of {n_rows} rows",
                            t.shape
                        ),
                    ));
                }
                let cols = t.shape[nd - 1];
                let rows = t.shape[nd - 2];
                let mut out = Vec::with_capacity(all.len() / (rows / n_rows).max(1));
                for m in all.chunks_exact(rows * cols) {
                    out.extend_from_slice(&m[part * n_rows * cols..(part + 1) * n_rows * cols]);
                }
                out
            }
            Source::Gather { name, rows, cols } => {
                let t = ck.req(name)?;
                gather(
                    name,
                    &ck.read_f32(t)?,
                    &t.shape,
                    rows.as_deref(),
                    cols.as_deref(),
                )?
            }
            Source::HeadRowsTransposed {
                name,
                n_head,
                first,
                n_rows,
            } => {
                let t = ck.req(name)?;
                head_rows_transposed(name, &ck.read_f32(t)?, &t.shape, *n_head, *first, *n_rows)?
            }
        };
        if data.len() != self.n_elements() {
            return Err(ConvertError::tensor(
                &self.name,
                format!(
                    "{} elements from the checkpoint, {} expected for shape {:?}",
                    data.len(),
                    self.n_elements(),
                    self.shape
                ),
            ));
        }
        let n_rows = self.shape.first().copied().unwrap_or(1).max(1);
        self.apply_ops(&mut data, 0, n_rows, half_work)?;
        Ok(data)
    }

    /// Whether the tensor can be made a block of rows at a time (one source,
    /// no Q/K permutation).
    pub fn streamable(&self) -> bool {
        matches!(self.src, Source::One(_))
            && !self.ops.iter().any(|o| matches!(o, Op::PermuteQk { .. }))
    }

    /// Rows `r0..r1` (outermost dimension) of a [`OutTensor::streamable`]
    /// tensor.
    pub fn materialize_rows(&self, ck: &Checkpoint, r0: usize, r1: usize) -> Result<Vec<f32>> {
        let Source::One(n) = &self.src else {
            return Err(ConvertError::tensor(&self.name, "not streamable"));
        };
        let t = ck.req(n)?;
        if t.n_elements() != self.n_elements() {
            return Err(ConvertError::Shape {
                name: t.name.clone(),
                actual: t.shape.clone(),
                expected: self.shape.clone(),
            });
        }
        let n_rows = self.shape.first().copied().unwrap_or(1).max(1);
        let row_len = self.n_elements() / n_rows;
        let mut data = ck.read_f32_range(t, r0 * row_len, r1 * row_len)?;
        self.apply_ops(&mut data, r0, n_rows, t.dtype == SrcDtype::F16)?;
        Ok(data)
    }

    /// Applies the element / row ops to `data`, which holds rows
    /// `row0..` of a tensor of `n_rows` rows.
    fn apply_ops(
        &self,
        data: &mut [f32],
        row0: usize,
        n_rows: usize,
        half_work: bool,
    ) -> Result<()> {
        let round = |v: &mut [f32]| {
            if half_work {
                for x in v.iter_mut() {
                    *x = half::f16::from_f32(*x).to_f32();
                }
            }
        };
        let row_len = self.n_elements() / n_rows.max(1);
        let have_rows = data.len().checked_div(row_len).unwrap_or(0);
        for op in &self.ops {
            match *op {
                Op::NegExp | Op::Exp => {
                    let sign = if matches!(*op, Op::NegExp) { -1.0 } else { 1.0 };
                    for x in data.iter_mut() {
                        // exp in f64, rounded once: the correctly rounded f32
                        // result on every platform.
                        *x = sign * ((*x as f64).exp() as f32);
                    }
                    round(data);
                }
                Op::Scale(f) => {
                    let f = f as f32;
                    for x in data.iter_mut() {
                        *x *= f;
                    }
                    round(data);
                }
                Op::Add(a) => {
                    let a = a as f32;
                    for x in data.iter_mut() {
                        *x += a;
                    }
                    round(data);
                }
                Op::ScaleRows { start, end, factor } => {
                    let f = factor as f32;
                    let s = start.clamp(row0, row0 + have_rows) - row0;
                    let e = end.clamp(row0, row0 + have_rows) - row0;
                    if s < e {
                        let part = &mut data[s * row_len..e * row_len];
                        for x in part.iter_mut() {
                            *x *= f;
                        }
                        round(part);
                    }
                }
                Op::PermuteQk { n_head, rot } => permute_qk(&self.name, data, n_rows, n_head, rot)?,
            }
        }
        Ok(())
    }
}

/// `data` (of `shape`) as a matrix `[shape[0], rest]` with the chosen rows
/// and columns, in the given orders.
fn gather(
    name: &str,
    data: &[f32],
    shape: &[usize],
    rows: Option<&[usize]>,
    cols: Option<&[usize]>,
) -> Result<Vec<f32>> {
    let n_rows = shape.first().copied().unwrap_or(1).max(1);
    let n_cols = data.len() / n_rows;
    let all_rows: Vec<usize>;
    let rows = match rows {
        Some(r) => r,
        None => {
            all_rows = (0..n_rows).collect();
            &all_rows
        }
    };
    let bad = |what: &str, i: usize, n: usize| {
        ConvertError::tensor(
            name,
            format!("{what} {i} picked from a tensor of shape {shape:?} ({n} {what}s)"),
        )
    };
    let mut out = Vec::with_capacity(rows.len() * cols.map_or(n_cols, <[usize]>::len));
    for &r in rows {
        if r >= n_rows {
            return Err(bad("row", r, n_rows));
        }
        let row = &data[r * n_cols..(r + 1) * n_cols];
        match cols {
            None => out.extend_from_slice(row),
            Some(cs) => {
                for &c in cs {
                    out.push(*row.get(c).ok_or_else(|| bad("column", c, n_cols))?);
                }
            }
        }
    }
    Ok(out)
}

/// See [`Source::HeadRowsTransposed`].
fn head_rows_transposed(
    name: &str,
    data: &[f32],
    shape: &[usize],
    n_head: usize,
    first: usize,
    n_rows: usize,
) -> Result<Vec<f32>> {
    let rows = shape.first().copied().unwrap_or(0);
    let cols = data.len().checked_div(rows).unwrap_or(0);
    if shape.len() != 2
        || n_head == 0
        || !rows.is_multiple_of(n_head)
        || first + n_rows > rows / n_head
    {
        return Err(ConvertError::tensor(
            name,
            format!(
                "shape {shape:?} is not {n_head} heads of at least {} rows",
                first + n_rows
            ),
        ));
    }
    let per = rows / n_head;
    let mut out = Vec::with_capacity(n_head * cols * n_rows);
    for h in 0..n_head {
        for c in 0..cols {
            for r in 0..n_rows {
                out.push(data[(h * per + first + r) * cols + c]);
            }
        }
    }
    Ok(out)
}

/// Row permutation of Q/K: within each head of `hd = rows / n_head` rows,
/// output row `2i + j` takes input row `j·rot/2 + i` for `i < rot/2`,
/// `j < 2`; rows `rot..hd` stay.
fn permute_qk(name: &str, data: &mut [f32], rows: usize, n_head: usize, rot: usize) -> Result<()> {
    if n_head == 0 || !rows.is_multiple_of(n_head) {
        return Err(ConvertError::tensor(
            name,
            format!("{rows} rows do not divide into {n_head} heads"),
        ));
    }
    let hd = rows / n_head;
    if rot > hd || !rot.is_multiple_of(2) {
        return Err(ConvertError::tensor(
            name,
            format!("rotary dimension {rot} does not fit head size {hd} (must be even and ≤ it)"),
        ));
    }
    let cols = data.len() / rows;
    let src = data.to_vec();
    let half = rot / 2;
    for h in 0..n_head {
        for i in 0..half {
            for j in 0..2 {
                let dst_row = h * hd + 2 * i + j;
                let src_row = h * hd + j * half + i;
                data[dst_row * cols..(dst_row + 1) * cols]
                    .copy_from_slice(&src[src_row * cols..(src_row + 1) * cols]);
            }
        }
    }
    Ok(())
}

/// The output type llama.cpp's converter picks for a tensor, given the
/// requested file type: 1-D tensors, norms, router weights, `ssm_conv1d`
/// (and KDA's `ssm_conv1d_q` / `_k` / `_v`), `shortconv.conv`
/// and anything not named `*.weight` (`ssm_a`, `ssm_d`, biases) stay F32;
/// Q8_0 falls back to F16 when rows are not whole blocks.
pub fn output_type(name: &str, shape: &[usize], requested: GgmlType) -> GgmlType {
    let f32_names = [
        ".ffn_gate_inp.weight",
        ".ffn_gate_inp_shexp.weight",
        ".ssm_conv1d.weight",
        ".ssm_conv1d_q.weight",
        ".ssm_conv1d_k.weight",
        ".ssm_conv1d_v.weight",
        ".shortconv.conv.weight",
        "position_embd.weight",
        "token_types.weight",
    ];
    if shape.len() <= 1
        || name.ends_with("_norm.weight")
        || f32_names.iter().any(|s| name.ends_with(s))
        || !name.ends_with(".weight")
    {
        return GgmlType::F32;
    }
    let ne0 = shape.last().copied().unwrap_or(1);
    if !ne0.is_multiple_of(requested.block_size()) {
        return GgmlType::F16;
    }
    requested
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn permute_matches_llama_cpp() {
        // 1 head of 4 rows, 1 column: reshape(1, 2, 2).swapaxes(1, 2) → rows 0, 2, 1, 3
        let mut d = vec![0.0, 1.0, 2.0, 3.0];
        permute_qk("q", &mut d, 4, 1, 4).unwrap();
        assert_eq!(d, [0.0, 2.0, 1.0, 3.0]);
        // partial: 6 rows, rot 4 → 0, 2, 1, 3, 4, 5
        let mut d: Vec<f32> = (0..6).map(|x| x as f32).collect();
        permute_qk("q", &mut d, 6, 1, 4).unwrap();
        assert_eq!(d, [0.0, 2.0, 1.0, 3.0, 4.0, 5.0]);
        assert!(permute_qk("q", &mut d, 6, 4, 4).is_err());
    }

    #[test]
    fn types() {
        use GgmlType::*;
        assert_eq!(output_type("blk.0.ssm_a", &[4, 1], F16), F32);
        assert_eq!(output_type("blk.0.ssm_norm.weight", &[2, 32], F16), F32);
        assert_eq!(output_type("blk.0.ssm_in.weight", &[196, 32], Q8_0), Q8_0);
        assert_eq!(output_type("blk.0.ssm_x.weight", &[36, 64], Q8_0), Q8_0);
        assert_eq!(output_type("blk.0.ssm_dt.weight", &[64, 4], Q8_0), F16);
        assert_eq!(output_type("blk.0.ffn_gate_inp.weight", &[6, 32], F16), F32);
    }
}
