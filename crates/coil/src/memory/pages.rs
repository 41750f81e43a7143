//! Copy-on-write pages of attention cells: the keys (or the values) of one
//! sequence in one attention layer, as a list of fixed-size pages. Each page
//! is an `Arc` shared by every fork that holds it; a fork clones the list,
//! not the cells. A page is written only while no other sequence holds it:
//! appending into a shared page first copies the part this sequence sees.

use std::collections::HashSet;
use std::sync::Arc;

/// Default positions per page: a multiple of the attention kernel's position
/// block (`coil_kernels::ops::KV_PAGE_ALIGN`), so the kernel reads pages in
/// place. 256 positions of a 1024-wide row are 1 MiB per page.
pub const PAGE_LEN: usize = 256;

/// Geometry of one layer's pages: `page_len` positions of `row` f32 each.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PageShape {
    pub page_len: usize,
    pub row: usize,
}

impl PageShape {
    fn page_elems(&self) -> usize {
        self.page_len * self.row
    }
}

/// One page: `[n, row]` f32, `n ≤ page_len`. Another sequence sharing it
/// may see fewer of its positions than it holds (after a truncation).
pub type Page = Arc<Vec<f32>>;

/// Keys or values of one sequence in one layer.
#[derive(Clone, Default, Debug)]
pub struct PagedCells {
    /// Page `i` holds positions `i·page_len ..`; exactly
    /// `n_pos.div_ceil(page_len)` pages.
    pages: Vec<Page>,
    /// Positions this sequence holds (and sees).
    n_pos: usize,
}

impl PagedCells {
    /// Cells cut into pages from a dense `[n_pos, row]` buffer (loading a
    /// session); a partial trailing row is ignored.
    pub fn from_dense(data: &[f32], sh: PageShape) -> Self {
        if sh.row == 0 || sh.page_len == 0 {
            return PagedCells::default();
        }
        let n_pos = data.len() / sh.row;
        PagedCells {
            pages: data[..n_pos * sh.row]
                .chunks(sh.page_elems())
                .map(|c| Arc::new(c.to_vec()))
                .collect(),
            n_pos,
        }
    }

    pub fn n_pos(&self) -> usize {
        self.n_pos
    }

    pub fn pages(&self) -> &[Page] {
        &self.pages
    }

    /// The cells in position order, one slice per page (`[n, row]`, the
    /// last page cut to the positions this sequence sees).
    pub fn slices(&self, sh: PageShape) -> Vec<&[f32]> {
        self.prefix(self.n_pos, sh)
    }

    /// The first `n` positions (at most all), one slice per page.
    pub fn prefix(&self, n: usize, sh: PageShape) -> Vec<&[f32]> {
        let n = n.min(self.n_pos);
        self.pages
            .iter()
            .take(n.div_ceil(sh.page_len.max(1)))
            .enumerate()
            .map(|(i, p)| {
                let m = (n - i * sh.page_len).min(sh.page_len);
                &p[..m * sh.row]
            })
            .collect()
    }

    /// Keeps positions `< p`: whole pages past it are dropped (freed when no
    /// other sequence holds them); the last one is shortened only if this
    /// sequence holds it alone, else just no longer seen.
    pub fn truncate(&mut self, p: usize, sh: PageShape) {
        if p >= self.n_pos {
            return;
        }
        self.n_pos = p;
        if p == 0 || sh.page_len == 0 {
            self.pages = Vec::new();
            self.n_pos = 0;
            return;
        }
        self.pages.truncate(p.div_ceil(sh.page_len));
        let keep = (p - (self.pages.len() - 1) * sh.page_len) * sh.row;
        if let Some(last) = self.pages.last_mut().and_then(Arc::get_mut) {
            last.truncate(keep);
        }
    }

    /// Appends positions (`[n, row]`), filling the last page and then new
    /// ones. A shared last page is copied first (only the part this
    /// sequence sees), so no other sequence's cells change.
    pub fn append(&mut self, data: &[f32], sh: PageShape) {
        if sh.row == 0 || sh.page_len == 0 {
            return;
        }
        debug_assert_eq!(data.len() % sh.row, 0);
        let mut rest = data;
        while !rest.is_empty() {
            let in_page = self.n_pos % sh.page_len;
            if in_page == 0 {
                self.pages.push(Arc::new(Vec::new()));
            }
            let room = (sh.page_len - in_page) * sh.row;
            let (now, later) = rest.split_at(room.min(rest.len()));
            // `pages` is non-empty: a page was pushed above or n_pos > 0.
            if let Some(last) = self.pages.last_mut() {
                writable(last, in_page * sh.row, now.len(), sh.page_elems()).extend_from_slice(now);
            }
            self.n_pos += now.len() / sh.row;
            rest = later;
        }
    }
}

/// The page for writing `add` elements after its first `keep`: in place
/// when no one else holds it (dropping anything past `keep`), else a
/// private copy of those `keep` elements. Room for `add` more is reserved,
/// growing geometrically but never past a full page (`full` elements), so a
/// full page holds no slack.
fn writable(page: &mut Page, keep: usize, add: usize, full: usize) -> &mut Vec<f32> {
    let room = |cap: usize| (keep + add).max(2 * cap).min(full).max(keep + add);
    if Arc::get_mut(page).is_none() {
        let mut own = Vec::with_capacity(room(keep));
        own.extend_from_slice(&page[..keep]);
        *page = Arc::new(own);
    }
    let v = Arc::make_mut(page); // unique here: never copies
    v.truncate(keep);
    if keep + add > v.capacity() {
        let want = room(v.capacity());
        v.reserve_exact(want - keep);
    }
    v
}

/// Bytes of pages, each page counted once however many sequences (and
/// layers' lists) hold it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PageStats {
    /// Distinct pages.
    pub pages: usize,
    /// Bytes of all distinct pages (their capacity).
    pub bytes: usize,
    /// Of those, pages held by more than one sequence, and their bytes.
    pub shared_pages: usize,
    pub shared_bytes: usize,
}

impl PageStats {
    /// Counts the distinct pages of `cells`.
    pub fn of<'a>(cells: impl IntoIterator<Item = &'a PagedCells>) -> Self {
        let mut seen: HashSet<*const Vec<f32>> = HashSet::new();
        let mut st = PageStats::default();
        for p in cells.into_iter().flat_map(|c| c.pages()) {
            if !seen.insert(Arc::as_ptr(p)) {
                continue;
            }
            let b = p.capacity() * 4;
            st.pages += 1;
            st.bytes += b;
            if Arc::strong_count(p) > 1 {
                st.shared_pages += 1;
                st.shared_bytes += b;
            }
        }
        st
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SH: PageShape = PageShape {
        page_len: 4,
        row: 2,
    };

    fn seq(n: usize, base: f32) -> Vec<f32> {
        (0..n * SH.row).map(|i| base + i as f32).collect()
    }

    fn flat(c: &PagedCells) -> Vec<f32> {
        c.slices(SH).concat()
    }

    #[test]
    fn append_fills_pages_and_truncate_drops_them() {
        let mut c = PagedCells::default();
        c.append(&seq(3, 0.0), SH);
        c.append(&seq(6, 100.0), SH);
        assert_eq!(c.n_pos(), 9);
        assert_eq!(c.pages().len(), 3);
        let want = [seq(3, 0.0), seq(6, 100.0)].concat();
        assert_eq!(flat(&c), want);
        // Full pages hold no slack.
        assert_eq!(c.pages()[0].capacity(), SH.page_len * SH.row);
        c.truncate(5, SH);
        assert_eq!(c.pages().len(), 2);
        assert_eq!(flat(&c), want[..10]);
        c.truncate(4, SH);
        assert_eq!(c.pages().len(), 1);
        c.truncate(0, SH);
        assert!(c.pages().is_empty());
        assert_eq!(PagedCells::from_dense(&want, SH).slices(SH).concat(), want);
        let mut odd = PagedCells::from_dense(&want[..3], SH);
        assert_eq!(odd.n_pos(), 1);
        odd.append(&seq(4, 0.0), SH);
        assert_eq!(flat(&odd), [&want[..2], &seq(4, 0.0)].concat());
    }

    #[test]
    fn forks_share_pages_and_copy_only_on_write() {
        let mut a = PagedCells::default();
        a.append(&seq(10, 0.0), SH);
        let a_before = flat(&a);
        let mut b = a.clone();
        let st = PageStats::of([&a, &b]);
        assert_eq!((st.pages, st.shared_pages), (3, 3));
        // Truncate into the shared second page, then append: `a` is unchanged.
        b.truncate(6, SH);
        b.append(&seq(3, 500.0), SH);
        assert_eq!(flat(&a), a_before);
        assert_eq!(flat(&b), [&a_before[..12], &seq(3, 500.0)].concat());
        // b holds page 0 of a, its own copy of page 1 and a new page 2.
        assert!(Arc::ptr_eq(&a.pages()[0], &b.pages()[0]));
        assert!(!Arc::ptr_eq(&a.pages()[1], &b.pages()[1]));
        let st = PageStats::of([&a, &b]);
        assert_eq!((st.pages, st.shared_pages), (5, 1));
        // The source appending into its shared last page copies it too.
        let c = a.clone();
        a.append(&seq(1, 900.0), SH);
        assert_eq!(flat(&c), a_before);
        assert_eq!(flat(&a), [&a_before[..], &seq(1, 900.0)].concat());
        // Once alone, a page is written in place.
        drop(c);
        let p = Arc::as_ptr(&a.pages()[2]);
        a.append(&seq(1, 901.0), SH);
        assert_eq!(Arc::as_ptr(&a.pages()[2]), p);
    }
}
