//! What the server is told at start: served model name, tenants and their keys, admin keys, the
//! trusted-proxy header and the limits. Plain data plus validation; never reads files (the binary
//! parses YAML into this).

use std::time::Duration;

/// One tenant: its API keys and the salt that enters its cache namespace.
#[derive(Debug, Clone, PartialEq)]
pub struct TenantSpec {
    pub name: String,
    pub api_keys: Vec<String>,
    /// Server-side salt (default: none beyond the tenant id, which already separates namespaces).
    pub salt: Option<String>,
    /// Scheduling and retention priority of the tenant's requests (vLLM's convention: lower is
    /// more important; `engine::MIN_PRIORITY..=MAX_PRIORITY`, default 0). A request's own
    /// `priority` is added to it.
    pub priority: i32,
}

/// Request and queue limits.
#[derive(Debug, Clone, PartialEq)]
pub struct Limits {
    /// Largest accepted request body.
    pub max_body_bytes: usize,
    /// Requests in flight (running or queued) over all tenants; beyond it → 503.
    pub max_requests: usize,
    /// Tokens in flight (prompt + max_tokens) over all tenants; beyond it → 503.
    pub max_tokens: usize,
    /// Requests in flight of one tenant; beyond it → 429.
    pub max_requests_per_tenant: usize,
    /// Tokens in flight of one tenant; beyond it → 429.
    pub max_tokens_per_tenant: usize,
    /// `max_tokens` when a request gives none (capped by what the context leaves).
    pub default_max_tokens: usize,
    /// Seconds sent in `Retry-After` with 429 and 503.
    pub retry_after_secs: u64,
    /// Stored Responses-API responses kept per tenant (oldest evicted beyond it).
    pub max_stored_responses_per_tenant: usize,
    /// Bytes of stored responses and their conversations kept per tenant.
    pub max_stored_response_bytes_per_tenant: usize,
    /// Open connections; one more gets an immediate 503 and is closed.
    pub max_connections: usize,
    /// Open connections from one client address (`None`: half of `max_connections`), so one
    /// client holding idle sockets cannot lock every other client out.
    pub max_connections_per_source: Option<usize>,
    /// A request head (fresh or keep-alive connection) must arrive within this, else the
    /// connection is closed.
    pub header_timeout: Duration,
    /// A request body must arrive within this, else 408 and the connection is closed.
    pub body_timeout: Duration,
    /// Longest retention a request may ask for (`cache_control.ttl`, `prompt_cache_retention`,
    /// a session key); longer asks are capped to it, 0 turns request retention off.
    pub max_cache_ttl_secs: u64,
    /// Most tool calls one assistant turn may hold when parallel calls are allowed (the
    /// grammar stops the list there; 1 when `parallel_tool_calls` is false). A request's
    /// `max_tool_calls` (Responses) may lower it.
    pub max_tool_calls_per_turn: usize,
}

impl Limits {
    /// The per-source connection cap in effect.
    pub fn connections_per_source(&self) -> usize {
        self.max_connections_per_source
            .unwrap_or(self.max_connections / 2)
            .max(1)
    }
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_body_bytes: 4 << 20,
            max_requests: 256,
            max_tokens: 1 << 20,
            max_requests_per_tenant: 64,
            max_tokens_per_tenant: 256 << 10,
            default_max_tokens: 1024,
            retry_after_secs: 1,
            max_stored_responses_per_tenant: 1024,
            max_stored_response_bytes_per_tenant: 64 << 20,
            max_connections: 1024,
            max_connections_per_source: None,
            header_timeout: Duration::from_secs(10),
            body_timeout: Duration::from_secs(30),
            max_cache_ttl_secs: 3600,
            max_tool_calls_per_turn: 8,
        }
    }
}

/// What a generation request's unknown or unsupported top-level field gets.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum UnknownFields {
    /// 400 naming the field (`param`), so a client learns the server would not honour it.
    #[default]
    Reject,
    /// Ignored, as many OpenAI-compatible servers do; known fields are still type-checked.
    Ignore,
}

#[derive(Debug, Clone, PartialEq)]
pub struct ServerSettings {
    /// The `model` id served in `/v1/models` and echoed in responses.
    pub model_name: String,
    /// Other names a request's `model` may give for the served model (listed in `/v1/models`
    /// after `model_name`); any other name gets 404 `model_not_found`.
    pub model_aliases: Vec<String>,
    /// Policy for unknown fields on `/v1/chat/completions` and `/v1/completions`.
    pub unknown_fields: UnknownFields,
    /// No tenants with keys: the server runs open as one `default` tenant.
    pub tenants: Vec<TenantSpec>,
    /// Keys for `/v1/cache/*`. With none and no tenant keys, admin routes are open too.
    pub admin_api_keys: Vec<String>,
    /// When set, this header names the tenant of a call made with one of
    /// `trusted_proxy_api_keys` (and only then: with a tenant key it is a 403). Needs proxy keys.
    pub trusted_tenant_header: Option<String>,
    /// Keys of trusted proxies: a call with one of them runs as the tenant its
    /// `trusted_tenant_header` names (required). Never a tenant or admin key.
    pub trusted_proxy_api_keys: Vec<String>,
    /// When non-empty, `GET /metrics` needs one of these keys (or an admin key); else it is open.
    pub metrics_api_keys: Vec<String>,
    /// Series labelled by tenant name in `/metrics` (default true); off, only totals are shown.
    pub metrics_per_tenant: bool,
    pub limits: Limits,
    /// How long running requests may take to finish after a shutdown signal.
    pub shutdown_timeout: Duration,
}

impl Default for ServerSettings {
    fn default() -> Self {
        ServerSettings {
            model_name: "agentkv".into(),
            model_aliases: Vec::new(),
            unknown_fields: UnknownFields::Reject,
            tenants: Vec::new(),
            admin_api_keys: Vec::new(),
            trusted_tenant_header: None,
            trusted_proxy_api_keys: Vec::new(),
            metrics_api_keys: Vec::new(),
            metrics_per_tenant: true,
            limits: Limits::default(),
            shutdown_timeout: Duration::from_secs(30),
        }
    }
}

#[derive(Debug, Clone, thiserror::Error, PartialEq)]
pub enum SettingsError {
    #[error("tenant name {0:?} is used twice")]
    DuplicateTenant(String),
    #[error("an API key is given to both tenant {0:?} and tenant {1:?}")]
    DuplicateKey(String, String),
    #[error("tenant {0:?} has an empty API key")]
    EmptyKey(String),
    #[error("limit {0} must be positive")]
    ZeroLimit(&'static str),
    #[error("tenant name must not be empty")]
    EmptyTenantName,
    #[error("model name must not be empty")]
    EmptyModelName,
    #[error("model name {0:?} is given twice (model_name and model_aliases)")]
    DuplicateModelName(String),
    #[error(
        "trusted_tenant_header is set but no trusted_proxy_api_keys are: the header is honoured \
         only from a trusted proxy's key (tenants are identified by their API keys)"
    )]
    TenantHeaderWithoutProxyKeys,
    #[error("trusted_proxy_api_keys need trusted_tenant_header (the header the proxy sets)")]
    ProxyKeysWithoutHeader,
    #[error("trusted_tenant_header {0:?} is not a valid header name")]
    BadTenantHeader(String),
    #[error("a trusted proxy key is empty, repeated, or also a tenant or admin key")]
    BadProxyKey,
    #[error("a metrics API key is empty")]
    EmptyMetricsKey,
}

impl ServerSettings {
    /// Every name a request's `model` may give: `model_name`, then the aliases.
    pub fn served_model_names(&self) -> Vec<&str> {
        std::iter::once(self.model_name.as_str())
            .chain(self.model_aliases.iter().map(String::as_str))
            .collect()
    }

    pub fn validate(&self) -> Result<(), SettingsError> {
        let l = &self.limits;
        for (name, v) in [
            ("max_body_bytes", l.max_body_bytes),
            ("max_requests", l.max_requests),
            ("max_tokens", l.max_tokens),
            ("max_requests_per_tenant", l.max_requests_per_tenant),
            ("max_tokens_per_tenant", l.max_tokens_per_tenant),
            ("default_max_tokens", l.default_max_tokens),
            (
                "max_stored_responses_per_tenant",
                l.max_stored_responses_per_tenant,
            ),
            (
                "max_stored_response_bytes_per_tenant",
                l.max_stored_response_bytes_per_tenant,
            ),
            ("max_connections", l.max_connections),
            ("header_timeout", l.header_timeout.as_millis() as usize),
            ("body_timeout", l.body_timeout.as_millis() as usize),
        ] {
            if v == 0 {
                return Err(SettingsError::ZeroLimit(name));
            }
        }
        let names = self.served_model_names();
        for (i, name) in names.iter().enumerate() {
            if name.is_empty() {
                return Err(SettingsError::EmptyModelName);
            }
            if names[..i].contains(name) {
                return Err(SettingsError::DuplicateModelName(name.to_string()));
            }
        }
        let mut seen_keys: Vec<(&str, &str)> = Vec::new();
        for (i, t) in self.tenants.iter().enumerate() {
            if t.name.is_empty() {
                return Err(SettingsError::EmptyTenantName);
            }
            if self.tenants[..i].iter().any(|o| o.name == t.name) {
                return Err(SettingsError::DuplicateTenant(t.name.clone()));
            }
            for k in &t.api_keys {
                if k.is_empty() {
                    return Err(SettingsError::EmptyKey(t.name.clone()));
                }
                if let Some((_, other)) = seen_keys.iter().find(|(key, _)| key == k) {
                    return Err(SettingsError::DuplicateKey(
                        other.to_string(),
                        t.name.clone(),
                    ));
                }
                seen_keys.push((k, &t.name));
            }
        }
        match (
            &self.trusted_tenant_header,
            self.trusted_proxy_api_keys.is_empty(),
        ) {
            (Some(_), true) => return Err(SettingsError::TenantHeaderWithoutProxyKeys),
            (None, false) => return Err(SettingsError::ProxyKeysWithoutHeader),
            (Some(h), false) => {
                if axum::http::HeaderName::from_bytes(h.as_bytes()).is_err() {
                    return Err(SettingsError::BadTenantHeader(h.clone()));
                }
            }
            (None, true) => {}
        }
        if self.metrics_api_keys.iter().any(String::is_empty) {
            return Err(SettingsError::EmptyMetricsKey);
        }
        for (i, k) in self.trusted_proxy_api_keys.iter().enumerate() {
            if k.is_empty()
                || self.trusted_proxy_api_keys[..i].contains(k)
                || seen_keys.iter().any(|(key, _)| key == k)
                || self.admin_api_keys.contains(k)
            {
                return Err(SettingsError::BadProxyKey);
            }
        }
        Ok(())
    }
}
