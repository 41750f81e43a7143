//! Saving one sequence's complete state — tokens, recurrent state and
//! checkpoints, attention cells — to a file and loading it back.
//!
//! Format (little-endian), version 1 (a memory of f32 state and cells) or
//! 2 (which records the types first):
//! ```text
//! "COILSESS"  u32 version  u64 model identity  u64 payload length
//! payload:    [version 2: u8 state type (0 f32, 1 bf16), u8 cell type (0 f32, 1 f16)]
//!             u64 n_tokens, u32 × n_tokens
//!             u8 has_recurrent [u64 state_len, f32 × state_len,
//!                               u64 n_checkpoints, (u64 pos, f32 × state_len) × n]
//!             u8 has_kv [u64 n_layer, (u64 n, f32 × n  keys, u64 n, f32 × n  values) × n_layer]
//! u64 FNV-1a checksum of the payload
//! ```
//! A bf16 recurrent state is written as its flat buffer is held: f32
//! words, each layer's SSM part two bf16 per word (see `recurrent`).
//! f16 cells likewise (two f16 per word, each position's row padded to
//! whole words). A session loads into a memory of either type: bf16 / f16
//! values widen exactly into an f32 memory; f32 values are rounded to
//! nearest (even) into a bf16 / f16 one.
//! Loading parses and checks everything (identity, checksum, every size
//! against this memory's shapes) before touching the memory: a truncated,
//! corrupted or other-model file changes nothing.

use super::{
    CacheType, Checkpoint, Memory, MemoryError, RecurrentMemory, SeqId, SequenceMemory, StateType,
};
use std::io::{Read, Write};

const MAGIC: &[u8; 8] = b"COILSESS";
const VERSION: u32 = 1;
/// Version 1 with the state and cell types recorded.
const VERSION_TYPED: u32 = 2;

#[derive(Debug, thiserror::Error)]
pub enum SessionError {
    #[error("not a coil session file (bad magic)")]
    BadMagic,
    #[error("session file version {0} is not supported (this coil reads versions {VERSION} and {VERSION_TYPED})")]
    Version(u32),
    #[error("the session was saved with another model (identity {found:016x}, this model is {expected:016x})")]
    OtherModel { expected: u64, found: u64 },
    #[error("session file is truncated or corrupted: {0}")]
    Corrupt(String),
    #[error("session does not fit this memory: {0}")]
    Mismatch(String),
    #[error(transparent)]
    Memory(#[from] MemoryError),
    #[error("session file I/O: {0}")]
    Io(#[from] std::io::Error),
    #[error("the memory could not be brought up to date before saving: {0}")]
    Unsynced(String),
}

/// FNV-1a, 64 bit: cheap and enough to catch accidental corruption.
pub fn fnv1a(bytes: &[u8], mut h: u64) -> u64 {
    for &b in bytes {
        h ^= b as u64;
        h = h.wrapping_mul(0x100_0000_01b3);
    }
    h
}
pub const FNV_OFFSET: u64 = 0xcbf2_9ce4_8422_2325;

fn put_u64(out: &mut Vec<u8>, v: u64) {
    out.extend_from_slice(&v.to_le_bytes());
}

fn put_f32s(out: &mut Vec<u8>, v: &[f32]) {
    put_u64(out, v.len() as u64);
    out.reserve(v.len() * 4);
    for x in v {
        out.extend_from_slice(&x.to_le_bytes());
    }
}

/// Like [`put_f32s`] for values held in pages: one length, then every
/// page's values in order (the same bytes as one contiguous slice).
fn put_f32_pages(out: &mut Vec<u8>, pages: &[&[f32]]) {
    put_u64(out, pages.iter().map(|p| p.len() as u64).sum());
    for p in pages {
        out.reserve(p.len() * 4);
        for x in *p {
            out.extend_from_slice(&x.to_le_bytes());
        }
    }
}

/// Writes sequence `s` of `mem` to `w`.
pub fn save(mem: &Memory, s: SeqId, identity: u64, w: &mut impl Write) -> Result<(), SessionError> {
    let tokens = mem.seq_tokens(s)?;
    let mut p = Vec::new();
    let state_type = mem
        .recurrent
        .as_ref()
        .map_or(StateType::F32, |r| r.state_type());
    let cache_type = mem.kv.as_ref().map_or(CacheType::F32, |k| k.cache_type());
    let version = if state_type == StateType::F32 && cache_type == CacheType::F32 {
        VERSION
    } else {
        p.push(state_type.code());
        p.push(cache_type.code());
        VERSION_TYPED
    };
    put_u64(&mut p, tokens.len() as u64);
    for t in tokens {
        p.extend_from_slice(&t.to_le_bytes());
    }
    match &mem.recurrent {
        Some(r) => {
            p.push(1);
            put_f32s(&mut p, &r.flat_state(s)?);
            let cps = r.checkpoints(s)?;
            put_u64(&mut p, cps.len() as u64);
            for c in cps {
                put_u64(&mut p, c.pos as u64);
                put_f32s(&mut p, &c.state);
            }
        }
        None => p.push(0),
    }
    match &mem.kv {
        Some(kv) => {
            p.push(1);
            let layers = kv.seq_cells(s)?;
            put_u64(&mut p, layers.len() as u64);
            for l in &layers {
                put_f32_pages(&mut p, &l.k);
                put_f32_pages(&mut p, &l.v);
            }
        }
        None => p.push(0),
    }
    w.write_all(MAGIC)?;
    w.write_all(&version.to_le_bytes())?;
    w.write_all(&identity.to_le_bytes())?;
    w.write_all(&(p.len() as u64).to_le_bytes())?;
    w.write_all(&p)?;
    w.write_all(&fnv1a(&p, FNV_OFFSET).to_le_bytes())?;
    Ok(())
}

struct Reader<'a> {
    b: &'a [u8],
    at: usize,
}

impl Reader<'_> {
    fn take(&mut self, n: usize, what: &str) -> Result<&[u8], SessionError> {
        let end = self
            .at
            .checked_add(n)
            .filter(|&e| e <= self.b.len())
            .ok_or_else(|| SessionError::Corrupt(format!("{what} runs past the end")))?;
        let s = &self.b[self.at..end];
        self.at = end;
        Ok(s)
    }
    fn u8(&mut self, what: &str) -> Result<u8, SessionError> {
        Ok(self.take(1, what)?[0])
    }
    fn u64(&mut self, what: &str) -> Result<u64, SessionError> {
        let s = self.take(8, what)?;
        let mut a = [0u8; 8];
        a.copy_from_slice(s);
        Ok(u64::from_le_bytes(a))
    }
    fn len(&mut self, what: &str, elem: usize) -> Result<usize, SessionError> {
        let n = self.u64(what)?;
        let left = (self.b.len() - self.at) / elem.max(1);
        if n > left as u64 {
            return Err(SessionError::Corrupt(format!(
                "{what}: {n} entries do not fit"
            )));
        }
        Ok(n as usize)
    }
    fn f32s(&mut self, what: &str) -> Result<Vec<f32>, SessionError> {
        let n = self.len(what, 4)?;
        let s = self.take(n * 4, what)?;
        Ok(s.chunks_exact(4)
            .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .collect())
    }
}

/// A flat recurrent state read from a file (SSM type `ty`) as `r` holds
/// it (converted when the types differ); `None` if it does not fit.
fn in_memory_type(r: &RecurrentMemory, ty: StateType, words: Vec<f32>) -> Option<Vec<f32>> {
    if ty == r.state_type() {
        (words.len() == r.state_len()).then_some(words)
    } else {
        r.convert_flat(ty, &words).map(|c| c.into_owned())
    }
}

/// Reads a session into sequence `s` of `mem`, replacing what it held.
pub fn load(
    mem: &mut Memory,
    s: SeqId,
    identity: u64,
    r: &mut impl Read,
) -> Result<(), SessionError> {
    // Check the sequence exists before reading anything.
    mem.seq_len(s)?;
    let mut head = [0u8; 28];
    r.read_exact(&mut head)
        .map_err(|_| SessionError::Corrupt("header is truncated".into()))?;
    if &head[..8] != MAGIC {
        return Err(SessionError::BadMagic);
    }
    let version = u32::from_le_bytes([head[8], head[9], head[10], head[11]]);
    if version != VERSION && version != VERSION_TYPED {
        return Err(SessionError::Version(version));
    }
    let mut id = [0u8; 8];
    id.copy_from_slice(&head[12..20]);
    let found = u64::from_le_bytes(id);
    if found != identity {
        return Err(SessionError::OtherModel {
            expected: identity,
            found,
        });
    }
    let mut n = [0u8; 8];
    n.copy_from_slice(&head[20..28]);
    let n = u64::from_le_bytes(n);
    // Read at most what the header promises (+ checksum); never allocate
    // from the header alone.
    let mut payload = Vec::new();
    r.take(n.saturating_add(8)).read_to_end(&mut payload)?;
    if (payload.len() as u64) < n.saturating_add(8) {
        return Err(SessionError::Corrupt("payload is truncated".into()));
    }
    let (p, sum) = payload.split_at(n as usize);
    let mut sb = [0u8; 8];
    sb.copy_from_slice(sum);
    if fnv1a(p, FNV_OFFSET) != u64::from_le_bytes(sb) {
        return Err(SessionError::Corrupt("checksum mismatch".into()));
    }
    let mut rd = Reader { b: p, at: 0 };
    let (file_state, file_cells) = if version == VERSION_TYPED {
        let code = rd.u8("state type")?;
        let ty = StateType::from_code(code)
            .ok_or_else(|| SessionError::Corrupt(format!("unknown state type {code}")))?;
        let code = rd.u8("cell type")?;
        let cells = CacheType::from_code(code)
            .ok_or_else(|| SessionError::Corrupt(format!("unknown cell type {code}")))?;
        (ty, cells)
    } else {
        (StateType::F32, CacheType::F32)
    };
    let nt = rd.len("tokens", 4)?;
    let tokens: Vec<u32> = rd
        .take(nt * 4, "tokens")?
        .chunks_exact(4)
        .map(|c| u32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect();
    if nt > mem.n_ctx() {
        return Err(SessionError::Mismatch(format!(
            "{nt} tokens exceed the context size {}",
            mem.n_ctx()
        )));
    }
    let mut rec = None;
    if rd.u8("recurrent flag")? == 1 {
        let Some(r) = &mem.recurrent else {
            return Err(SessionError::Mismatch(
                "it holds recurrent state; this model has none".into(),
            ));
        };
        let state = rd.f32s("recurrent state")?;
        let len = state.len();
        let Some(state) = in_memory_type(r, file_state, state) else {
            return Err(SessionError::Mismatch(format!(
                "recurrent state of {len} values, this model has {} ({file_state})",
                r.state_len_of(file_state)
            )));
        };
        let ncp = rd.len("checkpoints", 16)?;
        let mut cps = Vec::with_capacity(ncp);
        for _ in 0..ncp {
            let pos = rd.u64("checkpoint position")? as usize;
            let st = rd.f32s("checkpoint")?;
            let st = in_memory_type(r, file_state, st);
            let Some(st) =
                st.filter(|_| pos <= nt && cps.last().is_none_or(|c: &Checkpoint| c.pos < pos))
            else {
                return Err(SessionError::Mismatch("a checkpoint does not fit".into()));
            };
            cps.push(r.checkpoint_of(pos, &st));
        }
        rec = Some((state, cps));
    } else if mem.recurrent.is_some() {
        return Err(SessionError::Mismatch(
            "it holds no recurrent state; this model needs it".into(),
        ));
    }
    let mut kv = None;
    if rd.u8("kv flag")? == 1 {
        let Some(m) = &mem.kv else {
            return Err(SessionError::Mismatch(
                "it holds attention cells; this model has none".into(),
            ));
        };
        let nl = rd.len("kv layers", 16)?;
        if nl != m.n_layer() {
            return Err(SessionError::Mismatch(format!(
                "{nl} layers of cells, this model has {}",
                m.n_layer()
            )));
        }
        let (mut ks, mut vs) = (Vec::new(), Vec::new());
        for l in 0..nl {
            let k = rd.f32s("keys")?;
            let v = rd.f32s("values")?;
            let (want, want_v) = (m.expected_len(l, nt), m.expected_v_len(l, nt));
            let (k, v) = match (
                m.convert_cells(l, file_cells, k),
                m.convert_cells(l, file_cells, v),
            ) {
                (Some(k), Some(v)) if k.len() == want && v.len() == want_v => (k, v),
                _ => {
                    return Err(SessionError::Mismatch(format!(
                        "layer {l}: cells do not match {nt} tokens"
                    )))
                }
            };
            ks.push(k);
            vs.push(v);
        }
        kv = Some((ks, vs));
    } else if mem.kv.is_some() {
        return Err(SessionError::Mismatch(
            "it holds no attention cells; this model needs them".into(),
        ));
    }
    if rd.at != p.len() {
        return Err(SessionError::Corrupt("trailing bytes".into()));
    }
    // Everything checked: apply.
    mem.seq_clear(s)?;
    if let (Some(r), Some((state, cps))) = (&mut mem.recurrent, rec) {
        r.set_flat_state(s, nt, &state)?;
        r.set_checkpoints(s, cps)?;
    }
    if let (Some(m), Some((k, v))) = (&mut mem.kv, kv) {
        m.set_seq_cells(s, nt, k, v)?;
    }
    mem.set_tokens(s, tokens)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::memory::{KvLayerShape, KvMemory};

    /// Cells held in pages are written exactly as one contiguous run per
    /// layer (the version-1 format), and load back.
    #[test]
    fn paged_cells_keep_the_version_1_bytes() {
        let sh = KvLayerShape::heads(1, 3);
        let kv = KvMemory::new(vec![Some(sh), None], 2, 1000).with_page_len(32);
        let mut mem = Memory::new(None, Some(kv), 2, 1000);
        let n = 70;
        let k: Vec<f32> = (0..n * 3).map(|i| i as f32 * 0.5).collect();
        let v: Vec<f32> = (0..n * 3).map(|i| -(i as f32)).collect();
        let tokens: Vec<u32> = (0..n as u32).collect();
        if let Some(kv) = &mut mem.kv {
            kv.append(0, 0, 0, &k, &v).unwrap();
        }
        mem.advance(0, &tokens).unwrap();
        let mut got = Vec::new();
        save(&mem, 0, 42, &mut got).unwrap();

        let mut p = Vec::new();
        put_u64(&mut p, n as u64);
        for t in &tokens {
            p.extend_from_slice(&t.to_le_bytes());
        }
        p.push(0); // no recurrent state
        p.push(1);
        put_u64(&mut p, 2);
        put_f32s(&mut p, &k);
        put_f32s(&mut p, &v);
        put_f32s(&mut p, &[]);
        put_f32s(&mut p, &[]);
        let mut want = Vec::new();
        want.extend_from_slice(MAGIC);
        want.extend_from_slice(&VERSION.to_le_bytes());
        want.extend_from_slice(&42u64.to_le_bytes());
        want.extend_from_slice(&(p.len() as u64).to_le_bytes());
        want.extend_from_slice(&p);
        want.extend_from_slice(&fnv1a(&p, FNV_OFFSET).to_le_bytes());
        assert_eq!(got, want);

        load(&mut mem, 1, 42, &mut got.as_slice()).unwrap();
        let kv = mem.kv.as_ref().unwrap();
        let cells = kv.seq_cells(1).unwrap();
        assert_eq!(cells[0].k.concat(), k);
        assert_eq!(cells[0].v.concat(), v);
        assert_eq!(cells[0].k.len(), 3, "loaded into pages of 32 positions");
    }
}
