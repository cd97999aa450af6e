//! Request fields → the engine's soft session retention ([`engine::Retention`]): which session a
//! call belongs to (`session_id`, the `x-session-id` header, `prompt_cache_key`) and how long its
//! KV is kept after it ends (`cache_control`, `prompt_cache_retention`), bounded by
//! `limits.max_cache_ttl_secs`. Session ids are derived from the tenant and the client's key, so
//! tenants never share a session. Breakpoints inside the prompt (message-, content- and
//! tool-level `cache_control`) are the `breakpoints` module's.

use std::hash::{Hash, Hasher};
use std::time::Duration;

use api::CacheFields;
use axum::http::HeaderMap;
use cache::{SessionId, TenantId};
use engine::Retention;

use crate::error::ApiError;
use crate::settings::Limits;
use crate::tenants::Tenant;

/// The header that names a call's session (like the `session_id` field).
pub const SESSION_HEADER: &str = "x-session-id";
/// Longest accepted session key, in bytes.
pub const MAX_KEY_BYTES: usize = 256;
/// Retention of a call that names a session but no TTL (`cache_control`'s default, and OpenAI's
/// in-memory retention).
pub const DEFAULT_TTL: Duration = Duration::from_secs(300);

/// The priority of a request of `tenant` (vLLM's convention, lower is more important): the
/// tenant's plus the request's own `priority` (an integer in
/// `engine::MIN_PRIORITY..=MAX_PRIORITY`, else 400), clamped to that range. A configured
/// tenant's request can only make itself less important: never more than the operator set for
/// its tenant (a tenant at 20 sending -63 stays at 20). On an open server (no tenants, the
/// `default` tenant) the request's own priority is vLLM's, the whole range.
pub fn priority(tenant: &Tenant, f: &CacheFields) -> Result<i32, ApiError> {
    let (lo, hi) = (engine::MIN_PRIORITY, engine::MAX_PRIORITY);
    let own = match f.priority {
        None => 0,
        Some(p) if (i64::from(lo)..=i64::from(hi)).contains(&p) => p as i32,
        Some(p) => {
            return Err(ApiError::invalid(
                format!("priority must be an integer from {lo} to {hi}, got {p}"),
                "priority",
            ))
        }
    };
    let floor = if tenant.id == TenantId(0) {
        lo
    } else {
        tenant.priority
    };
    Ok((tenant.priority + own).clamp(floor.max(lo), hi))
}

/// The TTL a `cache_control` asks for (`5m` by default, or `1h`), before the config's cap; bad
/// values → 400 naming `{param}.type` / `{param}.ttl`.
pub(crate) fn cache_control_ttl(c: &api::CacheControl, param: &str) -> Result<Duration, ApiError> {
    if c.kind != "ephemeral" {
        return Err(ApiError::invalid(
            format!("{param}.type must be \"ephemeral\", got {:?}", c.kind),
            &format!("{param}.type"),
        ));
    }
    match c.ttl.as_deref() {
        None | Some("5m") => Ok(DEFAULT_TTL),
        Some("1h") => Ok(Duration::from_secs(3600)),
        Some(other) => Err(ApiError::invalid(
            format!("{param}.ttl must be \"5m\" or \"1h\", got {other:?}"),
            &format!("{param}.ttl"),
        )),
    }
}

/// The session of `key` within `tenant` (stable within a process).
pub fn session_id(tenant: &Tenant, key: &str) -> SessionId {
    let mut h = std::collections::hash_map::DefaultHasher::new();
    tenant.id.0.hash(&mut h);
    key.hash(&mut h);
    SessionId(h.finish())
}

fn check_key(key: &str, param: &str) -> Result<(), ApiError> {
    if key.is_empty() || key.len() > MAX_KEY_BYTES {
        return Err(ApiError::invalid(
            format!(
                "{param} must be 1 to {MAX_KEY_BYTES} bytes, got {} bytes",
                key.len()
            ),
            param,
        ));
    }
    Ok(())
}

/// The client's session key: `session_id`, else the `x-session-id` header, else
/// `prompt_cache_key` (a field and the header that disagree → 400).
pub fn session_key<'a>(
    headers: &'a HeaderMap,
    f: &'a CacheFields,
) -> Result<Option<&'a str>, ApiError> {
    let header = match headers.get(SESSION_HEADER) {
        None => None,
        Some(v) => Some(v.to_str().map_err(|_| {
            ApiError::invalid("the x-session-id header must be text", SESSION_HEADER)
        })?),
    };
    if let Some(h) = header {
        check_key(h, SESSION_HEADER)?;
    }
    if let Some(k) = &f.session_id {
        check_key(k, "session_id")?;
        if header.is_some_and(|h| h != k) {
            return Err(ApiError::invalid(
                "session_id and the x-session-id header name different sessions",
                "session_id",
            ));
        }
    }
    if let Some(k) = &f.prompt_cache_key {
        check_key(k, "prompt_cache_key")?;
    }
    Ok(f.session_id
        .as_deref()
        .or(header)
        .or(f.prompt_cache_key.as_deref()))
}

/// The retention a request asks for, `None` when it asks for none (or `max_cache_ttl_secs` is
/// 0). `prompt` names the anonymous session of a `cache_control` request without a key;
/// `priority` is the request's ([`priority`]).
pub fn retention(
    limits: &Limits,
    tenant: &Tenant,
    headers: &HeaderMap,
    f: &CacheFields,
    prompt: &[u32],
    priority: i32,
) -> Result<Option<Retention>, ApiError> {
    let key = session_key(headers, f)?;
    let explicit = match &f.cache_control {
        None => None,
        Some(c) => Some(cache_control_ttl(c, "cache_control")?),
    };
    let policy = match f.prompt_cache_retention.as_deref() {
        None => None,
        Some("in_memory") | Some("in-memory") => Some(DEFAULT_TTL),
        Some("24h") => Some(Duration::from_secs(24 * 3600)),
        Some(other) => {
            return Err(ApiError::invalid(
                format!("prompt_cache_retention must be \"in_memory\" or \"24h\", got {other:?}"),
                "prompt_cache_retention",
            ))
        }
    };
    let asked = match (explicit, policy, key) {
        (None, None, None) => return Ok(None),
        (None, None, Some(_)) => DEFAULT_TTL,
        (e, p, _) => e.max(p).unwrap_or(DEFAULT_TTL),
    };
    let ttl = asked.min(Duration::from_secs(limits.max_cache_ttl_secs));
    if ttl.is_zero() {
        return Ok(None);
    }
    let session = match key {
        Some(k) => session_id(tenant, k),
        None => {
            // No key: the prompt itself names the session, so repeating it refreshes it.
            let mut h = std::collections::hash_map::DefaultHasher::new();
            prompt.hash(&mut h);
            session_id(tenant, &format!("\u{0}prompt:{:016x}", h.finish()))
        }
    };
    Ok(Some(Retention {
        session,
        ttl,
        priority: engine::retention_rank(priority, explicit.is_some()),
    }))
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::http::HeaderValue;
    use cache::TenantId;

    fn tenant(id: u32) -> Tenant {
        Tenant {
            id: TenantId(id),
            name: format!("t{id}"),
            salt: Vec::new(),
            priority: 0,
        }
    }

    fn fields(v: serde_json::Value) -> CacheFields {
        serde_json::from_value(v).unwrap()
    }

    fn ask(v: serde_json::Value, headers: &HeaderMap) -> Result<Option<Retention>, ApiError> {
        retention(
            &Limits::default(),
            &tenant(1),
            headers,
            &fields(v),
            &[1, 2, 3],
            0,
        )
    }

    fn param(e: ApiError) -> (u16, String, String) {
        let status = e.status().as_u16();
        let body = e.body();
        (
            status,
            body.error.param.unwrap_or_default(),
            body.error.code.unwrap_or_default(),
        )
    }

    #[test]
    fn ttls_map_and_are_capped_by_the_config() {
        let none = HeaderMap::new();
        assert_eq!(ask(serde_json::json!({}), &none).unwrap(), None);
        let r = ask(serde_json::json!({"prompt_cache_key": "k"}), &none)
            .unwrap()
            .unwrap();
        assert_eq!((r.ttl, r.priority), (DEFAULT_TTL, 128));
        assert_eq!(r.session, session_id(&tenant(1), "k"));
        let r = ask(
            serde_json::json!({"cache_control": {"type": "ephemeral", "ttl": "1h"}}),
            &none,
        )
        .unwrap()
        .unwrap();
        assert_eq!((r.ttl, r.priority), (Duration::from_secs(3600), 129));
        let r = ask(
            serde_json::json!({"cache_control": {"type": "ephemeral"}}),
            &none,
        )
        .unwrap()
        .unwrap();
        assert_eq!(r.ttl, DEFAULT_TTL);
        // 24h is capped by max_cache_ttl_secs (1 h by default).
        let r = ask(
            serde_json::json!({"session_id": "s", "prompt_cache_retention": "24h"}),
            &none,
        )
        .unwrap()
        .unwrap();
        assert_eq!(r.ttl, Duration::from_secs(3600));
        let r = ask(
            serde_json::json!({"prompt_cache_key": "k", "prompt_cache_retention": "in_memory"}),
            &none,
        )
        .unwrap()
        .unwrap();
        assert_eq!(r.ttl, DEFAULT_TTL);
        let off = Limits {
            max_cache_ttl_secs: 0,
            ..Limits::default()
        };
        let f = fields(serde_json::json!({"cache_control": {"type": "ephemeral"}}));
        assert_eq!(
            retention(&off, &tenant(1), &none, &f, &[1], 0).unwrap(),
            None
        );
        let short = Limits {
            max_cache_ttl_secs: 60,
            ..Limits::default()
        };
        let r = retention(&short, &tenant(1), &none, &f, &[1], 0)
            .unwrap()
            .unwrap();
        assert_eq!(r.ttl, Duration::from_secs(60));
    }

    #[test]
    fn sessions_are_per_tenant_and_the_header_names_them_too() {
        assert_ne!(session_id(&tenant(1), "k"), session_id(&tenant(2), "k"));
        assert_ne!(session_id(&tenant(1), "k"), session_id(&tenant(1), "j"));
        let mut h = HeaderMap::new();
        h.insert(SESSION_HEADER, HeaderValue::from_static("s1"));
        let r = ask(serde_json::json!({"prompt_cache_key": "k"}), &h)
            .unwrap()
            .unwrap();
        assert_eq!(r.session, session_id(&tenant(1), "s1"), "header beats key");
        let r = ask(serde_json::json!({"session_id": "s1"}), &h)
            .unwrap()
            .unwrap();
        assert_eq!(r.session, session_id(&tenant(1), "s1"));
        let e = ask(serde_json::json!({"session_id": "s2"}), &h).unwrap_err();
        assert_eq!(param(e).1, "session_id");
        // Without a key, the prompt names the session: the same prompt, the same session.
        let f = fields(serde_json::json!({"cache_control": {"type": "ephemeral"}}));
        let none = HeaderMap::new();
        let l = Limits::default();
        let a = retention(&l, &tenant(1), &none, &f, &[1, 2], 0)
            .unwrap()
            .unwrap();
        let b = retention(&l, &tenant(1), &none, &f, &[1, 2], 0)
            .unwrap()
            .unwrap();
        let c = retention(&l, &tenant(1), &none, &f, &[1, 3], 0)
            .unwrap()
            .unwrap();
        assert_eq!(a.session, b.session);
        assert_ne!(a.session, c.session);
    }

    #[test]
    fn bad_values_are_400_naming_the_field() {
        let none = HeaderMap::new();
        for (v, p) in [
            (
                serde_json::json!({"cache_control": {"type": "persistent"}}),
                "cache_control.type",
            ),
            (
                serde_json::json!({"cache_control": {"type": "ephemeral", "ttl": "2h"}}),
                "cache_control.ttl",
            ),
            (
                serde_json::json!({"prompt_cache_retention": "forever"}),
                "prompt_cache_retention",
            ),
            (
                serde_json::json!({"prompt_cache_key": ""}),
                "prompt_cache_key",
            ),
            (
                serde_json::json!({"session_id": "x".repeat(MAX_KEY_BYTES + 1)}),
                "session_id",
            ),
        ] {
            let e = ask(v.clone(), &none).unwrap_err();
            assert_eq!(
                param(e),
                (400, p.to_string(), "invalid_value".to_string()),
                "{v}"
            );
        }
        let mut h = HeaderMap::new();
        h.insert(SESSION_HEADER, HeaderValue::from_static(""));
        assert_eq!(
            ask(serde_json::json!({}), &h)
                .unwrap_err()
                .body()
                .error
                .param
                .as_deref(),
            Some(SESSION_HEADER)
        );
    }

    #[test]
    fn priority_adds_the_tenants_and_rejects_values_out_of_range() {
        let mut t = tenant(1);
        let p = |t: &Tenant, v: serde_json::Value| priority(t, &fields(v));
        assert_eq!(p(&t, serde_json::json!({})).unwrap(), 0);
        // A configured tenant's request cannot outrank its tenant.
        assert_eq!(p(&t, serde_json::json!({"priority": -5})).unwrap(), 0);
        assert_eq!(p(&t, serde_json::json!({"priority": 5})).unwrap(), 5);
        t.priority = 20;
        assert_eq!(p(&t, serde_json::json!({"priority": -63})).unwrap(), 20);
        t.priority = 10;
        assert_eq!(p(&t, serde_json::json!({})).unwrap(), 10);
        assert_eq!(p(&t, serde_json::json!({"priority": -3})).unwrap(), 10);
        // An open server's requests have vLLM's whole range.
        let open = tenant(0);
        assert_eq!(p(&open, serde_json::json!({"priority": -5})).unwrap(), -5);
        assert_eq!(
            p(&t, serde_json::json!({"priority": 63})).unwrap(),
            63,
            "clamped"
        );
        for bad in [64, -64, 1_i64 << 40] {
            let e = p(&t, serde_json::json!({ "priority": bad })).unwrap_err();
            assert_eq!(param(e).0, 400);
        }
        // The retention of a more important request outranks a less important one's.
        let none = HeaderMap::new();
        let f = fields(serde_json::json!({"prompt_cache_key": "k"}));
        let rank = |p| {
            retention(&Limits::default(), &t, &none, &f, &[1], p)
                .unwrap()
                .unwrap()
                .priority
        };
        assert!(rank(-1) > rank(0) && rank(0) > rank(1));
    }
}
