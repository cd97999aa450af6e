//! `agentkv bench-model`: prefill and decode speed of the model runtime, as llama-bench measures
//! them (prefill of a P-token prompt; decode of N tokens at batch 1), median of several runs.
//!
//! `--depth D` measures what an agent call does (llama-bench's `-d`): D tokens are already in the
//! KV cache (filled untimed), then P new tokens are prefilled on top of them and, separately, N
//! tokens are decoded starting at position D. `--membw` adds the memory-bandwidth bound of that
//! decode (`model::membw`): the machine's read bandwidth with the same threads, the bytes a
//! decoded token reads, and their quotient next to the measured rate; then the same read of a
//! buffer the size of that token's traffic (the decode's working set, which a large last-level
//! cache may hold: the binding bound on such a CPU). `--roofline` adds the compute bound of
//! both steps (`bench_roofline`). Every step takes the
//! engine's arithmetic (`engine::EngineConfig::numerics`, or `--attention`);
//! it never runs the engine or the server.

use std::time::Instant;

use anyhow::Result;
use model::{AttnArith, ForwardBatch, Scratch};
use model::{Numerics, RowKind, SeqSlot};

use super::common::ModelArgs;

#[derive(clap::Args, Debug)]
pub struct BenchModelArgs {
    #[command(flatten)]
    pub model: ModelArgs,
    /// Prompt tokens for the prefill measurement.
    #[arg(long, default_value_t = 512)]
    pub prompt_tokens: usize,
    /// Generated tokens for the decode measurement.
    #[arg(long, default_value_t = 128)]
    pub gen_tokens: usize,
    /// Tokens already in the KV cache before each measurement (an agent call's cached prefix).
    #[arg(long, default_value_t = 0)]
    pub depth: usize,
    /// Repetitions (the median is reported).
    #[arg(long, default_value_t = 3)]
    pub reps: usize,
    /// Also measure the memory read bandwidth with the same threads (a streaming read of a
    /// `--membw-mib` buffer) and report the bytes one decoded token reads and the resulting
    /// bound on decode speed next to the measured one; and the same read of a buffer the size of
    /// that token's traffic, repeated as a decode repeats it (on a CPU whose cache holds the
    /// weights, that working set is read from cache, not memory: the binding bound there); and
    /// what an empty call of the thread pool costs (the threads' hand-off, paid about five times
    /// a layer by a decoded token).
    #[arg(long)]
    pub membw: bool,
    /// Also measure the vector units' peak rates (f32 FMA, 8-bit dot products) with the same
    /// threads and report the compute bound of the prefill and decode steps next to the measured
    /// rates (`bench_roofline`).
    #[arg(long)]
    pub roofline: bool,
    /// Buffer size of the bandwidth measurement, MiB (choose it far larger than the L3 cache).
    #[arg(long, default_value_t = 512)]
    pub membw_mib: usize,
    #[command(flatten)]
    pub kv: super::common::KvArgs,
    /// Compute prompt rows (the cached prefix and the timed prefill, when at least 64 tokens)
    /// in llama.cpp's tiled prefill arithmetic, as the engine does with
    /// `EngineConfig::llama_cpp_prefill` (`RowKind::LongPrompt`), and every other step in
    /// llama.cpp's per-row attention and ggml's matmul order, as that engine does.
    #[arg(long)]
    pub llama_cpp_prefill: bool,
    /// Attention arithmetic of the unmarked steps: `tiled` (the tiled regime at every depth) or
    /// `llama.cpp-row` (llama.cpp's per-row kernel with its f16 accumulator, and beyond 256
    /// positions its split-KV decode for this many threads). Default: the engine's
    /// (`EngineConfig::numerics`: `tiled`, or `llama.cpp-row` with `--llama-cpp-prefill`).
    #[arg(long, value_parser = ["tiled", "llama.cpp-row"])]
    pub attention: Option<String>,
    /// A second KV codec measured side by side in the same process: each repetition runs both
    /// codecs, each on a cache of its own (filled afresh), in alternating order (A B, B A, …),
    /// and the report adds its runs and the per-repetition ratios to the first codec's. Slow
    /// drift of the machine falls on both alike, so the ratios are steadier than those of two
    /// separate runs.
    #[arg(long, value_parser = super::common::parse_kv_dtype)]
    pub versus_kv_dtype: Option<model::KvDtype>,
}

/// One codec's prefill and decode rates, one entry per repetition.
#[derive(Default)]
struct Runs {
    pp: Vec<f64>,
    tg: Vec<f64>,
}

/// The median (the mean of the two middle values of an even count; 0 for none).
fn median(v: &[f64]) -> f64 {
    let mut v = v.to_vec();
    v.sort_by(f64::total_cmp);
    let n = v.len();
    if n == 0 {
        0.0
    } else if n.is_multiple_of(2) {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    } else {
        v[n / 2]
    }
}

/// `b[i] / a[i]` for every repetition.
fn ratios(a: &[f64], b: &[f64]) -> Vec<f64> {
    a.iter().zip(b).map(|(a, b)| b / a).collect()
}

pub fn run(args: BenchModelArgs) -> Result<()> {
    let model = args.model.load()?;
    let pool = args.model.pool();
    // The engine's numerics for this pool (what `serve` runs), or its matmul order with the
    // attention `--attention` names.
    let engine_numerics = Numerics::for_engine(args.llama_cpp_prefill, pool.num_threads());
    let numerics = match args.attention.as_deref() {
        None => engine_numerics,
        Some(name) => Numerics::Explicit {
            attention: if name == "tiled" {
                AttnArith::Tiled
            } else {
                AttnArith::Row
            },
            matmul: engine_numerics.matmul(),
        },
    };
    let vocab = model.config().vocab_size as u32;
    let depth = args.depth;
    // Deterministic pseudo-random tokens, as llama-bench uses random tokens.
    let token_at = |i: usize| ((i as u64 * 2_654_435_761) % vocab as u64) as u32;
    let capacity = depth + args.prompt_tokens.max(args.gen_tokens) + 1;
    let mut scratch = Scratch::default();
    // One forward pass over positions `start..start + len` of slot 0.
    let run = |kv: &mut model::ContiguousKv,
               scratch: &mut Scratch,
               start: usize,
               len: usize|
     -> Result<Vec<f32>> {
        let tokens: Vec<u32> = (start..start + len).map(token_at).collect();
        let positions: Vec<u32> = (start as u32..(start + len) as u32).collect();
        let slots = vec![SeqSlot(0); len];
        // Prompt rows of 64+ token steps are llama.cpp's tiled prefill rows when reproducing
        // it; otherwise each row is what llama.cpp's step would make it.
        let rows = if args.llama_cpp_prefill && len >= model::PREFILL_MIN_TOKENS {
            vec![RowKind::LongPrompt; len]
        } else {
            RowKind::by_step(&slots)
        };
        let batch = ForwardBatch {
            tokens: &tokens,
            positions: &positions,
            slots: &slots,
            logits_for: &[len - 1],
            numerics,
            rows: &rows,
        };
        Ok(model.forward(&pool, &batch, kv, scratch)?)
    };
    // One repetition of one codec: a fresh cache, the cached prefix, then the timed prefill
    // and decode.
    let mut measure = |codecs: model::KvDtype, runs: &mut Runs| -> Result<()> {
        let mut kv = model.contiguous_kv(1, capacity, codecs)?;
        // The cached prefix, untimed, in 512-token chunks (bounded activation memory).
        let mut filled = 0;
        while filled < depth {
            let len = (depth - filled).min(512);
            run(&mut kv, &mut scratch, filled, len)?;
            filled += len;
        }
        if args.prompt_tokens > 0 {
            let t0 = Instant::now();
            run(&mut kv, &mut scratch, depth, args.prompt_tokens)?;
            runs.pp
                .push(args.prompt_tokens as f64 / t0.elapsed().as_secs_f64());
        }
        // Decode from position `depth` (overwriting the prefill above: attention at position p
        // reads positions 0..=p only).
        let t0 = Instant::now();
        let mut tok = 1u32;
        for pos in depth..depth + args.gen_tokens {
            let batch = ForwardBatch {
                tokens: &[tok],
                positions: &[pos as u32],
                slots: &[SeqSlot(0)],
                logits_for: &[0],
                numerics,
                rows: &[RowKind::Generated],
            };
            let logits = model.forward(&pool, &batch, &mut kv, &mut scratch)?;
            tok = model::sampler::argmax(&logits);
        }
        runs.tg
            .push(args.gen_tokens as f64 / t0.elapsed().as_secs_f64());
        Ok(())
    };
    let codecs = args.kv.codecs()?;
    let (mut first, mut second) = (Runs::default(), Runs::default());
    for rep in 0..args.reps.max(1) {
        match args.versus_kv_dtype {
            None => measure(codecs, &mut first)?,
            Some(other) if rep.is_multiple_of(2) => {
                measure(codecs, &mut first)?;
                measure(other, &mut second)?;
            }
            Some(other) => {
                measure(other, &mut second)?;
                measure(codecs, &mut first)?;
            }
        }
    }
    let bound = if args.membw {
        Some(membw_bound(&model, &pool, &args)?)
    } else {
        None
    };
    let pp_med = median(&first.pp);
    let tg_med = median(&first.tg);
    let mut out = serde_json::json!({
        "threads": pool.num_threads(), "depth": depth, "prompt_tokens": args.prompt_tokens, "gen_tokens": args.gen_tokens,
        "prefill_tok_s": pp_med, "decode_tok_s": tg_med, "prefill_runs": first.pp, "decode_runs": first.tg,
    });
    if let Some(other) = args.versus_kv_dtype {
        let (pp_ratios, tg_ratios) = (ratios(&first.pp, &second.pp), ratios(&first.tg, &second.tg));
        let pp_ratio = median(&pp_ratios);
        let tg_ratio = median(&tg_ratios);
        out["versus"] = serde_json::json!({
            "kv_dtype": other.to_string(),
            "prefill_tok_s": median(&second.pp),
            "decode_tok_s": median(&second.tg),
            "prefill_runs": second.pp, "decode_runs": second.tg,
            "prefill_ratios": pp_ratios, "decode_ratios": tg_ratios,
            "prefill_ratio_median": pp_ratio, "decode_ratio_median": tg_ratio,
        });
        eprintln!(
            "{other} vs {codecs}, side by side ({} repetitions each): prefill {pp_ratio:.3}x, decode {tg_ratio:.3}x (medians of the per-repetition ratios)",
            second.tg.len()
        );
    }
    if let Some(b) = &bound {
        report_membw(b, tg_med, &mut out);
    }
    if args.roofline {
        if let Some(r) = super::bench_roofline::roofline(
            &model,
            &pool,
            codecs,
            (args.prompt_tokens, args.gen_tokens, depth),
            (pp_med, tg_med),
        ) {
            out["roofline"] = r;
        }
    }
    println!("{out}");
    eprintln!(
        "depth {depth}: prefill {} tokens: {pp_med:.1} tok/s; decode {} tokens: {tg_med:.1} tok/s ({} threads)",
        args.prompt_tokens,
        args.gen_tokens,
        pool.num_threads()
    );
    Ok(())
}

/// Adds `--membw`'s figures to the JSON report `out` and prints them: the bounds on decode
/// speed from memory and working-set bandwidth beside the measured `tg_med`.
fn report_membw(b: &MembwBound, tg_med: f64, out: &mut serde_json::Value) {
    let (mem, ws) = (&b.memory, &b.working_set);
    let bound_tok_s = mem.best() / b.bytes_per_token as f64;
    let ws_bound_tok_s = ws.best() / b.bytes_per_token as f64;
    out["membw"] = serde_json::json!({
        "buffer_bytes": mem.buffer_bytes,
        "read_gb_s_best": mem.best() / 1e9,
        "read_gb_s_median": mem.median() / 1e9,
        "read_gb_s_passes": mem.passes.iter().map(|p| p / 1e9).collect::<Vec<_>>(),
        "weight_bytes": b.weight_bytes,
        "kv_bytes_per_position": b.kv_bytes_per_position,
        "bytes_per_decoded_token": b.bytes_per_token,
        "decode_bound_tok_s": bound_tok_s,
        "decode_share_of_bound": tg_med / bound_tok_s,
        "decode_read_gb_s": tg_med * b.bytes_per_token as f64 / 1e9,
        "working_set_buffer_bytes": ws.buffer_bytes,
        "working_set_read_gb_s_best": ws.best() / 1e9,
        "working_set_read_gb_s_median": ws.median() / 1e9,
        "decode_working_set_bound_tok_s": ws_bound_tok_s,
        "decode_share_of_working_set_bound": tg_med / ws_bound_tok_s,
        "pool_call_ns_rounds": b.pool_call_ns,
        "pool_call_ns_median": median(&b.pool_call_ns),
    });
    eprintln!(
        "memory read {:.1} GB/s (best of {} passes over {} MiB, median {:.1}); a decoded token at mean depth {} reads {:.1} MB ({:.1} MB weights + {:.1} MB K/V): bound {:.1} tok/s, measured {:.1} tok/s = {:.0}% of it",
        mem.best() / 1e9,
        mem.passes.len(),
        mem.buffer_bytes >> 20,
        mem.median() / 1e9,
        b.mean_depth,
        b.bytes_per_token as f64 / 1e6,
        b.weight_bytes as f64 / 1e6,
        (b.bytes_per_token - b.weight_bytes) as f64 / 1e6,
        bound_tok_s,
        tg_med,
        100.0 * tg_med / bound_tok_s,
    );
    eprintln!(
        "working-set read {:.1} GB/s (best of {} passes over {} MiB, the token's traffic, median {:.1}): bound {:.1} tok/s, measured = {:.0}% of it",
        ws.best() / 1e9,
        ws.passes.len(),
        ws.buffer_bytes >> 20,
        ws.median() / 1e9,
        ws_bound_tok_s,
        100.0 * tg_med / ws_bound_tok_s,
    );
    eprintln!(
        "thread hand-off: an empty pool call of one task per thread costs {:.0} ns (median of {} rounds of {POOL_CALLS}; a decoded token pays it about five times a layer)",
        median(&b.pool_call_ns),
        b.pool_call_ns.len(),
    );
}

/// Empty pool calls per round of `--membw`'s hand-off measurement.
const POOL_CALLS: usize = 20_000;

/// What `--membw` reports: the machine's read bandwidth, of memory and of a working set of one
/// token's size, and one decoded token's traffic.
struct MembwBound {
    /// The streaming read of a `--membw-mib` buffer.
    memory: model::Bandwidth,
    /// The same read over a buffer of `bytes_per_token` (whole MiB): what the cache hierarchy
    /// gives a working set of the decode's size.
    working_set: model::Bandwidth,
    weight_bytes: u64,
    kv_bytes_per_position: u64,
    /// The decode's mean position (decode runs over `depth..depth + gen_tokens`).
    mean_depth: usize,
    bytes_per_token: u64,
    /// What an empty pool call costs, ns, per round (`model::measure_pool_call_ns`).
    pool_call_ns: Vec<f64>,
}

fn membw_bound(
    model: &model::Model,
    pool: &model::ThreadPool,
    args: &BenchModelArgs,
) -> Result<MembwBound> {
    let memory = model::measure_read_bandwidth(pool, args.membw_mib << 20, 20);
    let traffic = model::DecodeTraffic::of(model, args.kv.codecs()?);
    let mean_depth = args.depth + args.gen_tokens / 2;
    let bytes_per_token = traffic.bytes_at_depth(mean_depth);
    let working_set = model::measure_read_bandwidth(pool, bytes_per_token as usize, 20);
    let pool_call_ns = model::measure_pool_call_ns(pool, POOL_CALLS, 3);
    Ok(MembwBound {
        memory,
        working_set,
        pool_call_ns,
        weight_bytes: traffic.weight_bytes,
        kv_bytes_per_position: traffic.kv_bytes_per_position,
        mean_depth,
        bytes_per_token,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn medians_and_side_by_side_ratios() {
        assert_eq!(median(&[]), 0.0);
        assert_eq!(median(&[3.0, 1.0, 2.0]), 2.0);
        assert_eq!(median(&[4.0, 1.0, 3.0, 2.0]), 2.5);
        assert_eq!(ratios(&[2.0, 4.0], &[3.0, 2.0]), vec![1.5, 0.5]);
    }
}
