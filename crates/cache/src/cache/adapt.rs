//! The cache's hooks into the adaptive segmented LRU (`evict/adaptive.rs`): ghost keys on pressure
//! evictions, ghost hits on lookup misses (which move the protected capacity and demote down to
//! it), forgetting keys that are published again or flushed. Every hook is a no-op for the other
//! policies. Never changes the order within the segments.

use super::KvCache;
use crate::evict::adaptive::{GhostHit, Segment};
use crate::key::{BlockKey, NamespaceKey};

impl KvCache {
    /// A published block is evicted under pressure (not flushed): remember its key.
    pub(crate) fn ghost_on_evict(
        &mut self,
        key: BlockKey,
        ns: NamespaceKey,
        protected: bool,
        hits: u32,
    ) {
        if let Some(a) = &mut self.adaptive {
            a.record_eviction(key, ns, Segment::of(protected, hits));
        }
    }

    /// A key is published (resident again): it leaves its ghost list without adapting.
    pub(crate) fn ghost_on_publish(&mut self, key: &BlockKey) {
        if let Some(a) = &mut self.adaptive {
            a.forget(key);
        }
    }

    /// A lookup stopped at `key` (the first block not cached): adapt if it is a ghost.
    pub(crate) fn ghost_on_miss(&mut self, key: &BlockKey) {
        let capacity = self.protected.capacity;
        let Some(a) = &mut self.adaptive else { return };
        let Some(GhostHit {
            segment,
            capacity: new,
        }) = a.on_miss(key, capacity)
        else {
            return;
        };
        let c = &mut self.counters;
        match segment {
            Segment::Probation => c.slru_ghost_probation_hits += 1,
            Segment::Protected => c.slru_ghost_protected_hits += 1,
        }
        if new > capacity {
            c.slru_adaptations_up += 1;
        } else if new < capacity {
            c.slru_adaptations_down += 1;
        }
        c.slru_protected_capacity_blocks = u64::from(new);
        self.protected.capacity = new;
        self.rebalance_protected();
    }

    /// Drop the ghost keys of flushed namespaces so a flushed tenant's keys never linger.
    pub(crate) fn ghost_on_flush(&mut self, in_scope: impl Fn(&NamespaceKey) -> bool) {
        if let Some(a) = &mut self.adaptive {
            a.retain_namespaces(|ns| !in_scope(ns));
        }
    }

    /// The protected segment's current capacity in blocks (0 for LRU and LFU).
    pub fn protected_capacity(&self) -> u32 {
        self.protected.capacity
    }

    /// Keys in the (probation, protected) ghost lists; `None` unless the policy is adaptive.
    pub fn ghost_lens(&self) -> Option<(usize, usize)> {
        self.adaptive
            .as_ref()
            .map(|a| (a.probation.len(), a.protected.len()))
    }
}
