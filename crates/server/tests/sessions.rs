//! Agent sessions over HTTP on the real default model, in a pool small enough that other
//! traffic evicts what nothing retains: a call with `prompt_cache_key` keeps its KV through a
//! flood, usage reports what it newly retained (`cache_write_tokens`), and
//! `GET`/`DELETE /v1/sessions/{id}` see and release it, per tenant.

mod common;

use axum::body::Body;
use axum::http::Request;
use engine::{Engine, EngineConfig, EngineCore};
use http_body_util::BodyExt;
use server::settings::TenantSpec;
use server::ServerSettings;
use tower::ServiceExt;

use common::{call, model};

/// A server over a 32-block engine (512 tokens), two tenants; requests that name nothing are
/// plain LRU (no inferred conversations), the baseline the named mechanisms are measured
/// against.
fn small_app() -> (Engine, axum::Router) {
    app_with(Default::default(), false)
}

/// As [`small_app`], with tenants' shares of the pool (alpha is tenant 1, beta tenant 2).
fn app_with_shares(
    tenant_shares: std::collections::BTreeMap<cache::TenantId, engine::TenantShare>,
) -> (Engine, axum::Router) {
    app_with(tenant_shares, false)
}

/// As [`small_app`], with tenants' shares and inferred conversations on (the default) or off.
fn app_with(
    tenant_shares: std::collections::BTreeMap<cache::TenantId, engine::TenantShare>,
    inferred: bool,
) -> (Engine, axum::Router) {
    let mut cfg = EngineConfig {
        num_blocks: 32,
        threads: 2,
        tenant_shares,
        ..EngineConfig::default()
    };
    if !inferred {
        cfg.inferred_conversations = None;
    }
    let engine = Engine::start(EngineCore::new(model(), cfg).expect("engine"));
    let settings = ServerSettings {
        tenants: vec![
            TenantSpec {
                name: "alpha".into(),
                api_keys: vec!["ka".into()],
                salt: None,
                priority: 0,
            },
            TenantSpec {
                name: "beta".into(),
                api_keys: vec!["kb".into()],
                salt: None,
                priority: 0,
            },
        ],
        ..ServerSettings::default()
    };
    let state = server::AppState::new(engine.handle(), model().frontend().clone(), settings)
        .expect("settings");
    (engine, server::router(state))
}

/// A ~100-token task prompt, distinct per `seed`.
fn task(seed: usize) -> String {
    let words = [
        "alpha", "bravo", "charlie", "delta", "echo", "foxtrot", "golf", "hotel",
    ];
    let mut s = format!("Task {seed}: summarise these notes.");
    for i in 0..60 {
        s.push(' ');
        s.push_str(words[(i * 7 + seed * 3) % words.len()]);
        s.push_str(&((i * 13 + seed * 31) % 97).to_string());
    }
    s
}

fn body(content: &str, extra: serde_json::Value) -> String {
    let mut b = serde_json::json!({
        "model": "agentkv",
        "messages": [{"role": "user", "content": content}],
        "max_tokens": 4,
        "temperature": 0
    });
    for (k, v) in extra.as_object().unwrap() {
        b[k] = v.clone();
    }
    b.to_string()
}

fn details(reply: &common::Reply) -> serde_json::Value {
    assert_eq!(reply.status, 200, "{}", reply.body);
    reply.json()["usage"]["prompt_tokens_details"].clone()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_keyed_session_survives_other_traffic_and_is_released_by_delete() {
    let (_engine, r) = small_app();
    let chat = "/v1/chat/completions";
    let keyed = body(&task(0), serde_json::json!({"prompt_cache_key": "agent-1"}));
    let first = call(&r, "POST", chat, Some("ka"), &keyed).await;
    let d = details(&first);
    let prompt_tokens = first.json()["usage"]["prompt_tokens"].as_u64().unwrap();
    let created = d["cache_write_tokens"].as_u64().unwrap();
    assert_eq!(d["cached_tokens"], 0);
    assert!(prompt_tokens > 80, "{prompt_tokens}");
    // Whole blocks of the prompt and the written output (3 of the 4 generated tokens).
    assert_eq!(created, (prompt_tokens + 3) / 16 * 16);
    // A call that asks for no retention reports none.
    let plain = call(
        &r,
        "POST",
        chat,
        Some("ka"),
        &body(&task(1), serde_json::json!({})),
    )
    .await;
    assert!(details(&plain).get("cache_write_tokens").is_none());

    let s = call(&r, "GET", "/v1/sessions/agent-1", Some("ka"), "").await;
    assert_eq!(s.status, 200, "{}", s.body);
    let s = s.json();
    assert_eq!(
        (s["object"].as_str(), s["retained_tokens"].as_u64()),
        (Some("session"), Some(created))
    );
    assert_eq!(s["retained_blocks"].as_u64(), Some(created / 16));
    assert_eq!(
        s["blocks_by_tier"],
        serde_json::json!({"active": created / 16, "ram": 0, "disk": 0, "redis": 0, "none": 0})
    );
    let ttl = s["ttl_left_s"].as_f64().unwrap();
    assert!(ttl > 250.0 && ttl <= 300.0, "{ttl}");
    // Another tenant's key names another session.
    call(&r, "GET", "/v1/sessions/agent-1", Some("kb"), "")
        .await
        .error(404);

    // A flood of other prompts, ~2× the pool (9 × ~130 tokens over 32 blocks of 16).
    for i in 2..11 {
        let reply = call(
            &r,
            "POST",
            chat,
            Some("ka"),
            &body(&task(i), serde_json::json!({})),
        )
        .await;
        assert_eq!(reply.status, 200, "{}", reply.body);
    }
    let again = call(&r, "POST", chat, Some("ka"), &keyed).await;
    let d = details(&again);
    assert_eq!(
        d["cached_tokens"].as_u64(),
        Some((prompt_tokens - 1) / 16 * 16),
        "the retained prefix is still cached"
    );
    assert_eq!(d["cache_write_tokens"], 0, "nothing new to retain");
    let evicted = call(
        &r,
        "POST",
        chat,
        Some("ka"),
        &body(&task(1), serde_json::json!({})),
    )
    .await;
    // Unretained, it keeps only what every prompt shares (the chat template's first block), as
    // much as a prompt never seen before.
    let fresh = call(
        &r,
        "POST",
        chat,
        Some("ka"),
        &body(&task(99), serde_json::json!({})),
    )
    .await;
    let shared = details(&fresh)["cached_tokens"].as_u64().unwrap();
    assert!(shared < 32, "{shared}");
    assert_eq!(
        details(&evicted)["cached_tokens"].as_u64(),
        Some(shared),
        "the unretained prompt was evicted"
    );

    // Released by DELETE; then gone, and a second DELETE is a 404.
    call(&r, "DELETE", "/v1/sessions/agent-1", Some("kb"), "")
        .await
        .error(404);
    let del = call(&r, "DELETE", "/v1/sessions/agent-1", Some("ka"), "").await;
    assert_eq!(del.status, 200, "{}", del.body);
    assert_eq!(del.json()["released_tokens"].as_u64(), Some(created));
    assert_eq!(del.json()["deleted"], true);
    call(&r, "GET", "/v1/sessions/agent-1", Some("ka"), "")
        .await
        .error(404);
    call(&r, "DELETE", "/v1/sessions/agent-1", Some("ka"), "")
        .await
        .error(404);
}

/// The outside probe's case: one tenant's burst evicted another tenant's warm prefix. With a
/// reserved share (8 blocks), alpha's prefix survives beta's flood (two pools' worth); without one it is
/// evicted (positive control).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reserved_share_keeps_a_tenants_prefix_through_another_tenants_flood() {
    async fn alpha_cached_after_beta_flood(r: &axum::Router) -> (u64, u64) {
        let chat = "/v1/chat/completions";
        let warm = body(&task(0), serde_json::json!({}));
        let first = call(r, "POST", chat, Some("ka"), &warm).await;
        let prompt_tokens = first.json()["usage"]["prompt_tokens"].as_u64().unwrap();
        for i in 2..11 {
            let reply = call(
                r,
                "POST",
                chat,
                Some("kb"),
                &body(&task(i), serde_json::json!({})),
            )
            .await;
            assert_eq!(reply.status, 200, "{}", reply.body);
        }
        let again = call(r, "POST", chat, Some("ka"), &warm).await;
        (
            details(&again)["cached_tokens"].as_u64().unwrap(),
            prompt_tokens,
        )
    }
    let mut shares = std::collections::BTreeMap::new();
    shares.insert(
        cache::TenantId(1),
        engine::TenantShare {
            reserved_blocks: Some(8),
            ..Default::default()
        },
    );
    let (_engine, r) = app_with_shares(shares);
    let (cached, prompt_tokens) = alpha_cached_after_beta_flood(&r).await;
    // The prompt spans more than the 8 reserved blocks: exactly the reserved 8 (from the root)
    // stay; beta's flood took the rest.
    assert!(prompt_tokens > 8 * 16, "{prompt_tokens}");
    assert_eq!(cached, 8 * 16, "alpha's reserved prefix stayed");
    let metrics = call(&r, "GET", "/metrics", None, "").await;
    assert!(
        metrics
            .body
            .contains("agentkv_kv_reserved_evictions_total 0"),
        "no reserved block had to go"
    );

    let (_engine, r) = small_app();
    let (cached, _) = alpha_cached_after_beta_flood(&r).await;
    assert!(
        cached < 32,
        "without a reservation the flood evicts it: {cached}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn header_and_cache_control_name_and_retain_sessions_and_bad_values_are_400() {
    let (_engine, r) = small_app();
    // The x-session-id header names the session; top-level cache_control sets its TTL.
    let req = Request::builder()
        .method("POST")
        .uri("/v1/chat/completions")
        .header("content-type", "application/json")
        .header("authorization", "Bearer ka")
        .header("x-session-id", "tool-loop")
        .body(Body::from(body(
            &task(5),
            serde_json::json!({"cache_control": {"type": "ephemeral", "ttl": "1h"},
                "priority": 3}),
        )))
        .unwrap();
    let resp = r.clone().oneshot(req).await.unwrap();
    assert_eq!(resp.status(), 200);
    let v: serde_json::Value =
        serde_json::from_slice(&resp.into_body().collect().await.unwrap().to_bytes()).unwrap();
    let created = v["usage"]["prompt_tokens_details"]["cache_write_tokens"]
        .as_u64()
        .unwrap();
    assert!(created > 0);
    let s = call(&r, "GET", "/v1/sessions/tool-loop", Some("ka"), "")
        .await
        .json();
    assert_eq!(s["retained_tokens"].as_u64(), Some(created));
    // A tenant's request may make itself less important (never more: issue #44, N5).
    assert_eq!(
        s["priority"], 3,
        "vLLM's convention: the request's own is added"
    );
    let ttl = s["ttl_left_s"].as_f64().unwrap();
    assert!(ttl > 3500.0 && ttl <= 3600.0, "{ttl}");

    for (extra, param, code) in [
        (
            serde_json::json!({"cache_control": {"type": "ephemeral", "ttl": "2h"}}),
            "cache_control.ttl",
            Some("invalid_value"),
        ),
        (
            serde_json::json!({"prompt_cache_retention": "forever"}),
            "prompt_cache_retention",
            Some("invalid_value"),
        ),
        (
            serde_json::json!({"session_id": ""}),
            "session_id",
            Some("invalid_value"),
        ),
        (
            serde_json::json!({"priority": 64}),
            "priority",
            Some("invalid_value"),
        ),
        (
            serde_json::json!({"priority": "high"}),
            "priority",
            Some("invalid_value"),
        ),
        (
            serde_json::json!({"messages": [{"role": "user", "content": "hi",
                "cache_control": {"type": "ephemeral", "ttl": "2h"}}]}),
            "messages[0].cache_control.ttl",
            Some("invalid_value"),
        ),
    ] {
        let reply = call(
            &r,
            "POST",
            "/v1/chat/completions",
            Some("ka"),
            &body("hi", extra),
        )
        .await;
        let e = reply.error(400);
        assert_eq!(e["param"], param, "{}", reply.body);
        assert_eq!(e["code"].as_str(), code, "{}", reply.body);
    }
    // A stream's final usage chunk reports it too: the same prompt and session add nothing.
    let mut streamed: serde_json::Value = serde_json::from_str(&body(
        &task(5),
        serde_json::json!({"session_id": "tool-loop", "stream": true,
            "stream_options": {"include_usage": true}}),
    ))
    .unwrap();
    streamed["cache_control"] = serde_json::json!({"type": "ephemeral", "ttl": "1h"});
    let reply = call(
        &r,
        "POST",
        "/v1/chat/completions",
        Some("ka"),
        &streamed.to_string(),
    )
    .await;
    assert_eq!(reply.status, 200, "{}", reply.body);
    let events: Vec<&str> = reply
        .body
        .lines()
        .filter_map(|l| l.strip_prefix("data: "))
        .collect();
    assert_eq!(events.last(), Some(&"[DONE]"));
    let last: serde_json::Value = serde_json::from_str(events[events.len() - 2]).unwrap();
    let d = &last["usage"]["prompt_tokens_details"];
    assert_eq!(d["cache_write_tokens"], 0, "{last}");
    assert!(
        d["cached_tokens"].as_u64().unwrap() >= created - 16,
        "{last}"
    );

    // The Responses API takes the same fields.
    let resp = serde_json::json!({"model": "agentkv", "input": task(6), "max_output_tokens": 4,
        "temperature": 0, "store": false, "prompt_cache_key": "resp-1"});
    let reply = call(&r, "POST", "/v1/responses", Some("ka"), &resp.to_string()).await;
    assert_eq!(reply.status, 200, "{}", reply.body);
    let created = reply.json()["usage"]["input_tokens_details"]["cache_write_tokens"]
        .as_u64()
        .unwrap();
    assert!(created > 0);
    let s = call(&r, "GET", "/v1/sessions/resp-1", Some("ka"), "")
        .await
        .json();
    assert_eq!(s["retained_tokens"].as_u64(), Some(created));
}

/// A `cache_control` breakpoint on the system message retains the prefix up to it (not the
/// varying user turn), reports it as `cache_write_tokens`, and keeps it through a flood
/// that evicts the same prefix when unmarked; a breakpoint on a tool too; more than four
/// breakpoints are a 400.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn message_and_tool_breakpoints_retain_their_prefix_through_a_flood() {
    let chat = "/v1/chat/completions";
    let ask = |system_cc: bool, user: &str| {
        let mut system = serde_json::json!({"role": "system", "content": task(0)});
        if system_cc {
            system["cache_control"] = serde_json::json!({"type": "ephemeral", "ttl": "1h"});
        }
        serde_json::json!({
            "model": "agentkv", "max_tokens": 2, "temperature": 0,
            "messages": [system, {"role": "user", "content": user}]
        })
        .to_string()
    };
    let flood = |r: axum::Router| async move {
        for i in 2..11 {
            let reply = call(
                &r,
                "POST",
                chat,
                Some("ka"),
                &body(&task(i), serde_json::json!({})),
            )
            .await;
            assert_eq!(reply.status, 200, "{}", reply.body);
        }
    };
    let (_engine, r) = small_app();
    let first = call(&r, "POST", chat, Some("ka"), &ask(true, "First question?")).await;
    let created = details(&first)["cache_write_tokens"].as_u64().unwrap();
    let prompt_tokens = first.json()["usage"]["prompt_tokens"].as_u64().unwrap();
    // The system turn (~240 tokens) in whole blocks; the user turn is not retained.
    assert!(created >= 192 && created.is_multiple_of(16), "{created}");
    assert!(
        created + 16 <= prompt_tokens,
        "{created} of {prompt_tokens}"
    );
    flood(r.clone()).await;
    let second = call(
        &r,
        "POST",
        chat,
        Some("ka"),
        &ask(true, "Another question?"),
    )
    .await;
    let d = details(&second);
    assert_eq!(
        d["cached_tokens"].as_u64(),
        Some(created),
        "the marked prefix stayed"
    );
    assert_eq!(d["cache_write_tokens"], 0, "refreshed, nothing new");

    // Positive control: unmarked, the flood evicts the same prefix.
    let (_engine, r) = small_app();
    call(&r, "POST", chat, Some("ka"), &ask(false, "First question?")).await;
    flood(r.clone()).await;
    let unmarked = call(
        &r,
        "POST",
        chat,
        Some("ka"),
        &ask(false, "Another question?"),
    )
    .await;
    assert!(details(&unmarked)["cached_tokens"].as_u64().unwrap() < 32);

    // A breakpoint on the (only) tool retains the prefix up to the tool definitions.
    let tool_call = |cc: bool, user: &str| {
        let mut tool = serde_json::json!({"type": "function", "function": {
            "name": "lookup", "description": task(5),
            "parameters": {"type": "object", "properties": {"q": {"type": "string"}}}}});
        if cc {
            tool["cache_control"] = serde_json::json!({"type": "ephemeral"});
        }
        serde_json::json!({"model": "agentkv", "max_tokens": 2, "temperature": 0,
            "tools": [tool], "messages": [{"role": "user", "content": user}]})
        .to_string()
    };
    let (_engine, r) = small_app();
    let t1 = call(
        &r,
        "POST",
        chat,
        Some("ka"),
        &tool_call(true, "Look up alpha."),
    )
    .await;
    let created = details(&t1)["cache_write_tokens"].as_u64().unwrap();
    assert!(created >= 128, "the tool definitions: {created}");
    flood(r.clone()).await;
    let t2 = call(
        &r,
        "POST",
        chat,
        Some("ka"),
        &tool_call(true, "Look up bravo, please."),
    )
    .await;
    assert_eq!(details(&t2)["cached_tokens"].as_u64(), Some(created));

    // At most four breakpoints, the top-level one included.
    let cc = serde_json::json!({"type": "ephemeral"});
    let messages: Vec<_> = (0..4)
        .map(|i| serde_json::json!({"role": "user", "content": format!("m{i}"), "cache_control": cc}))
        .collect();
    let five = serde_json::json!({"model": "agentkv", "max_tokens": 1, "messages": messages,
        "cache_control": cc});
    let e = call(&r, "POST", chat, Some("ka"), &five.to_string())
        .await
        .error(400);
    assert_eq!(e["param"], "messages[3].cache_control");
}

/// A reply that ends in tool calls keeps its blocks for the agent's next call (a tool pause,
/// TTL from the engine's cost model) without any session field: the next call, which appends
/// the tool result, still finds the whole history after a flood. The same flow with
/// `tool_choice: "none"` (a plain answer) is evicted without inferred conversations (positive
/// control) and kept with them (the default): its next turn continues its prompt and reply.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reply_with_tool_calls_keeps_the_history_through_the_tool_pause() {
    let chat = "/v1/chat/completions";
    let tools = serde_json::json!([{"type": "function", "function": {"name": "lookup",
        "parameters": {"type": "object",
                       "properties": {"q": {"type": "string", "enum": ["alpha", "bravo"]}},
                       "required": ["q"], "additionalProperties": false}}}]);
    let first = |choice: &str| {
        serde_json::json!({"model": "agentkv", "max_tokens": 96, "temperature": 0,
            "tools": tools, "tool_choice": choice, "parallel_tool_calls": false,
            "messages": [{"role": "user", "content": task(0)}]})
    };
    let flood = |r: axum::Router| async move {
        for i in 2..11 {
            let reply = call(
                &r,
                "POST",
                chat,
                Some("kb"),
                &body(&task(i), serde_json::json!({})),
            )
            .await;
            assert_eq!(reply.status, 200, "{}", reply.body);
        }
    };
    let run = |choice: &'static str, inferred: bool| async move {
        let (_engine, r) = app_with(Default::default(), inferred);
        let reply = call(&r, "POST", chat, Some("ka"), &first(choice).to_string()).await;
        assert_eq!(reply.status, 200, "{}", reply.body);
        let v = reply.json();
        let prompt_tokens = v["usage"]["prompt_tokens"].as_u64().unwrap();
        let message = v["choices"][0]["message"].clone();
        flood(r.clone()).await;
        // The agent's next call: the history, the assistant turn, the tool's result.
        let mut next = first(choice);
        let history = next["messages"].as_array_mut().unwrap();
        history.push(message.clone());
        if let Some(calls) = message["tool_calls"].as_array() {
            history.push(
                serde_json::json!({"role": "tool", "tool_call_id": calls[0]["id"],
                "content": "alpha 42"}),
            );
        } else {
            history.push(serde_json::json!({"role": "user", "content": "And then?"}));
        }
        let again = call(&r, "POST", chat, Some("ka"), &next.to_string()).await;
        (
            v["choices"][0]["finish_reason"]
                .as_str()
                .unwrap()
                .to_string(),
            details(&again)["cached_tokens"].as_u64().unwrap(),
            prompt_tokens,
        )
    };
    let (finish, cached, prompt_tokens) = run("required", false).await;
    assert_eq!(finish, "tool_calls");
    // Retention is capped at half the pool (16 of 32 blocks here).
    assert!(
        cached >= ((prompt_tokens - 1) / 16 * 16).min(16 * 16),
        "the paused history stayed: {cached} of {prompt_tokens}"
    );
    let (finish, cached, _) = run("none", false).await;
    assert_ne!(finish, "tool_calls", "control: a plain answer");
    assert!(
        cached < 32,
        "without a tool pause the flood evicts it: {cached}"
    );
    // The same plain answer, its conversation inferred: the next turn finds its history.
    let (finish, cached, prompt_tokens) = run("none", true).await;
    assert_ne!(finish, "tool_calls");
    assert!(
        cached >= ((prompt_tokens - 1) / 16 * 16).min(16 * 16),
        "the inferred conversation kept its history: {cached} of {prompt_tokens}"
    );
}
