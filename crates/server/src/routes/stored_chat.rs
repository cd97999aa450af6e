//! Stored chat completions (`store: true` on `/v1/chat/completions`), as OpenAI serves them:
//! `GET /v1/chat/completions` (the tenant's, paged by `limit` 1–100 (default 20), `order`
//! (`asc`, the default, oldest first, or `desc`) and `after` (a completion id), filtered by
//! `metadata[key]=value`), `GET /v1/chat/completions/{id}` (the completion with its `metadata`),
//! `GET /v1/chat/completions/{id}/messages` (the request's messages, paged the same way) and
//! `DELETE /v1/chat/completions/{id}`. A tenant sees only its own. Storing happens in
//! `routes/chat.rs`; the store is `response_store::CompletionStore`.

use std::collections::HashMap;

use axum::extract::rejection::QueryRejection;
use axum::extract::{Path, Query, State};
use axum::http::HeaderMap;
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde_json::{json, Value};

use crate::error::ApiError;
use crate::response_store::StoredCompletion;
use crate::state::AppState;

/// Most metadata pairs, and the longest key and value (OpenAI's bounds).
pub const MAX_METADATA_PAIRS: usize = 16;
pub const MAX_METADATA_KEY: usize = 64;
pub const MAX_METADATA_VALUE: usize = 512;

/// `metadata` within OpenAI's bounds, else a 400 naming it.
pub fn check_metadata(m: &std::collections::BTreeMap<String, String>) -> Result<(), ApiError> {
    let ok = m.len() <= MAX_METADATA_PAIRS
        && m.iter()
            .all(|(k, v)| k.len() <= MAX_METADATA_KEY && v.len() <= MAX_METADATA_VALUE);
    if ok {
        Ok(())
    } else {
        Err(ApiError::invalid(
            format!(
                "metadata holds at most {MAX_METADATA_PAIRS} pairs, keys of at most \
                 {MAX_METADATA_KEY} and values of at most {MAX_METADATA_VALUE} characters"
            ),
            "metadata",
        ))
    }
}

fn stored_json(s: &StoredCompletion) -> Value {
    let mut v = serde_json::to_value(&s.completion).unwrap_or(Value::Null);
    v["metadata"] = json!(s.metadata);
    v
}

fn query_error(e: QueryRejection) -> ApiError {
    ApiError::InvalidRequest {
        message: format!("invalid query: {}", e.body_text()),
        param: None,
    }
}

fn not_found(id: &str) -> ApiError {
    ApiError::NotFound(format!("no stored chat completion with id {id:?}"))
}

/// One page of `items` (oldest first, each with its id) under `limit`, `order` (`asc` by
/// default) and `after` (`routes::input_items::list_page`).
fn page(items: Vec<(String, Value)>, q: &HashMap<String, String>) -> Result<Value, ApiError> {
    let limit = match q.get("limit") {
        None => None,
        Some(l) => Some(l.parse::<u32>().map_err(|_| {
            ApiError::invalid(
                format!("limit must be between 1 and 100, got {l:?}"),
                "limit",
            )
        })?),
    };
    let list = super::input_items::list_page(
        items,
        limit,
        q.get("order").map(String::as_str),
        q.get("after").map(String::as_str),
        false,
        "item",
    )?;
    Ok(serde_json::to_value(list).unwrap_or(Value::Null))
}

/// `GET /v1/chat/completions`.
pub async fn list(
    State(state): State<AppState>,
    headers: HeaderMap,
    query: Result<Query<HashMap<String, String>>, QueryRejection>,
) -> Result<Response, ApiError> {
    let tenant = state.tenants.authenticate(&headers)?;
    let Query(q) = query.map_err(query_error)?;
    let filters: Vec<(&str, &String)> = (q.iter())
        .filter_map(|(k, v)| {
            k.strip_prefix("metadata[")
                .and_then(|k| k.strip_suffix(']'))
                .map(|k| (k, v))
        })
        .collect();
    if let Some(model) = q.get("model") {
        if model != &state.settings.model_name && !state.settings.model_aliases.contains(model) {
            return Ok(Json(page(Vec::new(), &q)?).into_response());
        }
    }
    let items = (state.chat_completions.all(tenant.id).into_iter())
        .filter(|s| filters.iter().all(|(k, v)| s.metadata.get(*k) == Some(v)))
        .map(|s| (s.completion.id.clone(), stored_json(&s)))
        .collect();
    Ok(Json(page(items, &q)?).into_response())
}

/// `GET /v1/chat/completions/{id}`.
pub async fn get(
    State(state): State<AppState>,
    headers: HeaderMap,
    Path(id): Path<String>,
) -> Result<Response, ApiError> {
    let tenant = state.tenants.authenticate(&headers)?;
    let s = (state.chat_completions.get(tenant.id, &id)).ok_or_else(|| not_found(&id))?;
    Ok(Json(stored_json(&s)).into_response())
}

/// `GET /v1/chat/completions/{id}/messages`: the request's messages, each with an id.
pub async fn messages(
    State(state): State<AppState>,
    headers: HeaderMap,
    Path(id): Path<String>,
    query: Result<Query<HashMap<String, String>>, QueryRejection>,
) -> Result<Response, ApiError> {
    let tenant = state.tenants.authenticate(&headers)?;
    let Query(q) = query.map_err(query_error)?;
    let s = (state.chat_completions.get(tenant.id, &id)).ok_or_else(|| not_found(&id))?;
    let items = (s.messages.iter().enumerate())
        .map(|(i, m)| {
            let mid = format!("{id}-{i}");
            let mut v = serde_json::to_value(m).unwrap_or(Value::Null);
            v["id"] = json!(mid);
            (mid, v)
        })
        .collect();
    Ok(Json(page(items, &q)?).into_response())
}

/// `DELETE /v1/chat/completions/{id}`.
pub async fn delete(
    State(state): State<AppState>,
    headers: HeaderMap,
    Path(id): Path<String>,
) -> Result<Response, ApiError> {
    let tenant = state.tenants.authenticate(&headers)?;
    if !state.chat_completions.remove(tenant.id, &id) {
        return Err(not_found(&id));
    }
    Ok(
        Json(json!({"object": "chat.completion.deleted", "id": id, "deleted": true}))
            .into_response(),
    )
}

/// A streamed completion put back together from its chunks, for storing.
#[derive(Debug, Default)]
pub struct StreamAccumulator {
    choices: Vec<api::ChatChoice>,
}

impl StreamAccumulator {
    /// Adds one chunk's choices (content appended, tool-call pieces merged by index).
    pub fn add(&mut self, choices: &[api::ChatChunkChoice]) {
        for c in choices {
            let i = c.index as usize;
            while self.choices.len() <= i {
                let index = self.choices.len() as u32;
                self.choices.push(api::ChatChoice {
                    index,
                    message: api::ChatMessage {
                        content: None,
                        ..api::ChatMessage::new(api::Role::Assistant, "")
                    },
                    finish_reason: None,
                    logprobs: None,
                });
            }
            let choice = &mut self.choices[i];
            if let Some(text) = c.delta.content.as_deref().filter(|t| !t.is_empty()) {
                choice
                    .message
                    .content
                    .get_or_insert_with(String::new)
                    .push_str(text);
            }
            for d in c.delta.tool_calls.iter().flatten() {
                let calls = choice.message.tool_calls.get_or_insert_with(Vec::new);
                let j = d.index as usize;
                while calls.len() <= j {
                    calls.push(api::ToolCall {
                        id: String::new(),
                        kind: api::FunctionKind::Function,
                        function: api::FunctionCall {
                            name: String::new(),
                            arguments: String::new(),
                        },
                    });
                }
                if let Some(id) = &d.id {
                    calls[j].id.clone_from(id);
                }
                if let Some(f) = &d.function {
                    if let Some(n) = &f.name {
                        calls[j].function.name.clone_from(n);
                    }
                    if let Some(a) = &f.arguments {
                        calls[j].function.arguments.push_str(a);
                    }
                }
            }
            if c.finish_reason.is_some() {
                choice.finish_reason.clone_from(&c.finish_reason);
            }
        }
    }

    /// The whole completion.
    pub fn finish(
        self,
        id: String,
        created: u64,
        model: String,
        usage: Option<api::Usage>,
    ) -> api::ChatCompletionResponse {
        api::ChatCompletionResponse {
            id,
            object: "chat.completion".into(),
            created,
            model,
            choices: self.choices,
            usage,
            system_fingerprint: None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pages_follow_limit_order_and_after() {
        let items: Vec<(String, Value)> = (0..5).map(|i| (format!("c{i}"), json!(i))).collect();
        let q = |pairs: &[(&str, &str)]| -> HashMap<String, String> {
            pairs
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect()
        };
        let p = page(items.clone(), &q(&[("limit", "2")])).unwrap();
        assert_eq!(p["data"], json!([0, 1]));
        assert_eq!(p["has_more"], true);
        let p = page(items.clone(), &q(&[("order", "desc"), ("after", "c3")])).unwrap();
        assert_eq!(p["data"], json!([2, 1, 0]));
        assert_eq!(p["first_id"], "c2");
        assert!(page(items.clone(), &q(&[("limit", "0")])).is_err());
        assert!(page(items, &q(&[("after", "nope")])).is_err());
    }

    #[test]
    fn a_stream_accumulates_into_the_whole_message() {
        let chunk = |content: Option<&str>,
                     call: Option<(Option<&str>, Option<&str>, &str)>,
                     finish: Option<&str>| {
            api::ChatChunkChoice {
                index: 0,
                delta: api::ChatDelta {
                    role: None,
                    content: content.map(str::to_string),
                    tool_calls: call.map(|(id, name, args)| {
                        vec![api::ToolCallDelta {
                            index: 0,
                            id: id.map(str::to_string),
                            kind: None,
                            function: Some(api::FunctionCallDelta {
                                name: name.map(str::to_string),
                                arguments: Some(args.to_string()),
                            }),
                        }]
                    }),
                },
                finish_reason: finish.map(str::to_string),
                logprobs: None,
            }
        };
        let mut acc = StreamAccumulator::default();
        acc.add(&[chunk(Some(""), None, None)]);
        acc.add(&[chunk(None, Some((Some("call_1"), Some("f"), "")), None)]);
        acc.add(&[chunk(None, Some((None, None, "{\"a\": ")), None)]);
        acc.add(&[chunk(None, Some((None, None, "1}")), Some("tool_calls"))]);
        let c = acc.finish("x".into(), 1, "m".into(), None);
        let m = &c.choices[0].message;
        assert_eq!(m.content, None);
        let call = &m.tool_calls.as_ref().unwrap()[0];
        assert_eq!(
            (call.id.as_str(), call.function.name.as_str()),
            ("call_1", "f")
        );
        assert_eq!(call.function.arguments, "{\"a\": 1}");
        assert_eq!(c.choices[0].finish_reason.as_deref(), Some("tool_calls"));
    }
}
