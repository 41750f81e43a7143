//! Attention KV cells: for each attention layer and each sequence, the keys
//! and values of every position it holds, `[n_pos, n_kv_head · head_dim]`
//! each, in f32, in copy-on-write pages (see [`super::pages`]): a fork
//! shares its source's pages and copies at most the last, partly filled
//! page of each layer when it writes. Grows with the sequence up to the
//! context size.

use super::pages::{PageShape, PageStats, PagedCells, PAGE_LEN};
use super::{MemoryError, SeqId, SequenceMemory};
use coil_kernels::ops::attention::{KvView, KV_PAGE_ALIGN};

/// Sizes of one attention layer's cells.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct KvLayerShape {
    pub n_kv_head: usize,
    pub head_dim: usize,
}

impl KvLayerShape {
    /// f32 elements per position for K (and for V).
    pub fn row(&self) -> usize {
        self.n_kv_head * self.head_dim
    }
}

/// One layer of one sequence, as slices of its pages in position order
/// (each `[n, row]`; empty for layers without attention).
pub struct LayerSlices<'a> {
    pub k: Vec<&'a [f32]>,
    pub v: Vec<&'a [f32]>,
}

/// The pages of one layer of one sequence, borrowed for an attention call;
/// [`LayerPages::view`] is what the kernel reads.
pub struct LayerPages<'a> {
    k: Vec<&'a [f32]>,
    v: Vec<&'a [f32]>,
    page_len: usize,
    n_pos: usize,
    shape: KvLayerShape,
}

impl LayerPages<'_> {
    pub fn view(&self) -> KvView<'_> {
        KvView::paged(
            &self.k,
            &self.v,
            self.page_len,
            self.n_pos,
            self.shape.n_kv_head,
            self.shape.head_dim,
        )
    }
}

#[derive(Clone, Default)]
struct SeqCells {
    /// Committed length (positions every layer went through).
    len: usize,
    /// Per layer (empty for layers without attention); a layer may hold
    /// more than `len` positions during a pass.
    k: Vec<PagedCells>,
    v: Vec<PagedCells>,
}

pub struct KvMemory {
    shapes: Vec<Option<KvLayerShape>>,
    seqs: Vec<SeqCells>,
    n_ctx: usize,
    page_len: usize,
}

impl KvMemory {
    pub fn new(shapes: Vec<Option<KvLayerShape>>, n_seq_max: usize, n_ctx: usize) -> Self {
        let empty = SeqCells {
            len: 0,
            k: vec![PagedCells::default(); shapes.len()],
            v: vec![PagedCells::default(); shapes.len()],
        };
        KvMemory {
            shapes,
            seqs: vec![empty; n_seq_max.max(1)],
            n_ctx,
            page_len: PAGE_LEN,
        }
    }

    /// The same with pages of `page_len` positions, rounded up to a
    /// multiple of the attention kernel's position block (tests use small
    /// pages to exercise page boundaries).
    pub fn with_page_len(mut self, page_len: usize) -> Self {
        let pl = page_len.max(1).div_ceil(KV_PAGE_ALIGN) * KV_PAGE_ALIGN;
        if pl != self.page_len {
            for s in 0..self.seqs.len() {
                self.cut(s, 0);
            }
            self.page_len = pl;
        }
        self
    }

    pub fn page_len(&self) -> usize {
        self.page_len
    }

    fn check(&self, s: SeqId) -> Result<(), MemoryError> {
        if s >= self.seqs.len() {
            return Err(MemoryError::SeqOutOfRange {
                seq: s,
                n_seq_max: self.seqs.len(),
            });
        }
        Ok(())
    }

    /// Bytes one position takes over all attention layers (K and V).
    pub fn bytes_per_token(&self) -> usize {
        self.shapes.iter().flatten().map(|s| 2 * s.row() * 4).sum()
    }

    /// Bytes the cells would take with every sequence at the full context
    /// (and no page shared).
    pub fn max_bytes(&self) -> usize {
        self.bytes_per_token() * self.n_ctx * self.seqs.len()
    }

    fn shape(&self, layer: usize) -> Option<KvLayerShape> {
        self.shapes.get(layer).copied().flatten()
    }

    fn page_shape(&self, sh: KvLayerShape) -> PageShape {
        PageShape {
            page_len: self.page_len,
            row: sh.row(),
        }
    }

    /// Appends the keys and values of new positions (`[n, row]` each) of
    /// `s` in `layer`. They become visible to [`KvMemory::view`] at once;
    /// the sequence length advances with [`KvMemory::advance`].
    pub fn append(
        &mut self,
        layer: usize,
        s: SeqId,
        k: &[f32],
        v: &[f32],
    ) -> Result<(), MemoryError> {
        self.check(s)?;
        let Some(shape) = self.shape(layer) else {
            return Ok(());
        };
        debug_assert_eq!(k.len() % shape.row(), 0);
        let ps = self.page_shape(shape);
        let cells = &mut self.seqs[s];
        // Drop anything a failed pass left behind past the committed length.
        cells.k[layer].truncate(cells.len, ps);
        cells.v[layer].truncate(cells.len, ps);
        cells.k[layer].append(k, ps);
        cells.v[layer].append(v, ps);
        Ok(())
    }

    /// Keys and values of every position `s` holds in `layer`, including
    /// those appended in the current pass.
    pub fn view(&self, layer: usize, s: SeqId) -> Result<Option<LayerPages<'_>>, MemoryError> {
        self.check(s)?;
        let Some(shape) = self.shape(layer) else {
            return Ok(None);
        };
        let ps = self.page_shape(shape);
        let c = &self.seqs[s];
        Ok(Some(LayerPages {
            k: c.k[layer].slices(ps),
            v: c.v[layer].slices(ps),
            page_len: self.page_len,
            n_pos: c.k[layer].n_pos(),
            shape,
        }))
    }

    /// The committed cells of `s`, per layer: keys and values, `[len, row]`
    /// in all, as slices of their pages (saving a session).
    pub fn seq_cells(&self, s: SeqId) -> Result<Vec<LayerSlices<'_>>, MemoryError> {
        self.check(s)?;
        let c = &self.seqs[s];
        Ok((0..self.shapes.len())
            .map(|l| match self.shape(l) {
                Some(sh) => {
                    let ps = self.page_shape(sh);
                    LayerSlices {
                        k: c.k[l].prefix(c.len, ps),
                        v: c.v[l].prefix(c.len, ps),
                    }
                }
                None => LayerSlices {
                    k: Vec::new(),
                    v: Vec::new(),
                },
            })
            .collect())
    }

    /// Replaces the cells of `s` (loading a session) with dense `[len, row]`
    /// keys and values per layer. The caller checked the sizes with
    /// [`KvMemory::expected_len`].
    pub fn set_seq_cells(
        &mut self,
        s: SeqId,
        len: usize,
        k: Vec<Vec<f32>>,
        v: Vec<Vec<f32>>,
    ) -> Result<(), MemoryError> {
        self.check(s)?;
        let page = |l: usize, data: &[f32]| match self.shape(l) {
            Some(sh) => PagedCells::from_dense(data, self.page_shape(sh)),
            None => PagedCells::default(),
        };
        let n = self.shapes.len();
        let kp: Vec<PagedCells> = (0..n)
            .map(|l| page(l, k.get(l).map_or(&[], |x| x)))
            .collect();
        let vp: Vec<PagedCells> = (0..n)
            .map(|l| page(l, v.get(l).map_or(&[], |x| x)))
            .collect();
        self.seqs[s] = SeqCells { len, k: kp, v: vp };
        Ok(())
    }

    /// Elements layer `layer` holds for `len` positions (K or V).
    pub fn expected_len(&self, layer: usize, len: usize) -> usize {
        self.shape(layer).map_or(0, |sh| sh.row() * len)
    }

    pub fn n_layer(&self) -> usize {
        self.shapes.len()
    }

    pub fn advance(&mut self, s: SeqId, n: usize) -> Result<(), MemoryError> {
        self.check(s)?;
        self.seqs[s].len += n;
        Ok(())
    }

    /// Pages held, each counted once: how much of the cells forks share.
    pub fn page_stats(&self) -> PageStats {
        PageStats::of(self.seqs.iter().flat_map(|c| c.k.iter().chain(&c.v)))
    }

    fn cut(&mut self, s: SeqId, p: usize) {
        let page_len = self.page_len;
        let c = &mut self.seqs[s];
        c.len = c.len.min(p);
        for (l, shape) in self.shapes.iter().enumerate() {
            let ps = PageShape {
                page_len,
                row: shape.map_or(0, |sh| sh.row()),
            };
            c.k[l].truncate(c.len, ps);
            c.v[l].truncate(c.len, ps);
        }
    }
}

impl SequenceMemory for KvMemory {
    fn n_seq_max(&self) -> usize {
        self.seqs.len()
    }

    fn seq_len(&self, s: SeqId) -> Result<usize, MemoryError> {
        self.check(s)?;
        Ok(self.seqs[s].len)
    }

    fn seq_clear(&mut self, s: SeqId) -> Result<(), MemoryError> {
        self.check(s)?;
        self.cut(s, 0);
        Ok(())
    }

    fn seq_truncate(&mut self, s: SeqId, p: usize) -> Result<(), MemoryError> {
        self.check(s)?;
        self.cut(s, p);
        Ok(())
    }

    fn seq_fork(&mut self, src: SeqId, dst: SeqId) -> Result<(), MemoryError> {
        self.check(src)?;
        self.check(dst)?;
        if src != dst {
            // Shares the pages: no cell is copied here. Positions a failed
            // pass left past the committed length are not taken along.
            let copy = self.seqs[src].clone();
            self.seqs[dst] = copy;
            let len = self.seqs[dst].len;
            self.cut(dst, len);
        }
        Ok(())
    }

    fn seq_keep(&mut self, s: SeqId) -> Result<(), MemoryError> {
        self.check(s)?;
        for o in 0..self.seqs.len() {
            if o != s {
                self.cut(o, 0);
            }
        }
        Ok(())
    }

    /// Each page once, however many sequences share it.
    fn bytes(&self) -> usize {
        self.page_stats().bytes
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn append_view_truncate_fork() {
        let sh = KvLayerShape {
            n_kv_head: 1,
            head_dim: 2,
        };
        let mut m = KvMemory::new(vec![None, Some(sh)], 2, 10);
        assert_eq!(m.bytes_per_token(), 16);
        m.append(1, 0, &[1., 2., 3., 4.], &[5., 6., 7., 8.])
            .unwrap();
        m.append(0, 0, &[9.], &[9.]).unwrap();
        assert!(m.view(0, 0).unwrap().is_none());
        assert_eq!(m.view(1, 0).unwrap().unwrap().n_pos, 2);
        m.advance(0, 2).unwrap();
        m.seq_fork(0, 1).unwrap();
        m.seq_truncate(0, 1).unwrap();
        assert_eq!(m.seq_len(0), Ok(1));
        assert_eq!(m.view(1, 0).unwrap().unwrap().n_pos, 1);
        assert_eq!(m.view(1, 1).unwrap().unwrap().n_pos, 2);
        // An append after a failed (un-advanced) pass replaces the leftovers.
        m.append(1, 1, &[0.; 2], &[0.; 2]).unwrap();
        m.append(1, 1, &[0.; 2], &[0.; 2]).unwrap();
        assert_eq!(m.view(1, 1).unwrap().unwrap().n_pos, 3);
        m.seq_keep(1).unwrap();
        assert_eq!(m.seq_len(0), Ok(0));
        assert!(m.seq_clear(2).is_err());
    }

    /// All keys then all values `s` sees in `layer`, flat.
    fn cells(m: &KvMemory, layer: usize, s: SeqId) -> Vec<f32> {
        let p = m.view(layer, s).unwrap().unwrap();
        [p.k.concat(), p.v.concat()].concat()
    }

    #[test]
    fn forks_share_pages_and_writes_copy_on_write() {
        let sh = KvLayerShape {
            n_kv_head: 2,
            head_dim: 3,
        };
        let row = sh.row();
        let mut m = KvMemory::new(vec![Some(sh), None, Some(sh)], 3, 1000).with_page_len(32);
        assert_eq!(m.page_len(), 32);
        let data =
            |n: usize, base: f32| -> Vec<f32> { (0..n * row).map(|i| base + i as f32).collect() };
        for l in [0, 2] {
            m.append(l, 0, &data(70, 0.0), &data(70, 1e4)).unwrap();
        }
        m.advance(0, 70).unwrap();
        let (a0, a2) = (cells(&m, 0, 0), cells(&m, 2, 0));
        let page_bytes = 32 * row * 4;
        let before = m.bytes();
        // 3 pages per layer (the last partly filled), K and V.
        assert_eq!(m.page_stats().pages, 2 * 2 * 3);
        m.seq_fork(0, 1).unwrap();
        assert_eq!(m.bytes(), before, "a fork copies no cells");
        assert_eq!(m.page_stats().shared_bytes, m.bytes());
        assert_eq!(cells(&m, 2, 1), a2);

        // Truncate the fork into its shared second page, then append: the
        // source's cells do not change.
        m.seq_truncate(1, 40).unwrap();
        for l in [0, 2] {
            m.append(l, 1, &data(5, -7.0), &data(5, -9.0)).unwrap();
        }
        m.advance(1, 5).unwrap();
        assert_eq!(cells(&m, 0, 0), a0);
        assert_eq!(cells(&m, 2, 0), a2);
        let want_k = [&data(70, 0.0)[..40 * row], &data(5, -7.0)].concat();
        let want_v = [&data(70, 1e4)[..40 * row], &data(5, -9.0)].concat();
        assert_eq!(cells(&m, 2, 1), [want_k, want_v].concat());
        // The copy: one page per layer for K and for V, nothing more.
        assert!(m.bytes() <= before + 2 * 2 * page_bytes, "{}", m.bytes());
        // The first page is still shared; the source's last pages are its own.
        let st = m.page_stats();
        assert_eq!(st.shared_pages, 2 * 2);

        // The source appends into a page its fork holds: copy, not overwrite.
        m.seq_fork(0, 2).unwrap();
        for l in [0, 2] {
            m.append(l, 0, &data(1, 5e5), &data(1, 6e5)).unwrap();
        }
        m.advance(0, 1).unwrap();
        assert_eq!(cells(&m, 2, 2), a2);
        assert_eq!(m.view(2, 0).unwrap().unwrap().n_pos, 71);
        // Clearing the others frees what only they held.
        m.seq_keep(0).unwrap();
        assert_eq!(m.page_stats().shared_pages, 0);
        assert!(m.bytes() <= before + 2 * 2 * page_bytes, "{}", m.bytes());
    }
}
