//! `agentkv cache-sim`: read a JSONL trace (agentkv's agent format or Mooncake's), replay it
//! through the cache simulator (`cache::sim::simulate`) and the offline optimum
//! (`cache::sim::optimum`), print one JSON object. Parsing and I/O only; the logic is in `cache`.

use std::path::PathBuf;

use anyhow::Context;
use cache::sim::{
    label_conversations, mooncake_calls, optimum, simulate, InferredRetention, MooncakeRequest,
    SessionRetention, SimConfig, TraceCall, MOONCAKE_BLOCK_TOKENS,
};
use cache::EvictionPolicy;

#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum PolicyArg {
    Lru,
    Lfu,
    Slru,
    /// Segmented LRU with an adaptive protected fraction (starts at `--slru-protected`).
    AdaptiveSlru,
    /// LRU where a block read twice counts as used a learned return time later (the server's
    /// default; `--reuse-bonus-s` until a return time is learned).
    ReuseAware,
}

/// Which retention runs on top of the eviction policy.
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum RetentionArg {
    /// The eviction policy alone.
    None,
    /// What the server does for clients that send no hints (the default): conversations
    /// inferred from prefix continuation, retained for a learned TTL. Session names in the
    /// trace are ignored.
    Inferred,
    /// The trace's session names, retained for `--session-ttl-s` and released after each
    /// session's last call (what a client that names sessions and deletes them gets).
    Named,
    /// Conversations inferred offline over the whole trace, then replayed as `named`: a
    /// reference that knows each conversation's last call, not a policy.
    Oracle,
}

/// The trace's line format.
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum FormatArg {
    /// `mooncake` when the first line has `hash_ids`, else `agent`.
    Auto,
    /// `{"t", "session", "tenant", "tokens"}` per line (`bench` and the generators write it).
    Agent,
    /// Mooncake's FAST'25 traces: `{"timestamp", "input_length", "output_length", "hash_ids"}`.
    Mooncake,
}

/// Replay a trace through the KV-cache simulator; prints one JSON object with the offline
/// optimum beside the policy's figures.
#[derive(clap::Args, Debug)]
pub struct CacheSimArgs {
    /// JSONL trace (see `--format`).
    #[arg(long)]
    pub trace: PathBuf,
    #[arg(long, value_enum, default_value_t = FormatArg::Auto)]
    pub format: FormatArg,
    /// Tokens per block: 16 by default; a Mooncake trace's blocks are 512 tokens (its hash ids),
    /// the only size it can be replayed at, and the pool is counted in those blocks.
    #[arg(long)]
    pub block_size: Option<u32>,
    /// Blocks in the simulated pool.
    #[arg(long)]
    pub capacity_blocks: u32,
    /// Eviction policy (default: the server's, `reuse-aware`).
    #[arg(long, value_enum, default_value_t = PolicyArg::ReuseAware)]
    pub policy: PolicyArg,
    /// `reuse-aware`: the bonus in seconds until a return time is learned (and with
    /// `--retention none`, throughout).
    #[arg(long, default_value_t = 300.0)]
    pub reuse_bonus_s: f64,
    /// Fraction of the pool the protected segment may hold (slru; adaptive-slru's start).
    #[arg(long, default_value_t = 0.5)]
    pub slru_protected: f64,
    /// Retention on top of the policy (default: `inferred`, or `named` with `--session-ttl-s`).
    #[arg(long, value_enum)]
    pub retention: Option<RetentionArg>,
    /// `named` / `oracle`: each call's blocks are retained for its session this many seconds
    /// (trace time), released after the session's last call.
    #[arg(long)]
    pub session_ttl_s: Option<f64>,
    /// At most this fraction of the pool carries retention (default 0.9, the server's).
    #[arg(long)]
    pub retained_fraction: Option<f64>,
    /// `inferred`: the TTL is this quantile of the return gaps learned so far.
    #[arg(long)]
    pub ttl_quantile: Option<f64>,
    /// `inferred`: retain always, not only while the shadow caches say it pays.
    #[arg(long)]
    pub no_duel: bool,
    /// `inferred`: once the retention cap is reached, a new turn displaces retained
    /// conversations worth less than it (chance of return over mean wait) instead of being
    /// refused.
    #[arg(long)]
    pub displace: bool,
}

/// The printed report.
#[derive(serde::Serialize)]
struct Report {
    retention: RetentionArg,
    /// Tokens behind one simulated block's worth of hit rate (512 for Mooncake traces).
    trace_block_tokens: u32,
    #[serde(flatten)]
    sim: cache::sim::SimReport,
    /// Belady's rule on the same pool and rules (see `cache::sim::optimum`).
    optimum_hit_rate: f64,
    /// Every block seen before hits (an unbounded pool).
    unbounded_hit_rate: f64,
}

pub fn run(args: CacheSimArgs) -> anyhow::Result<()> {
    let (mut calls, mooncake) = load(&args.trace, args.format)?;
    let (block_size, trace_block_tokens) = if mooncake {
        match args.block_size {
            None | Some(MOONCAKE_BLOCK_TOKENS) => (1, MOONCAKE_BLOCK_TOKENS),
            Some(b) => anyhow::bail!(
                "a Mooncake trace hashes {MOONCAKE_BLOCK_TOKENS}-token blocks; --block-size {b} cannot replay it"
            ),
        }
    } else {
        let b = args.block_size.unwrap_or(16);
        (b, b)
    };
    let retention = match (args.retention, args.session_ttl_s) {
        (Some(r), _) => r,
        (None, Some(_)) => RetentionArg::Named,
        (None, None) => RetentionArg::Inferred,
    };
    let named_ttl = || {
        args.session_ttl_s
            .context("--retention named/oracle needs --session-ttl-s")
    };
    let mut session_retention = None;
    let mut inferred = None;
    match retention {
        RetentionArg::None => {}
        RetentionArg::Named | RetentionArg::Oracle => {
            if retention == RetentionArg::Oracle {
                calls = label_conversations(&calls, block_size);
            } else if calls.iter().any(|c| c.session.is_empty()) {
                anyhow::bail!("--retention named: the trace does not name every call's session");
            }
            session_retention = Some(SessionRetention {
                ttl_s: named_ttl()?,
                max_retained_fraction: args.retained_fraction.unwrap_or(0.9),
            });
        }
        RetentionArg::Inferred => {
            for c in &mut calls {
                c.session.clear();
            }
            let mut r = InferredRetention::default();
            if let Some(f) = args.retained_fraction {
                r.max_retained_fraction = f;
            }
            if args.no_duel {
                r.duel = None;
            }
            r.policy.displace = args.displace;
            if let Some(q) = args.ttl_quantile {
                anyhow::ensure!(q > 0.0 && q <= 1.0, "--ttl-quantile must be in (0, 1]");
                r.policy.return_model.quantile = q;
            }
            inferred = Some(r);
        }
    }
    let sim = simulate(
        &calls,
        SimConfig {
            block_size,
            capacity_blocks: args.capacity_blocks,
            policy: match args.policy {
                PolicyArg::ReuseAware => EvictionPolicy::ReuseAwareLru {
                    reuse_bonus_ms: (args.reuse_bonus_s.max(0.0) * 1000.0) as u64,
                },
                p => eviction_policy(p, args.slru_protected),
            },
            session_retention,
            inferred,
        },
    )?;
    let best = optimum(&calls, block_size, args.capacity_blocks);
    let report = Report {
        retention,
        trace_block_tokens,
        sim,
        optimum_hit_rate: best.hit_rate,
        unbounded_hit_rate: best.unbounded_hit_rate,
    };
    println!("{}", serde_json::to_string(&report)?);
    Ok(())
}

/// Reads a trace in `format` (blank lines skipped); says whether it was Mooncake's.
pub fn load(path: &std::path::Path, format: FormatArg) -> anyhow::Result<(Vec<TraceCall>, bool)> {
    let mooncake = match format {
        FormatArg::Agent => false,
        FormatArg::Mooncake => true,
        FormatArg::Auto => is_mooncake(path)?,
    };
    if mooncake {
        Ok((mooncake_calls(&load_mooncake(path)?)?, true))
    } else {
        Ok((read_lines(path)?, false))
    }
}

/// Every non-blank line of `path` as a `T`, errors naming the line.
fn read_lines<T: serde::de::DeserializeOwned>(path: &std::path::Path) -> anyhow::Result<Vec<T>> {
    let text =
        std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    text.lines()
        .enumerate()
        .filter(|(_, l)| !l.trim().is_empty())
        .map(|(n, l)| {
            serde_json::from_str::<T>(l)
                .with_context(|| format!("{}:{}: bad trace line", path.display(), n + 1))
        })
        .collect()
}

/// Whether the first non-blank line of `path` is a Mooncake request (has `hash_ids`).
pub fn is_mooncake(path: &std::path::Path) -> anyhow::Result<bool> {
    use std::io::BufRead;
    let file = std::fs::File::open(path).with_context(|| format!("opening {}", path.display()))?;
    for line in std::io::BufReader::new(file).lines() {
        let line = line.with_context(|| format!("reading {}", path.display()))?;
        if !line.trim().is_empty() {
            return Ok(line.contains("\"hash_ids\""));
        }
    }
    Ok(false)
}

/// Reads Mooncake requests (blank lines skipped).
pub fn load_mooncake(path: &std::path::Path) -> anyhow::Result<Vec<MooncakeRequest>> {
    read_lines(path)
}

/// Reads an agent-format JSONL trace (blank lines skipped).
pub fn load_trace(path: &std::path::Path) -> anyhow::Result<Vec<TraceCall>> {
    Ok(load(path, FormatArg::Agent)?.0)
}

/// The cache's eviction policy for a `--policy` choice.
pub fn eviction_policy(policy: PolicyArg, slru_protected: f64) -> EvictionPolicy {
    match policy {
        PolicyArg::Lru => EvictionPolicy::Lru,
        PolicyArg::Lfu => EvictionPolicy::Lfu,
        PolicyArg::Slru => EvictionPolicy::SegmentedLru {
            protected_fraction: slru_protected,
        },
        PolicyArg::ReuseAware => EvictionPolicy::REUSE_AWARE_LRU,
        PolicyArg::AdaptiveSlru => EvictionPolicy::AdaptiveSegmentedLru {
            initial_protected_fraction: slru_protected,
            min_protected_fraction: 0.0,
            max_protected_fraction: 1.0,
        },
    }
}
