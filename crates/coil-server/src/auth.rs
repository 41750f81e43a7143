//! `--api-key`: every route but `/health` and the chat page requires
//! `Authorization: Bearer KEY` (or `x-api-key: KEY`, as Anthropic's clients
//! send it); a missing or wrong key gets 401 in the API's error format
//! (`invalid_api_key`).

use crate::api::ApiError;
use axum::extract::{Request, State};
use axum::http::{header, HeaderValue};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use std::sync::Arc;

/// Paths open without a key: what load balancers and routers probe, and
/// the chat page (which holds no data and asks for the key itself).
const OPEN_PATHS: &[&str] = &["/health", "/"];

/// Middleware (`axum::middleware::from_fn_with_state` with the key).
pub async fn require_api_key(State(key): State<Arc<str>>, req: Request, next: Next) -> Response {
    if OPEN_PATHS.contains(&req.uri().path()) {
        return next.run(req).await;
    }
    let given = req
        .headers()
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(bearer_token)
        .or_else(|| {
            req.headers()
                .get("x-api-key")
                .and_then(|v| v.to_str().ok())
                .map(str::trim)
        });
    match given {
        Some(k) if same_key(k.as_bytes(), key.as_bytes()) => next.run(req).await,
        Some(_) => unauthorized("Incorrect API key provided."),
        None => unauthorized(
            "You didn't provide an API key. Send it in an Authorization header: Bearer KEY.",
        ),
    }
}

/// The token of `Bearer TOKEN` (the scheme's name in any case).
fn bearer_token(value: &str) -> Option<&str> {
    let (scheme, token) = value.trim().split_once(' ')?;
    scheme
        .eq_ignore_ascii_case("bearer")
        .then(|| token.trim())
        .filter(|t| !t.is_empty())
}

/// Compares in time that depends only on the lengths, not on where the
/// first difference lies.
fn same_key(a: &[u8], b: &[u8]) -> bool {
    if a.len() != b.len() {
        return false;
    }
    a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

fn unauthorized(message: &str) -> Response {
    let err = ApiError {
        status: 401,
        message: message.into(),
        kind: "invalid_request_error",
        param: None,
        code: Some("invalid_api_key"),
    };
    let mut res = err.into_response();
    res.headers_mut()
        .insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
    res
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_bearer_tokens() {
        assert_eq!(bearer_token("Bearer abc"), Some("abc"));
        assert_eq!(bearer_token("bearer  abc "), Some("abc"));
        assert_eq!(bearer_token("Basic abc"), None);
        assert_eq!(bearer_token("Bearer "), None);
        assert_eq!(bearer_token("abc"), None);
        assert!(same_key(b"k1", b"k1"));
        assert!(!same_key(b"k1", b"k2"));
        assert!(!same_key(b"k1", b"k12"));
    }
}
