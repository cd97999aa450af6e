//! `agentkv bench agent|replay|trace-to-sim`: argument parsing and glue over the `bench` crate
//! (workload, driver, reports, traces); `trace-to-sim` tokenises a bench trace with the model's
//! chat template and tokenizer into `cache-sim` JSONL. No measurement logic lives here.

use std::io::Write;
use std::path::PathBuf;

use anyhow::{bail, Context};
use bench::client::Target;
use bench::corpus::Corpus;
use bench::driver::{run_blocking, DriverConfig, TaskPlan};
use bench::report::{aggregate, table, write_all};

pub use super::bench_args::{targets, ReplayArgs, TargetArgs};
use bench::workload::{generate, WorkloadConfig, WorkloadKind};

#[derive(clap::Args, Debug)]
pub struct BenchArgs {
    #[command(subcommand)]
    pub command: BenchCommand,
}

#[derive(clap::Subcommand, Debug)]
pub enum BenchCommand {
    /// Drive closed-loop agents against an OpenAI-compatible endpoint and report latencies.
    Agent(AgentArgs),
    /// Replay the requests of a trace saved with `bench agent --save-trace`.
    Replay(ReplayArgs),
    /// Tokenise a bench trace into `cache-sim` JSONL (`{"t","session","tenant","tokens"}`).
    TraceToSim(TraceToSimArgs),
}

#[derive(clap::ValueEnum, Clone, Copy, Debug)]
pub enum WorkloadArg {
    React,
    Webshop,
    Swarm,
}

#[derive(clap::Args, Debug)]
pub struct AgentArgs {
    #[command(flatten)]
    pub target: TargetArgs,
    #[arg(long, value_enum, default_value_t = WorkloadArg::React)]
    pub workload: WorkloadArg,
    /// Concurrent closed-loop agents.
    #[arg(long, default_value_t = 4)]
    pub agents: u32,
    /// Tasks per agent, run one after another.
    #[arg(long, default_value_t = 2)]
    pub tasks: u32,
    /// Calls per task (default: the workload's own range).
    #[arg(long)]
    pub steps: Option<u32>,
    /// Simulated tool latency between calls, `LO..HI` or `N` milliseconds.
    #[arg(long, value_parser = parse_range)]
    pub tool_latency_ms: Option<(u64, u64)>,
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// Tool observation tokens appended per call, `LO..HI` or `N` (default: the workload's).
    #[arg(long, value_parser = parse_range)]
    pub observation_tokens: Option<(u64, u64)>,
    /// Output tokens (`max_tokens`) per call, `LO..HI` or `N` (default: the workload's).
    #[arg(long, value_parser = parse_range)]
    pub output_tokens: Option<(u64, u64)>,
    /// Shared system prompt tokens (default: the workload's).
    #[arg(long)]
    pub system_tokens: Option<usize>,
    /// Sampling temperature (0 = greedy, so both targets of --compare see comparable answers).
    #[arg(long, default_value_t = 0.0)]
    pub temperature: f32,
    /// Name each task's session in its calls (`prompt_cache_key`), so a server with session
    /// retention keeps it through the tool pauses.
    #[arg(long)]
    pub session_keys: bool,
    /// Mark each call's system message with `cache_control` (ephemeral, 1h).
    #[arg(long)]
    pub system_breakpoint: bool,
}

#[derive(clap::Args, Debug)]
pub struct TraceToSimArgs {
    /// Bench trace (JSONL).
    #[arg(long)]
    pub trace: PathBuf,
    /// GGUF model whose chat template and tokenizer turn messages into token ids.
    #[arg(long, short = 'm')]
    pub model: Option<PathBuf>,
    /// Output JSONL for `agentkv cache-sim --trace`.
    #[arg(long)]
    pub out: PathBuf,
    /// Which target's requests to convert from a --compare trace.
    #[arg(long, default_value_t = 0)]
    pub trace_target: usize,
}

fn parse_range(s: &str) -> Result<(u64, u64), String> {
    let parse = |x: &str| x.trim().parse::<u64>().map_err(|e| format!("{x:?}: {e}"));
    let (lo, hi) = match s.split_once("..") {
        Some((a, b)) => (parse(a)?, parse(b.trim_start_matches('='))?),
        None => (parse(s)?, parse(s)?),
    };
    if lo > hi {
        return Err(format!("empty range {lo}..{hi}"));
    }
    Ok((lo, hi))
}

pub fn run(args: BenchArgs) -> anyhow::Result<()> {
    match args.command {
        BenchCommand::Agent(a) => run_agent(a),
        BenchCommand::Replay(a) => run_replay(a),
        BenchCommand::TraceToSim(a) => trace_to_sim(a),
    }
}

fn driver_config(
    t: &TargetArgs,
    targets: Vec<Target>,
    temperature: f32,
    seed: Option<u64>,
) -> anyhow::Result<DriverConfig> {
    if !(t.timeout_s > 0.0 && t.timeout_s.is_finite()) {
        bail!("--timeout-s must be positive");
    }
    Ok(DriverConfig {
        targets,
        temperature,
        seed,
        request_timeout: std::time::Duration::from_secs_f64(t.timeout_s),
        max_duration: t
            .max_duration_s
            .filter(|d| d.is_finite() && *d > 0.0)
            .map(std::time::Duration::from_secs_f64),
        progress: !t.no_progress,
        session_keys: false,
        system_breakpoint: false,
    })
}

fn finish(
    t: &TargetArgs,
    results: bench::report::BenchResults,
    trace: &[bench::trace::TraceEntry],
) -> anyhow::Result<()> {
    if let Some(path) = &t.save_trace {
        bench::trace::write_trace(path, trace)?;
        eprintln!("trace: {} ({} requests)", path.display(), trace.len());
    }
    let files = write_all(&t.out, &results)?;
    print!("{}", table::render(&results));
    eprintln!(
        "wrote {}, {}, {}",
        files.json.display(),
        files.table.display(),
        files.html.display()
    );
    Ok(())
}

fn run_agent(a: AgentArgs) -> anyhow::Result<()> {
    let Some(model) = a.target.model.clone() else {
        bail!("--model is required for `bench agent`");
    };
    let wl = WorkloadConfig {
        kind: match a.workload {
            WorkloadArg::React => WorkloadKind::React,
            WorkloadArg::Webshop => WorkloadKind::Webshop,
            WorkloadArg::Swarm => WorkloadKind::Swarm,
        },
        num_agents: a.agents,
        tasks_per_agent: a.tasks,
        steps_per_task: a.steps,
        tool_latency_ms: a.tool_latency_ms,
        seed: a.seed,
        observation_tokens: a.observation_tokens.map(|(l, h)| (l as usize, h as usize)),
        output_tokens: a.output_tokens.map(|(l, h)| (l as usize, h as usize)),
        system_tokens: a.system_tokens,
    };
    let workload = generate(&wl, &Corpus::builtin())?;
    let targets = targets(&a.target, &model)?;
    eprintln!(
        "{} agents × {} tasks, {} calls per target, {} target(s)",
        a.agents,
        a.tasks,
        workload.num_calls(),
        targets.len()
    );
    let plans = workload
        .agents
        .into_iter()
        .map(|tasks| tasks.into_iter().map(TaskPlan::Scripted).collect())
        .collect();
    let mut cfg = driver_config(&a.target, targets.clone(), a.temperature, Some(a.seed))?;
    cfg.session_keys = a.session_keys;
    cfg.system_breakpoint = a.system_breakpoint;
    let mut out = run_blocking(cfg, plans)?;
    let trace = std::mem::take(&mut out.trace);
    let results = aggregate("agent".into(), Some(wl), &targets, out);
    finish(&a.target, results, &trace)
}

fn run_replay(a: ReplayArgs) -> anyhow::Result<()> {
    if super::cache_sim::is_mooncake(&a.trace)? {
        return super::mooncake_replay::run(&a);
    }
    let entries = bench::trace::read_trace(&a.trace)?;
    let plans = bench::replay::plans_from_trace(&entries, a.trace_target);
    if plans.is_empty() {
        bail!(
            "{}: no requests for target {}",
            a.trace.display(),
            a.trace_target
        );
    }
    // An empty model name keeps each recorded request's own model.
    let targets = targets(&a.target, "")?;
    let cfg = driver_config(&a.target, targets.clone(), 0.0, None)?;
    let mut out = run_blocking(cfg, plans)?;
    let trace = std::mem::take(&mut out.trace);
    let source = format!("replay {}", a.trace.display());
    let results = aggregate(source, None, &targets, out);
    finish(&a.target, results, &trace)
}

fn trace_to_sim(a: TraceToSimArgs) -> anyhow::Result<()> {
    let path = a.model.clone().unwrap_or_else(model::default_model_path);
    let gguf =
        gguf::GgufFile::open(&path).with_context(|| format!("opening {}", path.display()))?;
    let tok = frontend::tokenizer::Tokenizer::from_gguf(gguf.metadata())?;
    let template = frontend::chat::ChatTemplate::from_gguf(gguf.metadata(), &tok)?
        .unwrap_or_else(frontend::chat::ChatTemplate::fallback);
    let entries = bench::trace::read_trace(&a.trace)?;
    let file =
        std::fs::File::create(&a.out).with_context(|| format!("creating {}", a.out.display()))?;
    let mut w = std::io::BufWriter::new(file);
    let mut n = 0usize;
    for e in entries.iter().filter(|e| e.target == a.trace_target) {
        let messages: Vec<frontend::chat::ChatMessage> = e
            .request
            .messages
            .iter()
            .map(|m| {
                let role = serde_json::to_value(m.role)
                    .ok()
                    .and_then(|v| v.as_str().map(str::to_string))
                    .unwrap_or_default();
                frontend::chat::ChatMessage::new(role, m.content.clone().unwrap_or_default())
            })
            .collect();
        let text = template.render(&messages, None, true)?;
        let tokens = tok.encode(&text, true, true)?;
        let line = serde_json::json!({"t": e.t, "session": e.session, "tenant": e.tenant, "tokens": tokens});
        serde_json::to_writer(&mut w, &line)?;
        w.write_all(b"\n")?;
        n += 1;
    }
    w.flush()?;
    eprintln!("{n} calls → {}", a.out.display());
    Ok(())
}
