//! The router: which path goes to which handler, the body-size limit, and the helpers handlers
//! share (reading the body, reading a generation request, taking an engine snapshot).

mod admin;
mod chat;
mod completions;
mod info;
mod input_items;
mod render;
mod responses;
mod sessions;
mod stored_chat;

use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::DefaultBodyLimit;
use axum::http::{HeaderMap, StatusCode};
use axum::routing::{get, post};
use axum::Router;
use engine::EngineSnapshot;

use crate::error::ApiError;
use crate::params::{check_model, parse_request};
use crate::state::AppState;
use crate::tenants::Tenant;

/// Every route of the server.
pub fn router(state: AppState) -> Router {
    let limit = state.settings.limits.max_body_bytes;
    Router::new()
        .route(
            "/v1/chat/completions",
            post(chat::chat_completions).get(stored_chat::list),
        )
        .route(
            "/v1/chat/completions/{id}",
            get(stored_chat::get).delete(stored_chat::delete),
        )
        .route(
            "/v1/chat/completions/{id}/messages",
            get(stored_chat::messages),
        )
        .route("/v1/completions", post(completions::completions))
        .route("/v1/chat/completions/render", post(render::chat))
        .route("/v1/completions/render", post(render::completion))
        .route("/v1/responses", post(responses::create))
        .route(
            "/v1/responses/{id}",
            get(responses::get).delete(responses::delete),
        )
        .route("/v1/responses/{id}/input_items", get(input_items::list))
        .route(
            "/v1/sessions/{id}",
            get(sessions::get).delete(sessions::delete),
        )
        .route("/v1/models", get(info::models))
        .route("/v1/models/{*id}", get(info::model))
        .route("/health", get(info::health))
        .route("/metrics", get(info::metrics))
        .route("/tokenize", post(info::tokenize))
        .route("/detokenize", post(info::detokenize))
        .route("/v1/cache/flush", post(admin::flush))
        .route("/v1/cache/stats", get(admin::stats))
        .fallback(|| async { ApiError::NotFound("no such route".into()) })
        .method_not_allowed_fallback(crate::transport::method_not_allowed)
        .layer(axum::middleware::from_fn_with_state(
            state.clone(),
            crate::transport::read_body,
        ))
        .layer(DefaultBodyLimit::max(limit))
        .layer(axum::middleware::from_fn(crate::reqlog::log_requests))
        .with_state(state)
}

/// What every generation route does first: authenticate the caller, read the body, parse it
/// under the server's unknown-field policy, and check its `model` against the served names.
pub(crate) fn read_generation_request<T: serde::de::DeserializeOwned + api::KnownFields>(
    state: &AppState,
    headers: &HeaderMap,
    body: Result<Bytes, BytesRejection>,
    model: impl FnOnce(&T) -> &str,
) -> Result<(Tenant, T, Vec<crate::breakpoints::Marked>), ApiError> {
    let tenant = state.tenants.authenticate(headers)?.clone();
    crate::reqlog::note(|e| e.tenant = Some(tenant.name.clone()));
    let body = body_bytes(state, body)?;
    let (req, marked): (T, _) = parse_request(&body, state.settings.unknown_fields)?;
    check_model(state, model(&req))?;
    Ok((tenant, req, marked))
}

/// The request body, or the OpenAI error for an oversized or unreadable one.
pub(crate) fn body_bytes(
    state: &AppState,
    body: Result<Bytes, BytesRejection>,
) -> Result<Bytes, ApiError> {
    body.map_err(|rej| {
        if rej.status() == StatusCode::PAYLOAD_TOO_LARGE {
            ApiError::BodyTooLarge {
                limit_bytes: state.settings.limits.max_body_bytes,
            }
        } else {
            ApiError::InvalidRequest {
                message: format!("cannot read the request body: {rej}"),
                param: None,
            }
        }
    })
}

pub(crate) async fn snapshot(state: &AppState) -> Result<EngineSnapshot, ApiError> {
    let rx = state.engine.snapshot().map_err(ApiError::from_engine)?;
    rx.await.map_err(|_| ApiError::ShuttingDown)
}
