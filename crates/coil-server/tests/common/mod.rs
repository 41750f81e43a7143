//! A server on a fixture model at an OS-assigned loopback port, and a
//! plain HTTP/1.1 client over `TcpStream`.

#![allow(dead_code)]

use coil::engine::{Engine, EngineOptions};
use coil_gguf::gguf::encode_header;
use coil_gguf::{GgufFile, TensorSpec, Value};
use coil_server::scheduler::SchedulerConfig;
use coil_server::Server;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

#[path = "../../../../tests/support/fixtures.rs"]
mod fixtures;

/// The model file of fixture `arch` (`tests/fixtures/models/` or
/// `parity/`).
pub fn fixture(arch: &str) -> PathBuf {
    fixtures::path(
        &PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures"),
        arch,
    )
}

pub struct TestServer {
    pub addr: SocketAddr,
}

/// Starts a server on the Granite 4.0-H fixture (Mamba-2 + attention +
/// MoE) with `parallel` slots, `cache` more for the prefix cache and a
/// context of `ctx`.
pub fn start(parallel: usize, cache: usize, ctx: usize) -> TestServer {
    start_arch("granitemoehybrid", parallel, cache, ctx)
}

fn options(parallel: usize, cache: usize, ctx: usize) -> EngineOptions {
    EngineOptions {
        n_threads: 1,
        n_seq_max: parallel + cache,
        n_ctx: ctx,
        n_ubatch: 512,
        ..Default::default()
    }
}

/// The Granite fixture with room for only two recurrent checkpoints per
/// sequence (plus one every 16 tokens, thinned): what a big model's state
/// under the default budget looks like.
pub fn start_tight(parallel: usize, cache: usize, ctx: usize) -> TestServer {
    let mut opts = options(parallel, cache, ctx);
    opts.checkpoints = coil::memory::CheckpointPolicy {
        interval: 16,
        budget_bytes: 1,
        keep_recent: 2,
        every_call: true,
        call_spacing: 1,
    };
    let engine = Engine::load(fixture("granitemoehybrid"), opts).expect("load");
    start_engine(engine, parallel)
}

pub fn start_arch(arch: &str, parallel: usize, cache: usize, ctx: usize) -> TestServer {
    let engine = Engine::load(fixture(arch), options(parallel, cache, ctx)).expect("load");
    start_engine(engine, parallel)
}

/// A server on a fixture under `tests/fixtures/models/<arch>/model.f16.gguf`
/// or, for a name ending in `_tiny`, the parity fixture
/// `tests/fixtures/parity/<name>/model.gguf` (the Gated DeltaNet models).
pub fn start_any(name: &str, parallel: usize, cache: usize, ctx: usize) -> TestServer {
    start_any_cfg(name, cache, ctx, config(parallel))
}

/// [`start_any`] with a scheduler configuration of its own (`name` "demo":
/// the bundled demo model).
pub fn start_any_cfg(name: &str, cache: usize, ctx: usize, cfg: SchedulerConfig) -> TestServer {
    let path = if name == "demo" {
        // The bundled demo model (Q8_0; trained, so near-ties are common).
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../models/shakespeare-hybrid-q8_0.gguf")
    } else {
        fixture(name)
    };
    let engine = Engine::load(path, options(cfg.parallel, cache, ctx)).expect("load");
    start_engine_cfg(engine, cfg)
}

/// The Granite fixture with `tokenizer.chat_template` set to `template`
/// (the file rewritten in memory).
pub fn start_with_template(template: &str, parallel: usize, ctx: usize) -> TestServer {
    let file = GgufFile::open(fixture("granitemoehybrid")).expect("open");
    let mut md = file.metadata().clone();
    md.insert("tokenizer.chat_template", Value::String(template.into()));
    let specs: Vec<TensorSpec> = file
        .tensors()
        .iter()
        .map(|t| TensorSpec::new(t.name.clone(), &t.dims, t.ty))
        .collect();
    let (mut bytes, _) = encode_header(&md, &specs).expect("header");
    let align = file.alignment() as usize;
    for t in file.tensors() {
        bytes.extend_from_slice(&file.bytes()[file.data_range(t)]);
        bytes.resize(bytes.len().div_ceil(align) * align, 0);
    }
    let file = GgufFile::from_bytes(bytes).expect("reparse");
    let engine =
        Engine::from_file(Arc::new(file), options(parallel, 1, ctx)).expect("load the model");
    start_engine(engine, parallel)
}

/// The Granite fixture with `reserve` recurrent-state buffers put aside
/// at startup, as `coil serve` does.
pub fn start_reserved(parallel: usize, cache: usize, ctx: usize, reserve: usize) -> TestServer {
    let mut engine =
        Engine::load(fixture("granitemoehybrid"), options(parallel, cache, ctx)).expect("load");
    let r = engine.mem.recurrent.as_mut().expect("a recurrent memory");
    assert_eq!(r.reserve_buffers(reserve), reserve);
    start_engine(engine, parallel)
}

/// The Granite fixture served as `coil serve` serves a big model: room
/// for `checkpoints` recurrent checkpoints per sequence under the budget,
/// and the state buffers [`coil_server::scheduler::state_buffers_wanted`]
/// asks for `parallel` running sequences reserved while idle. Returns the
/// server and that reserve.
pub fn start_budgeted(parallel: usize, ctx: usize, checkpoints: usize) -> (TestServer, usize) {
    let mut engine =
        Engine::load(fixture("granitemoehybrid"), options(parallel, 0, ctx)).expect("load");
    let r = engine.mem.recurrent.as_mut().expect("a recurrent memory");
    r.policy.budget_bytes = checkpoints * r.bytes_per_seq();
    assert_eq!(r.max_checkpoints(), checkpoints);
    let reserve = coil_server::scheduler::state_buffers_wanted(&mut engine, parallel);
    let s = start_engine_cfg(
        engine,
        SchedulerConfig {
            reserve_state_buffers: reserve,
            ..config(parallel)
        },
    );
    (s, reserve)
}

/// The Granite fixture with `reserve` recurrent-state buffers for the
/// scheduler to put aside while idle (`SchedulerConfig::reserve_state_buffers`,
/// as `coil serve` has it).
pub fn start_reserving(parallel: usize, cache: usize, ctx: usize, reserve: usize) -> TestServer {
    let engine =
        Engine::load(fixture("granitemoehybrid"), options(parallel, cache, ctx)).expect("load");
    start_engine_cfg(
        engine,
        SchedulerConfig {
            reserve_state_buffers: reserve,
            ..config(parallel)
        },
    )
}

/// The Granite fixture with a prefix-cache budget of `cache_bytes`.
pub fn start_with_budget(
    parallel: usize,
    cache: usize,
    ctx: usize,
    cache_bytes: usize,
) -> TestServer {
    let engine =
        Engine::load(fixture("granitemoehybrid"), options(parallel, cache, ctx)).expect("load");
    start_engine_cfg(
        engine,
        SchedulerConfig {
            cache_bytes,
            ..config(parallel)
        },
    )
}

fn config(parallel: usize) -> SchedulerConfig {
    SchedulerConfig {
        parallel,
        cache_bytes: 1 << 30,
        prefill_chunk: 64,
        ..Default::default()
    }
}

pub fn start_engine(engine: Engine, parallel: usize) -> TestServer {
    start_engine_cfg(engine, config(parallel))
}

pub fn start_engine_cfg(engine: Engine, cfg: SchedulerConfig) -> TestServer {
    let server = Server::new(engine, cfg, "fixture".into()).expect("start the server");
    serve(server)
}

/// `engine` served with `draft` drafting for it (`coil serve -md`).
pub fn start_engine_draft(
    engine: Engine,
    draft: coil::engine::speculative::DraftModel,
    cfg: SchedulerConfig,
) -> TestServer {
    let server = Server::start_with_draft(
        engine,
        Some(draft),
        cfg,
        "fixture".into(),
        None,
        Default::default(),
    )
    .expect("start the server");
    serve(server)
}

/// The Granite fixture served with `chat_template` in place of its own
/// (`coil serve --chat-template`).
pub fn start_with_template_override(chat_template: &str, ctx: usize) -> TestServer {
    let engine = Engine::load(fixture("granitemoehybrid"), options(1, 1, ctx)).expect("load");
    let server = Server::with_template(engine, config(1), "fixture".into(), Some(chat_template))
        .expect("start the server");
    serve(server)
}

fn serve(server: Server) -> TestServer {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let addr = listener.local_addr().expect("address");
    listener.set_nonblocking(true).expect("nonblocking");
    std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .expect("runtime");
        rt.block_on(async move {
            let l = tokio::net::TcpListener::from_std(listener).expect("listener");
            server
                .serve(l, std::future::pending())
                .await
                .expect("serve");
        });
    });
    TestServer { addr }
}

pub struct Reply {
    pub status: u16,
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
}

impl Reply {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }
    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }
    pub fn json(&self) -> serde_json::Value {
        serde_json::from_slice(&self.body)
            .unwrap_or_else(|e| panic!("not JSON ({e}): {}", self.text()))
    }
    /// The `data:` payloads of a server-sent event stream.
    pub fn events(&self) -> Vec<String> {
        self.text()
            .lines()
            .filter_map(|l| l.strip_prefix("data: ").or(l.strip_prefix("data:")))
            .map(|s| s.to_string())
            .collect()
    }
}

impl TestServer {
    pub fn connect(&self) -> TcpStream {
        let s = TcpStream::connect(self.addr).expect("connect");
        s.set_read_timeout(Some(Duration::from_secs(60))).ok();
        s
    }

    pub fn send(&self, method: &str, path: &str, body: Option<&str>) -> TcpStream {
        let mut s = self.connect();
        let body = body.unwrap_or("");
        let req = format!(
            "{method} {path} HTTP/1.1\r\nHost: {}\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
            self.addr,
            body.len()
        );
        s.write_all(req.as_bytes()).expect("write");
        s
    }

    pub fn request(&self, method: &str, path: &str, body: Option<&str>) -> Reply {
        let mut s = self.send(method, path, body);
        let mut raw = Vec::new();
        s.read_to_end(&mut raw).expect("read");
        parse(&raw)
    }

    pub fn get(&self, path: &str) -> Reply {
        self.request("GET", path, None)
    }

    pub fn post(&self, path: &str, body: &serde_json::Value) -> Reply {
        self.request("POST", path, Some(&body.to_string()))
    }

    /// `/metrics` as name → value.
    pub fn metrics(&self) -> std::collections::HashMap<String, f64> {
        let r = self.get("/metrics");
        assert_eq!(r.status, 200);
        let mut out = std::collections::HashMap::new();
        for line in r.text().lines() {
            if line.starts_with('#') || line.trim().is_empty() {
                continue;
            }
            let (name, value) = line.split_once(' ').expect("name value");
            let v: f64 = value.parse().expect("a number");
            out.insert(name.to_string(), v);
        }
        out
    }
}

fn find(hay: &[u8], needle: &[u8]) -> Option<usize> {
    hay.windows(needle.len()).position(|w| w == needle)
}

pub fn parse(raw: &[u8]) -> Reply {
    let end = find(raw, b"\r\n\r\n").expect("end of headers");
    let head = String::from_utf8_lossy(&raw[..end]).into_owned();
    let mut lines = head.split("\r\n");
    let status: u16 = lines
        .next()
        .and_then(|l| l.split(' ').nth(1))
        .and_then(|s| s.parse().ok())
        .expect("status line");
    let headers: Vec<(String, String)> = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(k, v)| (k.trim().to_string(), v.trim().to_string()))
        .collect();
    let mut body = raw[end + 4..].to_vec();
    let chunked = headers
        .iter()
        .any(|(k, v)| k.eq_ignore_ascii_case("transfer-encoding") && v.contains("chunked"));
    if chunked {
        body = dechunk(&body);
    }
    Reply {
        status,
        headers,
        body,
    }
}

fn dechunk(mut b: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    while let Some(eol) = find(b, b"\r\n") {
        let size_text = String::from_utf8_lossy(&b[..eol]);
        let size = usize::from_str_radix(size_text.split(';').next().unwrap_or("").trim(), 16)
            .expect("chunk size");
        b = &b[eol + 2..];
        if size == 0 {
            break;
        }
        out.extend_from_slice(&b[..size]);
        b = &b[size + 2..];
    }
    out
}

/// The Granite fixture served with the HTTP side's `opts` (API key,
/// queue bound, timeouts).
pub fn start_opts(
    parallel: usize,
    cache: usize,
    ctx: usize,
    opts: coil_server::limits::HttpOptions,
) -> TestServer {
    start_drainable(parallel, cache, ctx, opts, None).0
}

/// A server whose shutdown the test triggers: send on the first value
/// (dropping it leaves the server running); the second yields what `serve_with_drain` returned
/// (requests still in flight when it stopped waiting) once it has.
pub fn start_drainable(
    parallel: usize,
    cache: usize,
    ctx: usize,
    opts: coil_server::limits::HttpOptions,
    drain: Option<Duration>,
) -> (
    TestServer,
    tokio::sync::oneshot::Sender<()>,
    std::sync::mpsc::Receiver<u64>,
) {
    let engine =
        Engine::load(fixture("granitemoehybrid"), options(parallel, cache, ctx)).expect("load");
    let server =
        Server::with_options(engine, config(parallel), "fixture".into(), opts).expect("start");
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let addr = listener.local_addr().expect("address");
    listener.set_nonblocking(true).expect("nonblocking");
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let (done_tx, done_rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .expect("runtime");
        rt.block_on(async move {
            let l = tokio::net::TcpListener::from_std(listener).expect("listener");
            // A dropped sender never stops the server.
            let stop = async move {
                if stop_rx.await.is_err() {
                    std::future::pending::<()>().await;
                }
            };
            let left = server
                .serve_with_drain(l, stop, drain)
                .await
                .expect("serve");
            let _ = done_tx.send(left);
        });
    });
    (TestServer { addr }, stop_tx, done_rx)
}

impl TestServer {
    /// A request with extra header lines (`("Authorization", "Bearer k")`).
    pub fn request_with(
        &self,
        method: &str,
        path: &str,
        body: Option<&str>,
        headers: &[(&str, &str)],
    ) -> Reply {
        let mut s = self.connect();
        let body = body.unwrap_or("");
        let mut req = format!(
            "{method} {path} HTTP/1.1\r\nHost: {}\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n",
            self.addr,
            body.len()
        );
        for (k, v) in headers {
            req.push_str(&format!("{k}: {v}\r\n"));
        }
        req.push_str("\r\n");
        req.push_str(body);
        s.write_all(req.as_bytes()).expect("write");
        let mut raw = Vec::new();
        s.read_to_end(&mut raw).expect("read");
        parse(&raw)
    }
}
