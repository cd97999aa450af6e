//! `bench replay` of a Mooncake trace against the real `agentkv serve` (issue #49): the first
//! requests of the committed sample of Mooncake's conversation trace, one at a time, as token-id
//! completions; what the server reports as cached equals what `cache-sim`'s simulator computes
//! for the same prompts and pool — exactly for plain LRU, closely for the default policy
//! (inferred conversations, reuse-aware LRU, the duel), whose retention times are wall-clock
//! in the server and trace-clock in the simulator.

mod common;

use std::io::Write;
use std::process::Command;

const SAMPLE: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/../cache/tests/data/mooncake_conversation_head400.jsonl"
);

/// (live cached tokens, simulated cached tokens, prompt tokens, inferred turns on the server).
fn replay(extra_config: &str, sim_plain_lru: bool) -> (u64, u64, u64, Option<u64>) {
    let dir = tempfile::tempdir().unwrap();
    let cfg = dir.path().join("agentkv.yaml");
    // 300 blocks of 16 tokens (f16 SmolLM2: 368,640 bytes each).
    let yaml = format!(
        "server: {{model_name: replayed}}\nmodel: {{threads: 2}}\n\
         kv_cache_config: {{max_size: 110592000{extra_config}}}\n"
    );
    std::fs::File::create(&cfg)
        .unwrap()
        .write_all(yaml.as_bytes())
        .unwrap();
    let server = common::start(&cfg);
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_agentkv"));
    cmd.args(["bench", "replay", SAMPLE, "--url"])
        .arg(format!("http://{}", server.addr))
        .args([
            "--model",
            "replayed",
            "--time-scale",
            "0",
            "--max-in-flight",
            "1",
            "--max-requests",
            "60",
            "--capacity-blocks",
            "300",
        ]);
    if sim_plain_lru {
        cmd.arg("--sim-plain-lru");
    }
    let out = cmd.output().expect("bench replay");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let r: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(r["requests"], 60, "{r}");
    assert_eq!(r["errors"], 0, "{r}");
    let turns = common::metric_sum(&server, "", "agentkv_inferred_turns_total");
    (
        r["cached_tokens"].as_u64().unwrap(),
        r["sim"]["hit_tokens"].as_u64().unwrap(),
        r["prompt_tokens"].as_u64().unwrap(),
        turns,
    )
}

#[test]
fn the_simulator_predicts_the_servers_prefix_hits() {
    let (live, sim, prompt, turns) = replay(
        ", replacement_policy: lru, infer_conversations: false",
        true,
    );
    assert!(prompt > 20_000, "{prompt}");
    assert!(
        live > 0,
        "the shared first block and continued conversations hit"
    );
    assert_eq!(live, sim, "plain LRU, one request at a time: exactly");
    assert_eq!(turns, Some(0), "no conversations inferred when off");

    let (live, sim, _, turns) = replay("", false);
    assert_eq!(turns, Some(60), "every unnamed request placed");
    let gap = live.abs_diff(sim);
    assert!(
        gap * 10 <= sim.max(live) + 640,
        "default policy: live {live} vs simulated {sim}"
    );
}
