//! Tokenizer (engine layer): text ↔ token ids, exactly as llama.cpp does it
//! for the vocabularies GGUF files carry.
//!
//! - [`Vocab`] is the plain data (`tokenizer.ggml.*` keys), read with
//!   [`Vocab::from_gguf`] or built by hand.
//! - [`Tokenizer`] encodes ([`Tokenizer::encode`]) and decodes
//!   ([`Tokenizer::decode`], [`Tokenizer::token_to_bytes`]).
//! - [`StreamDecoder`] turns generated ids into text one token at a time.
//!
//! Two algorithms: byte-level BPE (`"gpt2"`, GPT-NeoX and friends, with the
//! pre-tokenizer chosen by `tokenizer.ggml.pre`) and SentencePiece BPE
//! (`"llama"`). Like llama.cpp, no Unicode normalization (NFC) is applied.
//! User-defined tokens (type 4) are always matched verbatim in the input;
//! control and unknown tokens only with [`EncodeOptions::parse_special`].
//!
//! ```no_run
//! use coil::tokenizer::{StreamDecoder, Tokenizer};
//!
//! let file = coil_gguf::GgufFile::open("model.gguf")?;
//! let tok = Tokenizer::from_gguf(&file)?;
//! let ids = tok.encode("Hello world", true); // BOS added if the model asks
//! assert_eq!(tok.decode(&ids), "Hello world");
//!
//! let mut stream = StreamDecoder::new();
//! for &id in &ids {
//!     print!("{}", stream.push(&tok, id)); // complete UTF-8 only
//! }
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

mod bpe;
mod error;
mod pretokenize;
mod spm;
mod stream;
mod unicode;
mod unicode_tables;
mod vocab;

use std::collections::HashMap;

pub use error::TokenizerError;
pub use pretokenize::PreTokenizer;
pub use stream::StreamDecoder;
pub use vocab::{keys, TokenType, Vocab, VocabKind};

use bpe::{Bpe, BpeScratch};
use spm::{Spm, SpmScratch};

/// Options of [`Tokenizer::encode_with`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct EncodeOptions {
    /// Add BOS / EOS as the vocabulary asks (`add_bos` / `add_eos`).
    pub add_special: bool,
    /// Recognise the texts of control and unknown tokens (e.g. `<s>`,
    /// `<|endoftext|>`) in the input and emit those tokens (llama.cpp's
    /// `parse_special`). Off: they are tokenized as plain text.
    pub parse_special: bool,
}

enum Algo {
    Bpe(Bpe),
    Spm(Spm),
}

/// A tokenizer built from a [`Vocab`]. Immutable and `Sync`: share it.
pub struct Tokenizer {
    vocab: Vocab,
    pre: PreTokenizer,
    algo: Algo,
    /// Token text → id (the last id wins for duplicate texts, as in llama.cpp).
    token_to_id: HashMap<String, u32>,
    /// Control, user-defined and unknown tokens, longest text first.
    specials: Vec<u32>,
    /// Decoded bytes of every token, concatenated; `piece_ends[i]` ends token i.
    pieces: Vec<u8>,
    piece_ends: Vec<usize>,
    /// Control and unknown tokens: rendered only on request.
    hidden: Vec<bool>,
    /// End-of-generation tokens.
    eog: Vec<u32>,
}

impl std::fmt::Debug for Tokenizer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tokenizer")
            .field("kind", &self.vocab.kind)
            .field("n_vocab", &self.vocab.len())
            .field("pre", &self.pre)
            .field("bos_id", &self.vocab.bos_id)
            .field("eos_id", &self.vocab.eos_id)
            .finish_non_exhaustive()
    }
}

impl Tokenizer {
    /// Builds the tokenizer; checks the vocabulary first.
    ///
    /// Like llama.cpp's vocabulary loader, this also adjusts token types
    /// (visible through [`Tokenizer::vocab`]): empty texts become
    /// `[EMPTY_<id>]`; end-of-turn / end-of-generation / fill-in-the-middle
    /// tokens recognised by their text (`<|im_end|>`, `<|endoftext|>`,
    /// `<fim_prefix>`, ...) become control tokens; an absent EOT / EOM id is
    /// filled in from those texts.
    pub fn new(mut vocab: Vocab) -> Result<Self, TokenizerError> {
        vocab.validate()?;
        let n = vocab.len();
        if vocab.token_types.is_empty() {
            vocab.token_types = vec![TokenType::Normal; n];
        }
        if vocab.scores.is_empty() {
            vocab.scores = vec![0.0; n];
        }
        for (i, t) in vocab.tokens.iter_mut().enumerate() {
            if t.is_empty() {
                *t = format!("[EMPTY_{i}]");
            }
        }
        let pre = match vocab.kind {
            VocabKind::Bpe => PreTokenizer::from_name(vocab.pre.as_deref())?,
            // Not used by SentencePiece.
            VocabKind::Spm => PreTokenizer::Default,
        };

        let mut token_to_id = HashMap::with_capacity(n);
        for (i, t) in vocab.tokens.iter().enumerate() {
            token_to_id.insert(t.clone(), i as u32);
        }
        let eog = special_fixups(&mut vocab, &token_to_id);

        let algo = match vocab.kind {
            VocabKind::Bpe => Algo::Bpe(Bpe::new(
                &vocab.tokens,
                &vocab.merges,
                &token_to_id,
                pre.ignore_merges(),
            )?),
            VocabKind::Spm => Algo::Spm(Spm::new(&token_to_id, vocab.unk_id)),
        };

        let mut specials: Vec<u32> = (0..n as u32)
            .filter(|&id| {
                matches!(
                    vocab.token_types[id as usize],
                    TokenType::Control | TokenType::UserDefined | TokenType::Unknown
                )
            })
            .collect();
        specials.sort_by_key(|&id| std::cmp::Reverse(vocab.tokens[id as usize].len()));

        let mut pieces = Vec::new();
        let mut piece_ends = Vec::with_capacity(n);
        let mut hidden = Vec::with_capacity(n);
        for (text, &ty) in vocab.tokens.iter().zip(&vocab.token_types) {
            hidden.push(matches!(ty, TokenType::Control | TokenType::Unknown));
            render_piece(vocab.kind, text, ty, &mut pieces);
            piece_ends.push(pieces.len());
        }

        Ok(Tokenizer {
            vocab,
            pre,
            algo,
            token_to_id,
            specials,
            pieces,
            piece_ends,
            hidden,
            eog,
        })
    }

    /// Reads the vocabulary from a GGUF file and builds the tokenizer.
    pub fn from_gguf(file: &coil_gguf::GgufFile) -> Result<Self, TokenizerError> {
        Self::new(Vocab::from_gguf(file)?)
    }

    /// The vocabulary (with token types and scores filled in).
    pub fn vocab(&self) -> &Vocab {
        &self.vocab
    }

    /// Number of tokens.
    pub fn n_vocab(&self) -> usize {
        self.vocab.len()
    }

    pub fn kind(&self) -> VocabKind {
        self.vocab.kind
    }

    /// The pre-tokenizer in use (BPE only; meaningless for SentencePiece).
    pub fn pre_tokenizer(&self) -> PreTokenizer {
        self.pre
    }

    pub fn bos_id(&self) -> Option<u32> {
        self.vocab.bos_id
    }

    pub fn eos_id(&self) -> Option<u32> {
        self.vocab.eos_id
    }

    /// Whether `id` ends generation (EOS, EOT, EOM or a well-known
    /// end-of-turn control token).
    pub fn is_eog(&self, id: u32) -> bool {
        self.eog.contains(&id)
    }

    /// The end-of-generation tokens.
    pub fn eog_ids(&self) -> &[u32] {
        &self.eog
    }

    /// The stored text of token `id`.
    pub fn token_text(&self, id: u32) -> Option<&str> {
        self.vocab.tokens.get(id as usize).map(String::as_str)
    }

    /// The id of the token whose stored text is `text`.
    pub fn token_to_id(&self, text: &str) -> Option<u32> {
        self.token_to_id.get(text).copied()
    }

    /// Encodes `text`; with `add_special`, adds BOS/EOS as the vocabulary
    /// asks. Control-token texts in `text` are treated as plain text.
    pub fn encode(&self, text: &str, add_special: bool) -> Vec<u32> {
        self.encode_with(
            text,
            EncodeOptions {
                add_special,
                parse_special: false,
            },
        )
    }

    /// Encodes `text` with explicit options.
    pub fn encode_with(&self, text: &str, opts: EncodeOptions) -> Vec<u32> {
        let mut out = Vec::with_capacity(text.len() / 3 + 2);
        if opts.add_special && self.vocab.add_bos {
            out.extend(self.vocab.bos_id);
        }
        let fragments = self.partition(text, opts.parse_special);
        match &self.algo {
            Algo::Bpe(bpe) => {
                let mut words = Vec::new();
                let mut pre_scratch = pretokenize::Scratch::default();
                let mut scratch = BpeScratch::default();
                for frag in fragments {
                    match frag {
                        Fragment::Token(id) => out.push(id),
                        Fragment::Text(s) => {
                            words.clear();
                            self.pre.split_with(s, &mut words, &mut pre_scratch);
                            for w in &words {
                                bpe.encode_word(w, &self.token_to_id, &mut out, &mut scratch);
                            }
                        }
                    }
                }
            }
            Algo::Spm(spm) => {
                let mut scratch = SpmScratch::default();
                let mut text_buf = String::new();
                // A space is prefixed to the first raw text and to raw text
                // following a special token.
                let mut prev_special = true;
                for frag in fragments {
                    match frag {
                        Fragment::Token(id) => {
                            out.push(id);
                            prev_special = true;
                        }
                        Fragment::Text(s) => {
                            text_buf.clear();
                            if self.vocab.add_space_prefix && prev_special {
                                text_buf.push('▁');
                            }
                            for c in s.chars() {
                                text_buf.push(if c == ' ' { '▁' } else { c });
                            }
                            spm.encode(
                                &text_buf,
                                &self.token_to_id,
                                &self.vocab.scores,
                                &mut out,
                                &mut scratch,
                            );
                            prev_special = false;
                        }
                    }
                }
            }
        }
        if opts.add_special && self.vocab.add_eos {
            out.extend(self.vocab.eos_id);
        }
        out
    }

    /// Splits `text` on the texts of special tokens, longest first, like
    /// llama.cpp's `tokenizer_st_partition`.
    fn partition<'a>(&self, text: &'a str, parse_special: bool) -> Vec<Fragment<'a>> {
        let mut frags = Vec::new();
        if text.is_empty() {
            return frags;
        }
        frags.push(Fragment::Text(text));
        let mut next = Vec::new();
        for &id in &self.specials {
            let ty = self.vocab.token_types[id as usize];
            if !parse_special && matches!(ty, TokenType::Control | TokenType::Unknown) {
                continue;
            }
            let pat = self.vocab.tokens[id as usize].as_str();
            if !frags
                .iter()
                .any(|f| matches!(f, Fragment::Text(s) if s.contains(pat)))
            {
                continue;
            }
            next.clear();
            for &f in &frags {
                match f {
                    Fragment::Token(_) => next.push(f),
                    Fragment::Text(s) => {
                        let mut last = 0;
                        for (pos, _) in s.match_indices(pat) {
                            if pos > last {
                                next.push(Fragment::Text(&s[last..pos]));
                            }
                            next.push(Fragment::Token(id));
                            last = pos + pat.len();
                        }
                        if last < s.len() {
                            next.push(Fragment::Text(&s[last..]));
                        }
                    }
                }
            }
            std::mem::swap(&mut frags, &mut next);
        }
        frags
    }

    /// The bytes token `id` stands for. Control and unknown tokens give
    /// nothing (see [`Tokenizer::token_to_bytes_with`]); so do unused and
    /// out-of-range ids.
    pub fn token_to_bytes(&self, id: u32) -> &[u8] {
        self.token_to_bytes_with(id, false)
    }

    /// Like [`Tokenizer::token_to_bytes`]; with `special`, control and
    /// unknown tokens give their text.
    pub fn token_to_bytes_with(&self, id: u32, special: bool) -> &[u8] {
        let i = id as usize;
        if i >= self.piece_ends.len() || (self.hidden[i] && !special) {
            return &[];
        }
        let start = if i == 0 { 0 } else { self.piece_ends[i - 1] };
        &self.pieces[start..self.piece_ends[i]]
    }

    /// Decodes `ids` to bytes (control tokens as nothing). For SentencePiece
    /// with a space prefix, the leading space of the first non-empty piece
    /// is removed (llama.cpp's `detokenize`).
    pub fn decode_bytes(&self, ids: &[u32]) -> Vec<u8> {
        self.decode_bytes_with(ids, false)
    }

    /// Like [`Tokenizer::decode_bytes`]; with `special`, control and unknown
    /// tokens give their text.
    pub fn decode_bytes_with(&self, ids: &[u32], special: bool) -> Vec<u8> {
        let mut out = Vec::new();
        let mut strip = self.vocab.kind == VocabKind::Spm && self.vocab.add_space_prefix;
        for &id in ids {
            let mut piece = self.token_to_bytes_with(id, special);
            if strip && !piece.is_empty() {
                if let Some(rest) = piece.strip_prefix(b" ") {
                    piece = rest;
                }
                strip = false;
            }
            out.extend_from_slice(piece);
        }
        out
    }

    /// Decodes `ids` to text; invalid UTF-8 becomes U+FFFD.
    pub fn decode(&self, ids: &[u32]) -> String {
        String::from_utf8_lossy(&self.decode_bytes(ids)).into_owned()
    }

    /// A fresh streaming decoder (control tokens render as nothing).
    pub fn stream_decoder(&self) -> StreamDecoder {
        StreamDecoder::new()
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Fragment<'a> {
    Text(&'a str),
    Token(u32),
}

/// llama.cpp's text-based special-token detection (`llama_vocab::load`):
/// fills in EOT / EOM, forces end-of-generation and fill-in-the-middle
/// tokens to control type, and returns the end-of-generation ids (sorted).
/// Where llama.cpp picks one of several matching texts in hash order, the
/// lowest id is taken here.
fn special_fixups(vocab: &mut Vocab, token_to_id: &HashMap<String, u32>) -> Vec<u32> {
    let find = |texts: &[&str]| {
        texts
            .iter()
            .filter_map(|t| token_to_id.get(*t).copied())
            .min()
    };
    let mut force_control = Vec::new();

    if vocab.eot_id.is_none() {
        vocab.eot_id = find(&[
            "<|eot_id|>",
            "<|im_end|>",
            "<|end|>",
            "<end_of_turn>",
            "<|endoftext|>",
            "<|end_of_text|>",
            "<EOT>",
            "_<EOT>",
            "<｜end▁of▁sentence｜>",
            "<end_of_utterance>",
        ]);
        force_control.extend(vocab.eot_id);
    }
    if vocab.eom_id.is_none() {
        vocab.eom_id = find(&["<|eom_id|>"]);
        force_control.extend(vocab.eom_id);
    }
    let fim: [&[&str]; 6] = [
        &[
            "<|fim_prefix|>",
            "<fim-prefix>",
            "<fim_prefix>",
            "<｜fim▁begin｜>",
            "<PRE>",
            "▁<PRE>",
            "<|code_prefix|>",
        ],
        &[
            "<|fim_suffix|>",
            "<fim-suffix>",
            "<fim_suffix>",
            "<｜fim▁hole｜>",
            "<SUF>",
            "▁<SUF>",
            "<|code_suffix|>",
        ],
        &[
            "<|fim_middle|>",
            "<fim-middle>",
            "<fim_middle>",
            "<｜fim▁end｜>",
            "<MID>",
            "▁<MID>",
            "<|code_middle|>",
        ],
        &["<|fim_pad|>", "<fim-pad>", "<fim_pad>", "<PAD>"],
        &[
            "<|fim_repo|>",
            "<|repo_name|>",
            "<fim-repo>",
            "<REPO>",
            "<reponame>",
        ],
        &["<|file_sep|>"],
    ];
    let mut eog = Vec::new();
    for (k, texts) in fim.iter().enumerate() {
        if let Some(id) = find(texts) {
            force_control.push(id);
            // FIM pad, repo and file separator end generation.
            if k >= 3 {
                eog.push(id);
            }
        }
    }
    for text in [
        "<|eot_id|>",
        "<|im_end|>",
        "<|end|>",
        "<|return|>",
        "<|call|>",
        "<end_of_turn>",
        "<|endoftext|>",
        "<|eom_id|>",
        "<EOT>",
        "_<EOT>",
        "<|end_of_text|>",
        "<end_of_utterance>",
    ] {
        if let Some(&id) = token_to_id.get(text) {
            force_control.push(id);
            eog.push(id);
        }
    }
    for id in force_control {
        vocab.token_types[id as usize] = TokenType::Control;
    }
    // gpt-oss: always rendered.
    for text in ["<|channel|>", "<|message|>", "<|start|>", "<|constrain|>"] {
        if let Some(&id) = token_to_id.get(text) {
            vocab.token_types[id as usize] = TokenType::UserDefined;
        }
    }
    eog.extend(
        [vocab.eos_id, vocab.eot_id, vocab.eom_id]
            .into_iter()
            .flatten(),
    );
    eog.sort_unstable();
    eog.dedup();
    // o200k_harmony: "<|end|>" is not an end of generation when "<|return|>"
    // and "<|call|>" are.
    let in_eog = |t: &str| token_to_id.get(t).is_some_and(|id| eog.contains(id));
    if in_eog("<|return|>") && in_eog("<|call|>") {
        if let Some(&end) = token_to_id.get("<|end|>") {
            eog.retain(|&id| id != end);
            vocab.token_types[end as usize] = TokenType::UserDefined;
        }
    }
    eog
}

/// Appends the bytes token `text` of type `ty` decodes to (llama.cpp's
/// `token_to_piece` with `special = true`; hiding control tokens is left to
/// the caller).
fn render_piece(kind: VocabKind, text: &str, ty: TokenType, out: &mut Vec<u8>) {
    match ty {
        TokenType::Control | TokenType::Unknown | TokenType::UserDefined => {
            out.extend_from_slice(text.as_bytes())
        }
        TokenType::Normal => match kind {
            VocabKind::Bpe => {
                let mut buf = [0u8; 4];
                for c in text.chars() {
                    match unicode::char_to_byte(c) {
                        Some(b) => out.push(b),
                        // Not a byte-level symbol: keep it as it is (llama.cpp
                        // writes an "[UNK_BYTE_…]" marker instead).
                        None => out.extend_from_slice(c.encode_utf8(&mut buf).as_bytes()),
                    }
                }
            }
            VocabKind::Spm => {
                let mut buf = [0u8; 4];
                for c in text.chars() {
                    let c = if c == '▁' { ' ' } else { c };
                    out.extend_from_slice(c.encode_utf8(&mut buf).as_bytes());
                }
            }
        },
        TokenType::Byte => {
            if kind == VocabKind::Spm {
                match parse_byte_token(text) {
                    Some(b) => out.push(b),
                    None => out.extend_from_slice(text.as_bytes()),
                }
            }
            // llama.cpp renders byte-type tokens of BPE vocabularies as nothing.
        }
        TokenType::Unused | TokenType::Undefined => {}
    }
}

/// `<0xXX>` → the byte.
fn parse_byte_token(text: &str) -> Option<u8> {
    let hex = text.strip_prefix("<0x")?.strip_suffix('>')?;
    if hex.len() != 2 {
        return None;
    }
    u8::from_str_radix(hex, 16).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A tiny byte-level BPE vocabulary: all 256 byte symbols, a few merges,
    /// a control token and a user-defined one.
    fn tiny_bpe(pre: &str) -> Tokenizer {
        let table = unicode::byte_to_char_table();
        let mut tokens: Vec<String> = vec!["<|endoftext|>".into()];
        tokens.extend(table.iter().map(|c| c.to_string()));
        let merges = [
            "h e", "l l", "he ll", "hell o", "Ġ w", "o r", "Ġw or", "l d", "Ġwor ld",
        ];
        for m in merges {
            tokens.push(m.replace(' ', ""));
        }
        tokens.push("<tag>".into());
        let mut v = Vocab::bpe(
            tokens,
            merges.iter().map(|s| s.to_string()).collect(),
            Some(pre),
        );
        v.token_types = vec![TokenType::Normal; v.tokens.len()];
        v.token_types[0] = TokenType::Control;
        let last = v.tokens.len() - 1;
        v.token_types[last] = TokenType::UserDefined;
        v.bos_id = Some(0);
        v.eos_id = Some(0);
        Tokenizer::new(v).unwrap()
    }

    #[test]
    fn bpe_encode_decode() {
        let t = tiny_bpe("gpt2");
        let hello = t.token_to_id("hello").unwrap();
        let world = t.token_to_id("Ġworld").unwrap();
        assert_eq!(t.encode("hello world", false), [hello, world]);
        assert_eq!(t.decode(&[hello, world]), "hello world");
        // Control text is plain text unless parse_special.
        let plain = t.encode("<|endoftext|>", false);
        assert!(plain.len() > 1);
        assert_eq!(t.decode(&plain), "<|endoftext|>");
        let opts = EncodeOptions {
            add_special: false,
            parse_special: true,
        };
        assert_eq!(t.encode_with("hello<|endoftext|>", opts), [hello, 0]);
        // Control tokens decode to nothing unless asked.
        assert_eq!(t.decode(&[hello, 0]), "hello");
        assert_eq!(t.decode_bytes_with(&[0], true), b"<|endoftext|>");
        // User-defined tokens are always split out.
        let tag = t.token_to_id("<tag>").unwrap();
        assert_eq!(t.encode("hello<tag> world", false), [hello, tag, world]);
        assert_eq!(t.decode(&[tag]), "<tag>");
        // add_special honours add_bos / add_eos (both off here).
        assert_eq!(t.encode("hello", true), [hello]);
        assert!(t.is_eog(0));
    }

    #[test]
    fn bpe_add_bos_eos() {
        let t = tiny_bpe("gpt2");
        let mut v = t.vocab().clone();
        v.add_bos = true;
        v.add_eos = true;
        let t = Tokenizer::new(v).unwrap();
        let hello = t.token_to_id("hello").unwrap();
        assert_eq!(t.encode("hello", true), [0, hello, 0]);
        assert_eq!(t.encode("", true), [0, 0]);
        assert_eq!(t.encode("", false), Vec::<u32>::new());
    }

    #[test]
    fn bpe_bytes_and_out_of_range() {
        let t = tiny_bpe("gpt2");
        let ids = t.encode("é\n", false);
        assert_eq!(ids.len(), 3); // two UTF-8 bytes of é, one newline
        assert_eq!(t.decode(&ids), "é\n");
        assert_eq!(t.decode(&ids[..1]), "\u{FFFD}");
        assert_eq!(t.token_to_bytes(1_000_000), b"");
    }

    #[test]
    fn spm_encode_decode() {
        let mut tokens: Vec<String> = vec!["<unk>".into(), "<s>".into(), "</s>".into()];
        tokens.extend((0..=255u8).map(|b| format!("<0x{b:02X}>")));
        for t in ["▁", "h", "i", "▁h", "▁hi", "hi"] {
            tokens.push(t.into());
        }
        let n = tokens.len();
        let mut scores = vec![0.0; n];
        scores[n - 3] = -5.0; // ▁h
        scores[n - 2] = -1.0; // ▁hi
        scores[n - 1] = -2.0; // hi
        let mut v = Vocab::spm(tokens, scores);
        v.token_types = vec![TokenType::Normal; n];
        v.token_types[0] = TokenType::Unknown;
        v.token_types[1] = TokenType::Control;
        v.token_types[2] = TokenType::Control;
        for ty in &mut v.token_types[3..259] {
            *ty = TokenType::Byte;
        }
        let t = Tokenizer::new(v).unwrap();
        let id = |s: &str| t.token_to_id(s).unwrap();
        // "▁" "h" "i": "hi" (-2) beats "▁h" (-5), then "▁" + "hi" = "▁hi".
        assert_eq!(t.encode("hi", false), [id("▁hi")]);
        assert_eq!(t.encode("hi", true), [1, id("▁hi")]);
        assert_eq!(t.encode("hi hi", false), [id("▁hi"), id("▁hi")]);
        // Byte fallback for unknown characters, decoded back.
        let ids = t.encode("hé", false);
        assert_eq!(ids, [id("▁h"), 3 + 0xC3, 3 + 0xA9]);
        assert_eq!(t.decode(&ids), "hé");
        // Leading space removed once; BOS renders as nothing.
        assert_eq!(t.decode(&[1, id("▁hi"), id("▁hi")]), "hi hi");
        // With parse_special, "<s>" is BOS and the next text gets a space prefix.
        let opts = EncodeOptions {
            add_special: false,
            parse_special: true,
        };
        assert_eq!(t.encode_with("hi<s>hi", opts), [id("▁hi"), 1, id("▁hi")]);
    }

    #[test]
    fn special_fixups_like_llama_cpp() {
        let t = tiny_bpe("gpt2");
        let mut v = t.vocab().clone();
        // A user-defined "<|im_end|>" becomes a control, end-of-generation
        // token; EOT is the lowest id with an end-of-turn text
        // ("<|endoftext|>"); an empty text gets a placeholder.
        v.scores.clear();
        v.tokens.push("<|im_end|>".into());
        v.token_types.push(TokenType::UserDefined);
        v.tokens.push(String::new());
        v.token_types.push(TokenType::Normal);
        let n = v.tokens.len() as u32;
        let t = Tokenizer::new(v).unwrap();
        let im_end = n - 2;
        assert_eq!(t.vocab().token_type(im_end), TokenType::Control);
        assert_eq!(t.vocab().eot_id, Some(0));
        assert!(t.is_eog(im_end) && t.is_eog(0));
        assert_eq!(t.eog_ids(), [0, im_end]);
        assert!(!t.encode("a<|im_end|>", false).contains(&im_end));
        assert_eq!(
            t.token_text(n - 1),
            Some(format!("[EMPTY_{}]", n - 1).as_str())
        );
    }

    #[test]
    fn byte_token_parse() {
        assert_eq!(parse_byte_token("<0x0A>"), Some(10));
        assert_eq!(parse_byte_token("<0xff>"), Some(255));
        assert_eq!(parse_byte_token("<0x1>"), None);
        assert_eq!(parse_byte_token("0x10"), None);
    }
}
