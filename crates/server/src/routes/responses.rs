//! `POST /v1/responses` (OpenAI's Responses API) over the chat path: the input items (and the
//! stored conversation of `previous_response_id`) become chat messages, `instructions` a system
//! message, `tools` / `tool_choice` / `text.format` their chat equivalents, and the request runs
//! through [`prepare_chat`] — the same prompt rendering, tool mode and constraints. The reply
//! becomes output items (`message` or `function_call`), streamed as the typed events. With
//! `store` (the default) the response and its conversation are kept per tenant
//! (`response_store.rs`); `GET` and `DELETE /v1/responses/{id}` read and drop them, and
//! `GET /v1/responses/{id}/input_items` lists the input (`input_items.rs`).

use api::responses::{
    FunctionCallItem, IncompleteDetails, InputItem, InputRole, InputTokensDetails, OutputItem,
    OutputMessage, OutputText, OutputTokensDetails, Response as ApiResponse, ResponseDeleted,
    ResponseEvent, ResponseInput, ResponseTool, ResponseToolChoice, ResponseUsage,
    ResponsesRequest, StreamEvent, TextConfig, TextFormat, Truncation,
};
use api::{
    ChatCompletionRequest, ChatMessage, FunctionCall, FunctionDef, FunctionKind, FunctionName,
    NamedToolChoice, ResponseFormat, Role, Tool, ToolCall, ToolChoice, ToolChoiceMode,
};
use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::{Path, State};
use axum::http::HeaderMap;
use axum::response::{IntoResponse, Response};
use axum::Json;
use cache::TenantId;
use engine::FinishReason;

use crate::error::ApiError;
use crate::output::collect;
use crate::pipeline::{prepare_chat, start_chat, tool_reply, Hints};
use crate::response_store::StoredResponse;
use crate::routes::input_items::input_items;
use crate::routes::read_generation_request;
use crate::run::Step;
use crate::sse::{self, json, SseData};
use crate::state::{unix_now, AppState};
use crate::tool_stream::{Piece, ReplyStream};
use crate::tools::ReplySyntax;

pub async fn create(
    State(state): State<AppState>,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    let (tenant, req, marked) =
        read_generation_request(&state, &headers, body, |r: &ResponsesRequest| &r.model)?;
    if req.include.as_ref().is_some_and(|i| !i.is_empty()) {
        return Err(ApiError::UnsupportedParameter {
            param: "include".into(),
            message: "include is not supported (no extra output is available)".into(),
        });
    }
    if req.metadata.as_ref().is_some_and(|m| m.len() > 16) {
        return Err(ApiError::invalid(
            "metadata holds at most 16 pairs",
            "metadata",
        ));
    }
    let history = match &req.previous_response_id {
        Some(prev) => state
            .responses
            .get(tenant.id, prev)
            .ok_or_else(|| {
                ApiError::invalid(
                    format!("no stored response with id {prev:?}"),
                    "previous_response_id",
                )
            })?
            .conversation
            .clone(),
        None => Vec::new(),
    };
    let mut conversation = history.clone();
    conversation.extend(input_messages(&req.input)?);
    // `truncation: auto`: the oldest turns go until the conversation fits; the stored
    // conversation stays whole.
    let mut sent = conversation.clone();
    let (chat, prepared, tool_mode) = loop {
        let chat = chat_request(&req, &sent);
        match prepare_chat(&state, &tenant, &chat) {
            Err(ApiError::PromptTooLong { .. } | ApiError::ContextExceeded(_))
                if req.truncation == Some(Truncation::Auto) && drop_oldest_turn(&mut sent) => {}
            r => {
                let (prepared, tool_mode) = r.map_err(rename_param)?;
                break (chat, prepared, tool_mode);
            }
        }
    };
    if sent.len() < conversation.len() {
        tracing::debug!(
            dropped = conversation.len() - sent.len(),
            "truncation auto: oldest turns dropped to fit the context"
        );
    }
    let hints = Hints {
        headers: &headers,
        cache: &req.cache,
        marked: &marked,
    };
    let mut running = start_chat(
        &state,
        &tenant,
        hints,
        &chat,
        prepared,
        |list, index, text| {
            let ResponseInput::Items(items) = &req.input else {
                return None;
            };
            if list != "input" || index >= items.len() {
                return None;
            }
            let mut cut = items[..=index].to_vec();
            if let (InputItem::Message(m), Some(t)) = (&mut cut[index], text) {
                m.content = t.to_string();
            }
            let mut conversation = history.clone();
            conversation.extend(input_messages(&ResponseInput::Items(cut)).ok()?);
            Some(chat_request(&req, &conversation))
        },
    )?;
    let suffix = crate::ids::public_id();
    let draft = Draft {
        tenant: tenant.id,
        store: req.store.unwrap_or(true),
        skeleton: skeleton(&state, &req, &format!("resp_{suffix}")),
        conversation,
        msg_id: format!("msg_{suffix}"),
        input_items: input_items(&req.input, &suffix),
        call_suffix: suffix,
        tool_mode,
    };
    if req.stream.unwrap_or(false) {
        running.prime().await?;
        return Ok(stream(state, running, draft).into_response());
    }
    let collected = collect(&mut running).await?;
    let choice = collected
        .choices
        .into_iter()
        .next()
        .ok_or_else(|| ApiError::Internal("a response without its choice".into()))?;
    let reason = choice.finish_reason.unwrap_or(FinishReason::Stop);
    let finished = draft.finish_choice(choice.text, reason);
    if finished.reply.tool_calls.is_some() {
        running.tool_paused();
    }
    Ok(Json(draft.complete(&state, finished, &collected.usage)).into_response())
}

pub async fn get(
    State(state): State<AppState>,
    headers: HeaderMap,
    Path(id): Path<String>,
) -> Result<Response, ApiError> {
    let tenant = state.tenants.authenticate(&headers)?;
    let stored = state
        .responses
        .get(tenant.id, &id)
        .ok_or_else(|| not_found(&id))?;
    Ok(Json(stored.response.clone()).into_response())
}

pub async fn delete(
    State(state): State<AppState>,
    headers: HeaderMap,
    Path(id): Path<String>,
) -> Result<Response, ApiError> {
    let tenant = state.tenants.authenticate(&headers)?;
    if !state.responses.remove(tenant.id, &id) {
        return Err(not_found(&id));
    }
    Ok(Json(ResponseDeleted {
        id,
        object: "response.deleted".into(),
        deleted: true,
    })
    .into_response())
}

fn not_found(id: &str) -> ApiError {
    ApiError::NotFound(format!("no stored response with id {id:?}"))
}

/// Input items → chat messages: a `function_call` joins the assistant message of the calls just
/// before it (parallel calls), a `function_call_output` is a tool message answering `call_id`.
fn input_messages(input: &ResponseInput) -> Result<Vec<ChatMessage>, ApiError> {
    let items = match input {
        ResponseInput::Text(t) => return Ok(vec![ChatMessage::new(Role::User, t.clone())]),
        ResponseInput::Items(items) => items,
    };
    if items.is_empty() {
        return Err(ApiError::invalid("input must not be empty", "input"));
    }
    let mut out: Vec<ChatMessage> = Vec::with_capacity(items.len());
    for item in items {
        match item {
            InputItem::Message(m) => {
                let role = match m.role {
                    InputRole::User => Role::User,
                    InputRole::System => Role::System,
                    InputRole::Developer => Role::Developer,
                    InputRole::Assistant => Role::Assistant,
                };
                out.push(ChatMessage::new(role, m.content.clone()));
            }
            InputItem::FunctionCall(c) => {
                let call = ToolCall {
                    id: c.call_id.clone(),
                    kind: FunctionKind::Function,
                    function: FunctionCall {
                        name: c.name.clone(),
                        arguments: c.arguments.clone(),
                    },
                };
                match out.last_mut() {
                    Some(ChatMessage {
                        role: Role::Assistant,
                        tool_calls: Some(calls),
                        ..
                    }) => calls.push(call),
                    _ => out.push(ChatMessage {
                        content: None,
                        tool_calls: Some(vec![call]),
                        ..ChatMessage::new(Role::Assistant, "")
                    }),
                }
            }
            InputItem::FunctionCallOutput(o) => out.push(ChatMessage {
                tool_call_id: Some(o.call_id.clone()),
                ..ChatMessage::new(Role::Tool, o.output.clone())
            }),
        }
    }
    Ok(out)
}

/// The chat request this response runs as (`instructions` first, as the system message).
/// Drops the oldest turn of `conversation` for `truncation: auto`: its first message after any
/// leading system messages, with the tool results that answered it; never the last message (the
/// newest input). False when nothing can go.
fn drop_oldest_turn(conversation: &mut Vec<ChatMessage>) -> bool {
    let first = conversation
        .iter()
        .position(|m| m.role != Role::System)
        .unwrap_or(conversation.len());
    if first + 1 >= conversation.len() {
        return false;
    }
    conversation.remove(first);
    // Tool results whose call went with it would answer nothing.
    while first + 1 < conversation.len() && conversation[first].role == Role::Tool {
        conversation.remove(first);
    }
    true
}

fn chat_request(req: &ResponsesRequest, conversation: &[ChatMessage]) -> ChatCompletionRequest {
    let messages = req
        .instructions
        .iter()
        .map(|i| ChatMessage::new(Role::System, i.clone()))
        .chain(conversation.iter().cloned())
        .collect();
    let tools = req.tools.as_ref().map(|tools| {
        tools
            .iter()
            .map(|ResponseTool::Function(f)| Tool {
                kind: FunctionKind::Function,
                function: FunctionDef {
                    name: f.name.clone(),
                    description: f.description.clone(),
                    parameters: f.parameters.clone(),
                    strict: f.strict,
                },
            })
            .collect()
    });
    let tool_choice = req.tool_choice.as_ref().map(|c| match c {
        ResponseToolChoice::Mode(m) => ToolChoice::Mode(*m),
        ResponseToolChoice::Function(f) => ToolChoice::Named(NamedToolChoice {
            kind: FunctionKind::Function,
            function: FunctionName {
                name: f.name.clone(),
            },
        }),
    });
    let response_format = req
        .text
        .as_ref()
        .and_then(|t| t.format.as_ref())
        .map(|f| match f {
            TextFormat::Text => ResponseFormat::Text,
            TextFormat::JsonObject => ResponseFormat::JsonObject,
            TextFormat::JsonSchema(s) => ResponseFormat::JsonSchema {
                json_schema: s.clone(),
            },
        });
    ChatCompletionRequest {
        model: req.model.clone(),
        messages,
        max_tokens: req.max_output_tokens,
        temperature: req.temperature,
        top_p: req.top_p,
        tools,
        tool_choice,
        parallel_tool_calls: req.parallel_tool_calls,
        response_format,
        user: req.user.clone(),
        max_tool_calls: req.max_tool_calls,
        ..Default::default()
    }
}

/// A chat field named in an error → the Responses field the client sent.
fn responses_param(p: &str) -> String {
    if p.starts_with("messages") || p == "prompt" {
        return "input".into();
    }
    if let Some(rest) = p.strip_prefix("response_format") {
        return format!(
            "text.format{}",
            rest.strip_prefix(".json_schema").unwrap_or(rest)
        );
    }
    if p == "max_tokens" {
        return "max_output_tokens".into();
    }
    if p.starts_with("tools[") {
        return p.replacen(".function", "", 1);
    }
    p.to_string()
}

fn rename_param(e: ApiError) -> ApiError {
    match e {
        ApiError::InvalidRequest { message, param } => ApiError::InvalidRequest {
            message,
            param: param.map(|p| responses_param(&p)),
        },
        ApiError::UnsupportedParameter { param, message } => ApiError::UnsupportedParameter {
            param: responses_param(&param),
            message,
        },
        other => other,
    }
}

/// The response object before any output: what the request asked for, `in_progress`.
fn skeleton(state: &AppState, req: &ResponsesRequest, id: &str) -> ApiResponse {
    ApiResponse {
        id: id.to_string(),
        object: "response".into(),
        created_at: unix_now(),
        status: "in_progress".into(),
        model: state.settings.model_name.clone(),
        output: Vec::new(),
        output_text: String::new(),
        instructions: req.instructions.clone(),
        tools: req.tools.clone().unwrap_or_default(),
        tool_choice: req
            .tool_choice
            .clone()
            .unwrap_or(ResponseToolChoice::Mode(ToolChoiceMode::Auto)),
        parallel_tool_calls: req.parallel_tool_calls.unwrap_or(true),
        temperature: req.temperature,
        top_p: req.top_p,
        max_output_tokens: req.max_output_tokens,
        previous_response_id: req.previous_response_id.clone(),
        store: req.store.unwrap_or(true),
        text: TextConfig {
            format: Some(
                req.text
                    .as_ref()
                    .and_then(|t| t.format.clone())
                    .unwrap_or(TextFormat::Text),
            ),
        },
        usage: None,
        incomplete_details: None,
        error: None,
        metadata: req.metadata.clone().unwrap_or_default(),
        truncation: Some(
            match req.truncation {
                Some(Truncation::Auto) => "auto",
                _ => "disabled",
            }
            .into(),
        ),
        user: req.user.clone(),
    }
}

/// What a finished reply became.
struct Finished {
    output: Vec<OutputItem>,
    /// The reply as the conversation keeps it.
    reply: ChatMessage,
    reason: FinishReason,
}

/// A response being produced.
struct Draft {
    tenant: TenantId,
    store: bool,
    skeleton: ApiResponse,
    /// The stored history and this request's items (never the instructions).
    conversation: Vec<ChatMessage>,
    msg_id: String,
    /// This request's input items as `…/input_items` lists them.
    input_items: Vec<serde_json::Value>,
    call_suffix: String,
    /// The reply's syntax when tools may be called.
    tool_mode: Option<ReplySyntax>,
}

impl Draft {
    fn status(reason: FinishReason) -> &'static str {
        match reason {
            FinishReason::Stop => "completed",
            FinishReason::Length | FinishReason::Cancelled => "incomplete",
        }
    }

    fn message(&self, text: String, reason: FinishReason) -> OutputItem {
        OutputItem::Message(OutputMessage {
            id: self.msg_id.clone(),
            status: Draft::status(reason).into(),
            role: "assistant".into(),
            content: vec![OutputText::new(text)],
        })
    }

    /// The output items of the finished choice: calls (tool mode) or a message.
    fn finish_choice(&self, text: String, reason: FinishReason) -> Finished {
        let Some(syntax) = self.tool_mode else {
            return Finished {
                output: vec![self.message(text.clone(), reason)],
                reply: ChatMessage::new(Role::Assistant, text),
                reason,
            };
        };
        let suffix = &self.call_suffix;
        let (reply, _) = tool_reply(syntax, text, reason, |j| format!("call_{suffix}n{j}"));
        let output = match &reply.tool_calls {
            Some(calls) => calls
                .iter()
                .map(|c| {
                    OutputItem::FunctionCall(FunctionCallItem {
                        id: Some(format!(
                            "fc_{}",
                            c.id.strip_prefix("call_").unwrap_or(&c.id)
                        )),
                        call_id: c.id.clone(),
                        name: c.function.name.clone(),
                        arguments: c.function.arguments.clone(),
                        status: Some("completed".into()),
                    })
                })
                .collect(),
            None => vec![self.message(reply.content.clone().unwrap_or_default(), reason)],
        };
        Finished {
            output,
            reply,
            reason,
        }
    }

    /// The events of streamed pieces in the tool mode: a text answer opens the message (item 0)
    /// and sends its deltas; a call opens its `function_call` item (the ids `finish_choice`
    /// gives it) and sends its arguments as `function_call_arguments.delta`.
    fn piece_events(
        &self,
        events: &mut Events,
        pieces: Vec<Piece>,
        message_open: &mut bool,
        calls_open: &mut Vec<FunctionCallItem>,
    ) -> Vec<SseData> {
        let mut out = Vec::new();
        for p in pieces {
            match p {
                Piece::Content(text) => {
                    if !*message_open {
                        *message_open = true;
                        out.extend(events.message_start(0, &self.msg_id));
                    }
                    out.push(events.text_delta(0, &self.msg_id, text));
                }
                Piece::CallStart { index, id, name } => {
                    let call_id =
                        id.unwrap_or_else(|| format!("call_{}n{index}", self.call_suffix));
                    let item = FunctionCallItem {
                        id: Some(format!(
                            "fc_{}",
                            call_id.strip_prefix("call_").unwrap_or(&call_id)
                        )),
                        call_id,
                        name,
                        arguments: String::new(),
                        status: Some("in_progress".into()),
                    };
                    out.push(events.next(StreamEvent::OutputItemAdded {
                        output_index: index as u32,
                        item: OutputItem::FunctionCall(item.clone()),
                    }));
                    calls_open.push(item);
                }
                Piece::Args { index, text } => {
                    let item_id = calls_open
                        .get(index)
                        .and_then(|c| c.id.clone())
                        .unwrap_or_default();
                    out.push(events.next(StreamEvent::FunctionCallArgumentsDelta {
                        item_id,
                        output_index: index as u32,
                        delta: text,
                    }));
                }
            }
        }
        out
    }

    /// The final response object (stored unless `store: false`).
    fn complete(&self, state: &AppState, f: Finished, usage: &api::Usage) -> ApiResponse {
        let mut r = self.skeleton.clone();
        r.status = Draft::status(f.reason).into();
        if f.reason == FinishReason::Length {
            r.incomplete_details = Some(IncompleteDetails {
                reason: "max_output_tokens".into(),
            });
        }
        r.output_text = f
            .output
            .iter()
            .filter_map(|o| match o {
                OutputItem::Message(m) => Some(m.content.iter().map(|c| c.text.as_str())),
                OutputItem::FunctionCall(_) => None,
            })
            .flatten()
            .collect();
        r.output = f.output;
        r.usage = Some(ResponseUsage {
            input_tokens: usage.prompt_tokens,
            input_tokens_details: InputTokensDetails {
                cached_tokens: usage.cached_tokens().unwrap_or(0),
                cache_write_tokens: usage
                    .prompt_tokens_details
                    .as_ref()
                    .and_then(|d| d.cache_write_tokens)
                    .unwrap_or(0),
            },
            output_tokens: usage.completion_tokens,
            output_tokens_details: OutputTokensDetails::default(),
            total_tokens: usage.total_tokens,
        });
        if self.store {
            let mut conversation = self.conversation.clone();
            conversation.push(f.reply);
            state.responses.insert(
                self.tenant,
                StoredResponse {
                    response: r.clone(),
                    conversation,
                    input_items: self.input_items.clone(),
                },
            );
        }
        r
    }
}

/// Numbers events and names them for SSE.
struct Events(u64);

impl Events {
    fn next(&mut self, event: StreamEvent) -> SseData {
        let name = event.name();
        let data = json(&ResponseEvent {
            event,
            sequence_number: self.0,
        });
        self.0 += 1;
        SseData {
            event: Some(name),
            data,
        }
    }

    /// `output_item.added` … `output_item.done` of one whole item (text as one delta).
    fn whole_item(&mut self, index: u32, item: &OutputItem) -> Vec<SseData> {
        let mut out = Vec::new();
        match item {
            OutputItem::FunctionCall(c) => {
                let item_id = c.id.clone().unwrap_or_default();
                let added = OutputItem::FunctionCall(FunctionCallItem {
                    arguments: String::new(),
                    status: Some("in_progress".into()),
                    ..c.clone()
                });
                out.push(self.next(StreamEvent::OutputItemAdded {
                    output_index: index,
                    item: added,
                }));
                out.push(self.next(StreamEvent::FunctionCallArgumentsDelta {
                    item_id: item_id.clone(),
                    output_index: index,
                    delta: c.arguments.clone(),
                }));
                out.push(self.next(StreamEvent::FunctionCallArgumentsDone {
                    item_id,
                    output_index: index,
                    name: c.name.clone(),
                    arguments: c.arguments.clone(),
                }));
            }
            OutputItem::Message(m) => {
                let text: String = m.content.iter().map(|c| c.text.as_str()).collect();
                out.extend(self.message_start(index, &m.id));
                if !text.is_empty() {
                    out.push(self.text_delta(index, &m.id, text.clone()));
                }
                out.extend(self.message_text_done(index, &m.id, text));
            }
        }
        out.push(self.next(StreamEvent::OutputItemDone {
            output_index: index,
            item: item.clone(),
        }));
        out
    }

    fn message_start(&mut self, index: u32, id: &str) -> Vec<SseData> {
        let item = OutputItem::Message(OutputMessage {
            id: id.to_string(),
            status: "in_progress".into(),
            role: "assistant".into(),
            content: Vec::new(),
        });
        vec![
            self.next(StreamEvent::OutputItemAdded {
                output_index: index,
                item,
            }),
            self.next(StreamEvent::ContentPartAdded {
                item_id: id.to_string(),
                output_index: index,
                content_index: 0,
                part: OutputText::new(""),
            }),
        ]
    }

    fn text_delta(&mut self, index: u32, id: &str, delta: String) -> SseData {
        self.next(StreamEvent::OutputTextDelta {
            item_id: id.to_string(),
            output_index: index,
            content_index: 0,
            delta,
            logprobs: Vec::new(),
        })
    }

    fn message_text_done(&mut self, index: u32, id: &str, text: String) -> Vec<SseData> {
        vec![
            self.next(StreamEvent::OutputTextDone {
                item_id: id.to_string(),
                output_index: index,
                content_index: 0,
                text: text.clone(),
                logprobs: Vec::new(),
            }),
            self.next(StreamEvent::ContentPartDone {
                item_id: id.to_string(),
                output_index: index,
                content_index: 0,
                part: OutputText::new(text),
            }),
        ]
    }
}

/// The typed event stream: `response.created`, `response.in_progress`, the output items (text
/// deltas as they come; in the tool mode through the reply stream: a call's item once its name is
/// written, then its arguments in pieces), then
/// `response.completed` (or `response.incomplete`) with the whole response.
fn stream(
    state: AppState,
    running: crate::run::Running,
    draft: Draft,
) -> axum::response::sse::Sse<
    impl futures_util::Stream<Item = Result<axum::response::sse::Event, std::convert::Infallible>>,
> {
    let mut events = Events(0);
    let mut prelude = vec![
        events.next(StreamEvent::Created {
            response: Box::new(draft.skeleton.clone()),
        }),
        events.next(StreamEvent::InProgress {
            response: Box::new(draft.skeleton.clone()),
        }),
    ];
    if draft.tool_mode.is_none() {
        prelude.extend(events.message_start(0, &draft.msg_id));
    }
    let mut text = String::new();
    let mut finished: Option<Finished> = None;
    // Tool mode: the reply stream, whether its text message was opened, and the calls opened.
    let mut replies = draft.tool_mode.map(ReplyStream::new);
    let mut message_open = false;
    let mut calls_open: Vec<FunctionCallItem> = Vec::new();
    let on_step = move |r: &crate::run::Running, step: Step| -> Vec<SseData> {
        let piece = match step {
            Step::Token(t) => t.text,
            Step::Text { text, .. } => text,
            Step::Finished { reason, .. } => {
                let mut out = Vec::new();
                if let Some(rs) = replies.as_mut() {
                    let (pieces, _) = rs.finish(crate::run::finish_reason_name(reason));
                    out =
                        draft.piece_events(&mut events, pieces, &mut message_open, &mut calls_open);
                }
                let f = draft.finish_choice(std::mem::take(&mut text), reason);
                if f.reply.tool_calls.is_some() {
                    r.tool_paused();
                }
                if draft.tool_mode.is_some() {
                    for (i, item) in f.output.iter().enumerate() {
                        let index = i as u32;
                        match item {
                            OutputItem::FunctionCall(c) if i < calls_open.len() => {
                                out.push(events.next(StreamEvent::FunctionCallArgumentsDone {
                                    item_id: c.id.clone().unwrap_or_default(),
                                    output_index: index,
                                    name: c.name.clone(),
                                    arguments: c.arguments.clone(),
                                }));
                                out.push(events.next(StreamEvent::OutputItemDone {
                                    output_index: index,
                                    item: item.clone(),
                                }));
                            }
                            OutputItem::Message(m) if message_open => {
                                let text: String =
                                    m.content.iter().map(|c| c.text.as_str()).collect();
                                out.extend(events.message_text_done(index, &m.id, text));
                                out.push(events.next(StreamEvent::OutputItemDone {
                                    output_index: index,
                                    item: item.clone(),
                                }));
                            }
                            _ => out.extend(events.whole_item(index, item)),
                        }
                    }
                } else {
                    out.extend(events.message_text_done(
                        0,
                        &draft.msg_id,
                        f.reply.content.clone().unwrap_or_default(),
                    ));
                    for item in &f.output {
                        out.push(events.next(StreamEvent::OutputItemDone {
                            output_index: 0,
                            item: item.clone(),
                        }));
                    }
                }
                finished = Some(f);
                return out;
            }
            Step::Done(usage) => {
                let Some(f) = finished.take() else {
                    return Vec::new();
                };
                let response = Box::new(draft.complete(&state, f, &usage));
                let event = if response.status == "completed" {
                    StreamEvent::Completed { response }
                } else {
                    StreamEvent::Incomplete { response }
                };
                return vec![events.next(event)];
            }
        };
        text.push_str(&piece);
        if let Some(rs) = replies.as_mut() {
            let pieces = rs.push(&piece);
            return draft.piece_events(&mut events, pieces, &mut message_open, &mut calls_open);
        }
        if piece.is_empty() {
            return Vec::new();
        }
        vec![events.text_delta(0, &draft.msg_id, piece)]
    };
    sse::stream_ending(running, prelude, on_step, sse::Ending::Typed)
}
