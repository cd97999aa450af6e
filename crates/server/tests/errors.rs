//! In-process tests of every error class (OpenAI error body, status, `Retry-After`) and of
//! tenant auth and cache isolation.

mod common;

use common::{app, call, chat};
use server::{Limits, ServerSettings, TenantSpec};

fn tenants() -> ServerSettings {
    ServerSettings {
        tenants: vec![
            TenantSpec {
                name: "alpha".into(),
                api_keys: vec!["ka".into()],
                salt: None,
            },
            TenantSpec {
                name: "beta".into(),
                api_keys: vec!["kb".into()],
                salt: Some("s".into()),
            },
        ],
        admin_api_keys: vec!["admin".into()],
        trusted_tenant_header: Some("x-tenant".into()),
        ..ServerSettings::default()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn invalid_requests_get_400_naming_the_field() {
    let (_e, _s, r) = app(ServerSettings::default());
    let e = call(&r, "POST", "/v1/chat/completions", None, "{not json")
        .await
        .error(400);
    assert_eq!(e["type"], "invalid_request_error");
    for (field, value) in [
        ("temperature", serde_json::json!(3.0)),
        ("top_p", serde_json::json!(0.0)),
        ("n", serde_json::json!(0)),
        ("presence_penalty", serde_json::json!(5)),
        ("top_k", serde_json::json!(-2)),
        ("min_p", serde_json::json!(1.5)),
        ("max_tokens", serde_json::json!(0)),
    ] {
        let mut b: serde_json::Value = serde_json::from_str(&chat("hi", 4)).unwrap();
        b[field] = value;
        let e = call(&r, "POST", "/v1/chat/completions", None, &b.to_string())
            .await
            .error(400);
        assert_eq!(e["param"], field, "{e}");
    }
    // Unknown fields are ignored; text parts are read.
    let b = serde_json::json!({"model":"m","max_tokens":2,"frobnicate":1,
        "messages":[{"role":"user","content":[{"type":"text","text":"hi"}]}]});
    assert_eq!(
        call(&r, "POST", "/v1/chat/completions", None, &b.to_string())
            .await
            .status,
        200
    );
    let b = serde_json::json!({"model":"m","prompt":[999999],"max_tokens":2});
    call(&r, "POST", "/v1/completions", None, &b.to_string())
        .await
        .error(400);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn context_and_size_limits() {
    let settings = ServerSettings {
        limits: Limits {
            max_body_bytes: 200_000,
            ..Limits::default()
        },
        ..ServerSettings::default()
    };
    let (_e, _s, r) = app(settings);
    let ctx = common::model().config.context_length;
    let ids: Vec<u32> = vec![42; ctx + 5];
    let b = serde_json::json!({"model":"m","prompt":ids,"max_tokens":2});
    let e = call(&r, "POST", "/v1/completions", None, &b.to_string())
        .await
        .error(400);
    let msg = e["message"].as_str().unwrap();
    assert!(
        msg.contains(&(ctx + 5).to_string()) && msg.contains(&ctx.to_string()),
        "{msg}"
    );
    assert_eq!(e["code"], "context_length_exceeded");
    let b = serde_json::json!({"model":"m","prompt":[42, 43],"max_tokens":ctx});
    let e = call(&r, "POST", "/v1/completions", None, &b.to_string())
        .await
        .error(400);
    assert_eq!(e["code"], "context_length_exceeded");
    let big = format!(r#"{{"model":"m","prompt":"{}"}}"#, "a".repeat(300_000));
    call(&r, "POST", "/v1/completions", None, &big)
        .await
        .error(413);
    call(&r, "GET", "/v1/nothing", None, "").await.error(404);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn overload_gives_429_per_tenant_and_503_overall_with_retry_after() {
    let settings = ServerSettings {
        limits: Limits {
            max_tokens_per_tenant: 1000,
            max_tokens: 500,
            retry_after_secs: 3,
            ..Limits::default()
        },
        ..ServerSettings::default()
    };
    let (_e, _s, r) = app(settings);
    let b =
        |max: u32| serde_json::json!({"model":"m","prompt":"hello","max_tokens":max}).to_string();
    let reply = call(&r, "POST", "/v1/completions", None, &b(2000)).await;
    assert_eq!(reply.error(429)["type"], "rate_limit_error");
    assert_eq!(reply.headers["retry-after"], "3");
    let reply = call(&r, "POST", "/v1/completions", None, &b(700)).await;
    reply.error(503);
    assert_eq!(reply.headers["retry-after"], "3");
    assert_eq!(
        call(&r, "POST", "/v1/completions", None, &b(4))
            .await
            .status,
        200
    );
    let m = call(&r, "GET", "/metrics", None, "").await.body;
    assert!(
        m.contains("agentkv_requests_rejected_total{tenant=\"default\"} 2"),
        "{m}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keys_map_to_tenants_and_tenants_do_not_share_cache() {
    let (_e, _s, r) = app(tenants());
    let body = chat(
        "An agent prompt that is long enough to fill a couple of KV blocks.",
        2,
    );
    let path = "/v1/chat/completions";
    call(&r, "POST", path, None, &body).await.error(401);
    call(&r, "POST", path, Some("wrong"), &body)
        .await
        .error(401);
    call(&r, "GET", "/v1/cache/stats", Some("ka"), "")
        .await
        .error(401);
    let cached = |v: serde_json::Value| {
        v["usage"]["prompt_tokens_details"]["cached_tokens"]
            .as_u64()
            .unwrap()
    };
    assert_eq!(
        cached(call(&r, "POST", path, Some("ka"), &body).await.json()),
        0
    );
    // Another tenant, same prompt: nothing reused, whatever salt it sends.
    let mut salted: serde_json::Value = serde_json::from_str(&body).unwrap();
    salted["cache_salt"] = "".into();
    assert_eq!(
        cached(
            call(&r, "POST", path, Some("kb"), &salted.to_string())
                .await
                .json()
        ),
        0
    );
    // Positive control: the same tenant again reuses its prefix.
    assert!(cached(call(&r, "POST", path, Some("ka"), &body).await.json()) > 0);
    // A request salt narrows sharing within the tenant.
    salted["cache_salt"] = "private".into();
    assert_eq!(
        cached(
            call(&r, "POST", path, Some("ka"), &salted.to_string())
                .await
                .json()
        ),
        0
    );
    let stats = call(&r, "GET", "/v1/cache/stats", Some("admin"), "")
        .await
        .json();
    let names: Vec<&str> = stats["tenants"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["tenant"].as_str().unwrap())
        .collect();
    assert!(
        names.contains(&"alpha") && names.contains(&"beta"),
        "{names:?}"
    );
    let f = call(
        &r,
        "POST",
        "/v1/cache/flush",
        Some("admin"),
        r#"{"tenant":"nobody"}"#,
    )
    .await;
    f.error(404);
    let f = call(
        &r,
        "POST",
        "/v1/cache/flush",
        Some("admin"),
        r#"{"tenant":"alpha"}"#,
    )
    .await
    .json();
    assert!(f["flushed_blocks"].as_u64().unwrap() > 0);
    assert_eq!(
        cached(call(&r, "POST", path, Some("ka"), &body).await.json()),
        0
    );
}
