//! Every failure names its cause and leaves no output behind.

use coil_convert::{convert, quantize, ConvertError, ConvertOptions, QuantMix, QuantizeOptions};
use std::fs;
use std::path::{Path, PathBuf};
#[path = "../../../tests/support/temp_path.rs"]
mod temp_path;
use temp_path::TempPath;

fn fixture(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../tests/fixtures/hf")
        .join(name)
}

/// A fresh scratch folder per test.
fn scratch(test: &str) -> TempPath {
    TempPath::dir("coil-convert-err", test)
}

/// Copies a fixture checkpoint into `dir/hf`.
fn copy_fixture(name: &str, dir: &Path) -> PathBuf {
    let dst = dir.join("hf");
    fs::create_dir_all(&dst).unwrap();
    for e in fs::read_dir(fixture(name)).unwrap() {
        let e = e.unwrap();
        fs::copy(e.path(), dst.join(e.file_name())).unwrap();
    }
    dst
}

/// Reads a safetensors file as (header JSON, data).
fn read_st(path: &Path) -> (serde_json::Map<String, serde_json::Value>, Vec<u8>) {
    let b = fs::read(path).unwrap();
    let n = u64::from_le_bytes(b[..8].try_into().unwrap()) as usize;
    let h: serde_json::Value = serde_json::from_slice(&b[8..8 + n]).unwrap();
    (h.as_object().unwrap().clone(), b[8 + n..].to_vec())
}

/// Writes a safetensors file from (name → (dtype, shape, bytes)).
fn write_st(path: &Path, tensors: &[(String, String, Vec<usize>, Vec<u8>)]) {
    let mut header = serde_json::Map::new();
    let mut data = Vec::new();
    for (name, dtype, shape, bytes) in tensors {
        header.insert(
            name.clone(),
            serde_json::json!({"dtype": dtype, "shape": shape, "data_offsets": [data.len(), data.len() + bytes.len()]}),
        );
        data.extend_from_slice(bytes);
    }
    let mut h = serde_json::to_vec(&header).unwrap();
    while !h.len().is_multiple_of(8) {
        h.push(b' ');
    }
    let mut out = (h.len() as u64).to_le_bytes().to_vec();
    out.extend(h);
    out.extend(data);
    fs::write(path, out).unwrap();
}

/// The tensors of a safetensors file, editable.
fn tensors_of(path: &Path) -> Vec<(String, String, Vec<usize>, Vec<u8>)> {
    let (h, data) = read_st(path);
    let mut v: Vec<_> = h
        .iter()
        .filter(|(k, _)| *k != "__metadata__")
        .map(|(k, m)| {
            let off = m["data_offsets"].as_array().unwrap();
            let (a, b) = (
                off[0].as_u64().unwrap() as usize,
                off[1].as_u64().unwrap() as usize,
            );
            let shape = m["shape"]
                .as_array()
                .unwrap()
                .iter()
                .map(|x| x.as_u64().unwrap() as usize)
                .collect();
            (
                k.clone(),
                m["dtype"].as_str().unwrap().to_string(),
                shape,
                data[a..b].to_vec(),
            )
        })
        .collect();
    v.sort_by(|a, b| a.0.cmp(&b.0));
    v
}

fn no_output_left(dir: &Path) {
    let left: Vec<String> = fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.ends_with(".gguf") || n.ends_with(".partial"))
        .collect();
    assert!(left.is_empty(), "left behind: {left:?}");
}

fn convert_err(dir: &Path, hf: &Path) -> ConvertError {
    let e = convert(hf, &dir.join("out.gguf"), &ConvertOptions::default()).unwrap_err();
    no_output_left(dir);
    e
}

fn edit_config(hf: &Path, f: impl FnOnce(&mut serde_json::Value)) {
    let p = hf.join("config.json");
    let mut v: serde_json::Value = serde_json::from_str(&fs::read_to_string(&p).unwrap()).unwrap();
    f(&mut v);
    fs::write(&p, serde_json::to_string(&v).unwrap()).unwrap();
}

#[test]
fn unsupported_architecture_names_itself_and_the_supported_ones() {
    let d = scratch("arch");
    let hf = copy_fixture("mamba", &d);
    edit_config(&hf, |v| {
        v["architectures"] = serde_json::json!(["GPT2LMHeadModel"])
    });
    let msg = convert_err(&d, &hf).to_string();
    assert!(msg.contains("GPT2LMHeadModel"), "{msg}");
    assert!(
        msg.contains("Mamba2ForCausalLM") && msg.contains("NemotronHForCausalLM"),
        "{msg}"
    );
}

#[test]
fn missing_tensor() {
    let d = scratch("missing");
    let hf = copy_fixture("mamba2", &d);
    let st = hf.join("model.safetensors");
    let t: Vec<_> = tensors_of(&st)
        .into_iter()
        .filter(|t| t.0 != "backbone.layers.1.mixer.A_log")
        .collect();
    write_st(&st, &t);
    let msg = convert_err(&d, &hf).to_string();
    assert!(
        msg.contains("blk.1.ssm_a") && msg.contains("missing"),
        "{msg}"
    );
}

#[test]
fn missing_expert_is_reported() {
    let d = scratch("expert");
    let hf = copy_fixture("jamba", &d);
    let st = hf.join("model.safetensors");
    let t: Vec<_> = tensors_of(&st)
        .into_iter()
        .filter(|t| t.0 != "model.layers.2.feed_forward.experts.3.up_proj.weight")
        .collect();
    write_st(&st, &t);
    let msg = convert_err(&d, &hf).to_string();
    assert!(msg.contains("experts") && msg.contains("layer 2"), "{msg}");
}

#[test]
fn shape_mismatch() {
    let d = scratch("shape");
    let hf = copy_fixture("mamba2", &d);
    let st = hf.join("model.safetensors");
    let mut t = tensors_of(&st);
    for x in t.iter_mut() {
        if x.0 == "backbone.layers.0.mixer.A_log" {
            // 3 heads instead of 4
            x.2 = vec![3];
            x.3.truncate(12);
        }
    }
    write_st(&st, &t);
    let msg = convert_err(&d, &hf).to_string();
    assert!(
        msg.contains("backbone.layers.0.mixer.A_log") && msg.contains("shape"),
        "{msg}"
    );
}

#[test]
fn config_field_out_of_range() {
    let d = scratch("range");
    let hf = copy_fixture("mamba2", &d);
    edit_config(&hf, |v| v["n_groups"] = serde_json::json!(3));
    let msg = convert_err(&d, &hf).to_string();
    assert!(msg.contains("n_groups"), "{msg}");
    edit_config(&hf, |v| {
        v["n_groups"] = serde_json::json!(2);
        v["num_hidden_layers"] = serde_json::json!(-1);
    });
    let msg = convert_err(&d, &hf).to_string();
    assert!(msg.contains("num_hidden_layers"), "{msg}");
}

/// A `vocab_size` beyond the embedding's rows is refused before the
/// vocabulary is padded to it (a `vocab_size` of 1.8 billion aborted the
/// process allocating the token list: found by the `convert` fuzz target).
#[test]
fn vocab_size_beyond_the_embedding() {
    let d = scratch("vocab");
    for (name, rows) in [("qwen35_tiny", 1024), ("mamba2", 4096)] {
        let hf = copy_fixture(name, &d);
        edit_config(&hf, |v| {
            v["vocab_size"] = serde_json::json!(1_810_602_393u64)
        });
        let msg = convert_err(&d, &hf).to_string();
        assert!(
            msg.contains("vocab_size") && msg.contains(&format!("{rows} rows")),
            "{name}: {msg}"
        );
        fs::remove_dir_all(&hf).unwrap();
    }
}

/// A merged gate/up matrix with zero columns is refused by name (it made
/// a zero-sized chunk and a panic: found by the `convert` fuzz target).
#[test]
fn zero_sized_merged_matrix() {
    let d = scratch("zero-cols");
    let hf = copy_fixture("granitemoehybrid", &d);
    let st = hf.join("model.safetensors");
    let name = "model.layers.0.block_sparse_moe.input_linear.weight";
    let mut t = tensors_of(&st);
    let x = t.iter_mut().find(|x| x.0 == name).unwrap();
    *x.2.last_mut().unwrap() = 0;
    x.3.clear();
    write_st(&st, &t);
    let msg = convert_err(&d, &hf).to_string();
    assert!(msg.contains(name), "{msg}");
}

#[test]
fn corrupt_safetensors_header() {
    let d = scratch("corrupt");
    let hf = copy_fixture("mamba", &d);
    let st = hf.join("model.safetensors");
    let mut b = fs::read(&st).unwrap();
    b[12] = b'!'; // inside the JSON header
    fs::write(&st, &b).unwrap();
    let msg = convert_err(&d, &hf).to_string();
    assert!(
        msg.contains("corrupt safetensors") && msg.contains("model.safetensors"),
        "{msg}"
    );
    // truncated data
    let b = fs::read(fixture("mamba").join("model.safetensors")).unwrap();
    fs::write(&st, &b[..b.len() - 100]).unwrap();
    let msg = convert_err(&d, &hf).to_string();
    assert!(msg.contains("corrupt safetensors"), "{msg}");
}

#[test]
fn sharded_checkpoint_converts_like_a_single_file() {
    let d = scratch("sharded");
    let hf = copy_fixture("mamba2", &d);
    let st = hf.join("model.safetensors");
    let t = tensors_of(&st);
    fs::remove_file(&st).unwrap();
    let (a, b) = t.split_at(t.len() / 2);
    write_st(&hf.join("model-00001-of-00002.safetensors"), a);
    write_st(&hf.join("model-00002-of-00002.safetensors"), b);
    let mut map = serde_json::Map::new();
    for (i, part) in [a, b].iter().enumerate() {
        for x in part.iter() {
            map.insert(
                x.0.clone(),
                format!("model-0000{}-of-00002.safetensors", i + 1).into(),
            );
        }
    }
    fs::write(
        hf.join("model.safetensors.index.json"),
        serde_json::to_string(&serde_json::json!({ "weight_map": map })).unwrap(),
    )
    .unwrap();
    let opts = ConvertOptions {
        name: Some("Hf".into()),
        ..Default::default()
    };
    convert(&hf, &d.join("sharded.gguf"), &opts).unwrap();
    let want = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../tests/fixtures/models/mamba2/model.f16.gguf");
    assert!(fs::read(d.join("sharded.gguf")).unwrap() == fs::read(want).unwrap());
    // a part listed in the index but absent
    fs::remove_file(hf.join("model-00002-of-00002.safetensors")).unwrap();
    let e = convert(&hf, &d.join("x.gguf"), &opts)
        .unwrap_err()
        .to_string();
    assert!(e.contains("model-00002-of-00002.safetensors"), "{e}");
}

#[test]
fn bf16_and_f32_sources() {
    // The same weights stored as f32 and as bf16 convert to the f16 file
    // (all fixture values are f16-exact; bf16 keeps them only where they fit).
    let d = scratch("dtypes");
    let hf = copy_fixture("llama", &d);
    let st = hf.join("model.safetensors");
    let t = tensors_of(&st);
    let to_f32 = |x: &(String, String, Vec<usize>, Vec<u8>)| {
        let v: Vec<u8> =
            x.3.chunks_exact(2)
                .flat_map(|c| {
                    half::f16::from_bits(u16::from_le_bytes([c[0], c[1]]))
                        .to_f32()
                        .to_le_bytes()
                })
                .collect();
        (x.0.clone(), "F32".to_string(), x.2.clone(), v)
    };
    write_st(&st, &t.iter().map(to_f32).collect::<Vec<_>>());
    let opts = ConvertOptions {
        name: Some("Hf".into()),
        ..Default::default()
    };
    convert(&hf, &d.join("f32src.gguf"), &opts).unwrap();
    let want = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../tests/fixtures/models/llama/model.f16.gguf");
    assert!(fs::read(d.join("f32src.gguf")).unwrap() == fs::read(&want).unwrap());
    let to_bf16 = |x: &(String, String, Vec<usize>, Vec<u8>)| {
        let v: Vec<u8> =
            x.3.chunks_exact(2)
                .flat_map(|c| {
                    let f = half::f16::from_bits(u16::from_le_bytes([c[0], c[1]])).to_f32();
                    half::bf16::from_f32(f).to_bits().to_le_bytes()
                })
                .collect();
        (x.0.clone(), "BF16".to_string(), x.2.clone(), v)
    };
    write_st(&st, &t.iter().map(to_bf16).collect::<Vec<_>>());
    let out = d.join("bf16src.gguf");
    convert(
        &hf,
        &out,
        &ConvertOptions {
            out_type: coil_convert::OutType::Bf16,
            ..opts
        },
    )
    .unwrap();
    let f = coil_gguf::GgufFile::open(&out).unwrap();
    assert_eq!(
        f.tensor("blk.0.attn_q.weight").unwrap().ty(),
        coil_gguf::GgmlType::BF16
    );
    assert_eq!(
        f.tensor("blk.0.attn_norm.weight").unwrap().ty(),
        coil_gguf::GgmlType::F32
    );
    assert_eq!(f.metadata().get_u64("general.file_type"), Some(32));
}

#[test]
fn quantize_refuses_in_place_and_unreadable_input() {
    let d = scratch("quant");
    let src = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../tests/fixtures/models/mamba/model.f16.gguf");
    let opts = QuantizeOptions::new(QuantMix::Q8_0);
    let e = quantize(&src, &src, &opts).unwrap_err().to_string();
    assert!(e.contains("differ"), "{e}");
    let bad = d.join("bad.gguf");
    fs::write(&bad, b"GGUF\x03\x00\x00\x00").unwrap();
    assert!(quantize(&bad, &d.join("o.gguf"), &opts).is_err());
    assert!(!d.join("o.gguf").exists() && !d.join("o.gguf.partial").exists());
}
