//! `agentkv bench-model`: prefill and decode speed of the model runtime, as llama-bench measures
//! them (prefill of a P-token prompt; decode of N tokens at batch 1), median of several runs.

use std::time::Instant;

use anyhow::Result;
use model::forward::{ForwardBatch, Scratch};
use model::SeqSlot;

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
    /// Repetitions (the median is reported).
    #[arg(long, default_value_t = 3)]
    pub reps: usize,
    #[command(flatten)]
    pub kv: super::common::KvArgs,
}

pub fn run(args: BenchModelArgs) -> Result<()> {
    let model = args.model.load()?;
    let pool = args.model.pool();
    let vocab = model.config.vocab_size as u32;
    // Deterministic pseudo-random tokens, as llama-bench uses random tokens.
    let tokens: Vec<u32> = (0..args.prompt_tokens as u64)
        .map(|i| ((i * 2_654_435_761) % vocab as u64) as u32)
        .collect();
    let mut pp = Vec::new();
    let mut tg = Vec::new();
    for _ in 0..args.reps.max(1) {
        let mut kv =
            model.contiguous_kv(1, args.prompt_tokens + args.gen_tokens, args.kv.codecs()?)?;
        let mut scratch = Scratch::default();
        let positions: Vec<u32> = (0..args.prompt_tokens as u32).collect();
        let slots = vec![SeqSlot(0); args.prompt_tokens];
        let t0 = Instant::now();
        let batch = ForwardBatch {
            tokens: &tokens,
            positions: &positions,
            slots: &slots,
            logits_for: &[args.prompt_tokens - 1],
        };
        model.forward(&pool, &batch, &mut kv, &mut scratch)?;
        pp.push(args.prompt_tokens as f64 / t0.elapsed().as_secs_f64());

        let mut kv = model.contiguous_kv(1, args.gen_tokens + 1, args.kv.codecs()?)?;
        let t0 = Instant::now();
        let mut tok = 1u32;
        for pos in 0..args.gen_tokens {
            let batch = ForwardBatch {
                tokens: &[tok],
                positions: &[pos as u32],
                slots: &[SeqSlot(0)],
                logits_for: &[0],
            };
            let logits = model.forward(&pool, &batch, &mut kv, &mut scratch)?;
            tok = model::sampler::argmax(&logits);
        }
        tg.push(args.gen_tokens as f64 / t0.elapsed().as_secs_f64());
    }
    let med = |v: &mut Vec<f64>| {
        v.sort_by(f64::total_cmp);
        v[v.len() / 2]
    };
    let (pp_med, tg_med) = (med(&mut pp), med(&mut tg));
    println!(
        "{}",
        serde_json::json!({
            "threads": pool.num_threads(), "prompt_tokens": args.prompt_tokens, "gen_tokens": args.gen_tokens,
            "prefill_tok_s": pp_med, "decode_tok_s": tg_med, "prefill_runs": pp, "decode_runs": tg,
        })
    );
    eprintln!(
        "prefill {} tokens: {pp_med:.1} tok/s; decode {} tokens: {tg_med:.1} tok/s ({} threads)",
        args.prompt_tokens,
        args.gen_tokens,
        pool.num_threads()
    );
    Ok(())
}
