//! In-process tests of every error class (OpenAI error body, status, `Retry-After`) and of
//! tenant auth and cache isolation.

mod common;

use common::{app, call, chat};
use server::{Limits, ServerSettings, TenantSpec, UnknownFields};

fn tenants() -> ServerSettings {
    ServerSettings {
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
                salt: Some("s".into()),
                priority: 0,
            },
        ],
        admin_api_keys: vec!["admin".into()],
        trusted_tenant_header: Some("x-tenant".into()),
        trusted_proxy_api_keys: vec!["kproxy".into()],
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
    // Text parts are read.
    let b = serde_json::json!({"model":"agentkv","max_tokens":2,
        "messages":[{"role":"user","content":[{"type":"text","text":"hi"}]}]});
    assert_eq!(
        call(&r, "POST", "/v1/chat/completions", None, &b.to_string())
            .await
            .status,
        200
    );
    let b = serde_json::json!({"model":"agentkv","prompt":[999999],"max_tokens":2});
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
    let ctx = common::model().config().context_length;
    let ids: Vec<u32> = vec![42; ctx + 5];
    let b = serde_json::json!({"model":"agentkv","prompt":ids,"max_tokens":2});
    let e = call(&r, "POST", "/v1/completions", None, &b.to_string())
        .await
        .error(400);
    let msg = e["message"].as_str().unwrap();
    assert!(
        msg.contains(&(ctx + 5).to_string()) && msg.contains(&ctx.to_string()),
        "{msg}"
    );
    assert_eq!(e["code"], "context_length_exceeded");
    let b = serde_json::json!({"model":"agentkv","prompt":[42, 43],"max_tokens":ctx});
    let e = call(&r, "POST", "/v1/completions", None, &b.to_string())
        .await
        .error(400);
    assert_eq!(e["code"], "context_length_exceeded");
    let big = format!(
        r#"{{"model":"agentkv","prompt":"{}"}}"#,
        "a".repeat(300_000)
    );
    call(&r, "POST", "/v1/completions", None, &big)
        .await
        .error(413);
    call(&r, "GET", "/v1/nothing", None, "").await.error(404);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn overload_gives_429_per_tenant_and_503_overall_with_retry_after() {
    use tower::ServiceExt;
    let settings = ServerSettings {
        limits: Limits {
            max_requests_per_tenant: 1,
            max_tokens_per_tenant: 1000,
            max_tokens: 500,
            retry_after_secs: 3,
            ..Limits::default()
        },
        admin_api_keys: vec!["kadmin".into()],
        ..tenants()
    };
    let (_e, _s, r) = app(settings);
    let b = |max: u32, stream: bool| {
        serde_json::json!({"model":"agentkv","prompt":"hello","max_tokens":max,"stream":stream,
            "ignore_eos":true})
        .to_string()
    };
    // Larger than a bound on its own: it can never run, so 400 rather than "retry later".
    let reply = call(&r, "POST", "/v1/completions", Some("ka"), &b(2000, false)).await;
    assert_eq!(reply.error(400)["code"], "request_too_large");
    // Alpha holds a running stream (its body is not read, so the request stays in flight).
    let held = r
        .clone()
        .oneshot(
            axum::http::Request::post("/v1/completions")
                .header("content-type", "application/json")
                .header("authorization", "Bearer ka")
                .body(axum::body::Body::from(b(300, true)))
                .unwrap(),
        )
        .await
        .unwrap();
    assert_eq!(held.status(), 200);
    // Alpha over its own bound: 429.
    let reply = call(&r, "POST", "/v1/completions", Some("ka"), &b(4, false)).await;
    assert_eq!(reply.error(429)["type"], "rate_limit_error");
    assert_eq!(reply.headers["retry-after"], "3");
    // Beta fits its own bound but not the server's: 503.
    let reply = call(&r, "POST", "/v1/completions", Some("kb"), &b(300, false)).await;
    reply.error(503);
    assert_eq!(reply.headers["retry-after"], "3");
    drop(held);
    assert_eq!(
        call(&r, "POST", "/v1/completions", Some("ka"), &b(4, false))
            .await
            .status,
        200
    );
    // Tenant-labelled series need a metrics or admin key once tenants are configured.
    let m = call(&r, "GET", "/metrics", Some("kadmin"), "").await.body;
    for t in ["alpha", "beta"] {
        assert!(
            m.contains(&format!(
                "agentkv_requests_rejected_total{{tenant=\"{t}\"}} 1"
            )),
            "{m}"
        );
    }
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
    // An unknown tenant, or the open server's hidden `default` on a server with named tenants
    // (issue #44, I3): 404.
    for name in ["nobody", "default"] {
        let f = call(
            &r,
            "POST",
            "/v1/cache/flush",
            Some("admin"),
            &format!(r#"{{"tenant":"{name}"}}"#),
        )
        .await;
        f.error(404);
    }
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unknown_and_unsupported_fields_get_400_naming_the_param_unless_lenient() {
    let (_e, _s, r) = app(ServerSettings::default());
    let chat_with = |field: &str, value: serde_json::Value| {
        let mut b: serde_json::Value = serde_json::from_str(&chat("hi", 2)).unwrap();
        b[field] = value;
        b.to_string()
    };
    let cases = [
        ("best_of", serde_json::json!(2), "unsupported_parameter"),
        ("functions", serde_json::json!([]), "unsupported_parameter"),
        (
            "guided_decoding_backend",
            serde_json::json!("xgrammar"),
            "unknown_parameter",
        ),
        ("frobnicate", serde_json::json!(1), "unknown_parameter"),
    ];
    for (field, value, code) in &cases {
        let e = call(
            &r,
            "POST",
            "/v1/chat/completions",
            None,
            &chat_with(field, value.clone()),
        )
        .await
        .error(400);
        assert_eq!(
            (&e["param"], &e["code"]),
            (&(*field).into(), &(*code).into()),
            "{e}"
        );
        assert_eq!(e["type"], "invalid_request_error");
    }
    let b = serde_json::json!({"model":"agentkv","prompt":"p","max_tokens":2,"suffix":"x"});
    let e = call(&r, "POST", "/v1/completions", None, &b.to_string())
        .await
        .error(400);
    assert_eq!(e["param"], "suffix");
    let e = call(
        &r,
        "POST",
        "/v1/chat/completions",
        None,
        &chat_with("tool_choice", 12345.into()),
    )
    .await
    .error(400);
    assert_eq!(e["param"], "tool_choice");
    let bad_tools = serde_json::json!([{"type": "function", "function": {"name": 7}}]);
    let e = call(
        &r,
        "POST",
        "/v1/chat/completions",
        None,
        &chat_with("tools", bad_tools),
    )
    .await
    .error(400);
    assert_eq!(e["param"], "tools[0].function.name");

    // Lenient: unknown fields are ignored, wrong types of known fields still rejected.
    let lenient = ServerSettings {
        unknown_fields: UnknownFields::Ignore,
        ..ServerSettings::default()
    };
    let (_e2, _s2, r) = app(lenient);
    for (field, value, _) in cases {
        let reply = call(
            &r,
            "POST",
            "/v1/chat/completions",
            None,
            &chat_with(field, value),
        )
        .await;
        assert_eq!(reply.status, 200, "{field}: {}", reply.body);
    }
    let e = call(
        &r,
        "POST",
        "/v1/chat/completions",
        None,
        &chat_with("tool_choice", 12345.into()),
    )
    .await
    .error(400);
    assert_eq!(e["param"], "tool_choice");
    let e = call(
        &r,
        "POST",
        "/v1/chat/completions",
        None,
        &chat_with("top_k", "many".into()),
    )
    .await
    .error(400);
    assert_eq!(e["param"], "top_k");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn model_must_be_a_served_name_or_alias() {
    let settings = ServerSettings {
        model_aliases: vec!["gpt-4o-mini".into(), "org/small".into()],
        ..ServerSettings::default()
    };
    let (_e, _s, r) = app(settings);
    let with_model = |m: &str| {
        let mut b: serde_json::Value = serde_json::from_str(&chat("hi", 2)).unwrap();
        b["model"] = m.into();
        b.to_string()
    };
    let reply = call(
        &r,
        "POST",
        "/v1/chat/completions",
        None,
        &with_model("gpt-5"),
    )
    .await;
    let e = reply.error(404);
    assert_eq!(
        (&e["code"], &e["param"]),
        (&"model_not_found".into(), &"model".into())
    );
    assert!(e["message"].as_str().unwrap().contains("gpt-5"), "{e}");
    let b = serde_json::json!({"model":"nope","prompt":"p","max_tokens":2});
    call(&r, "POST", "/v1/completions", None, &b.to_string())
        .await
        .error(404);
    let ok = call(
        &r,
        "POST",
        "/v1/chat/completions",
        None,
        &with_model("gpt-4o-mini"),
    )
    .await;
    assert_eq!(ok.status, 200, "{}", ok.body);
    assert_eq!(
        ok.json()["model"],
        "agentkv",
        "responses name the model itself"
    );
    let ids: Vec<String> = call(&r, "GET", "/v1/models", None, "").await.json()["data"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["id"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(ids, ["agentkv", "gpt-4o-mini", "org/small"]);
    for id in ["agentkv", "gpt-4o-mini", "org/small"] {
        let card = call(&r, "GET", &format!("/v1/models/{id}"), None, "").await;
        assert_eq!(card.status, 200, "{id}: {}", card.body);
        assert_eq!(card.json()["id"], id);
        assert_eq!(card.json()["object"], "model");
    }
    let e = call(&r, "GET", "/v1/models/gpt-5", None, "")
        .await
        .error(404);
    assert_eq!(e["code"], "model_not_found");
    let e = call(
        &r,
        "POST",
        "/tokenize",
        None,
        r#"{"model":"gpt-5","prompt":"x"}"#,
    )
    .await
    .error(404);
    assert_eq!(e["code"], "model_not_found");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn logit_bias_bans_and_forces_tokens_and_is_validated() {
    let (_e, _s, r) = app(ServerSettings::default());
    let complete = |bias: serde_json::Value| {
        serde_json::json!({"model": "agentkv", "prompt": "The capital of France is",
            "max_tokens": 1, "temperature": 0, "logit_bias": bias})
        .to_string()
    };
    let text = |reply: common::Reply| {
        assert_eq!(reply.status, 200, "{}", reply.body);
        reply.json()["choices"][0]["text"]
            .as_str()
            .unwrap()
            .to_string()
    };
    let token_id = |t: String| {
        let r = &r;
        async move {
            let body = serde_json::json!({"prompt": t, "add_special_tokens": false});
            let ids = call(r, "POST", "/tokenize", None, &body.to_string())
                .await
                .json()["tokens"]
                .clone();
            assert_eq!(
                ids.as_array().unwrap().len(),
                1,
                "{t:?} is one token: {ids}"
            );
            ids[0].as_u64().unwrap()
        }
    };
    let greedy = text(
        call(
            &r,
            "POST",
            "/v1/completions",
            None,
            &complete(serde_json::json!({})),
        )
        .await,
    );
    let greedy_id = token_id(greedy.clone()).await;
    let banned = text(
        call(
            &r,
            "POST",
            "/v1/completions",
            None,
            &complete(serde_json::json!({greedy_id.to_string(): -100})),
        )
        .await,
    );
    assert_ne!(banned, greedy, "-100 bans the greedy token");
    let forced_id = token_id(" banana".into()).await;
    let forced = text(
        call(
            &r,
            "POST",
            "/v1/completions",
            None,
            &complete(serde_json::json!({forced_id.to_string(): 100})),
        )
        .await,
    );
    assert_eq!(forced, " banana", "+100 forces the token");
    // The chat route reads it too.
    let mut b: serde_json::Value = serde_json::from_str(&chat("Say hi.", 1)).unwrap();
    let plain = call(&r, "POST", "/v1/chat/completions", None, &b.to_string())
        .await
        .json();
    b["logit_bias"] = serde_json::json!({forced_id.to_string(): 100});
    let biased = call(&r, "POST", "/v1/chat/completions", None, &b.to_string())
        .await
        .json();
    assert_eq!(biased["choices"][0]["message"]["content"], " banana");
    assert_ne!(
        plain["choices"][0]["message"],
        biased["choices"][0]["message"]
    );
    let vocab = common::model().tokenizer().vocab_size();
    for bad in [
        serde_json::json!({"42": 150}),
        serde_json::json!({"forty-two": 1}),
        serde_json::json!({vocab.to_string(): 1}),
    ] {
        let e = call(&r, "POST", "/v1/completions", None, &complete(bad))
            .await
            .error(400);
        assert_eq!(e["param"], "logit_bias", "{e}");
    }
}
