//! Admin endpoints: `POST /v1/cache/flush` and `GET /v1/cache/stats`. Shape only; the figures
//! come from the engine's snapshot.

use serde::{Deserialize, Serialize};

/// Body of `POST /v1/cache/flush`: one tenant by name, or everything when absent.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct FlushRequest {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tenant: Option<String>,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct FlushResponse {
    /// Cached blocks dropped (blocks in use stay with their requests).
    pub flushed_blocks: u64,
}

/// `GET /v1/cache/stats`: where every KV block is and what the prefix cache did.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct CacheStats {
    pub prefix_caching: bool,
    pub kv_codec: String,
    pub block_size: u64,
    pub kv_bytes_per_token: u64,
    pub blocks: BlockUsage,
    /// Unused token slots in blocks held by requests / allocated slots.
    pub fragmentation: f64,
    pub num_running: u64,
    pub num_waiting: u64,
    pub lookups: u64,
    pub hit_tokens: u64,
    pub miss_tokens: u64,
    pub evicted_blocks: u64,
    pub preemptions: u64,
    pub tenants: Vec<TenantCacheStats>,
    /// Warm-up prompts prefilled and pinned at start.
    pub pinned_prompts: Vec<PinnedPromptStats>,
    /// Storage tiers after the active pool, in lookup order (empty when none are configured).
    #[serde(default)]
    pub tiers: Vec<TierCacheStats>,
}

/// One storage tier: the store's counters and what the engine did with it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct TierCacheStats {
    /// `ram`, `disk` or `redis`.
    pub kind: String,
    /// Prompt tokens served from this tier (loaded instead of recomputed).
    pub hit_tokens: u64,
    /// Objects found and verified.
    pub hits: u64,
    /// Objects asked for and not returned.
    pub misses: u64,
    pub bytes_read: u64,
    pub bytes_written: u64,
    /// Objects dropped by the tier's own byte budget.
    pub evictions: u64,
    /// Failed or skipped tier operations.
    pub errors: u64,
    /// Objects rejected by verification (checksum, key, truncation).
    pub corrupt: u64,
    /// Objects / bytes held now, where the store knows.
    pub stored_objects: Option<u64>,
    pub stored_bytes: Option<u64>,
    /// Blocks demoted into this tier from the active pool.
    pub demoted_blocks: u64,
    /// Evicted blocks not written again because this tier already held them.
    #[serde(default)]
    pub already_held_blocks: u64,
    /// Blocks encoded for this lossy tier while the engine computed.
    #[serde(default)]
    pub busy_encoded_blocks: u64,
    /// Hits the cost model loaded / recomputed instead.
    pub load_decisions: u64,
    pub recompute_decisions: u64,
    /// Mean load latency in microseconds (0 before the first load).
    pub mean_load_us: u64,
    /// Measured load bandwidth (bytes/s), once measured.
    pub load_bytes_per_s: Option<f64>,
}

/// `total == free + in_use + cached`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct BlockUsage {
    pub total: u64,
    pub free: u64,
    pub in_use: u64,
    pub cached: u64,
    pub pinned: u64,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct TenantCacheStats {
    pub tenant: String,
    pub lookups: u64,
    pub hit_tokens: u64,
    pub miss_tokens: u64,
    pub cached_blocks: u64,
    pub evicted_blocks: u64,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct PinnedPromptStats {
    pub name: String,
    pub tenant: String,
    pub num_tokens: u64,
    pub pinned_tokens: u64,
}
