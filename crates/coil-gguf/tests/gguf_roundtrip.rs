//! GGUF writer → reader round trips and header validation.

use coil_gguf::gguf::encode_header;
use coil_gguf::{
    GgmlType, GgufError, GgufFile, GgufWriter, Metadata, TensorSpec, Value, ValueType,
};
#[path = "../../../tests/support/temp_path.rs"]
mod temp_path;
use temp_path::TempPath;

fn sample_metadata() -> Metadata {
    let mut m = Metadata::new();
    m.insert("general.architecture", Value::String("mamba2".into()));
    m.insert("u8", Value::U8(7));
    m.insert("i8", Value::I8(-7));
    m.insert("u16", Value::U16(65535));
    m.insert("i16", Value::I16(-300));
    m.insert("u32", Value::U32(123456));
    m.insert("i32", Value::I32(-123456));
    m.insert("f32", Value::F32(1.5e-3));
    m.insert("bool", Value::Bool(true));
    m.insert("str", Value::String("héllo ▁world".into()));
    m.insert("u64", Value::U64(u64::MAX));
    m.insert("i64", Value::I64(i64::MIN));
    m.insert("f64", Value::F64(-2.25));
    m.insert(
        "strings",
        Value::Array(
            ValueType::String,
            vec![Value::String("a".into()), Value::String("".into())],
        ),
    );
    m.insert("empty", Value::Array(ValueType::F32, vec![]));
    m.insert(
        "nested",
        Value::Array(
            ValueType::Array,
            vec![
                Value::Array(ValueType::I32, vec![Value::I32(1), Value::I32(-2)]),
                Value::Array(ValueType::String, vec![Value::String("x".into())]),
            ],
        ),
    );
    m
}

fn bytes_of(spec: &TensorSpec, seed: u8) -> Vec<u8> {
    let n: u64 = spec.dims.iter().product();
    let len = spec.ty.bytes_for(n).unwrap() as usize;
    (0..len)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed))
        .collect()
}

#[test]
fn write_then_read_is_identical() {
    let dir = tempdir();
    let path = dir.join("rt.gguf");
    let meta = sample_metadata();
    let specs = vec![
        TensorSpec::new("a", &[3], GgmlType::F32),
        TensorSpec::new("b", &[64, 2], GgmlType::Q8_0),
        TensorSpec::new("c", &[256, 1, 2], GgmlType::Q4_K),
        TensorSpec::new("empty", &[0, 4], GgmlType::F16),
        TensorSpec::new("d", &[5, 3], GgmlType::F16),
    ];
    let datas: Vec<Vec<u8>> = specs
        .iter()
        .enumerate()
        .map(|(i, s)| bytes_of(s, i as u8))
        .collect();
    let mut w = GgufWriter::create(&path, &meta, &specs).unwrap();
    for d in &datas {
        // Feed in two pieces to exercise streaming.
        let (x, y) = d.split_at(d.len() / 2);
        w.write_tensor_data(x).unwrap();
        w.write_tensor_data(y).unwrap();
    }
    w.finish().unwrap();

    // read into memory: the same tensors, writable in memory only
    let mut m = GgufFile::open_in_huge_pages(&path).unwrap();
    assert!(m.is_read_into_memory());
    for (i, d) in datas.iter().enumerate() {
        let name = &specs[i].name;
        assert_eq!(m.tensor(name).unwrap().data, &d[..], "{name}");
        if let Some(data) = m.tensor_data_mut(i) {
            data.fill(0xAB);
        }
    }
    assert_eq!(m.tensor("b").unwrap().data[0], 0xAB);
    drop(m);
    let empty = dir.join("empty.gguf");
    std::fs::write(&empty, b"").unwrap();
    assert!(GgufFile::open_in_huge_pages(&empty).is_err());
    assert!(GgufFile::open_in_huge_pages(dir.join("absent.gguf")).is_err());

    let f = GgufFile::open(&path).unwrap();
    assert!(!f.is_read_into_memory());
    assert_eq!(f.version(), 3);
    assert_eq!(f.metadata(), &meta);
    assert_eq!(f.tensors().len(), specs.len());
    for ((t, s), d) in f.tensors().iter().zip(&specs).zip(&datas) {
        assert_eq!(t.name, s.name);
        assert_eq!(t.dims, s.dims);
        assert_eq!(t.ty, s.ty);
        assert_eq!(t.offset % 32, 0);
        assert_eq!(f.tensor(&t.name).unwrap().data, &d[..]);
    }
    let a = f.tensor("a").unwrap();
    let floats: &[f32] = a.as_slice().unwrap();
    assert_eq!(floats.len(), 3);
    assert!(a.as_slice::<half::f16>().is_err());
    assert!(matches!(f.tensor("nope"), Err(GgufError::MissingTensor(_))));

    // Re-encoding what was read gives the same header bytes.
    let specs_back: Vec<TensorSpec> = f
        .tensors()
        .iter()
        .map(|t| TensorSpec::new(t.name.clone(), &t.dims, t.ty))
        .collect();
    let (h1, _) = encode_header(&meta, &specs).unwrap();
    let (h2, _) = encode_header(f.metadata(), &specs_back).unwrap();
    assert_eq!(h1, h2);
    let raw = std::fs::read(&path).unwrap();
    assert_eq!(&raw[..h1.len()], &h1[..]);
}

#[test]
fn custom_alignment_is_honoured() {
    let dir = tempdir();
    let path = dir.join("align.gguf");
    let mut meta = Metadata::new();
    meta.insert("general.alignment", Value::U32(64));
    let specs = vec![
        TensorSpec::new("x", &[3], GgmlType::F32),
        TensorSpec::new("y", &[7], GgmlType::F32),
    ];
    let mut w = GgufWriter::create(&path, &meta, &specs).unwrap();
    w.write_tensor_data(&[0u8; 12]).unwrap();
    w.write_tensor_data(&[1u8; 28]).unwrap();
    w.finish().unwrap();
    let f = GgufFile::open(&path).unwrap();
    assert_eq!(f.alignment(), 64);
    assert_eq!(f.data_offset() % 64, 0);
    assert_eq!(f.tensors()[1].offset, 64);
    assert_eq!(f.tensor("y").unwrap().data, &[1u8; 28]);
}

#[test]
fn abandoned_or_short_write_leaves_nothing() {
    let dir = tempdir();
    let path = dir.join("short.gguf");
    let specs = vec![TensorSpec::new("x", &[4], GgmlType::F32)];
    {
        let mut w = GgufWriter::create(&path, &Metadata::new(), &specs).unwrap();
        w.write_tensor_data(&[0u8; 8]).unwrap();
        assert!(w.write_tensor_data(&[0u8; 9]).is_err());
        assert!(w.finish().is_err());
    }
    {
        let _w = GgufWriter::create(&path, &Metadata::new(), &specs).unwrap();
    }
    let left: Vec<_> = std::fs::read_dir(&dir).unwrap().collect();
    assert!(left.is_empty(), "{left:?}");
}

#[test]
fn bad_specs_are_rejected() {
    let bad = [
        TensorSpec::new("q", &[33], GgmlType::Q8_0),
        TensorSpec::new("big", &[u64::MAX, 2], GgmlType::F32),
        TensorSpec::new("5d", &[1, 1, 1, 1, 1], GgmlType::F32),
    ];
    for s in bad {
        assert!(encode_header(&Metadata::new(), &[s]).is_err());
    }
    let mut m = Metadata::new();
    m.insert("general.alignment", Value::U32(48));
    assert!(encode_header(&m, &[]).is_err());
}

fn header_with(f: impl FnOnce(&mut Vec<u8>)) -> Result<GgufFile, GgufError> {
    let mut b = Vec::new();
    b.extend_from_slice(b"GGUF");
    b.extend_from_slice(&3u32.to_le_bytes());
    f(&mut b);
    GgufFile::from_bytes(b)
}

#[test]
fn malformed_headers_name_the_field() {
    let e = GgufFile::from_bytes(b"GGML\x03\0\0\0".to_vec())
        .err()
        .unwrap();
    assert!(e.to_string().contains("magic"), "{e}");
    let e = GgufFile::from_bytes(b"GGUF\x01\0\0\0".to_vec())
        .err()
        .unwrap();
    assert!(e.to_string().contains("version 1"), "{e}");
    let e = GgufFile::from_bytes(b"GGUF\0\0\0\x03".to_vec())
        .err()
        .unwrap();
    assert!(e.to_string().contains("big-endian"), "{e}");

    // Huge counts are rejected before allocation.
    let e = header_with(|b| {
        b.extend_from_slice(&u64::MAX.to_le_bytes());
        b.extend_from_slice(&0u64.to_le_bytes());
    })
    .err()
    .unwrap();
    assert!(e.to_string().contains("tensor_count"), "{e}");

    // A string length past the end.
    let e = header_with(|b| {
        b.extend_from_slice(&0u64.to_le_bytes());
        b.extend_from_slice(&1u64.to_le_bytes());
        b.extend_from_slice(&(1u64 << 60).to_le_bytes());
        b.extend_from_slice(&[0u8; 16]);
    })
    .err()
    .unwrap();
    assert!(matches!(e, GgufError::Truncated { .. }), "{e}");
    assert!(
        e.to_string().contains("metadata[0].key") && e.to_string().contains("offset 24"),
        "{e}"
    );

    // An array count far beyond the file.
    let e = header_with(|b| {
        b.extend_from_slice(&0u64.to_le_bytes());
        b.extend_from_slice(&1u64.to_le_bytes());
        b.extend_from_slice(&1u64.to_le_bytes());
        b.push(b'k');
        b.extend_from_slice(&9u32.to_le_bytes());
        b.extend_from_slice(&8u32.to_le_bytes());
        b.extend_from_slice(&(u64::MAX / 2).to_le_bytes());
    })
    .err()
    .unwrap();
    assert!(e.to_string().contains("does not fit"), "{e}");

    // Deeply nested arrays do not overflow the stack.
    let e = header_with(|b| {
        b.extend_from_slice(&0u64.to_le_bytes());
        b.extend_from_slice(&1u64.to_le_bytes());
        b.extend_from_slice(&1u64.to_le_bytes());
        b.push(b'k');
        b.extend_from_slice(&9u32.to_le_bytes());
        for _ in 0..100 {
            b.extend_from_slice(&9u32.to_le_bytes());
            b.extend_from_slice(&1u64.to_le_bytes());
        }
        b.extend_from_slice(&[0u8; 64]);
    })
    .err()
    .unwrap();
    assert!(e.to_string().contains("nested"), "{e}");
}

#[test]
fn tensor_past_end_of_file_is_an_error() {
    let specs = vec![TensorSpec::new("w", &[32, 4], GgmlType::F32)];
    let (mut h, _) = encode_header(&Metadata::new(), &specs).unwrap();
    h.extend_from_slice(&vec![0u8; 32 * 4 * 4 - 1]);
    let e = GgufFile::from_bytes(h.clone()).err().unwrap();
    assert!(matches!(e, GgufError::TensorOutOfBounds { .. }), "{e}");
    h.push(0);
    assert!(GgufFile::from_bytes(h).is_ok());
}

fn tempdir() -> TempPath {
    use std::sync::atomic::{AtomicUsize, Ordering};
    static N: AtomicUsize = AtomicUsize::new(0);
    TempPath::dir(
        "coil-gguf-test",
        &N.fetch_add(1, Ordering::SeqCst).to_string(),
    )
}
