//! One attention call's shared inputs, its work items (queries × a KV
//! head) and a work item's scratch.

use super::kv::{KvView, PB};

/// Queries per work item.
pub(super) const QB: usize = 16;
/// From this many (query, head) rows per item on, scores use a transposed
/// K block (vectorized over positions) instead of per-position dot products.
pub(super) const TRANSPOSE_ROWS: usize = 8;

/// Scratch of one work item.
#[derive(Default)]
pub(super) struct Scratch {
    pub(super) q: Vec<f32>,  // [rows][hd], pre-scaled
    pub(super) o: Vec<f32>,  // [rows][hd]
    pub(super) m: Vec<f32>,  // [rows]
    pub(super) l: Vec<f32>,  // [rows]
    pub(super) kt: Vec<f32>, // [hd][PB]
    pub(super) kb: Vec<f32>, // [PB][hd]
    pub(super) vb: Vec<f32>, // [PB][hd]
    pub(super) p: Vec<f32>,  // [rows][PB] (the tiled path's scores and probabilities)
}

/// The inputs of one call, shared by its work items.
#[derive(Clone, Copy)]
pub(super) struct Call<'a> {
    pub(super) q: &'a [f32],
    pub(super) n_heads: usize,
    pub(super) kv: &'a KvView<'a>,
    pub(super) kv_len: &'a [usize],
    /// Sliding window: query `t` sees positions `kv_len[t] − window ..
    /// kv_len[t]` only (`usize::MAX`: every position below its limit).
    pub(super) window: usize,
    pub(super) scale: f32,
    pub(super) out: *mut f32,
    /// Queries per work item: [`QB`], or 1 in batch-invariant mode where
    /// the per-row kernel serves (each query then computed exactly as when
    /// it is alone; the tiled kernel's rows are that already).
    pub(super) qb: usize,
}

/// A work item: queries `t0..t1`, KV head `kvh` and its query heads.
#[derive(Clone, Copy)]
pub(super) struct Item {
    pub(super) t0: usize,
    pub(super) t1: usize,
    pub(super) kvh: usize,
}

impl Call<'_> {
    /// Query heads per KV head.
    pub(super) fn group(&self) -> usize {
        self.n_heads / self.kv.n_kv_heads
    }

    /// (query, head) rows of `it`: row `(t − t0)·group + j` is query `t`,
    /// head `kvh·group + j`.
    pub(super) fn rows(&self, it: Item) -> usize {
        (it.t1 - it.t0) * self.group()
    }

    /// The causal limit of row `r` of `it`.
    pub(super) fn limit(&self, it: Item, r: usize) -> usize {
        self.kv_len[it.t0 + r / self.group()]
    }

    /// The first position row `r` of `it` sees (0 without a window).
    pub(super) fn start(&self, it: Item, r: usize) -> usize {
        self.limit(it, r).saturating_sub(self.window)
    }

    /// The first position any of `it`'s queries sees, rounded down to a
    /// block of [`PB`] positions (where the position loop starts).
    pub(super) fn first_block(&self, it: Item) -> usize {
        let lo = self.kv_len[it.t0..it.t1]
            .iter()
            .map(|l| l.saturating_sub(self.window))
            .min()
            .unwrap_or(0);
        lo - lo % PB
    }

    /// The longest limit among `it`'s queries.
    pub(super) fn max_len(&self, it: Item) -> usize {
        self.kv_len[it.t0..it.t1].iter().copied().max().unwrap_or(0)
    }
}

impl Scratch {
    /// Prepares the buffers for `it` with its rows padded to `rows_padded`:
    /// the queries scaled (padding rows zero), o and l zero, m −∞.
    pub(super) fn begin(&mut self, call: &Call, it: Item, rows_padded: usize) {
        let hd = call.kv.head_dim;
        let (group, rows) = (call.group(), call.rows(it));
        self.q.clear();
        self.q.resize(rows_padded * hd, 0.0);
        self.o.clear();
        self.o.resize(rows_padded * hd, 0.0);
        self.m.clear();
        self.m.resize(rows, f32::NEG_INFINITY);
        self.l.clear();
        self.l.resize(rows, 0.0);
        self.kt.resize(hd * PB, 0.0);
        self.kb.resize(PB * hd, 0.0);
        self.vb.resize(PB * hd, 0.0);
        for t in it.t0..it.t1 {
            for j in 0..group {
                let h = it.kvh * group + j;
                let r = (t - it.t0) * group + j;
                let src = &call.q[(t * call.n_heads + h) * hd..(t * call.n_heads + h + 1) * hd];
                for (d, s) in self.q[r * hd..(r + 1) * hd].iter_mut().zip(src) {
                    *d = s * call.scale;
                }
            }
        }
    }

    /// Writes `o / l` of every row of `it` to the output.
    ///
    /// # Safety
    /// `call.out` is valid for `[n_q, n_heads, head_dim]`, and `it`'s
    /// (query, head) outputs belong to this call only.
    pub(super) unsafe fn finish(&self, call: &Call, it: Item) {
        let hd = call.kv.head_dim;
        let group = call.group();
        for t in it.t0..it.t1 {
            for j in 0..group {
                let h = it.kvh * group + j;
                let r = (t - it.t0) * group + j;
                let inv = if self.l[r] > 0.0 {
                    1.0 / self.l[r]
                } else {
                    0.0
                };
                let dst =
                    std::slice::from_raw_parts_mut(call.out.add((t * call.n_heads + h) * hd), hd);
                for (d, v) in dst.iter_mut().zip(&self.o[r * hd..(r + 1) * hd]) {
                    *d = v * inv;
                }
            }
        }
    }
}
