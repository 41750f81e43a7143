//! The first NextN / MTP block of a [`DecoderStack`] at run time (see
//! [`crate::models::nextn`] for what it computes): writing its attention
//! cells beside every pass of the trunk, keeping the hidden state it reads
//! next through verifications, and drafting.
//!
//! Memory: layer `L` = the trunk's length, one past the trunk, holds the
//! block's attention cells (the KV memory) and, as its recurrent state
//! (the conv region: f32 whatever the state type), `[h | waiting | n]`:
//! the trunk's final hidden state at the sequence's last position (`d`
//! values), then the hidden states read by the last `n` positions, whose
//! cells are not written yet (up to [`NEXTN_LAG`] rows of `d`), then `n`.
//! Both follow every sequence operation the trunk's memory does.
//!
//! Deferred cells: a pass that adds a few positions to a sequence outside
//! a verification only keeps what their cells read (the waiting rows);
//! drafting, a verification, a pass that would overflow the rows, or
//! [`crate::models::Model::nextn_catch_up`] (before a session is saved)
//! writes them, all waiting positions of all the sequences concerned in
//! one pass. So while drafting pauses (drafts keep failing) a decode step
//! costs the block nothing, and when it resumes the cells are caught up at
//! the price of one batched pass. The catch-up runs with batch-invariant
//! numerics: every cell is bit for bit what a one-token pass writes.

use super::common::{gather_rows, layer_state, recurrent_memory};
use super::stack::{add_scaled_rows, norm_rows, DecoderStack, LastRows, MixerBlock};
use crate::engine::sampling::argmax;
use crate::memory::LayerState;
use crate::memory::{Memory, SeqId, SequenceMemory};
use crate::models::nextn::NextnBlock;
use crate::models::{ModelError, Rows};
use coil_kernels::{matmul, Scratch, ThreadPool};

impl DecoderStack {
    /// The memory index of the first NextN block.
    fn nextn_at(&self) -> usize {
        self.layers.len()
    }

    /// Whether `mem` holds the first NextN block's layer (it came from
    /// [`crate::models::Model::new_memory_nextn`]).
    pub(super) fn nextn_on(&self, mem: &Memory) -> bool {
        !self.nextn.is_empty()
            && mem
                .kv
                .as_ref()
                .is_some_and(|k| k.n_layer() > self.nextn_at())
            && mem
                .recurrent
                .as_ref()
                .is_some_and(|r| r.n_layer() > self.nextn_at())
    }

    fn block(&self) -> Result<&NextnBlock, ModelError> {
        self.nextn.first().ok_or(ModelError::NoNextn)
    }

    /// Every row's final hidden state (the output norm of the last layer's
    /// output: what the head reads), `[n, d]`. `x` holds the last layer's
    /// output of the rows `out_rows` when `rest` is given (a pass asked for
    /// only some rows), else of every row; `rest` computes the others.
    pub(super) fn final_hidden(
        &self,
        pool: &ThreadPool,
        rows: &[Rows],
        mem: &mut Memory,
        out_rows: &[usize],
        x: &[f32],
        rest: Option<LastRows>,
    ) -> Result<Scratch, ModelError> {
        let d = self.info.n_embd;
        let n = rows.iter().map(|r| r.rows.len()).sum::<usize>();
        let mut all = Scratch::dirty(n * d);
        match rest {
            None => all.copy_from_slice(&x[..n * d]),
            Some(rest) => {
                let mut asked = vec![false; n];
                out_rows.iter().for_each(|&r| asked[r] = true);
                let others: Vec<usize> = (0..n).filter(|&r| !asked[r]).collect();
                let xo = self.last_layer_rows(pool, rows, mem, &others, rest)?;
                for (i, &r) in out_rows.iter().enumerate() {
                    all[r * d..(r + 1) * d].copy_from_slice(&x[i * d..(i + 1) * d]);
                }
                for (i, &r) in others.iter().enumerate() {
                    all[r * d..(r + 1) * d].copy_from_slice(&xo[i * d..(i + 1) * d]);
                }
            }
        }
        let mut h = Scratch::dirty(n * d);
        norm_rows(pool, &all, &self.head.norm, self.head.eps, &mut h, d);
        Ok(h)
    }

    /// The last layer's output of the rows `only` (ascending) of a pass
    /// that computed it for other rows: the mixer's output kept in `rest`,
    /// or attention's queries of these rows (their keys and values are in
    /// the cells already and are written again, the same), then the
    /// feed-forward.
    fn last_layer_rows(
        &self,
        pool: &ThreadPool,
        rows: &[Rows],
        mem: &mut Memory,
        only: &[usize],
        rest: LastRows,
    ) -> Result<Scratch, ModelError> {
        let d = self.info.n_embd;
        let last = self.layers.len() - 1;
        let layer = &self.layers[last];
        let m = only.len();
        let mut x = gather_rows(&rest.x, only, d);
        if !matches!(layer.mixer, MixerBlock::None) {
            let o = match rest.mixed {
                Some(all) => gather_rows(&all, only, d),
                None => {
                    let n = rest.x.len() / d;
                    let mut h = Scratch::dirty(n * d);
                    norm_rows(pool, &rest.x, &layer.norm, self.eps, &mut h, d);
                    let mut o = Scratch::dirty(n.max(1) * d);
                    if !self.mixer(pool, last, rows, mem, &h, Some(only), &mut o)? {
                        o = gather_rows(&o, only, d);
                    }
                    self.post_mixer_norm(pool, layer, &mut o[..m * d]);
                    o
                }
            };
            add_scaled_rows(pool, &mut x, self.scales.residual, &o[..m * d], d);
        }
        let (mut h, mut o) = (Scratch::dirty(m * d), Scratch::dirty(m * d));
        self.ffn_rows(pool, layer, &mut x, &mut h, &mut o, m);
        Ok(x)
    }

    /// The NextN block's attention cells for a pass's rows: row p of a
    /// chunk reads its token and the hidden state of the row before (the
    /// kept state for the chunk's first row), and the chunk's last hidden
    /// state is kept for the next pass. Outside a verification a chunk
    /// that fits beside the waiting rows ([`NEXTN_LAG`]) only joins them;
    /// else the waiting cells are caught up ([`DecoderStack::catch_up`])
    /// and the chunk's written with the pass's numerics. Only the keys and
    /// values are computed: nothing reads the block's output here. Under a
    /// verification each row's hidden state goes on the tape (a refold
    /// keeps the last kept row's).
    pub(super) fn nextn_cells(
        &self,
        pool: &ThreadPool,
        rows: &[Rows],
        mem: &mut Memory,
        tokens: &[u32],
        hidden: &[f32],
    ) -> Result<(), ModelError> {
        let at = self.nextn_at();
        let d = self.info.n_embd;
        let mut now = Pending::default();
        let mut behind = Vec::new();
        for r in rows {
            let (s, e) = (r.rows.start, r.rows.end);
            if s == e {
                continue;
            }
            let rec = recurrent_memory(mem, at)?;
            let lag = waiting_count(rec.conv_of(at, r.seq)?, d);
            let verifying = match rec.tape(at, r.seq) {
                Some(tape) => {
                    tape.extend_from_slice(&hidden[s * d..e * d]);
                    true
                }
                None => false,
            };
            let st = layer_state(rec, at, r.seq)?;
            let (h, wait, n) = split_state(st, d);
            if !verifying && lag + (e - s) <= NEXTN_LAG {
                wait[lag * d..(lag + 1) * d].copy_from_slice(h);
                wait[(lag + 1) * d..(lag + e - s) * d].copy_from_slice(&hidden[s * d..(e - 1) * d]);
                h.copy_from_slice(&hidden[(e - 1) * d..e * d]);
                *n = (lag + e - s) as f32;
                continue;
            }
            if lag > 0 {
                behind.push(r.seq);
            }
            let j = now.tokens.len();
            now.read.extend_from_slice(h);
            now.read.extend_from_slice(&hidden[s * d..(e - 1) * d]);
            h.copy_from_slice(&hidden[(e - 1) * d..e * d]);
            now.tokens.extend_from_slice(&tokens[s..e]);
            now.rows.push(Rows {
                seq: r.seq,
                pos: r.pos,
                rows: j..j + e - s,
            });
        }
        self.catch_up(pool, mem, &behind)?;
        self.block_cells(pool, mem, &now)
    }

    /// Writes the waiting cells of `seqs` (see the module's notes), in one
    /// pass with batch-invariant numerics.
    pub(super) fn catch_up(
        &self,
        pool: &ThreadPool,
        mem: &mut Memory,
        seqs: &[SeqId],
    ) -> Result<(), ModelError> {
        if !self.nextn_on(mem) {
            return Ok(());
        }
        let at = self.nextn_at();
        let d = self.info.n_embd;
        let mut now = Pending::default();
        for (i, &seq) in seqs.iter().enumerate() {
            let lag = waiting_count(recurrent_memory(mem, at)?.conv_of(at, seq)?, d);
            if lag == 0 || seqs[..i].contains(&seq) {
                continue;
            }
            let len = mem.seq_len(seq)?;
            let history = mem
                .seq_tokens(seq)?
                .get(len.wrapping_sub(lag)..len)
                .ok_or_else(|| bad_lag(at, seq))?;
            let j = now.tokens.len();
            now.tokens.extend_from_slice(history);
            let st = layer_state(recurrent_memory(mem, at)?, at, seq)?;
            let (_, wait, n) = split_state(st, d);
            now.read.extend_from_slice(&wait[..lag * d]);
            wait[..lag * d].fill(0.0);
            *n = 0.0;
            now.rows.push(Rows {
                seq,
                pos: len - lag,
                rows: j..j + lag,
            });
        }
        let _numerics = coil_kernels::invariant_scope(true);
        self.block_cells(pool, mem, &now)
    }

    /// The keys and values of the block for `now`'s rows, into its cells.
    fn block_cells(
        &self,
        pool: &ThreadPool,
        mem: &mut Memory,
        now: &Pending,
    ) -> Result<(), ModelError> {
        if now.rows.is_empty() {
            return Ok(());
        }
        let b = self.block()?;
        let d = self.info.n_embd;
        let x = b.input(
            &self.file,
            pool,
            &self.embed,
            &now.tokens,
            &now.read,
            self.eps,
        )?;
        let mut h = Scratch::dirty(x.len());
        norm_rows(pool, &x, &b.layer.norm, self.eps, &mut h, d);
        let mut none = Scratch::dirty(0);
        self.run_mixer(
            &b.layer,
            self.nextn_at(),
            pool,
            &now.rows,
            mem,
            &h,
            Some(&[]),
            &mut none,
        )?;
        Ok(())
    }

    /// After a verification of `seq` kept `n` tokens: the hidden state the
    /// block reads next is the verification's row `n − 1` (the state
    /// before it when nothing was kept).
    pub(super) fn refold_nextn(
        &self,
        mem: &mut Memory,
        seq: SeqId,
        n: usize,
    ) -> Result<(), ModelError> {
        let at = self.nextn_at();
        let d = self.info.n_embd;
        let no_tape = || ModelError::Tensor {
            name: format!("blk.{at}"),
            reason: "no verification tape to refold".into(),
        };
        let rec = recurrent_memory(mem, at)?;
        let (st, base, _, tape) = rec.refold_parts(at, seq).ok_or_else(no_tape)?;
        // The verification wrote every waiting cell: nothing waits after
        // it, and keeping none goes back to the state before it (whose
        // waiting cells are written already; writing them again changes
        // nothing).
        match n {
            0 => st.conv.copy_from_slice(base),
            _ => st.conv[..d].copy_from_slice(tape.get((n - 1) * d..n * d).ok_or_else(no_tape)?),
        }
        Ok(())
    }

    /// Greedy drafts (see [`crate::models::Model::draft_nextn`]): every
    /// sequence steps at once, one row each; step i of a sequence of length
    /// L sits at position L + i, reads the token before (the sampled one,
    /// then its own drafts) and the hidden state (the kept one, then the
    /// block's own output), and attends over the block's cells up to it.
    /// `sink` gets the first sequence's logits of every step.
    pub(super) fn draft(
        &self,
        pool: &ThreadPool,
        mem: &mut Memory,
        seqs: &[(SeqId, u32, usize)],
        mut sink: Option<&mut Vec<f32>>,
    ) -> Result<Vec<Vec<u32>>, ModelError> {
        if !self.nextn_on(mem) {
            return Err(if self.nextn.is_empty() {
                ModelError::NoNextn
            } else {
                ModelError::NextnMemory
            });
        }
        let b = self.block()?;
        let at = self.nextn_at();
        let d = self.info.n_embd;
        let n = seqs.len();
        let mut hid = Scratch::dirty(n * d);
        let mut base = Vec::with_capacity(n);
        for (i, &(s, t, k)) in seqs.iter().enumerate() {
            if seqs[..i].iter().any(|o| o.0 == s) {
                return Err(ModelError::Memory(
                    crate::memory::MemoryError::DuplicateSeq { seq: s },
                ));
            }
            if t as usize >= self.info.n_vocab {
                return Err(ModelError::BadToken {
                    token: t,
                    n_vocab: self.info.n_vocab,
                });
            }
            let len = mem.seq_len(s)?;
            // The drafts must fit the context (the verification holds them
            // and the sampled token).
            let room = mem.n_ctx().saturating_sub(len + 1);
            base.push((len, k.min(room)));
            let rec = recurrent_memory(mem, at)?;
            hid[i * d..(i + 1) * d].copy_from_slice(&rec.conv_of(at, s)?[..d]);
        }
        // The block attends over every position before its drafts.
        let drafting: Vec<SeqId> = seqs.iter().filter(|x| x.2 > 0).map(|x| x.0).collect();
        self.catch_up(pool, mem, &drafting)?;
        let head = b.shared_head_head.as_ref().unwrap_or(&self.head.output);
        let n_vocab = head.rows;
        let mut out: Vec<Vec<u32>> = vec![Vec::new(); n];
        let mut tokens: Vec<u32> = seqs.iter().map(|x| x.1).collect();
        // The sequences still drafting, by index into `seqs`.
        let mut live: Vec<usize> = (0..n).filter(|&i| base[i].1 > 0).collect();
        let mut step = 0;
        while !live.is_empty() {
            let a = live.len();
            let toks: Vec<u32> = live.iter().map(|&i| tokens[i]).collect();
            let read: Vec<f32> = live
                .iter()
                .flat_map(|&i| hid[i * d..(i + 1) * d].iter().copied())
                .collect();
            let rows: Vec<Rows> = live
                .iter()
                .enumerate()
                .map(|(j, &i)| Rows {
                    seq: seqs[i].0,
                    pos: base[i].0 + step,
                    rows: j..j + 1,
                })
                .collect();
            let mut x = b.input(&self.file, pool, &self.embed, &toks, &read, self.eps)?;
            let (mut h, mut o) = (Scratch::dirty(a * d), Scratch::dirty(a * d));
            norm_rows(pool, &x, &b.layer.norm, self.eps, &mut h, d);
            self.run_mixer(&b.layer, at, pool, &rows, mem, &h, None, &mut o)?;
            self.post_mixer_norm(pool, &b.layer, &mut o);
            add_scaled_rows(pool, &mut x, self.scales.residual, &o, d);
            self.ffn_rows(pool, &b.layer, &mut x, &mut h, &mut o, a);
            let mut m = Scratch::dirty(a * d);
            b.out_norm(&x, &self.head.norm, self.eps, &mut m);
            let mut logits = vec![0f32; a * n_vocab];
            matmul(pool, &head.get(&self.file), &m, &mut logits, a);
            let mut next = Vec::with_capacity(a);
            for (j, &i) in live.iter().enumerate() {
                let row = &logits[j * n_vocab..(j + 1) * n_vocab];
                if let (0, Some(s)) = (i, sink.as_deref_mut()) {
                    s.extend_from_slice(row);
                }
                let t = argmax(row) as u32;
                out[i].push(t);
                tokens[i] = t;
                hid[i * d..(i + 1) * d].copy_from_slice(&m[j * d..(j + 1) * d]);
                if out[i].len() < base[i].1 {
                    next.push(i);
                }
            }
            live = next;
            step += 1;
        }
        Ok(out)
    }
}

/// Most positions of a sequence whose NextN cells may wait (see the
/// module's notes): at `d` = 1024 the rows take 128 KiB per sequence state.
pub(crate) const NEXTN_LAG: usize = 32;

/// Words of the NextN layer's conv region: `[h (d) | waiting (NEXTN_LAG·d)
/// | count]`.
pub(crate) fn nextn_state_words(d: usize) -> usize {
    d * (1 + NEXTN_LAG) + 1
}

/// The waiting count of a NextN state (its last word).
fn waiting_count(conv: &[f32], d: usize) -> usize {
    conv.get(d * (1 + NEXTN_LAG)).map_or(0, |&n| n as usize)
}

/// `[h | waiting | count]` of a NextN layer's state.
fn split_state(st: LayerState<'_>, d: usize) -> (&mut [f32], &mut [f32], &mut f32) {
    let (h, rest) = st.conv.split_at_mut(d);
    let (wait, n) = rest.split_at_mut(NEXTN_LAG * d);
    (h, wait, &mut n[0])
}

fn bad_lag(at: usize, seq: SeqId) -> ModelError {
    ModelError::Tensor {
        name: format!("blk.{at}"),
        reason: format!("sequence {seq}: more waiting NextN cells than positions"),
    }
}

/// Rows whose NextN cells are written in one pass: their tokens, the hidden
/// states they read (`[n, d]`) and where they sit.
#[derive(Default)]
struct Pending {
    tokens: Vec<u32>,
    read: Vec<f32>,
    rows: Vec<Rows>,
}
