//! What a server in production needs: an API key, OpenAI-shaped errors for
//! everything (oversized bodies, wrong methods, unknown routes), a bounded
//! queue, a `max_tokens` ceiling, a request timeout, metrics for routers
//! and autoscalers, and a drain on shutdown.

mod common;

use coil_server::limits::HttpOptions;
use common::{start_drainable, start_opts, Reply, TestServer};
use serde_json::{json, Value};
use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

fn assert_openai_error(r: &Reply, status: u16, code: Option<&str>) -> Value {
    assert_eq!(r.status, status, "{}", r.text());
    assert!(
        r.header("content-type")
            .is_some_and(|v| v.starts_with("application/json")),
        "{:?}",
        r.headers
    );
    let v = r.json();
    let e = &v["error"];
    assert!(e["message"].as_str().is_some_and(|m| !m.is_empty()), "{v}");
    assert!(e["type"].is_string(), "{v}");
    assert!(e.get("param").is_some() && e.get("code").is_some(), "{v}");
    if let Some(c) = code {
        assert_eq!(e["code"], c, "{v}");
    }
    v
}

/// Starts a long greedy stream and reads until its first token.
fn open_stream(s: &TestServer, max_tokens: usize) -> TcpStream {
    let mut stream = s.send(
        "POST",
        "/v1/completions",
        Some(
            &json!({"prompt": "Tell me a very long story", "max_tokens": max_tokens,
                    "temperature": 0, "ignore_eos": true, "stream": true})
            .to_string(),
        ),
    );
    let mut got = Vec::new();
    let mut buf = [0u8; 256];
    while !String::from_utf8_lossy(&got).contains("\"text\"") {
        let n = stream.read(&mut buf).expect("read");
        assert!(
            n > 0,
            "stream ended early: {}",
            String::from_utf8_lossy(&got)
        );
        got.extend_from_slice(&buf[..n]);
    }
    stream
}

fn wait_for(
    s: &TestServer,
    what: &str,
    ok: impl Fn(&std::collections::HashMap<String, f64>) -> bool,
) {
    let t0 = Instant::now();
    loop {
        let m = s.metrics();
        if ok(&m) {
            return;
        }
        assert!(t0.elapsed() < Duration::from_secs(30), "{what}: {m:?}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn the_api_key_guards_every_route_but_health() {
    let opts = HttpOptions {
        api_key: Some("s3cret".into()),
        ..Default::default()
    };
    let s = start_opts(1, 1, 256, opts);
    let auth = [("Authorization", "Bearer s3cret")];
    assert_eq!(s.get("/health").status, 200);
    let body = json!({"prompt": "hi", "max_tokens": 2, "temperature": 0}).to_string();
    for (method, path, body) in [
        ("GET", "/v1/models", None),
        ("GET", "/metrics", None),
        ("POST", "/v1/completions", Some(body.as_str())),
        ("POST", "/v1/chat/completions", Some("{}")),
        ("GET", "/no/such/route", None),
    ] {
        let r = s.request_with(method, path, body, &[]);
        assert_openai_error(&r, 401, Some("invalid_api_key"));
        assert_eq!(r.header("www-authenticate"), Some("Bearer"));
        let r = s.request_with(method, path, body, &[("Authorization", "Bearer s3cre")]);
        assert_openai_error(&r, 401, Some("invalid_api_key"));
        let r = s.request_with(method, path, body, &[("Authorization", "Basic s3cret")]);
        assert_openai_error(&r, 401, Some("invalid_api_key"));
    }
    assert_eq!(s.request_with("GET", "/v1/models", None, &auth).status, 200);
    assert_eq!(s.request_with("GET", "/metrics", None, &auth).status, 200);
    let r = s.request_with("POST", "/v1/completions", Some(&body), &auth);
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.json()["usage"]["completion_tokens"], 2);
    // With the key, an unknown route is a plain 404.
    let r = s.request_with("GET", "/no/such/route", None, &auth);
    assert_openai_error(&r, 404, None);
}

/// `GET /` is the chat page: open without the key (the page holds no data
/// and asks for the key itself) while the API behind it keeps asking;
/// `--no-ui` leaves `/` an unknown route.
#[test]
fn the_chat_page_is_served_at_the_root() {
    let opts = HttpOptions {
        api_key: Some("s3cret".into()),
        ..Default::default()
    };
    let s = start_opts(1, 1, 256, opts);
    let r = s.get("/");
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.header("content-type"), Some("text/html; charset=utf-8"));
    assert_eq!(r.text(), coil_server::ui::PAGE);
    assert!(r.text().starts_with("<!doctype html>"));
    assert!(r.text().contains("<title>coil</title>"));
    assert_eq!(r.header("x-frame-options"), Some("DENY"));
    assert_openai_error(&s.get("/v1/models"), 401, Some("invalid_api_key"));
    assert_openai_error(
        &s.request("POST", "/", Some("{}")),
        405,
        Some("method_not_allowed"),
    );

    let opts = HttpOptions {
        no_ui: true,
        ..Default::default()
    };
    let s = start_opts(1, 1, 256, opts);
    let v = assert_openai_error(&s.get("/"), 404, None);
    assert!(v["error"]["message"]
        .as_str()
        .unwrap()
        .contains("no route for /"));
    assert_eq!(s.get("/v1/models").status, 200);
}

#[test]
fn every_error_is_an_openai_error_object() {
    let s = start_opts(1, 1, 256, HttpOptions::default());
    // A body declared larger than the limit: refused before it is read.
    let mut c = s.connect();
    let head = format!(
        "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        coil_server::routes::MAX_BODY + 1
    );
    c.write_all(head.as_bytes()).unwrap();
    c.write_all(b"{\"prompt\": \"").unwrap();
    let mut raw = Vec::new();
    c.read_to_end(&mut raw).unwrap();
    let r = common::parse(&raw);
    let v = assert_openai_error(&r, 413, Some("request_too_large"));
    assert!(v["error"]["message"].as_str().unwrap().contains("at most"));
    // Wrong methods.
    let r = s.request("GET", "/v1/completions", None);
    assert_openai_error(&r, 405, Some("method_not_allowed"));
    let r = s.request("DELETE", "/v1/models", None);
    assert_openai_error(&r, 405, Some("method_not_allowed"));
    // Malformed JSON, a wrong field type, an unknown route.
    let r = s.request("POST", "/v1/chat/completions", Some("{\"messages\": [}"));
    let v = assert_openai_error(&r, 400, None);
    assert!(v["error"]["message"].as_str().unwrap().contains("JSON"));
    let r = s.request("POST", "/v1/completions", Some("{\"prompt\": 3}"));
    assert_openai_error(&r, 400, None);
    assert_openai_error(&s.get("/v2/completions"), 404, None);
    // Not valid UTF-8 either.
    let mut c = s.connect();
    c.write_all(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 4\r\nConnection: close\r\n\r\n\xff\xfe{}")
        .unwrap();
    let mut raw = Vec::new();
    c.read_to_end(&mut raw).unwrap();
    assert_openai_error(&common::parse(&raw), 400, None);
}

#[test]
fn a_full_queue_gets_503_with_retry_after() {
    let opts = HttpOptions {
        max_queue: Some(1),
        ..Default::default()
    };
    let s = start_opts(1, 1, 8192, opts);
    let running = open_stream(&s, 8000);
    // The second waits for the only slot (no token arrives yet).
    let waiting = s.send(
        "POST",
        "/v1/completions",
        Some(&json!({"prompt": "wait", "max_tokens": 4, "temperature": 0}).to_string()),
    );
    wait_for(&s, "one running, one waiting", |m| {
        m["coil_requests_running"] == 1.0 && m["coil_requests_waiting"] == 1.0
    });
    let r = s.post(
        "/v1/completions",
        &json!({"prompt": "third", "max_tokens": 4, "temperature": 0}),
    );
    assert_openai_error(&r, 503, Some("queue_full"));
    assert_eq!(r.header("retry-after"), Some("1"));
    assert_eq!(s.metrics()["coil_requests_rejected_total"], 1.0);
    // Once the running one goes, the waiting one runs and room comes back.
    drop(running);
    let mut waiting = waiting;
    let mut raw = Vec::new();
    waiting.read_to_end(&mut raw).unwrap();
    assert_eq!(common::parse(&raw).status, 200);
    wait_for(&s, "all done", |m| {
        m["coil_requests_running"] == 0.0 && m["coil_requests_waiting"] == 0.0
    });
    let r = s.post(
        "/v1/completions",
        &json!({"prompt": "third", "max_tokens": 4, "temperature": 0}),
    );
    assert_eq!(r.status, 200, "{}", r.text());
}

#[test]
fn max_tokens_has_a_server_ceiling() {
    let opts = HttpOptions {
        max_tokens: Some(6),
        ..Default::default()
    };
    let s = start_opts(1, 1, 256, opts);
    let r = s.post(
        "/v1/completions",
        &json!({"prompt": "hi", "max_tokens": 7, "temperature": 0}),
    );
    let v = assert_openai_error(&r, 400, None);
    assert_eq!(v["error"]["param"], "max_tokens");
    assert!(v["error"]["message"]
        .as_str()
        .unwrap()
        .contains("--max-tokens"));
    let r = s.post(
        "/v1/chat/completions",
        &json!({"messages": [{"role": "user", "content": "hi"}], "max_completion_tokens": 100}),
    );
    let v = assert_openai_error(&r, 400, None);
    assert_eq!(v["error"]["param"], "max_completion_tokens");
    // Without max_tokens a chat generates at most the ceiling.
    let r = s.post(
        "/v1/chat/completions",
        &json!({"messages": [{"role": "user", "content": "hi"}], "temperature": 0, "ignore_eos": true}),
    );
    assert_eq!(r.status, 200, "{}", r.text());
    let v = r.json();
    assert_eq!(v["usage"]["completion_tokens"], 6, "{v}");
    assert_eq!(v["choices"][0]["finish_reason"], "length");
    // Within it, as asked.
    let r = s.post(
        "/v1/completions",
        &json!({"prompt": "hi", "max_tokens": 3, "temperature": 0, "ignore_eos": true}),
    );
    assert_eq!(r.json()["usage"]["completion_tokens"], 3);
}

#[test]
fn requests_past_the_timeout_end_and_free_their_slot() {
    let opts = HttpOptions {
        request_timeout: Some(Duration::from_millis(400)),
        ..Default::default()
    };
    let s = start_opts(1, 1, 8192, opts);
    let long = json!({"prompt": "Tell me a long story", "max_tokens": 8000,
                      "temperature": 0, "ignore_eos": true});
    let t0 = Instant::now();
    let r = s.post("/v1/completions", &long);
    assert_openai_error(&r, 504, Some("timeout"));
    assert!(t0.elapsed() < Duration::from_secs(20));
    // A stream ends with the error and [DONE].
    let mut streamed = long.clone();
    streamed["stream"] = json!(true);
    let r = s.post("/v1/completions", &streamed);
    assert_eq!(r.status, 200);
    let events = r.events();
    assert_eq!(
        events.last().map(String::as_str),
        Some("[DONE]"),
        "{events:?}"
    );
    let err: Value = serde_json::from_str(&events[events.len() - 2]).unwrap();
    assert_eq!(err["error"]["code"], "timeout", "{err}");
    assert!(events.len() > 3, "some text came first: {events:?}");
    wait_for(&s, "slots freed", |m| {
        m["coil_active_sequences"] == 0.0 && m["coil_requests_timed_out_total"] == 2.0
    });
    // A short request still fits.
    let r = s.post(
        "/v1/completions",
        &json!({"prompt": "hi", "max_tokens": 2, "temperature": 0}),
    );
    assert_eq!(r.status, 200, "{}", r.text());
}

#[test]
fn metrics_report_load_cache_and_latency() {
    let s = start_opts(1, 1, 256, HttpOptions::default());
    for p in ["one two three", "four five six"] {
        let r = s.post(
            "/v1/completions",
            &json!({"prompt": p, "max_tokens": 5, "temperature": 0, "ignore_eos": true}),
        );
        assert_eq!(r.status, 200);
    }
    let text = s.get("/metrics").text();
    assert!(text.contains("# TYPE coil_time_to_first_token_seconds histogram"));
    assert!(text.contains("# TYPE coil_time_per_output_token_seconds histogram"));
    assert!(text.contains("# TYPE coil_requests_waiting gauge"));
    let m = s.metrics();
    assert_eq!(m["coil_requests_running"], 0.0);
    assert_eq!(m["coil_requests_waiting"], 0.0);
    assert_eq!(m["coil_time_to_first_token_seconds_count"], 2.0);
    assert_eq!(
        m["coil_time_to_first_token_seconds_bucket{le=\"+Inf\"}"],
        2.0
    );
    assert_eq!(m["coil_time_per_output_token_seconds_count"], 2.0);
    assert!(m["coil_time_to_first_token_seconds_sum"] > 0.0);
    // The fixture configuration's budget (1 GiB), and what is held of it.
    assert_eq!(m["coil_cache_limit_bytes"], (1u64 << 30) as f64);
    assert!(m["coil_cached_bytes"] > 0.0);
    let ratio = m["coil_cached_bytes"] / m["coil_cache_limit_bytes"];
    assert!((m["coil_cache_usage_ratio"] - ratio).abs() < 1e-6);
}

#[test]
fn shutdown_drains_requests_in_flight() {
    let (s, stop, done) = start_drainable(2, 1, 8192, HttpOptions::default(), None);
    let stream = open_stream(&s, 500);
    let t0 = Instant::now();
    assert_eq!(s.metrics()["coil_requests_running"], 1.0);
    stop.send(()).unwrap();
    // The stream runs to its end.
    let mut stream = stream;
    let mut rest = Vec::new();
    stream.read_to_end(&mut rest).unwrap();
    let text = String::from_utf8_lossy(&rest);
    assert!(text.contains("\"finish_reason\":\"length\""), "{text}");
    assert!(text.contains("[DONE]"), "{text}");
    let left = done
        .recv_timeout(Duration::from_secs(30))
        .expect("serve ended");
    assert_eq!(left, 0);
    eprintln!("drained in {:?}", t0.elapsed());
    // Nothing listens any more.
    assert!(TcpStream::connect(s.addr).is_err());
}

#[test]
fn the_drain_is_bounded() {
    let (s, stop, done) = start_drainable(
        1,
        1,
        8192,
        HttpOptions::default(),
        Some(Duration::from_millis(300)),
    );
    let _stream = open_stream(&s, 8000);
    let t0 = Instant::now();
    stop.send(()).unwrap();
    let left = done
        .recv_timeout(Duration::from_secs(20))
        .expect("serve ended");
    assert_eq!(left, 1, "the long stream was still running");
    assert!(t0.elapsed() < Duration::from_secs(10));
}
