//! Benchmark (not a test): cold-tier bytes per token and restore time per KV codec, on the default
//! model and a prefix of `crates/model/tests/data/corpus.txt`. For each codec (the active pool's,
//! stored in the tier as it is) and each RAM-tier compression: prefill prompt P, push it out of
//! the active pool with another prompt (P is demoted), then time the re-request of P to its first
//! token (tier load + one computed token). Prints stored bytes per token (object headers
//! included) and the ratio to f16.
//!
//! `cargo run --release -p engine --example tier_codecs [-- <prompt_tokens> <threads>]`

use std::sync::Arc;
use std::time::{Duration, Instant};

use engine::{EngineConfig, EngineCore, EngineEvent, RequestId, RequestSpec, TierLoadPolicy};
use tier::{Compression, RamConfig, RamStore, TierStore};
use tokio::sync::mpsc;

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

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let num_tokens: usize = args.get(1).and_then(|s| s.parse().ok()).unwrap_or(1025);
    let threads: usize = args.get(2).and_then(|s| s.parse().ok()).unwrap_or(2);
    let model = Arc::new(model::Model::load(&model::default_model_path()).expect("model"));
    let text = std::fs::read_to_string("crates/model/tests/data/corpus.txt").expect("corpus");
    let tokens = model
        .tokenizer()
        .encode(&text, false, true)
        .expect("tokens");
    let (p, q) = (
        tokens[..num_tokens].to_vec(),
        tokens[num_tokens..2 * num_tokens].to_vec(),
    );
    println!("prompt {num_tokens} tokens of corpus.txt, {threads} threads, RAM tier");
    let mut f16_bytes = 0.0;
    for codec in [
        "f16",
        "int8",
        "k=int8,v=int4",
        "k=int4h,v=int4",
        "k=int4c,v=int4",
    ] {
        for compression in [
            Compression::None,
            Compression::Lz4,
            Compression::Lz4Shuffle16,
        ] {
            let store = Arc::new(RamStore::new(RamConfig {
                max_bytes: 1 << 30,
                compression,
            }));
            let cfg = EngineConfig {
                num_blocks: num_tokens.div_ceil(16) + 8,
                threads,
                kv_dtype: model::KvDtype::parse(codec).expect("codec"),
                tiers: engine::TieringConfig {
                    load_policy: TierLoadPolicy::Always,
                    ..Default::default()
                },
                ..Default::default()
            };
            let mut core = EngineCore::with_tier_stores(
                model.clone(),
                cfg,
                vec![store.clone() as Arc<dyn TierStore>],
            )
            .expect("engine");
            ttft(&mut core, 1, &p);
            ttft(&mut core, 2, &q); // evicts P into the tier
            core.wait_for_demotions();
            let (t, cached) = ttft(&mut core, 3, &p);
            let s = &core.snapshot().tiers.tiers[0].stats;
            let per_token = s.bytes_written as f64 / (s.puts.max(1) * 16) as f64;
            if codec == "f16" && compression == Compression::None {
                f16_bytes = per_token;
            }
            println!(
                "{codec:<16} {compression:<14?} stored {per_token:>8.0} B/token ({:.3}× f16 raw)  restore {:>7.1} ms  cached {cached:>5}  get_many {:>6.1} ms",
                per_token / f16_bytes,
                t.as_secs_f64() * 1e3,
                s.load_sum_us as f64 / s.load_count.max(1) as f64 / 1e3,
            );
        }
    }
}
