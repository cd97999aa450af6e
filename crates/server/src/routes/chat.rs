//! `POST /v1/chat/completions`: whole answers and SSE chunks in the OpenAI chat shape. With tools
//! (the generic mode of `tools.rs` or a template family's syntax, `tool_families.rs`) each
//! choice's reply is parsed into `tool_calls` (`finish_reason: "tool_calls"`) or text; streamed,
//! `tool_stream.rs` turns it into OpenAI's deltas as it is generated.

use api::{
    ChatChoice, ChatChunkChoice, ChatCompletionChunk, ChatCompletionRequest,
    ChatCompletionResponse, ChatDelta, ChatMessage, FunctionCallDelta, FunctionKind, Role,
    ToolCallDelta,
};
use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::State;
use axum::http::HeaderMap;
use axum::response::{IntoResponse, Response};
use axum::Json;

use crate::error::ApiError;
use crate::output::{chat_logprobs, collect};
use crate::pipeline::{prepare_chat, start_chat, tool_reply, Hints};
use crate::routes::read_generation_request;
use crate::run::{finish_reason_name, Step};
use crate::sse::{self, json};
use crate::state::{unix_now, AppState};
use crate::tool_stream::{Piece, ReplyStream};
use crate::tools::ReplySyntax;

pub async fn chat_completions(
    State(state): State<AppState>,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    let (tenant, req, marked) =
        read_generation_request(&state, &headers, body, |r: &ChatCompletionRequest| &r.model)?;
    let (prepared, tool_mode) = prepare_chat(&state, &tenant, &req)?;
    if let Some(m) = &req.metadata {
        super::stored_chat::check_metadata(m)?;
    }
    // `store: true`: the finished completion is kept for `GET /v1/chat/completions/{id}`.
    let store = req.store.unwrap_or(false).then(|| -> Store {
        let state = state.clone();
        let (tenant, messages) = (tenant.id, req.messages.clone());
        let metadata = req.metadata.clone().unwrap_or_default();
        Box::new(move |completion: api::ChatCompletionResponse| {
            state.chat_completions.insert(
                tenant,
                crate::response_store::StoredCompletion {
                    completion,
                    messages,
                    metadata,
                },
            );
        })
    });
    let hints = Hints {
        headers: &headers,
        cache: &req.cache,
        marked: &marked,
    };
    let mut running = start_chat(
        &state,
        &tenant,
        hints,
        &req,
        prepared,
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
    )?;
    let ids = ChatIds::new();
    let created = unix_now();
    let model = state.settings.model_name.clone();
    if req.stream.unwrap_or(false) {
        let include_usage = req
            .stream_options
            .as_ref()
            .and_then(|o| o.include_usage)
            .unwrap_or(false);
        running.prime().await?;
        let out = ChatOut {
            ids,
            created,
            model,
            include_usage,
        };
        return Ok(stream_chat(&state, running, tool_mode, store, out));
    }
    let (id, call_id) = (ids.id.clone(), |choice: u32, j: usize| {
        ids.call_id(choice, j)
    });
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

/// A stored-completion sink (`store: true`).
type Store = Box<dyn FnOnce(ChatCompletionResponse) + Send>;

/// The public ids of one chat completion: its own and its tool calls'.
#[derive(Clone)]
struct ChatIds {
    id: String,
    call_prefix: String,
}

impl ChatIds {
    fn new() -> ChatIds {
        let public = crate::ids::public_id();
        ChatIds {
            id: format!("chatcmpl-{public}"),
            call_prefix: public[..24].to_string(),
        }
    }

    /// The id of call `j` of choice `choice` (when the model wrote none).
    fn call_id(&self, choice: u32, j: usize) -> String {
        format!("call_{}c{choice}n{j}", self.call_prefix)
    }
}

/// What every chunk of a streamed completion repeats.
struct ChatOut {
    ids: ChatIds,
    created: u64,
    model: String,
    include_usage: bool,
}

/// A streamed chat completion: the role prelude, then each choice's text (in the tool mode
/// through its reply stream, as tool-call deltas), finish reasons and, when asked, the usage.
fn stream_chat(
    state: &AppState,
    running: crate::run::Running,
    tool_mode: Option<ReplySyntax>,
    store: Option<Store>,
    out: ChatOut,
) -> Response {
    let ChatOut {
        ids,
        created,
        model,
        include_usage,
    } = out;
    let id = ids.id.clone();
    let call_id = move |choice: u32, j: usize| ids.call_id(choice, j);
    // With `store`, every chunk also goes into the completion that is stored at the end.
    let (acc, mut store_at_end) = match store {
        Some(put) => {
            let (acc, at_end) = stream_store(put, id.clone(), created, model.clone());
            (Some(acc), Some(at_end))
        }
        None => (None, None),
    };
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
                let (pieces, finish) = streams[choice as usize].finish(finish_reason_name(reason));
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
    sse::stream(running, prelude, on_step).into_response()
}

/// One choice's delta in a chunk.
fn delta(
    index: u32,
    delta: ChatDelta,
    finish: Option<&str>,
    logprobs: Option<api::ChatLogprobs>,
) -> ChatChunkChoice {
    ChatChunkChoice {
        index,
        delta,
        finish_reason: finish.map(str::to_string),
        logprobs,
    }
}

/// A delta of text.
fn text_delta(content: String) -> ChatDelta {
    ChatDelta {
        content: Some(content),
        ..ChatDelta::default()
    }
}

/// The accumulator a stored streamed completion's chunks go into, and what stores it once
/// the usage is known.
fn stream_store(
    put: Store,
    id: String,
    created: u64,
    model: String,
) -> (
    std::sync::Arc<std::sync::Mutex<Option<super::stored_chat::StreamAccumulator>>>,
    impl FnOnce(api::Usage) + Send,
) {
    let acc = std::sync::Arc::new(std::sync::Mutex::new(Some(
        super::stored_chat::StreamAccumulator::default(),
    )));
    let whole = acc.clone();
    let at_end = move |usage: api::Usage| {
        let whole = whole.lock().ok().and_then(|mut a| a.take());
        if let Some(a) = whole {
            put(a.finish(id, created, model, Some(usage)));
        }
    };
    (acc, at_end)
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
