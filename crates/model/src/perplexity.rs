//! Perplexity computed the way llama.cpp's `llama-perplexity` does, so the figures compare.
//!
//! The text is tokenised once (BOS prepended when the model's tokenizer adds one); it is cut into
//! non-overlapping windows of `ctx` tokens (a trailing partial window is dropped); when BOS is
//! used, each window's first token is replaced by BOS; every window is evaluated from an empty
//! cache and only the second half is scored: the logits at positions `ctx/2 .. ctx-2` predict the
//! tokens at `ctx/2+1 .. ctx-1`. Reports `exp(mean NLL)` and llama.cpp's standard error.

use crate::forward::{AttnArith, ForwardBatch, ForwardError, MatmulArith, Scratch};
use crate::kv::KvDtype;
use crate::kv::SeqSlot;
use crate::model::Model;
use crate::numerics::{Numerics, RowKind};
use crate::ops::log_softmax_at;
use kernels::ThreadPool;

#[derive(Debug, Clone)]
pub struct PerplexityOptions {
    pub ctx: usize,
    /// Replace each window's first token with BOS (llama.cpp does so when the tokenizer adds BOS).
    pub use_bos: bool,
    pub kv_dtype: KvDtype,
    /// Stop after this many windows (all when `None`).
    pub max_chunks: Option<usize>,
    /// Also evaluate each window with this KV codec and report the mean KL divergence
    /// `KL(p_reference ‖ p)` over the scored tokens (e.g. f32 KV as the reference).
    pub kl_reference: Option<KvDtype>,
    /// Evaluate each window as a prompt whose first half was restored from a storage tier that
    /// keeps K/V in this codec: the first half is prefilled, its K/V round-tripped through the
    /// codec (`ContiguousKv::round_trip`), then the second half (every scored token) is computed
    /// over it. With the cache's own codec the round trip is a no-op: the exact baseline of the
    /// same two-step evaluation.
    pub restored_through: Option<KvDtype>,
    /// The matmul arithmetic: llama.cpp's (`MatmulArith::LlamaCpp`, what llama-perplexity
    /// computes) or the engine's (`Invariant`, to measure what its faster float order costs).
    pub matmul_arith: MatmulArith,
}

#[derive(Debug, Clone)]
pub struct PerplexityReport {
    pub num_chunks: usize,
    pub num_scored: usize,
    pub ppl: f64,
    /// Standard error of the perplexity estimate (llama.cpp's formula).
    pub ppl_stderr: f64,
    /// Per-window running perplexity, as llama.cpp prints it.
    pub running: Vec<f64>,
    /// Log-probabilities of every scored token, in order.
    pub token_logprobs: Vec<f32>,
    /// Mean KL divergence from the reference codec's distribution (when requested).
    pub mean_kl: Option<f64>,
}

#[derive(Debug, thiserror::Error)]
pub enum PerplexityError {
    #[error("context {ctx} must be an even number >= 4")]
    BadCtx { ctx: usize },
    #[error("text has {tokens} tokens, fewer than one window of {ctx}")]
    TooShort { tokens: usize, ctx: usize },
    #[error("the tokenizer has no BOS token")]
    NoBos,
    #[error(transparent)]
    Forward(#[from] ForwardError),
}

pub fn perplexity(
    model: &Model,
    pool: &ThreadPool,
    tokens: &[u32],
    opts: &PerplexityOptions,
    mut on_chunk: impl FnMut(usize, usize, f64),
) -> Result<PerplexityReport, PerplexityError> {
    let ctx = opts.ctx;
    if ctx < 4 || !ctx.is_multiple_of(2) {
        return Err(PerplexityError::BadCtx { ctx });
    }
    let mut num_chunks = tokens.len() / ctx;
    if num_chunks == 0 {
        return Err(PerplexityError::TooShort {
            tokens: tokens.len(),
            ctx,
        });
    }
    if let Some(m) = opts.max_chunks {
        num_chunks = num_chunks.min(m);
    }
    let bos = if opts.use_bos {
        Some(model.tokenizer().bos_id().ok_or(PerplexityError::NoBos)?)
    } else {
        None
    };
    let first = ctx / 2;
    let positions: Vec<u32> = (0..ctx as u32).collect();
    let slots = vec![SeqSlot(0); ctx];
    let logits_for: Vec<usize> = (first..ctx - 1).collect();
    let vocab = model.config.vocab_size;
    let mut kv = model
        .contiguous_kv(1, ctx, opts.kv_dtype)
        .map_err(ForwardError::from)?;
    let mut ref_kv = match opts.kl_reference {
        Some(d) => Some(model.contiguous_kv(1, ctx, d).map_err(ForwardError::from)?),
        None => None,
    };
    let mut kl_sum = 0.0f64;
    let mut scratch = Scratch::default();
    let (mut nll, mut nll2) = (0.0f64, 0.0f64);
    let mut token_logprobs = Vec::new();
    let mut running = Vec::new();
    for c in 0..num_chunks {
        let mut window = tokens[c * ctx..(c + 1) * ctx].to_vec();
        if let Some(b) = bos {
            window[0] = b;
        }
        let batch = ForwardBatch {
            tokens: &window,
            positions: &positions,
            slots: &slots,
            logits_for: &logits_for,
            // llama-perplexity evaluates each window in one step, so its tiled kernel.
            numerics: Numerics::Explicit {
                attention: AttnArith::for_step(ctx),
                matmul: opts.matmul_arith,
            },
            rows: &RowKind::by_step(&slots),
        };
        let logits = match opts.restored_through {
            None => model.forward(pool, &batch, &mut kv, &mut scratch)?,
            Some(through) => {
                let prefix = ForwardBatch {
                    tokens: &window[..first],
                    positions: &positions[..first],
                    slots: &slots[..first],
                    logits_for: &[],
                    numerics: Numerics::Explicit {
                        attention: AttnArith::for_step(first),
                        matmul: opts.matmul_arith,
                    },
                    rows: &RowKind::by_step(&slots[..first]),
                };
                model.forward(pool, &prefix, &mut kv, &mut scratch)?;
                kv.round_trip(SeqSlot(0), first, through)
                    .map_err(ForwardError::from)?;
                let shifted: Vec<usize> = logits_for.iter().map(|&t| t - first).collect();
                let rest = ForwardBatch {
                    tokens: &window[first..],
                    positions: &positions[first..],
                    slots: &slots[first..],
                    logits_for: &shifted,
                    numerics: Numerics::Explicit {
                        attention: AttnArith::for_step(ctx - first),
                        matmul: opts.matmul_arith,
                    },
                    rows: &RowKind::by_step(&slots[first..]),
                };
                model.forward(pool, &rest, &mut kv, &mut scratch)?
            }
        };
        if let Some(rkv) = ref_kv.as_mut() {
            let reference = model.forward(pool, &batch, rkv, &mut scratch)?;
            for j in 0..logits_for.len() {
                let row = j * vocab..(j + 1) * vocab;
                kl_sum += kl_divergence(&reference[row.clone()], &logits[row]);
            }
        }
        for (j, &t) in logits_for.iter().enumerate() {
            let target = window[t + 1] as usize;
            let lp = log_softmax_at(&logits[j * vocab..(j + 1) * vocab], target);
            token_logprobs.push(lp);
            nll -= lp as f64;
            nll2 += (lp as f64) * (lp as f64);
        }
        let n = token_logprobs.len() as f64;
        let ppl = (nll / n).exp();
        running.push(ppl);
        on_chunk(c + 1, num_chunks, ppl);
    }
    let n = token_logprobs.len() as f64;
    let mean_kl = ref_kv.as_ref().map(|_| kl_sum / n);
    let mean = nll / n;
    let var = (nll2 / n - mean * mean).max(0.0);
    let ppl = mean.exp();
    let ppl_stderr = if n > 1.0 {
        (var / (n - 1.0)).sqrt() * ppl
    } else {
        0.0
    };
    Ok(PerplexityReport {
        num_chunks,
        num_scored: token_logprobs.len(),
        ppl,
        ppl_stderr,
        running,
        token_logprobs,
        mean_kl,
    })
}

/// `KL(softmax(p) ‖ softmax(q))` of two logit rows, in nats, summed in f64.
pub fn kl_divergence(p_logits: &[f32], q_logits: &[f32]) -> f64 {
    let lse = |l: &[f32]| {
        let m = l.iter().copied().fold(f32::NEG_INFINITY, f32::max) as f64;
        m + l.iter().map(|&x| (x as f64 - m).exp()).sum::<f64>().ln()
    };
    let (lp, lq) = (lse(p_logits), lse(q_logits));
    p_logits
        .iter()
        .zip(q_logits)
        .map(|(&a, &b)| {
            let (la, lb) = (a as f64 - lp, b as f64 - lq);
            la.exp() * (la - lb)
        })
        .sum()
}

#[cfg(test)]
mod tests {
    use super::kl_divergence;

    #[test]
    fn kl_is_zero_for_equal_rows_and_positive_otherwise() {
        let a = [1.0f32, 2.0, 0.5];
        assert!(kl_divergence(&a, &a).abs() < 1e-12);
        assert!(kl_divergence(&a, &[0.0, 2.0, 0.5]) > 0.0);
        // Shift invariance: logits are defined up to a constant.
        assert!(kl_divergence(&a, &[11.0, 12.0, 10.5]).abs() < 1e-9);
    }
}
