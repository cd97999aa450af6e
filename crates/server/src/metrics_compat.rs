//! The engine's load and cache figures under the names other serving stacks' routers scrape, next
//! to our own `agentkv_` series (`metrics.rs` appends these to `/metrics`):
//!
//! - vLLM's: `vllm:num_requests_waiting` / `vllm:num_requests_running` (the Gateway API Inference
//!   Extension's queue and running gauges, vllm-router's load signals), `vllm:kv_cache_usage_perc`
//!   and its older name `vllm:gpu_cache_usage_perc` (KV utilisation as a fraction 0–1, as vLLM
//!   reports it), `vllm:cache_config_info` (block size and pool size as labels, read by the
//!   Inference Extension's prefix-cache scorer), the prefix-cache query / hit token counters and
//!   the prompt / generation token counters; every series labelled `model_name` like vLLM's.
//! - SGLang's (what sglang-router and the Inference Extension read for SGLang pods):
//!   `sglang:num_queue_reqs`, `sglang:num_running_reqs`, `sglang:token_usage`,
//!   `sglang:cache_hit_rate`.
//!
//! Utilisation counts the blocks requests hold (`in_use`); published blocks kept only for reuse
//! are reclaimable and count as free, as in vLLM. Owns only the renaming; never computes a rate
//! over time (the hit rate is the cumulative ratio SGLang exports).

use std::fmt::Write;

use engine::EngineSnapshot;

/// Server-side totals the compat series need (summed over tenants).
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct CompatTotals {
    pub prompt_tokens: u64,
    pub generation_tokens: u64,
    pub requests_finished: u64,
}

fn series(
    out: &mut String,
    name: &str,
    kind: &str,
    help: &str,
    labels: &str,
    value: impl std::fmt::Display,
) {
    let _ = writeln!(
        out,
        "# HELP {name} {help}\n# TYPE {name} {kind}\n{name}{{{labels}}} {value}"
    );
}

/// KV utilisation as a fraction: blocks held by requests / blocks in the pool.
pub(crate) fn kv_usage_fraction(s: &EngineSnapshot) -> f64 {
    let total = s.usage.total.max(1);
    f64::from(s.usage.in_use) / f64::from(total)
}

/// Appends the vLLM- and SGLang-named series.
pub(crate) fn render_compat(
    out: &mut String,
    s: &EngineSnapshot,
    model_name: &str,
    totals: CompatTotals,
) {
    let model = crate::prom_text::escape(model_name);
    let labels = format!("model_name=\"{model}\",engine=\"0\"");
    let usage = kv_usage_fraction(s);
    series(
        out,
        "vllm:num_requests_waiting",
        "gauge",
        "Number of requests waiting to be processed (agentkv_requests_waiting).",
        &labels,
        s.num_waiting,
    );
    series(
        out,
        "vllm:num_requests_running",
        "gauge",
        "Number of requests in model execution batches (agentkv_requests_running).",
        &labels,
        s.num_running,
    );
    series(
        out,
        "vllm:kv_cache_usage_perc",
        "gauge",
        "KV-cache usage. 1 means 100 percent usage (blocks held by requests / pool).",
        &labels,
        usage,
    );
    series(
        out,
        "vllm:gpu_cache_usage_perc",
        "gauge",
        "KV-cache usage under vLLM's older name. 1 means 100 percent usage.",
        &labels,
        usage,
    );
    series(
        out,
        "vllm:cache_config_info",
        "gauge",
        "Information of the KV cache configuration (labels).",
        &format!(
            "{labels},block_size=\"{}\",num_gpu_blocks=\"{}\",enable_prefix_caching=\"{}\",cache_dtype=\"{}\"",
            s.block_size,
            s.num_blocks,
            if s.prefix_caching { "True" } else { "False" },
            crate::prom_text::escape(&s.kv_codec)
        ),
        1,
    );
    let c = &s.cache;
    series(
        out,
        "vllm:prefix_cache_queries_total",
        "counter",
        "Prefix-cache queries, in tokens.",
        &labels,
        c.lookup_hit_tokens + c.lookup_miss_tokens,
    );
    series(
        out,
        "vllm:prefix_cache_hits_total",
        "counter",
        "Prefix-cache hits, in tokens.",
        &labels,
        c.lookup_hit_tokens,
    );
    series(
        out,
        "vllm:prompt_tokens_total",
        "counter",
        "Prefill tokens of finished requests.",
        &labels,
        totals.prompt_tokens,
    );
    series(
        out,
        "vllm:generation_tokens_total",
        "counter",
        "Generated tokens of finished requests.",
        &labels,
        totals.generation_tokens,
    );
    series(
        out,
        "vllm:request_success_total",
        "counter",
        "Requests that ran to completion.",
        &format!("{labels},finished_reason=\"any\""),
        totals.requests_finished,
    );
    let sg = format!("model_name=\"{model}\"");
    series(
        out,
        "sglang:num_queue_reqs",
        "gauge",
        "Requests in the waiting queue (SGLang's name).",
        &sg,
        s.num_waiting,
    );
    series(
        out,
        "sglang:num_running_reqs",
        "gauge",
        "Running requests (SGLang's name).",
        &sg,
        s.num_running,
    );
    series(
        out,
        "sglang:token_usage",
        "gauge",
        "KV token usage as a fraction (SGLang's name).",
        &sg,
        usage,
    );
    let queried = c.lookup_hit_tokens + c.lookup_miss_tokens;
    let hit_rate = if queried == 0 {
        0.0
    } else {
        c.lookup_hit_tokens as f64 / queried as f64
    };
    series(
        out,
        "sglang:cache_hit_rate",
        "gauge",
        "Prefix-cache hit rate in tokens since start (SGLang's name).",
        &sg,
        hit_rate,
    );
}
