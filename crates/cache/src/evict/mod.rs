//! Eviction candidates: the ordered sets of blocks that may be evicted now, and the order key.
//! Owns the candidate sets (global and per tenant); never changes block state itself.
//!
//! # Eviction order (all policies)
//!
//! A block is a *candidate* when it is published, unreferenced, and has no published child (it is
//! the tail of its chain). Evicting a tail can make its parent a candidate, so a chain is always
//! evicted tail first and a child is never indexed without its parent.
//!
//! Candidates are kept in a `BTreeSet<(OrderKey, BlockId)>`; eviction pops the smallest. The key is
//! `(retention rank, policy primary, last_use, Reverse(depth))`, then `BlockId`:
//! 1. retention rank (see `retention.rs`): unretained blocks first, then session-retained blocks
//!    (lower priority first, then later expiry: the most recently paused first), pinned last;
//! 2. the policy's primary key ([`lru`], [`lfu`], [`slru`]; [`adaptive`] segmented LRU orders
//!    exactly as [`slru`] and only moves the protected capacity);
//! 3. least recent `last_use` first (reuse-aware LRU: plus the block's reuse bonus, see
//!    [`reuse`]);
//! 4. deeper chain position first;
//! 5. lower `BlockId` first.
//!
//! Tenant reservations come before all of this: while some tenant holding more than its
//! reserved minimum (or having none) has a candidate, the first such candidate goes; a tenant
//! within its reservation loses a block only when no other candidate exists (the running
//! sequences need the block; admission never deadlocks on reservations).

pub mod adaptive;
pub mod ghost;
pub mod lfu;
pub mod lru;
pub mod reuse;
pub mod slru;

use std::cmp::Reverse;
use std::collections::{BTreeMap, BTreeSet};

use crate::config::EvictionPolicy;
use crate::ids::{BlockId, TenantId, Tick};
use crate::retention::RetentionRank;

/// Sort key of an eviction candidate; smaller is evicted first.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) struct OrderKey {
    pub rank: RetentionRank,
    pub primary: u64,
    pub last_use: Tick,
    pub depth: Reverse<u32>,
}

/// The statistics the policies order by.
#[derive(Clone, Copy, Debug)]
pub(crate) struct BlockStats {
    pub last_use: Tick,
    pub hits: u32,
    pub protected: bool,
    pub depth: u32,
    /// Reuse-aware LRU: the bonus (ms) this block earns now (0: read fewer than twice).
    pub reuse_bonus_ms: u64,
}

/// The policy's primary key for a block.
pub(crate) fn primary_key(policy: EvictionPolicy, stats: &BlockStats) -> u64 {
    match policy {
        EvictionPolicy::Lru | EvictionPolicy::ReuseAwareLru { .. } => lru::primary_key(stats),
        EvictionPolicy::Lfu => lfu::primary_key(stats),
        EvictionPolicy::SegmentedLru { .. } | EvictionPolicy::AdaptiveSegmentedLru { .. } => {
            slru::primary_key(stats)
        }
    }
}

/// Build the full order key.
pub(crate) fn order_key(
    policy: EvictionPolicy,
    rank: RetentionRank,
    stats: &BlockStats,
) -> OrderKey {
    OrderKey {
        rank,
        primary: primary_key(policy, stats),
        last_use: Tick(stats.last_use.0.saturating_add(stats.reuse_bonus_ms)),
        depth: Reverse(stats.depth),
    }
}

/// Global and per-tenant ordered candidate sets (the per-tenant sets serve quota eviction).
#[derive(Debug, Default)]
pub(crate) struct Candidates {
    pub global: BTreeSet<(OrderKey, BlockId)>,
    pub by_tenant: BTreeMap<TenantId, BTreeSet<(OrderKey, BlockId)>>,
}

impl Candidates {
    pub fn insert(&mut self, tenant: TenantId, key: OrderKey, id: BlockId) {
        let fresh = self.global.insert((key, id));
        debug_assert!(fresh, "{id} inserted twice into the candidate set");
        self.by_tenant.entry(tenant).or_default().insert((key, id));
    }

    pub fn remove(&mut self, tenant: TenantId, key: OrderKey, id: BlockId) {
        let present = self.global.remove(&(key, id));
        debug_assert!(present, "{id} missing from the candidate set");
        if let Some(set) = self.by_tenant.get_mut(&tenant) {
            set.remove(&(key, id));
            if set.is_empty() {
                self.by_tenant.remove(&tenant);
            }
        }
    }

    pub fn first(&self) -> Option<BlockId> {
        self.global.first().map(|(_, id)| *id)
    }

    /// The first candidate of any tenant for which `protected` is false (in global order), or
    /// `None` when every candidate belongs to a protected tenant.
    pub fn first_unprotected(&self, protected: impl Fn(TenantId) -> bool) -> Option<BlockId> {
        self.by_tenant
            .iter()
            .filter(|(t, _)| !protected(**t))
            .filter_map(|(_, set)| set.first())
            .min()
            .map(|(_, id)| *id)
    }

    pub fn first_of_tenant(&self, tenant: TenantId) -> Option<BlockId> {
        self.by_tenant.get(&tenant)?.first().map(|(_, id)| *id)
    }

    pub fn len(&self) -> usize {
        self.global.len()
    }
}
