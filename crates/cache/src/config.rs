//! Cache configuration and its validation. Owns no state; never reads files or the environment.

use std::collections::BTreeMap;

use crate::error::ConfigError;
use crate::ids::TenantId;

/// Which order unreferenced cached blocks are evicted in (see `evict/` for the exact orders).
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum EvictionPolicy {
    /// Least recently used first.
    Lru,
    /// Least frequently used first (ties: least recently used).
    Lfu,
    /// Segmented LRU: blocks hit a second time are promoted to a protected segment holding at most
    /// `protected_fraction` of the pool; the probation segment is evicted first.
    SegmentedLru {
        /// Fraction of `num_blocks` the protected segment may hold, in `[0, 1]`.
        protected_fraction: f64,
    },
}

/// Configuration of one [`crate::KvCache`].
#[derive(Clone, Debug, PartialEq)]
pub struct CacheConfig {
    /// Number of blocks in the pool.
    pub num_blocks: u32,
    /// Tokens per block (default 16).
    pub block_size: u32,
    /// Eviction order among unreferenced cached blocks.
    pub policy: EvictionPolicy,
    /// Watermark: at most this fraction of the pool may be held by unreferenced cached blocks
    /// (kept for reuse); beyond it, released blocks are evicted at once. `1.0` = no limit.
    pub max_cached_fraction: f64,
    /// At most this fraction of the pool may carry retention (pins and session retention).
    pub max_retained_fraction: f64,
    /// Per-tenant cap on published (cached) blocks, referenced or not.
    pub tenant_quota_blocks: BTreeMap<TenantId, u32>,
    /// Record [`crate::CacheEvent`]s for [`crate::KvCache::drain_events`]. Off by default so an
    /// undrained buffer cannot grow.
    pub record_events: bool,
}

impl CacheConfig {
    /// A config with `num_blocks` blocks and defaults for the rest: block size 16, LRU, no watermark,
    /// retention capped at half the pool, no quotas, no events.
    pub fn new(num_blocks: u32) -> CacheConfig {
        CacheConfig {
            num_blocks,
            block_size: 16,
            policy: EvictionPolicy::Lru,
            max_cached_fraction: 1.0,
            max_retained_fraction: 0.5,
            tenant_quota_blocks: BTreeMap::new(),
            record_events: false,
        }
    }

    /// Check ranges; every constructor of the cache calls this.
    pub fn validate(&self) -> Result<(), ConfigError> {
        if self.num_blocks == 0 {
            return Err(ConfigError::ZeroBlocks);
        }
        if self.block_size == 0 {
            return Err(ConfigError::ZeroBlockSize);
        }
        let fractions = [
            ("max_cached_fraction", self.max_cached_fraction),
            ("max_retained_fraction", self.max_retained_fraction),
        ];
        for (name, value) in fractions {
            if !(0.0..=1.0).contains(&value) {
                return Err(ConfigError::FractionOutOfRange { name, value });
            }
        }
        if let EvictionPolicy::SegmentedLru { protected_fraction } = self.policy {
            if !(0.0..=1.0).contains(&protected_fraction) {
                return Err(ConfigError::FractionOutOfRange {
                    name: "protected_fraction",
                    value: protected_fraction,
                });
            }
        }
        Ok(())
    }

    /// `floor(fraction · num_blocks)`.
    pub(crate) fn blocks_of(&self, fraction: f64) -> u32 {
        (fraction * f64::from(self.num_blocks)).floor() as u32
    }
}
