//! `agentkv generate`: one prompt through the engine (paged KV, the same path the server uses),
//! streamed to stdout.

use std::io::Write;

use std::sync::Arc;
use std::time::Instant;

use anyhow::{Context, Result};
use engine::{Engine, EngineConfig, EngineCore, EngineEvent, RequestSpec};
use frontend::chat::ChatMessage;
use model::SamplingParams;

use super::common::ModelArgs;

#[derive(clap::Args, Debug)]
pub struct GenerateArgs {
    #[command(flatten)]
    pub model: ModelArgs,
    /// The prompt text (a user message with --chat).
    #[arg(long, short = 'p')]
    pub prompt: String,
    /// Apply the model's chat template to the prompt as one user message.
    #[arg(long)]
    pub chat: bool,
    /// System message (with --chat).
    #[arg(long)]
    pub system: Option<String>,
    #[arg(long, default_value_t = 128)]
    pub max_tokens: usize,
    /// 0 = greedy.
    #[arg(long, default_value_t = 0.0)]
    pub temperature: f32,
    #[arg(long, default_value_t = 0)]
    pub top_k: usize,
    #[arg(long, default_value_t = 1.0)]
    pub top_p: f32,
    #[arg(long, default_value_t = 0.0)]
    pub min_p: f32,
    #[arg(long, default_value_t = 1.0)]
    pub repetition_penalty: f32,
    #[arg(long)]
    pub seed: Option<u64>,
    /// Keep generating past end-of-turn tokens.
    #[arg(long)]
    pub ignore_eos: bool,
    #[command(flatten)]
    pub kv: super::common::KvArgs,
    /// Print timing statistics to stderr.
    #[arg(long)]
    pub stats: bool,
}

pub fn run(args: GenerateArgs) -> Result<()> {
    let model = args.model.load()?;
    let tok = &model.tokenizer();
    let ids = if args.chat {
        let mut messages = Vec::new();
        if let Some(s) = &args.system {
            messages.push(ChatMessage::new("system", s));
        }
        messages.push(ChatMessage::new("user", &args.prompt));
        // As the server does: the prompt's text never becomes special tokens.
        model.encode_chat(&messages, None, true)?
    } else {
        tok.encode(&args.prompt, true, false)?
    };
    let sampling = SamplingParams {
        temperature: args.temperature,
        top_k: args.top_k,
        top_p: args.top_p,
        min_p: args.min_p,
        repetition_penalty: args.repetition_penalty,
        seed: args.seed,
        ..Default::default()
    };
    sampling.validate()?;
    let mut spec = RequestSpec::greedy(ids, args.max_tokens);
    spec.sampling = sampling;
    spec.ignore_eos = args.ignore_eos;
    let block_size = 16;
    let num_blocks = (spec.prompt.len() + args.max_tokens).div_ceil(block_size) + 1;
    let cfg = EngineConfig {
        num_blocks,
        block_size,
        kv_dtype: args.kv.codecs()?,
        threads: pool_threads(&args.model),
        ..Default::default()
    };
    let prompt_tokens = spec.prompt.len();
    let engine = Engine::start(EngineCore::new(Arc::new(model), cfg)?);
    let (_, mut rx) = engine.handle().submit(spec)?;
    let mut stdout = std::io::stdout().lock();
    let start = Instant::now();
    let mut first_token = None;
    let mut generated = 0usize;
    while let Some(ev) = rx.blocking_recv() {
        match ev {
            EngineEvent::Token(t) => {
                first_token.get_or_insert_with(Instant::now);
                generated += 1;
                stdout.write_all(t.text.as_bytes())?;
                stdout.flush()?;
            }
            EngineEvent::Text { text, .. } => stdout.write_all(text.as_bytes())?,
            EngineEvent::Finished { .. } => break,
            EngineEvent::Error(e) => return Err(e).context("generation failed"),
            EngineEvent::Admitted { .. } => {}
        }
    }
    writeln!(stdout)?;
    if args.stats {
        let first = first_token.unwrap_or_else(Instant::now);
        let ttft = (first - start).as_secs_f64();
        let decode = (Instant::now() - first).as_secs_f64();
        eprintln!(
            "prompt {prompt_tokens} tokens, first token after {ttft:.3}s ({:.1} tok/s prefill); \
             generated {generated} tokens, decode {:.1} tok/s",
            prompt_tokens as f64 / ttft.max(1e-9),
            generated.saturating_sub(1) as f64 / decode.max(1e-9)
        );
    }
    Ok(())
}

fn pool_threads(m: &ModelArgs) -> usize {
    m.threads
        .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()))
}
