//! Engine configuration (plain data; validated by `EngineCore::new`) and its defaults.

use std::time::Duration;

use cache::EvictionPolicy;
use model::KvDtype;

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
    /// Storage tiers after the active pool and how the engine uses them (needs
    /// `prefix_caching` when any store is configured).
    pub tiers: TieringConfig,
    /// Target duration of a step that carries decodes: prefill chunks mixed into such a step
    /// are cut to what the online cost model (`step_budget`) predicts fits, so inter-token
    /// latency stays bounded while long prompts stream in. `None`: only `max_batch_tokens`.
    pub step_time_target: Option<std::time::Duration>,
    /// Prefill tokens a step with decodes may always carry (prompts never starve).
    pub min_prefill_tokens_per_step: usize,
    /// Where to announce blocks stored / removed (pool and tiers) for routers (`None`: off).
    pub kv_events: Option<crate::kv_events::KvEventSink>,
    /// Retention of requests that ended in tool calls (see `tool_pause.rs`).
    pub tool_pause: crate::tool_pause::ToolPauseConfig,
    /// Conversations inferred from prefix continuation for requests that name no session, and
    /// their retention for a learned return time (`cache::InferredRetainer`; `None`: off).
    pub inferred_conversations: Option<cache::InferredConfig>,
    /// Shadow caches that decide, from the traffic so far, whether inferred retention and
    /// reuse-aware LRU's bonus pay (`cache::PolicyDuel`; `None`: both always on). Needs
    /// `inferred_conversations`.
    pub policy_duel: Option<cache::DuelConfig>,
    /// Tenants' shares of the active pool, in blocks (see [`TenantShare`]).
    pub tenant_shares: std::collections::BTreeMap<cache::TenantId, TenantShare>,
    /// Most of the pool (0–1) that sessions, breakpoints, tool pauses, inferred conversations
    /// and pins may retain (`cache::CacheConfig::max_retained_fraction`, default 0.9).
    pub max_retained_fraction: f64,
    /// Compute the prompt rows of prompts of [`model::PREFILL_MIN_TOKENS`]+ tokens in
    /// llama.cpp's tiled prefill attention arithmetic, as llama-server does, and every other
    /// row (generated tokens, short prompts) in its per-row one: logprobs then match
    /// llama.cpp's to ~0.001 where they differ by ~0.015 otherwise (docs/history/benchmarks-log.md
    /// "Held-out fidelity"). A row's arithmetic is then a property of its request, not of the
    /// batch or the chunking; to keep cache hits exact, such requests share blocks in a
    /// namespace of their own and publish their prompt blocks only — so a later turn (or a
    /// preempted request) recomputes earlier generated tokens instead of hitting them. Off by
    /// default. Its kernel (`kernels::ggml_tiled::attend_rows`) prefills as fast as the per-row
    /// engine's or faster on AVX2 CPUs (explicit kernel), 1.5–2× slower on AVX-512 CPUs (still
    /// the compiled portable body); docs/history/benchmarks-log.md "fid6", "fid7". Off: every row in the
    /// engine's attention arithmetic (`model::AttnArith::invariant`: the tiled attention at
    /// every depth), and generated blocks are shared too. On, every step's packed matmuls also
    /// take ggml's float order (`model::MatmulArith::InvariantGgml`) instead of the faster
    /// block-sum order of the default.
    pub llama_cpp_prefill: bool,
    /// Map the host K/V pool's pages when the engine starts (`model::KvRows::prefault`) instead
    /// of on first write: a long-running server pays the page faults and the zeroing once,
    /// before its first request, rather than inside its first requests' steps. Off by default
    /// (tests, benchmarks and one-shot tools build many engines and touch little of their
    /// pools); `agentkv serve` turns it on.
    pub prefault_kv: bool,
}

/// One tenant's share of the active pool, in blocks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct TenantShare {
    /// Reserved minimum: while the tenant holds no more cached blocks than this, other tenants'
    /// traffic cannot evict them (they go only when running sequences need the blocks).
    pub reserved_blocks: Option<u32>,
    /// Maximum: beyond it the tenant's own least valuable blocks are evicted first.
    pub max_blocks: Option<u32>,
    /// Most blocks the tenant's sessions may retain (`cache_control`, session keys).
    pub max_retained_blocks: Option<u32>,
}

impl EngineConfig {
    /// How every forward step computes, chosen once from the configuration: llama-server's
    /// arithmetic with the pool's threads when the engine reproduces llama.cpp
    /// (`llama_cpp_prefill`), else the engine's own (batch-invariant block-sum matmuls, the
    /// tiled attention at every depth).
    pub fn numerics(&self) -> model::Numerics {
        model::Numerics::for_engine(self.llama_cpp_prefill, self.threads)
    }
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
            policy: EvictionPolicy::REUSE_AWARE_LRU,
            threads: std::thread::available_parallelism().map_or(1, |n| n.get()),
            tiers: TieringConfig::default(),
            step_time_target: None,
            min_prefill_tokens_per_step: 32,
            kv_events: None,
            tenant_shares: Default::default(),
            tool_pause: Default::default(),
            inferred_conversations: Some(cache::InferredConfig::default()),
            policy_duel: Some(cache::DuelConfig::default()),
            max_retained_fraction: 0.9,
            llama_cpp_prefill: false,
            prefault_kv: false,
        }
    }
}

/// When a tier hit is loaded instead of recomputed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum TierLoadPolicy {
    /// Load only when the measured load bandwidth predicts it is faster than recomputing at the
    /// measured prefill speed (optimistic until both are measured; a declining tier is re-probed
    /// every [`PROBE_EVERY`] declines so its estimate cannot go stale).
    #[default]
    CostModel,
    /// Always load hits (deterministic; tests and benchmarks).
    Always,
}

/// Default cap on K/V bytes held by prefetches of requests not admitted yet.
pub const DEFAULT_PREFETCH_MAX_BYTES: usize = 1 << 30;

/// Default of `TieringConfig::admission_wait`.
pub const DEFAULT_ADMISSION_WAIT: Duration = Duration::from_millis(2);

/// The storage tiers and the engine's use of them.
#[derive(Debug, Clone)]
pub struct TieringConfig {
    /// Stores after the active pool, consulted in order (empty: no tiers).
    pub stores: Vec<tier::TierConfig>,
    /// The KV codec each tier stores blocks in, in lookup order (missing or `None`: the pool's
    /// codec, bytes as they are). Another codec than the pool's is lossy: blocks are transcoded
    /// on demotion and back on load, and the cache namespace commits to it. `EngineCore::new`
    /// fills it from each store's `codec:` setting.
    pub codecs: Vec<Option<model::kv::KvDtype>>,
    /// Demote evicted blocks to every tier (`true`) or only the first (write-back, `false`).
    pub write_through: bool,
    /// Also write each block to the tiers as soon as it is computed, not only when it is
    /// evicted: other servers sharing a tier (Redis) then find it at once, at the cost of
    /// writing every block once.
    pub write_on_publish: bool,
    /// When a tier hit is loaded rather than recomputed.
    pub load_policy: TierLoadPolicy,
    /// Cap on K/V bytes that prefetches of not-yet-admitted requests may hold in host memory
    /// (past it, a request's lookup starts when it reaches admission).
    pub prefetch_max_bytes: usize,
    /// How long one step's admissions may wait in all for tier lookups still in flight before
    /// deferring those requests to a later step (default 2 ms: a RAM-tier lookup takes
    /// microseconds). A large value makes admission wait for every lookup, so scheduling no
    /// longer depends on tier timing (deterministic tests).
    pub admission_wait: Duration,
    /// A tier lookup still unanswered after this long is abandoned and its request recomputes
    /// (a store that hangs — a frozen Redis — delays a request by this much, never more).
    pub lookup_timeout: Duration,
    /// Bytes of blocks queued for writing to the tiers; past it, new writes are dropped and
    /// counted (a store that stops answering cannot make the engine hoard evicted blocks).
    pub max_queued_write_bytes: usize,
    /// How long a block bound for a lossy tier may wait for the engine to go idle before it is
    /// encoded next to the forward pass (default 1 s). Lossy encodes (≈ 0.3–0.8 ms of CPU per
    /// block) otherwise slow the steps that run beside them, such as the restore that evicted
    /// those blocks; a lookup waiting for the writes, or a write queue past half its cap, ends
    /// the wait at once. Zero: encode as soon as blocks arrive.
    pub encode_deferral: Duration,
}

impl Default for TieringConfig {
    fn default() -> Self {
        TieringConfig {
            stores: Vec::new(),
            codecs: Vec::new(),
            write_through: false,
            write_on_publish: false,
            load_policy: TierLoadPolicy::CostModel,
            prefetch_max_bytes: DEFAULT_PREFETCH_MAX_BYTES,
            admission_wait: DEFAULT_ADMISSION_WAIT,
            lookup_timeout: DEFAULT_LOOKUP_TIMEOUT,
            max_queued_write_bytes: DEFAULT_MAX_QUEUED_WRITE_BYTES,
            encode_deferral: DEFAULT_ENCODE_DEFERRAL,
        }
    }
}

/// Default of `TieringConfig::encode_deferral`.
pub const DEFAULT_ENCODE_DEFERRAL: Duration = Duration::from_secs(1);

/// Default of `TieringConfig::lookup_timeout`.
pub const DEFAULT_LOOKUP_TIMEOUT: Duration = Duration::from_secs(2);

/// Default of `TieringConfig::max_queued_write_bytes`.
pub const DEFAULT_MAX_QUEUED_WRITE_BYTES: usize = 256 << 20;
