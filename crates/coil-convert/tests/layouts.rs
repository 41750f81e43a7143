//! SentencePiece vocabularies, chat templates and Mistral's native layout.

use coil_convert::{convert, ConvertOptions};
use coil_gguf::{GgufFile, Value};
use std::fs;
use std::path::{Path, PathBuf};
#[path = "../../../tests/support/temp_path.rs"]
mod temp_path;
use temp_path::TempPath;

fn fixtures() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures")
}

fn scratch(test: &str) -> TempPath {
    TempPath::dir("coil-convert-layout", test)
}

fn copy_dir(src: &Path, dst: &Path) {
    fs::create_dir_all(dst).unwrap();
    for e in fs::read_dir(src).unwrap() {
        let e = e.unwrap();
        fs::copy(e.path(), dst.join(e.file_name())).unwrap();
    }
}

/// A protobuf field: tag, then a varint length for wire type 2.
fn field(n: u64, wt: u64, payload: &[u8]) -> Vec<u8> {
    let mut v = Vec::new();
    let mut k = (n << 3) | wt;
    loop {
        let b = (k & 0x7f) as u8;
        k >>= 7;
        if k == 0 {
            v.push(b);
            break;
        }
        v.push(b | 0x80);
    }
    if wt == 2 {
        let mut l = payload.len() as u64;
        loop {
            let b = (l & 0x7f) as u8;
            l >>= 7;
            if l == 0 {
                v.push(b);
                break;
            }
            v.push(b | 0x80);
        }
    }
    v.extend_from_slice(payload);
    v
}

/// A SentencePiece model: <unk>, <s>, </s>, 256 byte pieces, then words.
fn spm_model() -> (Vec<u8>, Vec<(String, f32, u8)>) {
    let mut pieces: Vec<(String, f32, u8)> = vec![
        ("<unk>".into(), 0.0, 2),
        ("<s>".into(), 0.0, 3),
        ("</s>".into(), 0.0, 3),
    ];
    for b in 0..256 {
        pieces.push((format!("<0x{b:02X}>"), 0.0, 6));
    }
    for (i, w) in ["▁", "▁the", "▁a", "e", "t", "h", "▁th", "he"]
        .iter()
        .enumerate()
    {
        pieces.push((w.to_string(), -(i as f32), 1));
    }
    let mut model = Vec::new();
    for (text, score, ty) in &pieces {
        let mut p = field(1, 2, text.as_bytes());
        p.extend(field(2, 5, &score.to_le_bytes()));
        if *ty != 1 {
            p.extend(field(3, 0, &[*ty]));
        }
        model.extend(field(1, 2, &p));
    }
    (model, pieces)
}

#[test]
fn sentencepiece_vocabulary_and_chat_template() {
    let d = scratch("spm");
    let hf = d.join("hf");
    copy_dir(&fixtures().join("hf/llama"), &hf);
    fs::remove_file(hf.join("tokenizer.json")).unwrap();
    let (model, pieces) = spm_model();
    fs::write(hf.join("tokenizer.model"), model).unwrap();
    fs::write(
        hf.join("tokenizer_config.json"),
        r#"{"bos_token": "<s>", "eos_token": "</s>", "add_bos_token": true,
            "chat_template": "{% for m in messages %}{{ m['content'] }}{% endfor %}",
            "added_tokens_decoder": {"300": {"content": "<|im_end|>", "special": false}}}"#,
    )
    .unwrap();
    let out = d.join("spm.gguf");
    convert(&hf, &out, &ConvertOptions::default()).unwrap();
    let f = GgufFile::open(&out).unwrap();
    let md = f.metadata();
    assert_eq!(md.get_str("tokenizer.ggml.model"), Some("llama"));
    assert_eq!(md.get_str("tokenizer.ggml.pre"), Some("default"));
    let toks = md.get_array("tokenizer.ggml.tokens").unwrap();
    assert_eq!(toks.len(), 4096); // config.json's vocab_size; the rest padded
    for (i, (text, _, _)) in pieces.iter().enumerate() {
        assert_eq!(toks[i].as_str(), Some(text.as_str()));
    }
    assert_eq!(toks[300].as_str(), Some("<|im_end|>"));
    assert_eq!(toks[301].as_str(), Some("[PAD301]"));
    let types = md.get_array("tokenizer.ggml.token_type").unwrap();
    assert_eq!(types[0], Value::I32(2));
    assert_eq!(types[1], Value::I32(3));
    assert_eq!(types[3], Value::I32(6));
    assert_eq!(types[260], Value::I32(1));
    assert_eq!(types[300], Value::I32(3)); // looks special
    assert_eq!(types[301], Value::I32(5));
    let scores = md.get_array("tokenizer.ggml.scores").unwrap();
    assert_eq!(scores[260], Value::F32(-1.0));
    assert_eq!(scores[301], Value::F32(-10000.0));
    assert_eq!(md.get_u64("tokenizer.ggml.bos_token_id"), Some(0)); // config.json's bos_token_id
    assert_eq!(md.get_bool("tokenizer.ggml.add_bos_token"), Some(true));
    assert!(md
        .get_str("tokenizer.chat_template")
        .unwrap()
        .contains("messages"));
    // coil's own tokenizer reads it back.
    let tok = coil::tokenizer::Tokenizer::from_gguf(&f).unwrap();
    let ids = tok.encode("the", false);
    assert_eq!(tok.decode(&ids), "the");
}

fn read_st(path: &Path) -> Vec<(String, String, Vec<usize>, Vec<u8>)> {
    let b = fs::read(path).unwrap();
    let n = u64::from_le_bytes(b[..8].try_into().unwrap()) as usize;
    let h: serde_json::Value = serde_json::from_slice(&b[8..8 + n]).unwrap();
    let data = &b[8 + n..];
    let mut v: Vec<_> = h
        .as_object()
        .unwrap()
        .iter()
        .filter(|(k, _)| *k != "__metadata__")
        .map(|(k, m)| {
            let o = m["data_offsets"].as_array().unwrap();
            let (a, e) = (
                o[0].as_u64().unwrap() as usize,
                o[1].as_u64().unwrap() as usize,
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
                data[a..e].to_vec(),
            )
        })
        .collect();
    v.sort_by(|a, b| a.0.cmp(&b.0));
    v
}

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

/// llama.cpp's `LlamaModel.permute` on f16 rows (what Mistral's native
/// checkpoints hold relative to transformers').
fn permute(bytes: &[u8], rows: usize, n_head: usize) -> Vec<u8> {
    let row = bytes.len() / rows;
    let hd = rows / n_head;
    let mut out = vec![0u8; bytes.len()];
    for h in 0..n_head {
        for i in 0..hd / 2 {
            for j in 0..2 {
                let dst = h * hd + 2 * i + j;
                let src = h * hd + j * (hd / 2) + i;
                out[dst * row..(dst + 1) * row].copy_from_slice(&bytes[src * row..(src + 1) * row]);
            }
        }
    }
    out
}

#[test]
fn mistral_native_layout() {
    let d = scratch("mistral");
    let m = d.join("mistral");
    fs::create_dir_all(&m).unwrap();
    let src = read_st(&fixtures().join("hf/llama/model.safetensors"));
    let renamed: Vec<_> = src
        .into_iter()
        .map(|(name, dt, shape, bytes)| {
            let n = name
                .replace("model.embed_tokens.", "tok_embeddings.")
                .replace("model.norm.", "norm.")
                .replace("model.layers.", "layers.")
                .replace("input_layernorm", "attention_norm")
                .replace("post_attention_layernorm", "ffn_norm")
                .replace("self_attn.q_proj", "attention.wq")
                .replace("self_attn.k_proj", "attention.wk")
                .replace("self_attn.v_proj", "attention.wv")
                .replace("self_attn.o_proj", "attention.wo")
                .replace("mlp.gate_proj", "feed_forward.w1")
                .replace("mlp.down_proj", "feed_forward.w2")
                .replace("mlp.up_proj", "feed_forward.w3");
            let bytes = if n.ends_with("attention.wq.weight") {
                permute(&bytes, shape[0], 4)
            } else if n.ends_with("attention.wk.weight") {
                permute(&bytes, shape[0], 2)
            } else {
                bytes
            };
            (n, dt, shape, bytes)
        })
        .collect();
    write_st(&m.join("consolidated.safetensors"), &renamed);
    fs::write(
        m.join("params.json"),
        r#"{"dim": 32, "n_layers": 4, "head_dim": 8, "hidden_dim": 64, "n_heads": 4,
            "n_kv_heads": 2, "norm_eps": 1e-05, "vocab_size": 4096, "rope_theta": 500000.0}"#,
    )
    .unwrap();
    fs::write(m.join("tokenizer.model.v3"), spm_model().0).unwrap();
    let out = d.join("m.gguf");
    convert(&m, &out, &ConvertOptions::default()).unwrap();
    let ours = GgufFile::open(&out).unwrap();
    let theirs = GgufFile::open(fixtures().join("models/llama/model.f16.gguf")).unwrap();
    assert_eq!(ours.architecture(), Some("llama"));
    assert_eq!(ours.tensors().len(), theirs.tensors().len());
    for t in theirs.tensors() {
        let o = ours
            .tensor_info(&t.name)
            .unwrap_or_else(|| panic!("{}", t.name));
        assert_eq!((&o.dims, o.ty), (&t.dims, t.ty), "{}", t.name);
        assert!(ours.view(o).data == theirs.view(t).data, "{}", t.name);
    }
    for k in [
        "llama.block_count",
        "llama.embedding_length",
        "llama.feed_forward_length",
        "llama.attention.head_count",
        "llama.attention.head_count_kv",
        "llama.rope.freq_base",
        "llama.attention.layer_norm_rms_epsilon",
        "llama.rope.dimension_count",
    ] {
        assert_eq!(ours.metadata().get(k), theirs.metadata().get(k), "{k}");
    }
    assert_eq!(
        ours.metadata().get_str("tokenizer.ggml.model"),
        Some("llama")
    );
}

#[test]
fn llama3_rope_factors() {
    let d = scratch("llama3");
    let hf = d.join("hf");
    copy_dir(&fixtures().join("hf/llama"), &hf);
    let p = hf.join("config.json");
    let mut v: serde_json::Value = serde_json::from_str(&fs::read_to_string(&p).unwrap()).unwrap();
    v["rope_parameters"] = serde_json::json!({"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0,
        "low_freq_factor": 1.0, "high_freq_factor": 4.0, "original_max_position_embeddings": 8192});
    fs::write(&p, v.to_string()).unwrap();
    let out = d.join("l3.gguf");
    convert(&hf, &out, &ConvertOptions::default()).unwrap();
    let f = GgufFile::open(&out).unwrap();
    assert_eq!(f.tensors()[0].name, "rope_freqs.weight");
    let r = f.tensor("rope_freqs.weight").unwrap().to_f32().unwrap();
    // llama.cpp's generate_extra_tensors (PyTorch) on the same config
    let want = [1.0f32, 1.0, 2.694_53, 8.0];
    for (a, b) in r.iter().zip(want) {
        assert!((a - b).abs() < 1e-6, "{r:?}");
    }
}
