//! Pins (warm-up prefixes) and soft session retention: adding and removing holders, expiry.
//! Re-ranks the affected blocks in the candidate sets; never evicts.

use super::KvCache;
use crate::error::RetainError;
use crate::ids::{BlockId, PinId, SeqId, SessionId, Tick};
use crate::key::{BlockKey, NamespaceKey};
use crate::retention::{Holder, HolderRecord, RetentionRank};

/// Result of [`KvCache::pin_prefix`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PinOutcome {
    pub pin: PinId,
    /// Cached full blocks of the prefix now pinned (from the root).
    pub num_blocks: u32,
    /// `num_blocks · block_size`.
    pub num_tokens: usize,
    /// Cached blocks of the prefix left unpinned because of `max_retained_fraction`.
    pub refused_blocks: u32,
}

/// Result of [`KvCache::retain_session`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RetainOutcome {
    pub retained_blocks: u32,
    pub refused_blocks: u32,
    /// Blocks retained now that the session's previous retention did not hold (what this turn
    /// added: Anthropic's `cache_write_tokens` is this × block size).
    pub new_blocks: u32,
}

/// What [`KvCache::session`] reports of a session's retention.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SessionRetention {
    /// Blocks the session retains (its chain from the root, as far as the cap allowed).
    pub blocks: u32,
    /// `blocks · block_size`.
    pub tokens: usize,
    /// Retention ends at this tick.
    pub until: Tick,
    pub priority: u8,
}

impl KvCache {
    /// The current retention of `session`, `None` when it retains nothing (never retained,
    /// released or expired).
    pub fn session(&self, session: SessionId) -> Option<SessionRetention> {
        let r = self.registry.records.get(&Holder::Session(session))?;
        Some(SessionRetention {
            blocks: r.blocks.len() as u32,
            tokens: r.blocks.len() * self.block_size,
            until: r.rank.until,
            priority: r.rank.priority,
        })
    }

    /// Retain for `session` the cached full blocks of `tokens` in `ns` (the chain from the root, as
    /// far as it is cached) until `until` — a finished request's blocks found again by their
    /// tokens (a tool pause noticed after the request ended). Replaces the session's previous
    /// retention.
    pub fn retain_tokens(
        &mut self,
        session: SessionId,
        ns: &NamespaceKey,
        tokens: &[u32],
        until: Tick,
        priority: u8,
        tick: Tick,
    ) -> RetainOutcome {
        self.advance(tick);
        let blocks = self.cached_chain(ns, tokens);
        self.replace_session(session, &blocks, until, priority)
    }

    /// The cached full blocks of `tokens` in `ns`: the chain from the root, as far as it is cached.
    fn cached_chain(&self, ns: &NamespaceKey, tokens: &[u32]) -> Vec<BlockId> {
        let mut blocks = Vec::new();
        let mut parent = ns.root();
        for chunk in tokens.chunks_exact(self.block_size) {
            let key = BlockKey::chain(&parent, chunk);
            match self.index.get(&key) {
                Some(id) => blocks.push(id),
                None => break,
            }
            parent = key;
        }
        blocks
    }

    /// Replace `session`'s retention with `blocks` (chain order) until `until`; counts the blocks
    /// its previous retention did not hold.
    fn replace_session(
        &mut self,
        session: SessionId,
        blocks: &[BlockId],
        until: Tick,
        priority: u8,
    ) -> RetainOutcome {
        let holder = Holder::Session(session);
        let previous: std::collections::HashSet<BlockId> = self
            .registry
            .records
            .get(&holder)
            .map(|r| r.blocks.iter().copied().collect())
            .unwrap_or_default();
        self.remove_holder(holder);
        let rank = RetentionRank::session(priority, until);
        let (retained_blocks, refused_blocks) = self.add_holder(holder, rank, blocks);
        let new_blocks = self.registry.records[&holder]
            .blocks
            .iter()
            .filter(|b| !previous.contains(b))
            .count() as u32;
        self.registry.expiry.insert((until, session));
        self.counters.sessions_retained += 1;
        RetainOutcome {
            retained_blocks,
            refused_blocks,
            new_blocks,
        }
    }

    /// The keys of blocks `session` retained that were evicted from the pool since it retained
    /// them (eviction order: the chain's tail first; empty when none or no such session). The
    /// engine asks its storage tiers where they are now; a key may also be cached again.
    pub fn session_evicted(&self, session: SessionId) -> &[(NamespaceKey, BlockKey)] {
        self.registry
            .records
            .get(&Holder::Session(session))
            .map_or(&[], |r| r.evicted.as_slice())
    }

    /// Whether a block with chain key `key` is cached (published) in the active pool now.
    pub fn is_cached(&self, key: &BlockKey) -> bool {
        self.index.get(key).is_some()
    }

    /// The blocks `session` retains now (chain order, root first; empty when none).
    pub fn session_blocks(&self, session: SessionId) -> &[BlockId] {
        self.registry
            .records
            .get(&Holder::Session(session))
            .map_or(&[], |r| r.blocks.as_slice())
    }

    /// Attach `holder` to `blocks` (chain order, root first) up to the retention cap.
    /// Returns (retained, refused).
    fn add_holder(
        &mut self,
        holder: Holder,
        rank: RetentionRank,
        blocks: &[BlockId],
    ) -> (u32, u32) {
        self.registry.records.insert(
            holder,
            HolderRecord {
                rank,
                blocks: Vec::new(),
                evicted: Vec::new(),
            },
        );
        let is_pin = matches!(holder, Holder::Pin(_));
        let mut kept = Vec::with_capacity(blocks.len());
        for (n, &id) in blocks.iter().enumerate() {
            let b = self.pool.get(id);
            if b.holders.contains(&holder) {
                continue;
            }
            if b.holders.is_empty() {
                let tenant = b.published.map(|p| p.ns.tenant()).unwrap_or_default();
                let over_tenant_cap = !is_pin && self.tenants.at_retained_quota(tenant);
                if self.registry.num_retained_blocks >= self.max_retained_blocks || over_tenant_cap
                {
                    let refused = (blocks.len() - n) as u32;
                    self.counters.retention_refused_blocks += u64::from(refused);
                    if over_tenant_cap {
                        self.tenants.get_mut(tenant).retention_refused_blocks += u64::from(refused);
                    }
                    self.registry
                        .records
                        .get_mut(&holder)
                        .expect("inserted")
                        .blocks = kept.clone();
                    return (kept.len() as u32, refused);
                }
                self.registry.num_retained_blocks += 1;
                self.tenants.get_mut(tenant).retained_blocks += 1;
            }
            let was_pinned = b.holders.iter().any(|h| matches!(h, Holder::Pin(_)));
            if is_pin && !was_pinned {
                self.registry.num_pinned_blocks += 1;
            }
            self.detach(id);
            self.pool.get_mut(id).holders.push(holder);
            self.attach(id);
            kept.push(id);
        }
        let n = kept.len() as u32;
        self.registry
            .records
            .get_mut(&holder)
            .expect("inserted")
            .blocks = kept;
        (n, 0)
    }

    /// Detach `holder` from all its blocks and forget it. Returns false if unknown.
    fn remove_holder(&mut self, holder: Holder) -> bool {
        let Some(record) = self.registry.records.remove(&holder) else {
            return false;
        };
        if let Holder::Session(s) = holder {
            self.registry.expiry.remove(&(record.rank.until, s));
        }
        for id in record.blocks {
            self.detach(id);
            let b = self.pool.get_mut(id);
            b.holders.retain(|h| *h != holder);
            let still_pinned = b.holders.iter().any(|h| matches!(h, Holder::Pin(_)));
            let now_unretained = b.holders.is_empty();
            if matches!(holder, Holder::Pin(_)) && !still_pinned {
                self.registry.num_pinned_blocks -= 1;
            }
            if now_unretained {
                self.registry.num_retained_blocks -= 1;
                if let Some(p) = b.published {
                    self.tenants.get_mut(p.ns.tenant()).retained_blocks -= 1;
                }
            }
            self.attach(id);
        }
        true
    }

    /// Pin the cached full blocks of `tokens` in `ns` (warm-up templates): they are evicted only
    /// after every unpinned candidate. Prefill and publish the template first, then pin it.
    pub fn pin_prefix(&mut self, ns: &NamespaceKey, tokens: &[u32], tick: Tick) -> PinOutcome {
        self.advance(tick);
        let blocks = self.cached_chain(ns, tokens);
        let pin = self.registry.new_pin();
        let (num_blocks, refused_blocks) =
            self.add_holder(Holder::Pin(pin), RetentionRank::PIN, &blocks);
        self.counters.pins_created += 1;
        PinOutcome {
            pin,
            num_blocks,
            num_tokens: num_blocks as usize * self.block_size,
            refused_blocks,
        }
    }

    /// Remove a pin; its blocks return to their normal place in the eviction order.
    pub fn unpin(&mut self, pin: PinId) -> Result<(), RetainError> {
        if !self.remove_holder(Holder::Pin(pin)) {
            return Err(RetainError::UnknownPin(pin));
        }
        self.counters.pins_released += 1;
        Ok(())
    }

    /// Softly retain the published blocks of `seq` for `session` until `until` with `priority`
    /// (higher survives longer). Replaces the session's previous retention. Call it before
    /// freeing the sequence at the end of a turn; the blocks then survive the tool-call pause
    /// unless memory is truly needed.
    pub fn retain_session(
        &mut self,
        session: SessionId,
        seq: SeqId,
        until: Tick,
        priority: u8,
        tick: Tick,
    ) -> Result<RetainOutcome, RetainError> {
        self.retain_session_prefix(session, seq, usize::MAX, until, priority, tick)
    }

    /// As [`KvCache::retain_session`], for the first `max_blocks` blocks of `seq` only (a
    /// `cache_control` breakpoint inside the prompt: the prefix up to it).
    pub fn retain_session_prefix(
        &mut self,
        session: SessionId,
        seq: SeqId,
        max_blocks: usize,
        until: Tick,
        priority: u8,
        tick: Tick,
    ) -> Result<RetainOutcome, RetainError> {
        self.advance(tick);
        let s = self
            .seqs
            .map
            .get(&seq)
            .ok_or(RetainError::UnknownSequence(seq))?;
        let blocks: Vec<BlockId> = s.blocks[..s.keys.len()]
            .iter()
            .copied()
            .take(max_blocks)
            .take_while(|id| self.pool.get(*id).published.is_some())
            .collect();
        Ok(self.replace_session(session, &blocks, until, priority))
    }

    /// End a session's retention now.
    pub fn release_session(&mut self, session: SessionId) -> Result<(), RetainError> {
        if !self.remove_holder(Holder::Session(session)) {
            return Err(RetainError::UnknownSession(session));
        }
        self.counters.sessions_released += 1;
        Ok(())
    }

    /// End every session retention whose `until` is at or before `tick`. Returns how many ended.
    pub fn expire(&mut self, tick: Tick) -> usize {
        let now = self.advance(tick);
        let expired = self.registry.expired_sessions(now);
        for &s in &expired {
            self.remove_holder(Holder::Session(s));
        }
        self.counters.retention_expiries += expired.len() as u64;
        expired.len()
    }
}
