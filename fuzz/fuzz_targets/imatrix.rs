//! Importance-matrix files (llama.cpp's GGUF imatrix and legacy `.dat`) on
//! arbitrary bytes, and the same bytes after a valid GGUF imatrix header: an
//! error naming the file, never a panic; what parses gives importance
//! weights for every entry, and writes and reads back equal.
#![no_main]

use coil_convert::imatrix::{Imatrix, ImatrixEntry};
use libfuzzer_sys::fuzz_target;
use std::path::Path;
use std::sync::OnceLock;

/// A valid GGUF imatrix's bytes (two entries, one of 2 experts).
fn valid() -> &'static [u8] {
    static V: OnceLock<Vec<u8>> = OnceLock::new();
    V.get_or_init(|| {
        let mut m = Imatrix {
            datasets: vec!["t.txt".into()],
            chunk_count: 2,
            chunk_size: 64,
            ..Imatrix::default()
        };
        m.entries.insert(
            "blk.0.attn_q.weight".into(),
            ImatrixEntry {
                sums: vec![1.0; 32],
                counts: vec![128.0],
            },
        );
        m.entries.insert(
            "blk.0.ffn_up_exps.weight".into(),
            ImatrixEntry {
                sums: vec![2.0; 64],
                counts: vec![60.0, 0.0],
            },
        );
        let p = std::env::temp_dir().join(format!("fuzz-imatrix-{}.gguf", std::process::id()));
        m.write(&p).expect("write");
        let b = std::fs::read(&p).expect("read");
        let _ = std::fs::remove_file(p);
        b
    })
}

fn check(bytes: Vec<u8>) {
    let path = Path::new("fuzz.imatrix");
    let Ok(m) = Imatrix::parse(path, bytes) else {
        return;
    };
    for (name, e) in &m.entries {
        let w = m.importance(name).expect("an entry has weights");
        assert_eq!(w.len(), e.sums.len());
    }
    if m.legacy {
        return;
    }
    let p = std::env::temp_dir().join(format!("fuzz-imatrix-rt-{}.gguf", std::process::id()));
    if m.write(&p).is_ok() {
        let back = Imatrix::read(&p).expect("a written imatrix reads back");
        let _ = std::fs::remove_file(&p);
        assert_eq!(back.entries.len(), m.entries.len());
    }
}

fuzz_target!(|data: &[u8]| {
    let [how, rest @ ..] = data else {
        return;
    };
    match how % 3 {
        0 => check(rest.to_vec()),
        // edits of a valid file: a byte set at an offset, or a cut
        1 if rest.len() >= 3 => {
            let mut b = valid().to_vec();
            for e in rest.chunks_exact(3) {
                let at = u16::from_le_bytes([e[0], e[1]]) as usize % b.len();
                b[at] = e[2];
            }
            check(b)
        }
        _ => {
            let b = valid();
            let cut = rest.first().map_or(0, |&c| c as usize * b.len() / 256);
            check(b[..cut].to_vec())
        }
    }
});
