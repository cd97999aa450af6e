//! `GET /health`, `GET /v1/models`, `GET /v1/models/{id}`, `GET /metrics`, `POST /tokenize`,
//! `POST /detokenize`.

use api::tokenize::{DetokenizeRequest, DetokenizeResponse, TokenizeRequest, TokenizeResponse};
use api::{ModelCard, ModelList};
use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::{Path, State};
use axum::http::{header, HeaderMap};
use axum::response::{IntoResponse, Response};
use axum::Json;

use crate::error::ApiError;
use crate::params::{check_model, parse_json, render_chat};
use crate::routes::{body_bytes, snapshot};
use crate::state::AppState;

pub async fn health(State(state): State<AppState>) -> Result<&'static str, ApiError> {
    if state.is_shutting_down() {
        return Err(ApiError::ShuttingDown);
    }
    snapshot(&state).await?;
    Ok("ok")
}

/// Every served name (the model name, then its aliases), all for the one loaded model.
pub async fn models(
    State(state): State<AppState>,
    headers: HeaderMap,
) -> Result<Json<ModelList>, ApiError> {
    state.tenants.authenticate(&headers)?;
    Ok(Json(ModelList {
        object: "list".into(),
        data: state
            .settings
            .served_model_names()
            .into_iter()
            .map(|id| model_card(&state, id))
            .collect(),
    }))
}

/// One served name's card; 404 `model_not_found` for any other id.
pub async fn model(
    State(state): State<AppState>,
    headers: HeaderMap,
    Path(id): Path<String>,
) -> Result<Json<ModelCard>, ApiError> {
    state.tenants.authenticate(&headers)?;
    check_model(&state, &id)?;
    Ok(Json(model_card(&state, &id)))
}

fn model_card(state: &AppState, id: &str) -> ModelCard {
    ModelCard {
        id: id.to_string(),
        object: "model".into(),
        created: state.started_unix_s,
        owned_by: "agentkv".into(),
        max_model_len: Some(state.frontend.context_length as u64),
    }
}

/// Prometheus exposition; needs a metrics or admin key when `metrics_api_keys` are configured,
/// and carries tenant-labelled series only with `metrics_per_tenant` and, on a server with
/// tenants, only for a caller with a metrics or admin key.
pub async fn metrics(
    State(state): State<AppState>,
    headers: HeaderMap,
) -> Result<Response, ApiError> {
    let privileged = state.tenants.authenticate_metrics(&headers)?;
    let snap = snapshot(&state).await?;
    let text = state.metrics.render(
        &snap,
        |id| state.tenants.name_of(id),
        state.settings.metrics_per_tenant && privileged,
        &state.settings.model_name,
    );
    Ok((
        [(
            header::CONTENT_TYPE,
            "text/plain; version=0.0.4; charset=utf-8",
        )],
        text,
    )
        .into_response())
}

pub async fn tokenize(
    State(state): State<AppState>,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Result<Json<TokenizeResponse>, ApiError> {
    state.tenants.authenticate(&headers)?;
    let req: TokenizeRequest = parse_json(&body_bytes(&state, body)?)?;
    if let Some(m) = &req.model {
        check_model(&state, m)?;
    }
    let tokens = match (&req.prompt, &req.messages) {
        (Some(p), None) => state
            .frontend
            .tokenizer
            .encode(p, req.add_special_tokens.unwrap_or(true), false)
            .map_err(|e| ApiError::Internal(format!("tokenizer: {e}")))?,
        (None, Some(m)) => render_chat(
            &state,
            m,
            None,
            None,
            req.add_generation_prompt.unwrap_or(true),
        )?,
        _ => {
            return Err(ApiError::invalid(
                "give exactly one of prompt and messages",
                "prompt",
            ))
        }
    };
    Ok(Json(TokenizeResponse {
        count: tokens.len() as u64,
        max_model_len: state.frontend.context_length as u64,
        tokens,
    }))
}

pub async fn detokenize(
    State(state): State<AppState>,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Result<Json<DetokenizeResponse>, ApiError> {
    state.tenants.authenticate(&headers)?;
    let req: DetokenizeRequest = parse_json(&body_bytes(&state, body)?)?;
    if let Some(m) = &req.model {
        check_model(&state, m)?;
    }
    let vocab = state.frontend.tokenizer.vocab_size();
    if let Some(t) = req.tokens.iter().find(|&&t| t as usize >= vocab) {
        return Err(ApiError::invalid(
            format!("token id {t} is outside the vocabulary of {vocab}"),
            "tokens",
        ));
    }
    let prompt = state
        .frontend
        .tokenizer
        .decode(&req.tokens, false)
        .map_err(|e| ApiError::invalid(format!("cannot decode: {e}"), "tokens"))?;
    Ok(Json(DetokenizeResponse { prompt }))
}
