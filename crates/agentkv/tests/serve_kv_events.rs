//! A real `agentkv serve` publishing KV events (`--kv-events-endpoint`, with the replay ROUTER)
//! and a subscriber written from vLLM's format description in Python (`kv_events_subscriber.py`:
//! pyzmq + msgpack, strict checks of every frame and field, then a replay from seq 0): after real
//! requests of two tenants and enough prompts to evict, the decoded events say what the server
//! did — blocks stored in the pool (`GPU`), removed from it and stored in the RAM tier (`CPU`)
//! with the same hash and tokens, removed from the RAM tier when its byte budget evicts them
//! (`BlockRemoved`, `CPU`), chains that link — and the two tenants' identical prompts
//! announce disjoint hashes (a router can never match one tenant's request to the other's blocks).

mod common;

use std::collections::{HashMap, HashSet};
use std::io::{BufRead, BufReader, Read};
use std::process::{Command, Stdio};

use common::{greedy_chat, python, require_python_modules, start, words_message, Server};
use serde_json::Value;

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// A 24-block pool (16-token blocks, f16: 23,040 bytes per token) and a RAM tier of 11
/// objects (368,640 bytes and a header each), smaller than what the prompts demote.
fn config(pub_port: u16, replay_port: u16) -> String {
    format!(
        r#"
server: {{model_name: agentkv-events}}
tenants:
  - {{name: alpha, api_keys: ["ka"]}}
  - {{name: beta, api_keys: ["kb"]}}
kv_cache_config: {{max_size: 8847360, block_size: 16, replacement_policy: lru, quantization: f16}}
tiers: [{{kind: ram, max_size: 4MiB}}]
kv_events: {{endpoint: "tcp://127.0.0.1:{pub_port}", replay_endpoint: "tcp://127.0.0.1:{replay_port}"}}
model: {{threads: 2}}
"#
    )
}

fn chat(server: &Server, key: &str, text: &str) {
    greedy_chat(server, "agentkv-events", key, text, 4);
}

fn hashes(e: &Value) -> Vec<u64> {
    e["hashes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|h| h.as_u64().unwrap())
        .collect()
}

#[test]
fn a_python_subscriber_decodes_the_servers_kv_events_and_tenants_never_share_hashes() {
    require_python_modules(&["zmq", "msgpack"]);
    let (pub_port, replay_port) = (free_port(), free_port());
    let dir = tempfile::tempdir().unwrap();
    let cfg = dir.path().join("agentkv.yaml");
    std::fs::write(&cfg, config(pub_port, replay_port)).unwrap();
    let server = start(&cfg);

    let script = format!(
        "{}/tests/kv_events_subscriber.py",
        env!("CARGO_MANIFEST_DIR")
    );
    let mut sub = Command::new(python())
        .arg(&script)
        .arg(format!("tcp://127.0.0.1:{pub_port}"))
        .arg(format!("tcp://127.0.0.1:{replay_port}"))
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("running the subscriber");
    let mut out = BufReader::new(sub.stdout.take().unwrap());
    let mut line = String::new();
    out.read_line(&mut line).unwrap();
    assert_eq!(line.trim(), "ready", "{line}");

    // The same prompt for both tenants, then alpha's other prompts evict it to the RAM tier.
    chat(&server, "ka", &words_message(0));
    chat(&server, "kb", &words_message(0));
    for i in 1..4 {
        chat(&server, "ka", &words_message(i));
    }
    let mut rest = String::new();
    out.read_to_string(&mut rest).unwrap();
    assert!(sub.wait().unwrap().success(), "subscriber: {rest}");
    let report: Value = serde_json::from_str(rest.trim().lines().last().unwrap())
        .unwrap_or_else(|e| panic!("{e}: {rest}"));
    let events: Vec<&Value> = report["batches"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|b| b.as_array().unwrap())
        .collect();
    assert_eq!(
        events[0]["type"], "cleared",
        "a publisher starts with AllBlocksCleared"
    );
    assert!(report["replayed"].as_u64().unwrap() > 1);

    // Every stored block: hash -> (tokens, media); chains link to blocks stored before.
    let mut blocks: HashMap<u64, Vec<u32>> = HashMap::new();
    let mut media: HashMap<u64, HashSet<String>> = HashMap::new();
    let mut removed_gpu = Vec::new();
    let mut removed_cpu = 0;
    for e in &events {
        match e["type"].as_str().unwrap() {
            "stored" => {
                assert_eq!(e["block_size"], 16);
                let hs = hashes(e);
                if let Some(p) = e["parent"].as_u64() {
                    assert!(blocks.contains_key(&p), "parent {p} never stored: {e}");
                }
                let tokens: Vec<u32> = e["tokens"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .map(|t| t.as_u64().unwrap() as u32)
                    .collect();
                for (h, toks) in hs.iter().zip(tokens.chunks(16)) {
                    let prev = blocks.insert(*h, toks.to_vec());
                    assert!(
                        prev.is_none_or(|p| p == toks),
                        "hash {h} announced with different tokens"
                    );
                    media
                        .entry(*h)
                        .or_default()
                        .insert(e["medium"].as_str().unwrap().to_string());
                }
            }
            "removed" => {
                for h in hashes(e) {
                    assert!(blocks.contains_key(&h), "removed {h} never stored");
                    if e["medium"] == "GPU" {
                        removed_gpu.push(h);
                    }
                    if e["medium"] == "CPU" {
                        assert!(media[&h].contains("CPU"), "{h} left the RAM tier unstored");
                        removed_cpu += 1;
                    }
                }
            }
            other => assert_eq!(other, "cleared"),
        }
    }
    assert!(!removed_gpu.is_empty(), "the small pool evicted blocks");
    assert!(
        removed_gpu
            .iter()
            .any(|h| media[h].contains("CPU") && media[h].contains("GPU")),
        "evicted blocks are announced in the RAM tier under the same hash"
    );
    assert!(
        removed_cpu > 0,
        "the RAM tier's budget evictions are announced (BlockRemoved, CPU)"
    );
    // Tenants: the first prompt's blocks carry the same tokens for alpha and beta but never
    // the same hash.
    let mut by_tokens: HashMap<&[u32], HashSet<u64>> = HashMap::new();
    for (h, toks) in &blocks {
        by_tokens.entry(toks.as_slice()).or_default().insert(*h);
    }
    let shared = by_tokens.values().filter(|hs| hs.len() >= 2).count();
    assert!(
        shared >= 8,
        "alpha's and beta's identical blocks must announce distinct hashes ({shared} found)"
    );
    drop(server);
}
