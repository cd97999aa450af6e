//! A client that disconnects while its request runs: the request is cancelled in the engine and
//! its KV blocks are freed (streaming and non-streaming), over a real TCP connection to the real
//! router with the real default model. Positive control: the same request left connected
//! finishes normally.

mod common;

use std::io::Write;
use std::net::TcpStream;
use std::time::{Duration, Instant};

use engine::EngineHandle;
use server::ServerSettings;

/// A request that would run for thousands of decode steps if nobody cancelled it.
fn body(stream: bool, max_tokens: usize) -> String {
    serde_json::json!({
        "model": "agentkv",
        "messages": [{"role": "user", "content": "Count from one to one million."}],
        "max_tokens": max_tokens,
        "ignore_eos": true,
        "temperature": 0,
        "stream": stream,
    })
    .to_string()
}

fn send(addr: std::net::SocketAddr, body: &str) -> TcpStream {
    let mut s = TcpStream::connect(addr).unwrap();
    write!(
        s,
        "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n\
         Content-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    )
    .unwrap();
    s
}

/// Polls the engine until `done` holds (at most 120 s); returns that snapshot.
async fn wait_for(
    h: &EngineHandle,
    done: impl Fn(&engine::EngineSnapshot) -> bool,
) -> engine::EngineSnapshot {
    let start = Instant::now();
    loop {
        let snap = h.snapshot().unwrap().await.unwrap();
        if done(&snap) {
            return snap;
        }
        assert!(
            start.elapsed() < Duration::from_secs(120),
            "engine state never reached: {:?}",
            snap.stats
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_disconnected_client_is_cancelled_and_its_blocks_freed() {
    let (engine, _state, router) = common::app(ServerSettings::default());
    let h = engine.handle();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, router).await.unwrap() });

    for (i, stream) in [false, true].into_iter().enumerate() {
        let conn = tokio::task::spawn_blocking(move || send(addr, &body(stream, 3000)))
            .await
            .unwrap();
        // Running and decoding (holding blocks), then the client goes away.
        wait_for(&h, |s| s.stats.decode_tokens > 0 && s.num_running == 1).await;
        drop(conn);
        let snap = wait_for(&h, |s| s.num_running == 0 && s.num_waiting == 0).await;
        assert_eq!(
            snap.stats.cancelled,
            i as u64 + 1,
            "stream={stream}: the request was cancelled, not run to its 3000 tokens"
        );
        assert_eq!(snap.usage.in_use, 0, "stream={stream}: its blocks are free");
    }

    // Positive control: a client that stays connected gets its whole answer.
    let reply = tokio::task::spawn_blocking(move || {
        let mut s = send(addr, &body(false, 4));
        let mut out = String::new();
        std::io::Read::read_to_string(&mut s, &mut out).unwrap();
        out
    })
    .await
    .unwrap();
    assert!(reply.starts_with("HTTP/1.1 200"), "{reply}");
    assert!(reply.contains("\"finish_reason\":\"length\""), "{reply}");
    let snap = wait_for(&h, |s| s.stats.finished == 1).await;
    assert_eq!(snap.stats.cancelled, 2);
}
