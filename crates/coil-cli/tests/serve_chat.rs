//! `coil chat` with piped input and `coil serve` on a free port, as a user
//! runs them.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::Duration;

fn model(arch: &str) -> String {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../tests/fixtures/models")
        .join(arch)
        .join("model.f16.gguf")
        .to_string_lossy()
        .into_owned()
}

/// `(prompt, cached, processed)` from the stats lines.
fn turns(stderr: &str) -> Vec<(usize, usize, usize)> {
    stderr
        .lines()
        .filter_map(|l| l.strip_prefix("[prompt "))
        .map(|l| {
            let nums: Vec<usize> = l
                .split(|c: char| !c.is_ascii_digit())
                .filter(|s| !s.is_empty())
                .take(3)
                .map(|s| s.parse().unwrap())
                .collect();
            (nums[0], nums[1], nums[2])
        })
        .collect()
}

#[test]
fn chat_reads_turns_from_stdin_and_keeps_history() {
    let mut child = Command::new(env!("CARGO_BIN_EXE_coil"))
        .args([
            "chat",
            "-m",
            &model("granitemoehybrid"),
            "-n",
            "6",
            "--temp",
            "0",
        ])
        .args(["-t", "1", "--system", "Be brief."])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run coil chat");
    child
        .stdin
        .take()
        .unwrap()
        .write_all(b"Hello there\nHow are you?\n\nTell me more\n/reset\nHello there\n")
        .unwrap();
    let out = child.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    let t = turns(&stderr);
    assert_eq!(t.len(), 4, "{stderr}");
    assert_eq!(t[0].1, 0);
    for w in t[..3].windows(2) {
        // Each turn reuses the whole previous turn and processes only the rest.
        let (prev, now) = (w[0], w[1]);
        assert!(now.1 > prev.0, "{stderr}");
        assert_eq!(now.1 + now.2, now.0);
    }
    // After /reset the first prompt comes back: reused from the cache
    // but its last token.
    assert_eq!(t[3].0, t[0].0);
    assert_eq!(t[3].1, t[0].0 - 1, "{stderr}");
    assert!(stderr.contains("[conversation reset]"));
}

fn template(name: &str) -> String {
    format!(
        "{}/../../tests/fixtures/templates/{name}.jinja",
        env!("CARGO_MANIFEST_DIR")
    )
}

#[test]
fn serve_and_chat_refuse_a_missing_chat_template() {
    // llama.cpp's spelling and coil's older one.
    for (cmd, flag) in [
        ("serve", "--chat-template-file"),
        ("serve", "--chat-template"),
        ("chat", "--chat-template-file"),
    ] {
        let out = Command::new(env!("CARGO_BIN_EXE_coil"))
            .args(
                [cmd, "-m", &model("mamba2"), "--port", "0"][..if cmd == "serve" { 5 } else { 3 }]
                    .iter(),
            )
            .args([flag, "no/such/template.jinja"])
            .stdin(Stdio::null())
            .output()
            .expect("run coil");
        assert!(!out.status.success(), "{cmd} {flag}");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(
            err.contains("reading the chat template no/such/template.jinja"),
            "{cmd} {flag}: {err}"
        );
    }
}

#[test]
fn serve_listens_and_answers() {
    let mut child = Command::new(env!("CARGO_BIN_EXE_coil"))
        .args(["serve", "-m", &model("mamba2"), "--port", "0", "-t", "1"])
        .args(["--parallel", "2", "--ctx", "256", "--alias", "tiny"])
        .args(["--chat-template", &template("Qwen3-Coder")])
        // The page itself is tested in coil-server; here, that the flag reaches it.
        .arg("--no-ui")
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run coil serve");
    let mut err = BufReader::new(child.stderr.take().unwrap());
    let mut addr = None;
    let mut log = String::new();
    for _ in 0..20 {
        let mut line = String::new();
        if err.read_line(&mut line).unwrap_or(0) == 0 {
            break;
        }
        log.push_str(&line);
        if let Some(rest) = line.strip_prefix("listening on http://") {
            addr = rest.split_whitespace().next().map(str::to_string);
            break;
        }
    }
    let Some(addr) = addr else {
        let _ = child.kill();
        panic!("no address in: {log}");
    };
    let get = |path: &str, body: Option<&str>| {
        let mut s = TcpStream::connect(&addr).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
        let req = match body {
            None => format!("GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"),
            Some(b) => format!(
                "POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{b}",
                b.len()
            ),
        };
        s.write_all(req.as_bytes()).unwrap();
        let mut out = String::new();
        s.read_to_string(&mut out).unwrap();
        out
    };
    let health = get("/health", None);
    let page = get("/", None);
    let models = get("/v1/models", None);
    let done = get(
        "/v1/completions",
        Some(r#"{"prompt": "Hello", "max_tokens": 4, "temperature": 0, "ignore_eos": true}"#),
    );
    let rendered = get(
        "/apply-template",
        Some(r#"{"messages": [{"role": "user", "content": "Hi"}]}"#),
    );
    let _ = child.kill();
    let _ = child.wait();
    assert!(log.contains("Qwen3-Coder.jinja"), "{log}");
    assert!(
        rendered
            .ends_with(r#"{"prompt":"<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"}"#),
        "{rendered}"
    );
    assert!(health.starts_with("HTTP/1.1 200"), "{health}");
    assert!(page.starts_with("HTTP/1.1 404"), "{page}");
    assert!(models.contains("\"tiny\""), "{models}");
    assert!(done.starts_with("HTTP/1.1 200"), "{done}");
    assert!(done.contains("\"completion_tokens\":4"), "{done}");
}
