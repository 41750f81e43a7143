//! The GGUF reader on arbitrary bytes: an error, never a panic; on success
//! every tensor's data range lies inside the file, and the tokenizer reads
//! its metadata without panicking either.
#![no_main]

use coil_gguf::GgufFile;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(file) = GgufFile::from_bytes(data.to_vec()) else {
        return;
    };
    let len = file.bytes().len();
    for t in file.tensors() {
        let r = file.data_range(t);
        assert!(r.start <= r.end && r.end <= len, "tensor {} out of the file", t.name);
    }
    let _ = coil::tokenizer::Tokenizer::from_gguf(&file);
});
