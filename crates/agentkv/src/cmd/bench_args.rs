//! The arguments `bench agent` and `bench replay` share (where to send: [`TargetArgs`],
//! [`targets`]) and those of `bench replay` ([`ReplayArgs`]), apart from both commands so that
//! neither imports the other. Parsing only.

use std::path::PathBuf;

use anyhow::Context;
use bench::client::Target;

/// Where to send, shared by `agent` and `replay`.
#[derive(clap::Args, Debug)]
pub struct TargetArgs {
    /// Base URL of the server, e.g. http://127.0.0.1:8080.
    #[arg(long)]
    pub url: String,
    /// Model name sent in requests (replay: default = the recorded one).
    #[arg(long)]
    pub model: Option<String>,
    /// Second server: calls alternate between the two, and the report gives ratios.
    #[arg(long)]
    pub compare: Option<String>,
    /// Model name for --compare (default: --model).
    #[arg(long)]
    pub compare_model: Option<String>,
    /// Environment variable holding a bearer token for both servers.
    #[arg(long)]
    pub api_key_env: Option<String>,
    /// Per-request timeout in seconds.
    #[arg(long, default_value_t = 600.0)]
    pub timeout_s: f64,
    /// Stop starting calls after this many seconds (calls in flight finish); the report then
    /// counts the rest as "not run".
    #[arg(long)]
    pub max_duration_s: Option<f64>,
    /// Directory for results.json, table.txt and report.html.
    #[arg(long, default_value = "bench-out")]
    pub out: PathBuf,
    /// Also write the exact request sequence (JSONL) here.
    #[arg(long)]
    pub save_trace: Option<PathBuf>,
    /// Hide the progress bar.
    #[arg(long)]
    pub no_progress: bool,
}

#[derive(clap::Args, Debug)]
pub struct ReplayArgs {
    /// Trace written by `bench agent --save-trace`, or a Mooncake trace
    /// (`{"timestamp","input_length","output_length","hash_ids"}` per line), replayed open-loop
    /// as `/v1/completions` calls with token-id prompts (one block of ids per hash id).
    pub trace: PathBuf,
    #[command(flatten)]
    pub target: TargetArgs,
    /// Which target's requests to replay from a --compare trace.
    #[arg(long, default_value_t = 0)]
    pub trace_target: usize,
    /// Mooncake: wall seconds per trace second (0.05: twenty times faster than recorded).
    #[arg(long, default_value_t = 1.0)]
    pub time_scale: f64,
    /// Mooncake: tokens per hash id (the server's block size, so one trace block is one KV block).
    #[arg(long, default_value_t = 16)]
    pub block_tokens: usize,
    /// Mooncake: replay only the first N requests.
    #[arg(long)]
    pub max_requests: Option<usize>,
    /// Mooncake: requests in flight at most (later ones wait and are reported late).
    #[arg(long, default_value_t = 32)]
    pub max_in_flight: usize,
    /// Mooncake: tokens generated per request.
    #[arg(long, default_value_t = 1)]
    pub max_tokens: u32,
    /// Mooncake: also replay the same prompts through `cache-sim`'s default policy with a pool of
    /// this many blocks (the server's), and print both hit rates.
    #[arg(long)]
    pub capacity_blocks: Option<u32>,
    /// Mooncake: simulate plain LRU without inferred conversations (a server configured with
    /// `replacement_policy: lru` and `infer_conversations: false`) instead of the defaults.
    #[arg(long)]
    pub sim_plain_lru: bool,
}

pub fn targets(t: &TargetArgs, default_model: &str) -> anyhow::Result<Vec<Target>> {
    let api_key = match &t.api_key_env {
        Some(var) => Some(std::env::var(var).with_context(|| format!("reading ${var}"))?),
        None => None,
    };
    let model = t.model.clone().unwrap_or_else(|| default_model.to_string());
    let mut v = vec![Target {
        name: "base".into(),
        base_url: t.url.clone(),
        model: model.clone(),
        api_key: api_key.clone(),
    }];
    if let Some(url) = &t.compare {
        v[0].name = "A".into();
        v.push(Target {
            name: "B".into(),
            base_url: url.clone(),
            model: t.compare_model.clone().unwrap_or(model),
            api_key,
        });
    }
    Ok(v)
}
