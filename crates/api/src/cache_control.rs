//! Request fields that ask the server to keep a prompt's KV for an agent's next call, in the
//! shapes clients already send: OpenAI's `prompt_cache_key` and `prompt_cache_retention`, a
//! `session_id` (also the `x-session-id` header, read by the server), and Anthropic's
//! `cache_control` at the top level of the request (a breakpoint at the end of the prompt).
//! Flattened into the chat and responses requests. Shape only; the server validates the values.

use serde::{Deserialize, Serialize};

/// Session and retention fields of a generation request.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct CacheFields {
    /// OpenAI: groups requests that share a prefix; here it names the caller's session.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prompt_cache_key: Option<String>,
    /// The agent session this call belongs to (wins over `prompt_cache_key`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub session_id: Option<String>,
    /// OpenAI: `"in_memory"` or `"24h"`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prompt_cache_retention: Option<String>,
    /// Anthropic's automatic breakpoint: retain the whole prompt for `ttl`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cache_control: Option<CacheControl>,
    /// vLLM's request priority (lower is more important; added to the tenant's): admission
    /// order, preemption and the eviction order of what the request retains.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub priority: Option<i64>,
}

/// `{"type": "ephemeral", "ttl": "5m" | "1h"}`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct CacheControl {
    #[serde(rename = "type")]
    pub kind: String,
    /// `"5m"` (the default) or `"1h"`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ttl: Option<String>,
}

/// `GET /v1/sessions/{id}`: what a session retains now.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct SessionObject {
    /// The client's key (`session_id`, `x-session-id` or `prompt_cache_key`).
    pub id: String,
    /// `"session"`.
    pub object: String,
    /// Retained prompt and output tokens (whole KV blocks) in the active pool.
    pub retained_tokens: u64,
    pub retained_blocks: u64,
    /// Seconds until the retention ends (each call of the session renews it).
    pub ttl_left_s: f64,
    /// The priority the session retains at (vLLM's convention, the tenant's included: lower
    /// survives longer among retained blocks).
    pub priority: i32,
    /// Where the session's blocks are now: retained ones in the active pool, plus those lost
    /// to eviction since, by the place holding them.
    pub blocks_by_tier: SessionBlocksByTier,
}

/// A session's blocks by where they are (each block counted once, the fastest place first).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct SessionBlocksByTier {
    /// In the active pool: retained, or evicted and cached again since.
    pub active: u64,
    /// Evicted from the pool, held by the host-RAM tier.
    pub ram: u64,
    /// Evicted, held by the disk tier.
    pub disk: u64,
    /// Evicted, held by Redis.
    pub redis: u64,
    /// Evicted and held nowhere (no tier configured, or the tier dropped it): recomputed.
    pub none: u64,
}

/// `DELETE /v1/sessions/{id}`: the retention ended now.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SessionDeleted {
    pub id: String,
    /// `"session.deleted"`.
    pub object: String,
    pub deleted: bool,
    /// Tokens the session retained until now (their blocks stay cached, unretained).
    pub released_tokens: u64,
}
