//! Tokenizer golden tests: llama.cpp's `test-tokenizer-0` vectors for the
//! GPT-NeoX byte-level BPE (MPT) and LLaMA SentencePiece vocabularies, the
//! model fixtures' reference token ids, round trips and streaming decode.

use std::path::PathBuf;
use std::time::Instant;

use coil::tokenizer::{EncodeOptions, PreTokenizer, StreamDecoder, Tokenizer, Vocab, VocabKind};
use coil_gguf::GgufFile;

fn fixture(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/tokenizers")
        .join(name)
}

fn gpt_neox() -> Tokenizer {
    let file = GgufFile::open(fixture("ggml-vocab-gpt-neox.gguf")).unwrap();
    let mut vocab = Vocab::from_gguf(&file).unwrap();
    // This vocab-only file has no `tokenizer.ggml.pre`; llama.cpp's converter
    // writes "mpt" when it uses it for a model (`_set_vocab_builtin`).
    assert_eq!(vocab.pre, None);
    vocab.pre = Some("mpt".into());
    Tokenizer::new(vocab).unwrap()
}

fn llama_spm() -> Tokenizer {
    let file = GgufFile::open(fixture("ggml-vocab-llama-spm.gguf")).unwrap();
    Tokenizer::from_gguf(&file).unwrap()
}

/// (input, expected ids) pairs of a llama.cpp `.inp` / `.out` file pair.
fn vectors(stem: &str) -> Vec<(String, Vec<u32>)> {
    let inp = std::fs::read_to_string(fixture(&format!("{stem}.inp"))).unwrap();
    let out = std::fs::read_to_string(fixture(&format!("{stem}.out"))).unwrap();
    let inputs: Vec<&str> = inp.split("\n__ggml_vocab_test__\n").collect();
    let outputs: Vec<&str> = out.split('\n').collect();
    assert_eq!(
        inputs.len(),
        outputs.len(),
        "{stem}: .inp and .out disagree"
    );
    inputs
        .iter()
        .zip(&outputs)
        .map(|(i, o)| {
            let ids = o.split_whitespace().map(|t| t.parse().unwrap()).collect();
            (i.to_string(), ids)
        })
        .collect()
}

fn check_golden(tok: &Tokenizer, stem: &str) {
    check_golden_n(tok, stem, 46);
}

/// `n_inputs`: how many inputs llama.cpp's file holds (the split leaves
/// one empty tail more).
fn check_golden_n(tok: &Tokenizer, stem: &str, n_inputs: usize) {
    let vecs = vectors(stem);
    assert_eq!(
        vecs.len(),
        n_inputs + 1,
        "{stem}: expected llama.cpp's {n_inputs} inputs plus the empty tail"
    );
    let mut failures = Vec::new();
    for (i, (text, want)) in vecs.iter().enumerate() {
        let got = tok.encode(text, false);
        if &got != want {
            failures.push(format!("#{i} {text:?}\n   want {want:?}\n    got {got:?}"));
        }
    }
    assert!(
        failures.is_empty(),
        "{stem}: {} of {} vectors differ:\n{}",
        failures.len(),
        vecs.len(),
        failures.join("\n")
    );
}

#[test]
fn tokenizer_is_send_and_sync() {
    fn check<T: Send + Sync>() {}
    check::<Tokenizer>();
    check::<StreamDecoder>();
}

#[test]
fn golden_gpt_neox_mpt() {
    let tok = gpt_neox();
    assert_eq!(tok.kind(), VocabKind::Bpe);
    assert_eq!(tok.pre_tokenizer(), PreTokenizer::Gpt2);
    assert_eq!(tok.n_vocab(), 50432);
    check_golden(&tok, "ggml-vocab-mpt.gguf");
}

/// Qwen3.5 / Qwen3.6 (and Qwen3-Next files that name it): the Qwen2 regex
/// whose letter runs also take combining marks (`\p{M}`), 248,320 tokens.
#[test]
fn golden_qwen35() {
    let file = GgufFile::open(fixture("ggml-vocab-qwen35.gguf")).unwrap();
    let tok = Tokenizer::from_gguf(&file).unwrap();
    assert_eq!(tok.kind(), VocabKind::Bpe);
    assert_eq!(tok.pre_tokenizer(), PreTokenizer::Qwen35);
    check_golden_n(&tok, "ggml-vocab-qwen35.gguf", 50);
}

/// Where the Qwen3.5 regex and the Qwen2 one part: a combining mark after a
/// letter stays in the word (Qwen2 splits it off with what follows).
#[test]
fn qwen35_marks_stay_in_words() {
    let split = |p: PreTokenizer, s: &'static str| {
        let mut out = Vec::new();
        p.split(s, &mut out);
        out
    };
    let text = "cafe\u{301} ok";
    assert_eq!(split(PreTokenizer::Qwen35, text), ["cafe\u{301}", " ok"]);
    assert_eq!(split(PreTokenizer::Qwen2, text), ["cafe", "\u{301}", " ok"]);
}

#[test]
fn golden_llama_spm() {
    let tok = llama_spm();
    assert_eq!(tok.kind(), VocabKind::Spm);
    assert_eq!(tok.n_vocab(), 32000);
    check_golden(&tok, "ggml-vocab-llama-spm.gguf");
}

#[test]
fn missing_pre_is_llama_cpp_default() {
    let file = GgufFile::open(fixture("ggml-vocab-gpt-neox.gguf")).unwrap();
    let tok = Tokenizer::from_gguf(&file).unwrap();
    assert_eq!(tok.pre_tokenizer(), PreTokenizer::Default);
    // The "default" split cuts digit runs into triples; MPT's does not.
    assert_eq!(tok.encode("3333", false), [20084, 20]);
    assert_eq!(gpt_neox().encode("3333", false), [26409]);
}

#[test]
fn special_tokens() {
    let tok = llama_spm();
    assert_eq!((tok.bos_id(), tok.eos_id()), (Some(1), Some(2)));
    // add_bos is on for this vocabulary, add_eos off.
    assert_eq!(tok.encode("Hello world", true), [1, 15043, 3186]);
    assert_eq!(tok.encode("", true), [1]);
    // "<s>" is plain text unless parse_special.
    let plain = tok.encode("<s>Hello", false);
    assert!(!plain.contains(&1));
    let opts = EncodeOptions {
        add_special: true,
        parse_special: true,
    };
    assert_eq!(tok.encode_with("<s>Hello", opts), [1, 1, 15043]);
    assert_eq!(tok.decode(&[1, 15043, 3186, 2]), "Hello world");
    assert!(tok.is_eog(2));

    let neox = gpt_neox();
    let opts = EncodeOptions {
        add_special: false,
        parse_special: true,
    };
    let ids = neox.encode_with("Hello<|endoftext|>", opts);
    assert_eq!(ids.last(), Some(&0));
    assert_ne!(neox.encode("Hello<|endoftext|>", false).last(), Some(&0));
    assert!(neox.is_eog(0));
    assert_eq!(neox.token_to_bytes(0), b"");
    assert_eq!(neox.token_to_bytes_with(0, true), b"<|endoftext|>");
    // The added whitespace-run tokens are user-defined: always matched.
    assert_eq!(neox.encode("  ", false), [50276]);
    assert_eq!(neox.token_to_bytes(50276), b"  ");
}

/// decode(encode(s)) == s: llama.cpp round-trips all these inputs (no
/// normalization; byte-level BPE and SPM byte fallback cover every byte).
#[test]
fn round_trip() {
    for (tok, stem) in [
        (gpt_neox(), "ggml-vocab-mpt.gguf"),
        (llama_spm(), "ggml-vocab-llama-spm.gguf"),
    ] {
        for (text, _) in vectors(stem) {
            let ids = tok.encode(&text, false);
            assert_eq!(tok.decode(&ids), text, "{stem}");
            assert_eq!(tok.decode_bytes(&ids), text.as_bytes(), "{stem}");
        }
    }
}

/// Streaming decode of text whose characters are split across tokens.
#[test]
fn streaming_partial_utf8() {
    let text = "🦙 llamas 😶\u{200d}🌫️ 我想在apple工作 កាន់តែពិសេសអាច Cửa Việt";
    for tok in [gpt_neox(), llama_spm()] {
        let ids = tok.encode(text, false);
        let mut dec = StreamDecoder::new();
        let mut out = String::new();
        let mut held = 0;
        for &id in &ids {
            let chunk = dec.push(&tok, id);
            assert!(
                !chunk.contains('\u{FFFD}'),
                "{:?}: partial character leaked",
                tok.kind()
            );
            if chunk.is_empty() {
                held += 1;
            }
            out.push_str(&chunk);
        }
        assert_eq!(dec.flush(), "");
        assert!(
            held > 0,
            "{:?}: expected byte tokens that complete later",
            tok.kind()
        );
        // SPM: the stream keeps the prefix space that decode() strips.
        let want = if tok.kind() == VocabKind::Spm {
            format!(" {text}")
        } else {
            text.to_string()
        };
        assert_eq!(out, want);
    }
}

/// The model fixtures' tokens.json (tokenized by llama.cpp and HF
/// `tokenizers`): the same passage through each GGUF's own vocabulary.
#[test]
fn model_fixtures_tokens() {
    let passage = "GLOUCESTER:\nNow is the winter of our discontent\nMade glorious summer by this sun of York;\nAnd all the clouds that lour'd upon our";
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures/models");
    let mut n = 0;
    for entry in std::fs::read_dir(&dir).unwrap() {
        let path = entry.unwrap().path();
        let gguf = path.join("model.f16.gguf");
        if !gguf.exists() {
            continue;
        }
        let want: Vec<u32> = std::fs::read_to_string(path.join("tokens.json"))
            .unwrap()
            .trim()
            .trim_start_matches('[')
            .trim_end_matches(']')
            .split(',')
            .map(|t| t.trim().parse().unwrap())
            .collect();
        let tok = Tokenizer::from_gguf(&GgufFile::open(&gguf).unwrap()).unwrap();
        assert_eq!(tok.encode(passage, false), want, "{}", path.display());
        assert_eq!(tok.decode(&want), passage);
        n += 1;
    }
    assert!(n > 0, "no model fixtures under {}", dir.display());
}

/// About 1 MB of mixed text must encode quickly (well under a second in
/// release; the bound here is loose for slow CI machines and debug builds).
#[test]
fn encode_one_megabyte() {
    let mut text = String::new();
    let pieces: Vec<String> = vectors("ggml-vocab-mpt.gguf")
        .into_iter()
        .map(|(t, _)| t)
        .collect();
    while text.len() < 1 << 20 {
        for p in &pieces {
            text.push_str(p);
            text.push('\n');
        }
    }
    for tok in [gpt_neox(), llama_spm()] {
        let t0 = Instant::now();
        let ids = tok.encode(&text, false);
        let dt = t0.elapsed();
        eprintln!(
            "{:?}: {} bytes -> {} tokens in {:?}",
            tok.kind(),
            text.len(),
            ids.len(),
            dt
        );
        assert_eq!(tok.decode(&ids), text);
        assert!(dt.as_secs_f64() < 20.0, "encoding 1 MB took {dt:?}");
    }
}

/// Random strings (letters of many scripts, marks, emoji, odd white space,
/// contractions, digits) split by every pre-tokenizer and compared with the
/// regexes of llama.cpp run by Python's `regex` module, and encoded with the
/// GPT-NeoX vocabulary against a reference BPE. Vectors made by
/// `fixtures/tokenizers/gen_regex_vectors.py`.
#[test]
fn pretokenizers_match_reference_regexes() {
    let inp = std::fs::read_to_string(fixture("pretok-regex.inp")).unwrap();
    let inputs: Vec<&str> = inp.split('\0').collect();
    let out = std::fs::read_to_string(fixture("pretok-regex.out")).unwrap();
    let mut checked = 0;
    let mut failures = Vec::new();
    for line in out.lines() {
        let mut cols = line.split('\t');
        let (name, idx, want) = (
            cols.next().unwrap(),
            cols.next().unwrap(),
            cols.next().unwrap_or(""),
        );
        let pre = PreTokenizer::from_name(Some(name)).unwrap();
        let text = inputs[idx.parse::<usize>().unwrap()];
        let mut pieces = Vec::new();
        pre.split(text, &mut pieces);
        assert_eq!(pieces.concat(), text);
        let got: Vec<String> = pieces
            .iter()
            .map(|p| p.chars().count().to_string())
            .collect();
        if got.join(" ") != want {
            failures.push(format!(
                "{name} {text:?}: want {want}, got {}",
                got.join(" ")
            ));
        }
        checked += 1;
    }
    assert_eq!(checked, 9 * inputs.len());
    assert!(
        failures.is_empty(),
        "{} splits differ:\n{}",
        failures.len(),
        failures.join("\n")
    );

    let tok = gpt_neox();
    let bpe = std::fs::read_to_string(fixture("neox-bpe.out")).unwrap();
    for line in bpe.lines() {
        let (idx, want) = line.split_once('\t').unwrap();
        let text = inputs[idx.parse::<usize>().unwrap()];
        let want: Vec<u32> = want
            .split_whitespace()
            .map(|t| t.parse().unwrap())
            .collect();
        assert_eq!(tok.encode(text, false), want, "{text:?}");
        assert_eq!(tok.decode(&want), text);
    }
}
