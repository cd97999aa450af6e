//! Hit-rate table for docs/history/benchmarks-log.md: policy × capacity on generated ReAct, WebShop and swarm
//! traces, through the same simulator as `agentkv cache-sim`.
//!
//! `cargo run --release -p cache --example sim_table [agents] [tasks] [seed]`
//!
//! Capacities are fractions of the trace's distinct full blocks (what an unbounded cache would
//! hold), but never below the longest prompt.

use std::collections::HashSet;

use cache::sim::{generate, simulate, SimConfig, TraceCall, TraceKind, TraceParams};
use cache::{BlockKey, EvictionPolicy, Namespace, TenantId};

const BLOCK_SIZE: u32 = 16;

fn distinct_blocks(trace: &[TraceCall]) -> (u32, u32) {
    let mut seen = HashSet::new();
    let mut longest = 0;
    for call in trace {
        let tenant = TenantId(call.tenant.bytes().map(u32::from).sum());
        let ns = Namespace::for_tenant(tenant).key();
        let mut parent = ns.root();
        for chunk in call.tokens.chunks_exact(BLOCK_SIZE as usize) {
            parent = BlockKey::chain(&parent, chunk);
            seen.insert(parent.0);
        }
        longest = longest.max(call.tokens.len().div_ceil(BLOCK_SIZE as usize) as u32);
    }
    (seen.len() as u32, longest)
}

fn main() {
    let args: Vec<u64> = std::env::args()
        .skip(1)
        .filter_map(|a| a.parse().ok())
        .collect();
    let agents = args.first().copied().unwrap_or(24) as u32;
    let tasks = args.get(1).copied().unwrap_or(4) as u32;
    let seed = args.get(2).copied().unwrap_or(1);
    let policies = [
        ("LRU", EvictionPolicy::Lru),
        ("LFU", EvictionPolicy::Lfu),
        (
            "SLRU 0.2",
            EvictionPolicy::SegmentedLru {
                protected_fraction: 0.2,
            },
        ),
        (
            "SLRU 0.5",
            EvictionPolicy::SegmentedLru {
                protected_fraction: 0.5,
            },
        ),
        (
            "SLRU 0.8",
            EvictionPolicy::SegmentedLru {
                protected_fraction: 0.8,
            },
        ),
        ("adaptive SLRU", EvictionPolicy::ADAPTIVE_SEGMENTED_LRU),
    ];
    println!("agents={agents} tasks={tasks} seed={seed} block_size={BLOCK_SIZE}\n");
    print!("| trace | capacity (blocks) |");
    for (name, _) in &policies {
        print!(" {name} |");
    }
    println!();
    println!("|---|---|{}", "---|".repeat(policies.len()));
    for (label, kind) in [
        ("react", TraceKind::React),
        ("webshop", TraceKind::Webshop),
        ("swarm", TraceKind::Swarm),
    ] {
        let trace = generate(TraceParams {
            kind,
            agents,
            tasks,
            seed,
        });
        let (distinct, longest) = distinct_blocks(&trace);
        let prompt_tokens: usize = trace.iter().map(|c| c.tokens.len()).sum();
        for fraction in [0.05, 0.1, 0.25, 0.5, 1.0] {
            let capacity = ((f64::from(distinct) * fraction) as u32).max(longest + 1);
            print!(
                "| {label} ({} calls, {:.1}M tokens) | {capacity} ({:.0}%) |",
                trace.len(),
                prompt_tokens as f64 / 1e6,
                fraction * 100.0
            );
            for (_, policy) in &policies {
                let r = simulate(
                    &trace,
                    SimConfig {
                        block_size: BLOCK_SIZE,
                        capacity_blocks: capacity,
                        policy: *policy,
                        session_retention: None,
                        inferred: None,
                    },
                )
                .expect("capacity holds the longest prompt");
                print!(" {:.1}% |", r.hit_rate * 100.0);
            }
            println!();
        }
    }
}
