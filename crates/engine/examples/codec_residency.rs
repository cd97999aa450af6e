//! Benchmark (not a test): how many more agent sessions stay resident when the active pool holds
//! K/V in int8 or 4-bit instead of f16, at the same memory. Generated agent traces (ReAct,
//! WebShop, swarm; `cache::sim`, the simulator behind `agentkv cache-sim`) replayed through the
//! cache with an LRU pool of fixed bytes: the block capacity is those bytes over the codec's
//! bytes per block on the default model (`quant`'s exact row sizes, 16-token blocks). Reports,
//! per codec: blocks, the sessions' mean working set that fits (resident sessions) and the
//! prefix-cache hit rate.
//!
//! `cargo run --release -p engine --example codec_residency [-- agents tasks seed fraction]`
//! (`fraction`: the pool's bytes as a share of the live sessions' f16 working set, default 0.25).

use std::collections::HashMap;

use cache::sim::{generate, simulate, SimConfig, TraceCall, TraceKind, TraceParams};
use cache::EvictionPolicy;
use model::KvDtype;

const BLOCK_SIZE: u32 = 16;
/// The default model (SmolLM2-135M): 30 layers, 3 KV heads of 64.
const GEOMETRY: (usize, usize, usize) = (30, 3, 64);

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
    let args: Vec<String> = std::env::args().skip(1).collect();
    let num = |i: usize, d: f64| args.get(i).and_then(|s| s.parse().ok()).unwrap_or(d);
    let (agents, tasks, seed) = (num(0, 12.0) as u32, num(1, 4.0) as u32, num(2, 1.0) as u64);
    let fraction = num(3, 0.25);
    let (l, h, d) = GEOMETRY;
    let block_bytes = |c: KvDtype| c.bytes_per_token(l, h, d) * BLOCK_SIZE as usize;
    println!(
        "agents={agents} tasks={tasks} seed={seed} pool = {fraction} × live f16 working set\n"
    );
    println!("| trace | pool codec | bytes/token | blocks | resident sessions | hit rate |");
    println!("|---|---|---|---|---|---|");
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
        let pool_bytes = mean * f64::from(agents) * fraction * block_bytes(KvDtype::F16) as f64;
        for name in ["f16", "int8", "k=int8,v=int4", "k=int4c,v=int4"] {
            let codec = KvDtype::parse(name).expect("codec");
            let capacity = ((pool_bytes / block_bytes(codec) as f64) as u32).max(longest + 1);
            let r = simulate(
                &trace,
                SimConfig {
                    block_size: BLOCK_SIZE,
                    capacity_blocks: capacity,
                    policy: EvictionPolicy::Lru,
                    session_retention: None,
                    inferred: None,
                },
            )
            .expect("capacity holds the longest prompt");
            println!(
                "| {label} ({} calls) | {name} | {} | {capacity} | {:.1} | {:.1}% |",
                trace.len(),
                codec.bytes_per_token(l, h, d),
                f64::from(capacity) / mean,
                r.hit_rate * 100.0
            );
        }
    }
}
