//! GGUF files: [`GgufFile`] reads one (memory-mapped, zero-copy tensor
//! views), [`GgufWriter`] writes one (streaming tensor data to disk).
//!
//! Layout (little-endian): magic "GGUF", u32 version (2 or 3), u64 tensor
//! count, u64 metadata count, the metadata key/values, the tensor infos
//! (name, n_dims, `ne[n_dims]`, ggml type, offset relative to the data
//! section), padding to `general.alignment` (default 32), tensor data.
//!
//! A split model (see [`split`]) opens as one [`GgufFile`]: every part is
//! mapped (or read) into one contiguous range of memory, each at a
//! page-aligned base, so that a tensor's bytes are one slice wherever its
//! part lies.

mod reader;
pub mod split;
mod stitch;
mod value;
mod writer;

pub use reader::DEFAULT_ALIGNMENT;
pub use split::{SplitLimits, SplitWriter};
pub use value::{Metadata, Value, ValueType};
pub use writer::{encode_header, GgufWriter, TensorSpec};

use crate::dtype::GgmlType;
use memmap2::{Mmap, MmapMut, MmapOptions};
use std::fs::File;
use std::path::{Path, PathBuf};

pub const GGUF_MAGIC: [u8; 4] = *b"GGUF";
/// ggml tensors have at most 4 dimensions.
pub const MAX_DIMS: usize = 4;

#[derive(Debug, thiserror::Error)]
pub enum GgufError {
    #[error("cannot read or write {path}: {error}")]
    Io {
        path: PathBuf,
        // Shown in the message; not chained as a source, so that error
        // chains do not repeat it.
        error: std::io::Error,
    },
    #[error("I/O error: {0}")]
    Write(#[from] std::io::Error),
    #[error("not a GGUF file (magic bytes {0:02x?}, expected \"GGUF\")")]
    BadMagic([u8; 4]),
    #[error("GGUF version {0} is not supported (only versions 2 and 3)")]
    UnsupportedVersion(u32),
    #[error("big-endian GGUF files are not supported")]
    BigEndian,
    #[error("file truncated: {field} at byte offset {offset} needs {need} bytes, {have} left")]
    Truncated {
        field: String,
        offset: u64,
        need: u64,
        have: u64,
    },
    #[error("invalid {field} at byte offset {offset}: {reason}")]
    Invalid {
        field: String,
        offset: u64,
        reason: String,
    },
    #[error("tensor {name:?}: data at byte offset {offset} of {n_bytes} bytes runs past the end of the file ({file_len} bytes)")]
    TensorOutOfBounds {
        name: String,
        offset: u64,
        n_bytes: u64,
        file_len: u64,
    },
    #[error("tensor {name:?}: {reason}")]
    Tensor { name: String, reason: String },
    #[error("no tensor named {0:?}")]
    MissingTensor(String),
    /// An error in one part of a split model, naming the part.
    #[error("{}: {error}", path.display())]
    Part {
        path: PathBuf,
        error: Box<GgufError>,
    },
    #[error("split model, {}: {reason}", path.display())]
    Split { path: PathBuf, reason: String },
}

/// One tensor's entry in the header.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TensorInfo {
    pub name: String,
    /// ggml order: `dims[0]` (ne0) is the contiguous, innermost dimension.
    pub dims: Vec<u64>,
    pub ty: GgmlType,
    /// Offset from the start of the data section.
    pub offset: u64,
    pub n_elements: u64,
    pub n_bytes: u64,
    /// The part of a split model holding the tensor ([`GgufFile::parts`];
    /// 0 in a file that is not split).
    pub part: usize,
}

impl TensorInfo {
    /// `dims` padded with 1s to 4 entries.
    pub fn ne(&self) -> [u64; MAX_DIMS] {
        let mut ne = [1u64; MAX_DIMS];
        ne[..self.dims.len()].copy_from_slice(&self.dims);
        ne
    }

    /// Number of rows (elements / ne0) and row length (ne0).
    pub fn rows_cols(&self) -> (u64, u64) {
        let cols = self.dims.first().copied().unwrap_or(1);
        if cols == 0 {
            return (0, 0);
        }
        (self.n_elements / cols, cols)
    }
}

enum Storage {
    Mmap(Mmap),
    /// A copy-on-write map: pages written to become private memory, the
    /// file is never written.
    Private(MmapMut),
    /// The file read into anonymous memory (huge pages where given).
    Anon(MmapMut),
    Owned(Vec<u8>),
    /// The parts of a split model mapped side by side.
    Stitched(stitch::Stitched),
}

impl Storage {
    fn bytes(&self) -> &[u8] {
        match self {
            Storage::Mmap(m) => m,
            Storage::Private(m) | Storage::Anon(m) => m,
            Storage::Owned(v) => v,
            Storage::Stitched(s) => s.bytes(),
        }
    }

    fn bytes_mut(&mut self) -> Option<&mut [u8]> {
        match self {
            Storage::Mmap(_) => None,
            Storage::Private(m) | Storage::Anon(m) => Some(m),
            Storage::Owned(v) => Some(v),
            Storage::Stitched(s) => s.bytes_mut(),
        }
    }
}

/// One file of a model: the whole of it, or one part of a split model.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Part {
    /// `None` for an image parsed from memory.
    pub path: Option<PathBuf>,
    /// Where the part starts in [`GgufFile::bytes`].
    pub base: u64,
    /// The part's length in bytes.
    pub len: u64,
    /// Its data section's offset from the part's start.
    pub data_offset: u64,
    pub n_tensors: usize,
}

/// How a file's bytes come into memory.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Mode {
    /// A read-only map; `true`: every page read up front.
    Map(bool),
    /// A copy-on-write map, read up front.
    Private,
    /// Read into anonymous memory advised for huge pages.
    HugePages,
}

/// An open GGUF file. Tensor data stays in the memory map; views borrow it.
pub struct GgufFile {
    storage: Storage,
    version: u32,
    metadata: Metadata,
    tensors: Vec<TensorInfo>,
    alignment: u64,
    parts: Vec<Part>,
    /// Per tensor: its bytes were rewritten in memory by the loader (a
    /// kernel's layout, see [`GgufFile::tensor_data_mut`]).
    rewritten: Vec<bool>,
}

impl GgufFile {
    /// Opens and validates a GGUF file, memory-mapping its data; pages are
    /// mapped as they are first read. A part of a split model opens the
    /// whole model (every part, found by llama.cpp's naming).
    pub fn open(path: impl AsRef<Path>) -> Result<GgufFile, GgufError> {
        Self::open_as(path.as_ref(), Mode::Map(false))
    }

    /// [`GgufFile::open`] with every page of the file mapped up front
    /// (`MAP_POPULATE` on Linux, as llama.cpp maps its models): the file is
    /// read into the page cache now, and the first forward pass takes no
    /// page fault on the weights (~3,500 faults, 0.2 s of CPU on the first
    /// request of a server with a 225 MB file). For model loading; tools
    /// that read metadata or a few tensors use [`GgufFile::open`].
    pub fn open_prefaulted(path: impl AsRef<Path>) -> Result<GgufFile, GgufError> {
        Self::open_as(path.as_ref(), Mode::Map(true))
    }

    /// [`GgufFile::open_prefaulted`] with a copy-on-write map, so that
    /// the loader may rewrite tensors in memory ([`GgufFile::tensor_data_mut`];
    /// the file itself is never written).
    pub fn open_prefaulted_private(path: impl AsRef<Path>) -> Result<GgufFile, GgufError> {
        Self::open_as(path.as_ref(), Mode::Private)
    }

    /// The whole file read into anonymous memory advised for transparent
    /// huge pages (`madvise(MADV_HUGEPAGE)` on Linux), so that the kernels
    /// stream the weights through 2 MiB pages instead of the page cache's
    /// 4 KiB ones; the loader may rewrite tensors in it as in
    /// [`GgufFile::open_prefaulted_private`].
    pub fn open_in_huge_pages(path: impl AsRef<Path>) -> Result<GgufFile, GgufError> {
        Self::open_as(path.as_ref(), Mode::HugePages)
    }

    /// Whether the tensor data was read into memory by
    /// [`GgufFile::open_in_huge_pages`] (not a map of the file).
    pub fn is_read_into_memory(&self) -> bool {
        match &self.storage {
            Storage::Anon(_) => true,
            Storage::Stitched(s) => s.is_read_into_memory(),
            _ => false,
        }
    }

    /// The files of the model at `path`: itself, or every part of the
    /// split model it belongs to.
    pub fn model_files(path: impl AsRef<Path>) -> Result<Vec<PathBuf>, GgufError> {
        let path = path.as_ref();
        let first = Self::open_one(path, Mode::Map(false))?;
        match split::split_keys(&first.metadata, path)? {
            None => Ok(vec![path.to_path_buf()]),
            Some((no, count, _)) => split::find_parts(path, no, count),
        }
    }

    fn open_as(path: &Path, mode: Mode) -> Result<GgufFile, GgufError> {
        // The header first (a lazy map: only its pages are read), to know
        // whether the file is one part of several.
        let probe = Self::open_one(path, Mode::Map(false))?;
        let Some((no, count, _)) = split::split_keys(&probe.metadata, path)? else {
            return match mode {
                Mode::Map(false) => Ok(probe),
                _ => {
                    drop(probe);
                    Self::open_one(path, mode)
                }
            };
        };
        drop(probe);
        let paths = split::find_parts(path, no, count)?;
        let parts = stitch::Stitched::open(&paths, mode)?;
        Self::from_stitched(parts, &paths)
    }

    /// One file, whatever its split keys say.
    fn open_one(path: &Path, mode: Mode) -> Result<GgufFile, GgufError> {
        let io = |error| GgufError::Io {
            path: path.to_path_buf(),
            error,
        };
        let file = File::open(path).map_err(io)?;
        let storage = match mode {
            Mode::Map(populate) => {
                // SAFETY: the map is read-only; coil never writes the file
                // while it is open. Another process truncating it underneath
                // is outside what any mmap-based reader (llama.cpp included)
                // can defend against.
                let mut opts = MmapOptions::new();
                if populate {
                    opts.populate();
                }
                Storage::Mmap(unsafe { opts.map(&file) }.map_err(io)?)
            }
            // SAFETY: as above; writes go to private pages.
            Mode::Private => Storage::Private(
                unsafe { MmapOptions::new().populate().map_copy(&file) }.map_err(io)?,
            ),
            Mode::HugePages => {
                let mut file = file;
                let len = file.metadata().map_err(io)?.len() as usize;
                if len == 0 {
                    return Self::from_bytes(Vec::new()).map_err(|e| e.in_file(path));
                }
                let mut map = MmapOptions::new().len(len).map_anon().map_err(io)?;
                stitch::advise_huge_pages(&mut map);
                std::io::Read::read_exact(&mut file, &mut map[..len]).map_err(io)?;
                Storage::Anon(map)
            }
        };
        let mut f = Self::from_storage(storage)?;
        f.parts[0].path = Some(path.to_path_buf());
        Ok(f)
    }

    /// Parses a GGUF image held in memory (tests, fuzzing, network input).
    pub fn from_bytes(bytes: Vec<u8>) -> Result<GgufFile, GgufError> {
        Self::from_storage(Storage::Owned(bytes))
    }

    /// Parses the images of a split model's parts held in memory, first to
    /// last (tests, fuzzing), checked as [`GgufFile::open`] checks parts.
    pub fn from_parts(parts: &[Vec<u8>]) -> Result<GgufFile, GgufError> {
        let paths: Vec<PathBuf> = (1..=parts.len())
            .map(|i| split::part_path(Path::new("memory"), i, parts.len()))
            .collect();
        let stitched = stitch::Stitched::from_images(parts)?;
        let mut file = Self::from_stitched(stitched, &paths)?;
        for p in &mut file.parts {
            p.path = None;
        }
        Ok(file)
    }

    fn from_storage(storage: Storage) -> Result<GgufFile, GgufError> {
        let h = reader::parse_header(storage.bytes())?;
        let len = storage.bytes().len() as u64;
        Ok(GgufFile {
            storage,
            version: h.version,
            metadata: h.metadata,
            rewritten: vec![false; h.tensors.len()],
            parts: vec![Part {
                path: None,
                base: 0,
                len,
                data_offset: h.data_offset,
                n_tensors: h.tensors.len(),
            }],
            tensors: h.tensors,
            alignment: h.alignment,
        })
    }

    /// The parts' headers parsed where they lie in `stitched`: the first
    /// part's metadata, every part's tensors; checked to make one model.
    fn from_stitched(stitched: stitch::Stitched, paths: &[PathBuf]) -> Result<GgufFile, GgufError> {
        let mut parts = Vec::with_capacity(paths.len());
        let mut tensors: Vec<TensorInfo> = Vec::new();
        let mut first: Option<(u32, Metadata, u64, u64)> = None;
        let mut seen: std::collections::HashMap<String, usize> = std::collections::HashMap::new();
        for (i, (path, range)) in paths.iter().zip(stitched.ranges()).enumerate() {
            let bad = |reason: String| GgufError::Split {
                path: path.clone(),
                reason,
            };
            let h = reader::parse_header(&stitched.bytes()[range.clone()])
                .map_err(|e| e.in_file(path))?;
            let Some((no, count, total)) = split::split_keys(&h.metadata, path)? else {
                return Err(bad(format!(
                    "has no split keys, but is named as part {} of {}",
                    i + 1,
                    paths.len()
                )));
            };
            if count != paths.len() {
                return Err(bad(format!(
                    "split.count is {count}, not {}: a part of another model",
                    paths.len()
                )));
            }
            if no != i {
                return Err(bad(format!(
                    "split.no says part {} but the file is named as part {}",
                    no + 1,
                    i + 1
                )));
            }
            if let Some((_, md, _, want)) = &first {
                if total != *want {
                    return Err(bad(format!(
                        "split.tensors.count is {total}, the first part's is {want}: a part of another model"
                    )));
                }
                let arch = (
                    h.metadata.get_str("general.architecture"),
                    md.get_str("general.architecture"),
                );
                if let (Some(a), Some(b)) = arch {
                    if a != b {
                        return Err(bad(format!(
                            "architecture {a:?}, the first part's is {b:?}: a part of another model"
                        )));
                    }
                }
            }
            for t in &h.tensors {
                if let Some(&other) = seen.get(&t.name) {
                    return Err(bad(format!(
                        "tensor {:?} is also in {}: a part of another model",
                        t.name,
                        paths[other].display()
                    )));
                }
                seen.insert(t.name.clone(), i);
            }
            parts.push(Part {
                path: Some(path.clone()),
                base: range.start as u64,
                len: range.len() as u64,
                data_offset: h.data_offset,
                n_tensors: h.tensors.len(),
            });
            tensors.extend(h.tensors.into_iter().map(|t| TensorInfo { part: i, ..t }));
            if first.is_none() {
                first = Some((h.version, h.metadata, h.alignment, total));
            }
        }
        let Some((version, metadata, alignment, total)) = first else {
            return Err(GgufError::Split {
                path: PathBuf::new(),
                reason: "no parts".into(),
            });
        };
        if tensors.len() as u64 != total {
            return Err(GgufError::Split {
                path: paths[0].clone(),
                reason: format!(
                    "the {} parts hold {} tensors, split.tensors.count says {total}",
                    paths.len(),
                    tensors.len()
                ),
            });
        }
        Ok(GgufFile {
            storage: Storage::Stitched(stitched),
            version,
            metadata,
            rewritten: vec![false; tensors.len()],
            tensors,
            alignment,
            parts,
        })
    }

    pub fn version(&self) -> u32 {
        self.version
    }

    pub fn alignment(&self) -> u64 {
        self.alignment
    }

    /// Byte offset of the data section in the (first) file.
    pub fn data_offset(&self) -> u64 {
        self.parts[0].data_offset
    }

    /// The files of the model: one, or the parts of a split model in order.
    pub fn parts(&self) -> &[Part] {
        &self.parts
    }

    /// Whether the model is split over several files.
    pub fn is_split(&self) -> bool {
        self.parts.len() > 1
    }

    /// The whole file image (header and data); for a split model every
    /// part's image, each at its [`Part::base`].
    pub fn bytes(&self) -> &[u8] {
        self.storage.bytes()
    }

    /// Each file's header (everything before its data section), in order.
    pub fn headers(&self) -> impl Iterator<Item = &[u8]> {
        let bytes = self.storage.bytes();
        self.parts
            .iter()
            .map(move |p| &bytes[p.base as usize..(p.base + p.data_offset) as usize])
    }

    /// Byte range of a tensor's data within [`GgufFile::bytes`].
    pub fn data_range(&self, info: &TensorInfo) -> std::ops::Range<usize> {
        let p = &self.parts[info.part];
        let start = (p.base + p.data_offset + info.offset) as usize;
        start..start + info.n_bytes as usize
    }

    /// Bytes of the model's files together.
    pub fn file_len(&self) -> u64 {
        self.parts.iter().map(|p| p.len).sum()
    }

    pub fn metadata(&self) -> &Metadata {
        &self.metadata
    }

    /// `general.architecture`, if present.
    pub fn architecture(&self) -> Option<&str> {
        self.metadata.get_str("general.architecture")
    }

    pub fn tensors(&self) -> &[TensorInfo] {
        &self.tensors
    }

    pub fn tensor_info(&self, name: &str) -> Option<&TensorInfo> {
        self.tensors.iter().find(|t| t.name == name)
    }

    /// A zero-copy view of the tensor named `name`.
    pub fn tensor(&self, name: &str) -> Result<TensorView<'_>, GgufError> {
        let info = self
            .tensor_info(name)
            .ok_or_else(|| GgufError::MissingTensor(name.to_string()))?;
        Ok(self.view(info))
    }

    /// The bytes of tensor `index` (of [`GgufFile::tensors`]) to rewrite
    /// in memory (then [`GgufFile::mark_rewritten`]); `None` for a read-only
    /// map ([`GgufFile::open`]).
    pub fn tensor_data_mut(&mut self, index: usize) -> Option<&mut [u8]> {
        let range = self.data_range(self.tensors.get(index)?);
        Some(&mut self.storage.bytes_mut()?[range])
    }

    /// Records that tensor `index`'s bytes no longer are the file's
    /// encoding (readers check [`GgufFile::is_rewritten`]).
    pub fn mark_rewritten(&mut self, index: usize) {
        self.rewritten[index] = true;
    }

    /// Whether the loader rewrote this tensor's bytes in memory.
    pub fn is_rewritten(&self, info: &TensorInfo) -> bool {
        self.tensors
            .iter()
            .position(|t| std::ptr::eq(t, info) || t.name == info.name)
            .is_some_and(|i| self.rewritten[i])
    }

    /// A zero-copy view of a tensor of this file.
    pub fn view<'a>(&'a self, info: &'a TensorInfo) -> TensorView<'a> {
        // Bounds were checked when the header was parsed.
        let data = &self.storage.bytes()[self.data_range(info)];
        TensorView { info, data }
    }
}

/// A tensor's header entry and its bytes in the file.
#[derive(Clone, Copy)]
pub struct TensorView<'a> {
    pub info: &'a TensorInfo,
    pub data: &'a [u8],
}

/// Element types that can be viewed in place.
pub trait Plain: Copy + 'static {
    const TYPE: GgmlType;
}
impl Plain for f32 {
    const TYPE: GgmlType = GgmlType::F32;
}
impl Plain for half::f16 {
    const TYPE: GgmlType = GgmlType::F16;
}
impl Plain for half::bf16 {
    const TYPE: GgmlType = GgmlType::BF16;
}
impl Plain for i32 {
    const TYPE: GgmlType = GgmlType::I32;
}

impl GgufError {
    /// This error, naming the file it happened in.
    pub fn in_file(self, path: &Path) -> GgufError {
        match self {
            GgufError::Io { .. } | GgufError::Part { .. } | GgufError::Split { .. } => self,
            error => GgufError::Part {
                path: path.to_path_buf(),
                error: Box::new(error),
            },
        }
    }
}

impl<'a> TensorView<'a> {
    pub fn ty(&self) -> GgmlType {
        self.info.ty
    }

    /// The data as a typed slice, without copying. Fails if the tensor has
    /// another type or its data is not aligned for `T` in memory.
    pub fn as_slice<T: Plain>(&self) -> Result<&'a [T], GgufError> {
        if self.info.ty != T::TYPE {
            return Err(GgufError::Tensor {
                name: self.info.name.clone(),
                reason: format!("is {}, not {}", self.info.ty, T::TYPE),
            });
        }
        let size = std::mem::size_of::<T>();
        if !(self.data.as_ptr() as usize).is_multiple_of(std::mem::align_of::<T>())
            || !self.data.len().is_multiple_of(size)
        {
            return Err(GgufError::Tensor {
                name: self.info.name.clone(),
                reason: "data is not aligned for a typed view".into(),
            });
        }
        // SAFETY: the pointer is aligned for T, the length is a whole number
        // of T, every bit pattern is a valid f32/f16/bf16/i32, and the slice
        // borrows the storage for 'a.
        Ok(unsafe {
            std::slice::from_raw_parts(self.data.as_ptr().cast::<T>(), self.data.len() / size)
        })
    }

    /// The tensor widened to f32 (dequantized for block formats).
    pub fn to_f32(&self) -> Result<Vec<f32>, GgufError> {
        let n = usize::try_from(self.info.n_elements).map_err(|_| GgufError::Tensor {
            name: self.info.name.clone(),
            reason: "too large for this machine".into(),
        })?;
        let mut out = vec![0f32; n];
        crate::quant::dequantize_row(self.info.ty, self.data, &mut out).map_err(|e| {
            GgufError::Tensor {
                name: self.info.name.clone(),
                reason: e.to_string(),
            }
        })?;
        Ok(out)
    }
}
