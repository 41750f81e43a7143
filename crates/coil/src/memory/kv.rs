//! Attention KV cells: for each attention layer and each sequence, the keys
//! and values of every position it holds, `[n_pos, n_kv_head · head_dim]`
//! each, in f32. Grows with the sequence up to the context size.

use super::{MemoryError, SeqId, SequenceMemory};
use coil_kernels::ops::attention::{KvData, KvView};

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

/// Per layer: keys and values.
pub type LayerCells<'a> = (&'a [Vec<f32>], &'a [Vec<f32>]);

#[derive(Clone, Default)]
struct SeqCells {
    len: usize,
    k: Vec<Vec<f32>>,
    v: Vec<Vec<f32>>,
}

pub struct KvMemory {
    shapes: Vec<Option<KvLayerShape>>,
    seqs: Vec<SeqCells>,
    n_ctx: usize,
}

impl KvMemory {
    pub fn new(shapes: Vec<Option<KvLayerShape>>, n_seq_max: usize, n_ctx: usize) -> Self {
        let empty = SeqCells {
            len: 0,
            k: vec![Vec::new(); shapes.len()],
            v: vec![Vec::new(); shapes.len()],
        };
        KvMemory {
            shapes,
            seqs: vec![empty; n_seq_max.max(1)],
            n_ctx,
        }
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

    /// Bytes the cells would take with every sequence at the full context.
    pub fn max_bytes(&self) -> usize {
        self.bytes_per_token() * self.n_ctx * self.seqs.len()
    }

    fn shape(&self, layer: usize) -> Option<KvLayerShape> {
        self.shapes.get(layer).copied().flatten()
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
        let cells = &mut self.seqs[s];
        let want = cells.len * shape.row();
        // Drop anything a failed pass left behind past the committed length.
        cells.k[layer].truncate(want);
        cells.v[layer].truncate(want);
        cells.k[layer].extend_from_slice(k);
        cells.v[layer].extend_from_slice(v);
        Ok(())
    }

    /// Keys and values of every position `s` holds in `layer`, including
    /// those appended in the current pass.
    pub fn view(&self, layer: usize, s: SeqId) -> Result<Option<KvView<'_>>, MemoryError> {
        self.check(s)?;
        let Some(shape) = self.shape(layer) else {
            return Ok(None);
        };
        let c = &self.seqs[s];
        Ok(Some(KvView::dense(
            KvData::F32(&c.k[layer]),
            KvData::F32(&c.v[layer]),
            shape.n_kv_head,
            shape.head_dim,
        )))
    }

    /// The cells of `s`: per layer, keys and values `[len, row]` (empty for
    /// layers without attention).
    pub fn seq_cells(&self, s: SeqId) -> Result<LayerCells<'_>, MemoryError> {
        self.check(s)?;
        let c = &self.seqs[s];
        Ok((&c.k, &c.v))
    }

    /// Replaces the cells of `s` (loading a session). The caller checked
    /// the sizes with [`KvMemory::expected_len`].
    pub fn set_seq_cells(
        &mut self,
        s: SeqId,
        len: usize,
        k: Vec<Vec<f32>>,
        v: Vec<Vec<f32>>,
    ) -> Result<(), MemoryError> {
        self.check(s)?;
        self.seqs[s] = SeqCells { len, k, v };
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

    fn cut(&mut self, s: SeqId, p: usize) {
        let shapes = self.shapes.clone();
        let c = &mut self.seqs[s];
        c.len = c.len.min(p);
        for (l, shape) in shapes.iter().enumerate() {
            let keep = shape.map_or(0, |sh| c.len * sh.row());
            c.k[l].truncate(keep);
            c.v[l].truncate(keep);
            if c.len == 0 {
                c.k[l].shrink_to_fit();
                c.v[l].shrink_to_fit();
            }
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
            let copy = self.seqs[src].clone();
            self.seqs[dst] = copy;
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

    fn bytes(&self) -> usize {
        self.seqs
            .iter()
            .map(|c| {
                c.k.iter()
                    .chain(&c.v)
                    .map(|v| v.capacity() * 4)
                    .sum::<usize>()
            })
            .sum()
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
}
