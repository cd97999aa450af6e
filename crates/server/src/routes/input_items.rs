//! `GET /v1/responses/{id}/input_items`: the input items a stored response was created with, in
//! OpenAI's list shape, paged by `limit` (1 to 100, default 20), `order` (`desc`, the default,
//! newest first, or `asc`) and `after` (an item id: the page starts after it, in that order).
//! Items keep the ids the client gave them; the server names the others when it stores the
//! response (`msg_…`, `fc_…`, `fco_…`).

use api::responses::{InputItem, InputRole, ResponseInput, ResponseItemList};
use axum::extract::rejection::QueryRejection;
use axum::extract::{Path, Query, State};
use axum::http::HeaderMap;
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde::Deserialize;
use serde_json::{json, Value};

use crate::error::ApiError;
use crate::state::AppState;

/// The query of a list request.
#[derive(Debug, Default, Deserialize)]
pub struct ListQuery {
    limit: Option<u32>,
    order: Option<String>,
    after: Option<String>,
    include: Option<String>,
}

pub async fn list(
    State(state): State<AppState>,
    headers: HeaderMap,
    Path(id): Path<String>,
    query: Result<Query<ListQuery>, QueryRejection>,
) -> Result<Response, ApiError> {
    let tenant = state.tenants.authenticate(&headers)?;
    let Query(q) = query.map_err(|e| ApiError::InvalidRequest {
        message: format!("invalid query: {}", e.body_text()),
        param: None,
    })?;
    let stored = state
        .responses
        .get(tenant.id, &id)
        .ok_or_else(|| ApiError::NotFound(format!("no stored response with id {id:?}")))?;
    Ok(Json(page(&stored.input_items, &q)?).into_response())
}

/// One page of `items` (oldest first) under the query.
fn page(items: &[Value], q: &ListQuery) -> Result<ResponseItemList, ApiError> {
    if q.include.as_ref().is_some_and(|i| !i.is_empty()) {
        return Err(ApiError::UnsupportedParameter {
            param: "include".into(),
            message: "include is not supported (no extra output is available)".into(),
        });
    }
    let items = (items.iter())
        .map(|v| (v["id"].as_str().unwrap_or_default().to_string(), v.clone()))
        .collect();
    list_page(
        items,
        q.limit,
        q.order.as_deref(),
        q.after.as_deref(),
        true,
        "input item",
    )
}

/// One page of OpenAI's list shape over `items` (`(id, item)`, oldest first): `limit` 1 to 100
/// (default 20), `order` `asc` or `desc` (default `desc` when `desc_by_default`), `after` an id
/// of `what` (the page starts after it, in that order).
pub(crate) fn list_page(
    mut items: Vec<(String, Value)>,
    limit: Option<u32>,
    order: Option<&str>,
    after: Option<&str>,
    desc_by_default: bool,
    what: &str,
) -> Result<ResponseItemList, ApiError> {
    let limit = limit.unwrap_or(20);
    if !(1..=100).contains(&limit) {
        return Err(ApiError::invalid(
            format!("limit must be between 1 and 100, got {limit}"),
            "limit",
        ));
    }
    let desc = match order {
        None => desc_by_default,
        Some("desc") => true,
        Some("asc") => false,
        Some(other) => {
            return Err(ApiError::invalid(
                format!("order must be \"asc\" or \"desc\", got {other:?}"),
                "order",
            ))
        }
    };
    if desc {
        items.reverse();
    }
    let start = match after {
        None => 0,
        Some(after) => {
            items
                .iter()
                .position(|(id, _)| id == after)
                .ok_or_else(|| ApiError::invalid(format!("no {what} with id {after:?}"), "after"))?
                + 1
        }
    };
    let rest = &items[start..];
    let shown = &rest[..rest.len().min(limit as usize)];
    Ok(ResponseItemList {
        object: "list".into(),
        data: shown.iter().map(|(_, v)| v.clone()).collect(),
        first_id: shown.first().map(|(id, _)| id.clone()),
        last_id: shown.last().map(|(id, _)| id.clone()),
        has_more: rest.len() > shown.len(),
    })
}

/// The request's input as OpenAI's items, each with an id (the client's, or one named after the
/// response: `{prefix}_{suffix}_{k}`).
pub fn input_items(input: &ResponseInput, suffix: &str) -> Vec<Value> {
    let id = |given: &Option<String>, prefix: &str, k: usize| {
        given
            .clone()
            .unwrap_or_else(|| format!("{prefix}_{suffix}_{k}"))
    };
    let message = |id: String, role: &str, text: &str| {
        let part = if role == "assistant" {
            "output_text"
        } else {
            "input_text"
        };
        json!({"type": "message", "id": id, "role": role, "status": "completed",
               "content": [{"type": part, "text": text}]})
    };
    match input {
        ResponseInput::Text(t) => vec![message(format!("msg_{suffix}_0"), "user", t)],
        ResponseInput::Items(items) => items
            .iter()
            .enumerate()
            .map(|(k, item)| match item {
                InputItem::Message(m) => {
                    let role = match m.role {
                        InputRole::User => "user",
                        InputRole::System => "system",
                        InputRole::Developer => "developer",
                        InputRole::Assistant => "assistant",
                    };
                    message(id(&m.id, "msg", k), role, &m.content)
                }
                InputItem::FunctionCall(c) => json!({"type": "function_call",
                    "id": id(&c.id, "fc", k), "call_id": c.call_id, "name": c.name,
                    "arguments": c.arguments, "status": "completed"}),
                InputItem::FunctionCallOutput(o) => json!({"type": "function_call_output",
                    "id": id(&o.id, "fco", k), "call_id": o.call_id, "output": o.output,
                    "status": "completed"}),
            })
            .collect(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn items(n: usize) -> Vec<Value> {
        (0..n).map(|i| json!({"id": format!("i{i}")})).collect()
    }

    fn ids(l: &ResponseItemList) -> Vec<&str> {
        l.data.iter().map(|v| v["id"].as_str().unwrap()).collect()
    }

    fn q(limit: Option<u32>, order: Option<&str>, after: Option<&str>) -> ListQuery {
        ListQuery {
            limit,
            order: order.map(str::to_string),
            after: after.map(str::to_string),
            include: None,
        }
    }

    #[test]
    fn pages_follow_limit_order_and_after() {
        let all = items(5);
        let p = page(&all, &q(None, None, None)).unwrap();
        assert_eq!(ids(&p), ["i4", "i3", "i2", "i1", "i0"], "newest first");
        assert_eq!(
            (p.first_id.as_deref(), p.last_id.as_deref()),
            (Some("i4"), Some("i0"))
        );
        assert!(!p.has_more);
        let p = page(&all, &q(Some(2), Some("asc"), None)).unwrap();
        assert_eq!((ids(&p), p.has_more), (vec!["i0", "i1"], true));
        let p = page(&all, &q(Some(2), Some("asc"), Some("i1"))).unwrap();
        assert_eq!((ids(&p), p.has_more), (vec!["i2", "i3"], true));
        let p = page(&all, &q(Some(2), Some("asc"), Some("i3"))).unwrap();
        assert_eq!((ids(&p), p.has_more), (vec!["i4"], false));
        let p = page(&all, &q(Some(3), Some("desc"), Some("i2"))).unwrap();
        assert_eq!((ids(&p), p.has_more), (vec!["i1", "i0"], false));
        let p = page(&all, &q(None, None, Some("i0"))).unwrap();
        assert!(p.data.is_empty() && p.first_id.is_none() && !p.has_more);
        for (bad, param) in [
            (q(Some(0), None, None), "limit"),
            (q(Some(101), None, None), "limit"),
            (q(None, Some("up"), None), "order"),
            (q(None, None, Some("nope")), "after"),
        ] {
            let e = page(&all, &bad).unwrap_err();
            assert_eq!(e.body().error.param.as_deref(), Some(param));
        }
    }
}
