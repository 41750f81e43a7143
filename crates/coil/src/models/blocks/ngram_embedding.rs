//! Hashed n-gram embeddings (Qwen4-Exp's per-layer embedding input): each
//! token looks up `(n − 1)·heads_per_ngram` rows of one shared table, one
//! per hash head of each n-gram order 2..=n, and their concatenation is its
//! embedding. For order k the token and its k − 1 predecessors hash as
//!
//! ```text
//! mixed = (t₀·m₀) ^ (t₁·m₁) ^ … ^ (t_{k−1}·m_{k−1})   (t₀ the token, t_s the one s back; u64)
//! row_h = mixed mod vocab_h + offset_h                 (per head h of the order)
//! ```
//!
//! A predecessor before the sequence start, or at or before an
//! end-of-text token among the predecessors, counts as the end-of-text
//! token (the n-gram restarts after it; the token's own end-of-text does
//! not cut its own context), as transformers' `_shift_right_ignore_eos`.

use crate::models::weights::{Loader, Matrix};
use crate::models::ModelError;
use coil_gguf::{GgufFile, Value};

/// The hash: multipliers per n-gram position and each head's range of rows.
#[derive(Clone, Debug)]
pub struct NgramHash {
    /// The largest order n (`ple.ngram_size`, ≥ 2).
    pub ngram: usize,
    pub heads_per_ngram: usize,
    pub eos: u32,
    /// `[n]`: the multiplier of the token s back.
    pub multipliers: Vec<u64>,
    /// `[(n − 1)·heads_per_ngram]`
    pub offsets: Vec<u64>,
    pub vocab: Vec<u64>,
}

/// A u64 array key with at least `n` entries (its first `n`).
fn u64_array(ld: &Loader, suffix: &str, n: usize) -> Result<Vec<u64>, ModelError> {
    let key = format!("{}.{suffix}", ld.arch);
    let bad = |reason: String| ModelError::BadKey {
        key: key.clone(),
        reason,
    };
    match ld.file.metadata().get(&key) {
        None => Err(ModelError::MissingKey(key.clone())),
        Some(Value::Array(_, items)) if items.len() >= n => items[..n]
            .iter()
            .map(|v| {
                v.as_u64()
                    .ok_or_else(|| bad(format!("entry {v} is not a count")))
            })
            .collect(),
        Some(Value::Array(_, items)) => Err(bad(format!("{} entries, {n} needed", items.len()))),
        Some(v) => Err(bad(format!("{v} is not an array"))),
    }
}

impl NgramHash {
    /// Reads `ple.{ngram_size, heads_per_ngram, eos_token_id,
    /// layer_multipliers, head_offsets, head_vocab_sizes}`.
    pub fn from_gguf(ld: &Loader) -> Result<Self, ModelError> {
        let ngram = ld.u_in("ple.ngram_size", 2, 16)?;
        let heads_per_ngram = ld.u_in("ple.heads_per_ngram", 1, 4096)?;
        let eos = ld.u("ple.eos_token_id")? as u32;
        let n_heads = (ngram - 1) * heads_per_ngram;
        let multipliers = u64_array(ld, "ple.layer_multipliers", ngram)?;
        let offsets = u64_array(ld, "ple.head_offsets", n_heads)?;
        let vocab = u64_array(ld, "ple.head_vocab_sizes", n_heads)?;
        if let Some(h) = vocab.iter().position(|&v| v == 0) {
            return Err(ModelError::BadKey {
                key: format!("{}.ple.head_vocab_sizes", ld.arch),
                reason: format!("head {h} has no rows"),
            });
        }
        Ok(NgramHash {
            ngram,
            heads_per_ngram,
            eos,
            multipliers,
            offsets,
            vocab,
        })
    }

    pub fn n_heads(&self) -> usize {
        (self.ngram - 1) * self.heads_per_ngram
    }

    /// The rows every head needs: the end of the furthest head range.
    pub fn rows_needed(&self) -> u64 {
        self.offsets
            .iter()
            .zip(&self.vocab)
            .map(|(o, v)| o + v)
            .max()
            .unwrap_or(0)
    }

    /// The table rows of `tokens` (`[tokens.len(), n_heads]`), given the
    /// `n − 1` tokens before them (oldest first; `None` before the start).
    pub fn rows(&self, before: &[Option<u32>], tokens: &[u32]) -> Vec<u64> {
        let k = self.ngram - 1;
        debug_assert_eq!(before.len(), k);
        let hist: Vec<Option<u32>> = before
            .iter()
            .copied()
            .chain(tokens.iter().map(|&t| Some(t)))
            .collect();
        let mut out = Vec::with_capacity(tokens.len() * self.n_heads());
        let mut ctx = vec![0u64; self.ngram];
        for (i, &tok) in tokens.iter().enumerate() {
            let at = k + i;
            ctx[0] = tok as u64;
            let mut cut = false;
            for s in 1..self.ngram {
                let t = if cut { None } else { hist[at - s] };
                cut = cut || t.is_none_or(|t| t == self.eos);
                ctx[s] = if cut {
                    self.eos as u64
                } else {
                    t.unwrap_or(self.eos) as u64
                };
            }
            for order in 2..=self.ngram {
                let mixed = (ctx.iter().zip(&self.multipliers).take(order))
                    .fold(0u64, |acc, (&t, &m)| acc ^ t.wrapping_mul(m));
                let base = (order - 2) * self.heads_per_ngram;
                for h in base..base + self.heads_per_ngram {
                    out.push(mixed % self.vocab[h] + self.offsets[h]);
                }
            }
        }
        out
    }
}

/// The hash and its table (`per_layer_token_embd`, `[rows, head_dim]`).
pub struct NgramEmbedding {
    pub hash: NgramHash,
    pub table: Matrix,
}

impl NgramEmbedding {
    /// Loads the table for `hash`, checking it has the rows the heads index.
    pub fn load(ld: &Loader, hash: NgramHash, head_dim: usize) -> Result<Self, ModelError> {
        let name = "per_layer_token_embd.weight";
        let info = ld
            .file
            .tensor_info(name)
            .ok_or_else(|| ModelError::MissingTensor(name.into()))?;
        let rows = info.dims.get(1).copied().unwrap_or(0);
        if rows < hash.rows_needed() {
            return Err(ModelError::Tensor {
                name: name.into(),
                reason: format!(
                    "{rows} rows, too few for the n-gram head ranges ({})",
                    hash.rows_needed()
                ),
            });
        }
        let table = ld.matrix(name, rows as usize, head_dim)?;
        Ok(NgramEmbedding { hash, table })
    }

    /// Width of a token's embedding: heads × head_dim.
    pub fn width(&self) -> usize {
        self.hash.n_heads() * self.table.cols
    }

    /// `[tokens.len(), width]` into `out`.
    pub fn forward(
        &self,
        file: &GgufFile,
        before: &[Option<u32>],
        tokens: &[u32],
        out: &mut [f32],
    ) -> Result<(), ModelError> {
        let hd = self.table.cols;
        for (&r, o) in self
            .hash
            .rows(before, tokens)
            .iter()
            .zip(out.chunks_exact_mut(hd))
        {
            self.table.row_f32(file, r as usize, o)?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hash() -> NgramHash {
        NgramHash {
            ngram: 3,
            heads_per_ngram: 2,
            eos: 0,
            multipliers: vec![4295158889766209, 8433018892997163, 1270917961435699],
            offsets: vec![0, 23, 52, 83],
            vocab: vec![23, 29, 31, 37],
        }
    }

    /// transformers' ids for `[5, 7, 0, 9, 11]` from an empty history
    /// (computed with its `_shift_right_ignore_eos` and the same constants).
    #[test]
    fn matches_the_reference_hash() {
        let h = hash();
        let m = &h.multipliers;
        let rows = h.rows(&[None, None], &[5, 7, 0, 9, 11]);
        let mix2 = |a: u64, b: u64| a.wrapping_mul(m[0]) ^ b.wrapping_mul(m[1]);
        let mix3 = |a: u64, b: u64, c: u64| mix2(a, b) ^ c.wrapping_mul(m[2]);
        // (token, one back, two back) after the end-of-text rules
        let ctx = [(5, 0, 0), (7, 5, 0), (0, 7, 5), (9, 0, 0), (11, 9, 0)];
        for (i, &(a, b, c)) in ctx.iter().enumerate() {
            let want = [
                mix2(a, b) % 23,
                mix2(a, b) % 29 + 23,
                mix3(a, b, c) % 31 + 52,
                mix3(a, b, c) % 37 + 83,
            ];
            assert_eq!(&rows[i * 4..i * 4 + 4], &want, "token {i}");
        }
    }

    /// Hashing a continuation with its predecessors gives the rows of the
    /// whole sequence.
    #[test]
    fn continuation_matches_one_pass() {
        let h = hash();
        let toks = [3u32, 0, 4, 6, 8, 0, 0, 2];
        let all = h.rows(&[None, None], &toks);
        for cut in 0..toks.len() {
            let before: Vec<Option<u32>> = (0..2)
                .map(|j| (cut + j).checked_sub(2).map(|i| toks[i]))
                .collect();
            assert_eq!(h.rows(&before, &toks[cut..]), all[cut * 4..]);
        }
    }
}
