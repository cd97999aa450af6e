//! Which of the policy's options pay on this traffic? Shadow caches answer it online. Each arm
//! is a [`KvCache`] of the live pool's shape (bookkeeping only: no K/V bytes) that replays every
//! finished request with one combination of the two options — retaining inferred conversations
//! ([`InferredRetainer`]) and reuse-aware LRU's bonus (`evict/reuse.rs`) — and counts the prompt
//! tokens it would have served from cache, with exponentially fading weight. The live pool
//! follows the arm that serves the most (set dueling, as CPU caches choose an insertion policy;
//! ties go to the simpler arm). No oracle: only requests already finished count.
//!
//! Why: both options are bets on the workload. Retention under a cap keeps the first
//! conversations it admits for their whole return time — right when turns come back within it,
//! wrong when reuse runs across conversations (shared documents). The bonus keeps blocks read
//! twice — right for chat histories and shared documents, wrong for agent loops whose every
//! block is read again within seconds. Only the workload says which it is.
//!
//! Owns the arms and their scores; never touches the live cache.

use crate::config::{CacheConfig, EvictionPolicy};
use crate::conversation::FinishedRequest;
use crate::error::ConfigError;
use crate::ids::{TenantId, Tick};
use crate::inferred::{InferredConfig, InferredRetainer};
use crate::key::{BlockKey, NamespaceKey};
use crate::replay::compute;
use crate::KvCache;

/// How fast the duel forgets.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct DuelConfig {
    /// Requests after which a request's weight in the scores has halved.
    pub half_life_requests: f64,
}

impl Default for DuelConfig {
    fn default() -> Self {
        DuelConfig {
            half_life_requests: 200.0,
        }
    }
}

/// One combination of the options.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PolicyChoice {
    /// Retain inferred conversations.
    pub retain: bool,
    /// Give blocks read twice reuse-aware LRU's bonus (always false under other policies).
    pub reuse_bonus: bool,
}

#[derive(Debug)]
struct Arm {
    choice: PolicyChoice,
    cache: KvCache,
    retainer: Option<InferredRetainer>,
    score: f64,
}

/// The arms and their fading scores (prompt tokens served from cache).
#[derive(Debug)]
pub struct PolicyDuel {
    arms: Vec<Arm>,
    decay: f64,
    requests: u64,
}

impl PolicyDuel {
    /// Arms shaped like the live pool (`config`: its size, block size, policy, retention cap
    /// and tenant limits): plain and retaining, each also with the bonus under reuse-aware LRU.
    pub fn new(
        config: &CacheConfig,
        inferred: InferredConfig,
        duel: DuelConfig,
    ) -> Result<PolicyDuel, ConfigError> {
        let bonus = matches!(config.policy, EvictionPolicy::ReuseAwareLru { .. });
        let mut arms = Vec::new();
        // Tie order: retaining first (what the server did before any duel, and what an idle
        // server starts with), then plain, then the same with the bonus.
        for reuse_bonus in [false, true].into_iter().filter(|b| !b || bonus) {
            for retain in [true, false] {
                let mut cache = KvCache::new(config.clone())?;
                cache.set_reuse_bonus(0);
                arms.push(Arm {
                    choice: PolicyChoice {
                        retain,
                        reuse_bonus,
                    },
                    cache,
                    retainer: retain.then(|| InferredRetainer::new(inferred)),
                    score: 0.0,
                });
            }
        }
        Ok(PolicyDuel {
            arms,
            decay: 0.5f64.powf(1.0 / duel.half_life_requests.max(1.0)),
            requests: 0,
        })
    }

    /// Replays a finished request of `tenant` in every arm: `prompt` looked up, then `tokens`
    /// (the prompt and the generated tokens whose K/V was written) computed and published;
    /// retaining arms retain its conversation with `priority`, bonus arms use `bonus_ms`.
    #[allow(clippy::too_many_arguments)]
    pub fn observe(
        &mut self,
        tenant: TenantId,
        ns: &NamespaceKey,
        prompt: &[u32],
        tokens: &[u32],
        priority: u8,
        bonus_ms: u64,
        now: Tick,
    ) {
        self.requests += 1;
        for arm in &mut self.arms {
            arm.score *= self.decay;
            let cache = &mut arm.cache;
            cache.set_reuse_bonus(if arm.choice.reuse_bonus { bonus_ms } else { 0 });
            cache.expire(now);
            // A request larger than the pool does not fit a shadow either: skipped.
            let Ok((hit, seq)) = compute(cache, ns, prompt, tokens, now) else {
                continue;
            };
            if let Some(retainer) = arm.retainer.as_mut() {
                let bs = cache.block_size();
                let chain: Vec<BlockKey> = (cache.block_table(seq).unwrap_or(&[]).iter())
                    .map_while(|b| cache.block_key(*b))
                    .collect();
                let req = FinishedRequest {
                    tenant,
                    chain: &chain,
                    prompt_blocks: prompt.len() / bs,
                    first_own_block: hit / bs,
                    now,
                };
                let _ = retainer.on_finish(cache, req, seq, priority);
            }
            let _ = cache.free(seq, now);
            arm.score += hit as f64;
        }
    }

    /// What the live pool should do now: the best arm (ties: the first in the tie order).
    pub fn choice(&self) -> PolicyChoice {
        let mut best = &self.arms[0];
        for arm in &self.arms[1..] {
            if arm.score > best.score {
                best = arm;
            }
        }
        best.choice
    }

    /// Each arm's choice and fading score, and the requests seen.
    pub fn scores(&self) -> (Vec<(PolicyChoice, f64)>, u64) {
        let arms = self.arms.iter().map(|a| (a.choice, a.score)).collect();
        (arms, self.requests)
    }
}
