//! Hugging Face checkpoints edited as a hand-made config or a broken export
//! would have them: every checkpoint in `tests/fixtures/hf` (each
//! architecture `coil convert` takes, a tiny one each), with its
//! `config.json` and the tensor table of its `model.safetensors` changed by
//! the edits the input spells out, written to a scratch folder, converted
//! by `coil_convert::convert`; where that succeeds, the GGUF it wrote is
//! loaded and run as the `model` target runs its files. What must
//! hold: an error, never a panic (nor an overflow: cargo-fuzz builds with
//! debug assertions), and no output file left behind by a failed
//! conversion.
//!
//! Input: byte 0 picks the checkpoint, then 8-byte records, one edit each:
//! `[op, a (u16), b, v (u32)]` (see [`apply`]). The safetensors file is
//! always written consistent (offsets matching the shapes and types, the
//! data cut or zero-padded): the edits make a well-formed checkpoint that
//! disagrees with itself or with its config, not a corrupt container (the
//! `gguf` target's business for GGUF; the safetensors reader has its own
//! tests).
#![no_main]

#[path = "common.rs"]
mod common;

use coil_convert::{convert, ConvertOptions};
use coil_gguf::GgufFile;
use libfuzzer_sys::fuzz_target;
use serde_json::{json, Map, Value};
use std::path::{Path, PathBuf};
use std::sync::{Arc, OnceLock};

/// One tensor of a safetensors file.
#[derive(Clone)]
struct Tensor {
    name: String,
    dtype: String,
    shape: Vec<u64>,
    data: Vec<u8>,
}

/// A checkpoint: its folder (for the files copied as they are), config and
/// tensors.
struct Base {
    dir: PathBuf,
    config: Value,
    tensors: Vec<Tensor>,
}

fn read_safetensors(path: &Path) -> Vec<Tensor> {
    let b = std::fs::read(path).expect("a fixture's model.safetensors");
    let n = u64::from_le_bytes(b[..8].try_into().unwrap()) as usize;
    let header: Map<String, Value> = serde_json::from_slice(&b[8..8 + n]).unwrap();
    let data = &b[8 + n..];
    let mut out: Vec<Tensor> = header
        .iter()
        .filter(|(k, _)| *k != "__metadata__")
        .map(|(name, v)| {
            let off = v["data_offsets"].as_array().unwrap();
            let (s, e) = (off[0].as_u64().unwrap(), off[1].as_u64().unwrap());
            Tensor {
                name: name.clone(),
                dtype: v["dtype"].as_str().unwrap().to_string(),
                shape: v["shape"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .map(|d| d.as_u64().unwrap())
                    .collect(),
                data: data[s as usize..e as usize].to_vec(),
            }
        })
        .collect();
    out.sort_by(|a, b| a.name.cmp(&b.name));
    out
}

fn write_safetensors(path: &Path, tensors: &mut [Tensor]) -> std::io::Result<()> {
    let mut header = Map::new();
    header.insert("__metadata__".into(), json!({"format": "pt"}));
    let mut off = 0u64;
    for t in tensors.iter_mut() {
        let n: u64 = t.shape.iter().product::<u64>() * dtype_size(&t.dtype);
        t.data.resize(n as usize, 0);
        header.insert(
            t.name.clone(),
            json!({"dtype": t.dtype, "shape": t.shape, "data_offsets": [off, off + n]}),
        );
        off += n;
    }
    let mut h = serde_json::to_vec(&Value::Object(header)).unwrap();
    h.resize(h.len().div_ceil(8) * 8, b' ');
    let mut bytes = (h.len() as u64).to_le_bytes().to_vec();
    bytes.extend_from_slice(&h);
    for t in tensors.iter() {
        bytes.extend_from_slice(&t.data);
    }
    std::fs::write(path, bytes)
}

fn dtype_size(dtype: &str) -> u64 {
    match dtype {
        "F64" | "I64" | "U64" => 8,
        "F32" | "I32" | "U32" => 4,
        "F16" | "BF16" | "I16" | "U16" => 2,
        _ => 1,
    }
}

fn fixtures() -> &'static [Base] {
    static F: OnceLock<Vec<Base>> = OnceLock::new();
    F.get_or_init(|| {
        let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures/hf");
        let mut dirs: Vec<PathBuf> = std::fs::read_dir(&root)
            .expect("tests/fixtures/hf")
            .filter_map(|e| Some(e.ok()?.path()))
            .filter(|p| p.join("config.json").is_file() && p.join("model.safetensors").is_file())
            .collect();
        dirs.sort();
        dirs.into_iter()
            .map(|dir| Base {
                config: serde_json::from_slice(&std::fs::read(dir.join("config.json")).unwrap())
                    .unwrap(),
                tensors: read_safetensors(&dir.join("model.safetensors")),
                dir,
            })
            .collect()
    })
}

/// JSON pointers to the config's leaves that `keep` accepts, in document
/// order (objects by key).
fn leaves(v: &Value, at: String, keep: &dyn Fn(&Value) -> bool, out: &mut Vec<String>) {
    match v {
        Value::Object(m) => {
            for (k, x) in m {
                leaves(
                    x,
                    format!("{at}/{}", k.replace('~', "~0").replace('/', "~1")),
                    keep,
                    out,
                )
            }
        }
        Value::Array(a) => {
            for (i, x) in a.iter().enumerate() {
                leaves(x, format!("{at}/{i}"), keep, out)
            }
        }
        _ if keep(v) => out.push(at),
        _ => {}
    }
}

/// `v` as a value near the real ones (0..=64), or any u32 / i32 when `wide`.
fn pick(v: u32, wide: bool) -> i64 {
    if !wide {
        (v % 65) as i64
    } else if v & 1 == 0 {
        v as i64
    } else {
        v as i32 as i64
    }
}

/// Most elements an edited tensor may hold (keeps one run's memory small).
const MAX_ELEMENTS: u64 = 1 << 22;

const DTYPES: [&str; 5] = ["F32", "F16", "BF16", "I64", "U8"];

/// One edit: `op % 8` picks what changes, `a` which value or tensor, `b` a
/// dim (and, in its high bit, a value from the whole u32 range), `v` the
/// new value.
fn apply(config: &mut Value, tensors: &mut Vec<Tensor>, rec: &[u8]) {
    let (op, a, b) = (
        rec[0] % 8,
        u16::from_le_bytes([rec[1], rec[2]]) as usize,
        rec[3],
    );
    let v = u32::from_le_bytes([rec[4], rec[5], rec[6], rec[7]]);
    let wide = b & 0x80 != 0;
    let nt = tensors.len();
    match op {
        // a number or bool of the config (sizes, counts, flags, rope values)
        0 => {
            let mut at = Vec::new();
            leaves(
                config,
                String::new(),
                &|x| x.is_number() || x.is_boolean(),
                &mut at,
            );
            if let Some(p) = at.get(a % at.len().max(1)) {
                let x = config.pointer_mut(p).unwrap();
                *x = match x {
                    Value::Bool(_) => Value::Bool(v & 1 == 1),
                    Value::Number(n) if n.is_f64() => {
                        json!(if wide {
                            f32::from_bits(v) as f64
                        } else {
                            (v % 65) as f64 / 8.0
                        })
                    }
                    _ => json!(pick(v, wide)),
                };
                // (NaN and infinities are not JSON: serde_json writes them as null)
            }
        }
        // a config value removed (a key of an object, or set to null in an array)
        1 => {
            let mut at = Vec::new();
            leaves(config, String::new(), &|_| true, &mut at);
            if let Some(p) = at.get(a % at.len().max(1)) {
                let (parent, key) = p.rsplit_once('/').unwrap();
                match config.pointer_mut(parent) {
                    Some(Value::Object(m)) => {
                        m.remove(&key.replace("~1", "/").replace("~0", "~"));
                    }
                    Some(Value::Array(arr)) => {
                        if let Ok(i) = key.parse::<usize>() {
                            if b & 1 == 0 {
                                arr.remove(i);
                            } else {
                                arr[i] = Value::Null;
                            }
                        }
                    }
                    _ => {}
                }
            }
        }
        // a string of the config (architecture, layer types, activation) from another
        2 => {
            let mut at = Vec::new();
            leaves(config, String::new(), &|x| x.is_string(), &mut at);
            if at.len() >= 2 {
                let from = config.pointer(&at[v as usize % at.len()]).unwrap().clone();
                *config.pointer_mut(&at[a % at.len()]).unwrap() = from;
            }
        }
        // one dim of a tensor
        3 if nt > 0 => {
            let t = &mut tensors[a % nt];
            if t.shape.is_empty() {
                return;
            }
            let d = (b & 0x7f) as usize % t.shape.len();
            let mut shape = t.shape.clone();
            shape[d] = pick(v, wide) as u32 as u64;
            if shape
                .iter()
                .try_fold(1u64, |p, &x| p.checked_mul(x))
                .is_some_and(|n| n <= MAX_ELEMENTS)
            {
                t.shape = shape;
            }
        }
        // a dim added or dropped
        4 if nt > 0 => {
            let t = &mut tensors[a % nt];
            if b & 1 == 0 && !t.shape.is_empty() {
                t.shape.pop();
            } else if t.shape.len() < 4 {
                t.shape.push((v % 4 + 1) as u64);
            }
        }
        // a tensor dropped
        5 if nt > 0 => {
            tensors.remove(a % nt);
        }
        // a tensor's type changed
        6 if nt > 0 => tensors[a % nt].dtype = DTYPES[v as usize % DTYPES.len()].to_string(),
        // a tensor renamed: its numbers (layer, expert) changed
        7 if nt > 0 => {
            let t = &mut tensors[a % nt];
            let mut name = String::new();
            let mut digits = false;
            for c in t.name.chars() {
                if c.is_ascii_digit() {
                    if !digits {
                        name.push_str(&(v % 8).to_string());
                    }
                    digits = true;
                } else {
                    digits = false;
                    name.push(c);
                }
            }
            if !tensors.iter().any(|x| x.name == name) {
                tensors[a % nt].name = name;
            }
        }
        _ => {}
    }
}

fuzz_target!(|data: &[u8]| {
    let scratch = || common::scratch("convert");
    let all = fixtures();
    let Some((&which, edits)) = data.split_first() else {
        return;
    };
    let base = &all[which as usize % all.len()];
    let mut config = base.config.clone();
    let mut tensors = base.tensors.clone();
    for rec in edits.chunks_exact(8).take(16) {
        apply(&mut config, &mut tensors, rec);
    }
    // the checkpoint: the edited config and weights, the other files as they are
    let dir = scratch().join("ckpt");
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    for e in std::fs::read_dir(&base.dir).unwrap() {
        let p = e.unwrap().path();
        let name = p.file_name().unwrap().to_owned();
        if name != "config.json" && name != "model.safetensors" {
            std::fs::copy(&p, dir.join(name)).unwrap();
        }
    }
    std::fs::write(
        dir.join("config.json"),
        serde_json::to_vec(&config).unwrap(),
    )
    .unwrap();
    write_safetensors(&dir.join("model.safetensors"), &mut tensors).unwrap();
    let out = scratch().join("out.gguf");
    let _ = std::fs::remove_file(&out);
    if convert(&dir, &out, &ConvertOptions::default()).is_err() {
        let partial = scratch().join("out.gguf.partial");
        assert!(
            !out.exists() && !partial.exists(),
            "a failed conversion left its output behind"
        );
        return;
    }
    let Ok(file) = GgufFile::open(&out) else {
        panic!("coil convert wrote a GGUF it cannot read back");
    };
    common::exercise(Arc::new(file));
});
