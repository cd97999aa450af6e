//! A request that ended in tool calls keeps its blocks for the agent's next call (see
//! `tool_pause.rs` for the TTL rule and supersession), under its inferred conversation's
//! session when conversations are inferred. Never schedules and never touches K/V
//! bytes: it only puts cache retention on blocks found by their tokens.

use cache::{SessionId, TenantId};

use super::EngineCore;

/// What a tool pause retained.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ToolPauseInfo {
    pub session: SessionId,
    pub retained_tokens: usize,
    pub ttl: std::time::Duration,
}

impl EngineCore {
    /// The request whose prompt and output were `tokens` (tenant and salt as submitted) ended in
    /// tool calls: retain its cached blocks for a TTL from the cost model, under a session named
    /// by the tokens, and release the pauses it extends. `None` when disabled or nothing of it
    /// is cached any more. `priority` is the request's (vLLM's convention: lower is kept longer
    /// among retained blocks).
    pub fn tool_pause(
        &mut self,
        tenant: TenantId,
        salt: &[u8],
        tokens: &[u32],
        priority: i32,
    ) -> Option<ToolPauseInfo> {
        let cfg = self.cfg.tool_pause;
        if !cfg.enabled || tokens.len() < self.cfg.block_size {
            return None;
        }
        // The tokens a resumed request would send as its prompt.
        let ns = self.namespace_for(tenant, salt, tokens.len());
        let bs = self.cfg.block_size;
        let full = tokens.len() / bs * bs;
        let recompute_s = self.scheduler.predict_prefill_seconds(full);
        let bytes = full / bs * self.kv.memory().block_num_bytes();
        let reload_s = self.tiers.as_ref().and_then(|t| t.best_load_seconds(bytes));
        let ttl = crate::tool_pause::pause_ttl(&cfg, recompute_s, reload_s);
        // The request's inferred conversation when there is one (its retention is replaced by
        // the pause's), else a session named by the tokens.
        let conversation = self.inferred.as_ref().and_then(|inferred| {
            let chain = cache::key::chain_keys(&ns, tokens, bs, full / bs);
            inferred.conversation_of(tenant, &chain)
        });
        let session = conversation
            .map(cache::inferred_session)
            .unwrap_or_else(|| {
                use std::hash::{Hash, Hasher};
                let mut h = std::collections::hash_map::DefaultHasher::new();
                (tenant.0, salt, &tokens[..full]).hash(&mut h);
                SessionId(h.finish() | 1 << 63)
            });
        let rank = crate::request::retention_rank(priority, false);
        let tick = self.next_tick();
        self.cache.expire(tick);
        let until = cache::Tick(tick.0 + ttl.as_millis() as u64);
        let out = self
            .cache
            .retain_tokens(session, &ns, &tokens[..full], until, rank, tick);
        if out.retained_blocks == 0 {
            let _ = self.cache.release_session(session);
            return None;
        }
        let blocks = self.cache.session_blocks(session).to_vec();
        for old in self.tool_pauses.record(session, &blocks) {
            if self.cache.release_session(old).is_ok() {
                self.stats.tool_pauses_superseded += 1;
            }
        }
        let cache = &self.cache;
        self.tool_pauses
            .retain_live(|s| !cache.session_blocks(s).is_empty());
        self.stats.tool_pauses += 1;
        self.stats.retained_blocks += u64::from(out.retained_blocks);
        Some(ToolPauseInfo {
            session,
            retained_tokens: out.retained_blocks as usize * bs,
            ttl,
        })
    }
}
