//! Issue #44, N10, against the real `agentkv serve` process: streams whose clients stop reading
//! must stop holding compute, slots and blocks that others wait for. Twelve 1,000-token streams
//! (with `top_logprobs` 20, the heaviest events) are opened from sockets with a tiny receive
//! buffer that are never read; a short request from another client must then be answered, and
//! the stalled streams must stop generating (`agentkv_decode_tokens_total` stays flat while only
//! they are held); once their clients go away, their slots and blocks come back.

mod common;

use std::time::{Duration, Instant};

use common::{http, start};

const CONFIG: &str =
    "server: {model_name: hostile}\nmodel: {threads: 2}\nlimits: {max_running_requests: 8}\n";

fn metric(addr: &str, name: &str) -> f64 {
    let (_, body) = http(addr, "GET", "/metrics", "", "");
    body.lines()
        .find_map(|l| l.strip_prefix(&format!("{name} ")))
        .and_then(|v| v.parse().ok())
        .unwrap_or(0.0)
}

#[test]
fn streams_whose_clients_stop_reading_stop_holding_the_server() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = dir.path().join("agentkv.yaml");
    std::fs::write(&cfg, CONFIG).unwrap();
    let server = start(&cfg);
    let addr: std::net::SocketAddr = server.addr.parse().unwrap();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    // Twelve non-reading streams (more than the 8 running slots).
    let stalled: Vec<tokio::net::TcpStream> = rt.block_on(async {
        let mut socks = Vec::new();
        for i in 0..12 {
            let body = serde_json::json!({
                "model": "hostile",
                "messages": [{"role": "user", "content": format!("Write a very long story number {i}.")}],
                "max_tokens": 1000, "stream": true, "logprobs": true, "top_logprobs": 20,
                "ignore_eos": true, "temperature": 0,
            })
            .to_string();
            let s = tokio::net::TcpSocket::new_v4().unwrap();
            s.set_recv_buffer_size(4096).unwrap();
            let mut s = s.connect(addr).await.unwrap();
            let req = format!(
                "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n\
                 Content-Length: {}\r\n\r\n{body}",
                body.len()
            );
            tokio::io::AsyncWriteExt::write_all(&mut s, req.as_bytes())
                .await
                .unwrap();
            socks.push(s);
        }
        socks
    });
    std::thread::sleep(Duration::from_secs(3));
    // Another client is served (not after the 12 × 1,000 tokens).
    let body =
        serde_json::json!({"model": "hostile", "messages": [{"role": "user", "content": "Hi"}],
                                  "max_tokens": 4, "temperature": 0})
        .to_string();
    let t = Instant::now();
    let (status, reply) = http(&server.addr, "POST", "/v1/chat/completions", "", &body);
    assert_eq!(status, 200, "{reply}");
    println!(
        "short request answered in {:?} beside 12 stalled streams",
        t.elapsed()
    );
    // The stalled streams stop generating: the decode counter goes flat long before the
    // 12 × 1,000 tokens they asked for.
    let deadline = Instant::now() + Duration::from_secs(180);
    let mut last = metric(&server.addr, "agentkv_decode_tokens_total");
    loop {
        std::thread::sleep(Duration::from_secs(2));
        let now = metric(&server.addr, "agentkv_decode_tokens_total");
        if now == last {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "stalled streams kept decoding ({now} tokens)"
        );
        last = now;
    }
    println!("decoding stopped after {last} tokens");
    assert!(
        last < 12.0 * 1000.0 / 2.0,
        "the streams ran to the end: {last}"
    );
    // Their clients leave: everything comes back.
    drop(stalled);
    drop(rt);
    let deadline = Instant::now() + Duration::from_secs(60);
    while metric(&server.addr, "agentkv_requests_running") > 0.0 {
        assert!(Instant::now() < deadline, "stalled requests never ended");
        std::thread::sleep(Duration::from_millis(100));
    }
    assert_eq!(
        metric(&server.addr, "agentkv_requests_waiting"),
        0.0,
        "stalled requests left in the queue"
    );
}
