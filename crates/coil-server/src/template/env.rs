//! The minijinja environment that renders Hugging Face chat templates the
//! way transformers' Jinja2 environment does: trim_blocks and
//! lstrip_blocks, loop controls, Python's `str()` for printed values,
//! transformers' `tojson` (json.dumps, not HTML-safe JSON), Jinja2's tests
//! and filters where minijinja's differ (`iterable`, `sequence`, `number`,
//! `length` and `items` of undefined, `string`, `trim`), Python string /
//! dict methods (minijinja-contrib's pycompat), `raise_exception`,
//! `strftime_now`, and the `{% generation %}` block of transformers'
//! AssistantTracker (rendered as its body).

use super::python::{self, JsonStyle};
use super::strftime::strftime;
use minijinja::value::{Kwargs, ValueKind};
use minijinja::{Environment, Error, ErrorKind, Value};

/// The name the template is stored under (it shows in error messages as
/// `(in chat:LINE)`).
pub const NAME: &str = "chat";

/// Where `strftime_now` reads the time.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Clock {
    System,
    /// Seconds since 1970-01-01 UTC (tests, reproducible renders).
    Fixed(u64),
}

/// An environment holding `source` as the template [`NAME`].
pub fn build(source: &str, clock: Clock) -> Result<Environment<'static>, Error> {
    let mut env = Environment::new();
    env.set_trim_blocks(true);
    env.set_lstrip_blocks(true);
    env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
    env.set_formatter(|out, _state, value| {
        out.write_str(&python::str_of(value))
            .map_err(|_| Error::new(ErrorKind::WriteFailure, "writing the output"))
    });
    env.add_filter("tojson", tojson);
    env.add_filter("string", |v: &Value| string(v));
    env.add_filter("length", length);
    env.add_filter("count", length);
    env.add_filter("items", items);
    env.add_filter("trim", trim);
    env.add_test("iterable", is_iterable);
    env.add_test("sequence", is_sequence);
    env.add_test("number", is_number);
    env.add_test("integer", |v: &Value| v.is_integer());
    env.add_test("float", |v: &Value| v.is_number() && !v.is_integer());
    env.add_function("raise_exception", raise_exception);
    set_clock(&mut env, clock);
    env.add_template_owned(NAME, without_generation_tags(source))?;
    Ok(env)
}

pub fn set_clock(env: &mut Environment<'static>, clock: Clock) {
    env.add_function("strftime_now", move |format: String| {
        let secs = match clock {
            Clock::Fixed(s) => s,
            Clock::System => std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.as_secs())
                .unwrap_or(0),
        };
        strftime(&format, secs)
    });
}

fn raise_exception(msg: String) -> Result<Value, Error> {
    Err(Error::new(ErrorKind::InvalidOperation, msg))
}

/// transformers' `tojson(x, ensure_ascii=False, indent=None,
/// separators=None, sort_keys=False)`: Python's json.dumps.
fn tojson(value: &Value, kwargs: Kwargs) -> Result<Value, Error> {
    let mut st = JsonStyle::default();
    let indent: Option<Value> = kwargs.get("indent")?;
    if let Some(ind) = indent.filter(|v| !v.is_none()) {
        st.indent = Some(match ind.kind() {
            ValueKind::String => ind.as_str().unwrap_or_default().to_string(),
            _ => {
                let n = usize::try_from(ind.clone()).map_err(|_| {
                    Error::new(
                        ErrorKind::InvalidOperation,
                        "tojson: indent must be an integer or a string",
                    )
                })?;
                " ".repeat(n)
            }
        });
        st.item_sep = ",".into();
    }
    let separators: Option<Value> = kwargs.get("separators")?;
    if let Some(seps) = separators.filter(|v| !v.is_none()) {
        let parts: Vec<Value> = seps.try_iter()?.collect();
        match parts.as_slice() {
            [a, b] if a.as_str().is_some() && b.as_str().is_some() => {
                st.item_sep = a.as_str().unwrap_or_default().to_string();
                st.key_sep = b.as_str().unwrap_or_default().to_string();
            }
            _ => {
                return Err(Error::new(
                    ErrorKind::InvalidOperation,
                    "tojson: separators must be two strings",
                ))
            }
        }
    }
    st.sort_keys = kwargs.get::<Option<bool>>("sort_keys")?.unwrap_or(false);
    st.ensure_ascii = kwargs.get::<Option<bool>>("ensure_ascii")?.unwrap_or(false);
    kwargs.assert_all_used()?;
    python::json_dumps(value, &st).map(Value::from_safe_string)
}

/// `value | string`: Python's `str(value)` (a safe string stays safe).
fn string(v: &Value) -> Value {
    if v.is_safe() {
        return v.clone();
    }
    Value::from(python::str_of(v))
}

/// `len(value)`: undefined counts 0 (Jinja2's Undefined), none and numbers
/// have no length.
fn length(v: &Value) -> Result<usize, Error> {
    if v.is_undefined() {
        return Ok(0);
    }
    v.len().ok_or_else(|| {
        Error::new(
            ErrorKind::InvalidOperation,
            format!("object of type {} has no len()", python_type(v)),
        )
    })
}

/// `mapping | items`: its (key, value) pairs; nothing for undefined.
fn items(v: &Value) -> Result<Value, Error> {
    if v.is_undefined() {
        return Ok(Value::from(Vec::<Value>::new()));
    }
    if v.kind() != ValueKind::Map {
        return Err(Error::new(
            ErrorKind::InvalidOperation,
            format!("{} object has no attribute 'items'", python_type(v)),
        ));
    }
    let mut out = Vec::new();
    for k in v.try_iter()? {
        let item = v.get_item(&k)?;
        out.push(Value::from(vec![k, item]));
    }
    Ok(Value::from(out))
}

/// `value | trim(chars=None)`: `str(value).strip(chars)`.
fn trim(v: &Value, chars: Option<String>) -> Value {
    let s = python::str_of(v);
    let t = match chars {
        Some(c) => s.trim_matches(|x| c.contains(x)).to_string(),
        None => s.trim().to_string(),
    };
    Value::from(t)
}

/// Python's `iter(value)` succeeds: strings, lists, dicts, undefined — not
/// None, booleans or numbers.
fn is_iterable(v: &Value) -> bool {
    matches!(
        v.kind(),
        ValueKind::String
            | ValueKind::Bytes
            | ValueKind::Seq
            | ValueKind::Map
            | ValueKind::Iterable
            | ValueKind::Undefined
    )
}

/// Jinja2's `sequence` test: has `len()` and `[]` — strings and dicts too.
fn is_sequence(v: &Value) -> bool {
    matches!(
        v.kind(),
        ValueKind::String
            | ValueKind::Bytes
            | ValueKind::Seq
            | ValueKind::Map
            | ValueKind::Undefined
    )
}

/// Python's `isinstance(value, numbers.Number)`: booleans are numbers.
fn is_number(v: &Value) -> bool {
    matches!(v.kind(), ValueKind::Number | ValueKind::Bool)
}

fn python_type(v: &Value) -> &'static str {
    match v.kind() {
        ValueKind::None => "'NoneType'",
        ValueKind::Bool => "'bool'",
        ValueKind::Number if v.is_integer() => "'int'",
        ValueKind::Number => "'float'",
        ValueKind::String => "'str'",
        ValueKind::Seq => "'list'",
        ValueKind::Map => "'dict'",
        _ => "this",
    }
}

/// transformers' `{% generation %}…{% endgeneration %}` marks the
/// assistant's text for training masks and renders its body unchanged:
/// rewritten as `{% if true %}…{% endif %}` with the same whitespace
/// control, so that the output is the same.
pub fn without_generation_tags(source: &str) -> String {
    let mut out = String::with_capacity(source.len());
    let mut rest = source;
    while let Some(start) = rest.find("{%") {
        out.push_str(&rest[..start]);
        let tag = &rest[start..];
        let Some(end) = tag.find("%}") else {
            out.push_str(tag);
            return out;
        };
        let inner = &tag[2..end];
        let (open_ctl, body) = split_ctl_start(inner);
        let (body, close_ctl) = split_ctl_end(body);
        let replacement = match body.trim() {
            "generation" => Some("if true"),
            "endgeneration" => Some("endif"),
            _ => None,
        };
        match replacement {
            Some(r) => {
                out.push_str("{%");
                out.push_str(open_ctl);
                out.push(' ');
                out.push_str(r);
                out.push(' ');
                out.push_str(close_ctl);
                out.push_str("%}");
            }
            None => out.push_str(&tag[..end + 2]),
        }
        rest = &tag[end + 2..];
    }
    out.push_str(rest);
    out
}

fn split_ctl_start(s: &str) -> (&str, &str) {
    match s.as_bytes().first() {
        Some(b'-' | b'+') => (&s[..1], &s[1..]),
        _ => ("", s),
    }
}

fn split_ctl_end(s: &str) -> (&str, &str) {
    match s.as_bytes().last() {
        Some(b'-' | b'+') => (&s[..s.len() - 1], &s[s.len() - 1..]),
        _ => (s, ""),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn render(src: &str, ctx: serde_json::Value) -> Result<String, Error> {
        let env = build(src, Clock::Fixed(0))?;
        env.get_template(NAME)?.render(ctx)
    }

    #[test]
    fn generation_blocks_render_their_body() {
        let src = "a\n{%- generation -%}\n b {% endgeneration %}c";
        assert_eq!(
            without_generation_tags(src),
            "a\n{%- if true -%}\n b {% endif %}c"
        );
        assert_eq!(render(src, serde_json::json!({})).unwrap(), "ab c");
    }

    #[test]
    fn values_print_and_test_as_in_jinja2() {
        let ctx = serde_json::json!({"n": null, "t": true, "l": [1, "a"], "f": 2.0});
        let out = render(
            "{{ n }} {{ t }} {{ l }} {{ f }} {{ t | string }} {{ u | length }} \
             {{ n is iterable }} {{ u is iterable }} {{ 's' is sequence }} {{ t is number }}",
            ctx,
        )
        .unwrap();
        assert_eq!(out, "None True [1, 'a'] 2.0 True 0 False True True True");
        let e = render("{{ n | length }}", serde_json::json!({"n": null})).unwrap_err();
        assert!(e.to_string().contains("NoneType"), "{e}");
        let out = render(
            "{{ d | tojson }}|{{ d | tojson(indent=2) }}|{{ d | tojson(separators=(',', ':')) }}",
            serde_json::json!({"d": {"b": "<&>", "a": [1]}}),
        )
        .unwrap();
        assert_eq!(
            out,
            "{\"b\": \"<&>\", \"a\": [1]}|{\n  \"b\": \"<&>\",\n  \"a\": [\n    1\n  ]\n}|{\"b\":\"<&>\",\"a\":[1]}"
        );
        let out = render(
            "{% for k, v in d | items %}{{ k }}={{ v }};{% endfor %}{% for x in u | items %}x{% endfor %}",
            serde_json::json!({"d": {"z": 1, "a": false}}),
        )
        .unwrap();
        assert_eq!(out, "z=1;a=False;");
    }
}
