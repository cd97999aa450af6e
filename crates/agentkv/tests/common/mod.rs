//! Shared by the tests that run the real `agentkv serve` binary: start it on a free port (with a
//! YAML config), speak HTTP/1.1 to it over a plain socket, and run a Python client script
//! against it.

#![allow(dead_code)] // each test binary uses part of these helpers

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

pub struct Server {
    pub child: Child,
    pub addr: String,
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

pub fn start(cfg: &std::path::Path) -> Server {
    let mut child = Command::new(env!("CARGO_BIN_EXE_agentkv"))
        .args(["serve", "--port", "0", "--config"])
        .arg(cfg)
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("starting agentkv serve");
    let mut line = String::new();
    BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    let addr = line
        .trim()
        .strip_prefix("listening on http://")
        .unwrap_or_else(|| panic!("unexpected first line {line:?}"))
        .to_string();
    Server { child, addr }
}

/// One HTTP/1.1 exchange (`Connection: close`): status and body.
pub fn http(addr: &str, method: &str, path: &str, key: &str, body: &str) -> (u16, String) {
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(300))).unwrap();
    write!(
        s,
        "{method} {path} HTTP/1.1\r\nHost: {addr}\r\nAuthorization: Bearer {key}\r\n\
         Content-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    )
    .unwrap();
    let mut raw = String::new();
    s.read_to_string(&mut raw).unwrap();
    let (head, body) = raw.split_once("\r\n\r\n").expect("an HTTP response");
    let status = head.split(' ').nth(1).unwrap().parse().unwrap();
    let body = if head
        .to_ascii_lowercase()
        .contains("transfer-encoding: chunked")
    {
        dechunk(body)
    } else {
        body.to_string()
    };
    (status, body)
}

/// A ~200-token user message of ten words; different `i` differ from the first word on.
pub fn words_message(i: usize) -> String {
    let words = [
        "cache", "tool", "agent", "prefix", "block", "token", "layer", "query", "value", "shard",
    ];
    (0..150)
        .map(|j| words[(i * 7 + j * 3 + j * j) % words.len()])
        .collect::<Vec<_>>()
        .join(" ")
}

/// A greedy chat completion of one user message `text` to `model` as `key`, `max_tokens` long:
/// the response body (status 200 asserted).
pub fn greedy_chat(
    server: &Server,
    model: &str,
    key: &str,
    text: &str,
    max_tokens: u32,
) -> serde_json::Value {
    let body = serde_json::json!({
        "model": model,
        "messages": [{"role": "user", "content": text}],
        "max_tokens": max_tokens,
        "temperature": 0,
    });
    let (status, body) = http(
        &server.addr,
        "POST",
        "/v1/chat/completions",
        key,
        &body.to_string(),
    );
    assert_eq!(status, 200, "{body}");
    serde_json::from_str(&body).unwrap()
}

/// `/metrics`' lines (read as `key`) for counter `name`, one per label set, summed; `None`
/// when the server does not export it.
pub fn metric_sum(server: &Server, key: &str, name: &str) -> Option<u64> {
    let (status, body) = http(&server.addr, "GET", "/metrics", key, "");
    assert_eq!(status, 200);
    let values: Vec<u64> = body
        .lines()
        .filter(|l| l.starts_with(&format!("{name}{{")) || l.starts_with(&format!("{name} ")))
        .map(|l| l.rsplit(' ').next().unwrap().parse::<f64>().unwrap() as u64)
        .collect();
    (!values.is_empty()).then(|| values.iter().sum())
}

fn dechunk(mut s: &str) -> String {
    let mut out = String::new();
    while let Some((len, rest)) = s.split_once("\r\n") {
        let n = usize::from_str_radix(len.trim(), 16).unwrap();
        if n == 0 {
            break;
        }
        out.push_str(&rest[..n]);
        s = &rest[n + 2..];
    }
    out
}

/// The Python interpreter the end-to-end tests run: `$AGENTKV_PYTHON` (set by `scripts/test.sh`
/// to its venv), else the workspace's `.venv-tests/bin/python` when the script made one, else
/// `python3`.
pub fn python() -> String {
    if let Ok(p) = std::env::var("AGENTKV_PYTHON") {
        if !p.is_empty() {
            return p;
        }
    }
    let venv = format!(
        "{}/../../.venv-tests/bin/python",
        env!("CARGO_MANIFEST_DIR")
    );
    if std::path::Path::new(&venv).exists() {
        return venv;
    }
    "python3".to_string()
}

/// Fails, saying how to get them, unless the test interpreter imports every module in `modules`.
pub fn require_python_modules(modules: &[&str]) {
    let py = python();
    let code = format!("import {}", modules.join(", "));
    let out = Command::new(&py).args(["-c", &code]).output();
    let hint = "run `scripts/test.sh` (the README's test command: it makes .venv-tests with the \
                pinned openai, langchain-openai and openai-agents packages and runs the tests with \
                AGENTKV_PYTHON set), or point AGENTKV_PYTHON at an interpreter that has them";
    match out {
        Err(e) => panic!("cannot run the Python interpreter {py:?} ({e}): {hint}"),
        Ok(o) if !o.status.success() => panic!(
            "{py} cannot import {modules:?}: {}\n{hint}",
            String::from_utf8_lossy(&o.stderr).trim()
        ),
        Ok(_) => {}
    }
}

/// Runs the Python client `script` (under `crates/server/tests/`) against `base_url` with the
/// test interpreter ([`python`]), after checking that it imports `modules`; fails with its output
/// unless it exits 0 and prints `marker`, and returns its stdout.
pub fn run_python_client(script: &str, base_url: &str, marker: &str, modules: &[&str]) -> String {
    require_python_modules(modules);
    let path = format!("{}/../server/tests/{script}", env!("CARGO_MANIFEST_DIR"));
    let py = python();
    let out = Command::new(&py)
        .arg(&path)
        .arg(base_url)
        .output()
        .unwrap_or_else(|e| panic!("running {py} {script}: {e}"));
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "{script} failed\n--- stdout\n{stdout}\n--- stderr\n{stderr}"
    );
    assert!(stdout.contains(marker), "{stdout}");
    stdout
}
