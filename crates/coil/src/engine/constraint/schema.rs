//! A JSON schema's shape checked before compiling, so that a mistake is
//! reported with its path (`properties.age.type: ...`) rather than as
//! whatever the compiler makes of it. Keywords this does not know are left
//! to llguidance (which refuses what it cannot honour).

use serde_json::Value;

const TYPES: [&str; 7] = [
    "null", "boolean", "object", "array", "number", "integer", "string",
];

/// Keywords whose value is a schema.
const SCHEMA: [&str; 11] = [
    "items",
    "additionalProperties",
    "additionalItems",
    "not",
    "contains",
    "propertyNames",
    "unevaluatedProperties",
    "unevaluatedItems",
    "if",
    "then",
    "else",
];

/// Keywords whose value is a list of schemas.
const SCHEMA_LISTS: [&str; 4] = ["anyOf", "oneOf", "allOf", "prefixItems"];

/// Keywords whose value maps names to schemas.
const SCHEMA_MAPS: [&str; 5] = [
    "properties",
    "patternProperties",
    "$defs",
    "definitions",
    "dependentSchemas",
];

const NUMBERS: [&str; 5] = [
    "minimum",
    "maximum",
    "exclusiveMinimum",
    "exclusiveMaximum",
    "multipleOf",
];

const COUNTS: [&str; 8] = [
    "minLength",
    "maxLength",
    "minItems",
    "maxItems",
    "minProperties",
    "maxProperties",
    "minContains",
    "maxContains",
];

/// Checks `schema`; the error names the path of the first fault (`""` is
/// the schema itself).
pub fn check(schema: &Value) -> Result<(), String> {
    walk(schema, "")
}

fn join(path: &str, key: &str) -> String {
    if path.is_empty() {
        key.to_string()
    } else {
        format!("{path}.{key}")
    }
}

fn at(path: &str) -> String {
    if path.is_empty() {
        "the schema".to_string()
    } else {
        path.to_string()
    }
}

fn walk(s: &Value, path: &str) -> Result<(), String> {
    let obj = match s {
        Value::Bool(_) => return Ok(()),
        Value::Object(o) => o,
        other => {
            return Err(format!(
                "{} must be an object or a boolean, got {other}",
                at(path)
            ))
        }
    };
    for (k, v) in obj {
        let p = join(path, k);
        match k.as_str() {
            "type" => match v {
                Value::String(t) if TYPES.contains(&t.as_str()) => {}
                Value::Array(ts)
                    if !ts.is_empty()
                        && ts
                            .iter()
                            .all(|t| t.as_str().is_some_and(|t| TYPES.contains(&t))) => {}
                other => {
                    return Err(format!(
                        "{p} must be one of {} (or a list of them), got {other}",
                        TYPES.join(", ")
                    ))
                }
            },
            "required" => {
                let ok = v.as_array().is_some_and(|l| l.iter().all(Value::is_string));
                if !ok {
                    return Err(format!("{p} must be a list of property names, got {v}"));
                }
            }
            "enum" if !v.is_array() => {
                return Err(format!("{p} must be a list of values, got {v}"));
            }
            "pattern" | "format" | "$ref" | "$schema" | "$id" | "title" | "description"
                if !v.is_string() =>
            {
                return Err(format!("{p} must be a string, got {v}"));
            }
            k if SCHEMA.contains(&k) => walk(v, &p)?,
            k if SCHEMA_LISTS.contains(&k) => {
                let Some(list) = v.as_array() else {
                    return Err(format!("{p} must be a list of schemas, got {v}"));
                };
                if list.is_empty() && k != "prefixItems" {
                    return Err(format!("{p} must not be empty"));
                }
                for (i, item) in list.iter().enumerate() {
                    walk(item, &format!("{p}[{i}]"))?;
                }
            }
            k if SCHEMA_MAPS.contains(&k) => {
                let Some(map) = v.as_object() else {
                    return Err(format!("{p} must be an object of schemas, got {v}"));
                };
                for (name, item) in map {
                    walk(item, &join(&p, name))?;
                }
            }
            k if NUMBERS.contains(&k) => {
                if !v.is_number() {
                    return Err(format!("{p} must be a number, got {v}"));
                }
                if k == "multipleOf" && v.as_f64().is_some_and(|x| x <= 0.0) {
                    return Err(format!("{p} must be greater than 0, got {v}"));
                }
            }
            k if COUNTS.contains(&k) && !v.is_u64() => {
                return Err(format!("{p} must be a non-negative integer, got {v}"));
            }
            _ => {}
        }
    }
    let count = |k: &str| obj.get(k).and_then(Value::as_u64);
    for (lo, hi) in [
        ("minLength", "maxLength"),
        ("minItems", "maxItems"),
        ("minProperties", "maxProperties"),
    ] {
        if let (Some(a), Some(b)) = (count(lo), count(hi)) {
            if a > b {
                return Err(format!(
                    "{}: {lo} {a} is greater than {hi} {b}, so no value satisfies it",
                    at(path)
                ));
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn names_the_path() {
        let s = json!({"type": "object", "properties": {"age": {"type": "integr"}}});
        let e = check(&s).unwrap_err();
        assert!(e.starts_with("properties.age.type must be one of"), "{e}");
        let s = json!({"anyOf": [{"type": "string"}, {"items": 3}]});
        let e = check(&s).unwrap_err();
        assert!(e.starts_with("anyOf[1].items must be an object"), "{e}");
        let e = check(&json!({"required": "a"})).unwrap_err();
        assert!(e.starts_with("required must be a list"), "{e}");
        let e = check(&json!({"$defs": {"A": {"minLength": -1}}})).unwrap_err();
        assert!(e.starts_with("$defs.A.minLength"), "{e}");
        let e = check(&json!(3)).unwrap_err();
        assert!(e.starts_with("the schema must be"), "{e}");
        let e = check(&json!({"minItems": 3, "maxItems": 1})).unwrap_err();
        assert!(e.contains("no value satisfies"), "{e}");
        assert!(check(&json!({"type": ["string", "null"], "enum": ["a", null]})).is_ok());
        assert!(check(&json!(true)).is_ok());
    }
}
