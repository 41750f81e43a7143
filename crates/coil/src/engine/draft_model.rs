//! Drafts from a second, smaller model with the same vocabulary
//! (`--model-draft`): it follows the target's sequence token for token and
//! proposes its own greedy continuation.
//!
//! The draft model keeps a sequence for each of the target's (the same
//! ids), brought to the target's tokens before each draft: the tokens fed since (a prompt, the target's
//! corrections) go through it as a prompt; then the token just sampled and
//! the drafts are fed one at a time under a speculative verification of
//! the draft model's own, so that the next draft keeps exactly the prefix
//! the target accepted (a refold of its recurrent state, its attention
//! cells cut) and never replays it. A longer rollback (the target's
//! sequence went back) restores a checkpoint and replays, as any rollback.

use super::sampling::argmax;
use super::{Engine, EngineError};
use crate::memory::{SeqId, SequenceMemory};
use crate::models::LogitRows;
use coil_gguf::{GgufFile, Value};

/// A draft model's engine, following the target's sequences.
pub struct DraftModel {
    pub engine: Engine,
    /// Tokens the target's vocabulary has: drafting stops at any other.
    target_vocab: usize,
}

impl DraftModel {
    /// The draft model `draft` for `target`: checks that they share the
    /// vocabulary (every token of the smaller one spelled the same in the
    /// other) and that the draft model was trained for at least the
    /// context the target runs at (or its own training context, if less),
    /// and that it holds as many sequences as the target.
    pub fn new(draft: Engine, target: &Engine) -> Result<Self, EngineError> {
        if let Some(why) = vocab_mismatch(&target.file, &draft.file) {
            return Err(EngineError::Invalid(format!(
                "the draft model's vocabulary is not the target's: {why}"
            )));
        }
        let (ti, di) = (target.model.info(), draft.model.info());
        let need = target.opts.n_ctx.min(ti.n_ctx_train.max(1));
        if di.n_ctx_train > 0 && di.n_ctx_train < need {
            return Err(EngineError::Invalid(format!(
                "the draft model was trained for a context of {} tokens, smaller than the {need} \
                 the target runs at (lower --ctx to {} or use another draft model)",
                di.n_ctx_train, di.n_ctx_train
            )));
        }
        if draft.opts.n_ctx < target.opts.n_ctx {
            return Err(EngineError::Invalid(format!(
                "the draft model's context ({}) is smaller than the target's ({})",
                draft.opts.n_ctx, target.opts.n_ctx
            )));
        }
        let (tn, dn) = (target.mem.n_seq_max(), draft.mem.n_seq_max());
        if dn < tn {
            return Err(EngineError::Invalid(format!(
                "the draft model holds {dn} sequences, the target {tn}"
            )));
        }
        Ok(DraftModel {
            target_vocab: target.n_vocab(),
            engine: draft,
        })
    }

    /// Up to `k` greedy drafts after `history` (the tokens of the target's
    /// sequence `seq`) and `next` (the token just sampled for it). The draft
    /// model's sequence `seq` follows whatever the target's held before:
    /// only the common prefix is kept.
    pub fn draft(
        &mut self,
        seq: SeqId,
        history: &[u32],
        next: u32,
        k: usize,
    ) -> Result<Vec<u32>, EngineError> {
        let e = &mut self.engine;
        if (next as usize) >= e.n_vocab() {
            return Ok(Vec::new());
        }
        // End the last draft's verification at the prefix the target kept.
        if let Some(base) = e.mem.spec_base(seq) {
            let have = e.mem.seq_tokens(seq)?;
            let p = common_prefix(have, history);
            e.spec_commit(seq, p.clamp(base, have.len()) - base)?;
        }
        let p = common_prefix(e.mem.seq_tokens(seq)?, history);
        if p < e.mem.seq_len(seq)? {
            e.seq_truncate(seq, p)?;
        }
        if p < history.len() {
            e.eval(seq, &history[p..], LogitRows::None, 0)?;
        }
        let k = k.min(e.spec_room(seq)? + 1);
        let mut out = Vec::with_capacity(k);
        if k == 0 {
            return Ok(out);
        }
        e.spec_begin(seq)?;
        let mut t = next;
        while out.len() < k {
            let logits = e.eval(seq, &[t], LogitRows::Last, 1)?;
            let d = argmax(&logits) as u32;
            if d as usize >= self.target_vocab {
                break;
            }
            out.push(d);
            t = d;
        }
        Ok(out)
    }
}

fn common_prefix(a: &[u32], b: &[u32]) -> usize {
    a.iter().zip(b).take_while(|(x, y)| x == y).count()
}

/// Why the token lists of two files differ (`None`: the smaller list is a
/// prefix of the other, or neither file has one and their sizes agree).
fn vocab_mismatch(target: &GgufFile, draft: &GgufFile) -> Option<String> {
    let tokens = |f: &GgufFile| -> Option<Vec<String>> {
        match f.metadata().get("tokenizer.ggml.tokens") {
            Some(Value::Array(_, items)) => Some(
                items
                    .iter()
                    .map(|v| match v {
                        Value::String(s) => s.clone(),
                        other => other.to_string(),
                    })
                    .collect(),
            ),
            _ => None,
        }
    };
    let model = |f: &GgufFile| match f.metadata().get("tokenizer.ggml.model") {
        Some(Value::String(s)) => s.clone(),
        _ => String::new(),
    };
    if model(target) != model(draft) {
        return Some(format!(
            "tokenizer {:?} against {:?}",
            model(target),
            model(draft)
        ));
    }
    match (tokens(target), tokens(draft)) {
        (Some(t), Some(d)) => {
            let n = t.len().min(d.len());
            if let Some(i) = (0..n).find(|&i| t[i] != d[i]) {
                return Some(format!(
                    "token {i} is {:?} in the target and {:?} in the draft model",
                    t[i], d[i]
                ));
            }
            // A few padding tokens apart is the same vocabulary; more is not.
            let extra = t.len().abs_diff(d.len());
            (extra > 128).then(|| {
                format!(
                    "{} tokens in the target, {} in the draft model",
                    t.len(),
                    d.len()
                )
            })
        }
        (None, None) => None,
        _ => Some("only one of the files carries a token list".into()),
    }
}

#[cfg(test)]
mod tests {
    use super::common_prefix;

    #[test]
    fn prefix() {
        assert_eq!(common_prefix(&[1, 2, 3], &[1, 2, 4, 5]), 2);
        assert_eq!(common_prefix(&[], &[1]), 0);
        assert_eq!(common_prefix(&[1, 2], &[1, 2]), 2);
    }
}
