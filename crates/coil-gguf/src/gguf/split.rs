//! Split GGUF models (llama.cpp's `llama-gguf-split`, `convert_hf_to_gguf.py
//! --split-max-size`): one model in `n` files named
//! `PREFIX-00001-of-0000n.gguf` … `PREFIX-0000n-of-0000n.gguf`, each a
//! complete GGUF file holding some of the tensors. Every part carries
//! `split.no` (u16, 0-based), `split.count` (u16) and `split.tensors.count`
//! (i32, the model's total); the first part carries the model's metadata,
//! the others only these three keys.
//!
//! Reading: [`find_parts`] finds every part from any one of them.
//! Writing: [`plan_parts`] cuts a tensor list by size and count as gguf-py's
//! writer does, and [`SplitWriter`] streams the parts.

use super::value::{Metadata, Value};
use super::writer::{GgufWriter, TensorSpec};
use super::GgufError;
use std::ops::Range;
use std::path::{Path, PathBuf};

pub const KEY_SPLIT_NO: &str = "split.no";
pub const KEY_SPLIT_COUNT: &str = "split.count";
pub const KEY_SPLIT_TENSORS_COUNT: &str = "split.tensors.count";

/// llama.cpp's part name: `{prefix}-{no:05}-of-{count:05}.gguf`, `no` 1-based.
pub fn part_path(prefix: &Path, no: usize, count: usize) -> PathBuf {
    let mut s = prefix.as_os_str().to_os_string();
    s.push(format!("-{no:05}-of-{count:05}.gguf"));
    PathBuf::from(s)
}

/// The prefix and (1-based part, count) of a path named as a part, if it is.
pub fn parse_part_path(path: &Path) -> Option<(PathBuf, usize, usize)> {
    let s = path.to_str()?;
    let stem = s.strip_suffix(".gguf")?;
    // "-00001-of-00003": the numbers are at least 5 digits (llama.cpp's %05d)
    let (rest, count) = stem.rsplit_once("-of-")?;
    let (prefix, no) = rest.rsplit_once('-')?;
    let num = |t: &str| -> Option<usize> {
        (t.len() >= 5 && t.bytes().all(|b| b.is_ascii_digit()))
            .then(|| t.parse().ok())
            .flatten()
    };
    Some((PathBuf::from(prefix), num(no)?, num(count)?))
}

/// The split keys of one part's metadata: (0-based number, count, total
/// tensors); `None` for a file that is not split (no `split.count`, or 1).
pub fn split_keys(md: &Metadata, path: &Path) -> Result<Option<(usize, usize, u64)>, GgufError> {
    let bad = |reason: String| GgufError::Split {
        path: path.to_path_buf(),
        reason,
    };
    let count = match md.get(KEY_SPLIT_COUNT) {
        None => return Ok(None),
        Some(v) => v
            .as_u64()
            .ok_or_else(|| bad(format!("{KEY_SPLIT_COUNT} is {v}, not a count")))?,
    };
    if count <= 1 && md.get(KEY_SPLIT_NO).and_then(Value::as_u64).unwrap_or(0) == 0 {
        return Ok(None);
    }
    let no = md
        .get(KEY_SPLIT_NO)
        .and_then(Value::as_u64)
        .ok_or_else(|| {
            bad(format!(
                "{KEY_SPLIT_COUNT} is {count} but {KEY_SPLIT_NO} is missing"
            ))
        })?;
    if count == 0 || count > u16::MAX as u64 || no >= count {
        return Err(bad(format!(
            "{KEY_SPLIT_NO} {no} of {KEY_SPLIT_COUNT} {count}"
        )));
    }
    let tensors = md
        .get(KEY_SPLIT_TENSORS_COUNT)
        .and_then(Value::as_u64)
        .ok_or_else(|| {
            bad(format!(
                "{KEY_SPLIT_TENSORS_COUNT} is missing or not a count"
            ))
        })?;
    Ok(Some((no as usize, count as usize, tensors)))
}

/// Every part's path, first to last, for a part numbered `no` of `count`
/// (0-based) at `path`. Parts must be named as llama.cpp names them, and
/// exist.
pub fn find_parts(path: &Path, no: usize, count: usize) -> Result<Vec<PathBuf>, GgufError> {
    let prefix = match parse_part_path(path) {
        Some((prefix, n, c)) if n == no + 1 && c == count => prefix,
        _ => {
            return Err(GgufError::Split {
                path: path.to_path_buf(),
                reason: format!(
                    "part {} of {count} of a split model, but not named PREFIX-{:05}-of-{count:05}.gguf: \
                     cannot find the other parts",
                    no + 1,
                    no + 1
                ),
            })
        }
    };
    (1..=count)
        .map(|i| {
            let p = part_path(&prefix, i, count);
            if p.is_file() {
                Ok(p)
            } else {
                Err(GgufError::Split {
                    path: p,
                    reason: format!("part {i} of {count} is missing (beside {})", path.display()),
                })
            }
        })
        .collect()
}

/// Limits of one part when writing.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SplitLimits {
    /// Most bytes of tensor data in one part (each tensor padded to 32).
    pub max_bytes: Option<u64>,
    /// Most tensors in one part.
    pub max_tensors: Option<usize>,
}

impl SplitLimits {
    pub fn is_none(&self) -> bool {
        self.max_bytes.is_none() && self.max_tensors.is_none()
    }
}

/// Parses a size as llama.cpp's tools take it: a positive integer with `M`
/// (10⁶ bytes) or `G` (10⁹ bytes); coil also takes `K` and `T`.
pub fn parse_size(s: &str) -> Result<u64, String> {
    let s = s.trim();
    let (num, unit) = s.split_at(s.len().saturating_sub(1));
    let mult: u64 = match unit {
        "K" | "k" => 1_000,
        "M" | "m" => 1_000_000,
        "G" | "g" => 1_000_000_000,
        "T" | "t" => 1_000_000_000_000,
        _ => return Err(format!("{s:?}: give a size with a unit, M or G (e.g. 2G)")),
    };
    match num.parse::<u64>() {
        Ok(n) if n > 0 => n
            .checked_mul(mult)
            .ok_or_else(|| format!("{s:?} is too large")),
        _ => Err(format!(
            "{s:?}: the size must be a positive whole number of {unit}"
        )),
    }
}

/// Cuts `sizes` (each tensor's data bytes, in order) into parts: a new part
/// starts when the current one already has `max_tensors` tensors or the next
/// tensor would take it past `max_bytes`; every part has at least one
/// tensor (a tensor larger than the limit makes a part of its own). Sizes
/// count each tensor padded to the 32-byte alignment.
pub fn plan_parts(sizes: &[u64], limits: SplitLimits) -> Vec<Range<usize>> {
    let mut parts = Vec::new();
    let (mut start, mut bytes) = (0usize, 0u64);
    for (i, &n) in sizes.iter().enumerate() {
        let n = n.div_ceil(32) * 32;
        let full = i > start
            && (limits.max_tensors.is_some_and(|m| i - start >= m)
                || limits.max_bytes.is_some_and(|m| bytes + n > m));
        if full {
            parts.push(start..i);
            start = i;
            bytes = 0;
        }
        bytes += n;
    }
    parts.push(start..sizes.len());
    parts
}

/// Writes a model as parts (or as one plain file when it fits one): the
/// model's metadata and the split keys in the first part, only the split
/// keys in the others, as llama.cpp writes them. Feed tensor data in order
/// as to [`GgufWriter`]; parts are renamed into place as each completes,
/// and removed again if the whole is not finished.
pub struct SplitWriter {
    parts: Vec<(PathBuf, Range<usize>)>,
    metadata: Metadata,
    specs: Vec<TensorSpec>,
    current: Option<GgufWriter>,
    /// Index of the part being written.
    at: usize,
    done: Vec<PathBuf>,
}

impl SplitWriter {
    /// Plans the parts of `specs` under `limits` and opens the first. With
    /// one part the file is `path` itself, without split keys; with more,
    /// `path` minus `.gguf` is the prefix of the part names.
    pub fn create(
        path: impl AsRef<Path>,
        metadata: &Metadata,
        specs: &[TensorSpec],
        limits: SplitLimits,
    ) -> Result<SplitWriter, GgufError> {
        let path = path.as_ref();
        let sizes = specs
            .iter()
            .map(TensorSpec::n_bytes)
            .collect::<Result<Vec<_>, _>>()?;
        let ranges = plan_parts(&sizes, limits);
        let n = ranges.len();
        if n > u16::MAX as usize {
            return Err(GgufError::Split {
                path: path.to_path_buf(),
                reason: format!("{n} parts (at most {})", u16::MAX),
            });
        }
        let parts: Vec<(PathBuf, Range<usize>)> = if n == 1 {
            vec![(path.to_path_buf(), ranges[0].clone())]
        } else {
            let prefix = match path.to_str().and_then(|s| s.strip_suffix(".gguf")) {
                Some(p) => PathBuf::from(p),
                None => path.to_path_buf(),
            };
            (ranges.into_iter().enumerate())
                .map(|(i, r)| (part_path(&prefix, i + 1, n), r))
                .collect()
        };
        let mut w = SplitWriter {
            parts,
            metadata: metadata.clone(),
            specs: specs.to_vec(),
            current: None,
            at: 0,
            done: Vec::new(),
        };
        w.open(0)?;
        Ok(w)
    }

    /// The files this writer makes, first to last.
    pub fn paths(&self) -> Vec<PathBuf> {
        self.parts.iter().map(|(p, _)| p.clone()).collect()
    }

    fn open(&mut self, i: usize) -> Result<(), GgufError> {
        let n = self.parts.len();
        let (path, range) = &self.parts[i];
        let mut md = if i == 0 {
            self.metadata.clone()
        } else {
            let mut md = Metadata::new();
            if let Some(a) = self.metadata.get("general.alignment") {
                md.insert("general.alignment", a.clone());
            }
            md
        };
        for k in [KEY_SPLIT_NO, KEY_SPLIT_COUNT, KEY_SPLIT_TENSORS_COUNT] {
            md.remove(k);
        }
        if n > 1 {
            md.insert(KEY_SPLIT_NO, Value::U16(i as u16));
            md.insert(KEY_SPLIT_COUNT, Value::U16(n as u16));
            md.insert(KEY_SPLIT_TENSORS_COUNT, Value::I32(self.specs.len() as i32));
        }
        self.current = Some(GgufWriter::create(path, &md, &self.specs[range.clone()])?);
        self.at = i;
        self.advance()
    }

    /// Finishes the current part once all its data is in and opens the next.
    fn advance(&mut self) -> Result<(), GgufError> {
        let complete = self
            .current
            .as_ref()
            .is_some_and(|w| w.next_tensor().is_none());
        if complete && self.at + 1 < self.parts.len() {
            if let Some(w) = self.current.take() {
                self.done.push(w.finish()?);
            }
            self.open(self.at + 1)?;
        }
        Ok(())
    }

    /// Name of the tensor whose data is expected next, if any.
    pub fn next_tensor(&self) -> Option<&str> {
        self.current.as_ref().and_then(GgufWriter::next_tensor)
    }

    /// Appends `bytes` to the data of the current tensor (see
    /// [`GgufWriter::write_tensor_data`]).
    pub fn write_tensor_data(&mut self, bytes: &[u8]) -> Result<(), GgufError> {
        match self.current.as_mut() {
            Some(w) => w.write_tensor_data(bytes)?,
            None => {
                return Err(GgufError::Invalid {
                    field: "writer".into(),
                    offset: 0,
                    reason: "already finished".into(),
                })
            }
        }
        self.advance()
    }

    /// Finishes the last part; returns every file written.
    pub fn finish(mut self) -> Result<Vec<PathBuf>, GgufError> {
        if let Some(w) = self.current.take() {
            self.done.push(w.finish()?);
        }
        Ok(std::mem::take(&mut self.done))
    }
}

impl Drop for SplitWriter {
    fn drop(&mut self) {
        // Not finished: the parts already complete go too.
        if self.current.is_some() {
            for p in &self.done {
                let _ = std::fs::remove_file(p);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn part_names_round_trip() {
        let p = part_path(Path::new("/m/Qwen3.5-Q4_K_M"), 2, 3);
        assert_eq!(p, Path::new("/m/Qwen3.5-Q4_K_M-00002-of-00003.gguf"));
        assert_eq!(
            parse_part_path(&p),
            Some((PathBuf::from("/m/Qwen3.5-Q4_K_M"), 2, 3))
        );
        assert_eq!(parse_part_path(Path::new("a-1-of-3.gguf")), None);
        assert_eq!(parse_part_path(Path::new("a-00001-of-00003.bin")), None);
        assert_eq!(parse_part_path(Path::new("model.gguf")), None);
    }

    #[test]
    fn sizes_parse_as_llama_cpp_takes_them() {
        assert_eq!(parse_size("2G"), Ok(2_000_000_000));
        assert_eq!(parse_size("500M"), Ok(500_000_000));
        assert!(parse_size("2").is_err());
        assert!(parse_size("0G").is_err());
        assert!(parse_size("-1G").is_err());
        assert!(parse_size("G").is_err());
    }

    #[test]
    fn parts_are_cut_by_size_and_count() {
        let none = SplitLimits::default();
        assert_eq!(plan_parts(&[10, 20, 30], none), vec![0..3]);
        let by_count = SplitLimits {
            max_tensors: Some(2),
            ..none
        };
        assert_eq!(
            plan_parts(&[1, 1, 1, 1, 1], by_count),
            vec![0..2, 2..4, 4..5]
        );
        // 32-byte padding counts: 64, 32, 32, 224, 32
        let by_size = SplitLimits {
            max_bytes: Some(100),
            ..none
        };
        assert_eq!(
            plan_parts(&[33, 32, 10, 200, 1], by_size),
            vec![0..2, 2..3, 3..4, 4..5]
        );
        assert_eq!(plan_parts(&[], by_size), vec![0..0]);
    }
}
