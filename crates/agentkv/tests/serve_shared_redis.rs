//! Two real `agentkv serve` processes share one real `redis-server` (blocks written to it as
//! they are computed, `tier_write_on_publish`): a prompt the first server computed is found by
//! the second server in Redis (`cached_tokens`, tier hit counters) with output identical to the
//! first server's; another tenant of the second server gets nothing from the first tenant's
//! objects (positive control: the owner's hit). With a three-master Redis Cluster as the shared
//! tier, a master dying mid-run costs only its blocks: the other server still loads the prefix's
//! blocks up to the first one on the dead master, recomputes the rest with identical output, and
//! both keep serving new prompts (writes to the dead master fail and are counted).

mod common;

use common::{greedy_chat, http, metric_sum, start, words_message, Server};
use tier::testing::RedisServer;
use tier::testing_cluster::RedisCluster;

/// A 24-block active pool (16-token blocks, f16 KV: 23,040 bytes per token) and one Redis tier
/// (`tier`: its YAML flow mapping) written on publish.
fn config(tier: &str) -> String {
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
  - {tier}
model:
  threads: 2
"#
    )
}

/// A greedy chat completion: (reply text, prompt tokens, cached tokens).
fn chat(server: &Server, key: &str, text: &str) -> (String, u64, u64) {
    let v = greedy_chat(server, "agentkv-redis", key, text, 12);
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

/// Sum of a counter over its label sets in `/metrics` (0 when not exported).
fn metric(server: &Server, name: &str) -> u64 {
    metric_sum(server, "ka", name).unwrap_or(0)
}

#[test]
fn two_servers_share_one_redis_the_second_hits_the_first_servers_prefix() {
    let redis = RedisServer::start().expect("redis-server (CI installs it with apt)");
    let dir = tempfile::tempdir().unwrap();
    let cfg = dir.path().join("agentkv.yaml");
    let tier = format!("{{kind: redis, url: \"{}\"}}", redis.url());
    std::fs::write(&cfg, config(&tier)).unwrap();

    let first = start(&cfg);
    let p = words_message(0);
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

/// Polls until `server` reports at least `blocks` blocks written to its tiers.
fn wait_written(server: &Server, blocks: u64) {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    let mut written = metric(server, "agentkv_tier_demoted_blocks_total");
    while written < blocks && std::time::Instant::now() < deadline {
        std::thread::sleep(std::time::Duration::from_millis(50));
        written = metric(server, "agentkv_tier_demoted_blocks_total");
    }
    assert!(written >= blocks, "{written} blocks written, want {blocks}");
}

#[test]
fn a_dead_cluster_master_costs_only_its_blocks_both_servers_keep_serving() {
    let mut cluster = RedisCluster::start().expect("redis-server (CI installs it with apt)");
    let urls: Vec<String> = cluster.urls().iter().map(|u| format!("\"{u}\"")).collect();
    let tier = format!(
        "{{kind: redis, urls: [{}], cluster: true}}",
        urls.join(", ")
    );
    let dir = tempfile::tempdir().unwrap();
    let cfg = dir.path().join("agentkv.yaml");
    std::fs::write(&cfg, config(&tier)).unwrap();

    let first = start(&cfg);
    let p = words_message(0);
    let (reply, prompt_tokens, _) = chat(&first, "ka", &p);
    let p_blocks = (prompt_tokens - 1) / 16;
    wait_written(&first, p_blocks);
    let sizes: Vec<u64> = (0..3).map(|i| cluster.dbsize(i)).collect();
    assert_eq!(
        sizes.iter().sum::<u64>(),
        p_blocks,
        "one key per block: {sizes:?}"
    );
    // Kill a master holding some of P's blocks (SIGKILL), and wait past the node timeout.
    let dead = (0..3).find(|&i| sizes[i] > 0).unwrap();
    cluster.nodes[dead].stop();
    std::thread::sleep(std::time::Duration::from_millis(1500));

    let second = start(&cfg);
    let started = std::time::Instant::now();
    let (again, _, cached) = chat(&second, "ka", &p);
    assert!(
        started.elapsed() < std::time::Duration::from_secs(20),
        "a dead master stalled the request: {:?}",
        started.elapsed()
    );
    assert_eq!(
        again, reply,
        "recomputed blocks give the first server's output"
    );
    assert!(
        cached <= (p_blocks - sizes[dead]) * 16,
        "{cached} cached tokens: the dead master's {} blocks cannot have been loaded",
        sizes[dead]
    );
    assert_eq!(metric(&second, "agentkv_tier_hit_tokens_total"), cached);
    assert_eq!(metric(&second, "agentkv_tier_corrupt_total"), 0);
    // Both servers keep serving new prompts; some writes of their blocks hit the dead master's
    // slots and fail (counted), the rest are written.
    for (server, i) in [(&second, 1), (&first, 2), (&second, 3)] {
        chat(server, "ka", &words_message(i)); // asserts 200
    }
    let (status, _) = http(&first.addr, "GET", "/health", "", "");
    assert_eq!(status, 200);
    let errors =
        metric(&first, "agentkv_tier_errors_total") + metric(&second, "agentkv_tier_errors_total");
    assert!(
        errors > 0,
        "writes to the dead master are counted as tier errors"
    );
}
