//! Every error the server answers is the API's own JSON error object: the
//! handlers build [`ApiError`]s themselves, and this middleware rewrites the
//! rest — axum's own rejections (a body over the size limit: 413, a wrong
//! method: 405, an unreadable body) arrive as plain text or empty — into
//! OpenAI's `{"error": {"message", "type", "param", "code"}}` with the same
//! status and headers; on Anthropic's paths (`/v1/messages…`) every error
//! becomes Anthropic's `{"type": "error", "error": {"type", "message"}}`.

use crate::api::ApiError;
use axum::body::Body;
use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let status = StatusCode::from_u16(self.status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
        (status, Json(self.body())).into_response()
    }
}

/// Longest plain-text rejection kept as the error's message.
const MAX_MESSAGE: usize = 4096;

/// Middleware (`axum::middleware::from_fn`): errors in the shape of the
/// path's API (see the module's note).
pub async fn api_errors(req: axum::extract::Request, next: axum::middleware::Next) -> Response {
    let anthropic = req.uri().path().starts_with("/v1/messages");
    let res = openai_errors(next.run(req).await).await;
    if anthropic {
        anthropic_errors(res).await
    } else {
        res
    }
}

/// OpenAI's error body as Anthropic's.
async fn anthropic_errors(res: Response) -> Response {
    let status = res.status();
    if !(status.is_client_error() || status.is_server_error()) {
        return res;
    }
    let (mut parts, body) = res.into_parts();
    let bytes = axum::body::to_bytes(body, 1 << 20)
        .await
        .unwrap_or_default();
    let v: serde_json::Value = serde_json::from_slice(&bytes).unwrap_or_default();
    let message = v["error"]["message"]
        .as_str()
        .unwrap_or("error")
        .to_string();
    let body = crate::anthropic::error_body(status.as_u16(), &message);
    parts.headers.remove(header::CONTENT_LENGTH);
    Response::from_parts(parts, Body::from(body.to_string()))
}

/// Middleware (`axum::middleware::map_response`): an error status whose body
/// is not JSON becomes OpenAI's error object, its text the message.
pub async fn openai_errors(res: Response) -> Response {
    let status = res.status();
    if !(status.is_client_error() || status.is_server_error()) || is_json(&res) {
        return res;
    }
    let (mut parts, body) = res.into_parts();
    let text = axum::body::to_bytes(body, MAX_MESSAGE)
        .await
        .map(|b| String::from_utf8_lossy(&b).trim().to_string())
        .unwrap_or_default();
    let err = from_status(status, text);
    parts.headers.remove(header::CONTENT_LENGTH);
    parts.headers.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    Response::from_parts(parts, Body::from(err.body().to_string()))
}

fn is_json(res: &Response) -> bool {
    res.headers()
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.starts_with("application/json"))
}

/// The error object for a bare status and the text (maybe empty) that
/// came with it.
pub fn from_status(status: StatusCode, text: String) -> ApiError {
    let (kind, code, default) = match status {
        StatusCode::PAYLOAD_TOO_LARGE => (
            "invalid_request_error",
            Some("request_too_large"),
            "the request body is too large",
        ),
        StatusCode::METHOD_NOT_ALLOWED => (
            "invalid_request_error",
            Some("method_not_allowed"),
            "this method is not allowed on this path",
        ),
        StatusCode::NOT_FOUND => ("invalid_request_error", None, "no such route"),
        StatusCode::UNAUTHORIZED => (
            "invalid_request_error",
            Some("invalid_api_key"),
            "a valid API key is required",
        ),
        s if s.is_server_error() => ("server_error", None, "internal server error"),
        _ => ("invalid_request_error", None, "invalid request"),
    };
    let message = match (text.is_empty(), status) {
        (true, _) => default.to_string(),
        (false, StatusCode::PAYLOAD_TOO_LARGE) => format!("{default}: {text}"),
        (false, _) => text,
    };
    ApiError {
        status: status.as_u16(),
        message,
        kind,
        param: None,
        code,
    }
}

/// `err` with a `Retry-After: secs` header (503s a client should retry).
pub fn with_retry_after(err: ApiError, secs: u64) -> Response {
    let mut res = err.into_response();
    if let Ok(v) = HeaderValue::from_str(&secs.to_string()) {
        res.headers_mut().insert(header::RETRY_AFTER, v);
    }
    res
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn plain_rejections_become_openai_errors() {
        let res = (StatusCode::PAYLOAD_TOO_LARGE, "length limit exceeded").into_response();
        let res = openai_errors(res).await;
        assert_eq!(res.status(), 413);
        assert!(is_json(&res));
        let body = axum::body::to_bytes(res.into_body(), 1 << 16)
            .await
            .unwrap();
        let v: serde_json::Value = serde_json::from_slice(&body).unwrap();
        assert_eq!(v["error"]["code"], "request_too_large");
        assert!(v["error"]["message"]
            .as_str()
            .unwrap()
            .contains("length limit"));

        let res = openai_errors(StatusCode::METHOD_NOT_ALLOWED.into_response()).await;
        let body = axum::body::to_bytes(res.into_body(), 1 << 16)
            .await
            .unwrap();
        let v: serde_json::Value = serde_json::from_slice(&body).unwrap();
        assert_eq!(v["error"]["type"], "invalid_request_error");
        assert_eq!(v["error"]["code"], "method_not_allowed");

        // Success and JSON errors pass untouched.
        let ok = openai_errors("fine".into_response()).await;
        assert_eq!(ok.status(), 200);
        let mine = ApiError::bad_request("x").with_param("p").into_response();
        let res = openai_errors(mine).await;
        let body = axum::body::to_bytes(res.into_body(), 1 << 16)
            .await
            .unwrap();
        let v: serde_json::Value = serde_json::from_slice(&body).unwrap();
        assert_eq!(v["error"]["param"], "p");
    }
}
