//! Pre-tokenizers of byte-level BPE vocabularies: the regex splits that
//! llama.cpp selects by `tokenizer.ggml.pre`, implemented as hand-written
//! scanners over code points that reproduce llama.cpp's `unicode.cpp`
//! (including its custom GPT-2 and LLaMA-3 splitters) exactly.
//!
//! A pre-tokenizer is a pipeline of stages. Every stage splits each segment
//! the previous stage produced; segments never merge again.

use super::unicode::{flags, LETTER, MARK, NUMBER, PUNCTUATION, VALID, WHITESPACE};
use super::TokenizerError;

/// One splitting stage (one regex of llama.cpp's `regex_exprs`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Stage {
    /// `'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+`
    Gpt2,
    /// `(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+`
    /// with N = the digit group size (3 for LLaMA-3, 1 for Qwen2). With
    /// `marks` (Qwen3.5) letter runs also take combining marks:
    /// `[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+` and ` ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*`.
    Llama3 { digits: usize, marks: bool },
    /// The case-aware regexes of Tekken and GPT-4o, as llama.cpp adapts
    /// them (an "upper" letter is any letter but `a-z`, a "lower" one any
    /// letter but `A-Z`):
    /// `[^\r\n\p{L}\p{N}]?U*L+C?|[^\r\n\p{L}\p{N}]?U+L*C?|\p{N}{1,N}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+`
    /// where `C` is the contraction group (GPT-4o only).
    Cased { contractions: bool, digits: usize },
    /// `[\p{P}\$\+<=>\^~\|]+`, plus `` ` `` when the flag is set.
    PunctRun { backtick: bool },
    /// `\p{N}+`
    NumberRun,
    /// `\p{N}` — one number code point.
    NumberChar,
    /// `[0-9][0-9][0-9]`
    ThreeAsciiDigits,
}

/// The pre-tokenizers llama.cpp knows (its `LLAMA_VOCAB_PRE_TYPE_*`), as
/// far as coil implements them, by `tokenizer.ggml.pre`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum PreTokenizer {
    /// llama.cpp's "default" (also used when the key is missing):
    /// punctuation runs split off, then GPT-2, number runs, digit triples.
    Default,
    /// The GPT-2 regex: gpt-2, mpt, olmo (GPT-NeoX, the Mamba families),
    /// jais, trillion, phi-2, granite-docling, exaone4, ...
    Gpt2,
    /// The LLaMA-3 regex (llama3, llama-bpe, falcon3, falcon-h1, pixtral,
    /// ...). Whole pre-tokens that are tokens bypass the merges, and BOS is
    /// added by default.
    Llama3,
    /// The LLaMA-3 regex with plain merges (dbrx, smaug-bpe, glm4).
    Dbrx,
    /// The LLaMA-3 regex with single digits (qwen2, stablelm2, hunyuan,
    /// grok-2, megrez, ...).
    Qwen2,
    /// The Qwen2 regex whose letter runs also take combining marks
    /// (`\p{M}`): Qwen3.5 / Qwen3.6 (qwen35).
    Qwen35,
    /// Single digits split off, then GPT-2 (refact, starcoder, command-r,
    /// smollm, codeshell, exaone, minerva-7b).
    Refact,
    /// Punctuation runs, GPT-2, digit triples (falcon).
    Falcon,
    /// Mistral's Tekken regex (tekken): case-aware words, single digits.
    /// Whole pre-tokens that are tokens bypass the merges; BOS by default.
    Tekken,
    /// The GPT-4o regex (gpt-4o, llama4, minimax-m2): case-aware words with
    /// contractions, digit triples.
    Gpt4o,
}

impl PreTokenizer {
    /// The pre-tokenizer llama.cpp uses for a `tokenizer.ggml.pre` value.
    /// `None` (key missing) gives [`PreTokenizer::Default`], like llama.cpp.
    /// A name coil does not implement is an error (llama.cpp would warn and
    /// fall back to "default"; set [`Vocab::pre`](super::Vocab::pre) to
    /// `"default"` to do the same).
    pub fn from_name(name: Option<&str>) -> Result<Self, TokenizerError> {
        let Some(name) = name else {
            return Ok(PreTokenizer::Default);
        };
        Ok(match name {
            "default" => PreTokenizer::Default,
            // "gpt2" and "gpt-neox" are not llama.cpp names; accepted as
            // the obvious aliases.
            "gpt-2" | "gpt2" | "gpt-neox" | "mpt" | "olmo" | "jais" | "trillion" | "phi-2"
            | "jina-es" | "jina-de" | "jina-v1-en" | "jina-v2-es" | "jina-v2-de"
            | "jina-v2-code" | "roberta-bpe" | "gigachat" | "mellum" | "a.x-4.0"
            | "granite-docling" | "exaone4" => PreTokenizer::Gpt2,
            "llama3" | "llama-v3" | "llama-bpe" | "falcon3" | "falcon-h1" | "pixtral"
            | "midm-2.0" | "lfm2" | "jina-v5-nano" => PreTokenizer::Llama3,
            "dbrx" | "smaug-bpe" | "glm4" | "chatglm-bpe" => PreTokenizer::Dbrx,
            "qwen2" | "deepseek-r1-qwen" | "kormo" | "megrez" | "stablelm2" | "hunyuan"
            | "grok-2" => PreTokenizer::Qwen2,
            "qwen35" => PreTokenizer::Qwen35,
            "refact" | "starcoder" | "command-r" | "smollm" | "codeshell" | "exaone"
            | "minerva-7b" => PreTokenizer::Refact,
            "falcon" => PreTokenizer::Falcon,
            "tekken" => PreTokenizer::Tekken,
            "gpt-4o" | "llama4" | "minimax-m2" => PreTokenizer::Gpt4o,
            other => return Err(TokenizerError::UnknownPreTokenizer(other.to_string())),
        })
    }

    /// Whether whole pre-tokens found in the vocabulary skip the BPE merges
    /// (llama.cpp's `ignore_merges`).
    pub fn ignore_merges(self) -> bool {
        matches!(self, PreTokenizer::Llama3 | PreTokenizer::Tekken)
    }

    /// Whether llama.cpp defaults `add_bos` to true for this family (when
    /// `tokenizer.ggml.add_bos_token` is absent).
    pub fn default_add_bos(self) -> bool {
        matches!(self, PreTokenizer::Llama3 | PreTokenizer::Tekken)
    }

    fn stages(self) -> &'static [Stage] {
        match self {
            PreTokenizer::Default => &[
                Stage::PunctRun { backtick: false },
                Stage::Gpt2,
                Stage::NumberRun,
                Stage::ThreeAsciiDigits,
            ],
            PreTokenizer::Gpt2 => &[Stage::Gpt2],
            PreTokenizer::Llama3 | PreTokenizer::Dbrx => &[Stage::Llama3 {
                digits: 3,
                marks: false,
            }],
            PreTokenizer::Qwen2 => &[Stage::Llama3 {
                digits: 1,
                marks: false,
            }],
            PreTokenizer::Qwen35 => &[Stage::Llama3 {
                digits: 1,
                marks: true,
            }],
            PreTokenizer::Refact => &[Stage::NumberChar, Stage::Gpt2],
            PreTokenizer::Falcon => &[
                Stage::PunctRun { backtick: true },
                Stage::Gpt2,
                Stage::ThreeAsciiDigits,
            ],
            PreTokenizer::Tekken => &[Stage::Cased {
                contractions: false,
                digits: 1,
            }],
            PreTokenizer::Gpt4o => &[Stage::Cased {
                contractions: true,
                digits: 3,
            }],
        }
    }

    /// Splits `text` into pre-tokens, appended to `out` as sub-slices.
    pub fn split<'a>(self, text: &'a str, out: &mut Vec<&'a str>) {
        let mut scratch = Scratch::default();
        self.split_with(text, out, &mut scratch);
    }

    pub(crate) fn split_with<'a>(self, text: &'a str, out: &mut Vec<&'a str>, s: &mut Scratch) {
        if text.is_empty() {
            return;
        }
        s.cpts.clear();
        s.flags.clear();
        s.byte_offsets.clear();
        for (off, c) in text.char_indices() {
            s.cpts.push(c);
            s.flags.push(flags(c));
            s.byte_offsets.push(off);
        }
        s.byte_offsets.push(text.len());
        s.segs.clear();
        s.segs.push((0, s.cpts.len()));
        for &stage in self.stages() {
            s.next.clear();
            for &(ini, end) in &s.segs {
                let seg = Seg {
                    cpts: &s.cpts,
                    flags: &s.flags,
                    ini,
                    end,
                };
                let mut sink = Sink {
                    out: &mut s.next,
                    prev: ini,
                };
                match stage {
                    Stage::Gpt2 => split_gpt2(&seg, &mut sink),
                    Stage::Llama3 { digits, marks } => split_llama3(&seg, &mut sink, digits, marks),
                    Stage::Cased {
                        contractions,
                        digits,
                    } => split_cased(&seg, &mut sink, contractions, digits),
                    Stage::PunctRun { backtick } => split_matches(&seg, &mut sink, |seg, pos| {
                        let punct = |p: usize| {
                            seg.cpt(p).is_some_and(|c| {
                                seg.flags[p] & PUNCTUATION != 0
                                    || matches!(c, '$' | '+' | '<' | '=' | '>' | '^' | '~' | '|')
                                    || (backtick && c == '`')
                            })
                        };
                        let mut p = pos;
                        while punct(p) {
                            p += 1;
                        }
                        p - pos
                    }),
                    Stage::NumberRun => split_matches(&seg, &mut sink, |seg, pos| {
                        let mut p = pos;
                        while seg.flag(p) & NUMBER != 0 {
                            p += 1;
                        }
                        p - pos
                    }),
                    Stage::NumberChar => split_matches(&seg, &mut sink, |seg, pos| {
                        usize::from(seg.flags[pos] & NUMBER != 0)
                    }),
                    Stage::ThreeAsciiDigits => split_matches(&seg, &mut sink, |seg, pos| {
                        let digit = |p: usize| seg.cpt(p).is_some_and(|c| c.is_ascii_digit());
                        if digit(pos) && digit(pos + 1) && digit(pos + 2) {
                            3
                        } else {
                            0
                        }
                    }),
                }
                sink.finish(end);
            }
            std::mem::swap(&mut s.segs, &mut s.next);
        }
        for &(ini, end) in &s.segs {
            out.push(&text[s.byte_offsets[ini]..s.byte_offsets[end]]);
        }
    }
}

/// Reusable buffers of [`PreTokenizer::split_with`].
#[derive(Default)]
pub(crate) struct Scratch {
    cpts: Vec<char>,
    flags: Vec<u8>,
    byte_offsets: Vec<usize>,
    segs: Vec<(usize, usize)>,
    next: Vec<(usize, usize)>,
}

/// One segment `[ini, end)` of the code point array.
struct Seg<'a> {
    cpts: &'a [char],
    flags: &'a [u8],
    ini: usize,
    end: usize,
}

impl Seg<'_> {
    /// The code point at `pos`, `None` outside the segment.
    #[inline]
    fn cpt(&self, pos: usize) -> Option<char> {
        (self.ini <= pos && pos < self.end).then(|| self.cpts[pos])
    }

    /// The flags at `pos`, 0 outside the segment.
    #[inline]
    fn flag(&self, pos: usize) -> u8 {
        if self.ini <= pos && pos < self.end {
            self.flags[pos]
        } else {
            0
        }
    }
}

/// Collects the pieces of one segment (llama.cpp's `_add_token`).
struct Sink<'a> {
    out: &'a mut Vec<(usize, usize)>,
    prev: usize,
}

impl Sink<'_> {
    #[inline]
    fn add(&mut self, end: usize) {
        if end > self.prev {
            self.out.push((self.prev, end));
        }
        self.prev = end;
    }

    /// Anything left unclaimed at the end becomes its own piece (cannot
    /// happen for the scanners, which consume everything).
    fn finish(&mut self, end: usize) {
        self.add(end);
    }
}

/// A regex stage without custom scanner: non-overlapping leftmost matches and
/// the gaps between them both become pieces (llama.cpp's
/// `unicode_regex_split_stl`). `match_len(seg, pos)` is the length of the
/// match starting at `pos`, 0 for none.
fn split_matches(seg: &Seg<'_>, sink: &mut Sink<'_>, match_len: impl Fn(&Seg<'_>, usize) -> usize) {
    let mut pos = seg.ini;
    while pos < seg.end {
        let n = match_len(seg, pos);
        if n == 0 {
            pos += 1;
            continue;
        }
        sink.add(pos); // the gap before the match
        pos += n;
        sink.add(pos);
    }
}

/// llama.cpp's `unicode_regex_split_custom_gpt2`.
fn split_gpt2(seg: &Seg<'_>, sink: &mut Sink<'_>) {
    let mut pos = seg.ini;
    while pos < seg.end {
        let cpt = seg.cpts[pos];
        let fl = seg.flags[pos];

        // 's|'t|'re|'ve|'m|'ll|'d
        if cpt == '\'' && pos + 1 < seg.end {
            let next = seg.cpts[pos + 1];
            if matches!(next, 's' | 't' | 'm' | 'd') {
                pos += 2;
                sink.add(pos);
                continue;
            }
            if pos + 2 < seg.end {
                let next2 = seg.cpts[pos + 2];
                if matches!((next, next2), ('r', 'e') | ('v', 'e') | ('l', 'l')) {
                    pos += 3;
                    sink.add(pos);
                    continue;
                }
            }
        }

        let space = usize::from(cpt == ' ');
        let mut fl2 = if cpt == ' ' { seg.flag(pos + 1) } else { fl };
        // ' ?\p{L}+'
        if fl2 & LETTER != 0 {
            pos += space;
            while seg.flag(pos) & LETTER != 0 {
                pos += 1;
            }
            sink.add(pos);
            continue;
        }
        // ' ?\p{N}+'
        if fl2 & NUMBER != 0 {
            pos += space;
            while seg.flag(pos) & NUMBER != 0 {
                pos += 1;
            }
            sink.add(pos);
            continue;
        }
        // ' ?[^\s\p{L}\p{N}]+'
        if fl2 & (WHITESPACE | LETTER | NUMBER) == 0 && fl2 & VALID != 0 {
            pos += space;
            while fl2 & (WHITESPACE | LETTER | NUMBER) == 0 && fl2 & VALID != 0 {
                pos += 1;
                fl2 = seg.flag(pos);
            }
            sink.add(pos);
            continue;
        }

        let mut num_ws = 0;
        while seg.flag(pos + num_ws) & WHITESPACE != 0 {
            num_ws += 1;
        }
        // '\s+(?!\S)'
        if num_ws > 1 && pos + num_ws < seg.end {
            pos += num_ws - 1;
            sink.add(pos);
            continue;
        }
        // '\s+'
        if num_ws > 0 {
            pos += num_ws;
            sink.add(pos);
            continue;
        }
        // no match
        pos += 1;
        sink.add(pos);
    }
}

/// llama.cpp's `unicode_regex_split_custom_llama3`, with the digit group
/// size as a parameter (3; 1 gives the Qwen2 regex, which llama.cpp runs
/// through `std::regex` with the same result); `marks` counts combining
/// marks as letters in the word and symbol runs (Qwen3.5's regex, llama.cpp's
/// `unicode_regex_split_custom_qwen35`).
fn split_llama3(seg: &Seg<'_>, sink: &mut Sink<'_>, digits: usize, marks: bool) {
    // What a letter run takes (and a symbol run stops at).
    let word = if marks { LETTER | MARK } else { LETTER };
    let is_rn = |c: Option<char>| matches!(c, Some('\r' | '\n'));
    let lower = |c: char| c.to_ascii_lowercase();
    let mut pos = seg.ini;
    while pos < seg.end {
        let cpt = seg.cpts[pos];
        let fl = seg.flags[pos];

        // (?i:'s|'t|'re|'ve|'m|'ll|'d)
        if cpt == '\'' && pos + 1 < seg.end {
            let next = lower(seg.cpts[pos + 1]);
            if matches!(next, 's' | 't' | 'm' | 'd') {
                pos += 2;
                sink.add(pos);
                continue;
            }
            if pos + 2 < seg.end {
                let next2 = lower(seg.cpts[pos + 2]);
                if matches!((next, next2), ('r', 'e') | ('v', 'e') | ('l', 'l')) {
                    pos += 3;
                    sink.add(pos);
                    continue;
                }
            }
        }

        // [^\r\n\p{L}\p{N}]?\p{L}+  (or [\p{L}\p{M}]+)
        if !(cpt == '\r' || cpt == '\n' || fl & NUMBER != 0)
            && (fl & word != 0 || seg.flag(pos + 1) & word != 0)
        {
            pos += 1;
            while seg.flag(pos) & word != 0 {
                pos += 1;
            }
            sink.add(pos);
            continue;
        }

        // \p{N}{1,3}
        if fl & NUMBER != 0 {
            let mut ini = pos;
            while seg.flag(pos) & NUMBER != 0 {
                pos += 1;
                if pos - ini >= digits {
                    sink.add(pos);
                    ini = pos;
                }
            }
            sink.add(pos);
            continue;
        }

        // ' ?[^\s\p{L}\p{N}]+[\r\n]*'  (or [^\s\p{L}\p{M}\p{N}])
        let mut fl2 = if cpt == ' ' { seg.flag(pos + 1) } else { fl };
        if fl2 & (WHITESPACE | word | NUMBER) == 0 && fl & VALID != 0 {
            pos += usize::from(cpt == ' ');
            while fl2 & (WHITESPACE | word | NUMBER) == 0 && fl2 & VALID != 0 {
                pos += 1;
                fl2 = seg.flag(pos);
            }
            while is_rn(seg.cpt(pos)) {
                pos += 1;
            }
            sink.add(pos);
            continue;
        }

        let mut num_ws = 0;
        let mut last_end_rn = 0;
        while seg.flag(pos + num_ws) & WHITESPACE != 0 {
            if is_rn(seg.cpt(pos + num_ws)) {
                last_end_rn = pos + num_ws + 1;
            }
            num_ws += 1;
        }
        // \s*[\r\n]+
        if last_end_rn > 0 {
            pos = last_end_rn;
            sink.add(pos);
            continue;
        }
        // \s+(?!\S)
        if num_ws > 1 && pos + num_ws < seg.end {
            pos += num_ws - 1;
            sink.add(pos);
            continue;
        }
        // \s+
        if num_ws > 0 {
            pos += num_ws;
            sink.add(pos);
            continue;
        }
        // no match
        pos += 1;
        sink.add(pos);
    }
}

/// The Tekken / GPT-4o regexes (see [`Stage::Cased`]), matched with the
/// backtracking semantics of llama.cpp's `std::regex` run.
fn split_cased(seg: &Seg<'_>, sink: &mut Sink<'_>, contractions: bool, digits: usize) {
    let is_letter = |p: usize| seg.flag(p) & LETTER != 0;
    let is_upper = |p: usize| is_letter(p) && !seg.cpt(p).is_some_and(|c| c.is_ascii_lowercase());
    let is_lower = |p: usize| is_letter(p) && !seg.cpt(p).is_some_and(|c| c.is_ascii_uppercase());
    let is_other = |p: usize| {
        let f = seg.flag(p);
        f & VALID != 0 && f & (WHITESPACE | LETTER | NUMBER) == 0
    };
    let is_rn = |p: usize| matches!(seg.cpt(p), Some('\r' | '\n'));
    let lower = |p: usize| seg.cpt(p).map(|c| c.to_ascii_lowercase());
    // (?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])?
    let contraction = |p: usize| -> usize {
        if !contractions || seg.cpt(p) != Some('\'') {
            return 0;
        }
        match (lower(p + 1), lower(p + 2)) {
            (Some('s' | 't' | 'm' | 'd'), _) => 2,
            (Some('r' | 'v'), Some('e')) | (Some('l'), Some('l')) => 3,
            _ => 0,
        }
    };

    let mut pos = seg.ini;
    while pos < seg.end {
        // [^\r\n\p{L}\p{N}]? — taking it is tried first; leaving it out can
        // only help when the character is a letter, which it then is not.
        let flags = seg.flags[pos];
        let q = if !is_rn(pos) && flags & (LETTER | NUMBER) == 0 {
            pos + 1
        } else {
            pos
        };
        let mut u = q;
        while is_upper(u) {
            u += 1;
        }
        // U*L+ : the greedy U* gives back letters until one starts an L run.
        if let Some(k) = (q..=u).rev().find(|&k| is_lower(k)) {
            let mut e = k;
            while is_lower(e) {
                e += 1;
            }
            e += contraction(e);
            sink.add(e);
            pos = e;
            continue;
        }
        // U+L*
        if u > q {
            let mut e = u;
            while is_lower(e) {
                e += 1;
            }
            e += contraction(e);
            sink.add(e);
            pos = e;
            continue;
        }
        // \p{N}{1,N}
        if flags & NUMBER != 0 {
            let mut e = pos;
            while e - pos < digits && seg.flag(e) & NUMBER != 0 {
                e += 1;
            }
            sink.add(e);
            pos = e;
            continue;
        }
        // ' ?[^\s\p{L}\p{N}]+[\r\n/]*'
        let p2 = if seg.cpts[pos] == ' ' { pos + 1 } else { pos };
        if is_other(p2) {
            let mut e = p2;
            while is_other(e) {
                e += 1;
            }
            while matches!(seg.cpt(e), Some('\r' | '\n' | '/')) {
                e += 1;
            }
            sink.add(e);
            pos = e;
            continue;
        }
        // \s*[\r\n]+ , \s+(?!\S) , \s+
        let mut w = pos;
        let mut last_rn = None;
        while seg.flag(w) & WHITESPACE != 0 {
            if is_rn(w) {
                last_rn = Some(w + 1);
            }
            w += 1;
        }
        let e = if let Some(e) = last_rn {
            e
        } else if w - pos > 1 && w < seg.end {
            w - 1
        } else if w > pos {
            w
        } else {
            pos + 1 // no match (cannot happen: every class is covered)
        };
        sink.add(e);
        pos = e;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn split(p: PreTokenizer, s: &str) -> Vec<&str> {
        let mut out = Vec::new();
        p.split(s, &mut out);
        out
    }

    #[test]
    fn gpt2_basic() {
        let p = PreTokenizer::Gpt2;
        assert_eq!(split(p, "Hello, world!"), ["Hello", ",", " world", "!"]);
        assert_eq!(split(p, "   Hello"), ["  ", " Hello"]);
        assert_eq!(split(p, "Hello  \n"), ["Hello", "  \n"]);
        assert_eq!(split(p, "a  b"), ["a", " ", " b"]);
        assert_eq!(
            split(p, "y'all I'm 'RE"),
            ["y", "'", "all", " I", "'m", " '", "RE"]
        );
        assert_eq!(split(p, "3333 x1"), ["3333", " x", "1"]);
        assert_eq!(split(p, "\t\n"), ["\t\n"]);
        assert_eq!(split(p, "!!!!!! ??"), ["!!!!!!", " ??"]);
        assert_eq!(split(p, "🦙.cpp"), ["🦙.", "cpp"]);
        assert_eq!(split(p, ""), Vec::<&str>::new());
        // Khmer: the vowel signs are marks, not letters.
        assert_eq!(split(p, "កាន់"), ["ក", "ា", "ន", "់"]);
    }

    #[test]
    fn llama3_basic() {
        let p = PreTokenizer::Llama3;
        assert_eq!(split(p, "Hello, world!"), ["Hello", ",", " world", "!"]);
        assert_eq!(split(p, "1234567"), ["123", "456", "7"]);
        assert_eq!(
            split(p, "I'VE (x)\n\n y"),
            ["I", "'VE", " (", "x", ")\n\n", " y"]
        );
        assert_eq!(split(p, "a \n\n b"), ["a", " \n\n", " b"]);
        assert_eq!(split(p, "$hello"), ["$hello"]);
    }

    #[test]
    fn default_and_refact() {
        assert_eq!(
            split(PreTokenizer::Default, "Hello, world!!! 12345 a`b"),
            ["Hello", ",", " world", "!!!", " ", "123", "45", " a", "`", "b"]
        );
        assert_eq!(
            split(PreTokenizer::Refact, "ab12 c"),
            ["ab", "1", "2", " c"]
        );
    }

    #[test]
    fn names() {
        assert_eq!(
            PreTokenizer::from_name(None).ok(),
            Some(PreTokenizer::Default)
        );
        assert_eq!(
            PreTokenizer::from_name(Some("mpt")).ok(),
            Some(PreTokenizer::Gpt2)
        );
        assert_eq!(
            PreTokenizer::from_name(Some("llama-bpe")).ok(),
            Some(PreTokenizer::Llama3)
        );
        assert!(PreTokenizer::from_name(Some("nope")).is_err());
    }
}
