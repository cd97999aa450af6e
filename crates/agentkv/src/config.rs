//! `agentkv serve --config agentkv.yaml`: the YAML shape, its parsing (unknown or bad keys fail
//! naming the key) and its translation into engine and server settings. Never starts anything.
//!
//! ```yaml
//! server: {host: 127.0.0.1, port: 8000, model_name: agentkv, model_aliases: [gpt-4o-mini],
//!          unknown_fields: reject,   # or ignore: unknown request fields 400 / are ignored
//!          admin_api_keys: [..], shutdown_timeout_s: 30,
//!          trusted_proxy_api_keys: [..], trusted_tenant_header: x-agentkv-tenant,  # both or neither
//!          metrics_api_keys: [..], metrics_per_tenant: true}
//! model: {path: models/SmolLM2-135M-Instruct.Q4_1.gguf, threads: 4, llama_cpp_prefill: false}
//! kv_cache_config:
//!   max_size: 2GB            # bytes of KV memory, mapped at start (KB/MB/GB = 1000^k, KiB/MiB/GiB = 1024^k)
//!   replacement_policy: reuse_aware_lru  # (default) | lru | lfu | segmented_lru | adaptive_segmented_lru
//!   warmup_prompts: [system]  # names of `prompts` below
//!   quantization: auto        # (default) bf16 where the CPU has AVX-512 BF16, else f16; or a KV
//!                             # codec (f16, int8, k=int8,v=int4, …) or a preset: code | chat | math
//!   block_size: 16
//!   prefix_caching: true
//!   tier_write_through: false  # demote evicted blocks to every tier, not only the first
//!   tier_write_on_publish: false  # write blocks to the tiers when computed (shared Redis)
//!   tier_prefetch_max_size: 1GiB  # host memory for tier loads of queued requests
//!   tier_lookup_timeout_ms: 2000  # a tier lookup unanswered this long is abandoned (recompute)
//!   tier_write_queue_max_size: 256MiB  # blocks queued for tier writes; past it writes are dropped
//!   tier_encode_deferral_ms: 1000  # lossy tier encodes wait this long at most for an idle engine
//!   max_retained_fraction: 0.9  # most of the pool sessions, breakpoints and tool pauses retain
//!   infer_conversations: true   # retain unnamed requests' KV for their inferred conversation
//!   policy_duel: true           # shadow caches decide whether that retention and the reuse bonus pay
//!   conversation_max_ttl_s: 1800  # longest learned TTL of an inferred conversation
//! tiers:                      # after the active pool, in lookup order (docs/tiers.md)
//!   - {kind: ram, max_size: 4GB}
//!   - {kind: disk, path: /var/cache/agentkv, max_size: 50GB}
//!   - {kind: redis, url: "redis://127.0.0.1:6379", ttl_secs: 3600}
//! prompts:
//!   system: {system: "You are a coding agent."}   # or {text: "raw prompt text"}
//! tenants: [{name: alpha, api_keys: ["sk-alpha"], salt: "optional", priority: 0,
//!            kv_reserved_share: 0.25, kv_max_share: 0.6, kv_max_retained_size: 256MB}]
//! kv_events: {endpoint: "tcp://127.0.0.1:5557", replay_endpoint: "tcp://127.0.0.1:5558",
//!             topic: "", buffer_steps: 10000, format: array_of_maps,
//!             allow_remote_subscribers: false, publish_token_ids: true}
//!             # vLLM KV events (off by default; loopback unless remote is allowed)
//! limits: {max_body_bytes: 4194304, max_requests: 256, max_tokens: 1048576,
//!          max_requests_per_tenant: 64, max_tokens_per_tenant: 262144,  # with tenants or a
//!          # trusted tenant header; a single-tenant server defaults them to max_requests/max_tokens
//!          default_max_tokens: 1024,
//!          retry_after_s: 1, max_running_requests: 64, max_batch_tokens: 512,
//!          step_time_target_ms: 150, min_prefill_tokens_per_step: 32,
//!          max_stored_responses_per_tenant: 1024, max_stored_response_bytes_per_tenant: 67108864,
//!          max_connections: 1024, max_connections_per_source: 512, header_timeout_s: 10,
//!          body_timeout_s: 30,
//!          max_cache_ttl_secs: 3600, max_tool_calls_per_turn: 8}
//! ```

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};
use serde::Deserialize;

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FileConfig {
    #[serde(default)]
    pub server: ServerSection,
    #[serde(default)]
    pub model: ModelSection,
    #[serde(default)]
    pub kv_cache_config: KvCacheSection,
    #[serde(default)]
    pub prompts: BTreeMap<String, PromptDef>,
    #[serde(default)]
    pub tenants: Vec<TenantSection>,
    #[serde(default)]
    pub limits: LimitsSection,
    /// Storage tiers after the active pool, in lookup order.
    #[serde(default)]
    pub tiers: Vec<tier::TierConfig>,
    /// KV events for cache-aware routers (vLLM's ZMQ format; off unless `endpoint` is set).
    #[serde(default)]
    pub kv_events: KvEventsSection,
}

/// `kv_events:` — where to publish block stored / removed events (docs/scale-out.md).
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct KvEventsSection {
    /// ZMQ PUB endpoint to bind, e.g. `tcp://*:5557`.
    pub endpoint: Option<String>,
    /// ZMQ ROUTER endpoint answering replay requests, e.g. `tcp://*:5558`.
    pub replay_endpoint: Option<String>,
    /// First frame of every message (default empty, as vLLM's).
    pub topic: Option<String>,
    /// Batches kept for replay (default 10000).
    pub buffer_steps: Option<usize>,
    /// Bind non-loopback addresses (default false: `tcp://*:P` binds 127.0.0.1 and other
    /// addresses are refused at start, since events carry every tenant's prompt token ids).
    pub allow_remote_subscribers: Option<bool>,
    /// Send prompt token ids in `BlockStored` (default: true on loopback, false once remote
    /// subscribers are allowed).
    pub publish_token_ids: Option<bool>,
    /// `array_of_maps` (default: vllm-router 0.1.17), `map` (current vLLM) or `array` (vLLM's
    /// earlier `array_like` encoding; NVIDIA Dynamo).
    pub format: Option<KvEventsFormat>,
}

#[derive(Debug, Clone, Copy, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum KvEventsFormat {
    ArrayOfMaps,
    Map,
    Array,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ServerSection {
    pub host: Option<String>,
    pub port: Option<u16>,
    pub model_name: Option<String>,
    /// Other names requests may use for the model.
    #[serde(default)]
    pub model_aliases: Vec<String>,
    pub unknown_fields: Option<UnknownFieldsPolicy>,
    #[serde(default)]
    pub admin_api_keys: Vec<String>,
    /// Names the tenant of a call made with one of `trusted_proxy_api_keys` (only those).
    pub trusted_tenant_header: Option<String>,
    /// Keys of trusted proxies (never tenant keys); they must send `trusted_tenant_header`.
    #[serde(default)]
    pub trusted_proxy_api_keys: Vec<String>,
    /// When set, `GET /metrics` needs one of these keys (or an admin key).
    #[serde(default)]
    pub metrics_api_keys: Vec<String>,
    /// Tenant-labelled series in `/metrics` (default true).
    pub metrics_per_tenant: Option<bool>,
    pub shutdown_timeout_s: Option<u64>,
}

/// `server.unknown_fields`: `reject` (default: 400 naming the field) or `ignore`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum UnknownFieldsPolicy {
    Reject,
    Ignore,
}

impl UnknownFieldsPolicy {
    pub fn to_server(self) -> server::UnknownFields {
        match self {
            UnknownFieldsPolicy::Reject => server::UnknownFields::Reject,
            UnknownFieldsPolicy::Ignore => server::UnknownFields::Ignore,
        }
    }
}

/// `model.device` / `--device`: what runs the forward pass (chosen by `cmd::device`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum Device {
    Cpu,
    Cuda,
    #[default]
    Auto,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ModelSection {
    pub path: Option<PathBuf>,
    pub threads: Option<usize>,
    /// `cpu`, `cuda` or `auto` (`--device`).
    pub device: Option<Device>,
    /// Prompt rows of 64+ token prompts in llama.cpp's tiled prefill arithmetic, as
    /// llama-server computes them (`engine::EngineConfig::llama_cpp_prefill`; default false:
    /// logprobs then match llama.cpp's to ~0.001 instead of ~0.015, without cache hits on earlier
    /// generated tokens; prefill speed: docs/history/benchmarks-log.md "fid7").
    pub llama_cpp_prefill: Option<bool>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct KvCacheSection {
    /// "2GB", "512MiB" or a number of bytes.
    pub max_size: Option<ByteSize>,
    pub replacement_policy: Option<Policy>,
    #[serde(default)]
    pub warmup_prompts: Vec<String>,
    pub quantization: Option<Quantization>,
    pub block_size: Option<usize>,
    pub prefix_caching: Option<bool>,
    /// Demote evicted blocks to every tier (default: only the first).
    pub tier_write_through: Option<bool>,
    /// Write each block to the tiers when first computed, not only on eviction (default:
    /// false; set it when servers share a Redis tier, so they see each other's prefixes at once).
    pub tier_write_on_publish: Option<bool>,
    /// Cap on host memory held by tier prefetches of queued requests (default 1GiB).
    pub tier_prefetch_max_size: Option<ByteSize>,
    /// A tier lookup unanswered after this many milliseconds is abandoned and its request
    /// recomputes (default 2000): a hung store delays requests by this much, never more.
    pub tier_lookup_timeout_ms: Option<u64>,
    /// Cap on blocks queued for writing to the tiers (default 256MiB); past it, writes are
    /// dropped and counted (`agentkv_tier_dropped_writes_total`).
    pub tier_write_queue_max_size: Option<ByteSize>,
    /// How long a block bound for a lossy tier (a `codec:` other than the pool's) may wait for
    /// the engine to go idle before it is encoded beside the forward pass (default 1000; 0:
    /// at once).
    pub tier_encode_deferral_ms: Option<u64>,
    /// Keep a reply's KV when it ends in tool calls, for a TTL from the cost model (default on).
    pub tool_pause_retention: Option<bool>,
    /// TTL seconds per second of recompute (or tier reload) a return within it saves (default 30).
    pub tool_pause_ttl_per_saved_second: Option<f64>,
    /// Longest tool-pause TTL in seconds (default 300; also capped by `limits.max_cache_ttl_secs`).
    pub tool_pause_max_ttl_s: Option<u64>,
    /// Most of the pool (0–1) retention may hold: sessions, breakpoints, tool pauses, inferred
    /// conversations and warm-up pins (default 0.9). Retention always yields to running
    /// requests.
    pub max_retained_fraction: Option<f64>,
    /// Infer conversations from prefix continuation for requests that name no session and
    /// retain their KV until the conversation's learned return time (default on; docs/sessions.md).
    pub infer_conversations: Option<bool>,
    /// Longest TTL an inferred conversation's retention may learn, seconds (default 1800; also
    /// capped by `limits.max_cache_ttl_secs`).
    pub conversation_max_ttl_s: Option<u64>,
    /// Let shadow caches decide, from the traffic so far, whether inferred retention and
    /// reuse-aware LRU's bonus pay (default on; off: both always on).
    pub policy_duel: Option<bool>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Policy {
    Lru,
    Lfu,
    SegmentedLru,
    /// Segmented LRU whose protected fraction adapts to the workload (ARC-style ghost lists).
    AdaptiveSegmentedLru,
    /// LRU where a block read twice counts as used the learned return time later (the default;
    /// docs/kv-cache.md).
    ReuseAwareLru,
}

impl Policy {
    pub fn to_cache(self) -> cache::EvictionPolicy {
        match self {
            Policy::Lru => cache::EvictionPolicy::Lru,
            Policy::Lfu => cache::EvictionPolicy::Lfu,
            // 20% protected: never below LRU on the simulated agent traces, where a large
            // protected segment behaves like LFU (docs/history/benchmarks-log.md, "Hit rate by policy").
            Policy::SegmentedLru => cache::EvictionPolicy::SegmentedLru {
                protected_fraction: 0.2,
            },
            // Starts at 20% and moves within [0, 1] (docs/kv-cache.md).
            Policy::AdaptiveSegmentedLru => cache::EvictionPolicy::ADAPTIVE_SEGMENTED_LRU,
            Policy::ReuseAwareLru => cache::EvictionPolicy::REUSE_AWARE_LRU,
        }
    }
}

/// `kv_cache_config.quantization`: a KV codec (`f16`, `f32`, `bf16`, `fp8`, `int8`, `int4`,
/// `int8-g32`, `k=int8,v=int4`, …), a task preset: `code` → int8 (K and V), `chat` → int8 K +
/// int4 V, `math` → f16, or `auto` (the default): the codec the serving machine attends fastest
/// at no measured cost ([`auto_kv_dtype`]). The measured quality of each is in
/// docs/quantization.md.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(transparent)]
pub struct Quantization(pub String);

impl Quantization {
    /// The codecs this names, with `auto` meaning `auto_dtype` ([`auto_kv_dtype`]); the error
    /// says what is accepted.
    pub fn to_dtype(&self, auto_dtype: model::KvDtype) -> Result<model::KvDtype> {
        if self.0 == "auto" {
            return Ok(auto_dtype);
        }
        let spec = match self.0.as_str() {
            "code" => "int8",
            "chat" => "k=int8,v=int4",
            "math" => "f16",
            other => other,
        };
        model::KvDtype::parse(spec).map_err(|e| {
            anyhow::anyhow!(
                "kv_cache_config.quantization: {:?}: {e} (use auto, f16, f32, bf16, fp8, int8, \
                 int4, int8-g32, int4h, int8h, k=int8,v=int4, or a preset: code, chat, math)",
                self.0
            )
        })
    }
}

/// What `quantization: auto` (the default) means for a forward pass on the CPU (`cpu`: not a
/// device backend) with these kernel features and heads of `head_dim`, for a model with
/// sliding-window layers or not (`windowed`), in llama.cpp's prefill arithmetic or not, where
/// the engine's own arithmetic runs:
/// - `int8` K (one group per row, `int8-g{head_dim}`) with bf16 V where the CPU has AVX-512
///   VNNI and BF16, the head fits the int8-scored pair step (`kernels::flash_tile_pairs_coded`:
///   scores from K's codes on `vpdpbusd`, `p·V` on `vdpbf16ps`; K in 53% of bf16's bytes) and
///   no layer has a sliding window (those layers attend in the exact regime, where the step
///   never runs: on Gemma 3 270M the codec cost +0.5% perplexity on the reference corpus and
///   ran 0.95× bf16's speed there, docs/quantization.md);
/// - bf16 K/V where the CPU has AVX-512 BF16 only (`kernels::flash_tile_pairs`);
/// - else f16 (llama.cpp's cache type), as on a device backend or in llama.cpp's prefill.
pub fn auto_kv_dtype(
    cpu: bool,
    features: kernels::CpuFeatures,
    head_dim: usize,
    windowed: bool,
    llama_cpp_prefill: bool,
) -> model::KvDtype {
    if !cpu || llama_cpp_prefill || !features.bf16 {
        return model::KvDtype::F16;
    }
    let coded = model::KvDtype {
        k: quant::KvCodecKind::Int8 { group: head_dim },
        v: quant::KvCodecKind::Bf16,
    };
    if features.vnni && !windowed && model::coded_pairs_arithmetic(coded, head_dim) {
        coded
    } else {
        model::KvDtype::uniform(quant::KvCodecKind::Bf16)
    }
}

/// A warm-up prompt: a system message rendered with the chat template (so chats that start with
/// it share its blocks), or raw text.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PromptDef {
    pub system: Option<String>,
    pub text: Option<String>,
    /// Warm for this tenant only (default: every serving tenant).
    pub tenant: Option<String>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TenantSection {
    pub name: String,
    #[serde(default)]
    pub api_keys: Vec<String>,
    pub salt: Option<String>,
    /// Reserved minimum share of the active KV pool (0–1): other tenants' traffic cannot evict
    /// this tenant's cached blocks while it holds no more than this share.
    pub kv_reserved_share: Option<f64>,
    /// Maximum share of the active KV pool (0–1) this tenant's cached blocks may hold.
    pub kv_max_share: Option<f64>,
    /// Most KV memory this tenant's sessions may retain (`cache_control`, session keys), e.g.
    /// `256MB`; beyond it a session retains its prefix only as far as the cap allows.
    pub kv_max_retained_size: Option<ByteSize>,
    /// Priority of the tenant's requests, vLLM's convention (lower is more important; -63..=63,
    /// default 0): admission order, preemption and the eviction order of retained blocks. A
    /// request's own `priority` is added to it.
    pub priority: Option<i32>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LimitsSection {
    pub max_body_bytes: Option<usize>,
    pub max_requests: Option<usize>,
    pub max_tokens: Option<usize>,
    pub max_requests_per_tenant: Option<usize>,
    pub max_tokens_per_tenant: Option<usize>,
    pub default_max_tokens: Option<usize>,
    pub retry_after_s: Option<u64>,
    /// Stored Responses-API responses per tenant.
    pub max_stored_responses_per_tenant: Option<usize>,
    /// Bytes of stored responses per tenant.
    pub max_stored_response_bytes_per_tenant: Option<usize>,
    /// Longest KV retention a request may ask for (seconds; 0 = off).
    pub max_cache_ttl_secs: Option<u64>,
    /// Most tool calls in one assistant turn (parallel calls).
    pub max_tool_calls_per_turn: Option<usize>,
    /// Sequences per engine step.
    pub max_running_requests: Option<usize>,
    /// Tokens per engine step.
    pub max_batch_tokens: Option<usize>,
    /// Target duration (ms) of an engine step that carries decodes: prefill chunks mixed into
    /// it are cut to fit (0 turns the cap off; unset: [`DEFAULT_STEP_TIME_TARGET_MS`]).
    pub step_time_target_ms: Option<u64>,
    /// Prefill tokens a step with decodes may always carry.
    pub min_prefill_tokens_per_step: Option<usize>,
    /// Open connections (one more gets a 503 and is closed).
    pub max_connections: Option<usize>,
    /// Open connections from one client address (default: half of `max_connections`).
    pub max_connections_per_source: Option<usize>,
    /// Seconds a connection has to send a complete request head.
    pub header_timeout_s: Option<f64>,
    /// Seconds a request has to send its whole body (else 408).
    pub body_timeout_s: Option<f64>,
}

/// `limits.step_time_target_ms` when the file does not set it. Measured on agent loops
/// (docs/history/benchmarks-log.md, "The step-time cap on agent loops"): decoders' inter-token p99 falls
/// from ≈ 1 s to ≈ 0.2 s while other agents' prefills stream in, at no measurable cost in wall
/// time or call latency; 0 restores whole prefill chunks beside decodes.
pub const DEFAULT_STEP_TIME_TARGET_MS: u64 = 150;

impl LimitsSection {
    /// The engine's step-time target: the file's value (0 = off), else the default.
    pub fn step_time_target(&self) -> Option<std::time::Duration> {
        let ms = self
            .step_time_target_ms
            .unwrap_or(DEFAULT_STEP_TIME_TARGET_MS);
        (ms > 0).then(|| std::time::Duration::from_millis(ms))
    }
}

/// A size in bytes written as `2GB`, `1.5GiB`, `512MB` or a plain number.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ByteSize(pub u64);

impl<'de> Deserialize<'de> for ByteSize {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        #[derive(Deserialize)]
        #[serde(untagged)]
        enum Raw {
            N(u64),
            S(String),
        }
        match Raw::deserialize(d)? {
            Raw::N(n) => Ok(ByteSize(n)),
            Raw::S(s) => parse_size(&s)
                .map(ByteSize)
                .map_err(serde::de::Error::custom),
        }
    }
}

/// Parses "2GB" (10^9), "2GiB" (2^30), "512 MB", "1024" (bytes).
pub fn parse_size(s: &str) -> Result<u64, String> {
    let t = s.trim();
    let split = t
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(t.len());
    let (num, unit) = (t[..split].trim(), t[split..].trim());
    let value: f64 = num
        .parse()
        .map_err(|_| format!("invalid size {s:?}: expected e.g. 2GB, 512MiB or a byte count"))?;
    let mult: f64 = match unit.to_ascii_lowercase().as_str() {
        "" | "b" => 1.0,
        "kb" | "k" => 1e3,
        "mb" | "m" => 1e6,
        "gb" | "g" => 1e9,
        "tb" | "t" => 1e12,
        "kib" => 1024.0,
        "mib" => 1024.0 * 1024.0,
        "gib" => 1024.0 * 1024.0 * 1024.0,
        "tib" => 1024f64.powi(4),
        other => return Err(format!("invalid size unit {other:?} in {s:?}")),
    };
    Ok((value * mult) as u64)
}

impl FileConfig {
    pub fn parse(text: &str) -> Result<FileConfig> {
        let cfg: FileConfig = serde_norway::from_str(text).map_err(|e| anyhow::anyhow!("{e}"))?;
        cfg.check()?;
        Ok(cfg)
    }

    pub fn load(path: &Path) -> Result<FileConfig> {
        let text = std::fs::read_to_string(path)
            .with_context(|| format!("reading config {}", path.display()))?;
        FileConfig::parse(&text).with_context(|| format!("config {}", path.display()))
    }

    /// Cross-field checks serde cannot express.
    fn check(&self) -> Result<()> {
        for name in &self.kv_cache_config.warmup_prompts {
            if !self.prompts.contains_key(name) {
                bail!("kv_cache_config.warmup_prompts: {name:?} is not defined under prompts");
            }
        }
        for (name, p) in &self.prompts {
            if p.system.is_some() == p.text.is_some() {
                bail!("prompts.{name}: give exactly one of system and text");
            }
            if let Some(t) = &p.tenant {
                if !self.tenants.iter().any(|x| &x.name == t) {
                    bail!("prompts.{name}.tenant: no tenant named {t:?}");
                }
            }
        }
        let mut reserved_total = 0.0;
        for t in &self.tenants {
            let (lo, hi) = (engine::MIN_PRIORITY, engine::MAX_PRIORITY);
            if let Some(p) = t.priority.filter(|p| !(lo..=hi).contains(p)) {
                bail!("tenants[{}].priority: {p} is outside [{lo}, {hi}]", t.name);
            }
            for (what, v) in [
                ("kv_reserved_share", t.kv_reserved_share),
                ("kv_max_share", t.kv_max_share),
            ] {
                if let Some(v) = v.filter(|v| !(0.0..=1.0).contains(v)) {
                    bail!("tenants[{}].{what}: {v} is outside [0, 1]", t.name);
                }
            }
            if let (Some(r), Some(m)) = (t.kv_reserved_share, t.kv_max_share) {
                if r > m {
                    bail!(
                        "tenants[{}]: kv_reserved_share {r} is more than kv_max_share {m}",
                        t.name
                    );
                }
            }
            reserved_total += t.kv_reserved_share.unwrap_or(0.0);
        }
        if reserved_total > 0.5 {
            bail!("tenants: kv_reserved_share totals {reserved_total}, more than 0.5 of the pool");
        }
        if self.kv_cache_config.block_size == Some(0) {
            bail!("kv_cache_config.block_size: must be positive");
        }
        if let Some(q) = &self.kv_cache_config.quantization {
            q.to_dtype(model::KvDtype::F16)?;
        }
        if let Some(f) = self
            .kv_cache_config
            .max_retained_fraction
            .filter(|f| !(0.0..=1.0).contains(f))
        {
            bail!("kv_cache_config.max_retained_fraction: {f} is outside [0, 1]");
        }
        for (name, v) in [
            ("limits.header_timeout_s", self.limits.header_timeout_s),
            ("limits.body_timeout_s", self.limits.body_timeout_s),
        ] {
            if v.is_some_and(|s| !(s > 0.0 && s <= 86_400.0)) {
                bail!("{name}: must be a number of seconds in (0, 86400]");
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The config example in README.md parses and validates (tenant shares, tool pauses, …).
    #[test]
    fn the_readme_example_parses() {
        let readme = include_str!("../../../README.md");
        let start = readme.find("```yaml\n").expect("a yaml block") + "```yaml\n".len();
        let end = start + readme[start..].find("```").expect("its end");
        let c = FileConfig::parse(&readme[start..end]).expect("the README example");
        assert_eq!(c.tenants[0].kv_reserved_share, Some(0.25));
        assert_eq!(c.kv_cache_config.tool_pause_retention, Some(true));
        assert_eq!(c.model.llama_cpp_prefill, Some(false));
        let on = FileConfig::parse("model: {llama_cpp_prefill: true}\n").unwrap();
        assert_eq!(on.model.llama_cpp_prefill, Some(true));
        assert!(FileConfig::parse("model: {llama_cpp_prefil: true}\n").is_err());
    }

    #[test]
    fn tenant_shares_are_checked() {
        let bad = |t: &str| {
            FileConfig::parse(&format!("tenants: [{t}]\n"))
                .unwrap_err()
                .to_string()
        };
        assert!(bad("{name: a, kv_reserved_share: 1.5}").contains("kv_reserved_share"));
        assert!(bad("{name: a, priority: 64}").contains("priority"));
        let retained = FileConfig::parse("kv_cache_config: {max_retained_fraction: 1.5}\n");
        assert!(retained
            .unwrap_err()
            .to_string()
            .contains("max_retained_fraction"));
        assert!(bad("{name: a, priority: -64}").contains("priority"));
        let ok = FileConfig::parse("tenants: [{name: a, priority: -5}]\n").unwrap();
        assert_eq!(ok.tenants[0].priority, Some(-5));
        assert!(bad("{name: a, kv_reserved_share: 0.4, kv_max_share: 0.3}").contains("more than"));
        let two = "{name: a, kv_reserved_share: 0.3}, {name: b, kv_reserved_share: 0.3}";
        assert!(bad(two).contains("0.5"));
    }

    #[test]
    fn the_step_time_target_defaults_on_and_zero_turns_it_off() {
        let target = |y: &str| FileConfig::parse(y).unwrap().limits.step_time_target();
        let ms = std::time::Duration::from_millis;
        assert_eq!(target(""), Some(ms(DEFAULT_STEP_TIME_TARGET_MS)));
        assert_eq!(target("limits: {step_time_target_ms: 0}\n"), None);
        assert_eq!(target("limits: {step_time_target_ms: 40}\n"), Some(ms(40)));
    }

    #[test]
    fn sizes() {
        assert_eq!(parse_size("2GB"), Ok(2_000_000_000));
        assert_eq!(parse_size("1.5 GiB"), Ok(1_610_612_736));
        assert_eq!(parse_size("4096"), Ok(4096));
        assert!(parse_size("2 parsecs").is_err());
        assert!(parse_size("GB").is_err());
    }

    #[test]
    fn the_issue_example_parses() {
        let c = FileConfig::parse(
            "kv_cache_config:\n  max_size: 2GB\n  replacement_policy: \"segmented_lru\"\n  \
             warmup_prompts: [\"system\", \"common_actions\"]\n  quantization: \"f16\"\n\
             prompts:\n  system: {system: \"You are helpful.\"}\n  common_actions: {text: \"ls\"}\n\
             tenants: [{name: alpha, api_keys: [\"k1\"]}]\n",
        )
        .unwrap();
        assert_eq!(c.kv_cache_config.max_size, Some(ByteSize(2_000_000_000)));
        assert_eq!(
            c.kv_cache_config.replacement_policy,
            Some(Policy::SegmentedLru)
        );
        assert_eq!(c.tenants[0].api_keys, vec!["k1".to_string()]);
    }

    #[test]
    fn the_retention_cap_parses() {
        let c = FileConfig::parse("limits: {max_cache_ttl_secs: 60}\n").unwrap();
        assert_eq!(c.limits.max_cache_ttl_secs, Some(60));
        assert!(FileConfig::parse("limits: {max_cache_ttl_secs: -1}\n").is_err());
    }

    #[test]
    fn tiers_parse_in_order_and_typos_are_named() {
        let c = FileConfig::parse(
            "kv_cache_config: {tier_write_through: true}\ntiers:\n  - {kind: ram, max_size: 4GB}\n  \
             - {kind: disk, path: /tmp/agentkv-tier, max_size: 50GB}\n  \
             - {kind: redis, url: \"redis://127.0.0.1:6379\", ttl_secs: 60}\n",
        )
        .unwrap();
        assert_eq!(c.tiers.len(), 3);
        assert!(matches!(
            c.tiers[0],
            tier::TierConfig::Ram { max_size, .. } if max_size.0 == 4_000_000_000
        ));
        assert!(matches!(
            c.tiers[2],
            tier::TierConfig::Redis {
                ttl_secs: Some(60),
                ..
            }
        ));
        assert_eq!(c.kv_cache_config.tier_write_through, Some(true));
        let c = FileConfig::parse(
            "kv_cache_config: {tier_write_on_publish: true, tier_prefetch_max_size: 64MiB}\n",
        )
        .unwrap();
        assert_eq!(c.kv_cache_config.tier_write_on_publish, Some(true));
        assert_eq!(
            c.kv_cache_config.tier_prefetch_max_size,
            Some(ByteSize(64 << 20))
        );
        let e = FileConfig::parse("tiers: [{kind: ram, max_sise: 4GB}]\n").unwrap_err();
        assert!(format!("{e:#}").contains("max_sise"), "{e:#}");
    }

    #[test]
    fn model_aliases_and_unknown_fields_policy_parse() {
        let c = FileConfig::parse(
            "server: {model_name: a, model_aliases: [b, c], unknown_fields: ignore}\n",
        )
        .unwrap();
        assert_eq!(
            c.server.model_aliases,
            vec!["b".to_string(), "c".to_string()]
        );
        assert_eq!(c.server.unknown_fields, Some(UnknownFieldsPolicy::Ignore));
        assert_eq!(FileConfig::parse("{}").unwrap().server.unknown_fields, None);
        let e = FileConfig::parse("server: {unknown_fields: maybe}\n").unwrap_err();
        assert!(format!("{e:#}").contains("maybe"), "{e:#}");
    }

    #[test]
    fn bad_keys_are_named() {
        let e = FileConfig::parse("kv_cache_config:\n  max_sise: 2GB\n").unwrap_err();
        assert!(format!("{e:#}").contains("max_sise"), "{e:#}");
        let c =
            FileConfig::parse("kv_cache_config: {replacement_policy: adaptive_segmented_lru}\n")
                .unwrap();
        assert_eq!(
            c.kv_cache_config.replacement_policy.map(Policy::to_cache),
            Some(cache::EvictionPolicy::ADAPTIVE_SEGMENTED_LRU)
        );
        let e = FileConfig::parse("kv_cache_config:\n  replacement_policy: fifo\n").unwrap_err();
        assert!(format!("{e:#}").contains("fifo"), "{e:#}");
        let e = FileConfig::parse("limits: {max_requests: -3}\n").unwrap_err();
        assert!(format!("{e:#}").contains("max_requests"), "{e:#}");
        let e = FileConfig::parse("kv_cache_config: {warmup_prompts: [nope]}\n").unwrap_err();
        assert!(format!("{e:#}").contains("nope"), "{e:#}");
        let e = FileConfig::parse("kv_cache_config: {max_size: 2 parsecs}\n").unwrap_err();
        assert!(format!("{e:#}").contains("parsecs"), "{e:#}");
    }

    #[test]
    fn quantization_accepts_codecs_and_presets_and_names_the_key_when_bad() {
        let q = |s: &str| Quantization(s.to_string()).to_dtype(model::KvDtype::F16);
        assert_eq!(q("code").unwrap(), model::KvDtype::parse("int8").unwrap());
        assert_eq!(
            q("chat").unwrap(),
            model::KvDtype::parse("k=int8,v=int4").unwrap()
        );
        assert_eq!(q("math").unwrap(), model::KvDtype::F16);
        assert_eq!(
            q("int4-g32").unwrap(),
            model::KvDtype::parse("int4-g32").unwrap()
        );
        let err = q("int3").unwrap_err().to_string();
        assert!(err.contains("kv_cache_config.quantization"), "{err}");
        let bf16 = model::KvDtype::parse("bf16").unwrap();
        assert_eq!(Quantization("auto".into()).to_dtype(bf16).unwrap(), bf16);
    }

    #[test]
    fn auto_is_the_cpus_own_pair_arithmetic_or_f16() {
        let bf16 = model::KvDtype::parse("bf16").unwrap();
        let coded = model::KvDtype::parse("k=int8,v=bf16").unwrap();
        let bf16_only = kernels::CpuFeatures {
            avx512: true,
            bf16: true,
            ..kernels::CpuFeatures::AVX2
        };
        let native = kernels::CpuFeatures {
            vnni: true,
            ..bf16_only
        };
        // AVX-512 VNNI and BF16: int8 K scored from its codes, one group per row of 64.
        assert_eq!(auto_kv_dtype(true, native, 64, false, false), coded);
        assert_eq!(
            auto_kv_dtype(true, native, 128, false, false),
            model::KvDtype::parse("k=int8-g128,v=bf16").unwrap(),
            "one group per row of 128"
        );
        assert_eq!(
            auto_kv_dtype(true, native, 72, false, false),
            bf16,
            "a head the int8-scored step does not take"
        );
        assert_eq!(
            auto_kv_dtype(true, bf16_only, 64, false, false),
            bf16,
            "no VNNI"
        );
        assert_eq!(
            auto_kv_dtype(true, native, 256, true, false),
            bf16,
            "sliding-window layers attend in the exact regime"
        );
        assert_eq!(
            auto_kv_dtype(false, native, 64, false, false),
            model::KvDtype::F16,
            "a GPU backend"
        );
        assert_eq!(
            auto_kv_dtype(true, native, 64, false, true),
            model::KvDtype::F16,
            "llama.cpp's prefill"
        );
        let avx512_vnni = kernels::CpuFeatures {
            avx512: true,
            vnni: true,
            ..kernels::CpuFeatures::AVX2
        };
        for f in [
            kernels::CpuFeatures::PORTABLE,
            kernels::CpuFeatures::AVX2,
            avx512_vnni,
        ] {
            assert_eq!(
                auto_kv_dtype(true, f, 64, false, false),
                model::KvDtype::F16,
                "{}",
                f.name()
            );
        }
    }
}
