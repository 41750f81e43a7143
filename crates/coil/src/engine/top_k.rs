//! The k largest logits of a row without copying or sorting the row: the
//! sampler's top-k on a 248k-token vocabulary, per sequence and token,
//! where a copy, a candidate list of the whole vocabulary and a selection
//! over it took milliseconds (a serving step decodes several sequences and
//! samples them one after another).
//!
//! One pass keeps a buffer of at most `2m` candidates: a chunk of 64 logits
//! whose largest is not above the buffer's m-th value (once it has one) is
//! skipped whole; a full buffer is cut back to its m best, which raises
//! that threshold. Ties go to the lower token id, so the result does not
//! depend on where the row was cut into chunks.

use std::cmp::Ordering;

/// Candidates best first: larger logit, then lower token id.
pub(crate) fn better(a: &(u32, f32), b: &(u32, f32)) -> Ordering {
    b.1.total_cmp(&a.1).then(a.0.cmp(&b.0))
}

/// The `k` best `(token, logit)` of `row` after `adjusted` replaces the
/// logits of its tokens (penalized recent tokens, distinct ids), best first
/// (larger logit, then lower id); NaNs never count. Fewer than `k` when
/// the row has fewer non-NaN logits.
pub fn top_k(row: &[f32], k: usize, adjusted: &[(u32, f32)]) -> Vec<(u32, f32)> {
    if k == 0 {
        return Vec::new();
    }
    // The true k best are among the raw k + |adjusted| best (each of the
    // others has k tokens of unchanged logit above it): take those, swap
    // in the adjusted logits, then keep k.
    let m = k.saturating_add(adjusted.len()).min(row.len());
    let mut cand = if m == 0 { Vec::new() } else { raw_best(row, m) };
    cand.retain(|c| !adjusted.iter().any(|a| a.0 == c.0));
    cand.extend(
        adjusted
            .iter()
            .filter(|a| (a.0 as usize) < row.len() && !a.1.is_nan()),
    );
    cand.sort_unstable_by(better);
    cand.truncate(k);
    cand
}

/// The `m` best raw logits of `row` (NaNs left out), in no order.
fn raw_best(row: &[f32], m: usize) -> Vec<(u32, f32)> {
    const L: usize = 64;
    let mut best = Best {
        buf: Vec::with_capacity(2 * m + L),
        m,
        floor: None,
    };
    let chunks = row.chunks_exact(L);
    let tail = row.len() - chunks.remainder().len();
    for (c, xs) in chunks.enumerate() {
        // in 16 independent lanes (vectorized); `max` of a NaN and a
        // number is the number
        let mut lanes = [f32::NEG_INFINITY; 16];
        for q in xs.chunks_exact(16) {
            for (h, &x) in lanes.iter_mut().zip(q) {
                *h = h.max(x);
            }
        }
        let hi = lanes.iter().fold(f32::NEG_INFINITY, |a, &b| a.max(b));
        if best.floor.is_some_and(|f| hi <= f) {
            continue;
        }
        for (j, &x) in xs.iter().enumerate() {
            best.push(c * L + j, x);
        }
    }
    for (j, &x) in row[tail..].iter().enumerate() {
        best.push(tail + j, x);
    }
    let mut buf = best.buf;
    if buf.len() > m {
        buf.select_nth_unstable_by(m - 1, better);
        buf.truncate(m);
    }
    buf
}

/// Candidates so far: at most `2m`, cut back to the `m` best when full.
struct Best {
    buf: Vec<(u32, f32)>,
    m: usize,
    /// The m-th best once a cut was made: a logit must beat it (a tie
    /// loses, its id being higher than every kept one's).
    floor: Option<f32>,
}

impl Best {
    fn push(&mut self, i: usize, x: f32) {
        if x.is_nan() || self.floor.is_some_and(|f| x <= f) {
            return;
        }
        self.buf.push((i as u32, x));
        if self.buf.len() >= 2 * self.m {
            self.buf.select_nth_unstable_by(self.m - 1, better);
            self.buf.truncate(self.m);
            self.floor = Some(self.buf[self.m - 1].1);
        }
    }
}

/// Every logit of `row` with `adjusted` replacing its tokens', NaNs left
/// out, fully sorted best first: what the fast paths are checked against.
#[cfg(test)]
pub(crate) fn adjusted_sorted(row: &[f32], adjusted: &[(u32, f32)]) -> Vec<(u32, f32)> {
    let mut all: Vec<(u32, f32)> = row
        .iter()
        .enumerate()
        .map(|(i, &x)| {
            let x = adjusted
                .iter()
                .find(|a| a.0 as usize == i)
                .map_or(x, |a| a.1);
            (i as u32, x)
        })
        .filter(|c| !c.1.is_nan())
        .collect();
    all.sort_by(better);
    all
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The `k` best by a full sort (see [`adjusted_sorted`]).
    fn reference(row: &[f32], k: usize, adjusted: &[(u32, f32)]) -> Vec<(u32, f32)> {
        let mut all = adjusted_sorted(row, adjusted);
        all.truncate(k);
        all
    }

    fn rows() -> Vec<Vec<f32>> {
        let mut state = 0x9E37_79B9_7F4A_7C15u64;
        let mut next = move || {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            state
        };
        let mut rows = Vec::new();
        for len in [0usize, 1, 5, 16, 17, 40, 333, 5000] {
            // spread values, and few distinct values (many ties)
            rows.push((0..len).map(|_| (next() % 10_000) as f32 * 0.01).collect());
            rows.push((0..len).map(|_| (next() % 7) as f32).collect());
        }
        // rising: every chunk raises the floor; falling: none does
        rows.push((0..3000).map(|i| i as f32).collect());
        rows.push((0..3000).map(|i| -(i as f32)).collect());
        let mut nan: Vec<f32> = (0..700).map(|i| ((i * 37) % 101) as f32).collect();
        for i in (0..700).step_by(3) {
            nan[i] = f32::NAN;
        }
        nan[5] = f32::INFINITY;
        nan[6] = f32::NEG_INFINITY;
        rows.push(nan);
        rows.push(vec![f32::NAN; 50]);
        rows
    }

    #[test]
    fn the_k_best_as_a_full_sort_gives_them() {
        for row in rows() {
            for k in [1usize, 2, 3, 16, 40, 100, 10_000] {
                let got = top_k(&row, k, &[]);
                let want = reference(&row, k, &[]);
                let bits = |v: &[(u32, f32)]| -> Vec<(u32, u32)> {
                    v.iter().map(|c| (c.0, c.1.to_bits())).collect()
                };
                assert_eq!(bits(&got), bits(&want), "len {} k {k}", row.len());
            }
        }
    }

    #[test]
    fn adjusted_logits_replace_the_raw_ones() {
        for row in rows().into_iter().filter(|r| r.len() >= 40) {
            // the best raw tokens pushed far down, low ones lifted to the
            // top, one made NaN, one id past the row
            let best = reference(&row, 3, &[]);
            let mut adjusted: Vec<(u32, f32)> = best
                .iter()
                .filter(|c| c.0 != 7 && c.0 != 11)
                .map(|c| (c.0, -1e9))
                .collect();
            adjusted.push((7, 1e9));
            adjusted.push((11, f32::NAN));
            adjusted.push((row.len() as u32 + 5, 1e12));
            for k in [1usize, 2, 5, 40] {
                let got = top_k(&row, k, &adjusted);
                let want = reference(&row, k, &adjusted);
                assert_eq!(got.len(), want.len());
                for (g, w) in got.iter().zip(&want) {
                    assert_eq!((g.0, g.1.to_bits()), (w.0, w.1.to_bits()));
                }
                assert_eq!(got[0].0, 7);
            }
        }
        assert!(top_k(&[1.0, 2.0], 0, &[]).is_empty());
    }
}
