//! Incremental decoding: token ids in, complete UTF-8 text out.

use super::Tokenizer;

/// Turns a stream of token ids into text, one token at a time, emitting only
/// complete UTF-8: a character whose bytes are split across byte-level
/// tokens (emoji, CJK, `<0xXX>` fallback) is held back until its last byte
/// arrives. Bytes that can never become valid UTF-8 come out as U+FFFD.
///
/// Unlike [`Tokenizer::decode`], no leading space is stripped: the stream is
/// meant for generated continuations.
///
/// ```ignore
/// let mut dec = StreamDecoder::new();
/// for id in generated {
///     print!("{}", dec.push(&tokenizer, id));
/// }
/// print!("{}", dec.flush());
/// ```
#[derive(Clone, Debug, Default)]
pub struct StreamDecoder {
    pending: Vec<u8>,
    special: bool,
}

impl StreamDecoder {
    /// A decoder that renders control tokens as nothing.
    pub fn new() -> Self {
        Self::default()
    }

    /// A decoder that renders control and unknown tokens as their text when
    /// `special` is true.
    pub fn with_special(special: bool) -> Self {
        StreamDecoder {
            pending: Vec::new(),
            special,
        }
    }

    /// Feeds one token; returns the text completed by it (often empty while
    /// a multi-byte character is incomplete).
    pub fn push(&mut self, tokenizer: &Tokenizer, id: u32) -> String {
        self.push_bytes(tokenizer.token_to_bytes_with(id, self.special))
    }

    /// Feeds raw bytes; returns the text they complete.
    pub fn push_bytes(&mut self, bytes: &[u8]) -> String {
        self.pending.extend_from_slice(bytes);
        let mut out = String::new();
        let mut start = 0;
        loop {
            match std::str::from_utf8(&self.pending[start..]) {
                Ok(s) => {
                    out.push_str(s);
                    start = self.pending.len();
                    break;
                }
                Err(e) => {
                    let valid = e.valid_up_to();
                    // The prefix was just validated.
                    out.push_str(&String::from_utf8_lossy(
                        &self.pending[start..start + valid],
                    ));
                    start += valid;
                    match e.error_len() {
                        // Incomplete sequence at the end: wait for more.
                        None => break,
                        Some(n) => {
                            out.push(char::REPLACEMENT_CHARACTER);
                            start += n;
                        }
                    }
                }
            }
        }
        self.pending.drain(..start);
        out
    }

    /// Bytes held back, waiting for the rest of a character.
    pub fn pending(&self) -> &[u8] {
        &self.pending
    }

    /// Ends the stream: whatever is held back comes out (as U+FFFD).
    pub fn flush(&mut self) -> String {
        let s = String::from_utf8_lossy(&self.pending).into_owned();
        self.pending.clear();
        s
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn holds_back_partial_characters() {
        let mut d = StreamDecoder::new();
        let bytes = "a🦙b我".as_bytes();
        let mut out = String::new();
        let mut emitted = Vec::new();
        for &b in bytes {
            let s = d.push_bytes(&[b]);
            emitted.push(s.clone());
            out.push_str(&s);
        }
        assert_eq!(out, "a🦙b我");
        assert_eq!(emitted[1..4], ["", "", ""]);
        assert_eq!(emitted[4], "🦙");
        assert!(d.pending().is_empty());
        assert_eq!(d.flush(), "");
    }

    #[test]
    fn invalid_bytes_become_replacement() {
        let mut d = StreamDecoder::new();
        assert_eq!(d.push_bytes(b"x\xFFy"), "x\u{FFFD}y");
        // A lead byte followed by a non-continuation byte.
        assert_eq!(d.push_bytes(b"\xE6"), "");
        assert_eq!(d.push_bytes(b"z"), "\u{FFFD}z");
        assert_eq!(d.push_bytes(b"\xF0\x9F"), "");
        assert_eq!(d.flush(), "\u{FFFD}");
    }
}
