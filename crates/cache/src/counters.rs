//! Plain figures the server exports: global counters, eviction causes, usage and fragmentation.
//! Owns only data types; never computes them (the cache module keeps them up to date).

/// Why a block left the cache.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, serde::Serialize)]
pub enum EvictionCause {
    /// An allocation needed a block and none was free.
    Capacity,
    /// Released blocks pushed the cached total over `max_cached_fraction`.
    Watermark,
    /// The tenant was at its quota of cached blocks.
    Quota,
    /// An explicit flush (all, namespace or tenant).
    Flush,
}

/// Evicted blocks by cause.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct EvictionCounts {
    pub capacity: u64,
    pub watermark: u64,
    pub quota: u64,
    pub flush: u64,
    /// Of the above (except flush), blocks that carried retention when evicted.
    pub retained: u64,
    /// Of the above (except flush), blocks of a tenant within its reservation (nothing else
    /// could go).
    pub reserved: u64,
}

impl EvictionCounts {
    /// Evictions that made room (everything but flushes).
    pub fn total_pressure(&self) -> u64 {
        self.capacity + self.watermark + self.quota
    }
}

/// Global counters (monotonic unless noted; `slru_protected_capacity_blocks` is a gauge).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Counters {
    pub lookups: u64,
    pub lookup_hit_tokens: u64,
    pub lookup_miss_tokens: u64,
    pub blocks_allocated: u64,
    pub alloc_failures: u64,
    pub blocks_published: u64,
    /// Published blocks whose key was already cached: the duplicate was dropped.
    pub publish_duplicates: u64,
    pub evictions: EvictionCounts,
    pub forks: u64,
    pub copy_on_write_blocks: u64,
    pub pins_created: u64,
    pub pins_released: u64,
    pub sessions_retained: u64,
    pub sessions_released: u64,
    pub retention_expiries: u64,
    /// Blocks a pin or retain request could not retain because of `max_retained_fraction`.
    pub retention_refused_blocks: u64,
    pub slru_promotions: u64,
    pub slru_demotions: u64,
    /// Gauge: the protected segment's current capacity in blocks (segmented LRU: fixed; adaptive
    /// segmented LRU: moved by ghost hits; LRU and LFU: 0).
    pub slru_protected_capacity_blocks: u64,
    /// Adaptive segmented LRU: ghost hits that grew the protected capacity (not counted when it
    /// was already at its maximum).
    pub slru_adaptations_up: u64,
    /// Adaptive segmented LRU: ghost hits that shrank the protected capacity.
    pub slru_adaptations_down: u64,
    /// Adaptive segmented LRU: lookups that stopped at a key recently evicted from probation.
    pub slru_ghost_probation_hits: u64,
    /// Adaptive segmented LRU: lookups that stopped at a key recently evicted from the protected
    /// class (protected or demoted from it).
    pub slru_ghost_protected_hits: u64,
}

/// Where every block of the pool is. `free + in_use + cached == total` always.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct BlockUsage {
    pub total: u32,
    pub free: u32,
    /// Referenced by a sequence or an outstanding prefix match.
    pub in_use: u32,
    /// Published and unreferenced: kept for reuse, all reclaimable by eviction.
    pub cached: u32,
    /// Of `cached`, those evictable right now (chain tails).
    pub evictable_now: u32,
    /// Blocks carrying any retention (pins included), referenced or not.
    pub retained: u32,
    /// Blocks carrying a pin.
    pub pinned: u32,
}

/// Unused token slots in blocks held by sequences.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Fragmentation {
    pub allocated_slots: u64,
    pub unused_slots: u64,
}

impl Fragmentation {
    /// `unused_slots / allocated_slots` (0 when nothing is allocated).
    pub fn ratio(&self) -> f64 {
        if self.allocated_slots == 0 {
            0.0
        } else {
            self.unused_slots as f64 / self.allocated_slots as f64
        }
    }
}
