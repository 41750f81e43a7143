//! Draft tokens for speculative decoding without a second model: n-gram
//! lookup ("prompt lookup decoding") over the sequence's own tokens — the
//! prompt and what was generated so far. When the last n tokens (n = N
//! down to 2) occurred earlier, the tokens that followed them then are
//! proposed as the continuation now. Text that repeats or quotes its
//! context (code edits, summaries, a passage asked back) is continued at
//! the cost of one verification pass for several tokens; text that does
//! not gets no draft and no extra work.
//!
//! How many tokens to propose adapts to the recent acceptance
//! ([`AdaptiveLen`]): longer while drafts are accepted whole, shorter as
//! they fail, and after drafts fail outright the drafting pauses for a
//! growing number of steps, so that text where lookups keep failing costs
//! almost nothing over plain decoding.

/// A source of draft tokens.
pub trait Drafter {
    /// Up to `max` tokens that may follow `history` (empty: no draft).
    fn propose(&mut self, history: &[u32], max: usize) -> Vec<u32>;
}

/// Most tokens one draft may hold (`--draft-max`).
pub const MAX_DRAFT: usize = 64;
/// Longest n-gram looked up (`--ngram`).
pub const MAX_NGRAM: usize = 16;

/// What drafts.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum SpecKind {
    /// Prompt lookup ([`NgramDrafter`]).
    #[default]
    Ngram,
    /// The model's own NextN / MTP block (the engine keeps its memory).
    Nextn,
    /// A smaller model with the same vocabulary
    /// ([`super::speculative::DraftModel`]), which the caller loads.
    Model,
}

/// Settings of speculation, checked.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SpecParams {
    pub kind: SpecKind,
    /// Most draft tokens per verification (k).
    pub draft_max: usize,
    /// Longest n-gram matched (N); the shortest is min(2, N).
    pub ngram_max: usize,
}

impl Default for SpecParams {
    fn default() -> Self {
        SpecParams {
            kind: SpecKind::Ngram,
            draft_max: 8,
            ngram_max: 4,
        }
    }
}

impl SpecParams {
    /// Checks the ranges of n-gram speculation; the message names the flag.
    pub fn new(draft_max: usize, ngram_max: usize) -> Result<Self, String> {
        if !(1..=MAX_DRAFT).contains(&draft_max) {
            return Err(format!(
                "--draft-max must be between 1 and {MAX_DRAFT}, got {draft_max}"
            ));
        }
        if !(1..=MAX_NGRAM).contains(&ngram_max) {
            return Err(format!(
                "--ngram must be between 1 and {MAX_NGRAM}, got {ngram_max}"
            ));
        }
        Ok(SpecParams {
            kind: SpecKind::Ngram,
            draft_max,
            ngram_max,
        })
    }

    /// The same settings with drafts from `kind`.
    pub fn with_kind(self, kind: SpecKind) -> Self {
        SpecParams { kind, ..self }
    }
}

/// Prompt lookup: the continuation of the most recent, longest earlier
/// occurrence of the sequence's last n tokens, n in `n_min..=n_max`.
#[derive(Clone, Debug)]
pub struct NgramDrafter {
    pub n_min: usize,
    pub n_max: usize,
}

impl NgramDrafter {
    pub fn new(n_max: usize) -> Self {
        let n_max = n_max.max(1);
        NgramDrafter {
            n_min: n_max.min(2),
            n_max,
        }
    }

    /// Where the continuation starts in `history`: after the most recent
    /// earlier occurrence of its last n tokens, for the longest n in
    /// `n_min..=n_max` that occurs. One backwards pass over the history.
    pub fn find(&self, history: &[u32]) -> Option<usize> {
        let len = history.len();
        if len < self.n_min + 1 {
            return None;
        }
        let last = history[len - 1];
        let mut best: Option<(usize, usize)> = None;
        // `i` is the last token of an earlier occurrence.
        for i in (0..len - 1).rev() {
            if history[i] != last {
                continue;
            }
            let mut m = 1;
            while m < self.n_max && m <= i && history[i - m] == history[len - 1 - m] {
                m += 1;
            }
            if m >= self.n_min && best.is_none_or(|(_, bm)| m > bm) {
                best = Some((i + 1, m));
                if m == self.n_max {
                    break;
                }
            }
        }
        best.map(|(at, _)| at)
    }
}

impl Drafter for NgramDrafter {
    fn propose(&mut self, history: &[u32], max: usize) -> Vec<u32> {
        if max == 0 {
            return Vec::new();
        }
        match self.find(history) {
            Some(at) => history[at..history.len().min(at + max)].to_vec(),
            None => Vec::new(),
        }
    }
}

/// Longest pause of drafting after drafts keep failing, in steps.
const MAX_PAUSE: usize = 64;

/// The draft length from the recent acceptance: starts at half the maximum,
/// doubles after a draft is accepted whole (up to the maximum), falls to
/// what was accepted + 1 (at least half) after a partial one, and drops to
/// one token after a draft fails outright — and drafting then pauses for
/// 1, 4, 16, 64 steps while the failures go on, so that a text where
/// lookups keep failing is decoded almost as if speculation were off (a
/// failed verification costs more than the step it replaces).
#[derive(Clone, Debug)]
pub struct AdaptiveLen {
    max: usize,
    k: usize,
    pause: usize,
    backoff: usize,
    fixed: bool,
}

impl AdaptiveLen {
    pub fn new(max: usize) -> Self {
        let max = max.max(1);
        AdaptiveLen {
            max,
            k: (max / 2).max(1),
            pause: 0,
            backoff: 0,
            fixed: false,
        }
    }

    /// Always `k` (benchmarks: the cost of a given draft length).
    pub fn fixed(k: usize) -> Self {
        AdaptiveLen {
            fixed: true,
            k: k.max(1),
            ..Self::new(k)
        }
    }

    /// The draft length to ask for at this step (0: do not draft now).
    pub fn take(&mut self) -> usize {
        if self.pause > 0 {
            self.pause -= 1;
            return 0;
        }
        self.k
    }

    /// What the last verification did: `accepted` of `drafted` tokens.
    pub fn observe(&mut self, drafted: usize, accepted: usize) {
        if drafted == 0 || self.fixed {
            return;
        }
        if accepted >= drafted {
            self.k = (self.k * 2).min(self.max);
            self.backoff = 0;
        } else if accepted == 0 {
            self.k = 1;
            self.backoff = (self.backoff * 4).clamp(1, MAX_PAUSE);
            self.pause = self.backoff;
        } else {
            self.k = (accepted + 1).max(self.k / 2).min(self.max);
            self.backoff = 0;
        }
    }

    /// The current draft length (without the pause).
    pub fn len(&self) -> usize {
        self.k
    }

    pub fn is_empty(&self) -> bool {
        self.k == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn longest_most_recent_match_wins() {
        let d = NgramDrafter::new(3);
        // ... 1 2 3 [9] ... 7 2 3 [8] ... 1 2 3 → the 3-gram "1 2 3" at 0.
        let h = [1, 2, 3, 9, 5, 7, 2, 3, 8, 6, 1, 2, 3];
        assert_eq!(d.find(&h), Some(3));
        // Only "2 3" matches twice: the most recent occurrence.
        let h = [4, 2, 3, 9, 5, 7, 2, 3, 8, 6, 1, 2, 3];
        assert_eq!(d.find(&h), Some(8));
        let mut d = NgramDrafter::new(3);
        assert_eq!(d.propose(&h, 2), vec![8, 6]);
        assert_eq!(d.propose(&h, 10), vec![8, 6, 1, 2, 3]);
        assert_eq!(d.propose(&h, 0), Vec::<u32>::new());
    }

    #[test]
    fn no_match_no_draft() {
        let mut d = NgramDrafter::new(4);
        assert!(d.propose(&[1, 2, 3, 4, 5, 6], 8).is_empty());
        // A single repeated token is not a 2-gram match.
        assert!(d.propose(&[5, 1, 2, 5], 8).is_empty());
        assert!(d.propose(&[], 8).is_empty());
        assert!(d.propose(&[7], 8).is_empty());
        // n = 1 allows it.
        let mut d1 = NgramDrafter::new(1);
        assert_eq!(d1.propose(&[5, 1, 2, 5], 8), vec![1, 2, 5]);
    }

    #[test]
    fn repeats_overlap_the_suffix() {
        let mut d = NgramDrafter::new(4);
        // a b a b a b → continue "a b ...".
        assert_eq!(d.propose(&[1, 2, 1, 2, 1, 2], 3), vec![1, 2]);
        assert_eq!(d.propose(&[7, 7, 7, 7], 5), vec![7]);
    }

    #[test]
    fn params_are_checked() {
        assert!(SpecParams::new(0, 4).unwrap_err().contains("--draft-max"));
        assert!(SpecParams::new(65, 4).is_err());
        assert!(SpecParams::new(8, 0).unwrap_err().contains("--ngram"));
        assert!(SpecParams::new(8, 1000).is_err());
        assert_eq!(SpecParams::new(8, 4), Ok(SpecParams::default()));
    }

    #[test]
    fn adaptive_length_follows_acceptance() {
        let mut a = AdaptiveLen::new(8);
        assert_eq!(a.take(), 4);
        a.observe(4, 4);
        assert_eq!(a.take(), 8);
        a.observe(8, 3);
        assert_eq!(a.take(), 4);
        a.observe(4, 4);
        a.observe(8, 8);
        assert_eq!(a.take(), 8);
        // Outright failures: one-token drafts and growing pauses.
        let mut steps = Vec::new();
        for _ in 0..5 {
            let mut skipped = 0;
            let k = loop {
                match a.take() {
                    0 => skipped += 1,
                    k => break k,
                }
            };
            steps.push((k, skipped));
            a.observe(k, 0);
        }
        assert_eq!(steps, vec![(8, 0), (1, 1), (1, 4), (1, 16), (1, 64)]);
        // One success ends the pauses.
        let k = loop {
            match a.take() {
                0 => {}
                k => break k,
            }
        };
        a.observe(k, k);
        assert_eq!(a.take(), 2);
        // Fixed: never adapts.
        let mut f = AdaptiveLen::fixed(5);
        f.observe(5, 0);
        assert_eq!((f.take(), f.len()), (5, 5));
    }
}
