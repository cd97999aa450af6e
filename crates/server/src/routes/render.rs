//! `POST /v1/chat/completions/render` and `POST /v1/completions/render`: vLLM's render endpoints,
//! which routers call to learn a request's prompt token ids without running it (vllm-router asks
//! a worker to render before routing, so its cache-aware policies see the exact ids the worker
//! will cache). The body is checked and rendered exactly as the generation route would (auth,
//! tenant, tools, template); the answer is `{"token_ids": [...], "model": ...}` for chat and a
//! one-element list of that for text completions (vLLM's shapes). Never submits to the engine.

use api::{ChatCompletionRequest, CompletionRequest};
use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::State;
use axum::http::HeaderMap;
use axum::Json;
use serde_json::{json, Value};

use crate::error::ApiError;
use crate::params::completion_prompt;
use crate::pipeline::prepare_chat;
use crate::routes::read_generation_request;
use crate::state::AppState;

pub async fn chat(
    State(state): State<AppState>,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Result<Json<Value>, ApiError> {
    let (tenant, req, _) =
        read_generation_request(&state, &headers, body, |r: &ChatCompletionRequest| &r.model)?;
    let (prepared, _) = prepare_chat(&state, &tenant, &req)?;
    Ok(Json(json!({
        "token_ids": prepared.spec.prompt,
        "model": state.settings.model_name,
    })))
}

pub async fn completion(
    State(state): State<AppState>,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Result<Json<Value>, ApiError> {
    let (_, req, _) =
        read_generation_request(&state, &headers, body, |r: &CompletionRequest| &r.model)?;
    let tokens = completion_prompt(&state, &req.prompt)?;
    Ok(Json(json!([{
        "token_ids": tokens,
        "model": state.settings.model_name,
    }])))
}
