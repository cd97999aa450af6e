//! Shared set-up of the in-process tests: the real default model (loaded once), a small engine,
//! the router, and a helper that sends one request through `tower::ServiceExt::oneshot`.

#![allow(dead_code)] // each test binary uses part of these helpers

use std::sync::{Arc, OnceLock};

use axum::body::Body;
use axum::http::{HeaderMap, Request, StatusCode};
use axum::Router;
use engine::{Engine, EngineConfig, EngineCore};
use http_body_util::BodyExt;
use server::{AppState, ServerSettings};
use tower::ServiceExt;

pub fn model() -> Arc<model::Model> {
    static M: OnceLock<Arc<model::Model>> = OnceLock::new();
    M.get_or_init(|| {
        Arc::new(model::Model::load(&model::default_model_path()).expect("default model"))
    })
    .clone()
}

/// A server over a 256-block engine. Keep the `Engine` alive for the test's duration.
pub fn app(settings: ServerSettings) -> (Engine, AppState, Router) {
    let cfg = EngineConfig {
        num_blocks: 256,
        threads: 2,
        ..EngineConfig::default()
    };
    let engine = Engine::start(EngineCore::new(model(), cfg).expect("engine"));
    let state =
        AppState::new(engine.handle(), model().frontend().clone(), settings).expect("settings");
    let router = server::router(state.clone());
    (engine, state, router)
}

pub struct Reply {
    pub status: StatusCode,
    pub headers: HeaderMap,
    pub body: String,
}

impl Reply {
    pub fn json(&self) -> serde_json::Value {
        serde_json::from_str(&self.body).unwrap_or_else(|e| panic!("not JSON ({e}): {}", self.body))
    }

    /// Asserts the OpenAI error shape and returns `error`.
    pub fn error(&self, status: u16) -> serde_json::Value {
        assert_eq!(self.status.as_u16(), status, "{}", self.body);
        let v = self.json();
        let e = v["error"].clone();
        assert!(
            e["message"].is_string() && e["type"].is_string(),
            "{}",
            self.body
        );
        assert!(
            e.get("param").is_some() && e.get("code").is_some(),
            "{}",
            self.body
        );
        e
    }
}

pub async fn call(
    router: &Router,
    method: &str,
    path: &str,
    key: Option<&str>,
    body: &str,
) -> Reply {
    let mut req = Request::builder()
        .method(method)
        .uri(path)
        .header("content-type", "application/json");
    if let Some(k) = key {
        req = req.header("authorization", format!("Bearer {k}"));
    }
    let resp = router
        .clone()
        .oneshot(req.body(Body::from(body.to_string())).unwrap())
        .await
        .unwrap();
    let status = resp.status();
    let headers = resp.headers().clone();
    let bytes = resp.into_body().collect().await.unwrap().to_bytes();
    Reply {
        status,
        headers,
        body: String::from_utf8(bytes.to_vec()).unwrap(),
    }
}

/// A greedy chat request body.
pub fn chat(content: &str, max_tokens: u32) -> String {
    serde_json::json!({
        "model": "agentkv",
        "messages": [{"role": "system", "content": "You are a terse assistant."},
                     {"role": "user", "content": content}],
        "max_tokens": max_tokens,
        "temperature": 0
    })
    .to_string()
}
