//! LFM2's pre-tokenizer as llama.cpp names it (`tokenizer.ggml.pre` "lfm2":
//! llama.cpp runs it as its LLaMA-3 pre-tokenizer, with ignore_merges and
//! BOS added by default). Golden ids from the Hugging Face `tokenizers`
//! library on a small byte-level BPE built in that configuration (LLaMA-3
//! split regex, ByteLevel, `ignore_merges`), for llama.cpp's
//! test-tokenizer-0 inputs and 600 random strings: see
//! `fixtures/tokenizers/gen_lfm2_vectors.py`. LFM2's own vocabulary is not
//! in the repository; this checks the pre-tokenizer and BPE behaviour the
//! name stands for.

use coil::tokenizer::{PreTokenizer, Tokenizer};
use coil_gguf::GgufFile;
use std::path::PathBuf;

fn fixture(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/tokenizers")
        .join(name)
}

fn lfm2() -> Tokenizer {
    let file = GgufFile::open(fixture("lfm2-bpe.gguf")).unwrap();
    Tokenizer::from_gguf(&file).unwrap()
}

#[test]
fn lfm2_is_llama3_with_bos() {
    assert_eq!(
        PreTokenizer::from_name(Some("lfm2")).ok(),
        Some(PreTokenizer::Llama3)
    );
    let t = lfm2();
    assert_eq!(t.vocab().pre.as_deref(), Some("lfm2"));
    // No add_bos key in the file: llama.cpp's default for "lfm2" is on.
    assert!(t.vocab().add_bos);
    let ids = t.encode("Hello world", true);
    assert_eq!(ids[0], 1, "<|startoftext|> first");
    assert_eq!(&ids[1..], t.encode("Hello world", false));
}

#[test]
fn lfm2_matches_hf_tokenizers() {
    let t = lfm2();
    let inp = std::fs::read_to_string(fixture("ggml-vocab-mpt.gguf.inp")).unwrap();
    let inp: Vec<&str> = inp.split("\n__ggml_vocab_test__\n").collect();
    let rand = std::fs::read_to_string(fixture("pretok-regex.inp")).unwrap();
    let rand: Vec<&str> = rand.split('\0').collect();
    let out = std::fs::read_to_string(fixture("lfm2-bpe.out")).unwrap();
    let mut failures = Vec::new();
    let mut checked = 0;
    for line in out.lines() {
        let mut cols = line.split('\t');
        let (set, idx, want) = (
            cols.next().unwrap(),
            cols.next().unwrap().parse::<usize>().unwrap(),
            cols.next().unwrap_or(""),
        );
        let text = if set == "inp" { inp[idx] } else { rand[idx] };
        let want: Vec<u32> = want
            .split_whitespace()
            .map(|v| v.parse().unwrap())
            .collect();
        let got = t.encode(text, false);
        if got != want {
            failures.push(format!(
                "{set} #{idx} {text:?}\n   want {want:?}\n    got {got:?}"
            ));
        }
        assert_eq!(t.decode(&want), text, "{set} #{idx}: decode");
        checked += 1;
    }
    assert_eq!(checked, inp.len() + rand.len());
    assert!(
        failures.is_empty(),
        "{} of {checked} differ:\n{}",
        failures.len(),
        failures.join("\n")
    );
}
