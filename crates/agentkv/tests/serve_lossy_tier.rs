//! The real `agentkv serve` with an f16 active pool and a RAM tier storing `k=int4c,v=int4`
//! (a lossy tier, issue #18): evicted blocks are transcoded and written once the engine idles
//! (`tier_encode_deferral_ms`), a re-sent prompt is restored from the tier (`cached_tokens`),
//! and `/metrics` reports the writes and the blocks encoded while the engine computed.

mod common;

use common::{greedy_chat, metric_sum, start, words_message, Server};
use std::time::{Duration, Instant};

/// A 24-block active pool (16-token blocks, f16 KV: 23,040 bytes per token) over a lossy RAM
/// tier whose encodes wait up to 300 ms for an idle engine.
const CONFIG: &str = r#"
server:
  model_name: agentkv-lossy
tenants:
  - {name: alpha, api_keys: ["ka"]}
kv_cache_config:
  max_size: 8847360
  block_size: 16
  replacement_policy: lru
  infer_conversations: false
  quantization: f16
  tier_encode_deferral_ms: 300
tiers:
  - {kind: ram, max_size: 256MiB, codec: "k=int4c,v=int4"}
model:
  threads: 2
"#;

/// A greedy chat completion: (prompt tokens, cached tokens).
fn chat(server: &Server, text: &str) -> (u64, u64) {
    let v = greedy_chat(server, "agentkv-lossy", "ka", text, 8);
    let usage = &v["usage"];
    (
        usage["prompt_tokens"].as_u64().unwrap(),
        usage["prompt_tokens_details"]["cached_tokens"]
            .as_u64()
            .unwrap(),
    )
}

#[test]
fn a_lossy_tier_is_written_when_the_engine_idles_and_restores_the_prompt() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = dir.path().join("agentkv.yaml");
    std::fs::write(&cfg, CONFIG).unwrap();
    let server = start(&cfg);

    let p = words_message(0);
    let (prompt_tokens, cached) = chat(&server, &p);
    assert_eq!(cached, 0);
    assert!(prompt_tokens > 160, "{prompt_tokens} prompt tokens");
    // Two other prompts evict P's blocks (3 × ~13 blocks against a 24-block pool).
    chat(&server, &words_message(1));
    chat(&server, &words_message(2));
    // The server idles now: the deferred encodes run, `/metrics` reports them once written.
    let deadline = Instant::now() + Duration::from_secs(30);
    let demoted = || metric_sum(&server, "ka", "agentkv_tier_demoted_blocks_total").unwrap_or(0);
    let mut written = demoted();
    while written < 8 && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(50));
        written = demoted();
    }
    assert!(written >= 8, "{written} blocks written to the lossy tier");
    assert!(
        metric_sum(&server, "ka", "agentkv_tier_busy_encoded_blocks_total").is_some(),
        "the busy-encode counter is exported"
    );

    // P again: its blocks come back from the tier (transcoded to f16 on the loader thread).
    let (again_tokens, cached) = chat(&server, &p);
    assert_eq!(again_tokens, prompt_tokens);
    assert!(
        cached >= 16,
        "{cached} of {prompt_tokens} tokens restored from the lossy tier"
    );
    assert!(metric_sum(&server, "ka", "agentkv_tier_hit_tokens_total").unwrap_or(0) >= 16);
}
