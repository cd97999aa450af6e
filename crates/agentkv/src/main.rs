//! The `agentkv` binary: command-line parsing and wiring. The only crate that uses `anyhow`.

mod cmd;
mod config;
#[cfg(test)]
mod deploy_files;

use clap::{Parser, Subcommand};

#[derive(Parser, Debug)]
#[command(
    name = "agentkv",
    version,
    about = "An LLM inference server whose KV cache is built for AI agents"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Download the default model (SmolLM2-135M-Instruct Q4_1) into models/ and verify it.
    FetchModel(cmd::fetch_model::FetchModelArgs),
    /// Serve the OpenAI-compatible API (chat, completions, streaming, tenants, /metrics).
    Serve(cmd::serve::ServeArgs),
    /// Print what a GGUF model is: architecture, sizes, tokenizer, KV bytes per token.
    Info(cmd::info::InfoArgs),
    /// Generate text from a prompt, streamed to stdout.
    Generate(cmd::generate::GenerateArgs),
    /// Perplexity of a text file, computed like llama.cpp's llama-perplexity.
    Perplexity(cmd::perplexity::PerplexityArgs),
    /// Prefill and decode speed of the model runtime.
    BenchModel(cmd::bench_model::BenchModelArgs),
    /// Constrained-decoding cost per token (JSON, tool-call grammars) against the decode step.
    BenchConstraint(cmd::bench_constraint::BenchConstraintArgs),
    /// Engine throughput: decode at several concurrencies, prefill, TTFT with a cached prefix.
    BenchEngine(cmd::bench_engine::BenchEngineArgs),
    /// Agent-workload benchmark against OpenAI-compatible endpoints (agent, replay, trace-to-sim).
    Bench(cmd::bench_agent::BenchArgs),
    /// KV-cache memory per token, per layer and in total for a model, context length and dtype.
    KvSize(cmd::kv_size::KvSizeArgs),
    /// Replay a trace of model calls against the KV cache core and report the hit rate.
    CacheSim(cmd::cache_sim::CacheSimArgs),
    /// Simulate the hit rate of N replicas behind a router, per routing policy.
    RouteSim(cmd::route_sim::RouteSimArgs),
    /// Generate a synthetic agent-workload trace (JSONL) for cache-sim.
    TraceGen(cmd::trace_gen::TraceGenArgs),
    /// Start the CUDA runtime on GPU 0 and check every GPU kernel against the CPU.
    GpuCheck(cmd::gpu_check::GpuCheckArgs),
}

fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    let log_format = match &cli.command {
        Command::Serve(a) => a.log_format,
        _ => None,
    };
    cmd::logging::init(log_format)?;
    match cli.command {
        Command::FetchModel(a) => cmd::fetch_model::run(a),
        Command::Serve(a) => cmd::serve::run(a),
        Command::Info(a) => cmd::info::run(a),
        Command::Generate(a) => cmd::generate::run(a),
        Command::Perplexity(a) => cmd::perplexity::run(a),
        Command::BenchModel(a) => cmd::bench_model::run(a),
        Command::BenchConstraint(a) => cmd::bench_constraint::run(a),
        Command::BenchEngine(a) => cmd::bench_engine::run(a),
        Command::Bench(a) => cmd::bench_agent::run(a),
        Command::KvSize(a) => cmd::kv_size::run(a),
        Command::CacheSim(a) => cmd::cache_sim::run(a),
        Command::RouteSim(a) => cmd::route_sim::run(a),
        Command::TraceGen(a) => cmd::trace_gen::run(a),
        Command::GpuCheck(a) => cmd::gpu_check::run(a),
    }
}
