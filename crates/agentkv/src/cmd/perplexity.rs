//! `agentkv perplexity`: llama.cpp-compatible perplexity of a text file.

use std::path::PathBuf;
use std::time::Instant;

use anyhow::{Context, Result};
use model::{perplexity, PerplexityOptions};

use super::common::ModelArgs;

#[derive(clap::Args, Debug)]
pub struct PerplexityArgs {
    #[command(flatten)]
    pub model: ModelArgs,
    /// Text file to evaluate.
    #[arg(long, short = 'f')]
    pub file: PathBuf,
    /// Window size in tokens.
    #[arg(long, default_value_t = 512)]
    pub ctx: usize,
    /// Evaluate at most this many windows.
    #[arg(long)]
    pub chunks: Option<usize>,
    /// BOS handling: `auto` follows the tokenizer's add_bos flag (as llama.cpp does), `always`, `never`.
    #[arg(long, default_value = "auto")]
    pub bos: String,
    #[command(flatten)]
    pub kv: super::common::KvArgs,
    /// Also run each window with this KV codec (e.g. f32) and report the mean KL divergence.
    #[arg(long, value_parser = super::common::parse_kv_dtype)]
    pub kl_reference: Option<model::KvDtype>,
    /// Score each window's second half over a first half restored from a storage tier that
    /// keeps K/V in this codec (a lossy tier's cost; `--tier-codec` = `--kv-dtype` gives the
    /// exact baseline of the same two-step evaluation).
    #[arg(long, value_parser = super::common::parse_kv_dtype)]
    pub tier_codec: Option<model::KvDtype>,
    /// Matmul arithmetic: `llama.cpp` (its float order, as llama-perplexity computes) or
    /// `engine` (the server's batch-invariant order: on CPUs without AVX-512 VNNI the faster
    /// block-sum order of packed Q4_0 / Q4_1 / Q5_0 / Q8_0 matrices).
    #[arg(long, default_value = "llama.cpp", value_parser = ["llama.cpp", "engine"])]
    pub matmul: String,
    /// Print the result as JSON.
    #[arg(long)]
    pub json: bool,
}

pub fn run(args: PerplexityArgs) -> Result<()> {
    let mut model = args.model.load()?;
    // Windows of `ctx` tokens: the context llama-perplexity serves per sequence (Phi 3 128K's
    // RoPE factors depend on it).
    model.set_context_length(args.ctx);
    let pool = args.model.pool();
    let text = std::fs::read_to_string(&args.file)
        .with_context(|| format!("reading {}", args.file.display()))?;
    let use_bos = match args.bos.as_str() {
        "auto" => model.tokenizer().add_bos(),
        "always" => true,
        "never" => false,
        other => anyhow::bail!("--bos must be auto, always or never, not {other:?}"),
    };
    let tokens = model.tokenizer().encode(&text, use_bos, false)?;
    eprintln!(
        "{} tokens, ctx {}, BOS per window: {use_bos}",
        tokens.len(),
        args.ctx
    );
    let kv_dtype = args.kv.codecs()?;
    let opts = PerplexityOptions {
        ctx: args.ctx,
        use_bos,
        kv_dtype,
        max_chunks: args.chunks,
        kl_reference: args.kl_reference,
        restored_through: args.tier_codec,
        matmul_arith: if args.matmul == "engine" {
            model::MatmulArith::Invariant
        } else {
            model::MatmulArith::LlamaCpp
        },
    };
    let start = Instant::now();
    let report = perplexity(&model, &pool, &tokens, &opts, |i, n, ppl| {
        eprint!("\r[{i}/{n}] running perplexity {ppl:.4}");
    })?;
    eprintln!();
    let secs = start.elapsed().as_secs_f64();
    if args.json {
        println!(
            "{}",
            serde_json::json!({
                "ppl": report.ppl, "stderr": report.ppl_stderr, "chunks": report.num_chunks,
                "scored_tokens": report.num_scored, "ctx": args.ctx, "seconds": secs,
                "kv_codecs": kv_dtype.id(), "kv_bytes_per_token": kv_dtype.bytes_per_token(
                    model.config().num_layers, model.config().num_kv_heads, model.config().head_dim),
                "mean_kl": report.mean_kl,
                "tier_codec": args.tier_codec.map(|c| c.id()),
                "matmul": args.matmul,
                "packed_def": if args.matmul == "engine" {
                    model::PackedDef::invariant().name()
                } else {
                    model::PackedDef::Ggml.name()
                },
            })
        );
    } else {
        println!(
            "Final estimate: PPL = {:.4} +/- {:.4}  ({} chunks of {}, {} scored tokens, {:.1}s, {:.0} tok/s)",
            report.ppl,
            report.ppl_stderr,
            report.num_chunks,
            args.ctx,
            report.num_scored,
            secs,
            (report.num_chunks * args.ctx) as f64 / secs
        );
        if let Some(kl) = report.mean_kl {
            println!("Mean KL divergence from the reference KV codec: {kl:.6}");
        }
    }
    Ok(())
}
