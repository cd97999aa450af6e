//! Agent sessions over HTTP on the real default model, in a pool small enough that other
//! traffic evicts what nothing retains: a call with `prompt_cache_key` keeps its KV through a
//! flood, usage reports what it newly retained (`cache_creation_input_tokens`), and
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

/// A server over a 32-block engine (512 tokens), two tenants.
fn small_app() -> (Engine, axum::Router) {
    let cfg = EngineConfig {
        num_blocks: 32,
        threads: 2,
        ..EngineConfig::default()
    };
    let engine = Engine::start(EngineCore::new(model(), cfg).expect("engine"));
    let settings = ServerSettings {
        tenants: vec![
            TenantSpec {
                name: "alpha".into(),
                api_keys: vec!["ka".into()],
                salt: None,
            },
            TenantSpec {
                name: "beta".into(),
                api_keys: vec!["kb".into()],
                salt: None,
            },
        ],
        ..ServerSettings::default()
    };
    let state = server::AppState::new(engine.handle(), model().frontend.clone(), settings)
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
    let created = d["cache_creation_input_tokens"].as_u64().unwrap();
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
    assert!(details(&plain).get("cache_creation_input_tokens").is_none());

    let s = call(&r, "GET", "/v1/sessions/agent-1", Some("ka"), "").await;
    assert_eq!(s.status, 200, "{}", s.body);
    let s = s.json();
    assert_eq!(
        (s["object"].as_str(), s["retained_tokens"].as_u64()),
        (Some("session"), Some(created))
    );
    assert_eq!(s["retained_blocks"].as_u64(), Some(created / 16));
    let ttl = s["ttl_left_s"].as_f64().unwrap();
    assert!(ttl > 250.0 && ttl <= 300.0, "{ttl}");
    // Another tenant's key names another session.
    call(&r, "GET", "/v1/sessions/agent-1", Some("kb"), "")
        .await
        .error(404);

    // A flood of other prompts, ~4× the pool.
    for i in 2..20 {
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
    assert_eq!(d["cache_creation_input_tokens"], 0, "nothing new to retain");
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
            serde_json::json!({"cache_control": {"type": "ephemeral", "ttl": "1h"}}),
        )))
        .unwrap();
    let resp = r.clone().oneshot(req).await.unwrap();
    assert_eq!(resp.status(), 200);
    let v: serde_json::Value =
        serde_json::from_slice(&resp.into_body().collect().await.unwrap().to_bytes()).unwrap();
    let created = v["usage"]["prompt_tokens_details"]["cache_creation_input_tokens"]
        .as_u64()
        .unwrap();
    assert!(created > 0);
    let s = call(&r, "GET", "/v1/sessions/tool-loop", Some("ka"), "")
        .await
        .json();
    assert_eq!(s["retained_tokens"].as_u64(), Some(created));
    assert_eq!(s["priority"], 1);
    let ttl = s["ttl_left_s"].as_f64().unwrap();
    assert!(ttl > 3500.0 && ttl <= 3600.0, "{ttl}");

    for (extra, param, code) in [
        (
            serde_json::json!({"cache_control": {"type": "ephemeral", "ttl": "2h"}}),
            "cache_control.ttl",
            None,
        ),
        (
            serde_json::json!({"prompt_cache_retention": "forever"}),
            "prompt_cache_retention",
            None,
        ),
        (serde_json::json!({"session_id": ""}), "session_id", None),
        (
            serde_json::json!({"messages": [{"role": "user", "content": "hi",
                "cache_control": {"type": "ephemeral"}}]}),
            "messages[0].cache_control",
            Some("unsupported_parameter"),
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
    assert_eq!(d["cache_creation_input_tokens"], 0, "{last}");
    assert!(
        d["cached_tokens"].as_u64().unwrap() >= created - 16,
        "{last}"
    );

    // The Responses API takes the same fields.
    let resp = serde_json::json!({"model": "agentkv", "input": task(6), "max_output_tokens": 4,
        "temperature": 0, "store": false, "prompt_cache_key": "resp-1"});
    let reply = call(&r, "POST", "/v1/responses", Some("ka"), &resp.to_string()).await;
    assert_eq!(reply.status, 200, "{}", reply.body);
    let created = reply.json()["usage"]["input_tokens_details"]["cache_creation_input_tokens"]
        .as_u64()
        .unwrap();
    assert!(created > 0);
    let s = call(&r, "GET", "/v1/sessions/resp-1", Some("ka"), "")
        .await
        .json();
    assert_eq!(s["retained_tokens"].as_u64(), Some(created));
}
