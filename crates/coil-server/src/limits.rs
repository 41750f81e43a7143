//! What protects a server in production: an API key, a bound on requests
//! waiting (`--max-queue`, then 503 with `Retry-After`), a ceiling on
//! `max_tokens`, a request timeout, and the drain on shutdown (new
//! requests get 503 while those in flight finish).

use crate::api::ApiError;
use crate::errors::with_retry_after;
use crate::http_metrics::InFlight;
use crate::metrics::Metrics;
use axum::response::Response;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// The HTTP side's settings (`coil serve` flags).
#[derive(Clone, Debug, Default)]
pub struct HttpOptions {
    /// Required as `Authorization: Bearer KEY` on every route but `/health`.
    pub api_key: Option<String>,
    /// Requests that may wait for a slot beyond those running; more get
    /// 503 with `Retry-After`. `None`: unbounded.
    pub max_queue: Option<usize>,
    /// Most tokens one request may generate (a larger `max_tokens` is a
    /// 400; an absent one takes at most this). `None`: the context.
    pub max_tokens: Option<usize>,
    /// A request still running this long after it arrived is ended: 504,
    /// or an error event on a stream. `None`: no limit.
    pub request_timeout: Option<Duration>,
    /// No chat page at `/` (`--no-ui`).
    pub no_ui: bool,
    /// A GBNF grammar constraining the output of every request that sets
    /// no constraint of its own (`--grammar-file`); checked at startup.
    pub grammar: Option<String>,
}

/// Seconds a client is told to wait after a 503.
const RETRY_AFTER_QUEUE: u64 = 1;
const RETRY_AFTER_DRAIN: u64 = 5;

/// [`HttpOptions`] and the state they need, shared by the handlers.
#[derive(Debug, Default)]
pub struct Limits {
    pub opts: HttpOptions,
    /// Requests processed at once (`--parallel`).
    parallel: usize,
    draining: AtomicBool,
}

impl Limits {
    pub fn new(opts: HttpOptions, parallel: usize) -> Self {
        Limits {
            opts,
            parallel,
            draining: AtomicBool::new(false),
        }
    }

    /// From now on new requests get 503 and `/health` reports draining.
    pub fn start_draining(&self) {
        self.draining.store(true, Ordering::Relaxed);
    }

    pub fn is_draining(&self) -> bool {
        self.draining.load(Ordering::Relaxed)
    }

    /// Admits a generation request that arrived at `start`, or refuses it
    /// (shutting down; the queue is full).
    pub fn admit(&self, m: &Arc<Metrics>, start: Instant) -> Result<InFlight, Refused> {
        let reject = |err: ApiError, retry_after| {
            m.http.rejected.fetch_add(1, Ordering::Relaxed);
            Err(Refused { err, retry_after })
        };
        if self.is_draining() {
            return reject(
                ApiError::unavailable("the server is shutting down; retry on another replica"),
                RETRY_AFTER_DRAIN,
            );
        }
        let guard = InFlight::new(m.clone(), start);
        if let Some(q) = self.opts.max_queue {
            // Counted with this request: more than parallel + q in flight
            // means more than q would wait.
            let in_flight = m.http.in_flight.load(Ordering::Relaxed) as usize;
            if in_flight > self.parallel.saturating_add(q) {
                drop(guard);
                let mut e = ApiError::unavailable(format!(
                    "the server is busy: {q} requests are already waiting (--max-queue); retry later"
                ));
                e.code = Some("queue_full");
                return reject(e, RETRY_AFTER_QUEUE);
            }
        }
        Ok(guard)
    }

    /// When a request that arrived at `start` must end.
    pub fn deadline(&self, start: Instant) -> Option<tokio::time::Instant> {
        self.opts
            .request_timeout
            .map(|t| tokio::time::Instant::from_std(start + t))
    }

    /// The error a timed-out request gets.
    pub fn timeout_error(&self) -> ApiError {
        let secs = self.opts.request_timeout.map_or(0.0, |t| t.as_secs_f64());
        let mut e = ApiError::server(format!(
            "the request ran past the server's time limit of {secs} s (--request-timeout)"
        ));
        e.status = 504;
        e.code = Some("timeout");
        e
    }

    /// Checks a request's `max_tokens` (`param` names it) against
    /// `--max-tokens`; returns the ceiling for the completion.
    pub fn max_tokens(
        &self,
        requested: Option<u64>,
        param: &'static str,
    ) -> Result<usize, ApiError> {
        let Some(cap) = self.opts.max_tokens else {
            return Ok(usize::MAX);
        };
        match requested {
            Some(m) if m > cap as u64 => Err(ApiError::bad_request(format!(
                "{param} is {m}, more than this server's limit of {cap} tokens per request (--max-tokens)"
            ))
            .with_param(param)),
            _ => Ok(cap),
        }
    }
}

/// A request refused for now: 503 with `Retry-After`.
#[derive(Debug)]
pub struct Refused {
    pub err: ApiError,
    /// Seconds.
    pub retry_after: u64,
}

impl axum::response::IntoResponse for Refused {
    fn into_response(self) -> Response {
        with_retry_after(self.err, self.retry_after)
    }
}

/// Middleware (`axum::middleware::from_fn`): a body whose declared
/// `Content-Length` exceeds `routes::MAX_BODY` is refused with 413 before a
/// byte of it is read. (A chunked body over the limit is cut by axum's own
/// limit while it is read, also a 413.)
pub async fn refuse_oversized(
    req: axum::extract::Request,
    next: axum::middleware::Next,
) -> Response {
    let declared = req
        .headers()
        .get(axum::http::header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.trim().parse::<u64>().ok());
    match declared {
        Some(n) if n > crate::routes::MAX_BODY as u64 => {
            use axum::response::IntoResponse;
            let mut e = ApiError::bad_request(format!(
                "the request body is {n} bytes; this server takes at most {} bytes",
                crate::routes::MAX_BODY
            ));
            e.status = 413;
            e.code = Some("request_too_large");
            e.into_response()
        }
        _ => next.run(req).await,
    }
}
