//! `simulate_routing`: a trace replayed over N replicas, each its own [`KvCache`], with a router
//! in front choosing the replica of every call — how the prefix-cache hit rate scales with the
//! routing policy.
//!
//! Policies: `RoundRobin`; `SessionAffinity` (a hash of tenant and session, as sticky routers
//! and consistent hashing on `x-session-id` do); `CacheAware` (the replica holding the longest
//! cached prefix of the call in the call's namespace — what a router reading KV events sees —
//! unless the load is unbalanced, then the least loaded, with vllm-router's default thresholds:
//! `max - min > balance_abs` and `max > balance_rel × min`; ties go to the least loaded).
//!
//! Load is modelled, not measured: each replica serves its calls one after another from the
//! call's trace time `t`, a call taking `overhead_s + uncached tokens / prefill_tokens_per_s`;
//! a replica's load is its number of calls not finished at `t`. Each call runs as in
//! [`super::simulate`] on the chosen replica (lookup, compute the rest, publish, release).
//! Pure: no clock, no I/O.

use std::collections::HashMap;

use serde::Serialize;

use super::run::SimError;
use super::trace::TraceCall;
use crate::config::{CacheConfig, EvictionPolicy};
use crate::ids::{TenantId, Tick};
use crate::key::{Namespace, NamespaceKey};
use crate::KvCache;

/// How the router picks a replica.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RoutePolicy {
    RoundRobin,
    SessionAffinity,
    CacheAware,
}

impl RoutePolicy {
    pub fn name(self) -> &'static str {
        match self {
            RoutePolicy::RoundRobin => "round_robin",
            RoutePolicy::SessionAffinity => "session_affinity",
            RoutePolicy::CacheAware => "cache_aware",
        }
    }
}

/// The simulated fleet.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct RouteConfig {
    pub replicas: u32,
    pub block_size: u32,
    /// Blocks of each replica's pool.
    pub capacity_blocks: u32,
    pub policy: EvictionPolicy,
    pub routing: RoutePolicy,
    /// Modelled prefill speed of one replica.
    pub prefill_tokens_per_s: f64,
    /// Modelled fixed cost of a call (decode, HTTP).
    pub overhead_s: f64,
    /// Load balancing starts when `max - min` exceeds this many calls …
    pub balance_abs: u32,
    /// … and `max > balance_rel × min`.
    pub balance_rel: f64,
}

/// What the routing simulator prints.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct RouteReport {
    pub replicas: u32,
    pub routing: &'static str,
    pub calls: u64,
    pub prompt_tokens: u64,
    pub hit_tokens: u64,
    pub hit_rate: f64,
    /// Largest share of the calls one replica served (1/replicas = perfectly even).
    pub max_replica_share: f64,
    /// Modelled time from the first call to the last one finished.
    pub makespan_s: f64,
}

struct Replica {
    cache: KvCache,
    /// Finish times of the calls given to it, in order.
    finishes: Vec<f64>,
    busy_until: f64,
    calls: u64,
}

impl Replica {
    fn load(&self, t: f64) -> usize {
        // Finish times are increasing: count those after `t` from the end.
        self.finishes.iter().rev().take_while(|&&f| f > t).count()
    }
}

fn fnv(parts: &[&str]) -> u64 {
    let mut h = 0xcbf2_9ce4_8422_2325u64;
    for p in parts {
        for b in p.bytes().chain([0xff]) {
            h ^= u64::from(b);
            h = h.wrapping_mul(0x0000_0100_0000_01b3);
        }
    }
    h
}

/// Replay `calls` over `config.replicas` replicas.
pub fn simulate_routing(calls: &[TraceCall], config: RouteConfig) -> Result<RouteReport, SimError> {
    let n = config.replicas.max(1) as usize;
    let mut replicas = Vec::with_capacity(n);
    for _ in 0..n {
        let mut c = CacheConfig::new(config.capacity_blocks);
        c.block_size = config.block_size;
        c.policy = config.policy;
        c.max_retained_fraction = 0.0;
        replicas.push(Replica {
            cache: KvCache::new(c)?,
            finishes: Vec::new(),
            busy_until: 0.0,
            calls: 0,
        });
    }
    let mut tenants: HashMap<&str, NamespaceKey> = HashMap::new();
    let (mut prompt_tokens, mut hit_tokens) = (0u64, 0u64);
    let mut makespan = 0.0f64;
    for (i, call) in calls.iter().enumerate() {
        let tick = Tick(i as u64 + 1);
        let next_tenant = TenantId(tenants.len() as u32);
        let ns = *tenants
            .entry(call.tenant.as_str())
            .or_insert_with(|| Namespace::for_tenant(next_tenant).key());
        let loads: Vec<usize> = replicas.iter().map(|r| r.load(call.t)).collect();
        let least = (0..n).min_by_key(|&r| (loads[r], r)).unwrap_or(0);
        let chosen = match config.routing {
            RoutePolicy::RoundRobin => i % n,
            RoutePolicy::SessionAffinity => {
                (fnv(&[&call.tenant, &call.session]) % n as u64) as usize
            }
            RoutePolicy::CacheAware => {
                let (max, min) = (
                    loads.iter().copied().max().unwrap_or(0),
                    loads.iter().copied().min().unwrap_or(0),
                );
                let unbalanced = max - min > config.balance_abs as usize
                    && max as f64 > config.balance_rel * min as f64;
                if unbalanced {
                    least
                } else {
                    (0..n)
                        .max_by_key(|&r| {
                            let m = replicas[r].cache.peek_prefix(&ns, &call.tokens);
                            (m, std::cmp::Reverse(loads[r]), std::cmp::Reverse(r))
                        })
                        .unwrap_or(least)
                }
            }
        };
        let r = &mut replicas[chosen];
        let err = |error| SimError::Call { call: i, error };
        let m = r.cache.lookup(&ns, &call.tokens, tick);
        let cached = m.num_cached_tokens();
        let seq = r.cache.create_sequence(m).map_err(err)?;
        if let Err(e) = r.cache.append_tokens(seq, &call.tokens[cached..], tick) {
            r.cache.free(seq, tick).map_err(err)?;
            return Err(err(e));
        }
        r.cache
            .mark_written(seq, call.tokens.len(), tick)
            .map_err(err)?;
        r.cache.free(seq, tick).map_err(err)?;
        let service =
            config.overhead_s + (call.tokens.len() - cached) as f64 / config.prefill_tokens_per_s;
        r.busy_until = r.busy_until.max(call.t) + service;
        r.finishes.push(r.busy_until);
        r.calls += 1;
        makespan = makespan.max(r.busy_until);
        prompt_tokens += call.tokens.len() as u64;
        hit_tokens += cached as u64;
    }
    let max_calls = replicas.iter().map(|r| r.calls).max().unwrap_or(0);
    Ok(RouteReport {
        replicas: n as u32,
        routing: config.routing.name(),
        calls: calls.len() as u64,
        prompt_tokens,
        hit_tokens,
        hit_rate: if prompt_tokens == 0 {
            0.0
        } else {
            hit_tokens as f64 / prompt_tokens as f64
        },
        max_replica_share: if calls.is_empty() {
            0.0
        } else {
            max_calls as f64 / calls.len() as f64
        },
        makespan_s: makespan,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sim::{generate, simulate, SimConfig, TraceKind, TraceParams};

    fn config(replicas: u32, routing: RoutePolicy) -> RouteConfig {
        RouteConfig {
            replicas,
            block_size: 16,
            capacity_blocks: 2048,
            policy: EvictionPolicy::Lru,
            routing,
            prefill_tokens_per_s: 2000.0,
            overhead_s: 0.5,
            balance_abs: 2,
            balance_rel: 1.5,
        }
    }

    #[test]
    fn one_replica_is_the_plain_simulator_whatever_the_routing() {
        let calls = generate(TraceParams {
            kind: TraceKind::React,
            agents: 4,
            tasks: 2,
            seed: 3,
        });
        let single = simulate(
            &calls,
            SimConfig {
                block_size: 16,
                capacity_blocks: 2048,
                policy: EvictionPolicy::Lru,
                session_retention: None,
                inferred: None,
            },
        )
        .unwrap();
        for routing in [
            RoutePolicy::RoundRobin,
            RoutePolicy::SessionAffinity,
            RoutePolicy::CacheAware,
        ] {
            let r = simulate_routing(&calls, config(1, routing)).unwrap();
            assert_eq!(r.hit_tokens, single.hit_tokens, "{routing:?}");
            assert_eq!(r.max_replica_share, 1.0);
        }
    }

    #[test]
    fn cache_aware_keeps_sessions_warm_and_round_robin_does_not() {
        let calls = generate(TraceParams {
            kind: TraceKind::React,
            agents: 16,
            tasks: 2,
            seed: 7,
        });
        let rr = simulate_routing(&calls, config(8, RoutePolicy::RoundRobin)).unwrap();
        let aware = simulate_routing(&calls, config(8, RoutePolicy::CacheAware)).unwrap();
        let sticky = simulate_routing(&calls, config(8, RoutePolicy::SessionAffinity)).unwrap();
        assert!(aware.hit_rate > rr.hit_rate + 0.1, "{aware:?} vs {rr:?}");
        assert!(sticky.hit_rate > rr.hit_rate, "{sticky:?} vs {rr:?}");
        assert!(aware.max_replica_share < 0.6, "{aware:?}: load is spread");
    }
}
