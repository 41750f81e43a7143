//! Unicode helpers: the code point classes the pre-tokenizer regexes use
//! (`\p{L}`, `\p{M}`, `\p{N}`, `\p{P}`, `\s`) and GPT-2's byte ↔ unicode mapping.
//!
//! `char::is_alphabetic` is the Alphabetic *property*, which also covers
//! combining marks (e.g. Khmer vowel signs) and letter numbers, so it is not
//! `\p{L}`; the general categories come from a generated range table
//! (`unicode_tables.rs`). To regenerate it, run this Python script (any
//! version; its `unicodedata` sets the Unicode version) and `cargo fmt`:
//!
//! ```text
//! import unicodedata, sys
//! cls = lambda c: {'L': 'L', 'N': 'N', 'P': 'P', 'M': 'M'}.get(unicodedata.category(chr(c))[0])
//! ranges, cur = [], None
//! for cp in range(0x110000):
//!     k = cls(cp)
//!     if cur and cur[2] == k and cur[1] == cp - 1: cur[1] = cp
//!     else:
//!         if cur and cur[2]: ranges.append(cur)
//!         cur = [cp, cp, k]
//! if cur and cur[2]: ranges.append(cur)
//! # header as in unicode_tables.rs, then one "(0x{a:X}, 0x{b:X}, {k})," per range
//! ```
//!
//! White space is the Unicode `White_Space` property, which is exactly what
//! `char::is_whitespace` tests (and what llama.cpp's flag table uses).

use super::unicode_tables::CLASS_RANGES;

/// General-category class of a code point, as far as the pre-tokenizers care.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum CharClass {
    Letter,
    /// Combining marks (`\p{M}`: Mn, Mc, Me).
    Mark,
    Number,
    Punctuation,
}

/// Bit flags of one code point (see [`flags`]).
pub(crate) const LETTER: u8 = 1;
pub(crate) const NUMBER: u8 = 2;
pub(crate) const WHITESPACE: u8 = 4;
pub(crate) const PUNCTUATION: u8 = 8;
/// Set for every real code point; a position outside the segment has flags 0.
pub(crate) const VALID: u8 = 16;
/// A combining mark (`\p{M}`); only the Qwen3.5 regex tells marks apart.
pub(crate) const MARK: u8 = 32;

fn class_of(c: char) -> Option<CharClass> {
    let cp = c as u32;
    let idx = CLASS_RANGES.partition_point(|r| r.0 <= cp);
    if idx == 0 {
        return None;
    }
    let (_, end, class) = CLASS_RANGES[idx - 1];
    (cp <= end).then_some(class)
}

const fn ascii_flags_table() -> [u8; 128] {
    let mut t = [VALID; 128];
    let mut i = 0;
    while i < 128 {
        let c = i as u8;
        t[i] |= if c.is_ascii_alphabetic() {
            LETTER
        } else if c.is_ascii_digit() {
            NUMBER
        } else if matches!(c, b'\t' | b'\n' | 0x0B | 0x0C | b'\r' | b' ') {
            WHITESPACE
        } else if matches!(
            c,
            b'!' | b'"'
                | b'#'
                | b'%'
                | b'&'
                | b'\''
                | b'('
                | b')'
                | b'*'
                | b','
                | b'-'
                | b'.'
                | b'/'
                | b':'
                | b';'
                | b'?'
                | b'@'
                | b'['
                | b'\\'
                | b']'
                | b'_'
                | b'{'
                | b'}'
        ) {
            PUNCTUATION
        } else {
            0
        };
        i += 1;
    }
    t
}

static ASCII_FLAGS: [u8; 128] = ascii_flags_table();

/// Flags of a code point: `LETTER`/`MARK`/`NUMBER`/`PUNCTUATION` from the general
/// category, `WHITESPACE` from the White_Space property, always `VALID`.
#[inline]
pub(crate) fn flags(c: char) -> u8 {
    let cp = c as u32;
    if cp < 128 {
        return ASCII_FLAGS[cp as usize];
    }
    let mut f = VALID;
    if c.is_whitespace() {
        f |= WHITESPACE;
    }
    match class_of(c) {
        Some(CharClass::Letter) => f | LETTER,
        Some(CharClass::Mark) => f | MARK,
        Some(CharClass::Number) => f | NUMBER,
        Some(CharClass::Punctuation) => f | PUNCTUATION,
        None => f,
    }
}

/// Whether GPT-2's byte map keeps byte `b` as the code point of the same
/// value (printable Latin-1).
const fn keeps_byte(b: u32) -> bool {
    (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF)
}

/// The 68 bytes GPT-2 moves to U+0100.., in increasing order.
const MOVED_BYTES: [u8; 68] = {
    let mut t = [0u8; 68];
    let (mut b, mut n) = (0u32, 0usize);
    while b < 256 {
        if !keeps_byte(b) {
            t[n] = b as u8;
            n += 1;
        }
        b += 1;
    }
    t
};

/// GPT-2's `bytes_to_unicode`: every byte maps to a printable code point.
/// Printable Latin-1 bytes map to themselves, the others to U+0100 onwards.
pub(crate) fn byte_to_char_table() -> [char; 256] {
    let mut table = ['\0'; 256];
    for b in 0..256u32 {
        table[b as usize] = char::from_u32(b).unwrap_or('\0');
    }
    for (k, &b) in MOVED_BYTES.iter().enumerate() {
        // At most U+0143: a valid scalar value.
        table[b as usize] = char::from_u32(0x100 + k as u32).unwrap_or('\0');
    }
    table
}

/// Inverse of [`byte_to_char_table`], for decoding: the byte a code point
/// stands for, or `None` if it is not one of the 256 mapped code points.
#[inline]
pub(crate) fn char_to_byte(c: char) -> Option<u8> {
    let cp = c as u32;
    if cp < 0x100 {
        keeps_byte(cp).then_some(cp as u8)
    } else {
        MOVED_BYTES.get((cp - 0x100) as usize).copied()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn byte_map_is_a_bijection() {
        let t = byte_to_char_table();
        let mut seen = std::collections::HashSet::new();
        for (b, &c) in t.iter().enumerate() {
            assert!(seen.insert(c));
            assert_eq!(char_to_byte(c), Some(b as u8));
        }
        assert_eq!(t[b' ' as usize], 'Ġ');
        assert_eq!(t[b'\n' as usize], 'Ċ');
        assert_eq!(t[b'a' as usize], 'a');
        assert_eq!(char_to_byte('\u{144}'), None);
        assert_eq!(char_to_byte(' '), None);
    }

    #[test]
    fn categories() {
        assert_eq!(flags('a'), VALID | LETTER);
        assert_eq!(flags('7'), VALID | NUMBER);
        assert_eq!(flags(' '), VALID | WHITESPACE);
        assert_eq!(flags('$'), VALID);
        assert_eq!(flags('!'), VALID | PUNCTUATION);
        assert_eq!(flags('ж'), VALID | LETTER);
        assert_eq!(flags('我'), VALID | LETTER);
        assert_eq!(flags('½'), VALID | NUMBER);
        assert_eq!(flags('\u{3000}'), VALID | WHITESPACE);
        assert_eq!(flags('\u{85}'), VALID | WHITESPACE);
        assert_eq!(flags('\u{A0}'), VALID | WHITESPACE);
        // Khmer vowel sign AA (Mc) is Alphabetic but not a letter: a mark.
        assert!('\u{17B6}'.is_alphabetic());
        assert_eq!(flags('\u{17B6}'), VALID | MARK);
        // combining acute accent (Mn)
        assert_eq!(flags('\u{301}'), VALID | MARK);
        // Emoji, ZWJ: none of the classes; a variation selector is a mark.
        assert_eq!(flags('🦙'), VALID);
        assert_eq!(flags('\u{200D}'), VALID);
        assert_eq!(flags('\u{FE0F}'), VALID | MARK);
        assert_eq!(flags('～'), VALID); // U+FF5E is Sm
        assert_eq!(flags('。'), VALID | PUNCTUATION);
        // ASCII table agrees with the range table.
        for b in 0u8..128 {
            let c = b as char;
            let mut f = VALID;
            if c.is_whitespace() {
                f |= WHITESPACE;
            }
            f |= match class_of(c) {
                Some(CharClass::Letter) => LETTER,
                Some(CharClass::Mark) => MARK,
                Some(CharClass::Number) => NUMBER,
                Some(CharClass::Punctuation) => PUNCTUATION,
                None => 0,
            };
            assert_eq!(flags(c), f, "{b:#x}");
        }
    }
}
