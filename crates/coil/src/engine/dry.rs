//! DRY ("don't repeat yourself"): a penalty on the token that would extend
//! a repetition of the recent text, growing exponentially with the
//! repetition's length — `multiplier · base^(length − allowed_length)` for
//! a repeat of at least `allowed_length` tokens. Sequence breakers (a
//! newline, `:`, a quote, `*` by default) end the stretch a repeat can
//! span, so a common line start is never penalized. The semantics are
//! llama.cpp's `llama_sampler_dry` (itself from koboldcpp).
//!
//! A breaker is text; a token holds it whole (a single-token breaker) or
//! starts it and later tokens finish it. [`DryBreakers::new`] looks every
//! vocabulary token up once per breaker: a token containing the breaker, or
//! whose end is a prefix of it (then with the tokens of the breaker's rest,
//! at most [`MAX_TAIL`]).

use crate::tokenizer::{EncodeOptions, Tokenizer};
use std::collections::{HashMap, VecDeque};
use std::sync::Arc;

/// llama.cpp's default breakers.
pub const DEFAULT_BREAKERS: [&str; 4] = ["\n", ":", "\"", "*"];

/// Longest breaker text kept, in bytes.
const MAX_BREAKER_LEN: usize = 40;
/// Most tokens of a breaker's tail.
const MAX_TAIL: usize = 20;

/// Breakers as token sequences: for a head token, the tails that complete
/// a breaker after it (an empty tail: the head holds a whole breaker).
#[derive(Clone, Default)]
pub struct DryBreakers {
    texts: Vec<String>,
    heads: HashMap<u32, Vec<Vec<u32>>>,
}

impl std::fmt::Debug for DryBreakers {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_tuple("DryBreakers").field(&self.texts).finish()
    }
}

impl PartialEq for DryBreakers {
    fn eq(&self, other: &Self) -> bool {
        self.texts == other.texts
    }
}

impl DryBreakers {
    /// The breakers `texts` in `tok`'s vocabulary (empty texts skipped,
    /// long ones cut to 40 bytes).
    pub fn new(tok: &Tokenizer, texts: &[String]) -> Self {
        let mut heads: HashMap<u32, Vec<Vec<u32>>> = HashMap::new();
        let mut kept = Vec::new();
        for text in texts {
            let mut b = text.as_bytes();
            if b.is_empty() {
                continue;
            }
            if b.len() > MAX_BREAKER_LEN {
                b = &b[..MAX_BREAKER_LEN];
            }
            kept.push(String::from_utf8_lossy(b).into_owned());
            for id in 0..tok.n_vocab() as u32 {
                let word = tok.token_to_bytes_with(id, true);
                for tail in breaker_tails(word, b, |rest| {
                    let text = String::from_utf8_lossy(rest);
                    let opts = EncodeOptions {
                        add_special: false,
                        parse_special: false,
                    };
                    let mut t = tok.encode_with(&text, opts);
                    t.truncate(MAX_TAIL);
                    t
                }) {
                    let list = heads.entry(id).or_default();
                    if !list.contains(&tail) {
                        list.push(tail);
                    }
                }
            }
        }
        DryBreakers { texts: kept, heads }
    }

    /// The breakers' texts.
    pub fn texts(&self) -> &[String] {
        &self.texts
    }

    fn tails(&self, head: u32) -> &[Vec<u32>] {
        self.heads.get(&head).map_or(&[], Vec::as_slice)
    }

    fn is_single_token(&self, t: u32) -> bool {
        self.tails(t).iter().any(Vec::is_empty)
    }
}

/// The tails `word` (a token's bytes) starts breaker `b` with: none, an
/// empty one when `word` holds `b` whole, else one per place where the end
/// of `word` is a prefix of `b` (`tokenize` gives the rest's tokens).
fn breaker_tails(word: &[u8], b: &[u8], tokenize: impl Fn(&[u8]) -> Vec<u32>) -> Vec<Vec<u32>> {
    if word.windows(b.len()).any(|w| w == b) {
        return vec![Vec::new()];
    }
    let mut out = Vec::new();
    for pos in 0..word.len() {
        let have = word.len() - pos;
        if have < b.len() && word[pos..] == b[..have] {
            out.push(tokenize(&b[have..]));
        }
    }
    out
}

/// DRY's settings.
#[derive(Clone, Debug, PartialEq)]
pub struct DryParams {
    /// 0 = off.
    pub multiplier: f32,
    /// At least 1.
    pub base: f32,
    /// Repeats this long are free; one token more is penalized.
    pub allowed_length: usize,
    /// Recent tokens looked at (0 = off).
    pub penalty_last_n: usize,
    pub breakers: Arc<DryBreakers>,
}

impl Default for DryParams {
    fn default() -> Self {
        DryParams {
            multiplier: 0.0,
            base: 1.75,
            allowed_length: 2,
            penalty_last_n: 64,
            breakers: Arc::default(),
        }
    }
}

impl DryParams {
    pub fn is_on(&self) -> bool {
        self.multiplier != 0.0 && self.base >= 1.0 && self.penalty_last_n > 0
    }
}

/// The penalty of each token that would extend a repeat of `history`'s
/// last tokens (newest last), to subtract from its logit.
pub fn penalties(p: &DryParams, history: &VecDeque<u32>) -> Vec<(u32, f32)> {
    if !p.is_on() {
        return Vec::new();
    }
    let n = history.len().min(p.penalty_last_n);
    if n <= p.allowed_length {
        return Vec::new();
    }
    // newest first
    let rev: Vec<u32> = history.iter().rev().take(n).copied().collect();
    // A breaker ending `i` tokens back bounds how far a repeat may reach.
    let mut limit = n;
    'scan: for i in 0..n {
        let mut longest: Option<usize> = None;
        for tail in p.breakers.tails(rev[i]) {
            let len = tail.len();
            if len <= i
                && longest.is_none_or(|l| len > l)
                && tail.iter().enumerate().all(|(o, &t)| rev[i - o - 1] == t)
            {
                longest = Some(len);
            }
        }
        if let Some(len) = longest {
            limit = i - len;
            break 'scan;
        }
    }
    if limit < p.allowed_length {
        return Vec::new();
    }
    // z[k]: how many tokens ending k tokens back repeat the newest ones.
    let z = z_function(&rev);
    let mut longest: HashMap<u32, usize> = HashMap::new();
    for k in 1..n {
        let len = z[k].min(limit);
        if len >= p.allowed_length {
            // the token that followed that earlier occurrence
            let next = rev[k - 1];
            let e = longest.entry(next).or_default();
            *e = (*e).max(len);
        }
    }
    // base^exp stays a finite f32
    let max_exp = if p.base > 1.000_001 {
        (88.722_84_f32 / p.base.ln()) as usize
    } else {
        usize::MAX
    };
    let mut out: Vec<(u32, f32)> = longest
        .into_iter()
        .filter(|&(t, _)| !p.breakers.is_single_token(t))
        .map(|(t, len)| {
            let e = (len - p.allowed_length).min(max_exp);
            (t, p.multiplier * p.base.powi(e as i32))
        })
        .collect();
    out.sort_unstable_by_key(|x| x.0);
    out
}

/// The Z-array of `s`: `z[k]` is the length of the longest common prefix
/// of `s` and `s[k..]` (`z[0]` = `s.len()`), in linear time.
fn z_function(s: &[u32]) -> Vec<usize> {
    let n = s.len();
    let mut z = vec![0; n];
    if n == 0 {
        return z;
    }
    z[0] = n;
    // [l, r): the rightmost match window found so far
    let (mut l, mut r) = (0, 0);
    for k in 1..n {
        let mut len = if k < r { z[k - l].min(r - k) } else { 0 };
        while k + len < n && s[len] == s[k + len] {
            len += 1;
        }
        z[k] = len;
        if k + len > r {
            l = k;
            r = k + len;
        }
    }
    z
}

#[cfg(test)]
mod tests {
    use super::*;

    fn naive_z(s: &[u32]) -> Vec<usize> {
        (0..s.len())
            .map(|k| s[k..].iter().zip(s).take_while(|(a, b)| a == b).count())
            .collect()
    }

    #[test]
    fn z_function_matches_the_definition() {
        for s in [
            vec![],
            vec![1],
            vec![1, 1, 1, 1],
            vec![3, 1, 2, 3, 1, 2, 3, 1],
            vec![1, 2, 1, 1, 2, 1, 2, 1, 1, 2],
        ] {
            assert_eq!(z_function(&s), naive_z(&s));
        }
    }

    fn hist(v: &[u32]) -> VecDeque<u32> {
        v.iter().copied().collect()
    }

    #[test]
    fn the_token_that_extends_a_repeat_is_penalized_by_its_length() {
        let p = DryParams {
            multiplier: 1.0,
            base: 2.0,
            allowed_length: 2,
            penalty_last_n: 64,
            breakers: Arc::default(),
        };
        // "a b c d | a b c": d would repeat "a b c d" (a repeat of 3).
        let h = hist(&[1, 2, 3, 4, 9, 1, 2, 3]);
        let pen = penalties(&p, &h);
        assert_eq!(pen, vec![(4, 2.0)]); // 1 · 2^(3 − 2)
                                         // Too short a repeat: free.
        let h = hist(&[1, 2, 4, 9, 1, 2]);
        assert_eq!(penalties(&p, &h), vec![(4, 1.0)]);
        let h = hist(&[1, 4, 9, 1]);
        assert!(penalties(&p, &h).is_empty());
        assert!(penalties(&DryParams::default(), &h).is_empty());
    }

    #[test]
    fn breakers_bound_repeats_and_are_never_penalized() {
        // token 7 is a single-token breaker; 5 starts a two-token one (5 6)
        let mut heads = HashMap::new();
        heads.insert(7u32, vec![vec![]]);
        heads.insert(5u32, vec![vec![6u32]]);
        let breakers = Arc::new(DryBreakers {
            texts: vec!["x".into(), "yz".into()],
            heads,
        });
        let p = DryParams {
            multiplier: 1.0,
            base: 2.0,
            allowed_length: 1,
            penalty_last_n: 64,
            breakers,
        };
        // the repeat "1 2 3" before "4"; a breaker two tokens back cuts
        // the stretch to 2 tokens: "2 3" → 4, exponent 1
        let h = hist(&[1, 2, 3, 4, 1, 7, 2, 3]);
        assert_eq!(penalties(&p, &h), vec![(4, 2.0)]);
        // "5 6" (a breaker) ends 3 tokens back: the 5-token repeat
        // "1 5 6 2 3" counts as 2 tokens
        let h = hist(&[1, 5, 6, 2, 3, 4, 1, 5, 6, 2, 3]);
        assert_eq!(penalties(&p, &h), vec![(4, 2.0)]);
        // a repeat followed by the breaker token itself: no penalty on it
        let h = hist(&[1, 2, 7, 1, 2]);
        assert!(penalties(&p, &h).iter().all(|x| x.0 != 7));
    }

    #[test]
    fn tails_are_what_a_token_leaves_of_a_breaker() {
        let t = |rest: &[u8]| rest.iter().map(|&b| b as u32).collect::<Vec<_>>();
        assert_eq!(breaker_tails(b"a:b", b":", t), vec![Vec::<u32>::new()]);
        assert_eq!(
            breaker_tails(b"ab", b"bcd", t),
            vec![vec![b'c' as u32, b'd' as u32]]
        );
        assert!(breaker_tails(b"ab", b"cd", t).is_empty());
    }
}
