//! SentencePiece BPE (`tokenizer.ggml.model = "llama"`), exactly like
//! llama.cpp's `llm_tokenizer_spm_session`: start from UTF-8 characters,
//! repeatedly merge the adjacent pair whose concatenation is the
//! highest-scoring token (ties: leftmost), and spell whatever is left that is
//! not a token as `<0xXX>` byte tokens.

use std::cmp::Ordering;
use std::collections::{BinaryHeap, HashMap};

pub(crate) struct Spm {
    /// The `<0xXX>` token of each byte (or the byte itself as a token, or
    /// the unknown token).
    byte_tokens: [Option<u32>; 256],
}

#[derive(Clone, Copy)]
struct Sym {
    start: u32,
    len: u32,
    prev: u32,
    next: u32,
}

const NONE: u32 = u32::MAX;

#[derive(Clone, Copy)]
struct Bigram {
    score: f32,
    left: u32,
    right: u32,
    size: u32,
}

impl PartialEq for Bigram {
    fn eq(&self, other: &Self) -> bool {
        self.cmp(other) == Ordering::Equal
    }
}
impl Eq for Bigram {}
impl PartialOrd for Bigram {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}
impl Ord for Bigram {
    /// Max-heap order: higher score first, then the leftmost pair.
    fn cmp(&self, other: &Self) -> Ordering {
        self.score
            .total_cmp(&other.score)
            .then_with(|| other.left.cmp(&self.left))
    }
}

/// Reusable buffers of one encoding call.
#[derive(Default)]
pub(crate) struct SpmScratch {
    syms: Vec<Sym>,
    heap: BinaryHeap<Bigram>,
}

impl Spm {
    pub(crate) fn new(token_to_id: &HashMap<String, u32>, unk_id: Option<u32>) -> Self {
        let mut byte_tokens = [None; 256];
        for (b, slot) in byte_tokens.iter_mut().enumerate() {
            let hex = format!("<0x{b:02X}>");
            *slot = token_to_id
                .get(&hex)
                .copied()
                .or_else(|| {
                    let b = u8::try_from(b).ok().filter(u8::is_ascii)?;
                    token_to_id.get(char::from(b).to_string().as_str()).copied()
                })
                .or(unk_id);
        }
        Spm { byte_tokens }
    }

    /// Encodes `text` (already space-escaped to `▁`), appending to `out`.
    pub(crate) fn encode(
        &self,
        text: &str,
        token_to_id: &HashMap<String, u32>,
        scores: &[f32],
        out: &mut Vec<u32>,
        sc: &mut SpmScratch,
    ) {
        if text.is_empty() {
            return;
        }
        sc.syms.clear();
        sc.heap.clear();
        let n = text.chars().count() as u32;
        for (i, (off, c)) in text.char_indices().enumerate() {
            let i = i as u32;
            sc.syms.push(Sym {
                start: off as u32,
                len: c.len_utf8() as u32,
                prev: if i == 0 { NONE } else { i - 1 },
                next: if i + 1 == n { NONE } else { i + 1 },
            });
        }
        for i in 1..n {
            try_add(text, token_to_id, scores, sc, i - 1, i);
        }

        while let Some(bg) = sc.heap.pop() {
            let (l, r) = (sc.syms[bg.left as usize], sc.syms[bg.right as usize]);
            if l.len == 0 || r.len == 0 || l.len + r.len != bg.size {
                continue; // outdated
            }
            sc.syms[bg.left as usize].len += r.len;
            sc.syms[bg.right as usize].len = 0;
            sc.syms[bg.left as usize].next = r.next;
            if r.next != NONE {
                sc.syms[r.next as usize].prev = bg.left;
            }
            if l.prev != NONE {
                try_add(text, token_to_id, scores, sc, l.prev, bg.left);
            }
            if r.next != NONE {
                try_add(text, token_to_id, scores, sc, bg.left, r.next);
            }
        }

        let mut i = 0u32;
        while i != NONE {
            let s = sc.syms[i as usize];
            let piece = &text[s.start as usize..(s.start + s.len) as usize];
            match token_to_id.get(piece) {
                Some(&id) => out.push(id),
                None => out.extend(piece.bytes().filter_map(|b| self.byte_tokens[b as usize])),
            }
            i = s.next;
        }
    }
}

fn try_add(
    text: &str,
    token_to_id: &HashMap<String, u32>,
    scores: &[f32],
    sc: &mut SpmScratch,
    left: u32,
    right: u32,
) {
    let (l, r) = (sc.syms[left as usize], sc.syms[right as usize]);
    let size = l.len + r.len;
    let Some(piece) = text.get(l.start as usize..(l.start + size) as usize) else {
        return;
    };
    if let Some(&id) = token_to_id.get(piece) {
        let score = scores.get(id as usize).copied().unwrap_or(0.0);
        sc.heap.push(Bigram {
            score,
            left,
            right,
            size,
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn merges_by_score_with_byte_fallback() {
        let tokens = [
            "<unk>", "<0x41>", "▁", "a", "b", "ab", "▁a", "▁ab", "<0xE2>", "<0x82>", "<0xAC>",
        ];
        let scores = [0.0, 0.0, -1.0, -1.0, -1.0, -3.0, -2.0, -0.5, 0.0, 0.0, 0.0];
        let map: HashMap<String, u32> = tokens
            .iter()
            .enumerate()
            .map(|(i, t)| (t.to_string(), i as u32))
            .collect();
        let spm = Spm::new(&map, Some(0));
        let enc = |s: &str| {
            let mut out = Vec::new();
            spm.encode(s, &map, &scores, &mut out, &mut SpmScratch::default());
            out
        };
        // "▁a" (-2) beats "ab" (-3); then "▁ab" (-0.5).
        assert_eq!(enc("▁ab"), [7]);
        assert_eq!(enc("ab"), [5]);
        // 'A' has a byte token; '€' falls back to its three bytes.
        assert_eq!(enc("A€"), [1, 8, 9, 10]);
        // No byte token for 'c' (0x63): the unknown token.
        assert_eq!(enc("c"), [0]);
    }
}
