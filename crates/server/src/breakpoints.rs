//! `cache_control` breakpoints inside the prompt (Anthropic's shape on the OpenAI API): on a
//! message or Responses input item, on a text content part, on a tool definition. Owns reading
//! them from the raw request body, their limits (at most [`MAX_BREAKPOINTS`], the top-level one
//! included) and where each one falls in the prompt's tokens; never renders a prompt itself (the
//! route passes the rendering of a truncated request) and never touches the engine.
//!
//! Where a breakpoint falls: the prompt of the request cut just after the marked item (or with
//! the tool list cut after the marked tool and one probe tool appended) shares a prefix with the
//! full prompt; that shared prefix, in tokens, is what the breakpoint retains. A chat template
//! that renders a later item into an earlier place only shortens the prefix, never lengthens it.

use std::hash::{Hash, Hasher};
use std::time::Duration;

use api::CacheControl;
use engine::{Breakpoint, Retention};
use serde_json::Value;

use crate::error::ApiError;
use crate::sessions::{cache_control_ttl, session_id};
use crate::settings::Limits;
use crate::tenants::Tenant;

/// Most `cache_control` breakpoints in one request, the top-level one included (Anthropic's
/// limit).
pub const MAX_BREAKPOINTS: usize = 4;

/// Where a breakpoint sits in the request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Site {
    /// After item `index` of `list` (`messages` or `input`); `text` is the item's content up to
    /// and including the marked content part (`None`: the whole item is marked).
    Item {
        list: &'static str,
        index: usize,
        text: Option<String>,
    },
    /// After tool `index` of `tools`.
    Tool { index: usize },
}

/// One breakpoint: its place, its TTL (as asked, before the config's cap) and the field that
/// named it (for errors).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Marked {
    pub site: Site,
    pub ttl: Duration,
    pub param: String,
}

/// The breakpoints of a request body: `cache_control` on items of `messages` (or `input`), on
/// their text content parts and on `tools`. Bad values → 400 naming the field; more than
/// [`MAX_BREAKPOINTS`] (counting the top-level `cache_control`) → 400.
pub fn parse(body: &Value) -> Result<Vec<Marked>, ApiError> {
    let mut out = Vec::new();
    let array = |field: &str| body.get(field).and_then(Value::as_array);
    for field in ["messages", "input"] {
        for (i, item) in array(field).into_iter().flatten().enumerate() {
            if let Some(cc) = present(item) {
                let param = format!("{field}[{i}].cache_control");
                let site = Site::Item {
                    list: field,
                    index: i,
                    text: None,
                };
                out.push(marked(cc, site, param)?);
            }
            let parts = item.get("content").and_then(Value::as_array);
            let mut text = String::new();
            for (j, part) in parts.into_iter().flatten().enumerate() {
                if let Some(t) = part.get("text").and_then(Value::as_str) {
                    text.push_str(t);
                }
                if let Some(cc) = present(part) {
                    let param = format!("{field}[{i}].content[{j}].cache_control");
                    let site = Site::Item {
                        list: field,
                        index: i,
                        text: Some(text.clone()),
                    };
                    out.push(marked(cc, site, param)?);
                }
            }
        }
    }
    for (i, tool) in array("tools").into_iter().flatten().enumerate() {
        if let Some(cc) = present(tool) {
            let param = format!("tools[{i}].cache_control");
            out.push(marked(cc, Site::Tool { index: i }, param)?);
        }
    }
    let top_level = usize::from(present(body).is_some());
    if out.len() + top_level > MAX_BREAKPOINTS {
        let param = out[MAX_BREAKPOINTS - top_level].param.clone();
        return Err(ApiError::invalid(
            format!(
                "at most {MAX_BREAKPOINTS} cache_control breakpoints per request (the top-level \
                 one included), got {}",
                out.len() + top_level
            ),
            &param,
        ));
    }
    Ok(out)
}

/// [`parse`], then removes every `cache_control` inside the prompt from `body` (the typed request
/// structs never see them; the top-level one stays, `CacheFields` reads it).
pub fn take(body: &mut Value) -> Result<Vec<Marked>, ApiError> {
    let marked = parse(body)?;
    for field in ["messages", "input", "tools"] {
        let items = body.get_mut(field).and_then(Value::as_array_mut);
        for item in items.into_iter().flatten() {
            let parts = item.get_mut("content").and_then(Value::as_array_mut);
            for part in parts.into_iter().flatten() {
                if let Some(o) = part.as_object_mut() {
                    o.remove("cache_control");
                }
            }
            if let Some(o) = item.as_object_mut() {
                o.remove("cache_control");
            }
        }
    }
    Ok(marked)
}

fn present(v: &Value) -> Option<&Value> {
    v.get("cache_control").filter(|c| !c.is_null())
}

fn marked(cc: &Value, site: Site, param: String) -> Result<Marked, ApiError> {
    let c: CacheControl = serde_json::from_value(cc.clone()).map_err(|e| {
        ApiError::invalid(
            format!("{param} must be {{\"type\": \"ephemeral\", \"ttl\": \"5m\" | \"1h\"}}: {e}"),
            &param,
        )
    })?;
    let ttl = cache_control_ttl(&c, &param)?;
    Ok(Marked { site, ttl, param })
}

/// Length of the common prefix of two token sequences.
pub fn common_prefix(a: &[u32], b: &[u32]) -> usize {
    a.iter().zip(b).take_while(|(x, y)| x == y).count()
}

/// The engine's retention of each breakpoint. `prefix_of(site)` returns how many tokens of
/// `prompt` the breakpoint covers (see the module docs). Each breakpoint retains under a session
/// named by its tenant and prefix, so repeating the prefix refreshes it; TTLs are capped by
/// `limits.max_cache_ttl_secs` (0: none is retained); `priority` is the request's.
pub fn retentions(
    limits: &Limits,
    tenant: &Tenant,
    priority: i32,
    prompt: &[u32],
    marked: &[Marked],
    mut prefix_of: impl FnMut(&Site) -> Result<usize, ApiError>,
) -> Result<Vec<Breakpoint>, ApiError> {
    let cap = Duration::from_secs(limits.max_cache_ttl_secs);
    let mut out = Vec::with_capacity(marked.len());
    for m in marked {
        let ttl = m.ttl.min(cap);
        if ttl.is_zero() {
            continue;
        }
        let prefix_tokens = prefix_of(&m.site)?.min(prompt.len());
        let mut h = std::collections::hash_map::DefaultHasher::new();
        prompt[..prefix_tokens].hash(&mut h);
        let name = format!("\u{0}breakpoint:{prefix_tokens}:{:016x}", h.finish());
        out.push(Breakpoint {
            retention: Retention {
                session: session_id(tenant, &name),
                ttl,
                priority: engine::retention_rank(priority, true),
            },
            prefix_tokens,
        });
    }
    Ok(out)
}

/// The probe tool appended after a marked tool: two of them with different names bound where
/// the next tool would start.
pub fn probe_tool(variant: u8) -> api::Tool {
    api::Tool {
        kind: api::FunctionKind::Function,
        function: api::FunctionDef {
            name: format!("{}_breakpoint_probe", (b'a' + variant) as char),
            description: None,
            parameters: None,
            strict: None,
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use cache::TenantId;
    use serde_json::json;

    fn param(e: ApiError) -> (u16, String) {
        let status = e.status().as_u16();
        (status, e.body().error.param.unwrap_or_default())
    }

    #[test]
    fn breakpoints_are_found_on_items_parts_and_tools() {
        let cc = json!({"type": "ephemeral"});
        let body = json!({
            "messages": [
                {"role": "system", "content": "sys", "cache_control": {"type": "ephemeral", "ttl": "1h"}},
                {"role": "user", "content": [
                    {"type": "text", "text": "ab"},
                    {"type": "text", "text": "cd", "cache_control": cc},
                    {"type": "text", "text": "ef"}
                ]}
            ],
            "tools": [{"type": "function", "function": {"name": "f"}, "cache_control": cc}]
        });
        let m = parse(&body).unwrap();
        assert_eq!(
            m.iter().map(|m| (&m.site, m.ttl)).collect::<Vec<_>>(),
            vec![
                (
                    &Site::Item {
                        list: "messages",
                        index: 0,
                        text: None
                    },
                    Duration::from_secs(3600)
                ),
                (
                    &Site::Item {
                        list: "messages",
                        index: 1,
                        text: Some("abcd".into())
                    },
                    Duration::from_secs(300)
                ),
                (&Site::Tool { index: 0 }, Duration::from_secs(300)),
            ]
        );
        assert_eq!(m[1].param, "messages[1].content[1].cache_control");
        let input = json!({"input": [{"role": "user", "content": "x", "cache_control": cc}]});
        assert_eq!(parse(&input).unwrap()[0].param, "input[0].cache_control");
        assert!(
            parse(&json!({"messages": [{"role": "user", "content": "x"}]}))
                .unwrap()
                .is_empty()
        );
    }

    #[test]
    fn bad_values_and_more_than_four_are_400_naming_the_field() {
        let bad = json!({"messages": [{"role": "user", "content": "x",
                         "cache_control": {"type": "persistent"}}]});
        assert_eq!(
            param(parse(&bad).unwrap_err()),
            (400, "messages[0].cache_control.type".into())
        );
        let bad_ttl = json!({"tools": [{"type": "function", "function": {"name": "f"},
                              "cache_control": {"type": "ephemeral", "ttl": "2h"}}]});
        assert_eq!(
            param(parse(&bad_ttl).unwrap_err()),
            (400, "tools[0].cache_control.ttl".into())
        );
        let not_object =
            json!({"messages": [{"role": "user", "content": "x", "cache_control": 5}]});
        assert_eq!(
            param(parse(&not_object).unwrap_err()),
            (400, "messages[0].cache_control".into())
        );
        let cc = json!({"type": "ephemeral"});
        let msgs: Vec<Value> = (0..4)
            .map(|i| json!({"role": "user", "content": format!("m{i}"), "cache_control": cc}))
            .collect();
        assert_eq!(parse(&json!({"messages": msgs})).unwrap().len(), 4);
        assert_eq!(
            param(parse(&json!({"messages": msgs, "cache_control": cc})).unwrap_err()),
            (400, "messages[3].cache_control".into())
        );
    }

    #[test]
    fn retentions_name_sessions_by_tenant_and_prefix_and_cap_ttls() {
        let tenant = |id| Tenant {
            id: TenantId(id),
            name: format!("t{id}"),
            salt: Vec::new(),
            priority: 0,
        };
        let marked = vec![
            Marked {
                site: Site::Tool { index: 0 },
                ttl: Duration::from_secs(3600),
                param: "tools[0].cache_control".into(),
            },
            Marked {
                site: Site::Item {
                    list: "messages",
                    index: 1,
                    text: None,
                },
                ttl: Duration::from_secs(300),
                param: "messages[1].cache_control".into(),
            },
        ];
        let prompt: Vec<u32> = (0..100).collect();
        let at = |s: &Site| {
            Ok(match s {
                Site::Tool { .. } => 20,
                Site::Item { .. } => 70,
            })
        };
        let limits = Limits {
            max_cache_ttl_secs: 600,
            ..Limits::default()
        };
        let r = retentions(&limits, &tenant(1), 0, &prompt, &marked, at).unwrap();
        assert_eq!(
            r.iter()
                .map(|b| (b.prefix_tokens, b.retention.ttl))
                .collect::<Vec<_>>(),
            vec![
                (20, Duration::from_secs(600)),
                (70, Duration::from_secs(300))
            ]
        );
        assert_ne!(r[0].retention.session, r[1].retention.session);
        let again = retentions(&limits, &tenant(1), 0, &prompt, &marked, at).unwrap();
        assert_eq!(again, r, "the same prefix names the same session");
        let other = retentions(&limits, &tenant(2), 0, &prompt, &marked, at).unwrap();
        assert_ne!(other[0].retention.session, r[0].retention.session);
        let off = Limits {
            max_cache_ttl_secs: 0,
            ..Limits::default()
        };
        assert!(retentions(&off, &tenant(1), 0, &prompt, &marked, at)
            .unwrap()
            .is_empty());
        assert_eq!(common_prefix(&[1, 2, 3], &[1, 2, 4, 5]), 2);
    }
}
