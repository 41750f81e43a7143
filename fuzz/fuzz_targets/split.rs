//! Split models: the demo model written as 3 parts (`SplitWriter`), then up
//! to 8 edits of the parts' bytes from the input — a byte set, a part cut
//! short, two parts swapped, a part replaced by a part of another split of
//! the same model (into 2 or 4 parts) — and `GgufFile::from_parts`. An
//! error, never a panic; on success every tensor's data lies inside its own
//! part, and the model is loaded and run as the `model` target runs its
//! files.
#![no_main]

#[path = "common.rs"]
mod common;

use coil_gguf::{GgufFile, SplitLimits, SplitWriter, TensorSpec};
use libfuzzer_sys::fuzz_target;
use std::sync::{Arc, OnceLock};

/// The demo model's parts for splits into 2, 3 and 4 parts.
fn splits() -> &'static [Vec<Vec<u8>>; 3] {
    static S: OnceLock<[Vec<Vec<u8>>; 3]> = OnceLock::new();
    S.get_or_init(|| {
        let f = GgufFile::open(common::demo_path()).expect("the demo model opens");
        let specs: Vec<TensorSpec> = (f.tensors().iter())
            .map(|t| TensorSpec::new(t.name.clone(), &t.dims, t.ty))
            .collect();
        let n = specs.len();
        [2, 3, 4].map(|parts| {
            let out = common::scratch("split").join(format!("demo-{parts}.gguf"));
            let limits = SplitLimits {
                max_tensors: Some(n.div_ceil(parts)),
                max_bytes: None,
            };
            let mut w = SplitWriter::create(&out, f.metadata(), &specs, limits).unwrap();
            for t in f.tensors() {
                w.write_tensor_data(&f.bytes()[f.data_range(t)]).unwrap();
            }
            let paths = w.finish().unwrap();
            assert_eq!(paths.len(), parts);
            paths.iter().map(|p| std::fs::read(p).unwrap()).collect()
        })
    })
}

fuzz_target!(|data: &[u8]| {
    let all = splits();
    let mut parts = all[1].clone();
    for edit in data.chunks(5).take(8) {
        let [op, a, b, c, d] = match edit {
            &[op, a, b, c, d] => [op, a, b, c, d],
            _ => break,
        };
        let i = a as usize % parts.len();
        let at = u16::from_le_bytes([b, c]) as usize;
        match op % 4 {
            // (a part an earlier edit cut to nothing has no byte to set or cut)
            0 if !parts[i].is_empty() => {
                let len = parts[i].len();
                parts[i][at % len] = d;
            }
            1 if !parts[i].is_empty() => {
                let len = parts[i].len();
                parts[i].truncate(at % len);
            }
            0 | 1 => {}
            2 => parts.swap(i, b as usize % 3),
            _ => {
                let other = &all[if d % 2 == 0 { 0 } else { 2 }];
                parts[i] = other[(b as usize) % other.len()].clone();
            }
        }
    }
    let Ok(file) = GgufFile::from_parts(&parts) else {
        return;
    };
    let len = file.bytes().len();
    for t in file.tensors() {
        let r = file.data_range(t);
        let p = &file.parts()[t.part];
        let part = p.base as usize..(p.base + p.len) as usize;
        assert!(r.end <= len && part.start <= r.start && r.end <= part.end, "tensor {} outside its part", t.name);
    }
    common::exercise(Arc::new(file));
});
