//! `simulate`: replay a trace through a [`KvCache`], one call after another, and count hits.
//!
//! Per call: look up the longest cached prefix in the call's tenant namespace (whole blocks, at
//! least one token left to compute); allocate blocks for the rest, evicting by policy when no block
//! is free; publish every full block (a block whose key is already cached is dropped and the cached
//! one touched); release everything (the partial last block returns to the free list). The call's
//! index is its tick, so every block a call used counts as used at that call.

use std::collections::HashMap;

use serde::Serialize;
use thiserror::Error;

use super::trace::TraceCall;
use crate::config::{CacheConfig, EvictionPolicy};
use crate::error::{ConfigError, SeqError};
use crate::ids::{TenantId, Tick};
use crate::key::Namespace;
use crate::KvCache;

/// Simulated cache shape.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct SimConfig {
    pub block_size: u32,
    pub capacity_blocks: u32,
    pub policy: EvictionPolicy,
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
}

/// Replay `calls` in order.
pub fn simulate(calls: &[TraceCall], config: SimConfig) -> Result<SimReport, SimError> {
    let mut cache_config = CacheConfig::new(config.capacity_blocks);
    cache_config.block_size = config.block_size;
    cache_config.policy = config.policy;
    cache_config.max_retained_fraction = 0.0;
    let mut cache = KvCache::new(cache_config)?;
    let mut tenants: HashMap<&str, crate::key::NamespaceKey> = HashMap::new();
    let mut prompt_tokens = 0u64;
    let mut hit_tokens = 0u64;
    for (i, call) in calls.iter().enumerate() {
        let tick = Tick(i as u64 + 1);
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
