//! The files of a split model in one contiguous range of memory, each part
//! at a page-aligned base: mapped side by side (`mmap` with `MAP_FIXED` into
//! one reserved range), or read into one anonymous allocation. Tensor views
//! then stay plain slices, whichever part holds them.

use super::{GgufError, Mode};
use memmap2::{MmapMut, MmapOptions};
use std::fs::File;
use std::ops::Range;
use std::path::{Path, PathBuf};

pub(super) struct Stitched {
    mem: Mem,
    ranges: Vec<Range<usize>>,
}

enum Mem {
    /// Every part mapped into one reserved range (unmapped as a whole).
    #[cfg(unix)]
    Mapped {
        ptr: *mut u8,
        len: usize,
        writable: bool,
    },
    /// Every part read into anonymous memory.
    Anon(MmapMut),
    Owned(Vec<u8>),
}

// SAFETY: the mapped range is owned by this value alone (unmapped on drop);
// shared access is read-only, writes need `&mut self`.
#[cfg(unix)]
unsafe impl Send for Stitched {}
#[cfg(unix)]
unsafe impl Sync for Stitched {}

/// Advises transparent huge pages for `map` (Linux; elsewhere nothing).
pub(super) fn advise_huge_pages(map: &mut MmapMut) {
    #[cfg(target_os = "linux")]
    {
        // no huge pages (disabled, none free) only means small ones
        let _ = map.advise(memmap2::Advice::HugePage);
    }
    #[cfg(not(target_os = "linux"))]
    let _ = map;
}

fn page_size() -> usize {
    #[cfg(unix)]
    {
        // SAFETY: sysconf has no preconditions.
        let p = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
        if p > 0 {
            return p as usize;
        }
    }
    4096
}

/// Bases of parts of `lens` bytes laid side by side at multiples of `page`.
fn layout(lens: &[usize], page: usize) -> (Vec<Range<usize>>, usize) {
    let mut at = 0usize;
    let ranges = lens
        .iter()
        .map(|&n| {
            let r = at..at + n;
            at = (at + n).div_ceil(page) * page;
            r
        })
        .collect();
    (ranges, at.max(page))
}

impl Stitched {
    /// Maps (or reads, for [`Mode::HugePages`]) the files at `paths`.
    pub(super) fn open(paths: &[PathBuf], mode: Mode) -> Result<Stitched, GgufError> {
        let io = |path: &Path| {
            let path = path.to_path_buf();
            move |error| GgufError::Io { path, error }
        };
        let mut files = Vec::with_capacity(paths.len());
        let mut lens = Vec::with_capacity(paths.len());
        for p in paths {
            let f = File::open(p).map_err(io(p))?;
            let len = f.metadata().map_err(io(p))?.len();
            let len = usize::try_from(len).map_err(|_| GgufError::Split {
                path: p.clone(),
                reason: "too large for this machine".into(),
            })?;
            if len == 0 {
                return Err(GgufError::Split {
                    path: p.clone(),
                    reason: "the part is empty".into(),
                });
            }
            files.push(f);
            lens.push(len);
        }
        let (ranges, total) = layout(&lens, page_size());
        #[cfg(unix)]
        if let Mode::Map(_) | Mode::Private = mode {
            return Self::map(&files, paths, ranges, total, mode);
        }
        let mut map = MmapOptions::new()
            .len(total)
            .map_anon()
            .map_err(io(&paths[0]))?;
        if mode == Mode::HugePages {
            advise_huge_pages(&mut map);
        }
        for ((f, r), p) in files.iter_mut().zip(&ranges).zip(paths) {
            std::io::Read::read_exact(f, &mut map[r.clone()]).map_err(io(p))?;
        }
        Ok(Stitched {
            mem: Mem::Anon(map),
            ranges,
        })
    }

    #[cfg(unix)]
    fn map(
        files: &[File],
        paths: &[PathBuf],
        ranges: Vec<Range<usize>>,
        total: usize,
        mode: Mode,
    ) -> Result<Stitched, GgufError> {
        use std::os::fd::AsRawFd;
        let io = |path: &Path| GgufError::Io {
            path: path.to_path_buf(),
            error: std::io::Error::last_os_error(),
        };
        // SAFETY: a fresh anonymous reservation, inaccessible until the
        // parts are mapped over it.
        let base = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                total,
                libc::PROT_NONE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
                -1,
                0,
            )
        };
        if base == libc::MAP_FAILED {
            return Err(io(&paths[0]));
        }
        let stitched = Stitched {
            mem: Mem::Mapped {
                ptr: base.cast(),
                len: total,
                writable: mode == Mode::Private,
            },
            ranges,
        };
        let (prot, share) = match mode {
            Mode::Private => (libc::PROT_READ | libc::PROT_WRITE, libc::MAP_PRIVATE),
            _ => (libc::PROT_READ, libc::MAP_SHARED),
        };
        #[cfg(target_os = "linux")]
        let populate = match mode {
            Mode::Map(true) | Mode::Private => libc::MAP_POPULATE,
            _ => 0,
        };
        #[cfg(not(target_os = "linux"))]
        let populate = 0;
        for ((f, r), p) in files.iter().zip(&stitched.ranges).zip(paths) {
            // SAFETY: the target lies inside the reservation owned by
            // `stitched` (MAP_FIXED replaces its pages there only); the
            // file is mapped read-only or copy-on-write, never written.
            let got = unsafe {
                libc::mmap(
                    base.cast::<u8>().add(r.start).cast(),
                    r.len(),
                    prot,
                    share | libc::MAP_FIXED | populate,
                    f.as_raw_fd(),
                    0,
                )
            };
            if got == libc::MAP_FAILED {
                return Err(io(p));
            }
        }
        Ok(stitched)
    }

    /// In-memory images of the parts, laid out as files would be.
    pub(super) fn from_images(images: &[Vec<u8>]) -> Result<Stitched, GgufError> {
        if images.is_empty() {
            return Err(GgufError::Split {
                path: PathBuf::new(),
                reason: "no parts".into(),
            });
        }
        let lens: Vec<usize> = images.iter().map(Vec::len).collect();
        let (ranges, total) = layout(&lens, 4096);
        let mut buf = vec![0u8; total];
        for (img, r) in images.iter().zip(&ranges) {
            buf[r.clone()].copy_from_slice(img);
        }
        Ok(Stitched {
            mem: Mem::Owned(buf),
            ranges,
        })
    }

    /// Each part's bytes within [`Stitched::bytes`].
    pub(super) fn ranges(&self) -> &[Range<usize>] {
        &self.ranges
    }

    pub(super) fn is_read_into_memory(&self) -> bool {
        matches!(self.mem, Mem::Anon(_))
    }

    pub(super) fn bytes(&self) -> &[u8] {
        match &self.mem {
            #[cfg(unix)]
            // SAFETY: the range is mapped (readable) for the life of self;
            // the gaps between parts lie beyond every part's last byte and
            // within its last page, or are never read (views stay within
            // `ranges`).
            Mem::Mapped { ptr, len, .. } => unsafe { std::slice::from_raw_parts(*ptr, *len) },
            Mem::Anon(m) => m,
            Mem::Owned(v) => v,
        }
    }

    pub(super) fn bytes_mut(&mut self) -> Option<&mut [u8]> {
        match &mut self.mem {
            #[cfg(unix)]
            // SAFETY: as in `bytes`; the map is private and writable.
            Mem::Mapped {
                ptr,
                len,
                writable: true,
            } => Some(unsafe { std::slice::from_raw_parts_mut(*ptr, *len) }),
            #[cfg(unix)]
            Mem::Mapped { .. } => None,
            Mem::Anon(m) => Some(m),
            Mem::Owned(v) => Some(v),
        }
    }
}

#[cfg(unix)]
impl Drop for Stitched {
    fn drop(&mut self) {
        if let Mem::Mapped { ptr, len, .. } = self.mem {
            // SAFETY: the reservation made in `map`, with every part mapped
            // into it; nothing borrows it any more.
            unsafe { libc::munmap(ptr.cast(), len) };
        }
    }
}
