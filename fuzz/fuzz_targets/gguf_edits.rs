//! Tiny GGUF models edited as a bad converter or a damaged download would
//! edit them, for the `model` and `quantize` targets: every parity fixture
//! in `tests/fixtures/parity` (each architecture coil loads), its metadata
//! and tensor table changed by 8-byte edit records (see [`apply`]), rebuilt
//! in memory (see [`edited`]).
#![allow(dead_code)]

use coil_gguf::gguf::encode_header;
use coil_gguf::{GgmlType, GgufFile, Metadata, TensorSpec, Value};
use std::path::PathBuf;
use std::sync::OnceLock;

/// A fixture as (metadata, tensors with their bytes).
pub struct Base {
    pub md: Metadata,
    pub tensors: Vec<(TensorSpec, Vec<u8>)>,
}

pub fn fixtures() -> &'static [Base] {
    static F: OnceLock<Vec<Base>> = OnceLock::new();
    F.get_or_init(|| {
        let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures/parity");
        let mut names: Vec<PathBuf> = std::fs::read_dir(&dir)
            .expect("tests/fixtures/parity")
            .filter_map(|e| Some(e.ok()?.path().join("model.gguf")))
            .filter(|p| p.is_file())
            .collect();
        names.sort();
        names
            .iter()
            .map(|p| {
                let f = GgufFile::open(p).expect("a parity fixture parses");
                let tensors = f
                    .tensors()
                    .iter()
                    .map(|t| {
                        let spec = TensorSpec::new(t.name.clone(), &t.dims, t.ty);
                        (spec, f.bytes()[f.data_range(t)].to_vec())
                    })
                    .collect();
                Base {
                    md: f.metadata().clone(),
                    tensors,
                }
            })
            .collect()
    })
}

/// `v` as a value near the real ones (0..=64, most of the time) or any u32.
fn pick(v: u32, wide: bool) -> u64 {
    if wide {
        v as u64
    } else {
        (v % 65) as u64
    }
}

/// `old` with its integer replaced by `v` (same type, wrapped); `None` for
/// a value that is not an integer.
fn with_int(old: &Value, v: u64) -> Option<Value> {
    Some(match old {
        Value::U8(_) => Value::U8(v as u8),
        Value::I8(_) => Value::I8(v as i8),
        Value::U16(_) => Value::U16(v as u16),
        Value::I16(_) => Value::I16(v as i16),
        Value::U32(_) => Value::U32(v as u32),
        Value::I32(_) => Value::I32(v as i32),
        Value::U64(_) => Value::U64(v),
        Value::I64(_) => Value::I64(v as i64),
        Value::Bool(_) => Value::Bool(v & 1 == 1),
        _ => return None,
    })
}

/// The keys of `md` whose value `keep` accepts, in a fixed order.
fn keys(md: &Metadata, keep: impl Fn(&Value) -> bool) -> Vec<String> {
    let mut k: Vec<String> = md
        .iter()
        .filter(|(_, v)| keep(v))
        .map(|(k, _)| k.to_string())
        .collect();
    k.sort();
    k
}

/// Tensor types a damaged file might name instead.
const TYPES: [GgmlType; 6] = [
    GgmlType::F32,
    GgmlType::F16,
    GgmlType::BF16,
    GgmlType::Q8_0,
    GgmlType::Q4_K,
    GgmlType::Q6_K,
];

/// Most elements an edited tensor may hold (keeps one run's memory small).
const MAX_ELEMENTS: u64 = 1 << 22;

/// One edit: `op % 8` picks what changes, `a` which key or tensor, `b` a
/// dim or array element (and, in its high bit, a value from the whole u32
/// range), `v` the new value.
pub fn apply(md: &mut Metadata, tensors: &mut Vec<(TensorSpec, Vec<u8>)>, rec: &[u8]) {
    let (op, a, b) = (
        rec[0] % 8,
        u16::from_le_bytes([rec[1], rec[2]]) as usize,
        rec[3],
    );
    let v = u32::from_le_bytes([rec[4], rec[5], rec[6], rec[7]]);
    let wide = b & 0x80 != 0;
    let nt = tensors.len();
    match op {
        // an integer (or bool) value
        0 => {
            let k = keys(md, |v| v.as_int().is_some() || v.as_bool().is_some());
            if let Some(key) = k.get(a % k.len().max(1)) {
                let new = with_int(md.get(key).unwrap(), pick(v, wide));
                md.insert(key.clone(), new.unwrap());
            }
        }
        // one element of an integer or bool array (per-layer head counts,
        // rope sections, LFM3's sliding-window pattern, Zamba2's shared-block
        // schedule: a signed array's element set to −2..2 half the time,
        // no block, a block or one the file lacks)
        1 => {
            let k = keys(md, |v| {
                v.as_array().is_some_and(|a| {
                    !a.is_empty() && (a[0].as_int().is_some() || a[0].as_bool().is_some())
                })
            });
            if let Some(key) = k.get(a % k.len().max(1)) {
                if let Some(Value::Array(ty, items)) = md.get(key).cloned() {
                    let mut items = items;
                    let i = (b & 0x7f) as usize % items.len();
                    let signed = matches!(
                        items[i],
                        Value::I8(_) | Value::I16(_) | Value::I32(_) | Value::I64(_)
                    );
                    let x = match signed && !wide && v & 0x100 != 0 {
                        true => ((v % 5) as i64 - 2) as u64,
                        false => pick(v, wide),
                    };
                    if let Some(new) = with_int(&items[i], x) {
                        items[i] = new;
                        md.insert(key.clone(), Value::Array(ty, items));
                    }
                }
            }
        }
        // a float value (norm epsilons, rope bases, scales, the KDA gate's
        // lower bound), or one element of a float array (per-layer SwiGLU
        // limits): any bits
        2 if b & 1 == 0 => {
            let k = keys(md, |v| matches!(v, Value::F32(_)));
            if let Some(key) = k.get(a % k.len().max(1)) {
                md.insert(key.clone(), Value::F32(f32::from_bits(v)));
            }
        }
        2 => {
            let k = keys(md, |v| {
                v.as_array()
                    .is_some_and(|a| matches!(a.first(), Some(Value::F32(_))))
            });
            if let Some(key) = k.get(a % k.len().max(1)) {
                if let Some(Value::Array(ty, mut items)) = md.get(key).cloned() {
                    let i = (b >> 1) as usize % items.len();
                    items[i] = Value::F32(f32::from_bits(v));
                    md.insert(key.clone(), Value::Array(ty, items));
                }
            }
        }
        // a key removed
        3 => {
            let k = keys(md, |_| true);
            if let Some(key) = k.get(a % k.len().max(1)) {
                md.remove(key);
            }
        }
        // one dim of a tensor
        4 if nt > 0 => {
            let t = &mut tensors[a % nt].0;
            let d = (b & 0x7f) as usize % t.dims.len();
            let mut dims = t.dims.clone();
            dims[d] = pick(v, wide);
            if dims
                .iter()
                .try_fold(1u64, |p, &x| p.checked_mul(x))
                .is_some_and(|n| n <= MAX_ELEMENTS)
            {
                t.dims = dims;
            }
        }
        // a dim added or dropped
        5 if nt > 0 => {
            let t = &mut tensors[a % nt].0;
            if b & 1 == 0 && t.dims.len() > 1 {
                t.dims.pop();
            } else if t.dims.len() < 4 {
                t.dims.push(pick(v, false).clamp(1, 4));
            }
        }
        // a tensor dropped
        6 if nt > 0 => {
            tensors.remove(a % nt);
        }
        // a tensor's type changed
        7 if nt > 0 => {
            tensors[a % nt].0.ty = TYPES[v as usize % TYPES.len()];
        }
        _ => {}
    }
}

/// The edited fixture as a GGUF in memory, or `None` where the edits make
/// a tensor table the writer refuses (a size it cannot encode).
pub fn rebuild(md: &Metadata, tensors: &mut [(TensorSpec, Vec<u8>)]) -> Option<GgufFile> {
    let specs: Vec<TensorSpec> = tensors.iter().map(|t| t.0.clone()).collect();
    let (mut bytes, sizes) = encode_header(md, &specs).ok()?;
    for ((_, data), size) in tensors.iter_mut().zip(&sizes) {
        // a reshaped or retyped tensor keeps its bytes, cut or zero-padded
        data.resize(usize::try_from(*size).ok()?, 0);
        bytes.extend_from_slice(data);
        bytes.resize(bytes.len().div_ceil(32) * 32, 0);
    }
    GgufFile::from_bytes(bytes).ok()
}

/// Fixture `which` (modulo their number) with the edit records of `edits`
/// (16 at most) applied, rebuilt; `None` where the writer refuses the table.
pub fn edited(which: u8, edits: &[u8]) -> Option<GgufFile> {
    let all = fixtures();
    let base = &all[which as usize % all.len()];
    let mut md = base.md.clone();
    let mut tensors = base.tensors.clone();
    for rec in edits.chunks_exact(8).take(16) {
        apply(&mut md, &mut tensors, rec);
    }
    rebuild(&md, &mut tensors)
}
