//! A point-in-time copy of everything the server exports about the engine and its cache.

use cache::{BlockUsage, Counters, TenantCounters, TenantId};

use crate::stats::EngineStats;
use crate::tiering::TieringSnapshot;

/// One warm-up prompt pinned at start.
#[derive(Debug, Clone, PartialEq)]
pub struct PinnedPrompt {
    pub name: String,
    pub tenant: TenantId,
    pub num_tokens: usize,
    pub pinned_tokens: usize,
}

#[derive(Debug, Clone)]
pub struct EngineSnapshot {
    pub stats: EngineStats,
    pub cache: Counters,
    pub usage: BlockUsage,
    /// Unused token slots in allocated blocks / allocated slots.
    pub fragmentation: f64,
    pub tenants: Vec<(TenantId, TenantCounters)>,
    pub num_waiting: usize,
    pub num_running: usize,
    pub block_size: usize,
    pub num_blocks: usize,
    pub kv_bytes_per_token: usize,
    pub kv_codec: String,
    pub prefix_caching: bool,
    pub pinned: Vec<PinnedPrompt>,
    /// Storage tiers: per-tier store counters and the engine's (empty without tiers).
    pub tiers: TieringSnapshot,
}
