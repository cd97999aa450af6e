//! Engine configuration (plain data; validated by `EngineCore::new`).

use cache::EvictionPolicy;
use model::KvDtype;

use crate::tiering::TierLoadPolicy;

#[derive(Debug, Clone)]
pub struct EngineConfig {
    /// KV blocks in the pool.
    pub num_blocks: usize,
    /// Tokens per block.
    pub block_size: usize,
    /// Tokens per forward step (prefill chunks plus decodes).
    pub max_batch_tokens: usize,
    /// Sequences per step.
    pub max_seqs: usize,
    pub kv_dtype: KvDtype,
    /// Automatic prefix caching (lookup on admission, publish written blocks).
    pub prefix_caching: bool,
    pub policy: EvictionPolicy,
    pub threads: usize,
    /// Storage tiers after the active pool, consulted in order (needs `prefix_caching`).
    pub tiers: Vec<tier::TierConfig>,
    /// Demote evicted blocks to every tier (`true`) or only the first (write-back, `false`).
    pub tier_write_through: bool,
    /// Also write each block to the tiers as soon as it is computed, not only when it is
    /// evicted: other servers sharing a tier (Redis) then find it at once, at the cost of
    /// writing every block once.
    pub tier_write_on_publish: bool,
    /// When a tier hit is loaded rather than recomputed.
    pub tier_load_policy: TierLoadPolicy,
    /// Cap on K/V bytes that prefetches of not-yet-admitted requests may hold in host memory
    /// (past it, a request's lookup starts when it reaches admission).
    pub tier_prefetch_max_bytes: usize,
    /// How long one step's admissions may wait in all for tier lookups still in flight before
    /// deferring those requests to a later step (default 2 ms: a RAM-tier lookup takes
    /// microseconds). A large value makes admission wait for every lookup, so scheduling no
    /// longer depends on tier timing (deterministic tests).
    pub tier_admission_wait: std::time::Duration,
    /// Target duration of a step that carries decodes: prefill chunks mixed into such a step
    /// are cut to what the online cost model (`step_budget`) predicts fits, so inter-token
    /// latency stays bounded while long prompts stream in. `None`: only `max_batch_tokens`.
    pub step_time_target: Option<std::time::Duration>,
    /// Prefill tokens a step with decodes may always carry (prompts never starve).
    pub min_prefill_tokens_per_step: usize,
}

impl Default for EngineConfig {
    fn default() -> Self {
        EngineConfig {
            num_blocks: 2048,
            block_size: 16,
            max_batch_tokens: 512,
            max_seqs: 64,
            kv_dtype: KvDtype::F16,
            prefix_caching: true,
            policy: EvictionPolicy::Lru,
            threads: std::thread::available_parallelism().map_or(1, |n| n.get()),
            tiers: Vec::new(),
            tier_write_through: false,
            tier_write_on_publish: false,
            tier_load_policy: TierLoadPolicy::CostModel,
            tier_prefetch_max_bytes: crate::tiering::DEFAULT_PREFETCH_MAX_BYTES,
            tier_admission_wait: crate::tiering::DEFAULT_ADMISSION_WAIT,
            step_time_target: None,
            min_prefill_tokens_per_step: 32,
        }
    }
}
