//! `POST /v1/chat/completions`: whole answers and SSE chunks in the OpenAI chat shape.

use api::{
    ChatChoice, ChatChunkChoice, ChatCompletionChunk, ChatCompletionRequest,
    ChatCompletionResponse, ChatDelta, ChatMessage, Role,
};
use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::State;
use axum::http::HeaderMap;
use axum::response::{IntoResponse, Response};
use axum::Json;

use crate::error::ApiError;
use crate::output::{chat_logprobs, collect};
use crate::params::{chat_prompt, check_model, parse_request, prepare, GenOptions};
use crate::routes::body_bytes;
use crate::run::{finish_reason_name, submit, Step};
use crate::sse::{self, json};
use crate::state::{unix_now, AppState};

pub async fn chat_completions(
    State(state): State<AppState>,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    let tenant = state.tenants.authenticate(&headers)?.clone();
    let body = body_bytes(&state, body)?;
    let req: ChatCompletionRequest = parse_request(&body, state.settings.unknown_fields)?;
    check_model(&state, &req.model)?;
    let opts = GenOptions::from_chat(&req)?;
    let prompt = chat_prompt(&state, &req)?;
    let prepared = prepare(&state, &tenant, prompt, &opts)?;
    let mut running = submit(&state, &tenant, prepared)?;
    let id = format!("chatcmpl-{}", running.id.0);
    let created = unix_now();
    let model = state.settings.model_name.clone();
    if req.stream.unwrap_or(false) {
        let include_usage = req
            .stream_options
            .as_ref()
            .and_then(|o| o.include_usage)
            .unwrap_or(false);
        running.prime().await?;
        let chunk = move |choices: Vec<ChatChunkChoice>, usage: Option<api::Usage>| {
            json(&ChatCompletionChunk {
                id: id.clone(),
                object: "chat.completion.chunk".into(),
                created,
                model: model.clone(),
                choices,
                usage,
                system_fingerprint: None,
            })
        };
        let prelude = (0..running.n as u32)
            .map(|index| {
                chunk(
                    vec![ChatChunkChoice {
                        index,
                        delta: ChatDelta {
                            role: Some(Role::Assistant),
                            content: Some(String::new()),
                        },
                        finish_reason: None,
                        logprobs: None,
                    }],
                    None,
                )
            })
            .collect();
        let st = state.clone();
        let on_step = move |r: &crate::run::Running, step: Step| -> Vec<String> {
            let delta = |index: u32, content: String, logprobs| ChatChunkChoice {
                index,
                delta: ChatDelta {
                    role: None,
                    content: Some(content),
                },
                finish_reason: None,
                logprobs,
            };
            match step {
                Step::Token(t) => {
                    let lp = r
                        .logprobs
                        .map(|_| chat_logprobs(&st.model, std::slice::from_ref(&t)));
                    if t.text.is_empty() && lp.is_none() {
                        return Vec::new();
                    }
                    vec![chunk(vec![delta(t.choice, t.text, lp)], None)]
                }
                Step::Text { choice, text } if !text.is_empty() => {
                    vec![chunk(vec![delta(choice, text, None)], None)]
                }
                Step::Text { .. } => Vec::new(),
                Step::Finished { choice, reason } => vec![chunk(
                    vec![ChatChunkChoice {
                        index: choice,
                        delta: ChatDelta::default(),
                        finish_reason: Some(finish_reason_name(reason).into()),
                        logprobs: None,
                    }],
                    None,
                )],
                Step::Done(usage) if include_usage => vec![chunk(Vec::new(), Some(usage))],
                Step::Done(_) => Vec::new(),
            }
        };
        return Ok(sse::stream(running, prelude, on_step).into_response());
    }
    let collected = collect(&mut running).await?;
    let choices = collected
        .choices
        .into_iter()
        .enumerate()
        .map(|(i, c)| ChatChoice {
            index: i as u32,
            logprobs: running
                .logprobs
                .map(|_| chat_logprobs(&state.model, &c.tokens)),
            message: ChatMessage::new(Role::Assistant, c.text),
            finish_reason: c.finish_reason.map(|r| finish_reason_name(r).into()),
        })
        .collect();
    Ok(Json(ChatCompletionResponse {
        id,
        object: "chat.completion".into(),
        created,
        model,
        choices,
        usage: Some(collected.usage),
        system_fingerprint: None,
    })
    .into_response())
}
