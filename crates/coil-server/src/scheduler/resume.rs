//! Prefix resume: the longest prefix of a prompt held by a parked or
//! running sequence, adopted or forked and rolled back to its nearest
//! checkpoint; pinned checkpoints that thinning must not drop.

use super::{seq_len_or_zero, GenRequest, Worker, MAX_PINNED};
use crate::metrics;
use coil::memory::{Checkpoint, SeqId};

impl Worker {
    /// Where sequence `s`, sharing `len` tokens with a prompt whose calls
    /// end at `end` (before its last token), can resume with nothing
    /// replayed: its end if it holds no more than that, else its newest
    /// recurrent checkpoint at or before `len` (attention-only memory is
    /// simply cut at `len`). With `chunk_align`, only an aligned state at a
    /// chunk boundary or at `end` (`Engine::resumable`): the rest of the
    /// prompt then gives the bits it gives processed whole.
    pub(super) fn resume_point(&self, s: SeqId, len: usize, end: usize) -> usize {
        let have = seq_len_or_zero(&self.engine, s);
        let r = self.engine.mem.recurrent.as_ref();
        let ok = |pos: usize, aligned: bool| {
            self.chunk_align.is_none() || self.engine.resumable(pos, aligned, end)
        };
        if len >= have && ok(have, r.is_some_and(|r| r.aligned(s).unwrap_or(false))) {
            return have;
        }
        match r {
            None => len.min(have),
            Some(r) => {
                let engine = r.checkpoints(s).unwrap_or_default();
                engine
                    .iter()
                    .chain(&self.pinned[s])
                    .filter(|c| c.pos <= len && ok(c.pos, c.aligned))
                    .map(|c| c.pos)
                    .max()
                    .unwrap_or(0)
            }
        }
    }

    /// Picks the slot and rolls it back to the reused prefix; returns the
    /// slot and how many prompt tokens it already holds.
    ///
    /// Candidates are the parked sequences (from the radix tree) and the
    /// running ones; the best is the one that resumes furthest. The tokens
    /// between its resume point (a checkpoint) and the shared length are
    /// processed with the rest of the prompt, batched like any prefill,
    /// rather than replayed here.
    /// Also returns the branch position (see `Active::marks`; 0: none).
    pub(super) fn prepare(
        &mut self,
        req: &mut GenRequest,
    ) -> Result<(SeqId, usize, usize), String> {
        let n = req.prompt.len();
        if n == 0 {
            return Err("the prompt has no tokens".into());
        }
        let query = &req.prompt[..n - 1];
        let mut cands: Vec<(SeqId, usize, bool)> = self
            .cache
            .matches(query)
            .into_iter()
            .map(|m| (m.seq, m.len, true))
            .collect();
        for a in &self.active {
            let toks = self
                .engine
                .mem
                .seq_tokens(a.seq)
                .map_err(|e| e.to_string())?;
            let l = common_len(toks, query);
            if l > 0 {
                cands.push((a.seq, l, false));
            }
        }
        struct Pick {
            seq: SeqId,
            len: usize,
            at: usize,
            parked: bool,
            prompt: Option<Vec<u32>>,
            key: (usize, bool, u64),
        }
        let n_ctx = self.engine.mem.n_ctx();
        // The longest prefix shared with anything in memory.
        let shared = cands.iter().map(|&(_, len, _)| len).max().unwrap_or(0);
        let mut best: Option<Pick> = None;
        for (seq, len, parked) in cands {
            let held = self.engine.mem.seq_tokens(seq).map_err(|e| e.to_string())?;
            let (mut len, mut prompt) = (len, None);
            if self.cfg.reuse_by_text {
                let bytes = |t: u32| self.tok.token_to_bytes_with(t, true);
                if let Some((p, l)) = align_by_text(&req.prompt, held, len, bytes) {
                    if p.len() + req.max_tokens <= n_ctx {
                        prompt = Some(p);
                        len = l;
                    }
                }
            }
            let end = prompt.as_ref().map_or(n, Vec::len) - 1;
            let at = self.resume_point(seq, len, end);
            if at == 0 {
                continue;
            }
            let recency = match parked {
                true => self.cache.last_used(seq).unwrap_or(0),
                false => u64::MAX,
            };
            let key = (at, len == held.len(), recency);
            if best.as_ref().is_none_or(|b| key > b.key) {
                best = Some(Pick {
                    seq,
                    len,
                    at,
                    parked,
                    prompt,
                    key,
                });
            }
        }
        let Some(mut pick) = best else {
            let slot = self.take_slot(None).ok_or("no free sequence slot")?;
            self.engine.seq_clear(slot).map_err(|e| e.to_string())?;
            self.unpin_where(slot, |_| false);
            return Ok((slot, 0, shared));
        };
        if let Some(p) = pick.prompt.take() {
            req.prompt = p;
        }
        let src = pick.seq;
        let src_len = seq_len_or_zero(&self.engine, src);
        // Adopt a parked sequence (no copy) when nothing is lost by it, or
        // when a slot must be freed anyway and it is the one to go; fork it
        // otherwise.
        let adopt = pick.parked
            && (pick.at == src_len
                || (self.unused_slot().is_none()
                    && (self.cache.lru(None) == Some(src) || 2 * pick.at >= src_len)));
        let slot = if adopt {
            self.cache.remove(src);
            src
        } else {
            let slot = self.take_slot(Some(src)).ok_or("no free sequence slot")?;
            self.engine.seq_fork(src, slot).map_err(|e| e.to_string())?;
            self.unpin_where(slot, |_| false);
            self.pinned[slot] = self.pinned[src].clone();
            if pick.parked {
                self.cache.touch(src);
            }
            slot
        };
        let at = pick.at;
        self.unpin_where(slot, |c| c.pos <= at);
        if pick.at < seq_len_or_zero(&self.engine, slot) {
            if let Err(e) = self.unpin_into_engine(slot, pick.at) {
                let _ = self.engine.seq_clear(slot);
                self.unpin_where(slot, |_| false);
                return Err(e);
            }
        }
        // A checkpoint (or the end, or a cut of attention cells): nothing
        // is replayed here.
        let stats = match self.engine.seq_truncate(slot, pick.at) {
            Ok(s) => s,
            Err(e) => {
                let _ = self.engine.seq_clear(slot);
                self.unpin_where(slot, |_| false);
                return Err(e.to_string());
            }
        };
        self.pin(slot, pick.at);
        metrics::add(&self.metrics.prefix_tokens_recomputed, pick.len - pick.at);
        metrics::add(&self.metrics.prompt_tokens_evaluated, stats.replayed);
        let branch = if shared > pick.at { shared } else { 0 };
        Ok((slot, pick.at - stats.replayed.min(pick.at), branch))
    }

    /// Keeps the engine's checkpoint of slot `s` at `pos` beside it,
    /// whatever the engine's thinning does later. Where `s` stands at `pos`
    /// and the engine took none there (a prompt call of one token: the
    /// generation spacing, `CheckpointPolicy::call_spacing`, skips those),
    /// one is taken now: a reference to the current state, no copy.
    pub(super) fn pin(&mut self, s: SeqId, pos: usize) {
        let here = seq_len_or_zero(&self.engine, s) == pos;
        let Some(r) = &mut self.engine.mem.recurrent else {
            return;
        };
        if pos == 0 || self.pinned[s].iter().any(|c| c.pos == pos) {
            return;
        }
        if here {
            let _ = r.checkpoint(s);
        }
        let Some(cp) = r
            .checkpoints(s)
            .ok()
            .and_then(|cps| cps.iter().find(|c| c.pos == pos).cloned())
        else {
            return;
        };
        let pins = &mut self.pinned[s];
        pins.push(cp);
        pins.sort_by_key(|c| c.pos);
        if pins.len() > MAX_PINNED {
            // Its buffer goes back to the memory's pool unless shared.
            pins.remove(0);
        }
    }

    /// Drops the pinned checkpoints of slot `s` that `keep` rejects; their
    /// buffers go back to the recurrent memory's pool for reuse (where
    /// nothing else holds them).
    pub(super) fn unpin_where(&mut self, s: SeqId, keep: impl Fn(&Checkpoint) -> bool) {
        self.pinned[s].retain(|c| keep(c));
    }

    /// Puts the pinned checkpoint of slot `s` at `pos` back into the
    /// engine's list (where thinning dropped it), so that a rollback to
    /// `pos` restores it.
    pub(super) fn unpin_into_engine(&mut self, s: SeqId, pos: usize) -> Result<(), String> {
        let Some(pin) = self.pinned[s].iter().find(|c| c.pos == pos).cloned() else {
            return Ok(());
        };
        let Some(r) = &mut self.engine.mem.recurrent else {
            return Ok(());
        };
        let mut cps = r.checkpoints(s).map_err(|e| e.to_string())?.to_vec();
        if cps.iter().any(|c| c.pos == pos) {
            return Ok(());
        }
        cps.push(pin);
        cps.sort_by_key(|c| c.pos);
        r.set_checkpoints(s, cps).map_err(|e| e.to_string())
    }
}

fn common_len(a: &[u32], b: &[u32]) -> usize {
    a.iter().zip(b).take_while(|(x, y)| x == y).count()
}

/// Extends a token-level match by text: past the `len` tokens that
/// `prompt` and `held` share, the prompt may spell the same text with other
/// tokens (a model's own output re-tokenized differently, e.g. six `\n`
/// tokens read back as one `\n\n\n\n\n\n`). Finds the furthest point
/// where both token lists end on the same byte offset with equal bytes,
/// and returns the prompt rewritten to use `held`'s tokens up to there
/// (the same text, so the same request) and the new common length. The
/// prompt keeps at least its last token. `None` when nothing is gained.
pub fn align_by_text<'t>(
    prompt: &[u32],
    held: &[u32],
    len: usize,
    bytes: impl Fn(u32) -> &'t [u8],
) -> Option<(Vec<u32>, usize)> {
    let n = prompt.len();
    if len >= n.saturating_sub(1) || len >= held.len() {
        return None;
    }
    // The prompt's text past the match (but its last token), and where its
    // tokens end in it.
    let mut text = Vec::new();
    let mut ends = Vec::new();
    for &t in &prompt[len..n - 1] {
        text.extend_from_slice(bytes(t));
        ends.push(text.len());
    }
    let mut at = 0;
    let mut best = None;
    for (j, &t) in held[len..].iter().enumerate() {
        let b = bytes(t);
        if b.is_empty() || text.get(at..at + b.len()) != Some(b) {
            break;
        }
        at += b.len();
        if let Ok(i) = ends.binary_search(&at) {
            best = Some((len + i + 1, len + j + 1));
        }
    }
    let (i, j) = best?;
    if j - len <= i - len && held[len..j] == prompt[len..i] {
        return None;
    }
    let mut out = Vec::with_capacity(j + n - i);
    out.extend_from_slice(&held[..j]);
    out.extend_from_slice(&prompt[i..]);
    Some((out, j))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn piece(t: u32) -> &'static [u8] {
        // Token ids 1..=3: "a", "b", "\n"; 10: "ab"; 11: "\n\n"; 0: "".
        match t {
            1 => b"a",
            2 => b"b",
            3 => b"\n",
            10 => b"ab",
            11 => b"\n\n",
            _ => b"",
        }
    }

    #[test]
    fn text_alignment_reuses_held_tokens() {
        // Held: a b \n \n (the model's own tokens); the prompt re-tokenized
        // them as "ab" "\n\n", then goes on with "a".
        let held = [1, 2, 3, 3];
        let prompt = [10, 11, 1, 2];
        assert_eq!(
            align_by_text(&prompt, &held, 0, piece),
            Some((vec![1, 2, 3, 3, 1, 2], 4))
        );
        // Only the part that ends on a shared boundary is reused.
        let held = [1, 2, 3, 1];
        let prompt = [10, 11, 2];
        assert_eq!(
            align_by_text(&prompt, &held, 0, piece),
            Some((vec![1, 2, 11, 2], 2))
        );
        // Identical tokens: nothing to gain; a different text: nothing.
        assert_eq!(align_by_text(&[1, 2, 3], &[1, 2, 3], 2, piece), None);
        assert_eq!(align_by_text(&[1, 2, 2], &[1, 3, 3], 1, piece), None);
        // The prompt's last token is never taken from the cache.
        assert_eq!(align_by_text(&[1, 11], &[1, 3, 3], 1, piece), None);
    }

    /// Random token lists over the pieces above (empty ones included):
    /// whatever the alignment returns spells the prompt's text, starts with
    /// the held tokens it claims, keeps the prompt's last token and gains.
    #[test]
    fn text_alignment_keeps_the_text_at_random() {
        let ids = [0u32, 1, 2, 3, 10, 11];
        let mut s = 0x2545_F491_4F6C_DD1Du64;
        let mut next = |n: usize| {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            (s % n as u64) as usize
        };
        let text = |t: &[u32]| {
            t.iter()
                .flat_map(|&t| piece(t).to_vec())
                .collect::<Vec<u8>>()
        };
        let mut found = 0;
        for _ in 0..20_000 {
            let held: Vec<u32> = (0..1 + next(8)).map(|_| ids[next(ids.len())]).collect();
            // a prompt that often spells the held text another way
            let mut prompt: Vec<u32> = Vec::new();
            let mut i = 0;
            while i < held.len() && next(4) != 0 {
                match (held[i], held.get(i + 1)) {
                    (1, Some(2)) if next(2) == 0 => {
                        prompt.push(10);
                        i += 2;
                    }
                    (3, Some(3)) if next(2) == 0 => {
                        prompt.push(11);
                        i += 2;
                    }
                    (t, _) => {
                        prompt.push(t);
                        i += 1;
                    }
                }
            }
            prompt.extend((0..1 + next(3)).map(|_| ids[next(ids.len())]));
            let len = common_len(&prompt, &held).min(next(3));
            let Some((out, j)) = align_by_text(&prompt, &held, len, piece) else {
                continue;
            };
            found += 1;
            assert_eq!(
                text(&out),
                text(&prompt),
                "{prompt:?} / {held:?} -> {out:?}"
            );
            assert_eq!(&out[..j], &held[..j]);
            assert_eq!(out.last(), prompt.last());
            assert!(
                j > len && j < out.len(),
                "{prompt:?} / {held:?} -> {out:?}, {j}"
            );
        }
        assert!(found > 1000, "only {found} alignments");
    }
}
