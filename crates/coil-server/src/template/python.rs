//! Python's `str()`, `repr()` and `json.dumps()` of template values: what
//! Jinja2 (and so transformers' chat-template renderer) prints for
//! `{{ value }}`, `value | string` and `value | tojson`.

use minijinja::value::ValueKind;
use minijinja::{Error, ErrorKind, Value};
use std::fmt::Write;

/// `str(value)`: strings as they are, `None`, `True`, floats as Python
/// prints them, lists and dicts as their `repr`; undefined is empty.
pub fn str_of(v: &Value) -> String {
    match v.kind() {
        ValueKind::Undefined => String::new(),
        ValueKind::String => v.as_str().unwrap_or_default().to_string(),
        _ => repr(v),
    }
}

/// `repr(value)`.
pub fn repr(v: &Value) -> String {
    let mut out = String::new();
    write_repr(&mut out, v);
    out
}

fn write_repr(out: &mut String, v: &Value) {
    match v.kind() {
        ValueKind::Undefined => {}
        ValueKind::None => out.push_str("None"),
        ValueKind::Bool => out.push_str(if v.is_true() { "True" } else { "False" }),
        ValueKind::Number => out.push_str(&number(v, false)),
        ValueKind::String => repr_str(out, v.as_str().unwrap_or_default()),
        ValueKind::Seq | ValueKind::Iterable => {
            out.push('[');
            for (i, item) in v.try_iter().into_iter().flatten().enumerate() {
                if i > 0 {
                    out.push_str(", ");
                }
                write_repr(out, &item);
            }
            out.push(']');
        }
        ValueKind::Map => {
            out.push('{');
            for (i, key) in v.try_iter().into_iter().flatten().enumerate() {
                if i > 0 {
                    out.push_str(", ");
                }
                write_repr(out, &key);
                out.push_str(": ");
                write_repr(out, &v.get_item(&key).unwrap_or_default());
            }
            out.push('}');
        }
        _ => {
            let _ = write!(out, "{v}");
        }
    }
}

/// A string literal as Python writes it: single quotes unless the text has
/// a single quote and no double quote.
fn repr_str(out: &mut String, s: &str) {
    let quote = if s.contains('\'') && !s.contains('"') {
        '"'
    } else {
        '\''
    };
    out.push(quote);
    for c in s.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if c == quote => {
                out.push('\\');
                out.push(c);
            }
            c if (c as u32) < 0x20 || c as u32 == 0x7f => {
                let _ = write!(out, "\\x{:02x}", c as u32);
            }
            c => out.push(c),
        }
    }
    out.push(quote);
}

/// An integer in decimal, a float as Python's `repr` (shortest round-trip
/// digits; exponent form below 1e-4 and from 1e16). `json`: NaN and the
/// infinities as `json.dumps` writes them.
fn number(v: &Value, json: bool) -> String {
    if v.is_integer() {
        return v.to_string();
    }
    let f = f64::try_from(v.clone()).unwrap_or(f64::NAN);
    float_repr(f, json)
}

pub fn float_repr(f: f64, json: bool) -> String {
    if f.is_nan() {
        return if json { "NaN" } else { "nan" }.into();
    }
    if f.is_infinite() {
        let sign = if f < 0.0 { "-" } else { "" };
        return format!("{sign}{}", if json { "Infinity" } else { "inf" });
    }
    // Shortest round-trip digits and the decimal exponent: "d.ddde±x".
    let sci = format!("{f:e}");
    let (mantissa, exp) = sci.split_once('e').unwrap_or((&sci, "0"));
    let exp: i32 = exp.parse().unwrap_or(0);
    let (sign, mantissa) = match mantissa.strip_prefix('-') {
        Some(m) => ("-", m),
        None => ("", mantissa),
    };
    let digits: String = mantissa.chars().filter(|c| *c != '.').collect();
    if (-4..16).contains(&exp) {
        let n = digits.len() as i32;
        let s = if exp < 0 {
            format!("0.{}{digits}", "0".repeat((-exp - 1) as usize))
        } else if exp + 1 >= n {
            format!("{digits}{}.0", "0".repeat((exp + 1 - n) as usize))
        } else {
            let (a, b) = digits.split_at((exp + 1) as usize);
            format!("{a}.{b}")
        };
        format!("{sign}{s}")
    } else {
        let (first, rest) = digits.split_at(1);
        let frac = if rest.is_empty() {
            String::new()
        } else {
            format!(".{rest}")
        };
        let esign = if exp < 0 { '-' } else { '+' };
        format!("{sign}{first}{frac}e{esign}{:02}", exp.abs())
    }
}

/// `json.dumps` options as transformers' `tojson` filter takes them.
#[derive(Clone, Debug)]
pub struct JsonStyle {
    /// `None`: one line; `Some(s)`: newlines, `s` per nesting level.
    pub indent: Option<String>,
    pub item_sep: String,
    pub key_sep: String,
    pub sort_keys: bool,
    pub ensure_ascii: bool,
}

impl Default for JsonStyle {
    fn default() -> Self {
        JsonStyle {
            indent: None,
            item_sep: ", ".into(),
            key_sep: ": ".into(),
            sort_keys: false,
            ensure_ascii: false,
        }
    }
}

/// `json.dumps(value, ...)`: fails on values JSON has no form for.
pub fn json_dumps(v: &Value, style: &JsonStyle) -> Result<String, Error> {
    let mut out = String::new();
    write_json(&mut out, v, style, 0)?;
    Ok(out)
}

fn write_json(out: &mut String, v: &Value, st: &JsonStyle, depth: usize) -> Result<(), Error> {
    let newline = |out: &mut String, depth: usize| {
        if let Some(ind) = &st.indent {
            out.push('\n');
            for _ in 0..depth {
                out.push_str(ind);
            }
        }
    };
    match v.kind() {
        ValueKind::None => out.push_str("null"),
        ValueKind::Bool => out.push_str(if v.is_true() { "true" } else { "false" }),
        ValueKind::Number => out.push_str(&number(v, true)),
        ValueKind::String => json_str(out, v.as_str().unwrap_or_default(), st.ensure_ascii),
        ValueKind::Seq | ValueKind::Iterable => {
            let items: Vec<Value> = v.try_iter()?.collect();
            if items.is_empty() {
                out.push_str("[]");
                return Ok(());
            }
            out.push('[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push_str(&st.item_sep);
                }
                newline(out, depth + 1);
                write_json(out, item, st, depth + 1)?;
            }
            newline(out, depth);
            out.push(']');
        }
        ValueKind::Map => {
            let mut keys: Vec<Value> = v.try_iter()?.collect();
            if keys.is_empty() {
                out.push_str("{}");
                return Ok(());
            }
            if st.sort_keys {
                keys.sort();
            }
            out.push('{');
            for (i, key) in keys.iter().enumerate() {
                if i > 0 {
                    out.push_str(&st.item_sep);
                }
                newline(out, depth + 1);
                // JSON keys are strings: Python converts None, booleans and
                // numbers the way json.dumps writes them.
                match key.kind() {
                    ValueKind::String => {
                        json_str(out, key.as_str().unwrap_or_default(), st.ensure_ascii)
                    }
                    ValueKind::None => out.push_str("\"null\""),
                    ValueKind::Bool | ValueKind::Number => {
                        let mut k = String::new();
                        write_json(&mut k, key, st, 0)?;
                        json_str(out, &k, st.ensure_ascii);
                    }
                    other => {
                        return Err(Error::new(
                            ErrorKind::InvalidOperation,
                            format!("keys must be str, int, float, bool or None, not {other}"),
                        ))
                    }
                }
                out.push_str(&st.key_sep);
                write_json(out, &v.get_item(key)?, st, depth + 1)?;
            }
            newline(out, depth);
            out.push('}');
        }
        other => {
            return Err(Error::new(
                ErrorKind::InvalidOperation,
                format!("Object of type {other} is not JSON serializable"),
            ))
        }
    }
    Ok(())
}

/// A JSON string as Python's json module writes it: `"`, `\` and control
/// characters escaped (short forms where JSON has them), other text as is
/// (or as `\uXXXX` with `ensure_ascii`).
fn json_str(out: &mut String, s: &str, ensure_ascii: bool) {
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            '\u{8}' => out.push_str("\\b"),
            '\u{c}' => out.push_str("\\f"),
            c if (c as u32) < 0x20 => {
                let _ = write!(out, "\\u{:04x}", c as u32);
            }
            c if ensure_ascii && (c as u32) > 0x7e => {
                let mut buf = [0u16; 2];
                for unit in c.encode_utf16(&mut buf) {
                    let _ = write!(out, "\\u{unit:04x}");
                }
            }
            c => out.push(c),
        }
    }
    out.push('"');
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn floats_print_as_python_repr() {
        let cases = [
            (1.0, "1.0"),
            (2.5, "2.5"),
            (0.1, "0.1"),
            (-0.0, "-0.0"),
            (1e16, "1e+16"),
            (1.5e-7, "1.5e-07"),
            (123456789.125, "123456789.125"),
            (0.0001, "0.0001"),
            (0.00001234, "1.234e-05"),
            (1e100, "1e+100"),
            (9999999999999998.0, "9999999999999998.0"),
        ];
        for (f, want) in cases {
            assert_eq!(float_repr(f, false), want, "{f}");
        }
        assert_eq!(float_repr(f64::INFINITY, true), "Infinity");
        assert_eq!(float_repr(f64::NAN, false), "nan");
    }

    #[test]
    fn reprs_and_json_match_python() {
        let v = Value::from_serialize(serde_json::json!({
            "b": [1, 2.0, true, null, "it's"], "a": {"x": "say \"hi\"\n"}
        }));
        assert_eq!(
            repr(&v),
            r#"{'b': [1, 2.0, True, None, "it's"], 'a': {'x': 'say "hi"\n'}}"#
        );
        let st = JsonStyle::default();
        assert_eq!(
            json_dumps(&v, &st).unwrap(),
            r#"{"b": [1, 2.0, true, null, "it's"], "a": {"x": "say \"hi\"\n"}}"#
        );
        let st = JsonStyle {
            indent: Some("  ".into()),
            item_sep: ",".into(),
            sort_keys: true,
            ensure_ascii: true,
            ..JsonStyle::default()
        };
        let v = Value::from_serialize(serde_json::json!({"z": [], "é": {"k": [1]}}));
        assert_eq!(
            json_dumps(&v, &st).unwrap(),
            "{\n  \"z\": [],\n  \"\\u00e9\": {\n    \"k\": [\n      1\n    ]\n  }\n}"
        );
        assert!(json_dumps(&Value::UNDEFINED, &JsonStyle::default()).is_err());
        assert_eq!(str_of(&Value::from("x")), "x");
        assert_eq!(str_of(&Value::from(())), "None");
    }
}
