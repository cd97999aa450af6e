//! Aggregates call and task records into per-target summaries (latency percentiles, throughput,
//! cached fraction, error counts) and target-1 / target-0 ratios. Pure: no I/O, no clocks.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::client::Target;
use crate::driver::{CallOutcome, CallRecord, RunOutput, TaskRecord};
use crate::stats::{summarize, Summary};
use crate::workload::WorkloadConfig;

/// Everything a run produced; serialised as `results.json`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct BenchResults {
    /// `"agent"` or `"replay <trace file>"`.
    pub source: String,
    /// The generated workload's parameters (`None` for a replay).
    pub workload: Option<WorkloadConfig>,
    pub wall_s: f64,
    pub targets: Vec<TargetSummary>,
    /// Target 1 value divided by target 0 value, per metric, when two targets ran.
    pub ratios: BTreeMap<String, f64>,
    pub calls: Vec<CallRecord>,
    pub tasks: Vec<TaskRecord>,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct TargetSummary {
    pub target: Target,
    pub calls_ok: u64,
    pub calls_failed: u64,
    /// Calls never sent because an earlier call of their task failed.
    pub calls_skipped: u64,
    /// Calls never sent because the run's time limit had passed.
    pub calls_not_run: u64,
    /// Failed calls by kind (`http_status_503`, `timeout`, …).
    pub errors: BTreeMap<String, u64>,
    pub tasks_ok: u64,
    pub tasks_failed: u64,
    /// Tasks stopped by the time limit before their last call.
    pub tasks_cut: u64,
    pub ttft_s: Option<Summary>,
    pub inter_token_s: Option<Summary>,
    pub e2e_s: Option<Summary>,
    /// Over successful tasks.
    pub task_latency_s: Option<Summary>,
    /// Successful calls per second of the run's wall time (shared by all targets).
    pub calls_per_s: f64,
    pub generated_tokens: u64,
    pub generated_tokens_per_s: f64,
    pub prompt_tokens: u64,
    /// Calls whose final chunk carried `usage`.
    pub calls_with_usage: u64,
    /// Calls whose usage carried `prompt_tokens_details.cached_tokens`.
    pub calls_with_cached_tokens: u64,
    /// Sum of reported cached tokens; `None` = the server never reported them.
    pub cached_tokens: Option<u64>,
    /// cached / prompt tokens over the calls that reported cached tokens.
    pub cached_fraction: Option<f64>,
    /// Calls whose usage said why their cached prefix ended early, by reason (`diverged`,
    /// `evicted`, `uncached`: agentkv's `prompt_tokens_details.cache_miss`); empty when the
    /// server does not report it.
    #[serde(default)]
    pub cache_misses: BTreeMap<String, u64>,
}

/// Builds the results of `out`, run against `targets` (indices as in the records).
pub fn aggregate(
    source: String,
    workload: Option<WorkloadConfig>,
    targets: &[Target],
    out: RunOutput,
) -> BenchResults {
    let wall_s = out.wall_s;
    let summaries: Vec<TargetSummary> = targets
        .iter()
        .enumerate()
        .map(|(i, t)| summarize_target(i, t.clone(), &out.calls, &out.tasks, wall_s))
        .collect();
    let ratios = if summaries.len() == 2 {
        ratios(&summaries[0], &summaries[1])
    } else {
        BTreeMap::new()
    };
    BenchResults {
        source,
        workload,
        wall_s,
        targets: summaries,
        ratios,
        calls: out.calls,
        tasks: out.tasks,
    }
}

fn summarize_target(
    index: usize,
    target: Target,
    calls: &[CallRecord],
    tasks: &[TaskRecord],
    wall_s: f64,
) -> TargetSummary {
    let mine = || calls.iter().filter(move |c| c.target == index);
    let oks: Vec<_> = mine()
        .filter_map(|c| match &c.outcome {
            CallOutcome::Ok(m) => Some(m),
            _ => None,
        })
        .collect();
    let mut errors = BTreeMap::new();
    let mut calls_failed = 0;
    let mut calls_skipped = 0;
    let mut calls_not_run = 0;
    for c in mine() {
        match &c.outcome {
            CallOutcome::Error(e) => {
                calls_failed += 1;
                let kind = serde_json::to_value(e.kind)
                    .ok()
                    .and_then(|v| v.as_str().map(str::to_string))
                    .unwrap_or_default();
                let key = match e.status {
                    Some(s) => format!("{kind}_{s}"),
                    None => kind,
                };
                *errors.entry(key).or_insert(0) += 1;
            }
            CallOutcome::Skipped => calls_skipped += 1,
            CallOutcome::NotRun => calls_not_run += 1,
            CallOutcome::Ok(_) => {}
        }
    }
    let my_tasks = || tasks.iter().filter(|t| t.target == index);
    let generated_tokens: u64 = oks.iter().map(|m| m.completion_tokens()).sum();
    let with_usage: Vec<_> = oks.iter().filter_map(|m| m.usage.as_ref()).collect();
    let with_cached: Vec<_> = with_usage
        .iter()
        .filter_map(|u| Some((u.cached_tokens()?, u.prompt_tokens)))
        .collect();
    let cached_tokens = (!with_cached.is_empty()).then(|| with_cached.iter().map(|c| c.0).sum());
    let cached_prompt: u64 = with_cached.iter().map(|c| c.1).sum();
    let mut cache_misses = BTreeMap::new();
    for miss in with_usage
        .iter()
        .filter_map(|u| u.prompt_tokens_details.as_ref()?.cache_miss.as_ref())
    {
        *cache_misses.entry(miss.reason.clone()).or_insert(0) += 1;
    }
    let per_s = |x: f64| if wall_s > 0.0 { x / wall_s } else { 0.0 };
    TargetSummary {
        target,
        calls_ok: oks.len() as u64,
        calls_failed,
        calls_skipped,
        calls_not_run,
        errors,
        tasks_ok: my_tasks().filter(|t| t.ok).count() as u64,
        tasks_failed: my_tasks().filter(|t| !t.ok && !t.cut_by_time_limit).count() as u64,
        tasks_cut: my_tasks().filter(|t| t.cut_by_time_limit).count() as u64,
        ttft_s: summarize(oks.iter().filter_map(|m| m.ttft_s)),
        inter_token_s: summarize(oks.iter().flat_map(|m| m.inter_token_s.iter().copied())),
        e2e_s: summarize(oks.iter().map(|m| m.e2e_s)),
        task_latency_s: summarize(my_tasks().filter(|t| t.ok).map(|t| t.latency_s)),
        calls_per_s: per_s(oks.len() as f64),
        generated_tokens,
        generated_tokens_per_s: per_s(generated_tokens as f64),
        prompt_tokens: with_usage.iter().map(|u| u.prompt_tokens).sum(),
        calls_with_usage: with_usage.len() as u64,
        calls_with_cached_tokens: with_cached.len() as u64,
        cached_tokens,
        cached_fraction: cached_tokens
            .filter(|_| cached_prompt > 0)
            .map(|c| c as f64 / cached_prompt as f64),
        cache_misses,
    }
}

fn ratios(a: &TargetSummary, b: &TargetSummary) -> BTreeMap<String, f64> {
    let mut r = BTreeMap::new();
    let mut put = |name: &str, x: Option<f64>, y: Option<f64>| {
        if let (Some(x), Some(y)) = (x, y) {
            if x != 0.0 {
                r.insert(name.to_string(), y / x);
            }
        }
    };
    for (name, f) in [
        (
            "e2e",
            (|t: &TargetSummary| t.e2e_s) as fn(&TargetSummary) -> Option<Summary>,
        ),
        ("ttft", |t| t.ttft_s),
        ("inter_token", |t| t.inter_token_s),
        ("task_latency", |t| t.task_latency_s),
    ] {
        put(
            &format!("{name}_mean"),
            f(a).map(|s| s.mean),
            f(b).map(|s| s.mean),
        );
        put(
            &format!("{name}_p50"),
            f(a).map(|s| s.p50),
            f(b).map(|s| s.p50),
        );
        put(
            &format!("{name}_p95"),
            f(a).map(|s| s.p95),
            f(b).map(|s| s.p95),
        );
        put(
            &format!("{name}_p99"),
            f(a).map(|s| s.p99),
            f(b).map(|s| s.p99),
        );
    }
    put("calls_per_s", Some(a.calls_per_s), Some(b.calls_per_s));
    put(
        "generated_tokens_per_s",
        Some(a.generated_tokens_per_s),
        Some(b.generated_tokens_per_s),
    );
    r
}
