//! `agentkv bench replay <mooncake trace>`: turn each request's hash ids into a token-id prompt
//! (`cache::sim::mooncake_prompt`), replay them open-loop against a live server
//! (`bench::open_loop`), and — given the server's pool size — replay the same prompts through the
//! simulator's default policy, so the simulator's figures are checked against the engine's.
//! Glue and the printed report only.

use bench::open_loop::{run_open_loop, OpenLoopConfig, TimedPrompt};
use cache::sim::{mooncake_prompt, simulate, InferredRetention, SimConfig, TraceCall};
use cache::EvictionPolicy;

use super::bench_args::{targets, ReplayArgs};

/// The `p`-th percentile of `v` (the bench's definition), 0 when empty.
fn quantile(v: impl IntoIterator<Item = f64>, p: f64) -> f64 {
    bench::stats::percentile(&bench::stats::sorted_finite(v), p).unwrap_or(0.0)
}

pub fn run(a: &ReplayArgs) -> anyhow::Result<()> {
    anyhow::ensure!(a.block_tokens > 0, "--block-tokens must be > 0");
    let mut requests = super::cache_sim::load_mooncake(&a.trace)?;
    if let Some(n) = a.max_requests {
        requests.truncate(n);
    }
    let prompts: Vec<TimedPrompt> = requests
        .iter()
        .map(|r| TimedPrompt {
            at_s: r.timestamp as f64 / 1000.0,
            prompt: mooncake_prompt(r, a.block_tokens),
        })
        .collect();
    let sim = match a.capacity_blocks {
        Some(capacity_blocks) => {
            let calls: Vec<TraceCall> = prompts
                .iter()
                .map(|p| TraceCall {
                    t: p.at_s * a.time_scale,
                    session: String::new(),
                    tenant: String::new(),
                    tokens: p.prompt.clone(),
                })
                .collect();
            let config = SimConfig {
                block_size: a.block_tokens as u32,
                capacity_blocks,
                policy: if a.sim_plain_lru {
                    EvictionPolicy::Lru
                } else {
                    EvictionPolicy::REUSE_AWARE_LRU
                },
                session_retention: None,
                inferred: (!a.sim_plain_lru).then(InferredRetention::default),
            };
            Some(simulate(&calls, config)?)
        }
        None => None,
    };
    let target = targets(&a.target, "agentkv")?.remove(0);
    let cfg = OpenLoopConfig {
        target,
        time_scale: a.time_scale,
        max_tokens: a.max_tokens,
        max_in_flight: a.max_in_flight,
        timeout: std::time::Duration::from_secs_f64(a.target.timeout_s),
    };
    let started = std::time::Instant::now();
    let results = run_open_loop(cfg, prompts)?;
    let wall_s = started.elapsed().as_secs_f64();
    let ok: Vec<_> = results.iter().filter(|r| r.error.is_none()).collect();
    let prompt_tokens: u64 = ok.iter().map(|r| r.prompt_tokens).sum();
    let cached_tokens: u64 = ok.iter().map(|r| r.cached_tokens).sum();
    let first_error = results.iter().find_map(|r| r.error.clone());
    let report = serde_json::json!({
        "trace": a.trace.display().to_string(),
        "requests": results.len(),
        "errors": results.len() - ok.len(),
        "first_error": first_error,
        "time_scale": a.time_scale,
        "block_tokens": a.block_tokens,
        "wall_s": wall_s,
        "prompt_tokens": prompt_tokens,
        "cached_tokens": cached_tokens,
        "hit_rate": if prompt_tokens == 0 { 0.0 } else { cached_tokens as f64 / prompt_tokens as f64 },
        "latency_p50_s": quantile(ok.iter().map(|r| r.latency_s), 50.0),
        "latency_p95_s": quantile(ok.iter().map(|r| r.latency_s), 95.0),
        "late_p95_s": quantile(results.iter().map(|r| r.late_s), 95.0),
        "sim": sim,
    });
    println!("{}", serde_json::to_string(&report)?);
    Ok(())
}
