//! `agentkv bench-engine`: throughput of the engine (paged KV, continuous batching) — decode
//! tok/s at several concurrencies, prefill tok/s, and time to first token with a cached 1K-token
//! prefix vs without. Reports JSON on stdout and a table on stderr.
//!
//! `--depth D` runs the agent-shaped mix instead: `--decoders C` sequences decode at depth D
//! while prefills of `--arrival-tokens P` new tokens on top of a cached D-token prefix keep
//! arriving (one in flight at a time, the next submitted when the previous produced its
//! token), once per `--step-target-ms` value (0 = no step-time target); it reports decoder
//! inter-token latency p50/p99, arrival prefill tok/s and arrival time to first token.

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
    /// Agent mix: depth of the decoders and of the arrivals' cached prefix (0 = classic mode).
    #[arg(long, default_value_t = 0)]
    pub depth: usize,
    /// Agent mix: sequences decoding at depth.
    #[arg(long, default_value_t = 4)]
    pub decoders: usize,
    /// Agent mix: new prompt tokens per arriving request (0 = no arrivals: decoders alone).
    #[arg(long, default_value_t = 256)]
    pub arrival_tokens: usize,
    /// Agent mix: step-time targets to compare, in ms (0 = none).
    #[arg(long, value_delimiter = ',', default_value = "0,100")]
    pub step_target_ms: Vec<u64>,
    /// Prompt rows of prompts of 64+ tokens in llama.cpp's tiled prefill arithmetic
    /// (`EngineConfig::llama_cpp_prefill`; off by default, as in `serve`).
    #[arg(long)]
    pub llama_cpp_prefill: bool,
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
        llama_cpp_prefill: args.llama_cpp_prefill,
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

/// Percentile `q` (0..=1) of `v` (sorted in place); 0 when empty.
fn percentile(v: &mut [f64], q: f64) -> f64 {
    if v.is_empty() {
        return 0.0;
    }
    v.sort_by(f64::total_cmp);
    v[((v.len() - 1) as f64 * q).round() as usize]
}

/// The agent-shaped mix (module doc) under one step-time target.
fn run_agent_mix(
    model: &Arc<Model>,
    args: &BenchEngineArgs,
    target_ms: u64,
) -> Result<serde_json::Value> {
    let vocab = model.config().vocab_size;
    let (depth, p, gen) = (args.depth, args.arrival_tokens, args.gen_tokens);
    let threads = args
        .model
        .threads
        .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()));
    let per_seq_blocks = (depth + p.max(16) + gen).div_ceil(16) + 1;
    let cfg = EngineConfig {
        num_blocks: per_seq_blocks * (args.decoders + 4),
        max_seqs: 128,
        kv_dtype: args.kv.codecs()?,
        prefix_caching: true,
        threads,
        step_time_target: (target_ms > 0).then(|| Duration::from_millis(target_ms)),
        llama_cpp_prefill: args.llama_cpp_prefill,
        ..Default::default()
    };
    let mut core = EngineCore::new(model.clone(), cfg)?;
    let prefix = tokens(4242, depth, vocab);
    let with = |seed: u64, n: usize| {
        let mut v = prefix.clone();
        v.extend(tokens(seed, n, vocab));
        v
    };
    // The shared prefix, computed once (cached from here on).
    let (tx, _rx0) = unbounded_channel();
    core.submit(RequestId(1), RequestSpec::greedy(with(1, 1), 1), tx)?;
    while core.has_work() {
        core.step()?;
    }
    // Decoders: each prefills a short suffix, then decodes `gen` tokens at depth.
    let mut decoders = Vec::new();
    for d in 0..args.decoders {
        let (tx, rx) = unbounded_channel();
        let mut spec = RequestSpec::greedy(with(100 + d as u64, 16), gen);
        spec.ignore_eos = true;
        core.submit(RequestId(100 + d as u64), spec, tx)?;
        decoders.push(rx);
    }
    // Until every decoder has its first token.
    let mut last: Vec<Option<Instant>> = vec![None; args.decoders];
    while last.iter().any(|l| l.is_none()) {
        core.step()?;
        let now = Instant::now();
        for (d, rx) in decoders.iter_mut().enumerate() {
            while let Ok(ev) = rx.try_recv() {
                if let EngineEvent::Token(_) = ev {
                    last[d] = Some(now);
                }
            }
        }
    }
    let mut itl = Vec::new();
    let mut ttft = Vec::new();
    let mut next_arrival = 1000u64;
    let submit_arrival = |core: &mut EngineCore, id: u64| -> Result<_> {
        let (tx, rx) = unbounded_channel();
        core.submit(RequestId(id), RequestSpec::greedy(with(id, p), 1), tx)?;
        Ok((rx, Instant::now()))
    };
    // `--arrival-tokens 0`: decoders alone (decode throughput at depth).
    let mut arrival = if p > 0 {
        Some(submit_arrival(&mut core, next_arrival)?)
    } else {
        None
    };
    let started = Instant::now();
    let prefill_before = core.stats().prefill_tokens;
    let mut live = args.decoders;
    while live > 0 {
        core.step()?;
        let now = Instant::now();
        for (d, rx) in decoders.iter_mut().enumerate() {
            while let Ok(ev) = rx.try_recv() {
                match ev {
                    EngineEvent::Token(_) => {
                        if let Some(t) = last[d] {
                            itl.push((now - t).as_secs_f64() * 1e3);
                        }
                        last[d] = Some(now);
                    }
                    EngineEvent::Finished { .. } => live -= 1,
                    EngineEvent::Error(e) => anyhow::bail!("decoder failed: {e}"),
                    _ => {}
                }
            }
        }
        let Some((rx, sent)) = arrival.as_mut() else {
            continue;
        };
        let mut got = false;
        while let Ok(ev) = rx.try_recv() {
            match ev {
                EngineEvent::Token(_) => got = true,
                EngineEvent::Error(e) => anyhow::bail!("arrival failed: {e}"),
                _ => {}
            }
        }
        if got {
            ttft.push((now - *sent).as_secs_f64() * 1e3);
            next_arrival += 1;
            arrival = Some(submit_arrival(&mut core, next_arrival)?);
        }
    }
    let wall = started.elapsed().as_secs_f64();
    let prefill_tokens = core.stats().prefill_tokens - prefill_before;
    let (p50, p99) = (percentile(&mut itl, 0.5), percentile(&mut itl, 0.99));
    let ttft50 = percentile(&mut ttft, 0.5);
    let prefill_tps = prefill_tokens as f64 / wall;
    let decode_tps = itl.len() as f64 / wall;
    eprintln!(
        "depth {depth}, {} decoders, {p}-token arrivals, step target {}: ITL p50 {p50:.1} ms p99 {p99:.1} ms; \
         decode {decode_tps:.1} tok/s total; prefill {prefill_tps:.1} tok/s; arrival TTFT p50 \
         {ttft50:.0} ms ({} arrivals, {wall:.1}s)",
        args.decoders,
        if target_ms == 0 { "none".to_string() } else { format!("{target_ms} ms") },
        ttft.len(),
    );
    Ok(serde_json::json!({
        "depth": depth, "decoders": args.decoders, "arrival_tokens": p, "gen_tokens": gen,
        "step_target_ms": target_ms, "itl_ms_p50": p50, "itl_ms_p99": p99,
        "prefill_tok_s": prefill_tps, "decode_tok_s": decode_tps, "arrival_ttft_ms_p50": ttft50, "arrivals": ttft.len(),
        "wall_s": wall,
    }))
}

pub fn run(args: BenchEngineArgs) -> Result<()> {
    let model = Arc::new(args.model.load()?);
    if args.depth > 0 {
        let mut runs = Vec::new();
        for &t in &args.step_target_ms {
            runs.push(run_agent_mix(&model, &args, t)?);
        }
        println!("{}", serde_json::json!({ "agent_mix": runs }));
        return Ok(());
    }
    let vocab = model.config().vocab_size;
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
