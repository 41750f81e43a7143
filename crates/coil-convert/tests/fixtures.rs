//! coil's conversion of each tiny fixture checkpoint against llama.cpp's
//! converter output (`tests/fixtures/models/<name>/model.f16.gguf`): same
//! metadata keys and values, same tensors (names, shapes, types, bytes),
//! except where coil deliberately follows transformers (Bamba's partial
//! Q/K permutation).

use coil_convert::{convert, ConvertOptions, OutType};
use coil_gguf::GgufFile;
use std::path::PathBuf;
#[path = "../../../tests/support/temp_path.rs"]
mod temp_path;
use temp_path::TempPath;

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures")
}

fn tmp(name: &str) -> TempPath {
    TempPath::new("coil-convert-test", name)
}

/// Differences between two GGUF files (empty when identical up to the
/// allowed exceptions).
fn diff(
    ours: &GgufFile,
    theirs: &GgufFile,
    skip_tensors: &[&str],
    extra_keys: &[&str],
) -> Vec<String> {
    let mut d = Vec::new();
    for (k, v) in theirs.metadata().iter() {
        match ours.metadata().get(k) {
            None => d.push(format!("missing key {k}")),
            Some(o) if o != v => d.push(format!(
                "key {k}: ours {} theirs {}",
                o.summary(8),
                v.summary(8)
            )),
            _ => {}
        }
    }
    for (k, _) in ours.metadata().iter() {
        if theirs.metadata().get(k).is_none() && !extra_keys.contains(&k) {
            d.push(format!("extra key {k}"));
        }
    }
    for t in theirs.tensors() {
        let Some(o) = ours.tensor_info(&t.name) else {
            d.push(format!("missing tensor {}", t.name));
            continue;
        };
        if o.dims != t.dims || o.ty != t.ty {
            d.push(format!(
                "tensor {}: ours {:?} {} theirs {:?} {}",
                t.name, o.dims, o.ty, t.dims, t.ty
            ));
            continue;
        }
        if skip_tensors.iter().any(|s| t.name.contains(s)) {
            continue;
        }
        let a = ours.view(o).data;
        let b = theirs.view(t).data;
        if a != b {
            let n = a.chunks(2).zip(b.chunks(2)).filter(|(x, y)| x != y).count();
            d.push(format!("tensor {}: {n} elements differ", t.name));
        }
    }
    for o in ours.tensors() {
        if theirs.tensor_info(&o.name).is_none() {
            d.push(format!("extra tensor {}", o.name));
        }
    }
    let order_ours: Vec<&str> = ours.tensors().iter().map(|t| t.name.as_str()).collect();
    let order_theirs: Vec<&str> = theirs.tensors().iter().map(|t| t.name.as_str()).collect();
    if d.is_empty() && order_ours != order_theirs {
        d.push("tensor order differs".into());
    }
    d
}

fn check(name: &str, skip: &[&str], extra: &[&str]) {
    let out = tmp(&format!("{name}.gguf"));
    let opts = ConvertOptions {
        out_type: OutType::F16,
        name: Some("Hf".into()),
        progress: false,
        ..Default::default()
    };
    convert(&root().join("hf").join(name), &out, &opts).unwrap();
    let ours = GgufFile::open(&out).unwrap();
    let theirs = GgufFile::open(root().join("models").join(name).join("model.f16.gguf")).unwrap();
    let d = diff(&ours, &theirs, skip, extra);
    let _ = std::fs::remove_file(&out);
    assert!(
        d.is_empty(),
        "{name}: {} differences:\n{}",
        d.len(),
        d.join("\n")
    );
}

#[test]
fn mamba() {
    check("mamba", &[], &[]);
}

#[test]
fn mamba2() {
    check("mamba2", &[], &[]);
}

#[test]
fn jamba() {
    check("jamba", &[], &[]);
}

#[test]
fn bamba() {
    check(
        "bamba",
        &["attn_q", "attn_k"],
        &["coil.rope.partial_permute"],
    );
}

#[test]
fn granitemoehybrid() {
    check("granitemoehybrid", &[], &[]);
}

#[test]
fn falcon_h1() {
    check("falcon_h1", &[], &[]);
}

#[test]
fn nemotron_h() {
    check("nemotron_h", &[], &[]);
}

#[test]
fn nemotron_h_moe() {
    check("nemotron_h_moe", &[], &[]);
}

#[test]
fn llama() {
    check("llama", &[], &[]);
}

/// The Gated DeltaNet hybrids (tests/fixtures/hf/<name>, f32 checkpoints)
/// against llama.cpp's `--outtype f32 --no-mtp` conversion that the parity
/// tests run (tests/fixtures/parity/<name>/model.gguf), byte for byte:
/// Qwen3.5's value heads re-tiled, Qwen3-Next's fused `in_proj_qkvz` split,
/// the zero-centred norms stored as 1 + w.
fn check_f32_parity(name: &str) {
    let out = tmp(&format!("{name}.gguf"));
    let opts = ConvertOptions {
        out_type: OutType::F32,
        name: Some(name.into()),
        progress: false,
        ..Default::default()
    };
    convert(&root().join("hf").join(name), &out, &opts).unwrap();
    let ours = std::fs::read(&out).unwrap();
    let theirs = std::fs::read(root().join("parity").join(name).join("model.gguf")).unwrap();
    let d = diff(
        &GgufFile::open(&out).unwrap(),
        &GgufFile::open(root().join("parity").join(name).join("model.gguf")).unwrap(),
        &[],
        &[],
    );
    let _ = std::fs::remove_file(&out);
    assert!(
        d.is_empty(),
        "{name}: {} differences:\n{}",
        d.len(),
        d.join("\n")
    );
    assert!(
        ours == theirs,
        "{name}: same content but not the same bytes"
    );
}

#[test]
fn qwen35() {
    check_f32_parity("qwen35_tiny");
}

#[test]
fn qwen35moe() {
    check_f32_parity("qwen35moe_tiny");
}

#[test]
fn qwen3next() {
    check_f32_parity("qwen3next_tiny");
}

/// A Gated DeltaNet hybrid's checkpoint with its multi-token-prediction
/// block (tests/fixtures/hf/<source> plus tests/fixtures/nextn/<name>/
/// mtp.safetensors and `mtp_num_hidden_layers` in the config, as
/// tools/make_fixtures_nextn.py made it) against llama.cpp's conversion of
/// it with the block (tests/fixtures/nextn/<name>/model.gguf), byte for
/// byte; `--no-mtp` gives the trunk-only file.
fn check_mtp(name: &str, source: &str, config_key: Option<&str>) {
    let dir = TempPath::dir("coil-convert-test", &format!("{name}-mtp"));
    for f in std::fs::read_dir(root().join("hf").join(source)).unwrap() {
        let f = f.unwrap().path();
        std::fs::copy(&f, dir.join(f.file_name().unwrap())).unwrap();
    }
    std::fs::copy(
        root().join("nextn").join(name).join("mtp.safetensors"),
        dir.join("model_mtp.safetensors"),
    )
    .unwrap();
    if let Some(key) = config_key {
        let path = dir.join("config.json");
        let mut cfg: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
        cfg[key] = 1.into();
        std::fs::write(&path, serde_json::to_string_pretty(&cfg).unwrap()).unwrap();
    }
    for (no_mtp, want) in [
        (false, root().join("nextn").join(name).join("model.gguf")),
        (true, root().join("parity").join(source).join("model.gguf")),
    ] {
        let out = tmp(&format!("{name}-mtp-{no_mtp}.gguf"));
        let opts = ConvertOptions {
            out_type: OutType::F32,
            name: Some(source.into()),
            progress: false,
            no_mtp,
            ..Default::default()
        };
        convert(&dir, &out, &opts).unwrap();
        let d = diff(
            &GgufFile::open(&out).unwrap(),
            &GgufFile::open(&want).unwrap(),
            &[],
            &[],
        );
        assert!(
            d.is_empty(),
            "{name} (no_mtp {no_mtp}): {} differences:\n{}",
            d.len(),
            d.join("\n")
        );
        let order =
            |f: &GgufFile| -> Vec<String> { f.tensors().iter().map(|t| t.name.clone()).collect() };
        assert_eq!(
            order(&GgufFile::open(&out).unwrap()),
            order(&GgufFile::open(&want).unwrap()),
            "{name} (no_mtp {no_mtp}): tensor order"
        );
        assert!(
            std::fs::read(&out).unwrap() == std::fs::read(&want).unwrap(),
            "{name} (no_mtp {no_mtp}): same content but not the same bytes"
        );
    }
}

#[test]
fn qwen35_mtp() {
    check_mtp("qwen35", "qwen35_tiny", Some("mtp_num_hidden_layers"));
}

#[test]
fn qwen35moe_mtp() {
    check_mtp("qwen35moe", "qwen35moe_tiny", Some("mtp_num_hidden_layers"));
}

/// Qwen3-Next's config has no `mtp_num_hidden_layers`: the checkpoint's
/// `mtp.layers.N` say how many.
#[test]
fn qwen3next_mtp() {
    check_mtp("qwen3next", "qwen3next_tiny", None);
}

/// Kimi-Linear (KDA + MLA), with a plain query projection and with a
/// query LoRA: per-head `attn_k_b` / `attn_v_b` split from `kv_b_proj`,
/// the KDA convs reshaped, A stored as −exp(A_log), experts stacked.
#[test]
fn kimi_linear() {
    check_f32_parity("kimi_linear_tiny");
    check_f32_parity("kimi_linear_qlora");
}

/// The Bailing-Hybrid (Ling 3.0) fixtures against llama.cpp's `bailingmoe3`
/// conversion: KDA layers with full-rank gates and A stored as exp(A_log),
/// MLA layers with a per-head output gate, group-limited experts with
/// per-layer SwiGLU limits; one with a query LoRA.
#[test]
fn bailing_hybrid() {
    check_f32_parity("bailing_hybrid_tiny");
    check_f32_parity("bailing_hybrid_qlora");
}

/// The LFM3 fixtures: coil's own `lfm3` layout (llama.cpp has no LFM3
/// converter), so the committed `model.gguf` (written by `coil convert` in
/// tools/make_fixtures_lfm3.py, read back by the gguf package there, run
/// against transformers by crates/coil/tests/parity_lfm3.rs) pins it:
/// per-layer KV heads and sliding-window pattern, RoPE per layer type with
/// the proportional RoPE's `rope_freqs`, sandwich norms, the attention gate.
#[test]
fn lfm3() {
    check_f32_parity("lfm3_tiny");
    check_f32_parity("lfm3_plain");
}

/// LFM3 configurations coil cannot represent are refused by field name.
#[test]
fn lfm3_unsupported_configs_are_refused() {
    let src = root().join("hf/lfm3_tiny");
    for (i, (edit, want)) in [
        (
            r#""conv_bias": true"#,
            "conv_bias",
        ),
        (
            r#""rope_parameters": {"full_attention": {"rope_type": "yarn", "rope_theta": 1e6, "factor": 4.0}, "sliding_attention": {"rope_type": "default", "rope_theta": 1e4}}"#,
            "rope_parameters.full_attention",
        ),
        (
            r#""layer_types": ["conv", "mamba", "full_attention", "conv", "sliding_attention", "conv"]"#,
            "layer_types",
        ),
        (r#""sliding_window": null"#, "sliding_window"),
    ]
    .into_iter()
    .enumerate()
    {
        let dir = tmp(&format!("lfm3_bad{i}"));
        std::fs::create_dir_all(&dir).unwrap();
        for f in ["model.safetensors", "tokenizer.json", "tokenizer_config.json"] {
            std::fs::copy(src.join(f), dir.join(f)).unwrap();
        }
        let mut cfg: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(src.join("config.json")).unwrap())
                .unwrap();
        let patch: serde_json::Value = serde_json::from_str(&format!("{{{edit}}}")).unwrap();
        for (k, v) in patch.as_object().unwrap() {
            cfg[k] = v.clone();
        }
        std::fs::write(dir.join("config.json"), cfg.to_string()).unwrap();
        let out = tmp(&format!("lfm3_bad{i}.gguf"));
        let opts = ConvertOptions {
            out_type: OutType::F32,
            progress: false,
            ..Default::default()
        };
        let err = convert(&dir, &out, &opts).expect_err(edit).to_string();
        let _ = std::fs::remove_dir_all(&dir);
        assert!(err.contains(want), "{edit}: {err}");
        assert!(!out.exists(), "{edit}: output left behind");
    }
}

/// The Zamba2 fixtures: coil's own `zamba2` layout (llama.cpp has no
/// Zamba2 converter; see docs/CONVERT.md). The committed F32 file, made by
/// tools/make_fixtures_zamba2.py, read back by the gguf package there, run
/// against transformers by crates/coil/tests/parity_zamba2.rs, pins it:
/// converting the checkpoint again gives it byte for byte.
#[test]
fn zamba2() {
    check_f32_parity("zamba2_tiny");
    check_f32_parity("zamba2_plain");
}

/// Zamba2 configurations coil cannot represent are refused by field name.
#[test]
fn zamba2_unsupported_configs_are_refused() {
    let src = root().join("hf/zamba2_tiny");
    for (i, (edit, want)) in [
        (r#""add_bias_linear": true"#, "add_bias_linear"),
        (r#""hidden_act": "silu""#, "hidden_act"),
        (r#""use_long_context": true"#, "use_long_context"),
        (r#""tie_word_embeddings": false"#, "tie_word_embeddings"),
        (
            r#""rope_parameters": {"rope_type": "yarn", "rope_theta": 1e4, "factor": 4.0}"#,
            "rope_parameters.rope_type",
        ),
        (
            r#""layers_block_type": ["mamba", "hybrid", "attention", "hybrid", "mamba", "hybrid", "mamba"]"#,
            "layers_block_type",
        ),
        (
            r#""layers_block_type": ["mamba", "hybrid", "mamba"]"#,
            "layers_block_type",
        ),
        (r#""num_attention_heads": 5"#, "num_attention_heads"),
        (r#""mamba_ngroups": 3"#, "mamba_ngroups"),
    ]
    .into_iter()
    .enumerate()
    {
        let dir = tmp(&format!("zamba2_bad{i}"));
        std::fs::create_dir_all(&dir).unwrap();
        for f in ["model.safetensors", "tokenizer.json", "tokenizer_config.json"] {
            std::fs::copy(src.join(f), dir.join(f)).unwrap();
        }
        let mut cfg: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(src.join("config.json")).unwrap())
                .unwrap();
        let patch: serde_json::Value = serde_json::from_str(&format!("{{{edit}}}")).unwrap();
        for (k, v) in patch.as_object().unwrap() {
            cfg[k] = v.clone();
        }
        std::fs::write(dir.join("config.json"), cfg.to_string()).unwrap();
        let out = tmp(&format!("zamba2_bad{i}.gguf"));
        let opts = ConvertOptions {
            out_type: OutType::F32,
            progress: false,
            ..Default::default()
        };
        let err = convert(&dir, &out, &opts).expect_err(edit).to_string();
        let _ = std::fs::remove_dir_all(&dir);
        assert!(err.contains(want), "{edit}: {err}");
        assert!(!out.exists(), "{edit}: output left behind");
    }
}

/// The LFM2 parity fixtures (tests/fixtures/parity/<name>/): `hf/` converted
/// to F32 against llama.cpp's `convert_hf_to_gguf.py --outtype f32` of it
/// (`model.gguf`, made by tools/make_fixtures_lfm2.py).
fn check_f32_fixture(name: &str) {
    let dir = root().join("parity").join(name);
    let out = tmp(&format!("{name}.f32.gguf"));
    let opts = ConvertOptions {
        out_type: OutType::F32,
        name: Some("Hf".into()),
        progress: false,
        ..Default::default()
    };
    convert(&dir.join("hf"), &out, &opts).unwrap();
    let ours = GgufFile::open(&out).unwrap();
    let theirs = GgufFile::open(dir.join("model.gguf")).unwrap();
    let d = diff(&ours, &theirs, &[], &[]);
    let _ = std::fs::remove_file(&out);
    assert!(
        d.is_empty(),
        "{name}: {} differences:\n{}",
        d.len(),
        d.join("\n")
    );
}

#[test]
fn lfm2() {
    check_f32_fixture("lfm2_small");
}

#[test]
fn lfm2moe() {
    check_f32_fixture("lfm2moe_small");
}

/// LFM2-MoE settings llama.cpp's converter drops (its runtime always
/// renormalises and never scales the expert weights) become keys, and only
/// when they differ from that.
#[test]
fn lfm2moe_routing_settings_become_keys() {
    let src = root().join("parity/lfm2moe_small/hf");
    let dir = tmp("lfm2moe_routing");
    std::fs::create_dir_all(&dir).unwrap();
    for f in std::fs::read_dir(&src).unwrap() {
        let f = f.unwrap().path();
        std::fs::copy(&f, dir.join(f.file_name().unwrap())).unwrap();
    }
    let cfg_path = dir.join("config.json");
    let mut cfg: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&cfg_path).unwrap()).unwrap();
    cfg["norm_topk_prob"] = serde_json::json!(false);
    cfg["routed_scaling_factor"] = serde_json::json!(2.5);
    std::fs::write(&cfg_path, serde_json::to_string(&cfg).unwrap()).unwrap();
    let out = tmp("lfm2moe_routing.gguf");
    let opts = ConvertOptions {
        out_type: OutType::F32,
        name: Some("Hf".into()),
        progress: false,
        ..Default::default()
    };
    convert(&dir, &out, &opts).unwrap();
    let f = GgufFile::open(&out).unwrap();
    assert_eq!(
        f.metadata().get_bool("lfm2moe.expert_weights_norm"),
        Some(false)
    );
    assert_eq!(
        f.metadata()
            .get("lfm2moe.expert_weights_scale")
            .and_then(|v| v.as_f32()),
        Some(2.5)
    );
    let _ = std::fs::remove_file(&out);
    let _ = std::fs::remove_dir_all(&dir);
}

/// Qwen4-Exp against llama.cpp's converter (run with transformers 4.57, see
/// tools/make_fixtures_qwen4exp.py): hyper-connections, the indexer's split
/// projection, the per-layer embedding with its sharded table and int64
/// hash constants as keys, byte for byte.
#[test]
fn qwen4exp() {
    check_f32_parity("qwen4exp_tiny");
}

/// A copy of `hf/<name>` with `config.json`'s top-level keys patched by
/// `edit` (a JSON object's members), converted to F32.
fn convert_patched(name: &str, tag: &str, edit: &str) -> (TempPath, Result<(), String>) {
    let src = root().join("hf").join(name);
    let dir = tmp(&format!("{name}_{tag}"));
    std::fs::create_dir_all(&dir).unwrap();
    for f in [
        "model.safetensors",
        "tokenizer.json",
        "tokenizer_config.json",
    ] {
        std::fs::copy(src.join(f), dir.join(f)).unwrap();
    }
    let mut cfg: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(src.join("config.json")).unwrap()).unwrap();
    let patch: serde_json::Value = serde_json::from_str(&format!("{{{edit}}}")).unwrap();
    for (k, v) in patch.as_object().unwrap() {
        cfg[k] = v.clone();
    }
    std::fs::write(dir.join("config.json"), cfg.to_string()).unwrap();
    let out = tmp(&format!("{name}_{tag}.gguf"));
    let opts = ConvertOptions {
        out_type: OutType::F32,
        name: Some(name.into()),
        progress: false,
        ..Default::default()
    };
    let r = convert(&dir, &out, &opts)
        .map(|_| ())
        .map_err(|e| e.to_string());
    let _ = std::fs::remove_dir_all(&dir);
    (out, r)
}

/// transformers 5's spelling of the indexed layers ("indexed_attention")
/// converts to the same file as the released checkpoint's
/// ("full_attention"), their block size included.
#[test]
fn qwen4exp_indexed_attention_spelling() {
    let types = r#""layer_types": ["linear_attention", "indexed_attention", "linear_attention", "linear_attention", "indexed_attention"]"#;
    let (out, r) = convert_patched("qwen4exp_tiny", "spelling", types);
    r.unwrap();
    let ours = std::fs::read(&out).unwrap();
    let _ = std::fs::remove_file(&out);
    let theirs = std::fs::read(root().join("parity/qwen4exp_tiny/model.gguf")).unwrap();
    assert!(ours == theirs, "not the fixture's bytes");
}

/// Qwen4-Exp configurations llama.cpp's `qwen4exp` files cannot represent
/// are refused by field name.
#[test]
fn qwen4exp_unsupported_configs_are_refused() {
    for (i, (edit, want)) in [
        (r#""output_gate_type": "silu""#, "output_gate_type"),
        (r#""ple_layer_ids": [1, 3]"#, "ple_layer_ids"),
        (r#""ple_layer_ids": [2]"#, "ple_layer_ids"),
        (r#""split_ngram_parts": 8"#, "split_ngram_parts"),
    ]
    .into_iter()
    .enumerate()
    {
        let (out, r) = convert_patched("qwen4exp_tiny", &format!("bad{i}"), edit);
        let err = r.expect_err(edit);
        assert!(err.contains(want), "{edit}: {err}");
        assert!(!out.exists(), "{edit}: output left behind");
    }
}
