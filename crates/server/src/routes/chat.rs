//! `POST /v1/chat/completions`: whole answers and SSE chunks in the OpenAI chat shape. With tools
//! (the generic mode of `tools.rs` or a template family's syntax, `tool_families.rs`) each
//! choice's reply is parsed into `tool_calls` (`finish_reason: "tool_calls"`) or text; streamed,
//! `tool_stream.rs` turns it into OpenAI's deltas as it is generated.

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

use crate::breakpoints;
use crate::error::ApiError;
use crate::output::{chat_logprobs, collect};
use crate::params::{chat_prompt, prepare, tool_constraint, GenOptions, Prepared};
use crate::routes::read_generation_request;
use crate::run::{finish_reason_name, submit, Step};
use crate::sse::{self, json};
use crate::state::{unix_now, AppState};
use crate::structured;
use crate::tenants::Tenant;
use crate::tool_stream::{Piece, ReplyStream};
use crate::tools::{parse_reply_in, partial_text, ParsedCall, Reply, ReplySyntax};

pub async fn chat_completions(
    State(state): State<AppState>,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    let (tenant, req, marked) =
        read_generation_request(&state, &headers, body, |r: &ChatCompletionRequest| &r.model)?;
    let (mut prepared, tool_mode) = prepare_chat(&state, &tenant, &req)?;
    if let Some(m) = &req.metadata {
        super::stored_chat::check_metadata(m)?;
    }
    // `store: true`: the finished completion is kept for `GET /v1/chat/completions/{id}`.
    let store = req.store.unwrap_or(false).then(|| {
        let state = state.clone();
        let (tenant, messages) = (tenant.id, req.messages.clone());
        let metadata = req.metadata.clone().unwrap_or_default();
        move |completion: api::ChatCompletionResponse| {
            state.chat_completions.insert(
                tenant,
                crate::response_store::StoredCompletion {
                    completion,
                    messages,
                    metadata,
                },
            );
        }
    });
    prepared.spec.priority = crate::sessions::priority(&tenant, &req.cache)?;
    prepared.spec.retention = crate::sessions::retention(
        &state.settings.limits,
        &tenant,
        &headers,
        &req.cache,
        &prepared.spec.prompt,
        prepared.spec.priority,
    )?;
    let prompt = &prepared.spec.prompt;
    prepared.spec.breakpoints = breakpoints::retentions(
        &state.settings.limits,
        &tenant,
        prepared.spec.priority,
        prompt,
        &marked,
        |site| {
            Ok(breakpoint_prefix(
                &state,
                &req,
                prompt,
                site,
                |list, index, text| {
                    if list != "messages" {
                        return None;
                    }
                    let mut v = req.clone();
                    v.messages.truncate(index + 1);
                    if let (Some(m), Some(t)) = (v.messages.get_mut(index), text) {
                        m.content = Some(t.to_string());
                    }
                    (v.messages.len() == index + 1).then_some(v)
                },
            ))
        },
    )?;
    let mut running = submit(&state, &tenant, prepared)?;
    let public = crate::ids::public_id();
    let id = format!("chatcmpl-{public}");
    let call_id = {
        let public = public[..24].to_string();
        move |choice: u32, j: usize| format!("call_{public}c{choice}n{j}")
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
        // With `store`, every chunk also goes into the completion that is stored at the end.
        let stored = store.map(|put| {
            let acc = std::sync::Arc::new(std::sync::Mutex::new(Some(
                super::stored_chat::StreamAccumulator::default(),
            )));
            (acc, put, id.clone(), model.clone())
        });
        let acc = stored.as_ref().map(|s| s.0.clone());
        let mut store_at_end = stored.map(|(acc, put, id, model)| {
            move |usage: api::Usage| {
                let whole = acc.lock().ok().and_then(|mut a| a.take());
                if let Some(a) = whole {
                    put(a.finish(id, created, model, Some(usage)));
                }
            }
        });
        let chunk = move |choices: Vec<ChatChunkChoice>, usage: Option<api::Usage>| {
            if let Some(Some(a)) = acc.as_ref().and_then(|a| a.lock().ok()).as_deref_mut() {
                a.add(&choices);
            }
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
        // Tool mode: each choice's text goes through its reply stream.
        let mut streams: Vec<ReplyStream> = (0..running.n)
            .map(|_| ReplyStream::new(tool_mode.unwrap_or(ReplySyntax::Generic)))
            .collect();
        let pieces_delta = move |choice: u32, pieces: Vec<Piece>| -> Vec<ChatDelta> {
            pieces
                .into_iter()
                .map(|p| piece_delta(p, |j| call_id(choice, j)))
                .collect()
        };
        let on_step = move |r: &crate::run::Running, step: Step| -> Vec<String> {
            match step {
                Step::Token(t) if tool_mode.is_some() => {
                    let choice = t.choice;
                    let pieces = streams[choice as usize].push(&t.text);
                    let mut lp = r
                        .logprobs
                        .map(|_| chat_logprobs(&st.frontend, std::slice::from_ref(&t)));
                    let mut out: Vec<String> = pieces_delta(choice, pieces)
                        .into_iter()
                        .map(|d| chunk(vec![delta(choice, d, None, lp.take())], None))
                        .collect();
                    if let Some(lp) = lp {
                        out.push(chunk(
                            vec![delta(choice, ChatDelta::default(), None, Some(lp))],
                            None,
                        ));
                    }
                    out
                }
                Step::Text { choice, text } if tool_mode.is_some() => {
                    let pieces = streams[choice as usize].push(&text);
                    pieces_delta(choice, pieces)
                        .into_iter()
                        .map(|d| chunk(vec![delta(choice, d, None, None)], None))
                        .collect()
                }
                Step::Finished { choice, reason } if tool_mode.is_some() => {
                    let (pieces, finish) =
                        streams[choice as usize].finish(finish_reason_name(reason));
                    if choice == 0 && finish == "tool_calls" {
                        r.tool_paused();
                    }
                    let mut out: Vec<String> = pieces_delta(choice, pieces)
                        .into_iter()
                        .map(|d| chunk(vec![delta(choice, d, None, None)], None))
                        .collect();
                    out.push(chunk(
                        vec![delta(choice, ChatDelta::default(), Some(&finish), None)],
                        None,
                    ));
                    out
                }
                Step::Token(t) => {
                    let lp = r
                        .logprobs
                        .map(|_| chat_logprobs(&st.frontend, std::slice::from_ref(&t)));
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
                Step::Done(usage) => {
                    if let Some(put) = store_at_end.take() {
                        put(usage.clone());
                    }
                    if include_usage {
                        vec![chunk(Vec::new(), Some(usage))]
                    } else {
                        Vec::new()
                    }
                }
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
                .map(|_| chat_logprobs(&state.frontend, &c.tokens));
            let (message, finish_reason) = match (c.finish_reason, tool_mode) {
                (Some(reason), Some(syntax)) => {
                    let (m, f) = tool_reply(syntax, c.text, reason, |j| call_id(i as u32, j));
                    if i == 0 && f == "tool_calls" {
                        running.tool_paused();
                    }
                    (m, Some(f))
                }
                (reason, _) => (
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
    let completion = ChatCompletionResponse {
        id,
        object: "chat.completion".into(),
        created,
        model,
        choices,
        usage: Some(collected.usage),
        system_fingerprint: None,
    };
    if let Some(put) = store {
        put(completion.clone());
    }
    Ok(Json(completion).into_response())
}

/// How many tokens of `prompt` (the rendering of `full`) a `cache_control` breakpoint covers:
/// the prefix it shares with the rendering of the request cut after the marked item
/// (`item_variant(list, index, text)` builds that request, `None` if the item does not exist) or, for
/// a tool, with the tool list cut after it and a probe tool appended (two probes bound where the
/// next tool would start). A variant that fails to render covers nothing.
pub(crate) fn breakpoint_prefix(
    state: &AppState,
    full: &ChatCompletionRequest,
    prompt: &[u32],
    site: &breakpoints::Site,
    item_variant: impl Fn(&str, usize, Option<&str>) -> Option<ChatCompletionRequest>,
) -> usize {
    let format = structured::requested(full.response_format.as_ref(), &full.extra);
    let schema = format.ok().flatten();
    let schema = schema.as_ref().and_then(|f| f.json_schema());
    let render = |r: &ChatCompletionRequest| chat_prompt(state, r, schema).ok().map(|(p, _)| p);
    match site {
        breakpoints::Site::Item { list, index, text } => {
            item_variant(list, *index, text.as_deref())
                .and_then(|v| render(&v))
                .map_or(0, |p| breakpoints::common_prefix(prompt, &p))
        }
        breakpoints::Site::Tool { index } => {
            let with_probe = |k: u8| {
                let mut v = full.clone();
                let mut tools = v.tools.take().unwrap_or_default();
                tools.truncate(index + 1);
                tools.push(breakpoints::probe_tool(k));
                v.tools = Some(tools);
                // The marked tool's prefix does not depend on which tool must be called.
                v.tool_choice = None;
                render(&v)
            };
            match (with_probe(0), with_probe(1)) {
                (Some(a), Some(b)) => {
                    breakpoints::common_prefix(prompt, &a).min(breakpoints::common_prefix(&a, &b))
                }
                _ => 0,
            }
        }
    }
}

/// Validates a chat request into an engine request: the prompt (with the tool plan when tools
/// may be called) and the constraint of its tool calls or structured output. Also the syntax of
/// the reply when tools may be called (parsed back with [`tool_reply`]).
pub(crate) fn prepare_chat(
    state: &AppState,
    tenant: &Tenant,
    req: &ChatCompletionRequest,
) -> Result<(Prepared, Option<ReplySyntax>), ApiError> {
    let mut opts = GenOptions::from_chat(req)?;
    let format = structured::requested(req.response_format.as_ref(), &req.extra)?;
    let (prompt, plan) = chat_prompt(state, req, format.as_ref().and_then(|f| f.json_schema()))?;
    match (&plan, &format) {
        (Some(plan), format) => {
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
    Ok((
        prepare(state, tenant, prompt, &opts)?,
        plan.as_ref().map(|p| p.syntax()),
    ))
}

/// One piece of a streamed reply as a delta (a call's first delta carries its index, id, type
/// and name; the model's id when it wrote one).
fn piece_delta(p: Piece, call_id: impl Fn(usize) -> String) -> ChatDelta {
    let call = |index: usize, id: Option<String>, name: Option<String>, arguments: String| {
        Some(vec![ToolCallDelta {
            index: index as u32,
            kind: id.is_some().then_some(FunctionKind::Function),
            id,
            function: Some(FunctionCallDelta {
                name,
                arguments: Some(arguments),
            }),
        }])
    };
    match p {
        Piece::Content(text) => ChatDelta {
            content: Some(text),
            ..ChatDelta::default()
        },
        Piece::CallStart { index, id, name } => ChatDelta {
            tool_calls: call(
                index,
                Some(id.unwrap_or_else(|| call_id(index))),
                Some(name),
                String::new(),
            ),
            ..ChatDelta::default()
        },
        Piece::Args { index, text } => ChatDelta {
            tool_calls: call(index, None, None, text),
            ..ChatDelta::default()
        },
    }
}

/// A finished choice's reply written in `syntax`: tool calls (`finish_reason: "tool_calls"`; ids
/// the model wrote are kept), a text answer, or — when the reply is not the grammar's (cut by
/// `max_tokens` or a stop string) — the generic mode's text answer written so far, or else the
/// raw text, with the engine's reason.
pub(crate) fn tool_reply(
    syntax: ReplySyntax,
    text: String,
    reason: FinishReason,
    call_id: impl Fn(usize) -> String,
) -> (ChatMessage, String) {
    let message = |calls: Vec<ParsedCall>| {
        let calls: Vec<ToolCall> = (calls.into_iter().enumerate())
            .map(|(j, c)| ToolCall {
                id: c.id.unwrap_or_else(|| call_id(j)),
                kind: FunctionKind::Function,
                function: FunctionCall {
                    name: c.name,
                    arguments: c.arguments,
                },
            })
            .collect();
        ChatMessage {
            content: None,
            tool_calls: (!calls.is_empty()).then_some(calls),
            ..ChatMessage::new(Role::Assistant, "")
        }
    };
    match parse_reply_in(syntax, &text) {
        Reply::Calls(calls) => (message(calls), "tool_calls".to_string()),
        Reply::Text(t) => (
            ChatMessage::new(Role::Assistant, t),
            finish_reason_name(reason).to_string(),
        ),
        // Cut by `max_tokens` (or a stop string): the complete calls, never the JSON as text;
        // the finish reason says it was cut.
        Reply::Cut(calls) => (message(calls), finish_reason_name(reason).to_string()),
        Reply::Unparsed => (
            ChatMessage::new(
                Role::Assistant,
                match syntax {
                    ReplySyntax::Generic => partial_text(&text),
                    ReplySyntax::Family(_) => None,
                }
                .unwrap_or(text),
            ),
            finish_reason_name(reason).to_string(),
        ),
    }
}
