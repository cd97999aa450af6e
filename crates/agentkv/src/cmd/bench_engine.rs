//! `agentkv bench-engine`: throughput of the engine (paged KV, continuous batching) — decode
//! tok/s at several concurrencies, prefill tok/s, and time to first token with a cached 1K-token
//! prefix vs without. Reports JSON on stdout and a table on stderr.

use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Result;
use engine::{EngineConfig, EngineCore, EngineEvent, RequestId, RequestSpec};
use model::Model;
use tokio::sync::mpsc::unbounded_channel;

use super::common::ModelArgs;

#[derive(clap::Args, Debug)]
pub struct BenchEngineArgs {
    #[command(flatten)]
    pub model: ModelArgs,
    /// Concurrent sequences for the decode measurement.
    #[arg(long, value_delimiter = ',', default_value = "1,4,16,64")]
    pub concurrency: Vec<usize>,
    /// Tokens generated per sequence.
    #[arg(long, default_value_t = 64)]
    pub gen_tokens: usize,
    /// Prefix length for the time-to-first-token comparison.
    #[arg(long, default_value_t = 1024)]
    pub prefix_tokens: usize,
    #[command(flatten)]
    pub kv: super::common::KvArgs,
}

fn tokens(seed: u64, n: usize, vocab: usize) -> Vec<u32> {
    // Deterministic pseudo-random ids (avoiding the first 100 special/control ids).
    let mut x = seed
        .wrapping_mul(6364136223846793005)
        .wrapping_add(1442695040888963407);
    (0..n)
        .map(|_| {
            x = x
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            (100 + (x >> 33) as usize % (vocab - 100)) as u32
        })
        .collect()
}

fn new_core(
    model: &Arc<Model>,
    args: &BenchEngineArgs,
    prefix_caching: bool,
) -> Result<EngineCore> {
    let threads = args
        .model
        .threads
        .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()));
    let cfg = EngineConfig {
        num_blocks: 4096,
        max_seqs: 128,
        kv_dtype: args.kv.codecs()?,
        prefix_caching,
        threads,
        ..Default::default()
    };
    Ok(EngineCore::new(model.clone(), cfg)?)
}

/// Runs `prompts` concurrently; returns (decode tokens/s over decode-only steps, wall time).
fn run_batch(core: &mut EngineCore, prompts: Vec<Vec<u32>>, gen: usize) -> Result<(f64, Duration)> {
    let mut rxs = Vec::new();
    for (i, p) in prompts.into_iter().enumerate() {
        let (tx, rx) = unbounded_channel();
        let mut spec = RequestSpec::greedy(p, gen);
        spec.ignore_eos = true;
        core.submit(RequestId(i as u64 + 1_000_000), spec, tx)?;
        rxs.push(rx);
    }
    let start = Instant::now();
    let (mut decode_time, mut decode_tokens) = (Duration::ZERO, 0u64);
    while core.has_work() {
        let before = core.stats().clone();
        let t0 = Instant::now();
        core.step()?;
        let after = core.stats();
        if after.prefill_tokens == before.prefill_tokens {
            decode_time += t0.elapsed();
            decode_tokens += after.decode_tokens - before.decode_tokens;
        }
    }
    for mut rx in rxs {
        while let Ok(ev) = rx.try_recv() {
            if let EngineEvent::Error(e) = ev {
                anyhow::bail!("request failed: {e}");
            }
        }
    }
    Ok((
        decode_tokens as f64 / decode_time.as_secs_f64().max(1e-9),
        start.elapsed(),
    ))
}

/// Time to first token of one request.
fn ttft(core: &mut EngineCore, prompt: Vec<u32>) -> Result<Duration> {
    let (tx, mut rx) = unbounded_channel();
    core.submit(RequestId(7), RequestSpec::greedy(prompt, 1), tx)?;
    let start = Instant::now();
    while core.has_work() {
        core.step()?;
        while let Ok(ev) = rx.try_recv() {
            if let EngineEvent::Token(_) = ev {
                let t = start.elapsed();
                while core.has_work() {
                    core.step()?;
                }
                return Ok(t);
            }
        }
    }
    anyhow::bail!("no token produced")
}

pub fn run(args: BenchEngineArgs) -> Result<()> {
    let model = Arc::new(args.model.load()?);
    let vocab = model.config.vocab_size;
    let mut decode = serde_json::Map::new();
    for &c in &args.concurrency {
        let mut core = new_core(&model, &args, false)?;
        let prompts = (0..c).map(|i| tokens(i as u64, 32, vocab)).collect();
        let (tps, wall) = run_batch(&mut core, prompts, args.gen_tokens)?;
        eprintln!(
            "decode, {c:>3} sequences: {tps:>7.1} tok/s total ({:.1}s wall)",
            wall.as_secs_f64()
        );
        decode.insert(c.to_string(), serde_json::json!(tps));
    }
    let mut core = new_core(&model, &args, false)?;
    let t = Instant::now();
    run_batch(&mut core, vec![tokens(99, 512, vocab)], 1)?;
    let prefill = 512.0 / t.elapsed().as_secs_f64();
    eprintln!("prefill 512 tokens: {prefill:.1} tok/s");

    let prefix = tokens(1234, args.prefix_tokens, vocab);
    let with_suffix = |seed| {
        let mut p = prefix.clone();
        p.extend(tokens(seed, 32, vocab));
        p
    };
    let mut cold = new_core(&model, &args, false)?;
    let ttft_uncached = ttft(&mut cold, with_suffix(1))?;
    let mut warm = new_core(&model, &args, true)?;
    ttft(&mut warm, with_suffix(2))?; // fills the cache with the prefix
    let ttft_cached = ttft(&mut warm, with_suffix(3))?;
    eprintln!(
        "TTFT with a {}-token prefix: cached {:.1} ms vs uncached {:.1} ms ({:.1}x)",
        args.prefix_tokens,
        ttft_cached.as_secs_f64() * 1e3,
        ttft_uncached.as_secs_f64() * 1e3,
        ttft_uncached.as_secs_f64() / ttft_cached.as_secs_f64()
    );
    println!(
        "{}",
        serde_json::json!({
            "decode_tok_s_by_concurrency": decode,
            "prefill_tok_s": prefill,
            "ttft_ms_cached": ttft_cached.as_secs_f64() * 1e3,
            "ttft_ms_uncached": ttft_uncached.as_secs_f64() * 1e3,
            "prefix_tokens": args.prefix_tokens,
        })
    );
    Ok(())
}
