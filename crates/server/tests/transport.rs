//! Regression tests over real sockets (issue #13): F4 slow or short clients are cut off and
//! connections are capped; hyper's own 400 / 414 / 431 answers carry OpenAI error bodies; F6
//! requests still running when the shutdown grace period ends get an error, not silence.

mod common;

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::{Duration, Instant};

use common::app;
use server::{Limits, ServerSettings};

struct Running {
    addr: SocketAddr,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    task: tokio::task::JoinHandle<std::io::Result<()>>,
    _engine: engine::Engine,
}

async fn start(settings: ServerSettings) -> Running {
    let (engine, state, _router) = app(settings);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let (tx, rx) = tokio::sync::oneshot::channel::<()>();
    let task = tokio::spawn(server::serve(listener, state, async {
        let _ = rx.await;
    }));
    Running {
        addr,
        stop: Some(tx),
        task,
        _engine: engine,
    }
}

fn limits(header_ms: u64, body_ms: u64, max_connections: usize) -> Limits {
    Limits {
        header_timeout: Duration::from_millis(header_ms),
        body_timeout: Duration::from_millis(body_ms),
        max_connections,
        ..Limits::default()
    }
}

fn connect(addr: SocketAddr) -> TcpStream {
    let s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(60))).unwrap();
    s
}

/// Everything the server sends until it closes the connection (a reset counts as closed).
fn read_to_close(s: &mut TcpStream) -> String {
    let mut out = Vec::new();
    let mut buf = [0u8; 8192];
    loop {
        match s.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => out.extend_from_slice(&buf[..n]),
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => break,
            Err(e) => panic!("read: {e} after {:?}", String::from_utf8_lossy(&out)),
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// Status and (de-chunked) body of one response.
fn parse(raw: &str) -> (u16, String) {
    let (head, body) = raw
        .split_once("\r\n\r\n")
        .unwrap_or_else(|| panic!("{raw:?}"));
    let status = head.split(' ').nth(1).unwrap().parse().unwrap();
    if !head
        .to_ascii_lowercase()
        .contains("transfer-encoding: chunked")
    {
        return (status, body.to_string());
    }
    let (mut rest, mut out) = (body, String::new());
    while let Some((len, tail)) = rest.split_once("\r\n") {
        let n = usize::from_str_radix(len.trim(), 16).unwrap_or(0);
        if n == 0 || tail.len() < n {
            break;
        }
        out.push_str(&tail[..n]);
        rest = tail[n..].trim_start_matches("\r\n");
    }
    (status, out)
}

fn assert_openai_error(body: &str, code: &str) {
    let v: serde_json::Value =
        serde_json::from_str(body).unwrap_or_else(|e| panic!("not JSON ({e}): {body:?}"));
    assert!(v["error"]["message"].is_string(), "{body}");
    assert!(v["error"]["type"].is_string(), "{body}");
    assert_eq!(v["error"]["code"], code, "{body}");
}

async fn blocking<T: Send + 'static>(f: impl FnOnce() -> T + Send + 'static) -> T {
    tokio::task::spawn_blocking(f).await.unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn f4_partial_headers_and_short_bodies_are_cut_off() {
    let srv = start(ServerSettings {
        limits: limits(400, 400, 64),
        ..ServerSettings::default()
    })
    .await;
    let addr = srv.addr;
    blocking(move || {
        // Partial headers: closed after the header deadline.
        let mut s = connect(addr);
        let t = Instant::now();
        s.write_all(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Ty")
            .unwrap();
        read_to_close(&mut s);
        assert!(t.elapsed() < Duration::from_secs(5), "{:?}", t.elapsed());
        // A Content-Length larger than the body: 408 with a JSON body, then closed.
        let mut s = connect(addr);
        let t = Instant::now();
        s.write_all(
            b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n\
              Content-Length: 100\r\n\r\n{\"model\":",
        )
        .unwrap();
        let (status, body) = parse(&read_to_close(&mut s));
        assert_eq!(status, 408);
        assert_openai_error(&body, "request_timeout");
        assert!(t.elapsed() < Duration::from_secs(5), "{:?}", t.elapsed());
        // N8 (issue #44): a Content-Length over the body limit is a 413 at once: not a 408
        // after the body deadline.
        let mut s = connect(addr);
        s.write_all(
            b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n\
              Content-Length: 1000000000000\r\n\r\n{",
        )
        .unwrap();
        let (status, body) = parse(&read_to_close(&mut s));
        assert_eq!(status, 413);
        assert_openai_error(&body, "body_too_large");
        // An idle keep-alive connection is closed too; a prompt client is served.
        let mut s = connect(addr);
        s.write_all(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
            .unwrap();
        let t = Instant::now();
        let raw = read_to_close(&mut s);
        assert!(raw.starts_with("HTTP/1.1 200"), "{raw}");
        assert!(t.elapsed() < Duration::from_secs(5), "{:?}", t.elapsed());
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn f4_connections_beyond_the_cap_get_503_json() {
    let srv = start(ServerSettings {
        limits: limits(3_000, 3_000, 2),
        ..ServerSettings::default()
    })
    .await;
    let addr = srv.addr;
    blocking(move || {
        let idle: Vec<TcpStream> = (0..2).map(|_| connect(addr)).collect();
        std::thread::sleep(Duration::from_millis(200));
        let mut s = connect(addr);
        let (status, body) = parse(&read_to_close(&mut s));
        assert_eq!(status, 503);
        assert_openai_error(&body, "overloaded");
        drop(idle);
        // Slots come back when connections close.
        std::thread::sleep(Duration::from_millis(300));
        let mut s = connect(addr);
        s.write_all(b"GET /health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
            .unwrap();
        assert!(read_to_close(&mut s).starts_with("HTTP/1.1 200"));
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn n7_one_source_holding_idle_sockets_cannot_lock_others_out() {
    // Cap 4, so 2 per source by default.
    let srv = start(ServerSettings {
        limits: limits(3_000, 3_000, 4),
        ..ServerSettings::default()
    })
    .await;
    let addr = srv.addr;
    // Another client address on the loopback network (127.0.0.0/8 is all loopback).
    let other = tokio::net::TcpSocket::new_v4().unwrap();
    other.bind("127.0.0.2:0".parse().unwrap()).unwrap();
    let other = other.connect(addr).await.unwrap().into_std().unwrap();
    other.set_nonblocking(false).unwrap();
    blocking(move || {
        let idle: Vec<TcpStream> = (0..2).map(|_| connect(addr)).collect();
        std::thread::sleep(Duration::from_millis(200));
        // The hostile source's third socket is refused...
        let mut s = connect(addr);
        let (status, body) = parse(&read_to_close(&mut s));
        assert_eq!(status, 503);
        assert_openai_error(&body, "overloaded");
        // ...while another client is served.
        let mut o = other;
        o.set_read_timeout(Some(Duration::from_secs(60))).unwrap();
        o.write_all(b"GET /health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
            .unwrap();
        let raw = read_to_close(&mut o);
        assert!(raw.starts_with("HTTP/1.1 200"), "{raw}");
        drop(idle);
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn f4_every_error_status_has_an_openai_body_405_431_400() {
    let srv = start(ServerSettings::default()).await;
    let addr = srv.addr;
    blocking(move || {
        let exchange = |req: &[u8]| {
            let mut s = connect(addr);
            s.write_all(req).unwrap();
            parse(&read_to_close(&mut s))
        };
        let (status, body) = exchange(
            b"DELETE /v1/chat/completions HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
        );
        assert_eq!(status, 405);
        assert_openai_error(&body, "method_not_allowed");
        let long = format!(
            "GET /health?q={} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
            "a".repeat(70_000)
        );
        // A request head over the connection buffer (16 KiB: `transport::MAX_BUF_BYTES`, kept
        // small so a client that stops reading is noticed) is a 431, a long URI included.
        let (status, body) = exchange(long.as_bytes());
        assert_eq!(status, 431);
        assert_openai_error(&body, "headers_too_large");
        let mut many = String::from("GET /health HTTP/1.1\r\nHost: x\r\n");
        for i in 0..200 {
            many.push_str(&format!("x-h{i}: v\r\n"));
        }
        many.push_str("\r\n");
        let (status, body) = exchange(many.as_bytes());
        assert_eq!(status, 431);
        assert_openai_error(&body, "headers_too_large");
        let (status, body) = exchange(b"GET /health HTTP/1.1\r\nHost x\r\n\r\n");
        assert_eq!(status, 400);
        assert_openai_error(&body, "invalid_http_request");
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn f6_requests_running_past_the_shutdown_grace_get_an_error() {
    let mut srv = start(ServerSettings {
        shutdown_timeout: Duration::from_millis(300),
        ..ServerSettings::default()
    })
    .await;
    let addr = srv.addr;
    let request = |stream: bool| {
        let body = serde_json::json!({"model": "agentkv", "stream": stream, "max_tokens": 1500,
            "ignore_eos": true, "messages": [{"role": "user", "content": "Count to a million."}]})
        .to_string();
        format!(
            "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n\
             Content-Length: {}\r\n\r\n{body}",
            body.len()
        )
    };
    let (sreq, preq) = (request(true), request(false));
    let streamed = std::thread::spawn(move || {
        let mut s = connect(addr);
        s.write_all(sreq.as_bytes()).unwrap();
        read_to_close(&mut s)
    });
    let plain = std::thread::spawn(move || {
        let mut s = connect(addr);
        s.write_all(preq.as_bytes()).unwrap();
        read_to_close(&mut s)
    });
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let t = Instant::now();
    let _ = srv.stop.take().unwrap().send(());
    srv.task.await.unwrap().unwrap();
    assert!(t.elapsed() < Duration::from_secs(10), "{:?}", t.elapsed());
    let (status, body) = parse(&blocking(move || streamed.join().unwrap()).await);
    assert_eq!(status, 200);
    assert!(body.contains("\"choices\""), "{body}");
    let last_data: Vec<&str> = body
        .lines()
        .filter_map(|l| l.strip_prefix("data: "))
        .collect();
    let n = last_data.len();
    assert!(n >= 2, "{body}");
    assert_eq!(last_data[n - 1], "[DONE]", "{body}");
    assert_openai_error(last_data[n - 2], "overloaded");
    assert!(last_data[n - 2].contains("shutting down"), "{body}");
    let (status, body) = parse(&blocking(move || plain.join().unwrap()).await);
    assert_eq!(status, 503, "{body}");
    assert_openai_error(&body, "overloaded");
}
