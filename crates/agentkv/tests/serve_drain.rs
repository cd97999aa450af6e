//! Graceful shutdown under load: SIGTERM while a request is generating lets it finish (whole
//! answer, 200) and then the real `agentkv serve` process exits cleanly; new connections are
//! refused once it stops listening.

mod common;

use std::time::{Duration, Instant};

use common::{http, start};

const CONFIG: &str = "server: {model_name: drain, shutdown_timeout_s: 120}\nmodel: {threads: 2}\n";

fn running(addr: &str) -> u64 {
    let (_, body) = http(addr, "GET", "/metrics", "", "");
    body.lines()
        .find_map(|l| l.strip_prefix("agentkv_requests_running "))
        .and_then(|v| v.parse::<f64>().ok())
        .unwrap_or(0.0) as u64
}

#[test]
fn sigterm_drains_the_request_in_flight_then_exits() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = dir.path().join("agentkv.yaml");
    std::fs::write(&cfg, CONFIG).unwrap();
    let mut server = start(&cfg);
    let addr = server.addr.clone();
    let body = serde_json::json!({
        "model": "drain",
        "messages": [{"role": "user", "content": "Write a long story about a lighthouse."}],
        "max_tokens": 96,
        "ignore_eos": true,
        "temperature": 0,
    })
    .to_string();
    let a = addr.clone();
    let client = std::thread::spawn(move || http(&a, "POST", "/v1/chat/completions", "", &body));
    let start_wait = Instant::now();
    while running(&addr) == 0 {
        assert!(
            start_wait.elapsed() < Duration::from_secs(60),
            "never started"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    let pid = server.child.id().to_string();
    let status = std::process::Command::new("kill")
        .args(["-TERM", &pid])
        .status()
        .unwrap();
    assert!(status.success());
    let (status, reply) = client.join().unwrap();
    assert_eq!(status, 200, "{reply}");
    let v: serde_json::Value = serde_json::from_str(&reply).unwrap();
    assert_eq!(
        v["usage"]["completion_tokens"], 96,
        "the whole answer: {reply}"
    );
    assert_eq!(v["choices"][0]["finish_reason"], "length");
    // Then the process exits on its own, successfully.
    let deadline = Instant::now() + Duration::from_secs(60);
    let exit = loop {
        if let Some(s) = server.child.try_wait().unwrap() {
            break s;
        }
        assert!(Instant::now() < deadline, "still running after draining");
        std::thread::sleep(Duration::from_millis(20));
    };
    assert!(exit.success(), "{exit:?}");
    assert!(
        std::net::TcpStream::connect(&addr).is_err(),
        "no longer listening"
    );
}
