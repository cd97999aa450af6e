//! In-process tests (tower `oneshot`, no socket) of every endpoint on the real default model.

mod common;

use common::{app, call, chat};
use server::ServerSettings;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chat_reports_cached_tokens_equal_to_the_engines_counter() {
    let (_e, _s, r) = app(ServerSettings::default());
    let long =
        "Summarise the plan: read the file, find the bug, write a fix, run the tests, report.";
    let a = call(&r, "POST", "/v1/chat/completions", None, &chat(long, 4)).await;
    assert_eq!(a.status, 200, "{}", a.body);
    let a = a.json();
    assert_eq!(a["object"], "chat.completion");
    assert_eq!(a["choices"][0]["message"]["role"], "assistant");
    assert_eq!(a["usage"]["prompt_tokens_details"]["cached_tokens"], 0);
    let before = call(&r, "GET", "/v1/cache/stats", None, "").await.json();
    let b = call(&r, "POST", "/v1/chat/completions", None, &chat(long, 4))
        .await
        .json();
    let after = call(&r, "GET", "/v1/cache/stats", None, "").await.json();
    let cached = b["usage"]["prompt_tokens_details"]["cached_tokens"]
        .as_u64()
        .unwrap();
    let prompt = b["usage"]["prompt_tokens"].as_u64().unwrap();
    assert!(cached > 0 && cached < prompt, "cached {cached} of {prompt}");
    let hit = |v: &serde_json::Value| v["hit_tokens"].as_u64().unwrap();
    assert_eq!(hit(&after) - hit(&before), cached);
    // Greedy: the same prompt gives the same answer whether cached or not.
    assert_eq!(a["choices"][0]["message"], b["choices"][0]["message"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chat_stream_has_role_content_finish_usage_and_done() {
    let (_e, _s, r) = app(ServerSettings::default());
    let mut body: serde_json::Value = serde_json::from_str(&chat("Count to three.", 6)).unwrap();
    body["stream"] = true.into();
    body["stream_options"] = serde_json::json!({"include_usage": true});
    let reply = call(&r, "POST", "/v1/chat/completions", None, &body.to_string()).await;
    assert_eq!(reply.status, 200);
    assert!(reply.headers["content-type"]
        .to_str()
        .unwrap()
        .starts_with("text/event-stream"));
    let events: Vec<&str> = reply
        .body
        .lines()
        .filter_map(|l| l.strip_prefix("data: "))
        .collect();
    assert_eq!(*events.last().unwrap(), "[DONE]");
    let chunks: Vec<serde_json::Value> = events[..events.len() - 1]
        .iter()
        .map(|e| serde_json::from_str(e).unwrap())
        .collect();
    assert_eq!(chunks[0]["choices"][0]["delta"]["role"], "assistant");
    let finish = &chunks[chunks.len() - 2]["choices"][0];
    assert_eq!(finish["finish_reason"], "length");
    let usage = &chunks.last().unwrap()["usage"];
    assert_eq!(usage["completion_tokens"], 6);
    assert!(usage["prompt_tokens_details"]["cached_tokens"].is_u64());
    let text: String = chunks
        .iter()
        .filter_map(|c| c["choices"][0]["delta"]["content"].as_str())
        .collect();
    body["stream"] = false.into();
    let whole = call(&r, "POST", "/v1/chat/completions", None, &body.to_string())
        .await
        .json();
    assert_eq!(whole["choices"][0]["message"]["content"], text.as_str());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn completions_with_token_prompt_stop_n_and_logprobs() {
    let (_e, _s, r) = app(ServerSettings::default());
    let tok = call(
        &r,
        "POST",
        "/tokenize",
        None,
        r#"{"prompt":"The capital of France is"}"#,
    )
    .await
    .json();
    let ids = tok["tokens"].clone();
    assert_eq!(
        tok["count"].as_u64().unwrap() as usize,
        ids.as_array().unwrap().len()
    );
    let back = call(
        &r,
        "POST",
        "/detokenize",
        None,
        &serde_json::json!({"tokens": ids}).to_string(),
    )
    .await
    .json();
    assert_eq!(back["prompt"], "The capital of France is");
    let body = serde_json::json!({"model":"agentkv","prompt":ids,"max_tokens":8,"temperature":0,
        "logprobs":3,"n":2,"stop":"."});
    let v = call(&r, "POST", "/v1/completions", None, &body.to_string()).await;
    assert_eq!(v.status, 200, "{}", v.body);
    let v = v.json();
    assert_eq!(v["choices"].as_array().unwrap().len(), 2);
    for c in v["choices"].as_array().unwrap() {
        assert!(!c["text"].as_str().unwrap().contains('.'), "{c}");
        let lp = &c["logprobs"];
        assert_eq!(lp["top_logprobs"][0].as_object().unwrap().len(), 3);
        assert!(lp["token_logprobs"][0].as_f64().unwrap() <= 0.0);
    }
    assert_eq!(
        v["choices"][0]["text"], v["choices"][1]["text"],
        "greedy choices agree"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn models_health_metrics_and_flush() {
    let (_e, _s, r) = app(ServerSettings::default());
    let m = call(&r, "GET", "/v1/models", None, "").await.json();
    assert_eq!(m["data"][0]["id"], "agentkv");
    assert_eq!(call(&r, "GET", "/health", None, "").await.body, "ok");
    call(
        &r,
        "POST",
        "/v1/chat/completions",
        None,
        &chat("Hello there, how are you today?", 2),
    )
    .await;
    let metrics = call(&r, "GET", "/metrics", None, "").await.body;
    for name in [
        "agentkv_time_to_first_token_seconds_bucket",
        "agentkv_inter_token_latency_seconds_count",
        "agentkv_e2e_request_latency_seconds_sum",
        "agentkv_queue_time_seconds_count 1",
        "agentkv_prompt_tokens_total{tenant=\"default\"}",
        "agentkv_generation_tokens_total{tenant=\"default\"} 2",
        "agentkv_prefix_cache_lookups_total 1",
        "agentkv_tenant_prefix_cache_miss_tokens_total{tenant=\"default\"}",
        "agentkv_kv_blocks{state=\"free\"}",
        "agentkv_kv_fragmentation_ratio",
        "agentkv_kv_bytes_per_token{codec=\"f16\"} 23040",
        "agentkv_kv_evictions_total{cause=\"capacity\"}",
        "agentkv_preemptions_total",
        "agentkv_requests_running 0",
        "agentkv_requests_waiting 0",
    ] {
        assert!(metrics.contains(name), "missing {name} in\n{metrics}");
    }
    let stats = call(&r, "GET", "/v1/cache/stats", None, "").await.json();
    assert!(stats["blocks"]["cached"].as_u64().unwrap() > 0);
    let f = call(&r, "POST", "/v1/cache/flush", None, "").await.json();
    assert_eq!(f["flushed_blocks"], stats["blocks"]["cached"]);
    let stats = call(&r, "GET", "/v1/cache/stats", None, "").await.json();
    assert_eq!(stats["blocks"]["cached"], 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn grafana_dashboard_plots_only_exported_metrics() {
    let (_e, _s, r) = app(ServerSettings::default());
    call(&r, "POST", "/v1/chat/completions", None, &chat("Hi", 2)).await;
    let metrics = call(&r, "GET", "/metrics", None, "").await.body;
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../deploy/grafana-dashboard.json"
    );
    let dash = std::fs::read_to_string(path).unwrap();
    let mut names = 0;
    for part in dash.split("agentkv_").skip(1) {
        let name: String = part
            .chars()
            .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
            .collect();
        let base = name.strip_suffix("_bucket").unwrap_or(&name);
        assert!(
            metrics.contains(&format!("# TYPE agentkv_{base} ")),
            "dashboard uses agentkv_{name}, not exported"
        );
        names += 1;
    }
    assert!(names > 20, "{names}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn usage_says_where_and_why_the_cached_prefix_ended() {
    let (_e, _s, r) = app(ServerSettings::default());
    let with_time = |time: &str| {
        serde_json::json!({
            "model": "agentkv",
            "max_tokens": 2,
            "temperature": 0,
            "messages": [
                {"role": "system", "content": format!(
                    "You are a coding agent working in a large repository. Current time: {time}. \
                     Read files before editing them, run the tests after every change, and \
                     report what you changed and why in one short paragraph.")},
                {"role": "user", "content": "Fix the failing test in parser.rs."},
            ],
        })
    };
    let miss = |v: &serde_json::Value| v["usage"]["prompt_tokens_details"]["cache_miss"].clone();
    let first = call(
        &r,
        "POST",
        "/v1/chat/completions",
        None,
        &with_time("10:00:01").to_string(),
    )
    .await
    .json();
    assert_eq!(
        miss(&first),
        serde_json::json!({"reason": "uncached", "at_token": 0}),
        "a cold cache"
    );
    // Same agent, next call: only the timestamp in the system prompt changed.
    let second = call(
        &r,
        "POST",
        "/v1/chat/completions",
        None,
        &with_time("10:00:02").to_string(),
    )
    .await
    .json();
    let m = common::model();
    let ids = |time: &str| {
        let msgs: Vec<frontend::chat::ChatMessage> = with_time(time)["messages"]
            .as_array()
            .unwrap()
            .iter()
            .map(|x| {
                frontend::chat::ChatMessage::new(
                    x["role"].as_str().unwrap(),
                    x["content"].as_str().unwrap(),
                )
            })
            .collect();
        let text = m
            .frontend()
            .chat_template
            .as_ref()
            .unwrap()
            .render(&msgs, None, true)
            .unwrap();
        m.tokenizer().encode(&text, false, true).unwrap()
    };
    let (a, b) = (ids("10:00:01"), ids("10:00:02"));
    let changed_at = a.iter().zip(&b).take_while(|(x, y)| x == y).count();
    assert!(
        changed_at > 16,
        "the change is past the first block ({changed_at})"
    );
    assert_eq!(
        miss(&second),
        serde_json::json!({"reason": "diverged", "at_token": changed_at}),
        "the exact token where the prompt changed"
    );
    assert_eq!(
        second["usage"]["prompt_tokens_details"]["cached_tokens"],
        changed_at / 16 * 16,
        "whole blocks before the change were reused"
    );
    // The same prompt again: every full block hits, nothing to explain.
    let third = call(
        &r,
        "POST",
        "/v1/chat/completions",
        None,
        &with_time("10:00:02").to_string(),
    )
    .await
    .json();
    assert!(miss(&third).is_null(), "{third}");
    let metrics = call(&r, "GET", "/metrics", None, "").await.body;
    for line in [
        "agentkv_prefix_cache_misses_total{reason=\"diverged\"} 1",
        "agentkv_prefix_cache_misses_total{reason=\"uncached\"} 1",
        "agentkv_prefix_cache_misses_total{reason=\"evicted\"} 0",
    ] {
        assert!(metrics.contains(line), "{line} missing");
    }
}
