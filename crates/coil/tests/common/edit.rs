//! Bad-file tests: a fixture's GGUF rewritten with its metadata or tensor
//! list edited, then loaded.

use super::tool_fixture;
use coil::models;
use coil_gguf::gguf::encode_header;
use coil_gguf::{GgufFile, Metadata, TensorSpec};
use std::sync::Arc;

/// Loads fixture `name` with its metadata and tensor list edited (a
/// reshaped tensor keeps its bytes, cut or zero-padded).
pub fn edited(
    name: &str,
    edit_md: impl FnOnce(&mut Metadata),
    edit_tensors: impl FnOnce(&mut Vec<TensorSpec>),
) -> Result<(), String> {
    let f = GgufFile::open(tool_fixture(name).model).unwrap();
    let mut md = f.metadata().clone();
    edit_md(&mut md);
    let mut specs: Vec<TensorSpec> = f
        .tensors()
        .iter()
        .map(|t| TensorSpec::new(t.name.clone(), &t.dims, t.ty))
        .collect();
    edit_tensors(&mut specs);
    let (mut bytes, sizes) = encode_header(&md, &specs).unwrap();
    for (spec, size) in specs.iter().zip(&sizes) {
        let mut data = match f.tensor_info(&spec.name) {
            Some(t) => f.bytes()[f.data_range(t)].to_vec(),
            None => Vec::new(),
        };
        data.resize(*size as usize, 0);
        bytes.extend_from_slice(&data);
        bytes.resize(bytes.len().div_ceil(32) * 32, 0);
    }
    let file = GgufFile::from_bytes(bytes).map_err(|e| e.to_string())?;
    models::load(Arc::new(file))
        .map(|_| ())
        .map_err(|e| e.to_string())
}

pub fn drop_tensor(name: &'static str) -> impl FnOnce(&mut Vec<TensorSpec>) {
    move |s| s.retain(|t| t.name != name)
}

pub fn reshape(name: &'static str, dims: &'static [u64]) -> impl FnOnce(&mut Vec<TensorSpec>) {
    move |s| {
        for t in s.iter_mut().filter(|t| t.name == name) {
            *t = TensorSpec::new(name, dims, t.ty);
        }
    }
}
