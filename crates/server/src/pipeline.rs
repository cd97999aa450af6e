//! The one generation pipeline every route goes through once it has mapped its wire type:
//! the prompt plan of a chat-shaped request ([`prepare_chat`]: template, tools, constraint),
//! the engine request ([`start_chat`]: priority, retention and `cache_control` breakpoints from
//! the request's hints, then submission) and the reading of a finished reply ([`tool_reply`]).
//! Chat completions, Responses and the render endpoint call these; each route keeps only the
//! mapping of its own wire types and its rendering (whole or streamed).
//!
//! Owns no HTTP and no state of its own; it never schedules (the engine does).

use api::{ChatCompletionRequest, ChatMessage, FunctionCall, FunctionKind, Role, ToolCall};
use axum::http::HeaderMap;
use engine::FinishReason;

use crate::breakpoints;
use crate::error::ApiError;
use crate::params::{chat_prompt, prepare, tool_constraint, GenOptions, Prepared};
use crate::run::{finish_reason_name, submit, Running};
use crate::state::AppState;
use crate::structured;
use crate::tenants::Tenant;
use crate::tools::{parse_reply_in, partial_text, ParsedCall, Reply, ReplySyntax};

/// A request's retention hints: its headers (`x-session-id`), its cache fields
/// (`prompt_cache_key`, `session_id`, `cache_control`, `priority`, …) and the `cache_control`
/// marks found in its prompt.
pub(crate) struct Hints<'a> {
    pub headers: &'a HeaderMap,
    pub cache: &'a api::CacheFields,
    pub marked: &'a [breakpoints::Marked],
}

/// Submits a chat-shaped request (`chat`, prepared as `prepared`) with its priority, its
/// session retention and one retention per `cache_control` breakpoint; `item_variant(list,
/// index, text)` builds the request cut after a marked item (see [`breakpoint_prefix`]).
pub(crate) fn start_chat(
    state: &AppState,
    tenant: &Tenant,
    hints: Hints<'_>,
    chat: &ChatCompletionRequest,
    mut prepared: Prepared,
    item_variant: impl Fn(&str, usize, Option<&str>) -> Option<ChatCompletionRequest>,
) -> Result<Running, ApiError> {
    let limits = &state.settings.limits;
    let spec = &mut prepared.spec;
    spec.priority = crate::sessions::priority(tenant, hints.cache)?;
    spec.retention = crate::sessions::retention(
        limits,
        tenant,
        hints.headers,
        hints.cache,
        &spec.prompt,
        spec.priority,
    )?;
    let prompt = &spec.prompt;
    spec.breakpoints = breakpoints::retentions(
        limits,
        tenant,
        spec.priority,
        prompt,
        hints.marked,
        |site| Ok(breakpoint_prefix(state, chat, prompt, site, &item_variant)),
    )?;
    submit(state, tenant, prepared)
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
