//! The parts every language model shares: token embedding, the check of a
//! micro-batch against the memory, and the output head.

use crate::memory::{LayerState, Memory, MovingState, RecurrentMemory, SeqId, StateMut, StateRef};
use crate::models::weights::{Loader, Matrix};
use crate::models::{ModelError, Rows, UBatch};
use coil_gguf::GgufFile;
use coil_kernels::ops::state_elem::StateElem;
use coil_kernels::{matmul, ops::norm::rms_norm, Scratch, ThreadPool};

/// `token_embd`: `[n_vocab, n_embd]`.
pub struct Embedding {
    pub table: Matrix,
}

impl Embedding {
    pub fn load(ld: &Loader, n_vocab: usize, n_embd: usize) -> Result<Self, ModelError> {
        Ok(Embedding {
            table: ld.matrix("token_embd.weight", n_vocab, n_embd)?,
        })
    }

    /// Rows of the table for `tokens`: `[tokens.len(), n_embd]`.
    pub fn forward(
        &self,
        file: &GgufFile,
        tokens: &[u32],
        out: &mut [f32],
    ) -> Result<(), ModelError> {
        let d = self.table.cols;
        for (&t, row) in tokens.iter().zip(out.chunks_exact_mut(d)) {
            if t as usize >= self.table.rows {
                return Err(ModelError::BadToken {
                    token: t,
                    n_vocab: self.table.rows,
                });
            }
            self.table.row_f32(file, t as usize, row)?;
        }
        Ok(())
    }
}

/// Final RMSNorm and the output projection (`output`, or the embedding
/// table when tied).
pub struct OutputHead {
    pub norm: Vec<f32>,
    pub output: Matrix,
    pub eps: f32,
}

impl OutputHead {
    pub fn load(ld: &Loader, n_vocab: usize, n_embd: usize, eps: f32) -> Result<Self, ModelError> {
        Self::load_with_norm(ld, n_vocab, n_embd, eps, "output_norm.weight")
    }

    /// [`OutputHead::load`] with the final norm read from tensor `norm`.
    pub fn load_with_norm(
        ld: &Loader,
        n_vocab: usize,
        n_embd: usize,
        eps: f32,
        norm: &str,
    ) -> Result<Self, ModelError> {
        let output = if ld.has("output.weight") {
            ld.matrix("output.weight", n_vocab, n_embd)?
        } else {
            ld.matrix("token_embd.weight", n_vocab, n_embd)?
        };
        Ok(OutputHead {
            norm: ld.vector(norm, &[n_embd])?,
            output,
            eps,
        })
    }

    /// Logits of the rows `rows` of `x` (`[n_tokens, n_embd]`), in that
    /// order, into `logits` (`[rows.len(), n_vocab]`; whatever it held is
    /// overwritten: a reused buffer costs no zeroing, 8 MB per 8-sequence
    /// step on a 248k-token vocabulary).
    pub fn forward(
        &self,
        file: &GgufFile,
        pool: &ThreadPool,
        rows: &[usize],
        x: &[f32],
        logits: &mut Vec<f32>,
    ) {
        let d = self.output.cols;
        let mut h = vec![0f32; rows.len() * d];
        for (i, &r) in rows.iter().enumerate() {
            rms_norm(
                &x[r * d..(r + 1) * d],
                Some(&self.norm),
                self.eps,
                &mut h[i * d..(i + 1) * d],
                d,
            );
        }
        let n = rows.len() * self.output.rows;
        logits.truncate(n);
        logits.resize(n, 0.0);
        if !rows.is_empty() {
            matmul(pool, &self.output.get(file), &h, logits, rows.len());
        }
    }
}

/// Checks every chunk continues its sequence and fits the context.
pub fn check_ubatch(ub: &UBatch, mem: &Memory) -> Result<(), ModelError> {
    for (i, c) in ub.chunks.iter().enumerate() {
        if ub.chunks[..i].iter().any(|o| o.seq == c.seq) {
            return Err(ModelError::Memory(
                crate::memory::MemoryError::PositionMismatch {
                    seq: c.seq,
                    have: c.pos,
                    want: c.pos,
                },
            ));
        }
        mem.check_append(c.seq, c.pos, c.tokens.len())?;
    }
    Ok(())
}

/// The recurrent part of the memory, for layer `layer` (a clear error if
/// the memory was built without one).
pub fn recurrent_memory(
    mem: &mut Memory,
    layer: usize,
) -> Result<&mut RecurrentMemory, ModelError> {
    mem.recurrent.as_mut().ok_or_else(|| ModelError::Tensor {
        name: format!("blk.{layer}"),
        reason: "memory has no recurrent state".into(),
    })
}

/// The common start of a refold (a speculative verification of `seq` kept
/// only `n` tokens) for a mixer with a causal conv (`d_conv` taps over `ch`
/// channels) and a tape of `w` values per verified token whose first `ch`
/// are the conv inputs: sets the conv window to the one after the `n` kept
/// tokens and returns the state to overwrite, the SSM state before the
/// verification and the tape.
pub fn refold_conv_window(
    mem: &mut Memory,
    layer: usize,
    seq: SeqId,
    n: usize,
    (ch, w, d_conv): (usize, usize, usize),
) -> Result<(LayerState<'_>, StateRef<'_>, &[f32]), ModelError> {
    let no_tape = || ModelError::Tensor {
        name: format!("blk.{layer}"),
        reason: "no verification tape to refold".into(),
    };
    let rec = recurrent_memory(mem, layer)?;
    let (st, base_conv, base_ssm, tape) = rec.refold_parts(layer, seq).ok_or_else(no_tape)?;
    if tape.len() < n * w {
        return Err(no_tape());
    }
    // Conv window: rows i = n..n+K−1 of `window ++ tape inputs`.
    let km1 = d_conv - 1;
    for (j, dst) in st.conv.chunks_exact_mut(ch).enumerate() {
        let i = n + j;
        let src = if i < km1 {
            &base_conv[i * ch..(i + 1) * ch]
        } else {
            &tape[(i - km1) * w..(i - km1) * w + ch]
        };
        dst.copy_from_slice(src);
    }
    Ok((st, base_ssm, tape))
}

/// The state of `layer` for sequence `seq`.
pub fn layer_state(
    rec: &mut RecurrentMemory,
    layer: usize,
    seq: SeqId,
) -> Result<LayerState<'_>, ModelError> {
    rec.layer_state(layer, seq)?.ok_or_else(|| no_state(layer))
}

/// [`layer_state`] for a mixer that can start its update from another
/// buffer (see `RecurrentMemory::state_moving`): the SSM source comes back
/// when the state is moving off a shared one; the mixer must then write
/// all of the SSM state from it.
pub fn layer_state_moving(
    rec: &mut RecurrentMemory,
    layer: usize,
    seq: SeqId,
) -> Result<MovingState<'_>, ModelError> {
    rec.state_moving(layer, seq)?.ok_or_else(|| no_state(layer))
}

/// An SSM state (and the source it moves off) as `S`, the type its memory
/// stores: what a mixer generic over the state type runs on.
#[allow(clippy::type_complexity)]
pub fn typed_state<'a, S: StateElem>(
    ssm: StateMut<'a>,
    from: Option<StateRef<'a>>,
) -> Result<(&'a mut [S], Option<&'a [S]>), ModelError> {
    let bad = |have: coil_kernels::ops::StateType| ModelError::Tensor {
        name: "recurrent state".into(),
        reason: format!("stored as {have}, expected {}", S::TYPE),
    };
    let have = ssm.state_type();
    let st = S::of_mut(ssm).ok_or_else(|| bad(have))?;
    let f = match from {
        Some(f) => Some(S::of_ref(f).ok_or_else(|| bad(f.state_type()))?),
        None => None,
    };
    Ok((st, f))
}

fn no_state(layer: usize) -> ModelError {
    ModelError::Tensor {
        name: format!("blk.{layer}"),
        reason: "memory has no recurrent state for this layer".into(),
    }
}

/// [`layer_state_moving`] for several distinct sequences at once
/// (`out[i]` belongs to `seqs[i]`), so that one pass can update them all.
pub fn layer_states_moving<'a>(
    rec: &'a mut RecurrentMemory,
    layer: usize,
    seqs: &[SeqId],
) -> Result<Vec<MovingState<'a>>, ModelError> {
    rec.states_moving(layer, seqs)?
        .ok_or_else(|| no_state(layer))
}

/// The rows of each of `chunks` (in row order, not overlapping) in `buf`
/// (`[n_rows, width]`), as separate mutable slices.
pub fn split_rows<'a>(buf: &'a mut [f32], width: usize, chunks: &[&Rows]) -> Vec<&'a mut [f32]> {
    let mut out = Vec::with_capacity(chunks.len());
    let mut rest = buf;
    let mut at = 0;
    for c in chunks {
        assert!(c.rows.start >= at, "split_rows: chunks out of row order");
        let tail = std::mem::take(&mut rest);
        let (_, tail) = tail.split_at_mut((c.rows.start - at) * width);
        let (mine, tail) = tail.split_at_mut(c.rows.len() * width);
        out.push(mine);
        rest = tail;
        at = c.rows.end;
    }
    out
}

/// Rows `rows` of `x` (`[n, d]`), in that order.
pub fn gather_rows(x: &[f32], rows: &[usize], d: usize) -> Scratch {
    let mut g = Scratch::dirty(rows.len() * d);
    for (dst, &r) in g.chunks_exact_mut(d).zip(rows) {
        dst.copy_from_slice(&x[r * d..(r + 1) * d]);
    }
    g
}
