//! Where keys and values are read from: contiguous or paged, f32 or f16,
//! and one block of a KV head's rows as f32.

use half::f16;

/// Key or value storage.
#[derive(Clone, Copy, Debug)]
pub enum KvData<'a> {
    F32(&'a [f32]),
    F16(&'a [f16]),
    /// f32 storage in pages of `page_len` positions (a multiple of
    /// [`KV_PAGE_ALIGN`]): page `i` holds positions `i·page_len ..`, laid out
    /// like a dense view (`[page_len, row_stride]`; the last page may be
    /// shorter). Read in place, never gathered.
    PagedF32 {
        pages: &'a [&'a [f32]],
        page_len: usize,
    },
    /// [`KvData::PagedF32`] with f16 storage (`--cache-type f16`): each
    /// block is widened to f32 as it is read.
    PagedF16 {
        pages: &'a [&'a [f16]],
        page_len: usize,
    },
}

/// Whether `pages` of `page_len` positions hold `n_pos` positions, given
/// the elements `need(n)` that `n` positions take.
fn pages_cover(
    lens: impl Iterator<Item = usize>,
    page_len: usize,
    n_pos: usize,
    need: impl Fn(usize) -> usize,
) -> bool {
    if page_len == 0 || !page_len.is_multiple_of(PB) {
        return false;
    }
    let n_pages = n_pos.div_ceil(page_len);
    let mut seen = 0;
    for (i, len) in lens.take(n_pages).enumerate() {
        if len < need((n_pos - i * page_len).min(page_len)) {
            return false;
        }
        seen += 1;
    }
    seen == n_pages
}

/// Page lengths of [`KvData::PagedF32`] must be multiples of this (the
/// kernel's position block, so that no block straddles two pages).
pub const KV_PAGE_ALIGN: usize = PB;

impl KvData<'_> {
    /// Whether the storage holds `n_pos` positions of `row` elements,
    /// `row_stride` apart.
    pub(super) fn covers(&self, n_pos: usize, row_stride: usize, row: usize) -> bool {
        // Elements needed to hold `n` positions.
        let need = |n: usize| {
            if n == 0 {
                0
            } else {
                (n - 1) * row_stride + row
            }
        };
        match self {
            KvData::F32(s) => s.len() >= need(n_pos),
            KvData::F16(s) => s.len() >= need(n_pos),
            KvData::PagedF32 { pages, page_len } => {
                pages_cover(pages.iter().map(|p| p.len()), *page_len, n_pos, need)
            }
            KvData::PagedF16 { pages, page_len } => {
                pages_cover(pages.iter().map(|p| p.len()), *page_len, n_pos, need)
            }
        }
    }
}

/// Keys and values of `n_pos` positions: element `(pos, kv_head, i)` of K
/// (and V) is at `pos * row_stride + kv_head * head_dim + i`.
#[derive(Clone, Copy, Debug)]
pub struct KvView<'a> {
    pub k: KvData<'a>,
    pub v: KvData<'a>,
    pub n_pos: usize,
    pub n_kv_heads: usize,
    pub head_dim: usize,
    /// Elements between consecutive positions (≥ n_kv_heads · head_dim).
    pub row_stride: usize,
}

impl<'a> KvView<'a> {
    /// A densely packed view: K and V are `[n_pos, n_kv_heads, head_dim]`
    /// (`F32` or `F16` storage; see [`KvView::paged`] for pages).
    pub fn dense(k: KvData<'a>, v: KvData<'a>, n_kv_heads: usize, head_dim: usize) -> Self {
        let row = n_kv_heads * head_dim;
        let len = match k {
            KvData::F32(s) => s.len(),
            KvData::F16(s) => s.len(),
            KvData::PagedF32 { pages, .. } => pages.iter().map(|p| p.len()).sum(),
            KvData::PagedF16 { pages, .. } => pages.iter().map(|p| p.len()).sum(),
        };
        let n_pos = len.checked_div(row).unwrap_or(0);
        KvView {
            k,
            v,
            n_pos,
            n_kv_heads,
            head_dim,
            row_stride: row,
        }
    }

    /// `n_pos` positions in pages of `page_len` positions (a multiple of
    /// [`KV_PAGE_ALIGN`]), each page of K and of V `[page_len, n_kv_heads,
    /// head_dim]` densely packed (the last one may be shorter).
    pub fn paged(
        k_pages: &'a [&'a [f32]],
        v_pages: &'a [&'a [f32]],
        page_len: usize,
        n_pos: usize,
        n_kv_heads: usize,
        head_dim: usize,
    ) -> Self {
        KvView {
            k: KvData::PagedF32 {
                pages: k_pages,
                page_len,
            },
            v: KvData::PagedF32 {
                pages: v_pages,
                page_len,
            },
            n_pos,
            n_kv_heads,
            head_dim,
            row_stride: n_kv_heads * head_dim,
        }
    }

    /// [`KvView::paged`] over f16 pages.
    pub fn paged_f16(
        k_pages: &'a [&'a [f16]],
        v_pages: &'a [&'a [f16]],
        page_len: usize,
        n_pos: usize,
        n_kv_heads: usize,
        head_dim: usize,
    ) -> Self {
        KvView {
            k: KvData::PagedF16 {
                pages: k_pages,
                page_len,
            },
            v: KvData::PagedF16 {
                pages: v_pages,
                page_len,
            },
            n_pos,
            n_kv_heads,
            head_dim,
            row_stride: n_kv_heads * head_dim,
        }
    }
}

impl KvView<'_> {
    /// Position `pos`'s key in KV head `kvh` as f32 (`buf`: `head_dim` of
    /// scratch, used where the storage is f16).
    pub fn k_row<'b>(&'b self, kvh: usize, pos: usize, buf: &'b mut [f32]) -> &'b [f32] {
        // One row lies in one page, wherever it starts.
        &kv_block(&self.k, self, kvh, pos, 1, buf).data[..self.head_dim]
    }

    /// [`KvView::k_row`] of the values.
    pub fn v_row<'b>(&'b self, kvh: usize, pos: usize, buf: &'b mut [f32]) -> &'b [f32] {
        &kv_block(&self.v, self, kvh, pos, 1, buf).data[..self.head_dim]
    }
}

/// Positions per block.
pub(super) const PB: usize = 32;
/// Rows `p0..p0+nb` of one KV head as f32 `[nb][hd]` (into `buf` if a
/// conversion is needed).
#[inline(always)]
pub(super) fn kv_block<'a>(
    src: &'a KvData,
    kv: &KvView,
    kvh: usize,
    p0: usize,
    nb: usize,
    buf: &'a mut [f32],
) -> KvRows<'a> {
    let hd = kv.head_dim;
    match src {
        KvData::F32(s) => KvRows {
            data: &s[p0 * kv.row_stride + kvh * hd..],
            stride: kv.row_stride,
        },
        KvData::PagedF32 { pages, page_len } => {
            // p0 is a multiple of PB, and page_len of PB: the block lies in
            // one page.
            let page = pages[p0 / page_len];
            KvRows {
                data: &page[(p0 % page_len) * kv.row_stride + kvh * hd..],
                stride: kv.row_stride,
            }
        }
        KvData::F16(s) => {
            use half::slice::HalfFloatSliceExt;
            for j in 0..nb {
                let off = (p0 + j) * kv.row_stride + kvh * hd;
                s[off..off + hd].convert_to_f32_slice(&mut buf[j * hd..(j + 1) * hd]);
            }
            KvRows {
                data: &buf[..nb * hd],
                stride: hd,
            }
        }
        KvData::PagedF16 { pages, page_len } => {
            use half::slice::HalfFloatSliceExt;
            // The block lies in one page (see `PagedF32`).
            let (page, at) = (pages[p0 / page_len], p0 % page_len);
            for j in 0..nb {
                let off = (at + j) * kv.row_stride + kvh * hd;
                page[off..off + hd].convert_to_f32_slice(&mut buf[j * hd..(j + 1) * hd]);
            }
            KvRows {
                data: &buf[..nb * hd],
                stride: hd,
            }
        }
    }
}

pub(super) struct KvRows<'a> {
    pub(super) data: &'a [f32],
    pub(super) stride: usize,
}

impl KvRows<'_> {
    #[inline(always)]
    pub(super) fn row(&self, j: usize, hd: usize) -> &[f32] {
        &self.data[j * self.stride..j * self.stride + hd]
    }
}
