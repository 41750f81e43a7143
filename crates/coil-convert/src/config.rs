//! `config.json` (or Mistral's `params.json`) as a key → value table, with
//! the look-ups llama.cpp's converter does (`find_hparam`: the first of
//! several names that is present) and range checks that name the field.

use crate::error::{ConvertError, Result};
use serde_json::{Map, Value};
use std::path::Path;

/// The model's hyper-parameters.
#[derive(Clone, Debug, Default)]
pub struct Config {
    map: Map<String, Value>,
}

/// Python's `json.dump` writes non-finite floats as bare `Infinity`, `-Infinity`
/// and `NaN`, which are not JSON; turn them into transformers' own spelling
/// `{"__float__": "Infinity"}` (outside strings only).
pub(crate) fn sanitize_json(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut in_str = false;
    let mut escaped = false;
    let mut rest = text;
    while let Some(c) = rest.chars().next() {
        if in_str {
            out.push(c);
            if escaped {
                escaped = false;
            } else if c == '\\' {
                escaped = true;
            } else if c == '"' {
                in_str = false;
            }
            rest = &rest[c.len_utf8()..];
            continue;
        }
        if c == '"' {
            in_str = true;
        } else {
            let mut replaced = false;
            for (word, val) in [
                ("-Infinity", "-Infinity"),
                ("Infinity", "Infinity"),
                ("NaN", "NaN"),
            ] {
                if rest.starts_with(word) {
                    out.push_str(&format!("{{\"__float__\": \"{val}\"}}"));
                    rest = &rest[word.len()..];
                    replaced = true;
                    break;
                }
            }
            if replaced {
                continue;
            }
        }
        out.push(c);
        rest = &rest[c.len_utf8()..];
    }
    out
}

/// Reads a JSON file (with the non-finite float fix-up).
pub(crate) fn read_json(path: &Path) -> Result<Value> {
    let text = std::fs::read_to_string(path).map_err(|source| ConvertError::Io {
        path: path.to_path_buf(),
        source,
    })?;
    serde_json::from_str(&sanitize_json(&text)).map_err(|e| ConvertError::Json {
        path: path.to_path_buf(),
        reason: e.to_string(),
    })
}

/// A JSON number, or transformers' `{"__float__": "Infinity"}`.
pub(crate) fn as_f64(v: &Value) -> Option<f64> {
    match v {
        Value::Number(n) => n.as_f64(),
        Value::Object(o) => match o.get("__float__")?.as_str()? {
            "Infinity" | "inf" => Some(f64::INFINITY),
            "-Infinity" | "-inf" => Some(f64::NEG_INFINITY),
            "NaN" | "nan" => Some(f64::NAN),
            s => s.parse().ok(),
        },
        _ => None,
    }
}

impl Config {
    pub fn from_value(v: Value, what: &Path) -> Result<Config> {
        match v {
            Value::Object(mut map) => {
                // Multimodal wrappers keep the language model's settings in a
                // sub-table; llama.cpp lifts it to the top level.
                for key in ["llm_config", "text_config"] {
                    if let Some(Value::Object(sub)) = map.get(key).cloned() {
                        for (k, v) in sub {
                            map.insert(k, v);
                        }
                    }
                }
                Ok(Config { map })
            }
            _ => Err(ConvertError::Json {
                path: what.to_path_buf(),
                reason: "the top level is not an object".into(),
            }),
        }
    }

    pub fn load(path: &Path) -> Result<Config> {
        Config::from_value(read_json(path)?, path)
    }

    /// The raw value of `key`; JSON `null` counts as absent.
    pub fn get(&self, key: &str) -> Option<&Value> {
        self.map.get(key).filter(|v| !v.is_null())
    }

    pub fn contains(&self, key: &str) -> bool {
        self.get(key).is_some()
    }

    pub fn set(&mut self, key: &str, v: Value) {
        self.map.insert(key.to_string(), v);
    }

    pub fn remove(&mut self, key: &str) -> Option<Value> {
        self.map.remove(key)
    }

    /// The first of `keys` that is present: (name, value).
    pub fn find(&self, keys: &[&str]) -> Option<(String, &Value)> {
        keys.iter()
            .find_map(|k| self.get(k).map(|v| (k.to_string(), v)))
    }

    /// A non-negative integer from the first present key of `keys`. `None`
    /// when absent, 0, or a non-number such as `"auto"` (llama.cpp's
    /// `find_hparam(...) or default`); an error when negative or fractional.
    pub fn uint(&self, keys: &[&str]) -> Result<Option<u64>> {
        let Some((k, v)) = self.find(keys) else {
            return Ok(None);
        };
        match v {
            Value::Number(n) => {
                if let Some(u) = n.as_u64() {
                    Ok((u != 0).then_some(u))
                } else {
                    Err(ConvertError::config(
                        k,
                        format!("{n} is not a non-negative integer"),
                    ))
                }
            }
            Value::Bool(_) | Value::Array(_) | Value::Object(_) => Err(ConvertError::config(
                k,
                format!("expected an integer, found {v}"),
            )),
            _ => Ok(None),
        }
    }

    /// Like [`Config::uint`], but required and at least 1.
    pub fn req_uint(&self, keys: &[&str]) -> Result<u64> {
        self.uint(keys)?.ok_or_else(|| {
            ConvertError::config(
                keys.join(" | "),
                "missing (or zero) in config.json; it must be a positive integer",
            )
        })
    }

    /// Like [`Config::uint`] with a default for absent / 0.
    pub fn uint_or(&self, keys: &[&str], default: u64) -> Result<u64> {
        Ok(self.uint(keys)?.unwrap_or(default))
    }

    /// An integer that may legitimately be 0 (absent gives `None`).
    pub fn uint0(&self, keys: &[&str]) -> Result<Option<u64>> {
        let Some((k, v)) = self.find(keys) else {
            return Ok(None);
        };
        v.as_u64().map(Some).ok_or_else(|| {
            ConvertError::config(k, format!("expected a non-negative integer, found {v}"))
        })
    }

    /// A float from the first present key (`None` when absent or 0, as
    /// llama.cpp's `or default`).
    pub fn float(&self, keys: &[&str]) -> Result<Option<f64>> {
        let Some((k, v)) = self.find(keys) else {
            return Ok(None);
        };
        match as_f64(v) {
            Some(0.0) => Ok(None),
            Some(x) => Ok(Some(x)),
            None => Err(ConvertError::config(
                k,
                format!("expected a number, found {v}"),
            )),
        }
    }

    /// A float that may be 0.
    pub fn float0(&self, keys: &[&str]) -> Result<Option<f64>> {
        let Some((k, v)) = self.find(keys) else {
            return Ok(None);
        };
        as_f64(v)
            .map(Some)
            .ok_or_else(|| ConvertError::config(k, format!("expected a number, found {v}")))
    }

    pub fn str(&self, key: &str) -> Option<&str> {
        self.get(key).and_then(Value::as_str)
    }

    pub fn bool(&self, key: &str) -> Option<bool> {
        self.get(key).and_then(Value::as_bool)
    }

    /// A list of floats (e.g. Falcon-H1's `mlp_multipliers`).
    pub fn floats(&self, key: &str) -> Result<Option<Vec<f64>>> {
        let Some(v) = self.get(key) else {
            return Ok(None);
        };
        let arr = v.as_array().ok_or_else(|| {
            ConvertError::config(key, format!("expected a list of numbers, found {v}"))
        })?;
        arr.iter()
            .map(|x| {
                as_f64(x).ok_or_else(|| {
                    ConvertError::config(key, format!("expected a list of numbers, found {v}"))
                })
            })
            .collect::<Result<Vec<_>>>()
            .map(Some)
    }

    /// A list of integers (e.g. `attn_layer_indices`).
    pub fn uints(&self, key: &str) -> Result<Option<Vec<u64>>> {
        let Some(v) = self.get(key) else {
            return Ok(None);
        };
        let arr = v.as_array().ok_or_else(|| {
            ConvertError::config(key, format!("expected a list of integers, found {v}"))
        })?;
        arr.iter()
            .map(|x| {
                x.as_u64().ok_or_else(|| {
                    ConvertError::config(key, format!("expected a list of integers, found {v}"))
                })
            })
            .collect::<Result<Vec<_>>>()
            .map(Some)
    }

    /// A list of strings (e.g. `layer_types`).
    pub fn strs(&self, key: &str) -> Result<Option<Vec<String>>> {
        let Some(v) = self.get(key) else {
            return Ok(None);
        };
        let arr = v.as_array().ok_or_else(|| {
            ConvertError::config(key, format!("expected a list of strings, found {v}"))
        })?;
        arr.iter()
            .map(|x| {
                x.as_str().map(str::to_string).ok_or_else(|| {
                    ConvertError::config(key, format!("expected a list of strings, found {v}"))
                })
            })
            .collect::<Result<Vec<_>>>()
            .map(Some)
    }
}

/// Checks that a hyper-parameter fits a u32 GGUF key and is within `lo..=hi`.
pub(crate) fn check_range(field: &str, v: u64, lo: u64, hi: u64) -> Result<u32> {
    if v < lo || v > hi {
        return Err(ConvertError::config(
            field,
            format!("{v} is out of range ({lo}..={hi})"),
        ));
    }
    u32::try_from(v)
        .map_err(|_| ConvertError::config(field, format!("{v} does not fit in 32 bits")))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn infinity_spellings() {
        let s = sanitize_json(r#"{"a": [0.0, Infinity], "b": "Infinity NaN", "c": -Infinity}"#);
        let v: Value = serde_json::from_str(&s).unwrap();
        assert_eq!(as_f64(&v["a"][1]), Some(f64::INFINITY));
        assert_eq!(v["b"], "Infinity NaN");
        assert_eq!(as_f64(&v["c"]), Some(f64::NEG_INFINITY));
        let v: Value = serde_json::from_str(r#"{"x": {"__float__": "Infinity"}}"#).unwrap();
        assert_eq!(as_f64(&v["x"]), Some(f64::INFINITY));
    }

    #[test]
    fn lookups() {
        let v: Value = serde_json::from_str(
            r#"{"hidden_size": 32, "dt_rank": "auto", "neg": -3, "eps": 1e-5, "z": 0}"#,
        )
        .unwrap();
        let c = Config::from_value(v, Path::new("config.json")).unwrap();
        assert_eq!(c.uint(&["d_model", "hidden_size"]).unwrap(), Some(32));
        assert_eq!(c.uint(&["dt_rank"]).unwrap(), None);
        assert_eq!(c.uint_or(&["z"], 4).unwrap(), 4);
        assert!(c.uint(&["neg"]).unwrap_err().to_string().contains("neg"));
        assert!(c.req_uint(&["missing"]).is_err());
        assert_eq!(c.float(&["eps"]).unwrap(), Some(1e-5));
        assert!(check_range("x", 0, 1, 10).is_err());
    }
}
