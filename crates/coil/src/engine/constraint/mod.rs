//! Structured outputs: a grammar or JSON-schema constraint on the tokens a
//! sequence generates, through llguidance (the Earley parser with a
//! derivative-based lexer that llama.cpp, vLLM and SGLang use).
//!
//! A [`Constraint`] is per-sequence state, like the recurrent state: it
//! advances with each committed token ([`Constraint::commit`]), forks with
//! the sequence ([`Constraint::fork`]) and rolls back with it
//! ([`Constraint::settle`] after a speculative verification). What it gives
//! the sampler is a [`TokenMask`] per position: the tokens that keep the
//! output a prefix of some sentence of the grammar (end-of-generation
//! tokens only where the output is complete). Masks are computed beside the
//! forward pass ([`beside`]): the mask for the next position depends only on
//! the tokens committed so far, not on the logits, so it is ready when the
//! pass ends.
//!
//! [`Constraints`] compiles requests ([`ConstraintSpec`]) for one
//! tokenizer: JSON (any object, or a schema: checked first by
//! [`schema::check`], which names the path of a fault), llama.cpp's GBNF
//! (translated by [`gbnf::to_lark`], which names the line and column of a
//! fault) and llguidance's Lark (what tool-call formats are written in).

pub mod gbnf;
pub mod schema;
mod vocab;

use crate::tokenizer::Tokenizer;
use llguidance::api::TopLevelGrammar;
use llguidance::toktrie::{SimpleVob, TokEnv};
use llguidance::{Matcher, ParserFactory};
use serde_json::{json, Value};
use std::sync::Arc;

#[derive(Clone, Debug, PartialEq, thiserror::Error)]
pub enum ConstraintError {
    /// The grammar does not parse or refers to what is not there.
    #[error("{0}")]
    Grammar(String),
    /// The JSON schema is not one (the message names the path).
    #[error("{0}")]
    Schema(String),
    /// No output satisfies the constraint (with this vocabulary).
    #[error("{0}")]
    Unsatisfiable(String),
    /// The constraint failed while generating.
    #[error("the output constraint failed: {0}")]
    Failed(String),
}

/// What a request constrains its output to.
#[derive(Clone, Debug, PartialEq)]
pub enum ConstraintSpec {
    /// Any JSON object (OpenAI's `response_format: {"type": "json_object"}`).
    JsonObject,
    /// JSON valid against a schema.
    JsonSchema(Value),
    /// A grammar in llama.cpp's GBNF.
    Gbnf(String),
    /// A grammar in llguidance's Lark dialect (`%json {...}` inlines a
    /// schema; `<|name|>` names a control token).
    Lark(String),
}

/// How JSON is written under a constraint: no free whitespace (a model
/// cannot pad the output with blank lines forever), one space after `,`
/// and `:` as most models write it.
fn json_options() -> Value {
    json!({
        "whitespace_flexible": false,
        "item_separator": ", ",
        "key_separator": ": ",
    })
}

/// A JSON schema with coil's writing options, as llguidance takes it.
pub fn schema_with_options(schema: &Value) -> Value {
    let mut s = match schema {
        // `true` / `{}`: any JSON value.
        Value::Bool(true) => json!({}),
        other => other.clone(),
    };
    if let Some(obj) = s.as_object_mut() {
        obj.entry("x-guidance").or_insert_with(json_options);
    }
    s
}

/// Compiles constraints for one tokenizer. Building it reads the whole
/// vocabulary (a token trie and llguidance's token slices: ~0.1–0.5 s on a
/// 248k-token vocabulary); build it once per model and share it.
pub struct Constraints {
    factory: ParserFactory,
    tokenizer: Arc<Tokenizer>,
    n_vocab: usize,
}

impl std::fmt::Debug for Constraints {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Constraints")
            .field("n_vocab", &self.n_vocab)
            .finish_non_exhaustive()
    }
}

impl Constraints {
    pub fn new(tokenizer: Arc<Tokenizer>) -> Result<Self, ConstraintError> {
        let n_vocab = tokenizer.n_vocab();
        let env: TokEnv = Arc::new(vocab::CoilTokEnv::new(tokenizer.clone()));
        let mut factory = ParserFactory::new_simple(&env)
            .map_err(|e| ConstraintError::Failed(format!("building the token trie: {e}")))?;
        factory.quiet();
        Ok(Constraints {
            factory,
            tokenizer,
            n_vocab,
        })
    }

    /// Tokens the masks cover (the tokenizer's vocabulary; a model's
    /// padded logits rows beyond it are never allowed).
    pub fn n_vocab(&self) -> usize {
        self.n_vocab
    }

    /// Compiles `spec` into a fresh constraint and computes its first mask:
    /// a grammar or schema at fault, and one that no output of this
    /// vocabulary satisfies, are errors here, before any generation.
    pub fn compile(&self, spec: &ConstraintSpec) -> Result<Constraint, ConstraintError> {
        let (grammar, bad): (TopLevelGrammar, fn(String) -> ConstraintError) = match spec {
            ConstraintSpec::JsonObject => (
                TopLevelGrammar::from_json_schema(schema_with_options(&json!({"type": "object"}))),
                ConstraintError::Schema,
            ),
            ConstraintSpec::JsonSchema(s) => {
                schema::check(s).map_err(ConstraintError::Schema)?;
                (
                    TopLevelGrammar::from_json_schema(schema_with_options(s)),
                    |m| ConstraintError::Schema(format!("invalid JSON schema: {m}")),
                )
            }
            ConstraintSpec::Gbnf(text) => {
                let tok = &self.tokenizer;
                let lark = gbnf::to_lark(text, &|t| tok.token_to_id(t), self.n_vocab)
                    .map_err(|e| ConstraintError::Grammar(e.to_string()))?;
                (TopLevelGrammar::from_lark(lark), |m| {
                    ConstraintError::Grammar(format!("invalid grammar: {m}"))
                })
            }
            ConstraintSpec::Lark(text) => (TopLevelGrammar::from_lark(text.clone()), |m| {
                ConstraintError::Grammar(format!("invalid grammar: {m}"))
            }),
        };
        let parser = self.factory.create_parser(grammar).map_err(|e| {
            let m = first_line(&e.to_string()).to_string();
            if m.to_ascii_lowercase().contains("unsatisfiable") {
                ConstraintError::Unsatisfiable(format!("no output satisfies the constraint: {m}"))
            } else {
                bad(m)
            }
        })?;
        let mut c = Constraint {
            matcher: Matcher::new(Ok(parser)),
            draft: Vec::new(),
            consumed: 0,
            masks: Vec::new(),
        };
        if let Some(e) = c.matcher.get_error() {
            return Err(bad(e));
        }
        // llguidance stops with no token allowed (`NoExtensionBias`) when
        // nothing can start the output.
        let first = c.mask(0).map_err(|e| {
            ConstraintError::Unsatisfiable(format!("no output satisfies the constraint ({e})"))
        })?;
        if first.is_empty() {
            return Err(ConstraintError::Unsatisfiable(
                "no output satisfies the constraint: no token of this model's vocabulary can start it"
                    .into(),
            ));
        }
        Ok(c)
    }
}

/// llguidance's messages may go on with a dump of the parser's state.
fn first_line(m: &str) -> &str {
    m.lines().next().unwrap_or(m).trim_end()
}

/// The tokens allowed at one position.
#[derive(Clone, Debug)]
pub struct TokenMask(SimpleVob);

impl TokenMask {
    pub fn allows(&self, token: u32) -> bool {
        (token as usize) < self.0.len() && self.0.is_allowed(token)
    }

    /// How many tokens are allowed.
    pub fn count(&self) -> usize {
        self.0.num_set()
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_zero()
    }

    /// `logits` with every token the mask does not allow at −∞, into `out`
    /// (rows longer than the vocabulary: the padding is never allowed).
    pub fn apply(&self, logits: &[f32], out: &mut Vec<f32>) {
        out.clear();
        out.resize(logits.len(), f32::NEG_INFINITY);
        let words = self.0.as_slice();
        for (w, &bits) in words.iter().enumerate() {
            if bits == 0 {
                continue;
            }
            let base = w * 32;
            if bits == u32::MAX && base + 32 <= logits.len() {
                out[base..base + 32].copy_from_slice(&logits[base..base + 32]);
                continue;
            }
            let mut b = bits;
            while b != 0 {
                let i = base + b.trailing_zeros() as usize;
                if i < logits.len() {
                    out[i] = logits[i];
                }
                b &= b - 1;
            }
        }
    }
}

/// One sequence's constraint state (see the module's notes).
///
/// For a speculative verification, [`Constraint::propose`] takes the
/// drafts the constraint allows, [`Constraint::prepare`] advances through
/// them computing the mask of each verified position (beside the
/// verification pass), [`Constraint::mask`]`(j)` gives position `j`'s, and
/// [`Constraint::settle`] rolls back the drafts that were not accepted.
#[derive(Clone)]
pub struct Constraint {
    matcher: Matcher,
    /// Drafts under verification.
    draft: Vec<u32>,
    /// How many of them the matcher has consumed.
    consumed: usize,
    /// `masks[j]`: the mask after the committed tokens and `draft[..j]`.
    masks: Vec<TokenMask>,
}

impl std::fmt::Debug for Constraint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Constraint")
            .field("draft", &self.draft)
            .field("consumed", &self.consumed)
            .field("masks", &self.masks.len())
            .finish_non_exhaustive()
    }
}

impl Constraint {
    fn failed(&self, what: &str, e: impl std::fmt::Display) -> ConstraintError {
        ConstraintError::Failed(format!("{what}: {}", first_line(&e.to_string())))
    }

    /// Computes the masks the next sampling needs: the current position's,
    /// and with a draft proposed, every verified position's. Run it beside
    /// the forward pass.
    pub fn prepare(&mut self) -> Result<(), ConstraintError> {
        while self.masks.len() <= self.draft.len() {
            let j = self.masks.len();
            if j > 0 && self.consumed < j {
                self.matcher
                    .consume_token(self.draft[j - 1])
                    .map_err(|e| self.failed("advancing through a draft", e))?;
                self.consumed = j;
            }
            let m = self
                .matcher
                .compute_mask_or_eos()
                .map_err(|e| self.failed("computing the token mask", e))?;
            self.masks.push(TokenMask(m));
        }
        Ok(())
    }

    /// The mask of position `j` of the current verification (0: the next
    /// token; without a draft, the only one).
    pub fn mask(&mut self, j: usize) -> Result<&TokenMask, ConstraintError> {
        if j > self.draft.len() {
            return Err(ConstraintError::Failed(format!(
                "no mask for position {j} of a verification of {} drafts",
                self.draft.len()
            )));
        }
        self.prepare()?;
        let m = &self.masks[j];
        if m.is_empty() {
            return Err(ConstraintError::Failed(
                "no token is allowed at this position".into(),
            ));
        }
        Ok(m)
    }

    /// Takes the longest prefix of `draft` the constraint allows, to be
    /// verified; returns its length. Changes nothing until [`prepare`].
    ///
    /// [`prepare`]: Constraint::prepare
    pub fn propose(&mut self, draft: &[u32]) -> usize {
        self.draft.clear();
        let n = if draft.is_empty() {
            0
        } else {
            self.matcher.validate_tokens(draft).unwrap_or(0)
        };
        self.draft.extend_from_slice(&draft[..n]);
        // Only the current position's mask stays valid.
        self.masks.truncate(1);
        n
    }

    /// Ends a verification keeping the first `accepted` drafts: the matcher
    /// goes back to the state after them, exactly (llguidance keeps its
    /// parser stack per token), as the sequence's memory does.
    pub fn settle(&mut self, accepted: usize) -> Result<(), ConstraintError> {
        let accepted = accepted.min(self.draft.len());
        if self.consumed > accepted {
            self.matcher
                .rollback(self.consumed - accepted)
                .map_err(|e| self.failed("rolling back rejected drafts", e))?;
        }
        if self.consumed < accepted {
            self.matcher
                .consume_tokens(&self.draft[self.consumed..accepted])
                .map_err(|e| self.failed("advancing through accepted drafts", e))?;
        }
        let keep = (accepted < self.masks.len()).then(|| self.masks.swap_remove(accepted));
        self.masks.clear();
        self.masks.extend(keep);
        self.draft.clear();
        self.consumed = 0;
        Ok(())
    }

    /// Advances past a sampled token (an end-of-generation token is not
    /// committed: the generation ends on it).
    pub fn commit(&mut self, token: u32) -> Result<(), ConstraintError> {
        if !self.draft.is_empty() {
            return Err(ConstraintError::Failed(
                "a token committed during a verification".into(),
            ));
        }
        self.matcher
            .consume_token(token)
            .map_err(|e| self.failed(&format!("token {token} was not allowed"), e))?;
        self.masks.clear();
        Ok(())
    }

    /// Whether the output is complete and nothing can follow (only an
    /// end-of-generation token is allowed): generation ends here.
    pub fn is_finished(&self) -> bool {
        self.matcher.is_stopped()
    }

    /// Whether the output so far is a whole sentence of the grammar.
    pub fn is_accepting(&mut self) -> bool {
        self.matcher.is_accepting().unwrap_or(false)
    }

    /// An independent copy for a forked sequence.
    pub fn fork(&self) -> Constraint {
        self.clone()
    }
}

/// Runs `forward` on this thread while `masks` (the constraints' mask
/// computation, see [`Constraint::prepare`]) runs on another; returns
/// both results. With nothing to prepare, no thread is started.
pub fn beside<T>(
    constraints: &mut [&mut Constraint],
    forward: impl FnOnce() -> T,
) -> (T, Result<(), ConstraintError>) {
    if constraints.is_empty() {
        return (forward(), Ok(()));
    }
    std::thread::scope(|s| {
        let worker = s.spawn(move || {
            for c in constraints.iter_mut() {
                c.prepare()?;
            }
            Ok(())
        });
        let out = forward();
        let prepared = worker.join().unwrap_or_else(|_| {
            Err(ConstraintError::Failed(
                "the mask computation panicked".into(),
            ))
        });
        (out, prepared)
    })
}

#[cfg(test)]
mod tests;
