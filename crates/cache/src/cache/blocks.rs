//! State transitions of single blocks: reference, release, touch, publish bookkeeping, eviction,
//! allocation. Every change to a block's ordering inputs goes through `detach` → change →
//! `attach`, so the candidate sets and the protected segment never hold a stale key.

use super::KvCache;
use crate::counters::EvictionCause;
use crate::error::AllocError;
use crate::events::CacheEvent;
use crate::evict::reuse::REUSED_READS;
use crate::evict::slru::{ProtectedSegment, PROMOTION_HITS};
use crate::evict::{order_key, BlockStats};
use crate::ids::{BlockId, Tick};
use crate::retention::{Holder, RetentionRank};

impl KvCache {
    fn stats(&self, id: BlockId) -> Option<BlockStats> {
        let b = self.pool.get(id);
        let p = b.published.as_ref()?;
        Some(BlockStats {
            last_use: b.last_use,
            hits: b.hits,
            protected: b.protected,
            depth: p.depth,
            reuse_bonus_ms: b.reuse_bonus_ms,
        })
    }

    /// Remove a block from the candidate sets and the protected segment.
    pub(crate) fn detach(&mut self, id: BlockId) {
        let stats = self.stats(id);
        let b = self.pool.get_mut(id);
        let Some(p) = b.published else {
            debug_assert!(b.candidate.is_none());
            return;
        };
        if let Some(key) = b.candidate.take() {
            self.candidates.remove(p.ns.tenant(), key, id);
        }
        if b.protected {
            if let Some(stats) = stats {
                self.protected
                    .set
                    .remove(&ProtectedSegment::entry(&stats, id));
            }
        }
    }

    /// Re-insert a block where its current state says it belongs.
    pub(crate) fn attach(&mut self, id: BlockId) {
        // Reuse-aware LRU: the bonus is decided now and kept with the block until it is
        // re-ranked (the sketch and the bonus move on meanwhile).
        if let (Some(r), Some(p)) = (&self.reuse, self.pool.get(id).published) {
            let bonus = if r.sketch.estimate(&p.key) >= REUSED_READS {
                r.bonus_ms
            } else {
                0
            };
            self.pool.get_mut(id).reuse_bonus_ms = bonus;
        }
        let Some(stats) = self.stats(id) else { return };
        let b = self.pool.get(id);
        let tenant = b.published.map(|p| p.ns.tenant()).unwrap_or_default();
        if b.protected {
            self.protected
                .set
                .insert(ProtectedSegment::entry(&stats, id));
        }
        if b.ref_count == 0 && b.num_children == 0 {
            let rank = self.registry.rank_of(&b.holders);
            let key = order_key(self.config.policy, rank, &stats);
            self.candidates.insert(tenant, key, id);
            self.pool.get_mut(id).candidate = Some(key);
        }
    }

    /// Demote protected blocks while the segment is over capacity.
    pub(crate) fn rebalance_protected(&mut self) {
        while let Some(victim) = self.protected.overflow() {
            self.detach(victim);
            self.pool.get_mut(victim).protected = false;
            self.attach(victim);
            self.counters.slru_demotions += 1;
        }
    }

    /// Record a use at `now`; a `hit` also counts toward LFU and SLRU promotion.
    pub(crate) fn touch(&mut self, id: BlockId, now: Tick, hit: bool) {
        self.detach(id);
        let slru = self.config.policy.is_segmented();
        let mut reset = false;
        if let (true, Some(r), Some(p)) = (hit, self.reuse.as_mut(), self.pool.get(id).published) {
            reset = r.sketch.record(&p.key);
        }
        let b = self.pool.get_mut(id);
        b.last_use = b.last_use.max(now);
        let mut promoted = false;
        if hit {
            b.hits = b.hits.saturating_add(1);
            if slru && !b.protected && b.hits >= PROMOTION_HITS && b.published.is_some() {
                b.protected = true;
                promoted = true;
            }
        }
        self.attach(id);
        if promoted {
            self.counters.slru_promotions += 1;
            self.rebalance_protected();
        }
        if reset {
            self.rerank_all();
        }
    }

    /// Re-ranks every block (reuse-aware LRU after its counts or its bonus changed).
    pub(crate) fn rerank_all(&mut self) {
        for i in 0..self.pool.blocks.len() {
            let id = BlockId(i as u32);
            if self.pool.get(id).candidate.is_some() {
                self.detach(id);
                self.attach(id);
            }
        }
    }

    /// Add one reference.
    pub(crate) fn acquire(&mut self, id: BlockId) {
        self.detach(id);
        let b = self.pool.get_mut(id);
        b.ref_count += 1;
        if b.ref_count == 1 {
            self.num_in_use += 1;
            if b.published.is_some() {
                self.num_cached -= 1;
            }
        }
        self.attach(id);
    }

    /// Drop one reference; an unreferenced block becomes cached (published) or free.
    pub(crate) fn release(&mut self, id: BlockId, now: Tick) {
        self.detach(id);
        let b = self.pool.get_mut(id);
        debug_assert!(b.ref_count > 0, "{id} released with no reference");
        b.ref_count -= 1;
        if b.ref_count > 0 {
            self.attach(id);
            return;
        }
        self.num_in_use -= 1;
        if b.published.is_some() {
            b.last_use = b.last_use.max(now);
            self.num_cached += 1;
            self.attach(id);
        } else {
            self.pool.put_free(id);
        }
    }

    /// Unpublish a block (eviction or flush): out of the index, its holders and its parent's child
    /// count; freed if unreferenced, otherwise it stays with its sequences as a private block.
    pub(crate) fn unpublish(&mut self, id: BlockId, cause: EvictionCause) {
        self.detach(id);
        let b = self.pool.get_mut(id);
        let Some(p) = b.published.take() else { return };
        let holders = std::mem::take(&mut b.holders);
        let (was_protected, hits) = (b.protected, b.hits);
        b.protected = false;
        b.hits = 0;
        let unreferenced = b.ref_count == 0;
        let rank = self.registry.rank_of(&holders);
        self.index.remove(&p.key);
        self.divergence.on_unpublish(id);
        if cause != EvictionCause::Flush {
            self.divergence.on_evict(p.key, p.ns);
        }
        if let Some(parent) = p.parent {
            self.detach(parent);
            let pb = self.pool.get_mut(parent);
            pb.num_children -= 1;
            self.attach(parent);
        }
        self.drop_block_from_holders(id, &holders);
        if cause != EvictionCause::Flush {
            for h in &holders {
                if let Some(record) = self.registry.records.get_mut(h) {
                    record.evicted.push((p.ns, p.key));
                }
            }
        }
        let tenant = self.tenants.get_mut(p.ns.tenant());
        tenant.cached_blocks -= 1;
        if !holders.is_empty() {
            tenant.retained_blocks -= 1;
        }
        let e = &mut self.counters.evictions;
        match cause {
            EvictionCause::Capacity => e.capacity += 1,
            EvictionCause::Watermark => e.watermark += 1,
            EvictionCause::Quota => e.quota += 1,
            EvictionCause::Flush => e.flush += 1,
        }
        if cause != EvictionCause::Flush {
            tenant.evicted_blocks += 1;
            if rank != RetentionRank::NONE {
                e.retained += 1;
            }
            self.ghost_on_evict(p.key, p.ns, was_protected, hits);
        }
        if self.config.record_events {
            self.events.push(CacheEvent::BlockEvicted {
                key: p.key,
                block: id,
                tenant: p.ns.tenant(),
                cause,
            });
        }
        if unreferenced {
            self.num_cached -= 1;
            self.pool.put_free(id);
        }
    }

    /// Remove `id` from its holders' records and the retained/pinned gauges.
    fn drop_block_from_holders(&mut self, id: BlockId, holders: &[Holder]) {
        if holders.is_empty() {
            return;
        }
        self.registry.num_retained_blocks -= 1;
        if holders.iter().any(|h| matches!(h, Holder::Pin(_))) {
            self.registry.num_pinned_blocks -= 1;
        }
        for h in holders {
            if let Some(record) = self.registry.records.get_mut(h) {
                record.blocks.retain(|b| *b != id);
            }
        }
    }

    /// Evict the first candidate. Returns false when there is none.
    pub(crate) fn evict_one(&mut self, cause: EvictionCause) -> bool {
        let pick = if self.tenants.reserved.is_empty() {
            self.candidates.first()
        } else {
            let tenants = &self.tenants;
            self.candidates
                .first_unprotected(|t| tenants.within_reservation(t))
                .or_else(|| {
                    let id = self.candidates.first()?;
                    self.counters.evictions.reserved += 1;
                    let tenant = self.pool.get(id).published.map(|p| p.ns.tenant());
                    if let Some(t) = tenant {
                        self.tenants.get_mut(t).reserved_evictions += 1;
                    }
                    Some(id)
                })
        };
        match pick {
            Some(id) => {
                self.unpublish(id, cause);
                true
            }
            None => false,
        }
    }

    /// Evict cached blocks while more than `max_cached_fraction` of the pool is cached.
    pub(crate) fn enforce_watermark(&mut self) {
        while self.num_cached > self.max_cached_blocks {
            let evicted = self.evict_one(EvictionCause::Watermark);
            assert!(
                evicted,
                "num_cached > 0 implies a chain tail is a candidate"
            );
        }
    }

    /// Allocate `n` blocks (one reference each), evicting by policy when none is free.
    /// All or nothing: on error nothing changed except the `alloc_failures` counter.
    pub(crate) fn allocate(&mut self, n: u32) -> Result<Vec<BlockId>, AllocError> {
        let available = self.available_blocks();
        if n > available {
            self.counters.alloc_failures += 1;
            return Err(AllocError::OutOfBlocks {
                needed: n,
                available,
            });
        }
        let mut out = Vec::with_capacity(n as usize);
        for _ in 0..n {
            if self.pool.num_free() == 0 {
                let evicted = self.evict_one(EvictionCause::Capacity);
                assert!(
                    evicted,
                    "available blocks were counted, so a chain tail is a candidate"
                );
            }
            let id = self
                .pool
                .take_free()
                .expect("a block was free or just evicted");
            self.num_in_use += 1;
            out.push(id);
        }
        self.counters.blocks_allocated += u64::from(n);
        Ok(out)
    }
}
