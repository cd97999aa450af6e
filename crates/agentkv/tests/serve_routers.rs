//! Two real `agentkv serve` replicas (1 thread each, KV events on) behind real, pip-installed
//! routers: vllm-router 0.1.17 (`cache_aware`, and `kv_aware` fed by the replicas' ZMQ KV events)
//! and sglang-router 0.3.2 (`cache_aware`). Through each router a multi-call agent session (each
//! call = the previous conversation + the reply + a tool result) must land where its prefix is
//! warm (`usage.prompt_tokens_details.cached_tokens` covers the previous call's prompt), and a
//! second tenant sending the first tenant's prompt gets nothing cached (the router may pick the
//! replica, never the namespace). Positive control: round-robin alternates and misses.
//!
//! The routers come from `.venv-routers` (`scripts/test.sh` pip-installs them there). Where pip cannot install them on the platform, scripts/test.sh sets
//! `AGENTKV_ROUTERS=unavailable` and this test says so and returns; otherwise a missing router
//! binary is a failure.

mod common;

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use common::{http, python, start, Server};
use serde_json::{json, Value};

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// A router binary: in `$AGENTKV_ROUTER_BIN` (set by scripts/test.sh), else the workspace's
/// `.venv-routers/bin`, else next to the test interpreter.
fn router_bin(name: &str) -> Option<PathBuf> {
    let mut dirs = Vec::new();
    if let Ok(d) = std::env::var("AGENTKV_ROUTER_BIN") {
        dirs.push(PathBuf::from(d));
    }
    dirs.push(PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../.venv-routers/bin"));
    if let Some(p) = PathBuf::from(python()).parent() {
        dirs.push(p.to_path_buf());
    }
    dirs.into_iter().map(|d| d.join(name)).find(|b| b.exists())
}

struct Router {
    child: Child,
    addr: String,
}

impl Drop for Router {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn start_router(bin: &PathBuf, args: &[String], port: u16) -> Router {
    let log = std::env::temp_dir().join(format!("agentkv-router-{port}.log"));
    let child = Command::new(bin)
        .args(args)
        .stdout(Stdio::from(std::fs::File::create(&log).unwrap()))
        .stderr(Stdio::from(
            std::fs::File::create(log.with_extension("err")).unwrap(),
        ))
        .spawn()
        .unwrap_or_else(|e| panic!("starting {}: {e}", bin.display()));
    let addr = format!("127.0.0.1:{port}");
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        if std::net::TcpStream::connect(&addr).is_ok() {
            let (status, _) = http(&addr, "GET", "/v1/models", "ka", "");
            if status == 200 {
                break;
            }
        }
        assert!(
            Instant::now() < deadline,
            "router {} not ready: see {}",
            bin.display(),
            log.display()
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    Router { child, addr }
}

fn config(events_port: u16, replay_port: u16) -> String {
    format!(
        r#"
server: {{model_name: agentkv}}
tenants:
  - {{name: alpha, api_keys: ["ka"]}}
  - {{name: beta, api_keys: ["kb"]}}
kv_cache_config: {{max_size: 256MiB, block_size: 16}}
kv_events: {{endpoint: "tcp://127.0.0.1:{events_port}", replay_endpoint: "tcp://127.0.0.1:{replay_port}"}}
model: {{threads: 1}}
"#
    )
}

/// A ~120-token text; different `seed`s differ from the first word on.
fn text(seed: usize) -> String {
    let words = [
        "cache", "tool", "agent", "prefix", "block", "token", "layer", "query", "value", "shard",
        "router", "replica",
    ];
    (0..90)
        .map(|j| words[(seed * 7 + j * 5 + j * j) % words.len()])
        .collect::<Vec<_>>()
        .join(" ")
}

/// One chat call through `addr`: (prompt tokens, cached tokens, reply).
fn call(addr: &str, key: &str, session: &str, messages: &[Value]) -> (u64, u64, String) {
    let body = json!({
        "model": "agentkv",
        "messages": messages,
        "max_tokens": 8,
        "temperature": 0,
    })
    .to_string();
    let mut s = std::net::TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(120))).unwrap();
    use std::io::{Read, Write};
    write!(
        s,
        "POST /v1/chat/completions HTTP/1.1\r\nHost: {addr}\r\nAuthorization: Bearer {key}\r\n\
         x-session-id: {session}\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\
         Connection: close\r\n\r\n{body}",
        body.len()
    )
    .unwrap();
    let mut raw = String::new();
    s.read_to_string(&mut raw).unwrap();
    let (head, rest) = raw.split_once("\r\n\r\n").unwrap();
    assert!(head.contains(" 200 "), "{raw}");
    let json_text = if head.to_ascii_lowercase().contains("chunked") {
        let start = rest.find('{').unwrap();
        let end = rest.rfind('}').unwrap();
        &rest[start..=end]
    } else {
        rest
    };
    let v: Value = serde_json::from_str(json_text).unwrap_or_else(|e| panic!("{e}: {raw}"));
    let u = &v["usage"];
    (
        u["prompt_tokens"].as_u64().unwrap(),
        u["prompt_tokens_details"]["cached_tokens"]
            .as_u64()
            .unwrap_or(0),
        v["choices"][0]["message"]["content"]
            .as_str()
            .unwrap_or("")
            .to_string(),
    )
}

/// Runs a 4-call agent session of tenant alpha through `addr` and returns each call's
/// (prompt tokens, cached tokens).
fn agent_session(addr: &str, seed: usize) -> Vec<(u64, u64)> {
    let mut messages = vec![
        json!({"role": "system", "content": format!("You are agent {seed}. {}", text(seed))}),
        json!({"role": "user", "content": text(seed + 1)}),
    ];
    let session = format!("session-{seed}");
    let mut out = Vec::new();
    for step in 0..4 {
        let (prompt, cached, reply) = call(addr, "ka", &session, &messages);
        out.push((prompt, cached));
        messages.push(json!({"role": "assistant", "content": reply}));
        messages.push(json!({"role": "user", "content": format!("Tool result {step}: {}", text(seed + 10 + step))}));
    }
    out
}

/// Every call after the first found (almost) all of the previous call's prompt cached: the
/// router sent it where the prefix is warm.
fn assert_warm(name: &str, calls: &[(u64, u64)]) {
    for w in calls.windows(2) {
        let (prev_prompt, _) = w[0];
        let (_, cached) = w[1];
        assert!(
            cached + 32 >= prev_prompt,
            "{name}: a follow-up call found {cached} cached tokens, the previous prompt had \
             {prev_prompt}: {calls:?}"
        );
    }
}

#[test]
fn routers_send_agent_calls_where_the_prefix_is_warm_and_keep_tenants_apart() {
    if std::env::var("AGENTKV_ROUTERS").as_deref() == Ok("unavailable") {
        eprintln!(
            "SKIPPED: scripts/test.sh could not pip-install vllm-router / sglang-router on this \
             platform (AGENTKV_ROUTERS=unavailable)"
        );
        return;
    }
    let (vllm_router, sglang_router) = (
        router_bin("vllm-router").expect(
            "vllm-router not installed next to the test interpreter: run scripts/test.sh (it \
             pip-installs vllm-router==0.1.17 into .venv-routers)",
        ),
        router_bin("sglang-router").expect(
            "sglang-router not installed next to the test interpreter: run scripts/test.sh (it \
             pip-installs sglang-router==0.3.2 into .venv-routers)",
        ),
    );
    let dir = tempfile::tempdir().unwrap();
    let mut replicas: Vec<(Server, u16, u16)> = Vec::new();
    for i in 0..2 {
        let (ev, rp) = (free_port(), free_port());
        let cfg = dir.path().join(format!("replica{i}.yaml"));
        std::fs::write(&cfg, config(ev, rp)).unwrap();
        replicas.push((start(&cfg), ev, rp));
    }
    let urls: Vec<String> = replicas
        .iter()
        .map(|(s, _, _)| format!("http://{}", s.addr))
        .collect();

    let mut seed = 100;
    let mut run = |name: &str, bin: &PathBuf, extra: Vec<String>, expect_warm: bool| {
        let port = free_port();
        let mut args: Vec<String> = vec![
            "--host".into(),
            "127.0.0.1".into(),
            "--port".into(),
            port.to_string(),
            "--worker-urls".into(),
        ];
        args.extend(urls.iter().cloned());
        args.extend(extra);
        let router = start_router(bin, &args, port);
        seed += 20;
        let calls = agent_session(&router.addr, seed);
        if expect_warm {
            assert_warm(name, &calls);
        }
        // Tenant beta sends alpha's first prompt: nothing of alpha's is ever served to it.
        let first = vec![
            json!({"role": "system", "content": format!("You are agent {seed}. {}", text(seed))}),
            json!({"role": "user", "content": text(seed + 1)}),
        ];
        let (_, beta_cached, _) = call(&router.addr, "kb", "beta-session", &first);
        assert_eq!(
            beta_cached, 0,
            "{name}: tenant beta hit tenant alpha's blocks"
        );
        eprintln!("{name}: {calls:?}");
        calls
    };

    // vllm-router needs these to prometheus-bind somewhere free.
    let prom = |p: u16| vec!["--prometheus-port".to_string(), p.to_string()];
    let mut cache_aware = vec!["--policy".to_string(), "cache_aware".to_string()];
    cache_aware.extend(prom(free_port()));
    run("vllm-router cache_aware", &vllm_router, cache_aware, true);

    let mut kv_aware = vec![
        "--policy".to_string(),
        "kv_aware".to_string(),
        "--kv-event-block-size".to_string(),
        "16".to_string(),
        // The served model name: the router keys its index by it.
        "--kv-event-model".to_string(),
        "agentkv".to_string(),
    ];
    for (url, (_, ev, rp)) in urls.iter().zip(&replicas) {
        kv_aware.push("--kv-event-source".into());
        kv_aware.push(format!("{url}=tcp://127.0.0.1:{ev}"));
        kv_aware.push("--kv-event-replay-source".into());
        kv_aware.push(format!("{url}=tcp://127.0.0.1:{rp}"));
    }
    kv_aware.extend(prom(free_port()));
    run("vllm-router kv_aware", &vllm_router, kv_aware, true);

    let sglang = vec![
        "launch".to_string(),
        "--policy".to_string(),
        "cache_aware".to_string(),
        "--prometheus-port".to_string(),
        free_port().to_string(),
    ];
    // `launch` must come first: rebuild the argument list around it.
    {
        let port = free_port();
        let mut args = sglang.clone();
        args.extend([
            "--host".to_string(),
            "127.0.0.1".to_string(),
            "--port".to_string(),
            port.to_string(),
            "--worker-urls".to_string(),
        ]);
        args.extend(urls.iter().cloned());
        let router = start_router(&sglang_router, &args, port);
        let calls = agent_session(&router.addr, 999);
        assert_warm("sglang-router cache_aware", &calls);
        eprintln!("sglang-router cache_aware: {calls:?}");
    }

    // Positive control: round-robin alternates the two replicas, so follow-ups miss.
    let mut rr = vec!["--policy".to_string(), "round_robin".to_string()];
    rr.extend(prom(free_port()));
    let calls = run("vllm-router round_robin", &vllm_router, rr, false);
    assert!(
        calls.windows(2).any(|w| w[1].1 + 32 < w[0].0),
        "round robin should miss at least once: {calls:?}"
    );
}
