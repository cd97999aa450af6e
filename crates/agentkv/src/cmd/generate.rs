//! `agentkv generate`: one prompt, streamed to stdout.

use std::io::Write;

use anyhow::{Context, Result};
use model::chat::ChatMessage;
use model::generate::{generate, GenerateOptions};
use model::tokenizer::StreamDecoder;
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
    /// KV cache element type: f32 or f16.
    #[arg(long, default_value = "f16", value_parser = super::common::parse_kv_dtype)]
    pub kv_dtype: model::KvDtype,
    /// Print timing statistics to stderr.
    #[arg(long)]
    pub stats: bool,
}

pub fn run(args: GenerateArgs) -> Result<()> {
    let model = args.model.load()?;
    let pool = args.model.pool();
    let tok = &model.tokenizer;
    let text = if args.chat {
        let mut messages = Vec::new();
        if let Some(s) = &args.system {
            messages.push(ChatMessage::new("system", s));
        }
        messages.push(ChatMessage::new("user", &args.prompt));
        model
            .chat_template_or_fallback()
            .render(&messages, None, true)?
    } else {
        args.prompt.clone()
    };
    let ids = tok.encode(&text, !args.chat, args.chat)?;
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
    let opts = GenerateOptions {
        max_tokens: args.max_tokens,
        sampling,
        stop_ids: if args.ignore_eos {
            vec![]
        } else {
            tok.eot_ids().to_vec()
        },
        kv_dtype: args.kv_dtype,
        ..Default::default()
    };
    let mut dec = StreamDecoder::new(tok);
    let mut stdout = std::io::stdout().lock();
    let stop = opts.stop_ids.clone();
    let (_, stats) = generate(&model, &pool, &ids, &opts, |t| {
        if !stop.contains(&t.id) {
            let piece = dec.push(t.id);
            let _ = stdout.write_all(piece.as_bytes());
            let _ = stdout.flush();
        }
        true
    })
    .context("generation failed")?;
    let tail = dec.finish();
    stdout.write_all(tail.as_bytes())?;
    writeln!(stdout)?;
    if args.stats {
        eprintln!(
            "prompt {} tokens in {:.3}s ({:.1} tok/s); generated {} tokens, decode {:.1} tok/s",
            stats.prompt_tokens,
            stats.prefill_time.as_secs_f64(),
            stats.prefill_tok_per_s(),
            stats.generated_tokens,
            stats.decode_tok_per_s()
        );
    }
    Ok(())
}
