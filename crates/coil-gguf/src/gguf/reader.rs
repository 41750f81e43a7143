//! Parsing of the GGUF header: magic, version, metadata, tensor infos.
//!
//! Every read goes through [`Cursor`], which checks the remaining length
//! first; every count is checked against the bytes left before anything is
//! allocated for it. Errors name the field and its byte offset.

use super::value::{Metadata, Value, ValueType};
use super::{GgufError, TensorInfo, GGUF_MAGIC, MAX_DIMS};
use crate::dtype::GgmlType;
use std::collections::HashSet;

/// Deepest nesting of arrays accepted (llama.cpp writes depth 1; a hostile
/// file must not overflow the stack).
const MAX_ARRAY_DEPTH: usize = 8;
/// Default `general.alignment`.
pub const DEFAULT_ALIGNMENT: u64 = 32;

pub(crate) struct Cursor<'a> {
    buf: &'a [u8],
    pos: usize,
}

impl<'a> Cursor<'a> {
    pub(crate) fn new(buf: &'a [u8]) -> Self {
        Cursor { buf, pos: 0 }
    }

    fn remaining(&self) -> u64 {
        (self.buf.len() - self.pos) as u64
    }

    fn take(&mut self, n: u64, field: &str) -> Result<&'a [u8], GgufError> {
        if n > self.remaining() {
            return Err(GgufError::Truncated {
                field: field.to_string(),
                offset: self.pos as u64,
                need: n,
                have: self.remaining(),
            });
        }
        let n = n as usize;
        let s = &self.buf[self.pos..self.pos + n];
        self.pos += n;
        Ok(s)
    }

    fn array<const N: usize>(&mut self, field: &str) -> Result<[u8; N], GgufError> {
        let s = self.take(N as u64, field)?;
        let mut a = [0u8; N];
        a.copy_from_slice(s);
        Ok(a)
    }

    fn u8(&mut self, f: &str) -> Result<u8, GgufError> {
        Ok(self.array::<1>(f)?[0])
    }
    fn u16(&mut self, f: &str) -> Result<u16, GgufError> {
        Ok(u16::from_le_bytes(self.array(f)?))
    }
    fn u32(&mut self, f: &str) -> Result<u32, GgufError> {
        Ok(u32::from_le_bytes(self.array(f)?))
    }
    fn u64(&mut self, f: &str) -> Result<u64, GgufError> {
        Ok(u64::from_le_bytes(self.array(f)?))
    }

    fn string(&mut self, field: &str) -> Result<String, GgufError> {
        let at = self.pos as u64;
        let len = self.u64(field)?;
        if len > self.remaining() {
            // Report the offset of the string itself (its length prefix).
            return Err(GgufError::Truncated {
                field: field.to_string(),
                offset: at,
                need: len,
                have: self.remaining(),
            });
        }
        let bytes = self.take(len, field)?;
        String::from_utf8(bytes.to_vec()).map_err(|_| GgufError::Invalid {
            field: field.to_string(),
            offset: at,
            reason: "string is not valid UTF-8".into(),
        })
    }

    fn invalid(&self, field: &str, offset: usize, reason: String) -> GgufError {
        GgufError::Invalid {
            field: field.to_string(),
            offset: offset as u64,
            reason,
        }
    }

    fn value(&mut self, ty: ValueType, field: &str, depth: usize) -> Result<Value, GgufError> {
        Ok(match ty {
            ValueType::U8 => Value::U8(self.u8(field)?),
            ValueType::I8 => Value::I8(self.u8(field)? as i8),
            ValueType::U16 => Value::U16(self.u16(field)?),
            ValueType::I16 => Value::I16(self.u16(field)? as i16),
            ValueType::U32 => Value::U32(self.u32(field)?),
            ValueType::I32 => Value::I32(self.u32(field)? as i32),
            ValueType::F32 => Value::F32(f32::from_bits(self.u32(field)?)),
            ValueType::U64 => Value::U64(self.u64(field)?),
            ValueType::I64 => Value::I64(self.u64(field)? as i64),
            ValueType::F64 => Value::F64(f64::from_bits(self.u64(field)?)),
            ValueType::Bool => {
                let at = self.pos;
                match self.u8(field)? {
                    0 => Value::Bool(false),
                    1 => Value::Bool(true),
                    b => return Err(self.invalid(field, at, format!("bool byte is {b}"))),
                }
            }
            ValueType::String => Value::String(self.string(field)?),
            ValueType::Array => {
                if depth >= MAX_ARRAY_DEPTH {
                    return Err(self.invalid(
                        field,
                        self.pos,
                        format!("arrays nested deeper than {MAX_ARRAY_DEPTH}"),
                    ));
                }
                let at = self.pos;
                let raw = self.u32(field)?;
                let elem = ValueType::from_u32(raw).ok_or_else(|| {
                    self.invalid(field, at, format!("unknown array element type {raw}"))
                })?;
                let count_at = self.pos;
                let count = self.u64(field)?;
                // Bound the count by what the remaining bytes can hold before
                // allocating anything.
                let min = elem.min_encoded_size();
                if count.checked_mul(min).is_none_or(|b| b > self.remaining()) {
                    return Err(self.invalid(
                        field,
                        count_at,
                        format!(
                            "array of {count} {} elements does not fit in the {} bytes left (truncated or corrupt file)",
                            elem.name(),
                            self.remaining()
                        ),
                    ));
                }
                let mut items = Vec::with_capacity(count as usize);
                for _ in 0..count {
                    items.push(self.value(elem, field, depth + 1)?);
                }
                Value::Array(elem, items)
            }
        })
    }
}

/// The parsed header of a GGUF file.
pub(crate) struct Header {
    pub version: u32,
    pub metadata: Metadata,
    pub tensors: Vec<TensorInfo>,
    pub alignment: u64,
    pub data_offset: u64,
}

/// Parses and validates the header of a GGUF file held in `buf` (the whole
/// file). Tensor data ranges are checked against `buf.len()`.
pub(crate) fn parse_header(buf: &[u8]) -> Result<Header, GgufError> {
    let mut c = Cursor::new(buf);
    let magic = c.array::<4>("magic")?;
    if magic != GGUF_MAGIC {
        return Err(GgufError::BadMagic(magic));
    }
    let version = c.u32("version")?;
    match version {
        2 | 3 => {}
        1 => return Err(GgufError::UnsupportedVersion(version)),
        v if v.swap_bytes() == 2 || v.swap_bytes() == 3 => return Err(GgufError::BigEndian),
        v => return Err(GgufError::UnsupportedVersion(v)),
    }
    let n_tensors_at = c.pos;
    let n_tensors = c.u64("tensor_count")?;
    let n_kv_at = c.pos;
    let n_kv = c.u64("metadata_kv_count")?;
    // A kv takes at least 8 (key len) + 4 (type) + 1 bytes; a tensor info at
    // least 8 + 4 + 4 + 8.
    if n_kv.checked_mul(13).is_none_or(|b| b > c.remaining()) {
        return Err(c.invalid(
            "metadata_kv_count",
            n_kv_at,
            format!(
                "{n_kv} entries cannot fit in the {} bytes left (truncated or corrupt file)",
                c.remaining()
            ),
        ));
    }
    if n_tensors.checked_mul(24).is_none_or(|b| b > c.remaining()) {
        return Err(c.invalid(
            "tensor_count",
            n_tensors_at,
            format!(
                "{n_tensors} tensors cannot fit in the {} bytes left (truncated or corrupt file)",
                c.remaining()
            ),
        ));
    }

    let mut metadata = Metadata::new();
    for i in 0..n_kv {
        let key_at = c.pos;
        let key = c.string(&format!("metadata[{i}].key"))?;
        if metadata.contains_key(&key) {
            return Err(c.invalid(&key, key_at, "duplicate metadata key".into()));
        }
        let ty_at = c.pos;
        let raw = c.u32(&key)?;
        let ty = ValueType::from_u32(raw)
            .ok_or_else(|| c.invalid(&key, ty_at, format!("unknown value type {raw}")))?;
        let v = c.value(ty, &key, 0)?;
        metadata.insert(key, v);
    }

    let alignment = match metadata.get("general.alignment") {
        None => DEFAULT_ALIGNMENT,
        Some(Value::U32(a)) if *a > 0 && a.is_power_of_two() => *a as u64,
        Some(v) => {
            return Err(GgufError::Invalid {
                field: "general.alignment".into(),
                offset: 0,
                reason: format!("must be a u32 power of two, found {v}"),
            })
        }
    };

    let mut tensors = Vec::with_capacity(n_tensors as usize);
    let mut names = HashSet::new();
    for i in 0..n_tensors {
        let name_at = c.pos;
        let name = c.string(&format!("tensor[{i}].name"))?;
        if !names.insert(name.clone()) {
            return Err(c.invalid(&name, name_at, "duplicate tensor name".into()));
        }
        let field = |what: &str| format!("tensor {name:?} {what}");
        let nd_at = c.pos;
        let n_dims = c.u32(&field("n_dims"))?;
        if n_dims as usize > MAX_DIMS {
            return Err(c.invalid(
                &field("n_dims"),
                nd_at,
                format!("{n_dims} dimensions (at most {MAX_DIMS})"),
            ));
        }
        let mut dims = Vec::with_capacity(n_dims as usize);
        for d in 0..n_dims {
            dims.push(c.u64(&field(&format!("ne[{d}]")))?);
        }
        let ty_at = c.pos;
        let raw = c.u32(&field("type"))?;
        let ty = GgmlType::from_id(raw)
            .ok_or_else(|| c.invalid(&field("type"), ty_at, format!("unknown ggml type {raw}")))?;
        let off_at = c.pos;
        let offset = c.u64(&field("offset"))?;
        let n_elements = dims
            .iter()
            .try_fold(1u64, |acc, &d| acc.checked_mul(d))
            .ok_or_else(|| {
                c.invalid(
                    &field("shape"),
                    nd_at,
                    format!("{dims:?} overflows the element count"),
                )
            })?;
        let (bs, _) = ty.block_layout();
        let ne0 = dims.first().copied().unwrap_or(1);
        if ne0 % bs as u64 != 0 {
            return Err(c.invalid(
                &field("shape"),
                nd_at,
                format!("first dimension {ne0} is not a multiple of the {ty} block size {bs}"),
            ));
        }
        let n_bytes = ty.bytes_for(n_elements).ok_or_else(|| {
            c.invalid(
                &field("shape"),
                nd_at,
                format!("{dims:?} of {ty} overflows the byte size"),
            )
        })?;
        if offset % alignment != 0 {
            return Err(c.invalid(
                &field("offset"),
                off_at,
                format!("{offset} is not a multiple of the alignment {alignment}"),
            ));
        }
        tensors.push(TensorInfo {
            name,
            dims,
            ty,
            offset,
            n_elements,
            n_bytes,
            part: 0,
        });
    }

    let data_offset = (c.pos as u64).div_ceil(alignment) * alignment;
    let file_len = buf.len() as u64;
    for t in &tensors {
        let end = data_offset
            .checked_add(t.offset)
            .and_then(|s| s.checked_add(t.n_bytes));
        match end {
            Some(end) if end <= file_len => {}
            _ => {
                return Err(GgufError::TensorOutOfBounds {
                    name: t.name.clone(),
                    offset: data_offset.saturating_add(t.offset),
                    n_bytes: t.n_bytes,
                    file_len,
                })
            }
        }
    }
    Ok(Header {
        version,
        metadata,
        tensors,
        alignment,
        data_offset,
    })
}
