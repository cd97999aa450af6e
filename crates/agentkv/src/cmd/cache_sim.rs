//! `agentkv cache-sim`: read a JSONL agent trace, replay it through the cache simulator
//! (`cache::sim::simulate`), print one JSON object. Parsing and I/O only; the logic is in `cache`.

use std::io::BufRead;
use std::path::PathBuf;

use anyhow::Context;
use cache::sim::{simulate, SessionRetention, SimConfig, TraceCall};
use cache::EvictionPolicy;

#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum PolicyArg {
    Lru,
    Lfu,
    Slru,
    /// Segmented LRU with an adaptive protected fraction (starts at `--slru-protected`).
    AdaptiveSlru,
}

/// Replay an agent trace through the KV-cache simulator.
#[derive(clap::Args, Debug)]
pub struct CacheSimArgs {
    /// JSONL trace: one `{"t", "session", "tenant", "tokens"}` object per line.
    #[arg(long)]
    pub trace: PathBuf,
    /// Tokens per block.
    #[arg(long, default_value_t = 16)]
    pub block_size: u32,
    /// Blocks in the simulated pool.
    #[arg(long)]
    pub capacity_blocks: u32,
    /// Eviction policy.
    #[arg(long, value_enum, default_value_t = PolicyArg::Lru)]
    pub policy: PolicyArg,
    /// Fraction of the pool the protected segment may hold (slru; adaptive-slru's start).
    #[arg(long, default_value_t = 0.5)]
    pub slru_protected: f64,
    /// Session-aware retention: each call's blocks are retained for its session this many
    /// seconds (trace time), released after the session's last call.
    #[arg(long)]
    pub session_ttl_s: Option<f64>,
    /// With `--session-ttl-s`: at most this fraction of the pool carries retention.
    #[arg(long, default_value_t = 0.9)]
    pub retained_fraction: f64,
}

pub fn run(args: CacheSimArgs) -> anyhow::Result<()> {
    let calls = load_trace(&args.trace)?;
    let report = simulate(
        &calls,
        SimConfig {
            block_size: args.block_size,
            capacity_blocks: args.capacity_blocks,
            policy: eviction_policy(args.policy, args.slru_protected),
            session_retention: args.session_ttl_s.map(|ttl_s| SessionRetention {
                ttl_s,
                max_retained_fraction: args.retained_fraction,
            }),
        },
    )?;
    println!("{}", serde_json::to_string(&report)?);
    Ok(())
}

/// Reads a JSONL trace (blank lines skipped).
pub fn load_trace(path: &std::path::Path) -> anyhow::Result<Vec<TraceCall>> {
    let file = std::fs::File::open(path).with_context(|| format!("opening {}", path.display()))?;
    let mut calls = Vec::new();
    for (n, line) in std::io::BufReader::new(file).lines().enumerate() {
        let line = line.with_context(|| format!("reading {}", path.display()))?;
        if line.trim().is_empty() {
            continue;
        }
        let call: TraceCall = serde_json::from_str(&line)
            .with_context(|| format!("{}:{}: bad trace line", path.display(), n + 1))?;
        calls.push(call);
    }
    Ok(calls)
}

/// The cache's eviction policy for a `--policy` choice.
pub fn eviction_policy(policy: PolicyArg, slru_protected: f64) -> EvictionPolicy {
    match policy {
        PolicyArg::Lru => EvictionPolicy::Lru,
        PolicyArg::Lfu => EvictionPolicy::Lfu,
        PolicyArg::Slru => EvictionPolicy::SegmentedLru {
            protected_fraction: slru_protected,
        },
        PolicyArg::AdaptiveSlru => EvictionPolicy::AdaptiveSegmentedLru {
            initial_protected_fraction: slru_protected,
            min_protected_fraction: 0.0,
            max_protected_fraction: 1.0,
        },
    }
}
