//! Prometheus text exposition (`GET /metrics`, names prefixed `agentkv_`): latency histograms and
//! token counters the server observes, plus the engine's cache and scheduler figures read from a
//! snapshot at scrape time. Counters only grow; rates belong in Prometheus. Never computes a rate.

use std::collections::BTreeMap;
use std::fmt::Write;
use std::sync::Mutex;
use std::time::Duration;

use engine::EngineSnapshot;

use crate::metrics_compat::{render_compat, CompatTotals};
use crate::prom_text::escape;

/// Bucket upper bounds in seconds, shared by every latency histogram.
const BUCKETS_S: [f64; 16] = [
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0,
];

#[derive(Debug, Clone, Default)]
struct Histogram {
    counts: [u64; BUCKETS_S.len()],
    count: u64,
    sum_s: f64,
}

impl Histogram {
    fn observe(&mut self, d: Duration) {
        let s = d.as_secs_f64();
        for (c, b) in self.counts.iter_mut().zip(BUCKETS_S) {
            if s <= b {
                *c += 1;
            }
        }
        self.count += 1;
        self.sum_s += s;
    }

    fn render(&self, out: &mut String, name: &str, help: &str) {
        let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} histogram");
        for (c, b) in self.counts.iter().zip(BUCKETS_S) {
            let _ = writeln!(out, "{name}_bucket{{le=\"{b}\"}} {c}");
        }
        let _ = writeln!(out, "{name}_bucket{{le=\"+Inf\"}} {}", self.count);
        let _ = writeln!(out, "{name}_sum {}", self.sum_s);
        let _ = writeln!(out, "{name}_count {}", self.count);
    }
}

/// Per-tenant totals the server counts.
#[derive(Debug, Clone, Default)]
struct TenantTotals {
    prompt_tokens: u64,
    generation_tokens: u64,
    cached_prompt_tokens: u64,
    requests_finished: u64,
    requests_rejected: u64,
}

#[derive(Debug, Default)]
struct Inner {
    ttft: Histogram,
    itl: Histogram,
    e2e: Histogram,
    queue: Histogram,
    tenants: BTreeMap<String, TenantTotals>,
    /// Finished requests whose cached prefix ended early, by reason.
    cache_misses: BTreeMap<&'static str, u64>,
}

/// The server's own observations.
#[derive(Debug, Default)]
pub struct Metrics {
    inner: Mutex<Inner>,
}

/// One finished request, as the server saw it.
#[derive(Debug, Clone)]
pub struct FinishedRequest<'a> {
    pub tenant: &'a str,
    pub prompt_tokens: usize,
    pub generation_tokens: usize,
    pub cached_tokens: usize,
    /// Why the cached prefix ended early (`diverged`, `evicted`, `uncached`), if it did.
    pub cache_miss: Option<&'static str>,
    pub ttft: Duration,
    pub queue: Duration,
    pub total: Duration,
}

impl Metrics {
    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub fn observe_inter_token(&self, d: Duration) {
        self.lock().itl.observe(d);
    }

    pub fn observe_finished(&self, r: &FinishedRequest<'_>) {
        let mut g = self.lock();
        g.ttft.observe(r.ttft);
        g.queue.observe(r.queue);
        g.e2e.observe(r.total);
        let t = g.tenants.entry(r.tenant.to_string()).or_default();
        t.prompt_tokens += r.prompt_tokens as u64;
        t.generation_tokens += r.generation_tokens as u64;
        t.cached_prompt_tokens += r.cached_tokens as u64;
        t.requests_finished += 1;
        if let Some(reason) = r.cache_miss {
            *g.cache_misses.entry(reason).or_default() += 1;
        }
    }

    pub fn observe_rejected(&self, tenant: &str) {
        self.lock()
            .tenants
            .entry(tenant.to_string())
            .or_default()
            .requests_rejected += 1;
    }

    /// The whole exposition; `tenant_name` labels the engine's per-tenant cache counters. Without
    /// `per_tenant` no series carries a tenant label: the server's counters are summed over
    /// tenants and the engine's per-tenant series are left out (their totals remain). The
    /// vLLM/SGLang-named series (`metrics_compat.rs`) follow ours, labelled `model_name`.
    pub fn render(
        &self,
        snap: &EngineSnapshot,
        tenant_name: impl Fn(cache::TenantId) -> String,
        per_tenant: bool,
        model_name: &str,
    ) -> String {
        let mut out = String::with_capacity(8 << 10);
        let mut totals = CompatTotals::default();
        {
            let g = self.lock();
            for t in g.tenants.values() {
                totals.prompt_tokens += t.prompt_tokens;
                totals.generation_tokens += t.generation_tokens;
                totals.requests_finished += t.requests_finished;
            }
            g.ttft.render(
                &mut out,
                "agentkv_time_to_first_token_seconds",
                "Arrival to first token.",
            );
            g.itl.render(
                &mut out,
                "agentkv_inter_token_latency_seconds",
                "Time between consecutive tokens of a request.",
            );
            g.e2e.render(
                &mut out,
                "agentkv_e2e_request_latency_seconds",
                "Arrival to finish.",
            );
            g.queue.render(
                &mut out,
                "agentkv_queue_time_seconds",
                "Arrival to admission into the running batch.",
            );
            type Field = fn(&TenantTotals) -> u64;
            let per_tenant_series: [(&str, &str, Field); 5] = [
                (
                    "agentkv_prompt_tokens_total",
                    "Prompt tokens of finished requests.",
                    |t| t.prompt_tokens,
                ),
                (
                    "agentkv_generation_tokens_total",
                    "Generated tokens of finished requests.",
                    |t| t.generation_tokens,
                ),
                (
                    "agentkv_cached_prompt_tokens_total",
                    "Prompt tokens served from the prefix cache, as reported in usage.",
                    |t| t.cached_prompt_tokens,
                ),
                (
                    "agentkv_requests_finished_total",
                    "Requests that ran to completion.",
                    |t| t.requests_finished,
                ),
                (
                    "agentkv_requests_rejected_total",
                    "Requests refused by the queue bounds (429/503).",
                    |t| t.requests_rejected,
                ),
            ];
            for (name, help, f) in per_tenant_series {
                let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} counter");
                if per_tenant {
                    for (tenant, t) in &g.tenants {
                        let _ = writeln!(out, "{name}{{tenant=\"{}\"}} {}", escape(tenant), f(t));
                    }
                } else {
                    let total: u64 = g.tenants.values().map(f).sum();
                    let _ = writeln!(out, "{name} {total}");
                }
            }
            let name = "agentkv_prefix_cache_misses_total";
            let _ = writeln!(
                out,
                "# HELP {name} Finished requests whose cached prefix ended before the prompt's last full block, by reason (diverged: the prompt changed; evicted: the next block was evicted; uncached: never cached).\n# TYPE {name} counter"
            );
            for reason in ["diverged", "evicted", "uncached"] {
                let v = g.cache_misses.get(reason).copied().unwrap_or(0);
                let _ = writeln!(out, "{name}{{reason=\"{reason}\"}} {v}");
            }
        }
        render_engine(&mut out, snap, tenant_name, per_tenant);
        render_compat(&mut out, snap, model_name, totals);
        out
    }
}

fn metric(out: &mut String, name: &str, kind: &str, help: &str, value: impl std::fmt::Display) {
    let _ = writeln!(
        out,
        "# HELP {name} {help}\n# TYPE {name} {kind}\n{name} {value}"
    );
}

fn render_engine(
    out: &mut String,
    s: &EngineSnapshot,
    tenant_name: impl Fn(cache::TenantId) -> String,
    per_tenant: bool,
) {
    let c = &s.cache;
    metric(
        out,
        "agentkv_prefix_cache_lookups_total",
        "counter",
        "Prefix-cache lookups.",
        c.lookups,
    );
    metric(
        out,
        "agentkv_prefix_cache_hit_tokens_total",
        "counter",
        "Prompt tokens found in the prefix cache.",
        c.lookup_hit_tokens,
    );
    metric(
        out,
        "agentkv_prefix_cache_miss_tokens_total",
        "counter",
        "Prompt tokens not found in the prefix cache.",
        c.lookup_miss_tokens,
    );
    type TField = fn(&cache::TenantCounters) -> u64;
    let per_tenant_series: [(&str, &str, &str, TField); 6] = [
        (
            "agentkv_tenant_prefix_cache_lookups_total",
            "counter",
            "Prefix-cache lookups per tenant.",
            |t| t.lookups,
        ),
        (
            "agentkv_tenant_prefix_cache_hit_tokens_total",
            "counter",
            "Prompt tokens found in the prefix cache, per tenant.",
            |t| t.hit_tokens,
        ),
        (
            "agentkv_tenant_prefix_cache_miss_tokens_total",
            "counter",
            "Prompt tokens not found in the prefix cache, per tenant.",
            |t| t.miss_tokens,
        ),
        (
            "agentkv_tenant_kv_cached_blocks",
            "gauge",
            "Published KV blocks held per tenant.",
            |t| u64::from(t.cached_blocks),
        ),
        (
            "agentkv_tenant_kv_evicted_blocks_total",
            "counter",
            "KV blocks of the tenant evicted.",
            |t| t.evicted_blocks,
        ),
        (
            "agentkv_tenant_kv_reserved_evictions_total",
            "counter",
            "KV blocks of the tenant evicted while within its reserved share (nothing else could go).",
            |t| t.reserved_evictions,
        ),
    ];
    for (name, kind, help, f) in per_tenant_series {
        if !per_tenant {
            break;
        }
        let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} {kind}");
        for (id, t) in &s.tenants {
            let _ = writeln!(
                out,
                "{name}{{tenant=\"{}\"}} {}",
                escape(&tenant_name(*id)),
                f(t)
            );
        }
    }
    render_usage(out, s);
    render_evictions_and_steps(out, s);
    render_tiers(out, s);
}

/// The active pool's usage: blocks by state, retention, fragmentation.
fn render_usage(out: &mut String, s: &EngineSnapshot) {
    let u = &s.usage;
    let _ = writeln!(out, "# HELP agentkv_kv_blocks KV blocks by state (free + in_use + cached = total).\n# TYPE agentkv_kv_blocks gauge");
    for (state, v) in [
        ("free", u.free),
        ("in_use", u.in_use),
        ("cached", u.cached),
        ("pinned", u.pinned),
    ] {
        let _ = writeln!(out, "agentkv_kv_blocks{{state=\"{state}\"}} {v}");
    }
    metric(
        out,
        "agentkv_kv_blocks_total",
        "gauge",
        "KV blocks in the pool.",
        u.total,
    );
    let _ = writeln!(
        out,
        "# HELP agentkv_kv_bytes_per_token KV bytes per token of the configured codecs (all layers, K and V, scales included).\n# TYPE agentkv_kv_bytes_per_token gauge\nagentkv_kv_bytes_per_token{{codec=\"{}\"}} {}",
        s.kv_codec, s.kv_bytes_per_token
    );
    metric(
        out,
        "agentkv_kv_fragmentation_ratio",
        "gauge",
        "Unused token slots in blocks held by requests / allocated slots.",
        s.fragmentation,
    );
}

/// Evictions by cause, the adaptive segment, the engine's step counters.
fn render_evictions_and_steps(out: &mut String, s: &EngineSnapshot) {
    let c = &s.cache;
    let e = &c.evictions;
    let _ = writeln!(out, "# HELP agentkv_kv_evictions_total KV blocks evicted, by cause.\n# TYPE agentkv_kv_evictions_total counter");
    for (cause, v) in [
        ("capacity", e.capacity),
        ("watermark", e.watermark),
        ("quota", e.quota),
        ("flush", e.flush),
    ] {
        let _ = writeln!(out, "agentkv_kv_evictions_total{{cause=\"{cause}\"}} {v}");
    }
    metric(
        out,
        "agentkv_kv_reserved_evictions_total",
        "counter",
        "KV blocks evicted from a tenant within its reserved share (running sequences needed them).",
        e.reserved,
    );
    metric(
        out,
        "agentkv_preemptions_total",
        "counter",
        "Requests preempted (recomputed later) for lack of KV blocks.",
        s.stats.preemptions,
    );
    metric(
        out,
        "agentkv_inferred_turns_total",
        "counter",
        "Finished requests without a named session placed in an inferred conversation.",
        s.stats.inferred_turns,
    );
    metric(
        out,
        "agentkv_inferred_continuations_total",
        "counter",
        "Inferred turns that continued a conversation's latest turn.",
        s.stats.inferred_continuations,
    );
    metric(
        out,
        "agentkv_inferred_branches_total",
        "counter",
        "Inferred turns that continued an earlier turn (a new conversation).",
        s.stats.inferred_branches,
    );
    metric(
        out,
        "agentkv_inferred_released_for_explicit_total",
        "counter",
        "Inferred conversations' retention released to make room for named sessions.",
        s.stats.inferred_released_for_explicit,
    );
    metric(
        out,
        "agentkv_inferred_unretained_total",
        "counter",
        "Inferred turns not retained because the shadow caches said retention did not pay.",
        s.stats.inferred_unretained,
    );
    metric(
        out,
        "agentkv_kv_reuse_bonus_seconds",
        "gauge",
        "Reuse-aware LRU's bonus in force for blocks read twice (0: not learned or not paying).",
        s.stats.reuse_bonus_ms as f64 / 1000.0,
    );
    metric(
        out,
        "agentkv_inferred_ttl_seconds",
        "gauge",
        "Retention TTL an inferred conversation's latest turn gets now (learned return gaps).",
        s.stats.inferred_ttl_ms as f64 / 1000.0,
    );
    metric(
        out,
        "agentkv_kv_pins_created_total",
        "counter",
        "Prefix pins created (warm-up prompts).",
        c.pins_created,
    );
    metric(
        out,
        "agentkv_kv_pins_released_total",
        "counter",
        "Prefix pins released.",
        c.pins_released,
    );
    metric(
        out,
        "agentkv_kv_protected_capacity_blocks",
        "gauge",
        "Blocks the segmented-LRU protected segment may hold now (adapts with adaptive_segmented_lru; 0 for lru/lfu).",
        c.slru_protected_capacity_blocks,
    );
    let _ = writeln!(out, "# HELP agentkv_kv_protected_adaptations_total Changes of the adaptive protected segment's size, by direction.\n# TYPE agentkv_kv_protected_adaptations_total counter");
    for (dir, v) in [
        ("up", c.slru_adaptations_up),
        ("down", c.slru_adaptations_down),
    ] {
        let _ = writeln!(
            out,
            "agentkv_kv_protected_adaptations_total{{direction=\"{dir}\"}} {v}"
        );
    }
    let _ = writeln!(out, "# HELP agentkv_kv_ghost_hits_total Lookups that missed a recently evicted block, by the segment it left (adaptive policy).\n# TYPE agentkv_kv_ghost_hits_total counter");
    for (seg, v) in [
        ("probation", c.slru_ghost_probation_hits),
        ("protected", c.slru_ghost_protected_hits),
    ] {
        let _ = writeln!(out, "agentkv_kv_ghost_hits_total{{segment=\"{seg}\"}} {v}");
    }
    metric(
        out,
        "agentkv_requests_running",
        "gauge",
        "Requests in the running batch.",
        s.num_running,
    );
    metric(
        out,
        "agentkv_requests_waiting",
        "gauge",
        "Requests queued in the engine.",
        s.num_waiting,
    );
    metric(
        out,
        "agentkv_prefill_tokens_total",
        "counter",
        "Tokens computed in prefill.",
        s.stats.prefill_tokens,
    );
    metric(
        out,
        "agentkv_decode_tokens_total",
        "counter",
        "Tokens computed in decode.",
        s.stats.decode_tokens,
    );
}

/// Per-tier series, labelled `tier` (position in the lookup order) and `kind`.
fn render_tiers(out: &mut String, s: &EngineSnapshot) {
    let tiers = &s.tiers.tiers;
    if tiers.is_empty() {
        return;
    }
    type Field = fn(&engine::TierSnapshot) -> u64;
    let series: [(&str, &str, &str, Field); 13] = [
        (
            "agentkv_tier_hit_tokens_total",
            "counter",
            "Prompt tokens loaded from the tier instead of recomputed.",
            |t| t.engine.hit_tokens,
        ),
        (
            "agentkv_tier_hits_total",
            "counter",
            "Tier objects found and verified.",
            |t| t.stats.hits,
        ),
        (
            "agentkv_tier_misses_total",
            "counter",
            "Tier objects asked for and not returned.",
            |t| t.stats.misses,
        ),
        (
            "agentkv_tier_read_bytes_total",
            "counter",
            "Stored bytes read from the tier.",
            |t| t.stats.bytes_read,
        ),
        (
            "agentkv_tier_written_bytes_total",
            "counter",
            "Stored bytes written to the tier.",
            |t| t.stats.bytes_written,
        ),
        (
            "agentkv_tier_evictions_total",
            "counter",
            "Objects dropped by the tier's own byte budget.",
            |t| t.stats.evictions,
        ),
        (
            "agentkv_tier_errors_total",
            "counter",
            "Failed or skipped tier operations (the request recomputes).",
            |t| t.stats.errors,
        ),
        (
            "agentkv_tier_corrupt_total",
            "counter",
            "Tier objects rejected (checksum, key, truncation, wrong shape).",
            |t| t.stats.corrupt + t.engine.rejected,
        ),
        (
            "agentkv_tier_demoted_blocks_total",
            "counter",
            "KV blocks written to the tier (on eviction from the active pool, or when computed).",
            |t| t.engine.demoted_blocks,
        ),
        (
            "agentkv_tier_already_held_blocks_total",
            "counter",
            "Evicted KV blocks not written again because the (RAM or disk) tier already held them.",
            |t| t.engine.already_held_blocks,
        ),
        (
            "agentkv_tier_busy_encoded_blocks_total",
            "counter",
            "KV blocks encoded for a lossy tier while the engine computed (no idle time came within tier_encode_deferral_ms, or the write queue was past half its cap).",
            |t| t.engine.busy_encoded_blocks,
        ),
        (
            "agentkv_tier_load_decisions_total",
            "counter",
            "Tier hits the cost model chose to load.",
            |t| t.engine.load_decisions,
        ),
        (
            "agentkv_tier_recompute_decisions_total",
            "counter",
            "Tier hits the cost model chose to recompute.",
            |t| t.engine.recompute_decisions,
        ),
    ];
    for (name, kind, help, f) in series {
        let _ = writeln!(
            out,
            "# HELP {name} {help}
# TYPE {name} {kind}"
        );
        for (i, t) in tiers.iter().enumerate() {
            let _ = writeln!(
                out,
                "{name}{{tier=\"{i}\",kind=\"{}\"}} {}",
                t.kind.as_str(),
                f(t)
            );
        }
    }
    render_tier_loads(out, s);
}

/// Per-tier load latency histograms and the prefetch counters.
fn render_tier_loads(out: &mut String, s: &EngineSnapshot) {
    let tiers = &s.tiers.tiers;
    let name = "agentkv_tier_load_latency_seconds";
    let _ = writeln!(
        out,
        "# HELP {name} Latency of one batched load from the tier.\n# TYPE {name} histogram"
    );
    for (i, t) in tiers.iter().enumerate() {
        let labels = format!("tier=\"{i}\",kind=\"{}\"", t.kind.as_str());
        let mut cumulative = 0;
        for (count, bound_us) in t
            .stats
            .load_buckets
            .iter()
            .zip(engine::LOAD_LATENCY_BUCKETS_US)
        {
            cumulative += count;
            let le = bound_us as f64 / 1e6;
            let _ = writeln!(out, "{name}_bucket{{{labels},le=\"{le}\"}} {cumulative}");
        }
        let _ = writeln!(
            out,
            "{name}_bucket{{{labels},le=\"+Inf\"}} {}",
            t.stats.load_count
        );
        let _ = writeln!(
            out,
            "{name}_sum{{{labels}}} {}",
            t.stats.load_sum_us as f64 / 1e6
        );
        let _ = writeln!(out, "{name}_count{{{labels}}} {}", t.stats.load_count);
    }
    let prefetch: [(&str, &str, u64); 5] = [
        (
            "agentkv_tier_prefetches_total",
            "Tier lookups started for requests (loaded off the engine thread).",
            s.tiers.prefetches,
        ),
        (
            "agentkv_tier_refetches_total",
            "Tier lookups started again because the active pool lost blocks meanwhile.",
            s.tiers.refetches,
        ),
        (
            "agentkv_tier_prefetch_wait_steps_total",
            "Engine steps with nothing to run but a tier load in flight.",
            s.tiers.prefetch_wait_steps,
        ),
        (
            "agentkv_tier_lookup_timeouts_total",
            "Tier lookups abandoned after the lookup timeout (their requests recomputed).",
            s.tiers.lookup_timeouts,
        ),
        (
            "agentkv_tier_dropped_writes_total",
            "Blocks not written to the tiers because the write queue was full.",
            s.tiers.dropped_writes,
        ),
    ];
    for (name, help, v) in prefetch {
        let _ = writeln!(
            out,
            "# HELP {name} {help}\n# TYPE {name} counter\n{name} {v}"
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn histogram_buckets_are_cumulative() {
        let mut h = Histogram::default();
        h.observe(Duration::from_millis(3));
        h.observe(Duration::from_millis(300));
        let mut out = String::new();
        h.render(&mut out, "x", "h");
        assert!(out.contains("x_bucket{le=\"0.005\"} 1\n"), "{out}");
        assert!(out.contains("x_bucket{le=\"0.5\"} 2\n"), "{out}");
        assert!(out.contains("x_bucket{le=\"+Inf\"} 2\n"), "{out}");
        assert!(out.contains("x_count 2\n"));
    }

    #[test]
    fn label_values_are_escaped() {
        assert_eq!(escape("a\"b\\c\nd"), "a\\\"b\\\\c\\nd");
    }
}
