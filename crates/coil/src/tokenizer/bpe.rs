//! Byte-level BPE (`tokenizer.ggml.model = "gpt2"`), merging exactly like
//! llama.cpp's `llm_tokenizer_bpe_session`: the lowest-rank adjacent pair
//! merges first, ties go to the leftmost pair.
//!
//! Symbols carry ids instead of strings. Texts that occur in merges but are
//! not tokens get ids past the vocabulary ("extended ids"), so a merge table
//! keyed by id pairs reproduces llama.cpp's string-keyed one exactly.

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap};
use std::hash::{BuildHasherDefault, Hasher};

use super::unicode::byte_to_char_table;
use super::vocab::keys;
use super::TokenizerError;

/// A fast hasher for the `u64` id-pair keys (splitmix64 finalizer).
#[derive(Default)]
pub(crate) struct PairHasher(u64);

impl Hasher for PairHasher {
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.write_u64(u64::from(b));
        }
    }

    #[inline]
    fn write_u64(&mut self, v: u64) {
        let mut z = (self.0 ^ v).wrapping_add(0x9E37_79B9_7F4A_7C15);
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        self.0 = z ^ (z >> 31);
    }

    fn finish(&self) -> u64 {
        self.0
    }
}

type PairMap = HashMap<u64, (u32, u32), BuildHasherDefault<PairHasher>>;

#[inline]
fn pair_key(left: u32, right: u32) -> u64 {
    (u64::from(left) << 32) | u64::from(right)
}

pub(crate) struct Bpe {
    /// (left id, right id) → (rank, merged id), ids extended.
    merges: PairMap,
    /// Initial symbol of each input byte.
    byte_sym: [u32; 256],
    /// Vocabulary size: ids below are real tokens.
    n_vocab: u32,
    /// For each extended id (index = id − n_vocab): the tokens llama.cpp
    /// emits for a finished symbol that is not a token (its single-byte
    /// pieces that happen to be tokens).
    extra_fallback: Vec<Vec<u32>>,
    /// The mapped-text form of each byte, for whole-word lookups.
    byte_char: [char; 256],
    ignore_merges: bool,
}

#[derive(Clone, Copy)]
struct Sym {
    id: u32,
    prev: u32,
    next: u32,
    alive: bool,
}

const NONE: u32 = u32::MAX;

/// A mergeable adjacent pair. Field order is the priority: rank, then the
/// left position (ties go to the leftmost pair, as in llama.cpp).
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
struct Candidate {
    rank: u32,
    left: u32,
    right: u32,
    /// Ids of both sides when queued; a changed side makes it outdated.
    left_id: u32,
    right_id: u32,
    merged: u32,
}

/// Reusable buffers of one encoding call.
#[derive(Default)]
pub(crate) struct BpeScratch {
    syms: Vec<Sym>,
    /// Mergeable pairs, lowest rank (then leftmost) first.
    heap: BinaryHeap<Reverse<Candidate>>,
    mapped: String,
}

impl Bpe {
    pub(crate) fn new(
        tokens: &[String],
        merges: &[String],
        token_to_id: &HashMap<String, u32>,
        ignore_merges: bool,
    ) -> Result<Self, TokenizerError> {
        let n_vocab = u32::try_from(tokens.len()).map_err(|_| TokenizerError::Inconsistent {
            key: keys::TOKENS,
            reason: "too many tokens".into(),
        })?;
        let mut extra: HashMap<String, u32> = HashMap::new();
        let mut extra_texts: Vec<String> = Vec::new();
        let mut id_of = |text: &str| -> u32 {
            if let Some(&id) = token_to_id.get(text) {
                return id;
            }
            if let Some(&id) = extra.get(text) {
                return id;
            }
            let id = n_vocab.saturating_add(extra_texts.len() as u32);
            extra.insert(text.to_string(), id);
            extra_texts.push(text.to_string());
            id
        };

        let byte_char = byte_to_char_table();
        let mut byte_sym = [0u32; 256];
        let mut buf = [0u8; 4];
        for (b, sym) in byte_sym.iter_mut().enumerate() {
            *sym = id_of(byte_char[b].encode_utf8(&mut buf));
        }

        let mut map = PairMap::default();
        map.reserve(merges.len());
        let mut joined = String::new();
        for (rank, line) in merges.iter().enumerate() {
            // llama.cpp: split at the first space after the first byte.
            let split = line
                .as_bytes()
                .iter()
                .skip(1)
                .position(|&b| b == b' ')
                .map(|p| p + 1)
                .ok_or_else(|| TokenizerError::Inconsistent {
                    key: keys::MERGES,
                    reason: format!("entry {rank} ({line:?}) is not two space-separated symbols"),
                })?;
            let (left, right) = (&line[..split], &line[split + 1..]);
            let l = id_of(left);
            let r = id_of(right);
            joined.clear();
            joined.push_str(left);
            joined.push_str(right);
            let m = id_of(&joined);
            let rank = u32::try_from(rank).unwrap_or(u32::MAX);
            // The first occurrence of a pair wins, like llama.cpp's emplace.
            map.entry(pair_key(l, r)).or_insert((rank, m));
        }

        let extra_fallback = extra_texts
            .iter()
            .map(|t| {
                t.bytes()
                    .filter(u8::is_ascii)
                    .filter_map(|b| {
                        token_to_id
                            .get(char::from(b).encode_utf8(&mut buf) as &str)
                            .copied()
                    })
                    .collect()
            })
            .collect();

        Ok(Bpe {
            merges: map,
            byte_sym,
            n_vocab,
            extra_fallback,
            byte_char,
            ignore_merges,
        })
    }

    /// Encodes one pre-token, appending its token ids to `out`.
    pub(crate) fn encode_word(
        &self,
        word: &str,
        token_to_id: &HashMap<String, u32>,
        out: &mut Vec<u32>,
        sc: &mut BpeScratch,
    ) {
        let bytes = word.as_bytes();
        if bytes.is_empty() {
            return;
        }
        if self.ignore_merges {
            sc.mapped.clear();
            sc.mapped
                .extend(bytes.iter().map(|&b| self.byte_char[b as usize]));
            if let Some(&id) = token_to_id.get(sc.mapped.as_str()) {
                out.push(id);
                return;
            }
        }
        if bytes.len() == 1 {
            self.emit(self.byte_sym[bytes[0] as usize], out);
            return;
        }

        let n = bytes.len() as u32;
        sc.syms.clear();
        sc.heap.clear();
        sc.syms.extend(bytes.iter().enumerate().map(|(i, &b)| {
            let i = i as u32;
            Sym {
                id: self.byte_sym[b as usize],
                prev: if i == 0 { NONE } else { i - 1 },
                next: if i + 1 == n { NONE } else { i + 1 },
                alive: true,
            }
        }));
        for i in 1..n {
            self.push_pair(sc, i - 1, i);
        }

        while let Some(Reverse(c)) = sc.heap.pop() {
            let (left, right, merged) = (c.left, c.right, c.merged);
            let (l, r) = (sc.syms[left as usize], sc.syms[right as usize]);
            if !l.alive || !r.alive || l.id != c.left_id || r.id != c.right_id {
                continue; // outdated
            }
            sc.syms[left as usize].id = merged;
            sc.syms[left as usize].next = r.next;
            sc.syms[right as usize].alive = false;
            if r.next != NONE {
                sc.syms[r.next as usize].prev = left;
            }
            if l.prev != NONE {
                self.push_pair(sc, l.prev, left);
            }
            if r.next != NONE {
                self.push_pair(sc, left, r.next);
            }
        }

        let mut i = 0u32;
        while i != NONE {
            let s = sc.syms[i as usize];
            self.emit(s.id, out);
            i = s.next;
        }
    }

    #[inline]
    fn push_pair(&self, sc: &mut BpeScratch, left: u32, right: u32) {
        let (left_id, right_id) = (sc.syms[left as usize].id, sc.syms[right as usize].id);
        if let Some(&(rank, merged)) = self.merges.get(&pair_key(left_id, right_id)) {
            sc.heap.push(Reverse(Candidate {
                rank,
                left,
                right,
                left_id,
                right_id,
                merged,
            }));
        }
    }

    #[inline]
    fn emit(&self, id: u32, out: &mut Vec<u32>) {
        if id < self.n_vocab {
            out.push(id);
        } else if let Some(fb) = self.extra_fallback.get((id - self.n_vocab) as usize) {
            out.extend_from_slice(fb);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn build(tokens: &[&str], merges: &[&str]) -> (Bpe, HashMap<String, u32>) {
        let tokens: Vec<String> = tokens.iter().map(|s| s.to_string()).collect();
        let merges: Vec<String> = merges.iter().map(|s| s.to_string()).collect();
        let map = tokens
            .iter()
            .enumerate()
            .map(|(i, t)| (t.clone(), i as u32))
            .collect();
        (Bpe::new(&tokens, &merges, &map, false).unwrap(), map)
    }

    fn enc(b: &Bpe, map: &HashMap<String, u32>, w: &str) -> Vec<u32> {
        let mut out = Vec::new();
        b.encode_word(w, map, &mut out, &mut BpeScratch::default());
        out
    }

    #[test]
    fn ranks_and_ties() {
        // "aaa": pairs (0,1) and (1,2) have the same rank; the left one wins.
        let (b, m) = build(&["a", "aa", "b"], &["a a"]);
        assert_eq!(enc(&b, &m, "aaa"), [1, 0]);
        assert_eq!(enc(&b, &m, "aaaa"), [1, 1]);
        // Lower rank first: "abc" with "b c" ranked before "a b".
        let (b, m) = build(&["a", "b", "c", "ab", "bc", "abc"], &["b c", "a bc", "a b"]);
        assert_eq!(enc(&b, &m, "abc"), [5]);
        assert_eq!(enc(&b, &m, "ab"), [3]);
        // Bytes map through the GPT-2 table.
        let (b, m) = build(&["Ġ", "a", "Ġa"], &["Ġ a"]);
        assert_eq!(enc(&b, &m, " a"), [2]);
    }

    #[test]
    fn non_token_intermediates() {
        // "x y" merges into a text that is not a token; a later merge uses it.
        let (b, m) = build(&["x", "y", "z", "xyz"], &["x y", "xy z"]);
        assert_eq!(enc(&b, &m, "xyz"), [3]);
        // Left as a non-token, the symbol falls back to its ASCII bytes.
        assert_eq!(enc(&b, &m, "xy"), [0, 1]);
        // Bytes that are no token at all vanish (as in llama.cpp).
        assert_eq!(enc(&b, &m, "xq"), [0]);
    }

    #[test]
    fn malformed_merge() {
        let tokens = vec!["a".to_string()];
        let map = HashMap::from([("a".to_string(), 0)]);
        let e = Bpe::new(&tokens, &["ab".to_string()], &map, false)
            .err()
            .unwrap();
        assert!(matches!(
            e,
            TokenizerError::Inconsistent {
                key: keys::MERGES,
                ..
            }
        ));
    }
}
