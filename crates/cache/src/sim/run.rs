//! `simulate`: replay a trace through a [`KvCache`], one call after another, and count hits.
//!
//! Per call: look up the longest cached prefix in the call's tenant namespace (whole blocks, at
//! least one token left to compute); allocate blocks for the rest, evicting by policy when no block
//! is free; publish every full block (a block whose key is already cached is dropped and the cached
//! one touched); release everything (the partial last block returns to the free list). The call's
//! index is its tick, so every block a call used counts as used at that call.
//!
//! With [`SessionRetention`] (the session-aware policy, sessions named by the trace): ticks are
//! the calls' times in milliseconds; each call's blocks are retained for its session until
//! `t + ttl` (replacing the session's previous retention, as the server does for a keyed
//! session), expired retention ends before each call, and a session's retention is released
//! after its last call (the client deletes the session when its task is done).
//!
//! With [`InferredRetention`] (what the server does for clients that name nothing): calls whose
//! trace names no session are placed in conversations by [`crate::Conversations`], exactly as the
//! engine does at the end of a request, and each call's blocks are retained for its conversation
//! for the TTL the [`crate::ReturnModel`] has learned so far (no knowledge of later calls).

use std::collections::HashMap;

use serde::Serialize;
use thiserror::Error;

use super::trace::TraceCall;
use crate::config::{CacheConfig, EvictionPolicy};
use crate::conversation::{FinishedRequest, TurnKind};
use crate::duel::{DuelConfig, PolicyChoice, PolicyDuel};
use crate::error::{ConfigError, RetainError, SeqError};
use crate::ids::{SeqId, SessionId, TenantId, Tick};
use crate::inferred::{InferredConfig, InferredRetainer};
use crate::key::{chain_keys, Namespace, NamespaceKey};
use crate::replay::compute;
use crate::KvCache;

/// Simulated cache shape.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct SimConfig {
    pub block_size: u32,
    pub capacity_blocks: u32,
    pub policy: EvictionPolicy,
    /// Session-aware retention on top of `policy` for calls that name a session (`None`: plain
    /// policy).
    pub session_retention: Option<SessionRetention>,
    /// Retention for inferred conversations, for calls that name no session (`None`: plain
    /// policy for them).
    pub inferred: Option<InferredRetention>,
}

/// The session-aware policy's parameters.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct SessionRetention {
    /// How long a call's blocks stay retained for its session's next call.
    pub ttl_s: f64,
    /// At most this fraction of the pool carries retention.
    pub max_retained_fraction: f64,
}

/// The inferred-conversation policy's parameters (the server's defaults: [`Default`]).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct InferredRetention {
    pub policy: InferredConfig,
    /// At most this fraction of the pool carries retention.
    pub max_retained_fraction: f64,
    /// Retain only while shadow caches say it pays ([`RetentionDuel`]; `None`: always).
    pub duel: Option<DuelConfig>,
}

impl Default for InferredRetention {
    fn default() -> Self {
        InferredRetention {
            policy: InferredConfig::default(),
            // The engine's default (`engine::EngineConfig::max_retained_fraction`).
            max_retained_fraction: 0.9,
            duel: Some(DuelConfig::default()),
        }
    }
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
    /// Calls placed by conversation inference: continuing a conversation's latest turn, and
    /// branching from an earlier turn (0 without [`InferredRetention`]).
    pub inferred_continuations: u64,
    pub inferred_branches: u64,
    /// The TTL the return model had learned by the end (ms; 0 without inference).
    pub learned_ttl_ms: u64,
    /// Inferred turns left unretained because the shadow caches said retention did not pay.
    pub inferred_unretained: u64,
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
        .map(|r| r.max_retained_fraction)
        .into_iter()
        .chain(config.inferred.map(|r| r.max_retained_fraction))
        .fold(0.0, f64::max);
    let mut cache = KvCache::new(cache_config.clone())?;
    let last_call: HashMap<&str, usize> = calls
        .iter()
        .enumerate()
        .map(|(i, c)| (c.session.as_str(), i))
        .collect();
    let mut sessions: HashMap<&str, SessionId> = HashMap::new();
    let mut inference = match config.inferred {
        Some(r) => Some(Inference {
            retainer: InferredRetainer::new(r.policy),
            duel: match r.duel {
                Some(d) => Some(PolicyDuel::new(&cache_config, r.policy, d)?),
                None => None,
            },
        }),
        None => None,
    };
    // Retention TTLs and the reuse bonus are times: ticks are then the calls' ms.
    let timed = config.session_retention.is_some()
        || inference.is_some()
        || matches!(config.policy, EvictionPolicy::ReuseAwareLru { .. });
    let mut last_tick = 0u64;
    let mut tenants: HashMap<&str, (TenantId, NamespaceKey)> = HashMap::new();
    let mut report = SimReport {
        calls: calls.len() as u64,
        prompt_tokens: 0,
        hit_tokens: 0,
        hit_rate: 0.0,
        evictions: 0,
        protected_capacity_blocks: 0,
        inferred_continuations: 0,
        inferred_branches: 0,
        learned_ttl_ms: 0,
        inferred_unretained: 0,
    };
    for (i, call) in calls.iter().enumerate() {
        let tick = if timed {
            // Times in ms, never going back (ties and disorder keep the last tick).
            last_tick = last_tick.max((call.t.max(0.0) * 1000.0) as u64).max(1);
            cache.expire(Tick(last_tick));
            Tick(last_tick)
        } else {
            Tick(i as u64 + 1)
        };
        let next_tenant = TenantId(tenants.len() as u32);
        let (tenant, ns) = *tenants
            .entry(call.tenant.as_str())
            .or_insert_with(|| (next_tenant, Namespace::for_tenant(next_tenant).key()));
        let err = |error| SimError::Call { call: i, error };
        let (cached, seq) =
            compute(&mut cache, &ns, &call.tokens, &call.tokens, tick).map_err(err)?;
        let retain = |e| SimError::Retain { call: i, error: e };
        match (config.session_retention, inference.as_mut()) {
            (Some(r), _) if !call.session.is_empty() => {
                let next = SessionId(sessions.len() as u64);
                let session = *sessions.entry(call.session.as_str()).or_insert(next);
                if last_call[call.session.as_str()] == i {
                    let _ = cache.release_session(session);
                } else {
                    let until = Tick(tick.0 + (r.ttl_s * 1000.0) as u64);
                    cache
                        .retain_session(session, seq, until, 0, tick)
                        .map_err(retain)?;
                }
            }
            (_, Some(inferred)) if call.session.is_empty() => {
                let done = Done {
                    tenant,
                    ns: &ns,
                    tokens: &call.tokens,
                    seq,
                    cached,
                    tick,
                };
                inferred
                    .finish(&mut cache, done, config.block_size as usize, &mut report)
                    .map_err(retain)?;
            }
            _ => {}
        }
        cache.free(seq, tick).map_err(err)?;
        report.prompt_tokens += call.tokens.len() as u64;
        report.hit_tokens += cached as u64;
    }
    if report.prompt_tokens > 0 {
        report.hit_rate = report.hit_tokens as f64 / report.prompt_tokens as f64;
    }
    report.evictions = cache.counters().evictions.total_pressure();
    report.protected_capacity_blocks = cache.protected_capacity();
    report.learned_ttl_ms = inference.map_or(0, |r| r.retainer.ttl_ms());
    Ok(report)
}

/// The server's policy for calls that name no session: the retainer and the duel.
struct Inference {
    retainer: InferredRetainer,
    duel: Option<PolicyDuel>,
}

/// A call computed and published, its sequence still allocated.
struct Done<'a> {
    tenant: TenantId,
    ns: &'a NamespaceKey,
    tokens: &'a [u32],
    seq: SeqId,
    /// Prompt tokens the lookup found cached.
    cached: usize,
    tick: Tick,
}

impl Inference {
    /// What the engine does when an unnamed request finishes: place it, set the reuse bonus and
    /// retain as the duel says, then let the duel's arms replay it.
    fn finish(
        &mut self,
        cache: &mut KvCache,
        done: Done<'_>,
        block_size: usize,
        report: &mut SimReport,
    ) -> Result<(), RetainError> {
        // The blocks a later lookup of this prompt could read: a Mooncake trace's last hash id
        // is a partial block, and an exact block multiple leaves its last token to compute (a
        // simplification for token traces: the server registers the last full block either way).
        let full = done.tokens.len().saturating_sub(1) / block_size;
        let chain = chain_keys(done.ns, done.tokens, block_size, full);
        let req = FinishedRequest {
            tenant: done.tenant,
            chain: &chain,
            prompt_blocks: full,
            first_own_block: done.cached / block_size,
            now: done.tick,
        };
        let choice = self.duel.as_ref().map_or(
            PolicyChoice {
                retain: true,
                reuse_bonus: true,
            },
            |d| d.choice(),
        );
        // Reuse-aware LRU's bonus follows the learned return time (as in the engine).
        let bonus_ms = self.retainer.reuse_bonus_ms();
        cache.set_reuse_bonus(if choice.reuse_bonus { bonus_ms } else { 0 });
        let turn = if choice.retain {
            self.retainer.on_finish(cache, req, done.seq, 0)?.turn
        } else {
            report.inferred_unretained += 1;
            self.retainer.place(req)
        };
        if let Some(d) = self.duel.as_mut() {
            let (t, ns) = (done.tokens, done.ns);
            d.observe(done.tenant, ns, t, t, 0, bonus_ms, done.tick);
        }
        match turn.kind {
            TurnKind::Continue { .. } => report.inferred_continuations += 1,
            TurnKind::Branch { .. } => report.inferred_branches += 1,
            TurnKind::Start => {}
        }
        Ok(())
    }
}
