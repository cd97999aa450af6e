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
    /// Segmented LRU whose protected capacity adapts to the workload (ARC's rule, see
    /// `evict/adaptive.rs`): it starts at `initial_protected_fraction` of the pool and moves within
    /// `[min_protected_fraction, max_protected_fraction]`, growing when a lookup misses a block
    /// recently evicted from the protected (frequent) class and shrinking when it misses one
    /// recently evicted from probation. Order within the segments is exactly `SegmentedLru`'s.
    AdaptiveSegmentedLru {
        /// Starting fraction of `num_blocks` the protected segment may hold.
        initial_protected_fraction: f64,
        /// Lower bound of the protected fraction, in `[0, initial_protected_fraction]`.
        min_protected_fraction: f64,
        /// Upper bound of the protected fraction, in `[initial_protected_fraction, 1]`.
        max_protected_fraction: f64,
    },
    /// LRU in which a block read at least twice (reads counted in a bounded sketch that
    /// remembers blocks evicted since) ranks as if used `reuse_bonus_ms` later (logical-clock
    /// ms; [`crate::KvCache::set_reuse_bonus`] moves it at run time). See `evict/reuse.rs`.
    ReuseAwareLru { reuse_bonus_ms: u64 },
}

impl EvictionPolicy {
    /// Adaptive segmented LRU starting at 20% protected (the safest fixed setting on the simulated
    /// agent traces, see docs/history/benchmarks-log.md), free to move over the whole `[0, 1]` range.
    pub const ADAPTIVE_SEGMENTED_LRU: EvictionPolicy = EvictionPolicy::AdaptiveSegmentedLru {
        initial_protected_fraction: 0.2,
        min_protected_fraction: 0.0,
        max_protected_fraction: 1.0,
    };

    /// Reuse-aware LRU with a 300 s bonus (until the engine's learned return time replaces it).
    pub const REUSE_AWARE_LRU: EvictionPolicy = EvictionPolicy::ReuseAwareLru {
        reuse_bonus_ms: 300_000,
    };

    /// Whether blocks are split into probation and protected segments (fixed or adaptive).
    pub fn is_segmented(&self) -> bool {
        matches!(
            self,
            EvictionPolicy::SegmentedLru { .. } | EvictionPolicy::AdaptiveSegmentedLru { .. }
        )
    }
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
    /// Per-tenant reserved minimum of cached blocks: while a tenant holds no more than this, its
    /// blocks are evicted only when no other tenant's unreserved block can go (see
    /// `evict/mod.rs`). The sum over tenants is at most half the pool.
    pub tenant_reserved_blocks: BTreeMap<TenantId, u32>,
    /// Per-tenant cap on blocks its sessions may retain (on top of `max_retained_fraction`).
    pub tenant_max_retained_blocks: BTreeMap<TenantId, u32>,
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
            tenant_reserved_blocks: BTreeMap::new(),
            tenant_max_retained_blocks: BTreeMap::new(),
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
        let reserved: u64 = self
            .tenant_reserved_blocks
            .values()
            .map(|r| u64::from(*r))
            .sum();
        if reserved > u64::from(self.num_blocks / 2) {
            return Err(ConfigError::ReservationsTooLarge {
                reserved,
                num_blocks: self.num_blocks,
            });
        }
        for (tenant, r) in &self.tenant_reserved_blocks {
            if let Some(q) = self.tenant_quota_blocks.get(tenant).filter(|q| *q < r) {
                return Err(ConfigError::ReservationAboveQuota {
                    tenant: tenant.0,
                    reserved: *r,
                    quota: *q,
                });
            }
        }
        match self.policy {
            EvictionPolicy::Lru | EvictionPolicy::Lfu | EvictionPolicy::ReuseAwareLru { .. } => {
                Ok(())
            }
            EvictionPolicy::SegmentedLru { protected_fraction } => {
                check_fraction("protected_fraction", protected_fraction)
            }
            EvictionPolicy::AdaptiveSegmentedLru {
                initial_protected_fraction: initial,
                min_protected_fraction: min,
                max_protected_fraction: max,
            } => {
                check_fraction("initial_protected_fraction", initial)?;
                check_fraction("min_protected_fraction", min)?;
                check_fraction("max_protected_fraction", max)?;
                if min <= initial && initial <= max {
                    Ok(())
                } else {
                    Err(ConfigError::ProtectedBoundsOrder { min, initial, max })
                }
            }
        }
    }

    /// Protected-segment capacity in blocks: `(initial, min, max)`; all zero for LRU and LFU, all
    /// equal for fixed segmented LRU.
    pub(crate) fn protected_capacity_bounds(&self) -> (u32, u32, u32) {
        match self.policy {
            EvictionPolicy::Lru | EvictionPolicy::Lfu | EvictionPolicy::ReuseAwareLru { .. } => {
                (0, 0, 0)
            }
            EvictionPolicy::SegmentedLru { protected_fraction } => {
                let c = self.blocks_of(protected_fraction);
                (c, c, c)
            }
            EvictionPolicy::AdaptiveSegmentedLru {
                initial_protected_fraction,
                min_protected_fraction,
                max_protected_fraction,
            } => (
                self.blocks_of(initial_protected_fraction),
                self.blocks_of(min_protected_fraction),
                self.blocks_of(max_protected_fraction),
            ),
        }
    }

    /// `floor(fraction · num_blocks)` (monotone in `fraction`, so ordered bounds stay ordered).
    pub(crate) fn blocks_of(&self, fraction: f64) -> u32 {
        (fraction * f64::from(self.num_blocks)).floor() as u32
    }
}

fn check_fraction(name: &'static str, value: f64) -> Result<(), ConfigError> {
    if (0.0..=1.0).contains(&value) {
        Ok(())
    } else {
        Err(ConfigError::FractionOutOfRange { name, value })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn with(policy: EvictionPolicy) -> CacheConfig {
        let mut c = CacheConfig::new(100);
        c.policy = policy;
        c
    }

    fn adaptive(initial: f64, min: f64, max: f64) -> CacheConfig {
        with(EvictionPolicy::AdaptiveSegmentedLru {
            initial_protected_fraction: initial,
            min_protected_fraction: min,
            max_protected_fraction: max,
        })
    }

    #[test]
    fn adaptive_bounds_are_validated() {
        assert_eq!(adaptive(0.2, 0.1, 0.9).validate(), Ok(()));
        assert_eq!(adaptive(0.0, 0.0, 0.0).validate(), Ok(()));
        assert_eq!(
            with(EvictionPolicy::ADAPTIVE_SEGMENTED_LRU).validate(),
            Ok(())
        );
        assert_eq!(
            adaptive(0.05, 0.1, 0.9).validate(),
            Err(ConfigError::ProtectedBoundsOrder {
                min: 0.1,
                initial: 0.05,
                max: 0.9
            })
        );
        assert_eq!(
            adaptive(0.95, 0.1, 0.9).validate(),
            Err(ConfigError::ProtectedBoundsOrder {
                min: 0.1,
                initial: 0.95,
                max: 0.9
            })
        );
        assert_eq!(
            adaptive(0.2, -0.1, 0.9).validate(),
            Err(ConfigError::FractionOutOfRange {
                name: "min_protected_fraction",
                value: -0.1
            })
        );
        assert!(matches!(
            adaptive(0.2, 0.1, 1.5).validate(),
            Err(ConfigError::FractionOutOfRange {
                name: "max_protected_fraction",
                ..
            })
        ));
        assert!(matches!(
            adaptive(f64::NAN, 0.1, 0.9).validate(),
            Err(ConfigError::FractionOutOfRange {
                name: "initial_protected_fraction",
                ..
            })
        ));
    }

    #[test]
    fn capacity_bounds_in_blocks() {
        assert_eq!(
            adaptive(0.25, 0.1, 0.9).protected_capacity_bounds(),
            (25, 10, 90)
        );
        let slru = with(EvictionPolicy::SegmentedLru {
            protected_fraction: 0.5,
        });
        assert_eq!(slru.protected_capacity_bounds(), (50, 50, 50));
        assert_eq!(
            with(EvictionPolicy::Lru).protected_capacity_bounds(),
            (0, 0, 0)
        );
        assert!(EvictionPolicy::ADAPTIVE_SEGMENTED_LRU.is_segmented());
        assert!(!EvictionPolicy::Lfu.is_segmented());
    }
}
