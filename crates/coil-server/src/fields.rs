//! Nothing a client sends is silently ignored: a request's top-level
//! fields are each one the endpoint implements or harmless metadata
//! ([`METADATA`]); any other field — one that would change the output and
//! that coil does not implement, or a misspelling — is a 400 naming it.

use crate::api::ApiError;
use serde_json::Value;

/// Fields accepted by every endpoint without effect on the output: who is
/// asking, storage and billing hints, cache keys.
pub const METADATA: &[&str] = &[
    "user",
    "metadata",
    "store",
    "service_tier",
    "prompt_cache_key",
    "safety_identifier",
    "cache_prompt",
];

/// Checks the top-level fields of the JSON object `body` (anything else
/// is left to the typed parse): each must be in one of `implemented` or
/// in [`METADATA`].
pub fn check(body: &[u8], implemented: &[&[&str]]) -> Result<(), ApiError> {
    let Ok(Value::Object(map)) = serde_json::from_slice::<Value>(body) else {
        return Ok(());
    };
    for key in map.keys() {
        let k = key.as_str();
        if METADATA.contains(&k) || implemented.iter().any(|list| list.contains(&k)) {
            continue;
        }
        return Err(unsupported(k));
    }
    Ok(())
}

/// The 400 for a field coil does not implement.
pub fn unsupported(field: &str) -> ApiError {
    let mut e = ApiError::bad_request(format!(
        "unsupported field \"{field}\": coil does not implement it, and ignoring it could change the output; remove it (the fields each endpoint takes are listed in coil's README)"
    ));
    e.code = Some("unsupported_field");
    e.param_owned(field)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unknown_fields_are_named_metadata_passes() {
        let ok = br#"{"a": 1, "user": "u", "metadata": {}, "store": false}"#;
        assert!(check(ok, &[&["a"]]).is_ok());
        let e = check(br#"{"a": 1, "audio": {}}"#, &[&["a"]]).unwrap_err();
        assert_eq!(e.status, 400);
        assert!(e.message.contains("\"audio\""), "{}", e.message);
        assert_eq!(e.body()["error"]["param"], "audio");
        // not an object: the typed parse reports it
        assert!(check(b"[1]", &[]).is_ok());
    }
}
