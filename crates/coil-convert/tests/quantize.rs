//! `coil_convert::quantize` on tensors wide enough for K-quant blocks.

use coil_convert::{quantize, QuantMix, QuantizeOptions};
use coil_gguf::{GgmlType, GgufFile, GgufWriter, Metadata, TensorSpec, Value};

#[test]
fn k_mixtures_quantize_wide_tensors() {
    let d = std::env::temp_dir().join(format!("coil-convert-q-{}", std::process::id()));
    std::fs::create_dir_all(&d).unwrap();
    let src = d.join("wide.f32.gguf");
    let mut md = Metadata::new();
    md.insert("general.architecture", Value::String("mamba2".into()));
    md.insert("mamba2.block_count", Value::U32(1));
    let specs = [
        TensorSpec::new("token_embd.weight", &[512, 64], GgmlType::F32),
        TensorSpec::new("blk.0.ssm_in.weight", &[512, 96], GgmlType::F32),
        TensorSpec::new("blk.0.ssm_norm.weight", &[256, 2], GgmlType::F32),
        TensorSpec::new("blk.0.ssm_a", &[1, 8], GgmlType::F32),
    ];
    let data: Vec<Vec<f32>> = specs
        .iter()
        .map(|s| {
            let n: u64 = s.dims.iter().product();
            (0..n)
                .map(|i| ((i * 7919 % 1013) as f32 / 506.0 - 1.0) * 0.5)
                .collect()
        })
        .collect();
    let mut w = GgufWriter::create(&src, &md, &specs).unwrap();
    for v in &data {
        let b: Vec<u8> = v.iter().flat_map(|x| x.to_le_bytes()).collect();
        w.write_tensor_data(&b).unwrap();
    }
    w.finish().unwrap();
    for (mix, embd, ssm_in, tol) in [
        (QuantMix::Q4_K_M, GgmlType::Q6_K, GgmlType::Q4_K, 0.05),
        (QuantMix::Q5_K_M, GgmlType::Q6_K, GgmlType::Q5_K, 0.025),
        (QuantMix::Q6_K, GgmlType::Q6_K, GgmlType::Q6_K, 0.012),
        (QuantMix::Q4_0, GgmlType::Q6_K, GgmlType::Q4_0, 0.07),
    ] {
        let out = d.join(format!("{}.gguf", mix.name()));
        quantize(
            &src,
            &out,
            &QuantizeOptions {
                mix,
                progress: false,
            },
        )
        .unwrap();
        let f = GgufFile::open(&out).unwrap();
        let types: Vec<GgmlType> = specs
            .iter()
            .map(|s| f.tensor_info(&s.name).unwrap().ty)
            .collect();
        // tied embeddings get the output treatment
        assert_eq!(
            types,
            [embd, ssm_in, GgmlType::F32, GgmlType::F32],
            "{}",
            mix.name()
        );
        // llama-quantize's order: by layer, then name
        let names: Vec<&str> = f.tensors().iter().map(|t| t.name.as_str()).collect();
        assert_eq!(
            names,
            [
                "token_embd.weight",
                "blk.0.ssm_a",
                "blk.0.ssm_in.weight",
                "blk.0.ssm_norm.weight"
            ]
        );
        for (s, want) in specs.iter().zip(&data) {
            let t = f.tensor_info(&s.name).unwrap();
            let got = f.view(t).to_f32().unwrap();
            let err = got
                .iter()
                .zip(want)
                .fold(0f32, |m, (a, b)| m.max((a - b).abs()));
            assert!(err <= tol, "{} {}: {err}", mix.name(), t.name);
        }
        assert_eq!(
            f.metadata().get_u64("general.file_type"),
            Some(mix.file_type() as u64)
        );
    }
    let _ = std::fs::remove_dir_all(&d);
}
