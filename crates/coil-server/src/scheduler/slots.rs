//! Sequence slots and the prefix cache's memory: parking finished
//! sequences, evicting the least recently used, and measuring what the
//! parked ones hold.

use super::Worker;
use crate::metrics;
use coil::memory::recurrent::distinct_checkpoint_bytes;
use coil::memory::SeqId;

/// A parked sequence keeps its checkpoints within `PARKED_GRID` ×
/// `checkpoint_spacing` tokens of its end, and about one per as many
/// positions before: resuming it anywhere replays about that many tokens
/// at most.
const PARKED_GRID: usize = 4;

impl Worker {
    /// Bytes the sequences `seqs` hold together — attention pages,
    /// recurrent states, the engine's checkpoints and the pinned ones —
    /// each buffer once however many of them share it.
    pub(super) fn footprint(&self, seqs: &[SeqId]) -> usize {
        let mem = &self.engine.mem;
        let kv = mem
            .kv
            .as_ref()
            .map_or(0, |k| k.page_stats_of(seqs.iter().copied()).bytes);
        let rec = mem.recurrent.as_ref().map_or(0, |r| {
            let engine = seqs
                .iter()
                .flat_map(|&s| r.checkpoints(s).unwrap_or_default());
            let pinned = seqs.iter().flat_map(|&s| &self.pinned[s]);
            r.resident_bytes_of(seqs.iter().copied())
                + distinct_checkpoint_bytes(engine.chain(pinned))
        });
        kv + rec
    }

    /// Bytes the parked sequences hold beyond what the running ones do:
    /// what clearing all of them would free. A fork shares its source's
    /// memory until it writes, so parked conversations with a common
    /// prefix take that prefix once, not once each.
    pub(super) fn cache_footprint(&self) -> usize {
        let running: Vec<SeqId> = (0..self.busy.len()).filter(|&s| self.busy[s]).collect();
        let mut all = running.clone();
        all.extend(self.cache.seqs());
        self.footprint(&all)
            .saturating_sub(self.footprint(&running))
    }

    /// Recomputes [`Worker::cached_bytes`] after the cache changed.
    pub(super) fn refresh_cache_bytes(&mut self) {
        self.cached_bytes = self.cache_footprint();
        metrics::set(&self.metrics.cached_bytes, self.cached_bytes);
    }

    /// Gives slot `s` back: parked in the cache (`keep`) or cleared.
    pub(super) fn release(&mut self, s: SeqId, keep: bool) {
        self.busy[s] = false;
        let tokens = match self.engine.mem.seq_tokens(s) {
            Ok(t) if keep && !t.is_empty() => t.to_vec(),
            _ => {
                let _ = self.engine.seq_clear(s);
                self.unpin_where(s, |_| false);
                self.refresh_cache_bytes();
                return;
            }
        };
        // Parked, it keeps the checkpoints of its last few tokens and a
        // coarser grid before them (its pins, prompt ends and branch
        // points, stay): the buffers of the others go back to the pool for
        // the running sequences instead of new memory being mapped (on
        // qwen35-0.8b-like, 13 states of 19 MB per parked conversation).
        if let Some(r) = &mut self.engine.mem.recurrent {
            let grid = PARKED_GRID * self.cfg.checkpoint_spacing.max(1);
            let _ = r.thin_parked(s, grid, grid);
        }
        self.cache.insert(s, &tokens);
        // Evicting a sequence frees only what nothing else shares, so the
        // total is measured again after each one.
        self.refresh_cache_bytes();
        while self.cached_bytes > self.cfg.cache_bytes {
            let Some(victim) = self.cache.lru(None) else {
                break;
            };
            self.evict(victim);
        }
    }

    /// Before a step whose sequences may each move their state into a
    /// fresh buffer (a checkpoint), in a memory that reserved state buffers
    /// at startup (`coil serve` does; without a reserve, memory is mapped
    /// as needed and the cache's byte budget alone bounds the parked
    /// sequences): when the pool holds fewer than `need` free, parked
    /// sequences give theirs back, least recently used first —
    /// first the buffers of their checkpoints but the first and the last
    /// (their pinned prompt ends stay, and a conversation still resumes at
    /// its end, or under fixed chunk positions at its newest aligned
    /// checkpoint, which stays too), then, if that is not enough, whole parked sequences, as a
    /// paged KV cache evicts cached prefixes for running requests. New
    /// memory is mapped only when no parked sequence is left to give way:
    /// mapping and zeroing fresh pages is slow in a VM (hybrid-350m-like
    /// Q8_0, 8 clients after 8 earlier conversations parked: 58 buffers of
    /// 22 MB mapped during one load, its time per token +40%; thinning
    /// alone still mapped 31). Without `evict` (at admission, when the
    /// parked sequence a request resumes from is not chosen yet) only the
    /// checkpoints are thinned.
    pub(super) fn make_room(&mut self, need: usize, evict: bool) {
        let free = |w: &Self| {
            w.engine
                .mem
                .recurrent
                .as_ref()
                .filter(|r| r.reserved_buffers() > 0)
                .map_or(usize::MAX, |r| r.free_buffers())
        };
        if free(self) >= need {
            return;
        }
        let mut parked: Vec<(u64, SeqId)> = self
            .cache
            .seqs()
            .map(|s| (self.cache.last_used(s).unwrap_or(0), s))
            .collect();
        parked.sort_unstable();
        let mut thinned = false;
        for &(_, s) in &parked {
            if let Some(r) = &mut self.engine.mem.recurrent {
                // a spacing past any position: only the first and the last stay
                thinned |= r.thin_parked(s, usize::MAX / 4, 0).unwrap_or(0) > 0;
            }
            if free(self) >= need {
                break;
            }
        }
        while evict && free(self) < need {
            let Some(victim) = self.cache.lru(None) else {
                break;
            };
            self.evict(victim);
        }
        if thinned {
            self.refresh_cache_bytes();
        }
    }

    pub(super) fn evict(&mut self, s: SeqId) {
        self.cache.remove(s);
        let _ = self.engine.seq_clear(s);
        self.unpin_where(s, |_| false);
        metrics::add(&self.metrics.cache_evictions, 1);
        self.refresh_cache_bytes();
    }

    /// A slot neither running nor parked.
    pub(super) fn unused_slot(&self) -> Option<SeqId> {
        (0..self.busy.len()).find(|&s| !self.busy[s] && !self.cache.contains(s))
    }

    /// An unused slot, evicting the least recently used parked sequence
    /// (other than `keep`) when there is none.
    pub(super) fn take_slot(&mut self, keep: Option<SeqId>) -> Option<SeqId> {
        if let Some(s) = self.unused_slot() {
            return Some(s);
        }
        let victim = self.cache.lru(keep)?;
        self.evict(victim);
        Some(victim)
    }
}
