//! Adaptive segmented LRU against fixed protected fractions on the three synthetic agent traces
//! (the `sim_table` example's defaults: 24 agents over 3 tenants, 4 tasks each, seed 1, block
//! size 16), at the two tight capacities where the best fixed fraction differs by trace (5% and
//! 10% of the trace's distinct blocks, as in docs/history/benchmarks-log.md). Deterministic, so the printed
//! table is exact; the assertions keep a margin.

use cache::sim::{generate, simulate, SimConfig, SimReport, TraceKind, TraceParams};
use cache::EvictionPolicy;

fn slru(protected_fraction: f64) -> EvictionPolicy {
    EvictionPolicy::SegmentedLru { protected_fraction }
}

#[test]
fn adaptive_tracks_the_best_fixed_fraction_and_never_loses_to_lru() {
    let fixed = [
        ("SLRU 0.2", slru(0.2)),
        ("SLRU 0.5", slru(0.5)),
        ("SLRU 0.8", slru(0.8)),
    ];
    println!(
        "| trace | capacity | LRU | SLRU 0.2 | SLRU 0.5 | SLRU 0.8 | adaptive | final protected |"
    );
    println!("|---|---|---|---|---|---|---|---|");
    // Capacities: 5% and 10% of the distinct full blocks of each trace.
    for (label, kind, capacities) in [
        ("react", TraceKind::React, [2472, 4945]),
        ("webshop", TraceKind::Webshop, [2816, 5632]),
        ("swarm", TraceKind::Swarm, [451, 903]),
    ] {
        let trace = generate(TraceParams {
            kind,
            agents: 24,
            tasks: 4,
            seed: 1,
        });
        for capacity_blocks in capacities {
            let run = |policy| -> SimReport {
                simulate(
                    &trace,
                    SimConfig {
                        block_size: 16,
                        capacity_blocks,
                        policy,
                        session_retention: None,
                        inferred: None,
                    },
                )
                .expect("capacity holds the longest prompt")
            };
            let lru = run(EvictionPolicy::Lru).hit_rate;
            let fixed_rates: Vec<f64> = fixed.iter().map(|(_, p)| run(*p).hit_rate).collect();
            let adaptive = run(EvictionPolicy::ADAPTIVE_SEGMENTED_LRU);
            let a = adaptive.hit_rate;
            let best = fixed_rates.iter().copied().fold(lru, f64::max);
            let pct = |r: f64| format!("{:.1}%", r * 100.0);
            println!(
                "| {label} | {capacity_blocks} | {} | {} | {} | {} | {} | {} |",
                pct(lru),
                pct(fixed_rates[0]),
                pct(fixed_rates[1]),
                pct(fixed_rates[2]),
                pct(a),
                adaptive.protected_capacity_blocks
            );
            let ctx = format!("{label} at {capacity_blocks} blocks");
            // Never worse than LRU, nor than its own starting point (fixed 0.2).
            assert!(a >= lru - 0.002, "{ctx}: adaptive {a} < LRU {lru}");
            assert!(
                a >= fixed_rates[0] - 0.005,
                "{ctx}: adaptive {a} < SLRU 0.2 {}",
                fixed_rates[0]
            );
            // Close to the best fixed fraction: within 3 points on ReAct and WebShop. Swarm wants
            // a large protected segment (0.8) that the policy is still growing toward when the
            // short trace ends, so there the margin is 8 points and adapting must visibly pay:
            // at least 1.5 points over its 0.2 start, with the segment grown past 0.2.
            let margin = if kind == TraceKind::Swarm { 0.08 } else { 0.03 };
            assert!(a >= best - margin, "{ctx}: adaptive {a}, best fixed {best}");
            if kind == TraceKind::Swarm {
                assert!(a >= fixed_rates[0] + 0.015, "{ctx}: adaptation did not pay");
                assert!(
                    adaptive.protected_capacity_blocks > capacity_blocks / 5,
                    "{ctx}"
                );
            }
        }
    }
}
