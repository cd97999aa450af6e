//! `POST /v1/chat/completions`: whole answers and SSE chunks in the OpenAI chat shape. With tools
//! (the generic tool mode, `tools.rs`) each choice's reply is held until it ends, then parsed into
//! `tool_calls` (`finish_reason: "tool_calls"`) or text.

use api::{
    ChatChoice, ChatChunkChoice, ChatCompletionChunk, ChatCompletionRequest,
    ChatCompletionResponse, ChatDelta, ChatMessage, FunctionCall, FunctionCallDelta, FunctionKind,
    Role, ToolCall, ToolCallDelta,
};
use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::State;
use axum::http::HeaderMap;
use axum::response::{IntoResponse, Response};
use axum::Json;
use engine::FinishReason;

use crate::error::ApiError;
use crate::output::{chat_logprobs, collect};
use crate::params::{chat_prompt, prepare, tool_constraint, GenOptions, Prepared};
use crate::routes::read_generation_request;
use crate::run::{finish_reason_name, submit, Step};
use crate::sse::{self, json};
use crate::state::{unix_now, AppState};
use crate::structured;
use crate::tenants::Tenant;
use crate::tools::{parse_reply, partial_text, Reply};

pub async fn chat_completions(
    State(state): State<AppState>,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    let (tenant, req) =
        read_generation_request(&state, &headers, body, |r: &ChatCompletionRequest| &r.model)?;
    let (prepared, tool_mode) = prepare_chat(&state, &tenant, &req)?;
    let mut running = submit(&state, &tenant, prepared)?;
    let id = format!("chatcmpl-{}", running.id.0);
    let call_id = {
        let (started, request) = (state.started_unix_s, running.id.0);
        move |choice: u32, j: usize| format!("call_{started:x}{request:x}c{choice}n{j}")
    };
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
        let delta =
            |index: u32, delta: ChatDelta, finish: Option<&str>, logprobs| ChatChunkChoice {
                index,
                delta,
                finish_reason: finish.map(str::to_string),
                logprobs,
            };
        let text_delta = |content: String| ChatDelta {
            content: Some(content),
            ..ChatDelta::default()
        };
        let prelude = (0..running.n as u32)
            .map(|index| {
                let d = ChatDelta {
                    role: Some(Role::Assistant),
                    content: Some(String::new()),
                    tool_calls: None,
                };
                chunk(vec![delta(index, d, None, None)], None)
            })
            .collect();
        let st = state.clone();
        // Tool mode: each choice's text is held until it finishes.
        let mut held: Vec<String> = vec![String::new(); running.n];
        let on_step = move |r: &crate::run::Running, step: Step| -> Vec<String> {
            match step {
                Step::Token(t) if tool_mode => {
                    held[t.choice as usize].push_str(&t.text);
                    Vec::new()
                }
                Step::Text { choice, text } if tool_mode => {
                    held[choice as usize].push_str(&text);
                    Vec::new()
                }
                Step::Finished { choice, reason } if tool_mode => {
                    let text = std::mem::take(&mut held[choice as usize]);
                    let (message, finish) = tool_reply(text, reason, |j| call_id(choice, j));
                    let finished = ChatDelta::default();
                    vec![
                        chunk(vec![delta(choice, whole_delta(message), None, None)], None),
                        chunk(vec![delta(choice, finished, Some(&finish), None)], None),
                    ]
                }
                Step::Token(t) => {
                    let lp = r
                        .logprobs
                        .map(|_| chat_logprobs(&st.model, std::slice::from_ref(&t)));
                    if t.text.is_empty() && lp.is_none() {
                        return Vec::new();
                    }
                    vec![chunk(
                        vec![delta(t.choice, text_delta(t.text), None, lp)],
                        None,
                    )]
                }
                Step::Text { choice, text } if !text.is_empty() => {
                    vec![chunk(
                        vec![delta(choice, text_delta(text), None, None)],
                        None,
                    )]
                }
                Step::Text { .. } => Vec::new(),
                Step::Finished { choice, reason } => vec![chunk(
                    vec![delta(
                        choice,
                        ChatDelta::default(),
                        Some(finish_reason_name(reason)),
                        None,
                    )],
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
        .map(|(i, c)| {
            let logprobs = running
                .logprobs
                .map(|_| chat_logprobs(&state.model, &c.tokens));
            let (message, finish_reason) = match c.finish_reason {
                Some(reason) if tool_mode => {
                    let (m, f) = tool_reply(c.text, reason, |j| call_id(i as u32, j));
                    (m, Some(f))
                }
                reason => (
                    ChatMessage::new(Role::Assistant, c.text),
                    reason.map(|r| finish_reason_name(r).to_string()),
                ),
            };
            ChatChoice {
                index: i as u32,
                logprobs,
                message,
                finish_reason,
            }
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

/// Validates a chat request into an engine request: the prompt (with the generic tool mode's
/// plan when tools may be called) and the constraint of its tool calls or structured output.
/// Also `true` when the reply is in the tool mode (parsed back with [`tool_reply`]).
pub(crate) fn prepare_chat(
    state: &AppState,
    tenant: &Tenant,
    req: &ChatCompletionRequest,
) -> Result<(Prepared, bool), ApiError> {
    let mut opts = GenOptions::from_chat(req)?;
    let format = structured::requested(req.response_format.as_ref(), &req.extra)?;
    let (prompt, plan) = chat_prompt(state, req, format.as_ref().and_then(|f| f.json_schema()))?;
    match (&plan, &format) {
        (Some(plan), format) => {
            if opts.logprobs.is_some() {
                return Err(ApiError::UnsupportedParameter {
                    param: "logprobs".into(),
                    message: "logprobs is not supported together with tools".into(),
                });
            }
            structured::check_eos_fields(&opts.extra, "tools")?;
            if let Some(f) = format {
                if f.json_schema().is_none() {
                    return Err(ApiError::UnsupportedParameter {
                        param: f.param.clone(),
                        message: format!(
                            "{} is not supported together with tools (only JSON formats are)",
                            f.param
                        ),
                    });
                }
                // Compiled alone first, so that a bad schema is named after its own field.
                structured::constraint(state, f)?;
            }
            opts.constraint = Some(tool_constraint(state, plan)?);
        }
        (None, Some(f)) => {
            structured::check_eos_fields(&opts.extra, "structured output")?;
            opts.constraint = Some(structured::constraint(state, f)?);
        }
        (None, None) => {}
    }
    Ok((prepare(state, tenant, prompt, &opts)?, plan.is_some()))
}

/// A whole message as one streamed delta (`tool_calls` carry their index, id, type and name).
fn whole_delta(message: ChatMessage) -> ChatDelta {
    let tool_calls = message.tool_calls.map(|calls| {
        calls
            .into_iter()
            .enumerate()
            .map(|(j, c)| ToolCallDelta {
                index: j as u32,
                id: Some(c.id),
                kind: Some(c.kind),
                function: Some(FunctionCallDelta {
                    name: Some(c.function.name),
                    arguments: Some(c.function.arguments),
                }),
            })
            .collect()
    });
    ChatDelta {
        role: None,
        content: message.content,
        tool_calls,
    }
}

/// A finished choice's reply in the generic tool mode: tool calls (`finish_reason:
/// "tool_calls"`), a text answer, or — when the reply is not the grammar's JSON (cut by
/// `max_tokens` or a stop string) — the text answer written so far, or else the raw text, with
/// the engine's reason.
pub(crate) fn tool_reply(
    text: String,
    reason: FinishReason,
    call_id: impl Fn(usize) -> String,
) -> (ChatMessage, String) {
    match parse_reply(&text) {
        Reply::Calls(calls) => {
            let calls = calls
                .into_iter()
                .enumerate()
                .map(|(j, c)| ToolCall {
                    id: call_id(j),
                    kind: FunctionKind::Function,
                    function: FunctionCall {
                        name: c.name,
                        arguments: c.arguments,
                    },
                })
                .collect();
            let message = ChatMessage {
                content: None,
                tool_calls: Some(calls),
                ..ChatMessage::new(Role::Assistant, "")
            };
            (message, "tool_calls".to_string())
        }
        Reply::Text(t) => (
            ChatMessage::new(Role::Assistant, t),
            finish_reason_name(reason).to_string(),
        ),
        Reply::Unparsed => (
            ChatMessage::new(Role::Assistant, partial_text(&text).unwrap_or(text)),
            finish_reason_name(reason).to_string(),
        ),
    }
}
