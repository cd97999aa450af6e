//! `agentkv trace-gen`: write a synthetic agent trace (`cache::sim::generate`) as JSONL to a file
//! or stdout. Argument parsing and I/O only; the generators live in `cache`.

use std::io::Write;
use std::path::PathBuf;

use anyhow::Context;
use cache::sim::{generate, TraceKind, TraceParams};

#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum KindArg {
    React,
    Webshop,
    Swarm,
}

/// Generate a synthetic agent trace (JSONL, one model call per line).
#[derive(clap::Args, Debug)]
pub struct TraceGenArgs {
    /// Workload shape.
    #[arg(long, value_enum)]
    pub kind: KindArg,
    /// Concurrent agents (spread over up to 3 tenants).
    #[arg(long, default_value_t = 8)]
    pub agents: u32,
    /// Tasks per agent.
    #[arg(long, default_value_t = 4)]
    pub tasks: u32,
    /// Seed; the same seed gives the same trace.
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// Output file (stdout if absent).
    #[arg(long)]
    pub out: Option<PathBuf>,
}

pub fn run(args: TraceGenArgs) -> anyhow::Result<()> {
    let kind = match args.kind {
        KindArg::React => TraceKind::React,
        KindArg::Webshop => TraceKind::Webshop,
        KindArg::Swarm => TraceKind::Swarm,
    };
    let calls = generate(TraceParams {
        kind,
        agents: args.agents,
        tasks: args.tasks,
        seed: args.seed,
    });
    let mut out: Box<dyn Write> = match &args.out {
        Some(path) => Box::new(std::io::BufWriter::new(
            std::fs::File::create(path).with_context(|| format!("creating {}", path.display()))?,
        )),
        None => Box::new(std::io::BufWriter::new(std::io::stdout().lock())),
    };
    for call in &calls {
        serde_json::to_writer(&mut out, call)?;
        out.write_all(b"\n")?;
    }
    out.flush()?;
    Ok(())
}
