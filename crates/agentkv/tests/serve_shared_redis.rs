//! Two real `agentkv serve` processes share one real `redis-server` (blocks written to it as
//! they are computed, `tier_write_on_publish`): a prompt the first server computed is found by
//! the second server in Redis (`cached_tokens`, tier hit counters) with output identical to the
//! first server's; another tenant of the second server gets nothing from the first tenant's
//! objects (positive control: the owner's hit).

mod common;

use common::{http, start, Server};
use serde_json::{json, Value};
use tier::testing::RedisServer;

/// A 24-block active pool (16-token blocks, f16 KV: 23,040 bytes per token) and one Redis tier
/// written on publish.
fn config(redis_url: &str) -> String {
    format!(
        r#"
server:
  model_name: agentkv-redis
tenants:
  - {{name: alpha, api_keys: ["ka"]}}
  - {{name: beta, api_keys: ["kb"]}}
kv_cache_config:
  max_size: 8847360
  block_size: 16
  replacement_policy: lru
  quantization: f16
  tier_write_on_publish: true
tiers:
  - {{kind: redis, url: "{redis_url}"}}
model:
  threads: 2
"#
    )
}

/// A ~200-token user message; different `i` differ from the first word on.
fn message(i: usize) -> String {
    let words = [
        "cache", "tool", "agent", "prefix", "block", "token", "layer", "query", "value", "shard",
    ];
    (0..150)
        .map(|j| words[(i * 7 + j * 3 + j * j) % words.len()])
        .collect::<Vec<_>>()
        .join(" ")
}

/// A greedy chat completion: (reply text, prompt tokens, cached tokens).
fn chat(server: &Server, key: &str, text: &str) -> (String, u64, u64) {
    let body = json!({
        "model": "agentkv-redis",
        "messages": [{"role": "user", "content": text}],
        "max_tokens": 12,
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
    let v: Value = serde_json::from_str(&body).unwrap();
    let usage = &v["usage"];
    (
        v["choices"][0]["message"]["content"]
            .as_str()
            .unwrap()
            .to_string(),
        usage["prompt_tokens"].as_u64().unwrap(),
        usage["prompt_tokens_details"]["cached_tokens"]
            .as_u64()
            .unwrap(),
    )
}

/// Sum of a counter over its label sets in `/metrics`.
fn metric(server: &Server, name: &str) -> u64 {
    let (status, body) = http(&server.addr, "GET", "/metrics", "ka", "");
    assert_eq!(status, 200);
    body.lines()
        .filter(|l| l.starts_with(&format!("{name}{{")) || l.starts_with(&format!("{name} ")))
        .map(|l| l.rsplit(' ').next().unwrap().parse::<f64>().unwrap() as u64)
        .sum()
}

#[test]
fn two_servers_share_one_redis_the_second_hits_the_first_servers_prefix() {
    let redis = RedisServer::start().expect("redis-server (CI installs it with apt)");
    let dir = tempfile::tempdir().unwrap();
    let cfg = dir.path().join("agentkv.yaml");
    std::fs::write(&cfg, config(&redis.url())).unwrap();

    let first = start(&cfg);
    let p = message(0);
    let (reply, prompt_tokens, cached) = chat(&first, "ka", &p);
    assert_eq!(cached, 0, "a cold server and an empty Redis");
    assert!(prompt_tokens > 160, "{prompt_tokens} prompt tokens");
    // P's full blocks reach Redis although the first server still holds them (written on
    // publish, not on eviction). Writes run in the background and `/metrics` never waits for
    // them: poll until they are reported.
    let p_blocks = (prompt_tokens - 1) / 16;
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    let mut written = metric(&first, "agentkv_tier_demoted_blocks_total");
    while written < p_blocks && std::time::Instant::now() < deadline {
        std::thread::sleep(std::time::Duration::from_millis(50));
        written = metric(&first, "agentkv_tier_demoted_blocks_total");
    }
    assert!(
        written >= p_blocks,
        "{written} blocks written, P has {p_blocks}"
    );

    let second = start(&cfg);
    // Another tenant: the same text finds nothing of alpha's in Redis.
    let (beta_reply, _, beta_cached) = chat(&second, "kb", &p);
    assert_eq!(
        beta_cached, 0,
        "tenant beta must not hit tenant alpha's objects"
    );
    assert_eq!(metric(&second, "agentkv_tier_hit_tokens_total"), 0);
    assert_eq!(beta_reply, reply, "output is tenant-independent");
    // The owner, on the second server: every cacheable block of P comes from Redis.
    let (again, _, cached) = chat(&second, "ka", &p);
    assert_eq!(cached, p_blocks * 16, "P's full blocks served from Redis");
    assert_eq!(
        metric(&second, "agentkv_tier_hit_tokens_total"),
        p_blocks * 16
    );
    assert_eq!(again, reply, "loaded K/V gives the first server's output");
    assert!(metric(&second, "agentkv_tier_prefetches_total") >= 2);
    assert_eq!(metric(&second, "agentkv_tier_corrupt_total"), 0);
}
