//! Session-aware retention under memory pressure, for docs/history/benchmarks-log.md: hit rate of LRU,
//! adaptive SLRU and the session-aware policy (LRU plus per-session retention with a TTL,
//! released when a task ends) on generated agent traces with tool pauses, through the same
//! simulator as `agentkv cache-sim --session-ttl-s`.
//!
//! `cargo run --release -p cache --example session_sim [agents] [tasks] [seed]`
//!
//! Pressure is stated against the live sessions' working set: the pool holds `fraction` of
//! (agents × the mean final context of a task), so at 0.5 it holds at most half of the sessions
//! that are live at once. The last row (2×) is the no-pressure control.

use std::collections::HashMap;

use cache::sim::{
    generate, simulate, SessionRetention, SimConfig, TraceCall, TraceKind, TraceParams,
};
use cache::EvictionPolicy;

const BLOCK_SIZE: u32 = 16;

/// Mean over sessions of the longest prompt (blocks), and the longest prompt of the trace.
fn working_set(trace: &[TraceCall]) -> (f64, u32) {
    let mut longest: HashMap<&str, usize> = HashMap::new();
    for c in trace {
        let l = longest.entry(c.session.as_str()).or_default();
        *l = (*l).max(c.tokens.len());
    }
    let blocks = |t: usize| t.div_ceil(BLOCK_SIZE as usize) as f64;
    let mean = longest.values().map(|t| blocks(*t)).sum::<f64>() / longest.len() as f64;
    let max = longest.values().copied().max().unwrap_or(0);
    (mean, blocks(max) as u32)
}

fn main() {
    let args: Vec<u64> = std::env::args()
        .skip(1)
        .filter_map(|a| a.parse().ok())
        .collect();
    let agents = args.first().copied().unwrap_or(12) as u32;
    let tasks = args.get(1).copied().unwrap_or(4) as u32;
    let seed = args.get(2).copied().unwrap_or(1);
    let session = |ttl_s| {
        Some(SessionRetention {
            ttl_s,
            max_retained_fraction: 0.9,
        })
    };
    let policies: [(&str, EvictionPolicy, Option<SessionRetention>); 4] = [
        ("LRU", EvictionPolicy::Lru, None),
        (
            "adaptive SLRU",
            EvictionPolicy::ADAPTIVE_SEGMENTED_LRU,
            None,
        ),
        (
            "session-aware, TTL 10 s",
            EvictionPolicy::Lru,
            session(10.0),
        ),
        (
            "session-aware, TTL 60 s",
            EvictionPolicy::Lru,
            session(60.0),
        ),
    ];
    println!("agents={agents} tasks={tasks} seed={seed} block_size={BLOCK_SIZE}\n");
    print!("| trace | pool / live working set |");
    for (name, _, _) in &policies {
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
        let (mean, longest) = working_set(&trace);
        for fraction in [0.25, 0.5, 2.0] {
            let capacity = ((mean * f64::from(agents) * fraction) as u32).max(longest + 1);
            print!(
                "| {label} ({} calls) | {fraction} ({capacity} blocks) |",
                trace.len()
            );
            for (_, policy, retention) in &policies {
                let r = simulate(
                    &trace,
                    SimConfig {
                        block_size: BLOCK_SIZE,
                        capacity_blocks: capacity,
                        policy: *policy,
                        session_retention: *retention,
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
