//! Split models: written by `SplitWriter` as llama.cpp names and keys them,
//! opened from any part in every way a model is opened, with the same
//! metadata, tensors and bytes as the unsplit file; a missing, truncated,
//! renamed or foreign part is an error naming it.

use coil_gguf::gguf::split::{part_path, KEY_SPLIT_COUNT, KEY_SPLIT_NO, KEY_SPLIT_TENSORS_COUNT};
use coil_gguf::{GgufFile, SplitLimits, SplitWriter, TensorSpec, Value};
use std::path::{Path, PathBuf};
#[path = "../../../tests/support/temp_path.rs"]
mod temp_path;
use temp_path::TempPath;

fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join(format!("../../tests/fixtures/models/{name}/model.f16.gguf"))
}

/// `src` written as parts of at most `max_tensors` tensors under `dir`
/// (`prefix.gguf` → `prefix-0000i-of-0000n.gguf`).
fn split(src: &Path, dir: &Path, prefix: &str, limits: SplitLimits) -> Vec<PathBuf> {
    let f = GgufFile::open(src).unwrap();
    let specs: Vec<TensorSpec> = f
        .tensors()
        .iter()
        .map(|t| TensorSpec::new(t.name.clone(), &t.dims, t.ty))
        .collect();
    let mut w = SplitWriter::create(
        dir.join(format!("{prefix}.gguf")),
        f.metadata(),
        &specs,
        limits,
    )
    .unwrap();
    for t in f.tensors() {
        assert_eq!(w.next_tensor(), Some(t.name.as_str()));
        w.write_tensor_data(&f.bytes()[f.data_range(t)]).unwrap();
    }
    w.finish().unwrap()
}

fn by_tensors(n: usize) -> SplitLimits {
    SplitLimits {
        max_tensors: Some(n),
        max_bytes: None,
    }
}

/// Same tensors (names, shapes, types, bytes) and the same metadata but the
/// split keys.
fn assert_same_model(a: &GgufFile, b: &GgufFile) {
    let keys = |f: &GgufFile| -> Vec<(String, Value)> {
        f.metadata()
            .iter()
            .filter(|(k, _)| !k.starts_with("split."))
            .map(|(k, v)| (k.to_string(), v.clone()))
            .collect()
    };
    assert_eq!(keys(a), keys(b));
    assert_eq!(a.tensors().len(), b.tensors().len());
    for (x, y) in a.tensors().iter().zip(b.tensors()) {
        assert_eq!((&x.name, &x.dims, x.ty), (&y.name, &y.dims, y.ty));
        assert_eq!(a.view(x).data, b.view(y).data, "{}", x.name);
    }
}

#[test]
fn a_split_model_opens_from_any_part_in_every_mode() {
    let dir = TempPath::dir("coil-split", "modes");
    let src = fixture("nemotron_h_moe");
    let parts = split(&src, &dir, "m", by_tensors(16));
    let whole = GgufFile::open(&src).unwrap();
    let n = whole.tensors().len().div_ceil(16);
    assert_eq!(parts.len(), n);
    for (i, p) in parts.iter().enumerate() {
        assert_eq!(p, &part_path(&dir.join("m"), i + 1, n));
        let one = GgufFile::from_bytes(std::fs::read(p).unwrap()).unwrap();
        let md = one.metadata();
        assert_eq!(md.get(KEY_SPLIT_NO), Some(&Value::U16(i as u16)));
        assert_eq!(md.get(KEY_SPLIT_COUNT), Some(&Value::U16(n as u16)));
        assert_eq!(
            md.get(KEY_SPLIT_TENSORS_COUNT),
            Some(&Value::I32(whole.tensors().len() as i32))
        );
        // The model's metadata in the first part only, as llama.cpp writes.
        assert_eq!(
            md.len(),
            if i == 0 {
                whole.metadata().len() + 3
            } else {
                3
            },
            "part {i}"
        );
    }
    type Open = fn(&Path) -> Result<GgufFile, coil_gguf::GgufError>;
    let modes: [(&str, Open); 4] = [
        ("open", |p| GgufFile::open(p)),
        ("prefaulted", |p| GgufFile::open_prefaulted(p)),
        ("private", |p| GgufFile::open_prefaulted_private(p)),
        ("huge pages", |p| GgufFile::open_in_huge_pages(p)),
    ];
    for (mode, open) in modes {
        for p in [&parts[0], &parts[n - 1]] {
            let f = open(p).unwrap_or_else(|e| panic!("{mode} {}: {e}", p.display()));
            assert!(f.is_split(), "{mode}");
            assert_eq!(f.parts().len(), n);
            assert_eq!(f.parts()[1].path.as_deref(), Some(parts[1].as_path()));
            assert_eq!(f.is_read_into_memory(), mode == "huge pages");
            assert_same_model(&f, &whole);
            let files = GgufFile::model_files(p).unwrap();
            assert_eq!(files, parts);
        }
    }
    // The loader may rewrite tensors of a private or read copy.
    let mut f = GgufFile::open_prefaulted_private(&parts[1]).unwrap();
    let last = f.tensors().len() - 1;
    f.tensor_data_mut(last).unwrap()[0] ^= 1;
    let mut f = GgufFile::open(&parts[0]).unwrap();
    assert!(f.tensor_data_mut(0).is_none());
    // In memory, too.
    let images: Vec<Vec<u8>> = parts.iter().map(|p| std::fs::read(p).unwrap()).collect();
    assert_same_model(&GgufFile::from_parts(&images).unwrap(), &whole);
}

/// The parts `llama-gguf-split --split --split-max-tensors 8` cut the llama
/// fixture's Q8_0 file into (`tools/make_split_fixture.sh`). That tool writes
/// the split keys in another order than gguf-py (`split.no`,
/// `split.tensors.count`, `split.count`) and copies them from the original's
/// metadata: coil reads either, and cuts the tensors where it does.
#[test]
fn a_split_written_by_llama_gguf_split_opens_as_the_whole_file() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures/split");
    let q8 = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../tests/fixtures/models/llama/model.q8_0.gguf");
    let whole = GgufFile::open(&q8).unwrap();
    let n = 5;
    let parts: Vec<PathBuf> = (1..=n)
        .map(|i| part_path(&dir.join("llama-q8_0"), i, n))
        .collect();
    for p in &parts {
        let f = GgufFile::open(p).unwrap_or_else(|e| panic!("{}: {e}", p.display()));
        assert!(f.is_split());
        assert_eq!(GgufFile::model_files(p).unwrap(), parts);
        assert_same_model(&f, &whole);
    }
    // coil's writer, given the same limit, puts the same tensors in each part
    // with the same bytes.
    let out = TempPath::dir("coil-split", "as-llama");
    let ours = split(&q8, &out, "llama-q8_0", by_tensors(8));
    assert_eq!(ours.len(), n);
    for (a, b) in ours.iter().zip(&parts) {
        let (a, b) = (
            GgufFile::from_bytes(std::fs::read(a).unwrap()).unwrap(),
            GgufFile::from_bytes(std::fs::read(b).unwrap()).unwrap(),
        );
        let names =
            |f: &GgufFile| -> Vec<String> { f.tensors().iter().map(|t| t.name.clone()).collect() };
        assert_eq!(names(&a), names(&b));
        for (x, y) in a.tensors().iter().zip(b.tensors()) {
            assert_eq!(a.view(x).data, b.view(y).data, "{}", x.name);
        }
    }
}

#[test]
fn a_model_that_fits_one_part_is_one_plain_file() {
    let dir = TempPath::dir("coil-split", "one");
    let src = fixture("mamba");
    let limits = SplitLimits {
        max_bytes: Some(1 << 30),
        max_tensors: None,
    };
    let parts = split(&src, &dir, "m", limits);
    assert_eq!(parts, vec![dir.join("m.gguf")]);
    let f = GgufFile::open(&parts[0]).unwrap();
    assert!(!f.is_split() && f.metadata().get(KEY_SPLIT_COUNT).is_none());
    assert_eq!(
        std::fs::read(&parts[0]).unwrap(),
        std::fs::read(&src).unwrap()
    );
}

#[test]
fn parts_are_cut_by_size() {
    let dir = TempPath::dir("coil-split", "size");
    let src = fixture("mamba2");
    let whole = GgufFile::open(&src).unwrap();
    let limit = 40_000u64;
    let limits = SplitLimits {
        max_bytes: Some(limit),
        max_tensors: None,
    };
    let parts = split(&src, &dir, "m", limits);
    assert!(parts.len() > 2, "{}", parts.len());
    let f = GgufFile::open(&parts[1]).unwrap();
    for (i, p) in f.parts().iter().enumerate() {
        let data: u64 = (f.tensors().iter().filter(|t| t.part == i))
            .map(|t| t.n_bytes.div_ceil(32) * 32)
            .sum();
        assert!(
            data <= limit || p.n_tensors == 1,
            "part {i}: {data} bytes of tensors"
        );
    }
    assert_same_model(&f, &whole);
}

fn err(path: &Path) -> String {
    match GgufFile::open(path) {
        Ok(_) => panic!("{} opened", path.display()),
        Err(e) => e.to_string(),
    }
}

#[test]
fn a_missing_truncated_renamed_or_foreign_part_is_an_error_naming_it() {
    let dir = TempPath::dir("coil-split", "bad");
    let parts = split(&fixture("nemotron_h_moe"), &dir, "a", by_tensors(15));
    assert_eq!(parts.len(), 3);
    let name = |p: &Path| p.file_name().unwrap().to_string_lossy().into_owned();

    // Missing.
    let moved = dir.join("elsewhere.gguf");
    std::fs::rename(&parts[1], &moved).unwrap();
    let e = err(&parts[0]);
    assert!(
        e.contains(&name(&parts[1])) && e.contains("part 2 of 3 is missing"),
        "{e}"
    );
    // Renamed: a part that does not follow the naming cannot find the others.
    let e = err(&moved);
    assert!(
        e.contains("elsewhere.gguf") && e.contains("PREFIX-00002-of-00003.gguf"),
        "{e}"
    );
    std::fs::rename(&moved, &parts[1]).unwrap();

    // Truncated.
    let bytes = std::fs::read(&parts[2]).unwrap();
    std::fs::write(&parts[2], &bytes[..bytes.len() - 100]).unwrap();
    let e = err(&parts[0]);
    assert!(
        e.contains(&name(&parts[2])) && e.contains("runs past the end"),
        "{e}"
    );
    std::fs::write(&parts[2], &bytes).unwrap();
    GgufFile::open(&parts[0]).unwrap();

    // Another model split the same way: its part 2 in this model's place.
    let other = split(&fixture("granitemoehybrid"), &dir, "b", by_tensors(27));
    assert_eq!(other.len(), 3);
    let keep = std::fs::read(&parts[1]).unwrap();
    std::fs::copy(&other[1], &parts[1]).unwrap();
    let e = err(&parts[0]);
    assert!(
        e.contains(&name(&parts[1])) && e.contains("another model"),
        "{e}"
    );
    // A part of a split into another number of parts.
    let four = split(&fixture("nemotron_h_moe"), &dir, "c", by_tensors(10));
    assert_eq!(four.len(), 4);
    std::fs::copy(&four[1], &parts[1]).unwrap();
    let e = err(&parts[0]);
    assert!(
        e.contains(&name(&parts[1])) && e.contains("split.count is 4, not 3"),
        "{e}"
    );
    // Parts swapped: split.no disagrees with the name.
    std::fs::copy(&parts[2], &parts[1]).unwrap();
    let e = err(&parts[0]);
    assert!(
        e.contains(&name(&parts[1])) && e.contains("split.no says part 3"),
        "{e}"
    );
    std::fs::write(&parts[1], &keep).unwrap();
    GgufFile::open(&parts[2]).unwrap();
}
