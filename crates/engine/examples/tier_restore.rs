//! Benchmark (not a test): time to restore a 4K-token prefix from each storage tier versus
//! recomputing it, on the default model. For each tier: prefill prompt P, push it out of the
//! active pool with another 4K prompt (P is demoted), then time the re-request of P to its first
//! token (tier load of 256 blocks + one computed token). The baseline is the same request with
//! caching off.
//!
//! `cargo run --release -p engine --example tier_restore [-- <prompt_tokens> <threads>]`
//! (Redis is measured when `redis-server` is installed; a throw-away server is started.)

use std::sync::Arc;
use std::time::{Duration, Instant};

use engine::{EngineConfig, EngineCore, EngineEvent, RequestId, RequestSpec, TierLoadPolicy};
use tier::testing::RedisServer;
use tier::{Compression, DiskConfig, DiskStore, RamConfig, RamStore, RedisConfig, RedisStore};
use tier::{TierStats, TierStore};
use tokio::sync::mpsc;

fn prompt(seed: u32, n: usize) -> Vec<u32> {
    (0..n as u32)
        .map(|j| 1000 + (seed * 7919 + j * 131 + j * j * 7) % 40_000)
        .collect()
}

/// Time to first token of one request, and its cached tokens.
fn ttft(core: &mut EngineCore, id: u64, p: &[u32]) -> (Duration, usize) {
    let (tx, mut rx) = mpsc::unbounded_channel();
    let start = Instant::now();
    core.submit(RequestId(id), RequestSpec::greedy(p.to_vec(), 1), tx)
        .expect("submit");
    let mut first = None;
    let mut cached = 0;
    while core.has_work() {
        core.step().expect("step");
        while let Ok(ev) = rx.try_recv() {
            match ev {
                EngineEvent::Token(_) if first.is_none() => first = Some(start.elapsed()),
                EngineEvent::Finished { usage, .. } => cached = usage.cached_tokens,
                _ => {}
            }
        }
    }
    (first.expect("one token"), cached)
}

fn cfg(num_tokens: usize, threads: usize) -> EngineConfig {
    EngineConfig {
        num_blocks: num_tokens.div_ceil(16) + 8,
        threads,
        tiers: engine::TieringConfig {
            load_policy: TierLoadPolicy::Always,
            ..Default::default()
        },
        ..Default::default()
    }
}

fn run_tier(
    name: &str,
    store: Arc<dyn TierStore>,
    num_tokens: usize,
    threads: usize,
    model: &Arc<model::Model>,
) {
    let mut core =
        EngineCore::with_tier_stores(model.clone(), cfg(num_tokens, threads), vec![store])
            .expect("engine");
    let p = prompt(1, num_tokens);
    ttft(&mut core, 1, &p);
    ttft(&mut core, 2, &prompt(2, num_tokens)); // evicts P into the tier
    let (t, cached) = ttft(&mut core, 3, &p);
    let s: &TierStats = &core.snapshot().tiers.tiers[0].stats;
    println!(
        "{name:<14} restore {:>8.1} ms  cached_tokens {cached:>5}  tier bytes_read {:>6.1} MB  mean get_many {:>7.1} ms",
        t.as_secs_f64() * 1e3,
        s.bytes_read as f64 / 1e6,
        s.load_sum_us as f64 / s.load_count.max(1) as f64 / 1e3,
    );
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let num_tokens: usize = args.get(1).and_then(|s| s.parse().ok()).unwrap_or(4097);
    let threads: usize = args
        .get(2)
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()));
    let model = Arc::new(model::Model::load(&model::default_model_path()).expect("model"));
    println!(
        "prompt {num_tokens} tokens ({} cacheable), {threads} threads, f16 KV",
        (num_tokens - 1) / 16 * 16
    );
    let mut off = EngineCore::new(
        model.clone(),
        EngineConfig {
            prefix_caching: false,
            ..cfg(num_tokens, threads)
        },
    )
    .expect("engine");
    let (t, _) = ttft(&mut off, 1, &prompt(1, num_tokens));
    println!(
        "{:<14} restore {:>8.1} ms",
        "recompute",
        t.as_secs_f64() * 1e3
    );

    let ram = RamStore::new(RamConfig {
        max_bytes: 1 << 30,
        compression: Compression::None,
    });
    run_tier("ram", Arc::new(ram), num_tokens, threads, &model);
    for fsync in [false, true] {
        let dir = tempfile::tempdir().expect("tempdir");
        let mut c = DiskConfig::new(dir.path(), 1 << 30);
        c.fsync = fsync;
        let store = DiskStore::open(c).expect("disk");
        let name = if fsync { "disk (fsync)" } else { "disk" };
        run_tier(name, Arc::new(store), num_tokens, threads, &model);
    }
    match RedisServer::start() {
        Ok(server) => {
            let store = RedisStore::open(RedisConfig::single(server.url())).expect("redis");
            run_tier("redis (lo)", Arc::new(store), num_tokens, threads, &model);
        }
        Err(e) => println!("redis          skipped: {e}"),
    }
}
