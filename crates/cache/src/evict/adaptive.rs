//! Adaptive segmented LRU: ARC's adaptation rule applied to the protected-segment capacity. Owns
//! the two ghost lists and the capacity bounds; never evicts, promotes or demotes (the cache does,
//! and demotes down to a shrunk capacity through its usual rebalance).
//!
//! # The rule
//!
//! Order within the segments is exactly segmented LRU's ([`super::slru`]). On top of it:
//! - every block evicted under pressure (capacity, watermark, quota; never a flush) leaves its key
//!   in a ghost list: the *protected ghost* when it belonged to the frequent class (protected, or
//!   demoted from protected: hit at least `PROMOTION_HITS` times), the *probation ghost* otherwise
//!   (hit once). A demoted block counts as protected because it was pushed out only because the
//!   protected segment was too small — ARC's T2 → B2 path. Each ghost keeps the newest
//!   `num_blocks` keys;
//! - a lookup whose walk stops at a key in a ghost list removes it and adapts: a probation-ghost
//!   hit means probation was too small, so the protected capacity shrinks by
//!   `max(1, |protected ghost| / |probation ghost|)` blocks; a protected-ghost hit grows it by
//!   `max(1, |probation ghost| / |protected ghost|)` (sizes before removal, integer division),
//!   at most `num_blocks / 16` blocks per hit, clamped to `[min, max]`;
//! - a key published again leaves its ghost list silently; flushes drop the flushed keys.
//!
//! Two choices differ from a literal reading of ARC, both measured on the simulated agent traces
//! (`tests/sim_adaptive.rs`). Demoted blocks go to the protected ghost: blocks are almost never
//! evicted straight from the protected segment (probation goes first), so classifying by the
//! segment at eviction time leaves the protected ghost empty and the capacity can only shrink.
//! The step is capped: agent traces evict far more one-off blocks than frequent ones, so
//! `|probation ghost| / |protected ghost|` reaches the thousands and one protected-ghost hit would
//! fill the whole pool with protected blocks (on the ReAct trace at 10% capacity that cost 12
//! points of hit rate against LRU; with the cap the policy beats LRU there).

use super::ghost::GhostList;
use super::slru::PROMOTION_HITS;
use crate::key::{BlockKey, NamespaceKey};

/// The segment class a ghost key was evicted from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Segment {
    Probation,
    Protected,
}

impl Segment {
    /// Class of a block at eviction: protected if it is (or was, before a demotion) protected.
    pub fn of(protected: bool, hits: u32) -> Segment {
        if protected || hits >= PROMOTION_HITS {
            Segment::Protected
        } else {
            Segment::Probation
        }
    }
}

/// One ghost hit moves the capacity by at most `num_blocks / MAX_STEP_DIVISOR` blocks.
pub(crate) const MAX_STEP_DIVISOR: u32 = 16;

/// ARC's step: how far one hit in `hit`'s ghost moves the protected capacity.
pub(crate) fn step(hit: Segment, probation_ghosts: usize, protected_ghosts: usize) -> u32 {
    let (this, other) = match hit {
        Segment::Probation => (probation_ghosts, protected_ghosts),
        Segment::Protected => (protected_ghosts, probation_ghosts),
    };
    (other / this.max(1)).max(1) as u32
}

/// State of the adaptive policy.
#[derive(Debug)]
pub(crate) struct Adaptive {
    pub min_capacity: u32,
    pub max_capacity: u32,
    /// Largest move of one ghost hit: `max(1, num_blocks / MAX_STEP_DIVISOR)`.
    pub max_step: u32,
    pub probation: GhostList,
    pub protected: GhostList,
}

/// A lookup miss on a ghost key: which ghost, and the protected capacity after adapting.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct GhostHit {
    pub segment: Segment,
    pub capacity: u32,
}

impl Adaptive {
    /// Bounds in blocks; each ghost list keeps at most `num_blocks` keys.
    pub fn new(min_capacity: u32, max_capacity: u32, num_blocks: u32) -> Adaptive {
        debug_assert!(min_capacity <= max_capacity, "validated by CacheConfig");
        let ghost_cap = num_blocks as usize;
        Adaptive {
            min_capacity,
            max_capacity,
            max_step: (num_blocks / MAX_STEP_DIVISOR).max(1),
            probation: GhostList::new(ghost_cap),
            protected: GhostList::new(ghost_cap),
        }
    }

    /// A block left the cache under pressure.
    pub fn record_eviction(&mut self, key: BlockKey, ns: NamespaceKey, segment: Segment) {
        match segment {
            Segment::Probation => self.probation.insert(key, ns),
            Segment::Protected => self.protected.insert(key, ns),
        }
    }

    /// A key is resident again: it is no ghost.
    pub fn forget(&mut self, key: &BlockKey) {
        if !self.probation.remove(key) {
            self.protected.remove(key);
        }
    }

    /// A lookup stopped at `key`: if it is a ghost, remove it and return the adapted capacity.
    pub fn on_miss(&mut self, key: &BlockKey, capacity: u32) -> Option<GhostHit> {
        let segment = if self.probation.contains(key) {
            Segment::Probation
        } else if self.protected.contains(key) {
            Segment::Protected
        } else {
            return None;
        };
        let delta = step(segment, self.probation.len(), self.protected.len()).min(self.max_step);
        let capacity = match segment {
            Segment::Probation => capacity.saturating_sub(delta).max(self.min_capacity),
            Segment::Protected => capacity.saturating_add(delta).min(self.max_capacity),
        };
        self.forget(key);
        Some(GhostHit { segment, capacity })
    }

    /// Keep only ghost keys whose namespace satisfies `keep` (flushes).
    pub fn retain_namespaces(&mut self, keep: impl Fn(&NamespaceKey) -> bool) {
        self.probation.retain_namespaces(&keep);
        self.protected.retain_namespaces(&keep);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ids::TenantId;
    use crate::key::Namespace;

    fn key(i: u8) -> BlockKey {
        BlockKey([i; 32])
    }

    #[test]
    fn step_is_arcs_ratio_with_floor_one() {
        assert_eq!(step(Segment::Probation, 4, 1), 1);
        assert_eq!(step(Segment::Probation, 1, 7), 7);
        assert_eq!(step(Segment::Probation, 2, 7), 3);
        assert_eq!(step(Segment::Protected, 9, 2), 4);
        assert_eq!(step(Segment::Protected, 1, 5), 1);
    }

    #[test]
    fn segment_class_counts_demoted_blocks_as_protected() {
        assert_eq!(Segment::of(false, 1), Segment::Probation);
        assert_eq!(Segment::of(true, 2), Segment::Protected);
        assert_eq!(Segment::of(false, 3), Segment::Protected);
    }

    #[test]
    fn ghost_hits_move_the_capacity_within_bounds() {
        let ns = Namespace::for_tenant(TenantId(0)).key();
        // 160 blocks: one hit moves at most 10.
        let mut a = Adaptive::new(2, 10, 160);
        for i in 0..6 {
            a.record_eviction(key(i), ns, Segment::Probation);
        }
        a.record_eviction(key(100), ns, Segment::Protected);
        // Protected hit: |probation ghost| / |protected ghost| = 6, clamped at the maximum 10.
        let hit = a.on_miss(&key(100), 5).unwrap();
        assert_eq!(
            hit,
            GhostHit {
                segment: Segment::Protected,
                capacity: 10
            }
        );
        assert!(a.on_miss(&key(100), 10).is_none(), "removed on hit");
        // Probation hit with no protected ghosts: step 1, clamped at the minimum.
        assert_eq!(a.on_miss(&key(0), 3).unwrap().capacity, 2);
        assert_eq!(a.on_miss(&key(1), 2).unwrap().capacity, 2);
        assert!(a.on_miss(&key(77), 2).is_none());
        a.forget(&key(2));
        assert_eq!(a.probation.len(), 3);
    }

    #[test]
    fn one_hit_moves_at_most_a_sixteenth_of_the_pool() {
        let ns = Namespace::for_tenant(TenantId(0)).key();
        let mut a = Adaptive::new(0, 64, 64);
        assert_eq!(a.max_step, 4);
        for i in 0..30 {
            a.record_eviction(key(i), ns, Segment::Probation);
        }
        a.record_eviction(key(200), ns, Segment::Protected);
        a.record_eviction(key(201), ns, Segment::Protected);
        // Ratio 30 / 2 = 15, capped at 4.
        assert_eq!(a.on_miss(&key(200), 8).unwrap().capacity, 12);
        // Probation hit: |protected ghost| / |probation ghost| = 1 / 30 -> 1.
        assert_eq!(a.on_miss(&key(3), 12).unwrap().capacity, 11);
        assert_eq!((a.probation.len(), a.protected.len()), (29, 1));
    }
}
