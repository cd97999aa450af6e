//! Single-sequence generation over a [`ContiguousKv`]: prompt prefill in chunks, then decode.
//!
//! Used by the CLI (`agentkv generate`, the speed benchmark) and by the correctness tests against
//! llama.cpp. The engine has its own batched loop; this one never batches sequences.

use std::time::{Duration, Instant};

use crate::forward::{AttnArith, ForwardBatch, ForwardError, MatmulArith, Scratch};
use crate::kv::{KvDtype, SeqSlot};
use crate::model::Model;
use crate::numerics::{Numerics, RowKind};
use crate::sampler::{SampledToken, Sampler, SamplingParams};
use kernels::ThreadPool;

#[derive(Debug, Clone)]
pub struct GenerateOptions {
    pub max_tokens: usize,
    pub sampling: SamplingParams,
    /// Generation stops after emitting one of these (the token is reported).
    pub stop_ids: Vec<u32>,
    /// Prompt tokens per forward call.
    pub prefill_chunk: usize,
    pub kv_dtype: KvDtype,
    /// Prompt chunks of 64+ tokens in llama.cpp's tiled prefill arithmetic
    /// ([`AttnArith::for_step`]), as llama-server computes them, and generated tokens in its
    /// per-row one. Off by default: every step in `attn_arith`. (The engine, with `EngineConfig::llama_cpp_prefill`, computes the prompt rows of 64+ token prompts in the
    /// tiled arithmetic whatever its chunks — `RowKind::LongPrompt` — which equals this
    /// for prompts of up to 512 tokens.) On, the matmuls take llama.cpp's float order too
    /// (`MatmulArith::LlamaCpp` for the prompt, `InvariantGgml` for generated tokens).
    pub llama_cpp_prefill: bool,
    /// The matmul arithmetic of every step when `llama_cpp_prefill` is off: the engine's
    /// `Invariant` by default, or `InvariantGgml` (llama.cpp's decode arithmetic everywhere).
    pub matmul_arith: MatmulArith,
    /// The attention arithmetic of every step when `llama_cpp_prefill` is off: the engine's
    /// ([`AttnArith::invariant`]) by default, or [`AttnArith::Tiled`] / [`AttnArith::Row`]
    /// (llama.cpp's decode kernel).
    pub attn_arith: AttnArith,
}

impl Default for GenerateOptions {
    fn default() -> Self {
        GenerateOptions {
            max_tokens: 64,
            // `generate` reports each token's logprob (the reference tests compare them).
            sampling: SamplingParams {
                logprobs: true,
                ..Default::default()
            },
            stop_ids: Vec::new(),
            prefill_chunk: 512,
            kv_dtype: KvDtype::F16,
            llama_cpp_prefill: false,
            matmul_arith: MatmulArith::Invariant,
            attn_arith: AttnArith::invariant(),
        }
    }
}

#[derive(Debug, Clone, Default)]
pub struct GenerateStats {
    pub prompt_tokens: usize,
    pub generated_tokens: usize,
    pub prefill_time: Duration,
    pub decode_time: Duration,
}

impl GenerateStats {
    pub fn prefill_tok_per_s(&self) -> f64 {
        self.prompt_tokens as f64 / self.prefill_time.as_secs_f64().max(1e-9)
    }
    /// Decode speed over the tokens after the first (the first comes from the prefill).
    pub fn decode_tok_per_s(&self) -> f64 {
        self.generated_tokens.saturating_sub(1) as f64 / self.decode_time.as_secs_f64().max(1e-9)
    }
}

#[derive(Debug, thiserror::Error)]
pub enum GenerateError {
    #[error("empty prompt")]
    EmptyPrompt,
    #[error("prompt of {prompt} tokens plus {max_tokens} new tokens exceeds the context length {context}")]
    TooLong {
        prompt: usize,
        max_tokens: usize,
        context: usize,
    },
    #[error(transparent)]
    Forward(#[from] ForwardError),
    /// The sampling constraint allowed no next token.
    #[error(transparent)]
    Constraint(#[from] crate::sampler::ConstraintError),
}

/// Generates up to `opts.max_tokens` tokens after `prompt`, calling `on_token` for each; it
/// returns `false` to stop early.
pub fn generate(
    model: &Model,
    pool: &ThreadPool,
    prompt: &[u32],
    opts: &GenerateOptions,
    mut on_token: impl FnMut(&SampledToken) -> bool,
) -> Result<(Vec<SampledToken>, GenerateStats), GenerateError> {
    if prompt.is_empty() {
        return Err(GenerateError::EmptyPrompt);
    }
    let context = model.config.context_length;
    let capacity = prompt.len() + opts.max_tokens;
    if capacity > context {
        return Err(GenerateError::TooLong {
            prompt: prompt.len(),
            max_tokens: opts.max_tokens,
            context,
        });
    }
    let mut kv = model
        .contiguous_kv(1, capacity, opts.kv_dtype)
        .map_err(ForwardError::from)?;
    let mut scratch = Scratch::default();
    let mut sampler = Sampler::new(opts.sampling.clone());
    let mut stats = GenerateStats {
        prompt_tokens: prompt.len(),
        ..Default::default()
    };
    let chunk = opts.prefill_chunk.max(1);

    let start = Instant::now();
    let mut logits = Vec::new();
    for (c, piece) in prompt.chunks(chunk).enumerate() {
        let positions: Vec<u32> = (0..piece.len()).map(|i| (c * chunk + i) as u32).collect();
        let slots = vec![SeqSlot(0); piece.len()];
        let last = [piece.len() - 1];
        let is_last_chunk = (c + 1) * chunk >= prompt.len();
        let numerics = if opts.llama_cpp_prefill {
            Numerics::Explicit {
                attention: AttnArith::for_step(piece.len()),
                matmul: MatmulArith::LlamaCpp,
            }
        } else {
            Numerics::Explicit {
                attention: opts.attn_arith,
                matmul: opts.matmul_arith,
            }
        };
        let batch = ForwardBatch {
            tokens: piece,
            positions: &positions,
            slots: &slots,
            logits_for: if is_last_chunk { &last } else { &[] },
            numerics,
            rows: &RowKind::by_step(&slots),
        };
        logits = model.forward(pool, &batch, &mut kv, &mut scratch)?;
    }
    stats.prefill_time = start.elapsed();

    let start = Instant::now();
    let mut out = Vec::new();
    let mut pos = prompt.len();
    while out.len() < opts.max_tokens {
        let tok = sampler.sample(&logits, prompt)?;
        sampler.observe(tok.id);
        let keep_going = on_token(&tok);
        let stop = opts.stop_ids.contains(&tok.id);
        let id = tok.id;
        out.push(tok);
        if stop || !keep_going || out.len() == opts.max_tokens {
            break;
        }
        // llama.cpp's decode arithmetic when reproducing it (the prompt's `LlamaCpp` is the
        // same for one token).
        let numerics = if opts.llama_cpp_prefill {
            Numerics::Explicit {
                attention: AttnArith::Row,
                matmul: MatmulArith::InvariantGgml,
            }
        } else {
            Numerics::Explicit {
                attention: opts.attn_arith,
                matmul: opts.matmul_arith,
            }
        };
        let batch = ForwardBatch {
            tokens: &[id],
            positions: &[pos as u32],
            slots: &[SeqSlot(0)],
            logits_for: &[0],
            numerics,
            rows: &[RowKind::Generated],
        };
        logits = model.forward(pool, &batch, &mut kv, &mut scratch)?;
        pos += 1;
    }
    stats.decode_time = start.elapsed();
    stats.generated_tokens = out.len();
    Ok((out, stats))
}
