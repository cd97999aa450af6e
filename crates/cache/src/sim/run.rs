//! `simulate`: replay a trace through a [`KvCache`], one call after another, and count hits.
//!
//! Per call: look up the longest cached prefix in the call's tenant namespace (whole blocks, at
//! least one token left to compute); allocate blocks for the rest, evicting by policy when no block
//! is free; publish every full block (a block whose key is already cached is dropped and the cached
//! one touched); release everything (the partial last block returns to the free list). The call's
//! index is its tick, so every block a call used counts as used at that call.
//!
//! With [`SessionRetention`] (the session-aware policy): ticks are the calls' times in
//! milliseconds; each call's blocks are retained for its session until `t + ttl` (replacing the
//! session's previous retention, as the server does for a keyed session), expired retention ends
//! before each call, and a session's retention is released after its last call (the client
//! deletes the session when its task is done).

use std::collections::HashMap;

use serde::Serialize;
use thiserror::Error;

use super::trace::TraceCall;
use crate::config::{CacheConfig, EvictionPolicy};
use crate::error::{ConfigError, RetainError, SeqError};
use crate::ids::{SessionId, TenantId, Tick};
use crate::key::Namespace;
use crate::KvCache;

/// Simulated cache shape.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct SimConfig {
    pub block_size: u32,
    pub capacity_blocks: u32,
    pub policy: EvictionPolicy,
    /// Session-aware retention on top of `policy` (`None`: plain policy).
    pub session_retention: Option<SessionRetention>,
}

/// The session-aware policy's parameters.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct SessionRetention {
    /// How long a call's blocks stay retained for its session's next call.
    pub ttl_s: f64,
    /// At most this fraction of the pool carries retention.
    pub max_retained_fraction: f64,
}

/// What the simulator prints.
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub struct SimReport {
    pub calls: u64,
    pub prompt_tokens: u64,
    pub hit_tokens: u64,
    pub hit_rate: f64,
    pub evictions: u64,
    /// The protected segment's capacity in blocks at the end (moved by the adaptive policy).
    pub protected_capacity_blocks: u32,
}

/// A trace the simulated cache cannot run.
#[derive(Debug, Error, PartialEq)]
pub enum SimError {
    #[error(transparent)]
    Config(#[from] ConfigError),
    #[error("call {call}: {error}")]
    Call { call: usize, error: SeqError },
    #[error("call {call}: {error}")]
    Retain { call: usize, error: RetainError },
}

/// Replay `calls` in order.
pub fn simulate(calls: &[TraceCall], config: SimConfig) -> Result<SimReport, SimError> {
    let mut cache_config = CacheConfig::new(config.capacity_blocks);
    cache_config.block_size = config.block_size;
    cache_config.policy = config.policy;
    cache_config.max_retained_fraction = config
        .session_retention
        .map_or(0.0, |r| r.max_retained_fraction);
    let mut cache = KvCache::new(cache_config)?;
    let last_call: HashMap<&str, usize> = calls
        .iter()
        .enumerate()
        .map(|(i, c)| (c.session.as_str(), i))
        .collect();
    let mut sessions: HashMap<&str, SessionId> = HashMap::new();
    let mut last_tick = 0u64;
    let mut tenants: HashMap<&str, crate::key::NamespaceKey> = HashMap::new();
    let mut prompt_tokens = 0u64;
    let mut hit_tokens = 0u64;
    for (i, call) in calls.iter().enumerate() {
        let tick = match config.session_retention {
            None => Tick(i as u64 + 1),
            Some(_) => {
                // Times in ms, never going back (ties and disorder keep the last tick).
                last_tick = last_tick.max((call.t.max(0.0) * 1000.0) as u64).max(1);
                cache.expire(Tick(last_tick));
                Tick(last_tick)
            }
        };
        let next_tenant = TenantId(tenants.len() as u32);
        let ns = *tenants
            .entry(call.tenant.as_str())
            .or_insert_with(|| Namespace::for_tenant(next_tenant).key());
        let err = |error| SimError::Call { call: i, error };
        let m = cache.lookup(&ns, &call.tokens, tick);
        let cached = m.num_cached_tokens();
        let seq = cache.create_sequence(m).map_err(err)?;
        if let Err(e) = cache.append_tokens(seq, &call.tokens[cached..], tick) {
            cache.free(seq, tick).map_err(err)?;
            return Err(err(e));
        }
        cache
            .mark_written(seq, call.tokens.len(), tick)
            .map_err(err)?;
        if let Some(r) = config.session_retention {
            let next = SessionId(sessions.len() as u64);
            let session = *sessions.entry(call.session.as_str()).or_insert(next);
            if last_call[call.session.as_str()] == i {
                let _ = cache.release_session(session);
            } else {
                let until = Tick(tick.0 + (r.ttl_s * 1000.0) as u64);
                cache
                    .retain_session(session, seq, until, 0, tick)
                    .map_err(|e| SimError::Retain { call: i, error: e })?;
            }
        }
        cache.free(seq, tick).map_err(err)?;
        prompt_tokens += call.tokens.len() as u64;
        hit_tokens += cached as u64;
    }
    Ok(SimReport {
        calls: calls.len() as u64,
        prompt_tokens,
        hit_tokens,
        hit_rate: if prompt_tokens == 0 {
            0.0
        } else {
            hit_tokens as f64 / prompt_tokens as f64
        },
        evictions: cache.counters().evictions.total_pressure(),
        protected_capacity_blocks: cache.protected_capacity(),
    })
}
