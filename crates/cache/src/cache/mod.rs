//! [`KvCache`]: the one owner of all cache state, and its read-only accessors. The operations live
//! in the sibling files (one concern each); the state transitions of a single block live in
//! `blocks.rs`. Never does I/O, never reads a clock, never touches K/V bytes.

mod adapt;
mod blocks;
mod diverge;
mod flush;
mod lookup;
mod retain;
mod seq;

use std::collections::BTreeMap;

use crate::config::{CacheConfig, EvictionPolicy};
use crate::counters::{BlockUsage, Counters, Fragmentation};
use crate::error::{ConfigError, SeqError};
use crate::events::CacheEvent;
use crate::evict::adaptive::Adaptive;
use crate::evict::reuse::ReuseSketch;
use crate::evict::slru::ProtectedSegment;
use crate::evict::Candidates;
use crate::ids::{BlockId, SeqId, TenantId, Tick};
use crate::index::PrefixIndex;
use crate::key::{BlockKey, NamespaceKey};
use crate::pool::Pool;
use crate::retention::Registry;
use crate::table::Sequences;
use crate::tenant::{TenantCounters, Tenants};

pub use diverge::{MissReason, PrefixMiss};
pub use lookup::PrefixMatch;
pub use retain::{PinOutcome, RetainOutcome, SessionRetention};
pub use seq::{BlockCopy, BlockReplacement, Fork, PublishReport};

/// An outstanding [`PrefixMatch`]: its blocks hold references until it becomes a sequence or is
/// released.
#[derive(Debug)]
pub(crate) struct OutstandingMatch {
    pub ns: NamespaceKey,
    pub blocks: Vec<BlockId>,
    /// Its namespace was flushed since the lookup: a sequence made from it never publishes.
    pub sealed: bool,
    /// What the lookup added to the hit and miss counters (taken back if it is released).
    pub hit_tokens: usize,
    pub miss_tokens: usize,
}

/// Paged KV-cache bookkeeping: block pool, block tables, prefix index, eviction, retention,
/// tenants. See the crate docs for the lifecycle.
#[derive(Debug)]
pub struct KvCache {
    pub(crate) config: CacheConfig,
    pub(crate) block_size: usize,
    pub(crate) pool: Pool,
    pub(crate) index: PrefixIndex,
    pub(crate) candidates: Candidates,
    pub(crate) protected: ProtectedSegment,
    /// Ghost lists and bounds of the adaptive segmented LRU (`None` for every other policy).
    pub(crate) adaptive: Option<Adaptive>,
    /// Miss diagnostics: sibling blocks and recently evicted keys.
    pub(crate) divergence: diverge::Divergence,
    pub(crate) seqs: Sequences,
    pub(crate) matches: BTreeMap<u64, OutstandingMatch>,
    pub(crate) next_match: u64,
    pub(crate) registry: Registry,
    pub(crate) tenants: Tenants,
    pub(crate) counters: Counters,
    pub(crate) events: Vec<CacheEvent>,
    pub(crate) clock: Tick,
    /// Referenced blocks.
    pub(crate) num_in_use: u32,
    /// Published, unreferenced blocks.
    pub(crate) num_cached: u32,
    /// Sum over sequences of unused token slots.
    pub(crate) unused_slots: u64,
    pub(crate) max_cached_blocks: u32,
    pub(crate) max_retained_blocks: u32,
    /// Reuse-aware LRU's read counts and bonus (`None` for every other policy).
    pub(crate) reuse: Option<Reuse>,
}

/// Reuse-aware LRU's state (`evict/reuse.rs`).
#[derive(Debug)]
pub(crate) struct Reuse {
    pub sketch: ReuseSketch,
    pub bonus_ms: u64,
}

impl KvCache {
    /// A cache with every block free.
    pub fn new(config: CacheConfig) -> Result<KvCache, ConfigError> {
        config.validate()?;
        let (protected_capacity, min_capacity, max_capacity) = config.protected_capacity_bounds();
        let adaptive = matches!(config.policy, EvictionPolicy::AdaptiveSegmentedLru { .. })
            .then(|| Adaptive::new(min_capacity, max_capacity, config.num_blocks));
        Ok(KvCache {
            block_size: config.block_size as usize,
            pool: Pool::new(config.num_blocks),
            index: PrefixIndex::default(),
            candidates: Candidates::default(),
            protected: ProtectedSegment {
                capacity: protected_capacity,
                set: Default::default(),
            },
            adaptive,
            divergence: diverge::Divergence::new(config.num_blocks as usize),
            seqs: Sequences::default(),
            matches: BTreeMap::new(),
            next_match: 0,
            registry: Registry::default(),
            tenants: Tenants {
                counters: BTreeMap::new(),
                quotas: config.tenant_quota_blocks.clone(),
                reserved: config.tenant_reserved_blocks.clone(),
                retained_quotas: config.tenant_max_retained_blocks.clone(),
            },
            counters: Counters {
                slru_protected_capacity_blocks: u64::from(protected_capacity),
                ..Counters::default()
            },
            events: Vec::new(),
            clock: Tick(0),
            num_in_use: 0,
            num_cached: 0,
            unused_slots: 0,
            max_cached_blocks: config.blocks_of(config.max_cached_fraction),
            max_retained_blocks: config.blocks_of(config.max_retained_fraction),
            reuse: match config.policy {
                EvictionPolicy::ReuseAwareLru { reuse_bonus_ms } => Some(Reuse {
                    sketch: ReuseSketch::new(config.num_blocks),
                    bonus_ms: reuse_bonus_ms,
                }),
                _ => None,
            },
            config,
        })
    }

    /// The configuration this cache was built with.
    pub fn config(&self) -> &CacheConfig {
        &self.config
    }

    /// Tokens per block.
    pub fn block_size(&self) -> usize {
        self.block_size
    }

    /// The latest tick seen (the cache's monotonic logical clock).
    pub fn clock(&self) -> Tick {
        self.clock
    }

    /// Global counters.
    pub fn counters(&self) -> &Counters {
        &self.counters
    }

    /// Counters of one tenant (zeros if never seen).
    pub fn tenant_counters(&self, tenant: TenantId) -> TenantCounters {
        self.tenants
            .counters
            .get(&tenant)
            .copied()
            .unwrap_or_default()
    }

    /// Counters of every tenant seen.
    pub fn all_tenant_counters(&self) -> impl Iterator<Item = (TenantId, &TenantCounters)> {
        self.tenants.counters.iter().map(|(t, c)| (*t, c))
    }

    /// Set (or clear with `None`) a tenant's reserved minimum of cached blocks (see
    /// [`CacheConfig::tenant_reserved_blocks`]); the config's bound on the total is checked.
    pub fn set_tenant_reservation(
        &mut self,
        tenant: TenantId,
        reserved_blocks: Option<u32>,
    ) -> Result<(), ConfigError> {
        let mut config = self.config.clone();
        match reserved_blocks {
            Some(r) => config.tenant_reserved_blocks.insert(tenant, r),
            None => config.tenant_reserved_blocks.remove(&tenant),
        };
        config.tenant_quota_blocks = self.tenants.quotas.clone();
        config.validate()?;
        self.tenants.reserved = config.tenant_reserved_blocks.clone();
        self.config = config;
        Ok(())
    }

    /// Set (or clear with `None`) a tenant's quota of cached blocks. Applies to later publishes.
    pub fn set_tenant_quota(&mut self, tenant: TenantId, quota_blocks: Option<u32>) {
        match quota_blocks {
            Some(q) => self.tenants.quotas.insert(tenant, q),
            None => self.tenants.quotas.remove(&tenant),
        };
    }

    /// Where every block is.
    pub fn usage(&self) -> BlockUsage {
        BlockUsage {
            total: self.config.num_blocks,
            free: self.pool.num_free(),
            in_use: self.num_in_use,
            cached: self.num_cached,
            evictable_now: self.candidates.len() as u32,
            retained: self.registry.num_retained_blocks,
            pinned: self.registry.num_pinned_blocks,
        }
    }

    /// Reuse-aware LRU: the bonus (ms) blocks read at least twice earn; every block is
    /// re-ranked when it changes (call it when the value moves, not per request). No effect
    /// under other policies.
    pub fn set_reuse_bonus(&mut self, bonus_ms: u64) {
        if let Some(r) = self.reuse.as_mut().filter(|r| r.bonus_ms != bonus_ms) {
            r.bonus_ms = bonus_ms;
            self.rerank_all();
        }
    }

    /// Blocks that may still take on retention before `max_retained_fraction` is reached.
    pub fn retention_headroom(&self) -> u32 {
        self.max_retained_blocks
            .saturating_sub(self.registry.num_retained_blocks)
    }

    /// Blocks an allocation can get right now: free plus every unreferenced cached block.
    pub fn available_blocks(&self) -> u32 {
        self.pool.num_free() + self.num_cached
    }

    /// Whether `num_blocks` blocks can be allocated now (evicting as needed).
    pub fn can_allocate(&self, num_blocks: u32) -> bool {
        num_blocks <= self.available_blocks()
    }

    /// Unused token slots in blocks held by sequences.
    pub fn fragmentation(&self) -> Fragmentation {
        Fragmentation {
            allocated_slots: u64::from(self.num_in_use) * self.block_size as u64,
            unused_slots: self.unused_slots,
        }
    }

    /// Number of published keys.
    pub fn num_published(&self) -> usize {
        self.index.len()
    }

    /// Take every event recorded since the last drain (empty unless `record_events`).
    pub fn drain_events(&mut self) -> Vec<CacheEvent> {
        std::mem::take(&mut self.events)
    }

    /// The block table of a sequence.
    pub fn block_table(&self, seq: SeqId) -> Result<&[BlockId], SeqError> {
        Ok(&self.sequence(seq)?.blocks)
    }

    /// Tokens appended to a sequence so far.
    pub fn num_tokens(&self, seq: SeqId) -> Result<usize, SeqError> {
        Ok(self.sequence(seq)?.tokens.len())
    }

    /// Leading blocks of a sequence that are published (visible to lookups).
    pub fn num_published_blocks(&self, seq: SeqId) -> Result<usize, SeqError> {
        let s = self.sequence(seq)?;
        Ok(if s.sealed { 0 } else { s.keys.len() })
    }

    /// Live sequences.
    pub fn num_sequences(&self) -> usize {
        self.seqs.map.len()
    }

    /// The published key of a block, if it is published.
    pub fn block_key(&self, block: BlockId) -> Option<BlockKey> {
        let b = self.pool.blocks.get(block.index())?;
        b.published.map(|p| p.key)
    }

    /// References held on a block.
    pub fn ref_count(&self, block: BlockId) -> Option<u32> {
        self.pool.blocks.get(block.index()).map(|b| b.ref_count)
    }

    /// The current eviction order of candidate blocks (first = evicted next). O(candidates).
    pub fn eviction_order(&self) -> Vec<BlockId> {
        self.candidates.global.iter().map(|(_, id)| *id).collect()
    }

    pub(crate) fn sequence(&self, seq: SeqId) -> Result<&crate::table::Sequence, SeqError> {
        self.seqs
            .map
            .get(&seq)
            .ok_or(SeqError::UnknownSequence(seq))
    }

    /// Advance the logical clock and return "now".
    pub(crate) fn advance(&mut self, tick: Tick) -> Tick {
        self.clock = self.clock.max(tick);
        self.clock
    }
}
