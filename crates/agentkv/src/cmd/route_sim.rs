//! `agentkv route-sim`: replay a JSONL agent trace over simulated replica fleets behind a router
//! (`cache::sim::simulate_routing`) and print one JSON line per (replica count, routing policy),
//! plus the single-server baselines: one server with one replica's pool, and one server with the
//! whole fleet's pooled capacity. Parsing and I/O only; the logic is in `cache`.

use std::path::PathBuf;

use cache::sim::{simulate, simulate_routing, RouteConfig, RoutePolicy, SimConfig};

use super::cache_sim::{eviction_policy, load_trace, PolicyArg};

#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum RoutingArg {
    RoundRobin,
    SessionAffinity,
    CacheAware,
}

/// Simulate the prefix-cache hit rate of N replicas behind a router, per routing policy.
#[derive(clap::Args, Debug)]
pub struct RouteSimArgs {
    /// JSONL trace: one `{"t", "session", "tenant", "tokens"}` object per line.
    #[arg(long)]
    pub trace: PathBuf,
    /// Replica counts to simulate (comma-separated).
    #[arg(long, value_delimiter = ',', default_value = "8,16,32,64")]
    pub replicas: Vec<u32>,
    /// Routing policies (comma-separated; default all).
    #[arg(long, value_enum, value_delimiter = ',')]
    pub routing: Vec<RoutingArg>,
    /// Tokens per block.
    #[arg(long, default_value_t = 16)]
    pub block_size: u32,
    /// Blocks in each replica's pool.
    #[arg(long)]
    pub capacity_blocks: u32,
    /// Eviction policy of every replica.
    #[arg(long, value_enum, default_value_t = PolicyArg::Lru)]
    pub policy: PolicyArg,
    /// Modelled prefill speed of one replica (tokens/s).
    #[arg(long, default_value_t = 2000.0)]
    pub prefill_tokens_per_s: f64,
    /// Modelled fixed cost of one call (seconds).
    #[arg(long, default_value_t = 0.5)]
    pub overhead_s: f64,
    /// cache_aware balances load when max - min in-flight calls exceeds this …
    #[arg(long, default_value_t = 8)]
    pub balance_abs: u32,
    /// … and max > this × min.
    #[arg(long, default_value_t = 1.5)]
    pub balance_rel: f64,
}

pub fn run(args: RouteSimArgs) -> anyhow::Result<()> {
    let calls = load_trace(&args.trace)?;
    let policy = eviction_policy(args.policy, 0.5);
    let routings = if args.routing.is_empty() {
        vec![
            RoutingArg::RoundRobin,
            RoutingArg::SessionAffinity,
            RoutingArg::CacheAware,
        ]
    } else {
        args.routing.clone()
    };
    let single = |capacity_blocks| {
        simulate(
            &calls,
            SimConfig {
                block_size: args.block_size,
                capacity_blocks,
                policy,
                session_retention: None,
                inferred: None,
            },
        )
    };
    let one = single(args.capacity_blocks)?;
    println!(
        "{}",
        serde_json::json!({"baseline": "one_server_one_pool", "hit_rate": one.hit_rate,
                           "capacity_blocks": args.capacity_blocks})
    );
    for &n in &args.replicas {
        let pooled = single(args.capacity_blocks.saturating_mul(n))?;
        for &r in &routings {
            let routing = match r {
                RoutingArg::RoundRobin => RoutePolicy::RoundRobin,
                RoutingArg::SessionAffinity => RoutePolicy::SessionAffinity,
                RoutingArg::CacheAware => RoutePolicy::CacheAware,
            };
            let report = simulate_routing(
                &calls,
                RouteConfig {
                    replicas: n,
                    block_size: args.block_size,
                    capacity_blocks: args.capacity_blocks,
                    policy,
                    routing,
                    prefill_tokens_per_s: args.prefill_tokens_per_s,
                    overhead_s: args.overhead_s,
                    balance_abs: args.balance_abs,
                    balance_rel: args.balance_rel,
                },
            )?;
            let mut v = serde_json::to_value(&report)?;
            v["pooled_single_server_hit_rate"] = serde_json::json!(pooled.hit_rate);
            v["fraction_of_pooled"] = serde_json::json!(if pooled.hit_rate > 0.0 {
                report.hit_rate / pooled.hit_rate
            } else {
                0.0
            });
            v["fraction_of_one_pool"] = serde_json::json!(if one.hit_rate > 0.0 {
                report.hit_rate / one.hit_rate
            } else {
                0.0
            });
            println!("{v}");
        }
    }
    Ok(())
}
