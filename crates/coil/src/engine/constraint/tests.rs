//! Constraints on a small hand-made byte vocabulary: masks, commits,
//! speculative rollback and forks.

use super::*;
use crate::tokenizer::{Tokenizer, Vocab};

/// A byte-level BPE vocabulary: `<|end|>` (0, end of generation), the 95
/// printable ASCII bytes and newline, and a few merged tokens.
fn tokenizer() -> Arc<Tokenizer> {
    let mut tokens = vec!["<|end|>".to_string()];
    for b in (0x20u8..0x7f).chain([b'\n']) {
        tokens.push(byte_text(b));
    }
    for extra in ["{\"", "\":", "ab", "true"] {
        tokens.push(extra.bytes().map(byte_text).collect());
    }
    let mut v = Vocab::bpe(tokens, Vec::new(), Some("gpt-2"));
    v.eos_id = Some(0);
    let mut types = vec![crate::tokenizer::TokenType::Normal; v.tokens.len()];
    types[0] = crate::tokenizer::TokenType::Control;
    v.token_types = types;
    Arc::new(Tokenizer::new(v).unwrap())
}

/// GPT-2's printable stand-in for a byte.
fn byte_text(b: u8) -> String {
    let c = if (b'!'..=b'~').contains(&b) {
        b as u32
    } else if b == b' ' {
        0x120
    } else if b == b'\n' {
        0x10a
    } else {
        256 + b as u32
    };
    char::from_u32(c).unwrap().to_string()
}

fn id(t: &Tokenizer, s: &str) -> u32 {
    t.token_to_id(&s.bytes().map(byte_text).collect::<String>())
        .unwrap_or_else(|| panic!("no token {s:?}"))
}

/// Greedy decoding of `c` over flat logits that prefer the highest id:
/// whatever the constraint allows last in the vocabulary.
fn decode(t: &Tokenizer, c: &mut Constraint, max: usize) -> String {
    let n = t.n_vocab();
    let logits: Vec<f32> = (0..n).map(|i| i as f32 * 0.01).collect();
    let mut s =
        crate::engine::sampling::Sampler::new(crate::engine::sampling::SamplingParams::greedy());
    let mut out = Vec::new();
    for _ in 0..max {
        let m = c.mask(0).unwrap().clone();
        let tok = s.sample_masked(&logits, Some(&m));
        assert!(m.allows(tok));
        if t.is_eog(tok) {
            break;
        }
        c.commit(tok).unwrap();
        out.push(tok);
        if c.is_finished() {
            break;
        }
    }
    String::from_utf8(t.decode_bytes(&out)).unwrap()
}

#[test]
fn json_schema_forces_valid_json() {
    let t = tokenizer();
    let cs = Constraints::new(t.clone()).unwrap();
    let schema = serde_json::json!({
        "type": "object",
        "properties": {"ok": {"type": "boolean"}, "n": {"type": "integer", "minimum": 0, "maximum": 9}},
        "required": ["ok", "n"],
        "additionalProperties": false
    });
    let mut c = cs.compile(&ConstraintSpec::JsonSchema(schema)).unwrap();
    let out = decode(&t, &mut c, 64);
    let v: serde_json::Value = serde_json::from_str(&out).unwrap_or_else(|e| panic!("{out}: {e}"));
    assert!(v["ok"].is_boolean() && v["n"].is_u64(), "{out}");
}

#[test]
fn speculative_rollback_restores_the_state() {
    let t = tokenizer();
    let cs = Constraints::new(t.clone()).unwrap();
    let mut c = cs
        .compile(&ConstraintSpec::Gbnf("root ::= [xy] [0-9]+ \"!\"\n".into()))
        .unwrap();
    let (one, two, bang, x) = (id(&t, "1"), id(&t, "2"), id(&t, "!"), id(&t, "x"));
    let m = c.mask(0).unwrap();
    assert!(m.allows(x) && !m.allows(one) && !m.allows(0));
    c.commit(x).unwrap();
    let fresh = c.fork();
    // A draft the constraint cuts at its first disallowed token.
    assert_eq!(c.propose(&[one, two, x, bang]), 2);
    c.prepare().unwrap();
    assert!(c.mask(2).unwrap().allows(bang));
    assert!(!c.mask(0).unwrap().allows(bang));
    // One draft accepted, the second rejected: back to "x1".
    c.settle(1).unwrap();
    assert!(c.mask(0).unwrap().allows(bang));
    c.commit(bang).unwrap();
    assert!(c.is_finished());
    assert!(c.mask(0).unwrap().allows(0));
    // The fork taken before is untouched.
    let mut f = fresh;
    assert!(!f.mask(0).unwrap().allows(bang));
    f.commit(one).unwrap();
    assert!(f.mask(0).unwrap().allows(bang));
    // Every draft accepted (advanced through without `prepare`), then the
    // bonus token.
    let mut g = f.fork();
    assert_eq!(g.propose(&[two, two]), 2);
    g.settle(2).unwrap();
    assert!(g.mask(0).unwrap().allows(bang));
    g.commit(bang).unwrap();
    assert!(g.is_finished());
    // A token the mask does not allow is refused.
    let mut h = f.fork();
    assert!(h.commit(x).is_err());
}

#[test]
fn bad_input_is_named() {
    let t = tokenizer();
    let cs = Constraints::new(t).unwrap();
    let e = cs
        .compile(&ConstraintSpec::JsonSchema(
            serde_json::json!({"properties": {"a": {"type": "strin"}}}),
        ))
        .unwrap_err();
    assert!(
        matches!(e, ConstraintError::Schema(ref m) if m.contains("properties.a.type")),
        "{e}"
    );
    let e = cs
        .compile(&ConstraintSpec::Gbnf("root ::= (\"a\"\n".into()))
        .unwrap_err();
    assert!(
        matches!(e, ConstraintError::Grammar(ref m) if m.contains("line 2")),
        "{e}"
    );
    let e = cs
        .compile(&ConstraintSpec::JsonSchema(
            serde_json::json!({"type": "integer", "minimum": 5, "maximum": 3}),
        ))
        .unwrap_err();
    assert!(matches!(e, ConstraintError::Unsatisfiable(_)), "{e}");
    // A character this vocabulary has no token for.
    let e = cs
        .compile(&ConstraintSpec::Gbnf("root ::= \"é\"\n".into()))
        .unwrap_err();
    assert!(matches!(e, ConstraintError::Unsatisfiable(_)), "{e}");
}
