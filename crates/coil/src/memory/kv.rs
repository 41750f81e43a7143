//! Attention KV cells: for each attention layer and each sequence, the keys
//! and values of every position it holds, `[n_pos, n_kv_head · head_dim]`
//! each, in f32, in copy-on-write pages (see [`super::pages`]): a fork
//! shares its source's pages and copies at most the last, partly filled
//! page of each layer when it writes. Grows with the sequence up to the
//! context size. With [`CacheType::F16`] (`--cache-type f16`) the cells
//! are stored in f16 (attention still computes in f32): the pages are f32
//! words holding two f16 each, a position's row padded to whole words.

use super::pages::{PageShape, PageStats, PagedCells, PAGE_LEN};
use super::{MemoryError, SeqId, SequenceMemory};
use coil_kernels::ops::attention::{KvData, KvView, KV_PAGE_ALIGN};
use half::f16;
use half::slice::HalfFloatSliceExt;
use std::fmt;
use std::str::FromStr;

/// The element type of attention cells.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum CacheType {
    /// Exact: what the attention kernel computes with.
    #[default]
    F32,
    /// Half the bytes per position; rounded to nearest on write.
    F16,
}

impl CacheType {
    pub const ALL: [CacheType; 2] = [CacheType::F32, CacheType::F16];

    pub fn name(self) -> &'static str {
        match self {
            CacheType::F32 => "f32",
            CacheType::F16 => "f16",
        }
    }

    /// The byte that stands for this type in session files.
    pub fn code(self) -> u8 {
        match self {
            CacheType::F32 => 0,
            CacheType::F16 => 1,
        }
    }

    pub fn from_code(c: u8) -> Option<CacheType> {
        CacheType::ALL.into_iter().find(|t| t.code() == c)
    }

    /// f32 words one position of `row` values takes.
    pub fn words(self, row: usize) -> usize {
        match self {
            CacheType::F32 => row,
            CacheType::F16 => row.div_ceil(2),
        }
    }
}

impl fmt::Display for CacheType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// A cache type name that is not one of [`CacheType::ALL`].
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error("unknown cache type {0:?} (allowed: f32, f16)")]
pub struct UnknownCacheType(pub String);

impl FromStr for CacheType {
    type Err = UnknownCacheType;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let l = s.trim().to_ascii_lowercase();
        CacheType::ALL
            .into_iter()
            .find(|t| t.name() == l)
            .ok_or_else(|| UnknownCacheType(s.to_string()))
    }
}

/// The f16 values packed in `words` (two per word).
fn as_f16(words: &[f32]) -> &[f16] {
    // SAFETY: f32 words are at least as aligned as f16, hold twice as many
    // of them, and every bit pattern is valid for both types.
    unsafe { std::slice::from_raw_parts(words.as_ptr() as *const f16, words.len() * 2) }
}

fn as_f16_mut(words: &mut [f32]) -> &mut [f16] {
    // SAFETY: as in `as_f16`; the borrow is exclusive.
    unsafe { std::slice::from_raw_parts_mut(words.as_mut_ptr() as *mut f16, words.len() * 2) }
}

/// `[n, row]` f32 values as stored with `ty`: `[n, ty.words(row)]` words.
fn encode(ty: CacheType, row: usize, data: &[f32]) -> Vec<f32> {
    match ty {
        CacheType::F32 => data.to_vec(),
        CacheType::F16 => {
            let rw = ty.words(row);
            let n = data.len() / row.max(1);
            let mut out = vec![0f32; n * rw];
            for (src, dst) in data.chunks_exact(row).zip(out.chunks_exact_mut(rw)) {
                as_f16_mut(dst)[..row].convert_from_f32_slice(src);
            }
            out
        }
    }
}

/// Stored words of `[n, row]` values back as f32 (exact for f16).
fn decode(ty: CacheType, row: usize, words: &[f32]) -> Vec<f32> {
    match ty {
        CacheType::F32 => words.to_vec(),
        CacheType::F16 => {
            let rw = ty.words(row);
            let n = words.len() / rw.max(1);
            let mut out = vec![0f32; n * row];
            for (src, dst) in words.chunks_exact(rw).zip(out.chunks_exact_mut(row)) {
                as_f16(src)[..row].convert_to_f32_slice(dst);
            }
            out
        }
    }
}

/// Sizes of one attention layer's cells.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct KvLayerShape {
    pub n_kv_head: usize,
    pub head_dim: usize,
    /// Multi-head latent attention's compressed cache: each position's row
    /// (`[c_kv | k_rope]`) is its key, and its value is read from the same
    /// row (the latent's lanes), so no value cells are stored.
    pub latent: bool,
}

impl KvLayerShape {
    /// Keys and values of `n_kv_head` heads of `head_dim`.
    pub fn heads(n_kv_head: usize, head_dim: usize) -> Self {
        KvLayerShape {
            n_kv_head,
            head_dim,
            latent: false,
        }
    }

    /// A latent row of `width` values per position serving as key and value.
    pub fn latent(width: usize) -> Self {
        KvLayerShape {
            n_kv_head: 1,
            head_dim: width,
            latent: true,
        }
    }

    /// f32 elements per position for K (and for V).
    pub fn row(&self) -> usize {
        self.n_kv_head * self.head_dim
    }

    /// Rows stored per position: K and V, or the latent alone.
    fn stored_rows(&self) -> usize {
        if self.latent {
            1
        } else {
            2
        }
    }
}

/// One layer of one sequence, as slices of its pages in position order
/// (each `[n, words per row]`, see [`CacheType::words`]; empty for layers
/// without attention).
pub struct LayerSlices<'a> {
    pub k: Vec<&'a [f32]>,
    pub v: Vec<&'a [f32]>,
}

/// The pages of one layer of one sequence, borrowed for an attention call;
/// [`LayerPages::view`] is what the kernel reads.
pub struct LayerPages<'a> {
    k: Vec<&'a [f32]>,
    v: Vec<&'a [f32]>,
    /// The same pages as f16 (f16 cells only).
    k16: Vec<&'a [f16]>,
    v16: Vec<&'a [f16]>,
    page_len: usize,
    n_pos: usize,
    shape: KvLayerShape,
    ty: CacheType,
}

impl LayerPages<'_> {
    pub fn view(&self) -> KvView<'_> {
        let sh = self.shape;
        // A latent layer's values are its keys' pages.
        let (v, v16) = match sh.latent {
            true => (&self.k, &self.k16),
            false => (&self.v, &self.v16),
        };
        match self.ty {
            CacheType::F32 => KvView::paged(
                &self.k,
                v,
                self.page_len,
                self.n_pos,
                sh.n_kv_head,
                sh.head_dim,
            ),
            CacheType::F16 => KvView {
                k: KvData::PagedF16 {
                    pages: &self.k16,
                    page_len: self.page_len,
                },
                v: KvData::PagedF16 {
                    pages: v16,
                    page_len: self.page_len,
                },
                n_pos: self.n_pos,
                n_kv_heads: sh.n_kv_head,
                head_dim: sh.head_dim,
                // Rows padded to whole words.
                row_stride: 2 * self.ty.words(sh.row()),
            },
        }
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
    /// Layers whose cells may be written behind the sequence's length
    /// ([`KvMemory::with_deferred`]).
    deferred: Vec<bool>,
    seqs: Vec<SeqCells>,
    n_ctx: usize,
    page_len: usize,
    cache_type: CacheType,
}

impl KvMemory {
    pub fn new(shapes: Vec<Option<KvLayerShape>>, n_seq_max: usize, n_ctx: usize) -> Self {
        let empty = SeqCells {
            len: 0,
            k: vec![PagedCells::default(); shapes.len()],
            v: vec![PagedCells::default(); shapes.len()],
        };
        KvMemory {
            deferred: vec![false; shapes.len()],
            shapes,
            seqs: vec![empty; n_seq_max.max(1)],
            n_ctx,
            page_len: PAGE_LEN,
            cache_type: CacheType::F32,
        }
    }

    /// This memory with `layer`'s cells written behind the others (the
    /// NextN block's, which catch up later): [`KvMemory::append`] takes
    /// them from any position up to those the layer holds, also before the
    /// sequence's length.
    pub fn with_deferred(mut self, layer: usize) -> Self {
        if let Some(d) = self.deferred.get_mut(layer) {
            *d = true;
        }
        self
    }

    /// This memory, empty, with its cells stored as `ty`.
    pub fn with_cache_type(mut self, ty: CacheType) -> Self {
        for s in 0..self.seqs.len() {
            self.cut(s, 0);
        }
        self.cache_type = ty;
        self
    }

    pub fn cache_type(&self) -> CacheType {
        self.cache_type
    }

    /// Stored cells of `layer` for `n` positions of another type `from`
    /// (`[n, from.words(row)]` words, as a session holds them) in this
    /// memory's type; `None` if they are not that long.
    pub fn convert_cells(
        &self,
        layer: usize,
        from: CacheType,
        words: Vec<f32>,
    ) -> Option<Vec<f32>> {
        let row = self.shape(layer).map_or(0, |sh| sh.row());
        let fw = from.words(row);
        if fw == 0 {
            return words.is_empty().then_some(words);
        }
        if !words.len().is_multiple_of(fw) {
            return None;
        }
        if from == self.cache_type {
            return Some(words);
        }
        Some(encode(self.cache_type, row, &decode(from, row, &words)))
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

    /// Bytes one position takes over all attention layers (K and V, or a
    /// latent row).
    pub fn bytes_per_token(&self) -> usize {
        let ty = self.cache_type;
        self.shapes
            .iter()
            .flatten()
            .map(|s| s.stored_rows() * ty.words(s.row()) * 4)
            .sum()
    }

    /// Bytes of cells one position takes in `layer` (0 for a layer without
    /// attention).
    pub fn layer_bytes_per_token(&self, layer: usize) -> usize {
        self.shape(layer)
            .map_or(0, |s| s.stored_rows() * self.cache_type.words(s.row()) * 4)
    }

    /// The attention layers whose cells are a latent row (MLA).
    pub fn n_latent_layers(&self) -> usize {
        self.shapes.iter().flatten().filter(|s| s.latent).count()
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
            row: self.cache_type.words(sh.row()),
        }
    }

    /// Writes the keys and values of positions `pos..` (`[n, row]` each;
    /// `v` is ignored for a latent layer) of `s` in `layer`, dropping what
    /// the layer held from `pos` on. They become visible to
    /// [`KvMemory::view`] at once; the sequence length advances with
    /// [`KvMemory::advance`]. `pos` is the committed length in a forward
    /// pass (anything a failed pass left behind is dropped); a draft writes
    /// past it, each step behind the one before (positions `len..pos` must
    /// be held), and the next pass at `len` drops the draft's cells. A
    /// deferred layer ([`KvMemory::with_deferred`]) may also be written
    /// from before `len`.
    pub fn append(
        &mut self,
        layer: usize,
        s: SeqId,
        pos: usize,
        k: &[f32],
        v: &[f32],
    ) -> Result<(), MemoryError> {
        self.check(s)?;
        let Some(shape) = self.shape(layer) else {
            return Ok(());
        };
        debug_assert_eq!(k.len() % shape.row(), 0);
        let ps = self.page_shape(shape);
        let ty = self.cache_type;
        let n_ctx = self.n_ctx;
        let deferred = self.deferred[layer];
        let cells = &mut self.seqs[s];
        let held = cells.k[layer].n_pos();
        let n_new = k.len() / shape.row().max(1);
        let behind = pos < cells.len && !deferred;
        if behind || pos > held || pos + n_new > n_ctx {
            return Err(MemoryError::PositionMismatch {
                seq: s,
                have: cells.len,
                want: pos,
            });
        }
        cells.k[layer].truncate(pos, ps);
        cells.v[layer].truncate(pos, ps);
        match ty {
            CacheType::F32 => cells.k[layer].append(k, ps),
            CacheType::F16 => cells.k[layer].append(&encode(ty, shape.row(), k), ps),
        }
        if !shape.latent {
            match ty {
                CacheType::F32 => cells.v[layer].append(v, ps),
                CacheType::F16 => cells.v[layer].append(&encode(ty, shape.row(), v), ps),
            }
        }
        Ok(())
    }

    /// Keys and values of every position `s` holds in `layer`, including
    /// those appended in the current pass.
    pub fn view<'a>(
        &'a self,
        layer: usize,
        s: SeqId,
    ) -> Result<Option<LayerPages<'a>>, MemoryError> {
        self.check(s)?;
        let Some(shape) = self.shape(layer) else {
            return Ok(None);
        };
        let ps = self.page_shape(shape);
        let c = &self.seqs[s];
        let (k, v) = (c.k[layer].slices(ps), c.v[layer].slices(ps));
        let ty = self.cache_type;
        let halves = |p: &[&'a [f32]]| -> Vec<&'a [f16]> {
            match ty {
                CacheType::F32 => Vec::new(),
                CacheType::F16 => p.iter().map(|w| as_f16(w)).collect(),
            }
        };
        Ok(Some(LayerPages {
            k16: halves(&k),
            v16: halves(&v),
            k,
            v,
            page_len: self.page_len,
            n_pos: c.k[layer].n_pos(),
            shape,
            ty: self.cache_type,
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
                        v: match sh.latent {
                            true => Vec::new(),
                            false => c.v[l].prefix(c.len, ps),
                        },
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

    /// Words layer `layer` holds for `len` positions (K).
    pub fn expected_len(&self, layer: usize, len: usize) -> usize {
        self.shape(layer)
            .map_or(0, |sh| self.cache_type.words(sh.row()) * len)
    }

    /// Words of values layer `layer` holds for `len` positions (none for a
    /// latent layer).
    pub fn expected_v_len(&self, layer: usize, len: usize) -> usize {
        match self.shape(layer) {
            Some(sh) if sh.latent => 0,
            _ => self.expected_len(layer, len),
        }
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
        self.page_stats_of(0..self.seqs.len())
    }

    /// Pages held by the sequences `seqs` (those out of range are skipped),
    /// each counted once however many of them hold it: what those
    /// sequences take together. A page counts as shared when anything else
    /// holds it too, inside `seqs` or not.
    pub fn page_stats_of(&self, seqs: impl IntoIterator<Item = SeqId>) -> PageStats {
        PageStats::of(
            seqs.into_iter()
                .filter_map(|s| self.seqs.get(s))
                .flat_map(|c| c.k.iter().chain(&c.v)),
        )
    }

    fn cut(&mut self, s: SeqId, p: usize) {
        let (page_len, ty) = (self.page_len, self.cache_type);
        let c = &mut self.seqs[s];
        c.len = c.len.min(p);
        for (l, shape) in self.shapes.iter().enumerate() {
            let ps = PageShape {
                page_len,
                row: shape.map_or(0, |sh| ty.words(sh.row())),
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
        let sh = KvLayerShape::heads(1, 2);
        let mut m = KvMemory::new(vec![None, Some(sh)], 2, 10);
        assert_eq!(m.bytes_per_token(), 16);
        m.append(1, 0, 0, &[1., 2., 3., 4.], &[5., 6., 7., 8.])
            .unwrap();
        m.append(0, 0, 0, &[9.], &[9.]).unwrap();
        assert!(m.view(0, 0).unwrap().is_none());
        assert_eq!(m.view(1, 0).unwrap().unwrap().n_pos, 2);
        m.advance(0, 2).unwrap();
        m.seq_fork(0, 1).unwrap();
        m.seq_truncate(0, 1).unwrap();
        assert_eq!(m.seq_len(0), Ok(1));
        assert_eq!(m.view(1, 0).unwrap().unwrap().n_pos, 1);
        assert_eq!(m.view(1, 1).unwrap().unwrap().n_pos, 2);
        // An append after a failed (un-advanced) pass replaces the leftovers.
        m.append(1, 1, 2, &[0.; 2], &[0.; 2]).unwrap();
        m.append(1, 1, 2, &[0.; 2], &[0.; 2]).unwrap();
        assert_eq!(m.view(1, 1).unwrap().unwrap().n_pos, 3);
        // A draft writes past the committed length, each step behind the
        // one before; the next pass at the length drops it.
        m.append(1, 1, 3, &[1.; 2], &[1.; 2]).unwrap();
        assert_eq!(m.view(1, 1).unwrap().unwrap().n_pos, 4);
        assert!(m.append(1, 1, 5, &[1.; 2], &[1.; 2]).is_err(), "a gap");
        assert!(m.append(1, 1, 1, &[1.; 2], &[1.; 2]).is_err(), "committed");
        m.append(1, 1, 2, &[0.; 2], &[0.; 2]).unwrap();
        assert_eq!(m.view(1, 1).unwrap().unwrap().n_pos, 3);
        m.seq_keep(1).unwrap();
        assert_eq!(m.seq_len(0), Ok(0));
        assert!(m.seq_clear(2).is_err());
    }

    /// f16 cells: half the bytes, values rounded to f16, odd rows padded;
    /// the attention view reads them back, forks and truncation as in f32;
    /// stored words convert both ways.
    #[test]
    fn f16_cells_round_and_view_back() {
        let sh = KvLayerShape::heads(1, 3);
        let m32 = KvMemory::new(vec![Some(sh)], 2, 100);
        let mut m = KvMemory::new(vec![Some(sh)], 2, 100).with_cache_type(CacheType::F16);
        assert_eq!(m32.bytes_per_token(), 2 * 3 * 4);
        assert_eq!(m.bytes_per_token(), 2 * 2 * 4, "3 f16 padded to 2 words");
        let k = [1.0f32, 1.0 + 1.0 / 4096.0, -3.5, 65504.0, 1e-8, 0.1];
        let v = [0.5f32; 6];
        m.append(0, 0, 0, &k, &v).unwrap();
        m.advance(0, 2).unwrap();
        m.seq_fork(0, 1).unwrap();
        m.seq_truncate(0, 1).unwrap();
        let p = m.view(0, 1).unwrap().unwrap();
        let view = p.view();
        assert_eq!((view.n_pos, view.row_stride), (2, 4));
        let KvData::PagedF16 { pages, .. } = view.k else {
            panic!("f16 cells give an f16 view")
        };
        let got: Vec<f32> = [&pages[0][0..3], &pages[0][4..7]]
            .concat()
            .iter()
            .map(|x| x.to_f32())
            .collect();
        let want: Vec<f32> = k.iter().map(|x| f16::from_f32(*x).to_f32()).collect();
        assert_eq!(got, want);
        assert_eq!(got[1], 1.0, "rounded to nearest");
        assert_eq!(m.view(0, 0).unwrap().unwrap().n_pos, 1);
        // Stored words → f32 (exact) → f16 again: the same words.
        let words: Vec<f32> = m.seq_cells(1).unwrap()[0].k.concat();
        assert_eq!(m.expected_len(0, 2), words.len());
        let wide = m32.convert_cells(0, CacheType::F16, words.clone()).unwrap();
        assert_eq!(wide, want);
        assert_eq!(m.convert_cells(0, CacheType::F32, wide), Some(words));
        assert!(m.convert_cells(0, CacheType::F32, vec![0.0; 4]).is_none());
        assert_eq!("f16".parse(), Ok(CacheType::F16));
        let e = "q8_0".parse::<CacheType>().unwrap_err().to_string();
        assert!(e.contains("allowed: f32, f16"), "{e}");
    }

    /// All keys then all values `s` sees in `layer`, flat.
    fn cells(m: &KvMemory, layer: usize, s: SeqId) -> Vec<f32> {
        let p = m.view(layer, s).unwrap().unwrap();
        [p.k.concat(), p.v.concat()].concat()
    }

    #[test]
    fn forks_share_pages_and_writes_copy_on_write() {
        let sh = KvLayerShape::heads(2, 3);
        let row = sh.row();
        let mut m = KvMemory::new(vec![Some(sh), None, Some(sh)], 3, 1000).with_page_len(32);
        assert_eq!(m.page_len(), 32);
        let data =
            |n: usize, base: f32| -> Vec<f32> { (0..n * row).map(|i| base + i as f32).collect() };
        for l in [0, 2] {
            m.append(l, 0, 0, &data(70, 0.0), &data(70, 1e4)).unwrap();
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
            m.append(l, 1, 40, &data(5, -7.0), &data(5, -9.0)).unwrap();
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
            m.append(l, 0, 70, &data(1, 5e5), &data(1, 6e5)).unwrap();
        }
        m.advance(0, 1).unwrap();
        assert_eq!(cells(&m, 2, 2), a2);
        assert_eq!(m.view(2, 0).unwrap().unwrap().n_pos, 71);
        // Counted over some sequences: the shared first pages once.
        let (s0, s1) = (m.page_stats_of([0]), m.page_stats_of([1]));
        let both = m.page_stats_of([0, 1]);
        assert_eq!(both.bytes, s0.bytes + s1.bytes - 2 * 2 * page_bytes);
        assert_eq!(m.page_stats_of([0, 1, 2]), m.page_stats());
        assert_eq!(m.page_stats_of([1, 9]), s1);
        // Clearing the others frees what only they held.
        m.seq_keep(0).unwrap();
        assert_eq!(m.page_stats().shared_pages, 0);
        assert!(m.bytes() <= before + 2 * 2 * page_bytes, "{}", m.bytes());
    }
}
