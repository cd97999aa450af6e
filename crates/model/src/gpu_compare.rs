//! A forward pass held against the CPU's ([`compare_with_cpu`]): for each prompt, the CPU (the
//! engine's numerics) prefills it and decodes greedily; the other side ([`StepFn`]: the device
//! forward pass, or the CPU in llama-server's arithmetic as the yardstick of how far two
//! correct float orders drift apart on this model) is fed the same tokens (the prompt in one
//! step, then one token a step) and at every step its greedy choice and its log-probability of
//! the CPU's token are compared — the figures issue #47 asks of a GPU backend. With `HostOps`
//! this runs in the tests; with `CudaOps`, in `agentkv gpu-check --model`.
//!
//! Owns the comparison only; both forward passes are their modules'.

use cuda::ops::Ops;
use kernels::ThreadPool;

use crate::forward::{ForwardBatch, ForwardError, Scratch};
use crate::gpu_forward::{GpuForward, GpuForwardError};
use crate::kv::{KvDtype, SeqSlot};
use crate::model::Model;
use crate::numerics::{Numerics, RowKind};
use crate::ops::log_softmax_at;

#[derive(Debug, thiserror::Error)]
pub enum GpuCompareError {
    #[error("CPU: {0}")]
    Cpu(#[from] ForwardError),
    #[error(transparent)]
    Device(#[from] GpuForwardError),
    #[error("{0}")]
    Bad(String),
}

/// What [`compare_with_cpu`] found.
#[derive(Debug, Clone, Default)]
pub struct Comparison {
    /// Per prompt: decode steps before the device's greedy token first differs from the CPU's
    /// (`steps` when never).
    pub greedy_equal_steps: Vec<usize>,
    pub steps: usize,
    /// Over every step of every prompt: |device − CPU| log-probability of the CPU's token.
    pub mean_abs_dlogprob: f64,
    pub max_abs_dlogprob: f64,
}

impl std::fmt::Display for Comparison {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let all = self
            .greedy_equal_steps
            .iter()
            .filter(|&&s| s == self.steps)
            .count();
        let least = self.greedy_equal_steps.iter().min().copied().unwrap_or(0);
        write!(
            f,
            "{} prompts × {} steps: greedy tokens equal throughout on {all}, fewest equal steps \
             {least}; |Δ logprob| mean {:.5}, max {:.5}",
            self.greedy_equal_steps.len(),
            self.steps,
            self.mean_abs_dlogprob,
            self.max_abs_dlogprob
        )
    }
}

fn argmax(row: &[f32]) -> usize {
    let mut best = 0;
    for (i, &v) in row.iter().enumerate() {
        if v > row[best] {
            best = i;
        }
    }
    best
}

/// One sequence's forward steps, the other side of a comparison.
pub trait StepFn {
    /// Forgets the sequence.
    fn clear(&mut self) -> Result<(), GpuCompareError>;
    /// Runs `tokens` at `positions`; returns the logits of the tokens `logits_for` names.
    fn step(
        &mut self,
        tokens: &[u32],
        positions: &[u32],
        logits_for: &[usize],
    ) -> Result<Vec<f32>, GpuCompareError>;
}

impl<O: Ops> StepFn for GpuForward<O> {
    fn clear(&mut self) -> Result<(), GpuCompareError> {
        self.clear_slot(0);
        Ok(())
    }

    fn step(
        &mut self,
        tokens: &[u32],
        positions: &[u32],
        logits_for: &[usize],
    ) -> Result<Vec<f32>, GpuCompareError> {
        Ok(self.forward(tokens, positions, &vec![0; tokens.len()], logits_for)?)
    }
}

/// The CPU forward pass in given numerics over a contiguous f16 K/V of one sequence.
pub struct CpuSteps<'m> {
    model: &'m Model,
    numerics: Numerics,
    pool: ThreadPool,
    capacity: usize,
    kv: crate::kv_contiguous::ContiguousKv,
    scratch: Scratch,
}

impl<'m> CpuSteps<'m> {
    /// `model` on `threads` threads in `numerics`, for sequences of up to `capacity` tokens.
    pub fn new(
        model: &'m Model,
        numerics: Numerics,
        threads: usize,
        capacity: usize,
    ) -> Result<Self, GpuCompareError> {
        Ok(CpuSteps {
            model,
            numerics,
            pool: ThreadPool::new(threads.max(1)),
            capacity,
            kv: model
                .contiguous_kv(1, capacity, KvDtype::F16)
                .map_err(ForwardError::from)?,
            scratch: Scratch::default(),
        })
    }
}

impl StepFn for CpuSteps<'_> {
    fn clear(&mut self) -> Result<(), GpuCompareError> {
        self.kv = self
            .model
            .contiguous_kv(1, self.capacity, KvDtype::F16)
            .map_err(ForwardError::from)?;
        Ok(())
    }

    fn step(
        &mut self,
        tokens: &[u32],
        positions: &[u32],
        logits_for: &[usize],
    ) -> Result<Vec<f32>, GpuCompareError> {
        let slots = vec![SeqSlot(0); tokens.len()];
        let batch = ForwardBatch {
            tokens,
            positions,
            slots: &slots,
            logits_for,
            numerics: self.numerics,
            rows: &RowKind::by_step(&slots),
        };
        Ok(self
            .model
            .forward(&self.pool, &batch, &mut self.kv, &mut self.scratch)?)
    }
}

/// Runs `prompts` (each non-empty) for `steps` greedy steps on the CPU (the engine's numerics,
/// f16 K/V, `threads` threads) and on `other`.
pub fn compare_with_cpu(
    model: &Model,
    other: &mut dyn StepFn,
    prompts: &[Vec<u32>],
    steps: usize,
    threads: usize,
) -> Result<Comparison, GpuCompareError> {
    let longest = prompts.iter().map(Vec::len).max().unwrap_or(0);
    let mut cpu_side = CpuSteps::new(model, Numerics::Engine, threads, longest + steps + 1)?;
    let vocab = model.config().vocab_size;
    let mut out = Comparison {
        steps,
        ..Default::default()
    };
    let (mut sum, mut count) = (0.0f64, 0usize);
    for prompt in prompts {
        if prompt.is_empty() {
            return Err(GpuCompareError::Bad("an empty prompt".into()));
        }
        cpu_side.clear()?;
        other.clear()?;
        let mut feed: Vec<u32> = prompt.clone();
        let mut first_pos = 0usize;
        let mut equal = None;
        for step in 0..steps {
            let positions: Vec<u32> = (first_pos..first_pos + feed.len())
                .map(|p| p as u32)
                .collect();
            let last = [feed.len() - 1];
            let cpu = cpu_side.step(&feed, &positions, &last)?;
            let dev = other.step(&feed, &positions, &last)?;
            if cpu.len() != vocab || dev.len() != vocab {
                return Err(GpuCompareError::Bad(format!(
                    "logits of {} and {} for a vocabulary of {vocab}",
                    cpu.len(),
                    dev.len()
                )));
            }
            let token = argmax(&cpu);
            let d = f64::from(log_softmax_at(&dev, token) - log_softmax_at(&cpu, token)).abs();
            sum += d;
            count += 1;
            out.max_abs_dlogprob = out.max_abs_dlogprob.max(d);
            if equal.is_none() && argmax(&dev) != token {
                equal = Some(step);
            }
            first_pos += feed.len();
            feed = vec![token as u32];
        }
        out.greedy_equal_steps.push(equal.unwrap_or(steps));
    }
    other.clear()?;
    out.mean_abs_dlogprob = if count == 0 { 0.0 } else { sum / count as f64 };
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::{tiny_model, TinyArch, TinyModelSpec, TINY_FIRST_BYTE};
    use cuda::ops::HostOps;

    fn prompts(lens: &[usize]) -> Vec<Vec<u32>> {
        lens.iter()
            .enumerate()
            .map(|(i, &n)| {
                (0..n)
                    .map(|t| TINY_FIRST_BYTE + ((t * 7 + i * 31) % 200) as u32)
                    .collect()
            })
            .collect()
    }

    fn check(spec: TinyModelSpec) -> Comparison {
        let model = tiny_model(&spec).unwrap();
        let mut device = GpuForward::new(std::sync::Arc::new(HostOps), &model, 2, 200, 16).unwrap();
        let cmp = compare_with_cpu(&model, &mut device, &prompts(&[1, 5, 17, 40]), 24, 2).unwrap();
        assert!(
            cmp.greedy_equal_steps.iter().all(|&s| s == 24) && cmp.mean_abs_dlogprob < 1e-3,
            "{cmp}"
        );
        cmp
    }

    #[test]
    fn the_device_forward_pass_follows_the_cpu_on_a_tiny_llama() {
        check(TinyModelSpec::default());
    }

    #[test]
    fn the_device_forward_pass_follows_the_cpu_on_a_tiny_gemma3_with_sliding_windows() {
        // Windows of 8 positions, every third layer global: prompts longer than the window.
        check(TinyModelSpec {
            num_layers: 4,
            arch: TinyArch::Gemma3 {
                window: 8,
                pattern: 3,
            },
            ..TinyModelSpec::default()
        });
    }

    #[test]
    fn a_sequence_computes_the_same_logits_alone_and_batched_with_another() {
        let model = tiny_model(&TinyModelSpec::default()).unwrap();
        let a: Vec<u32> = (0..20).map(|t| TINY_FIRST_BYTE + t).collect();
        let b: Vec<u32> = (0..9).map(|t| TINY_FIRST_BYTE + 100 + t).collect();
        let pos = |n: usize| (0..n as u32).collect::<Vec<_>>();
        let mut alone = GpuForward::new(std::sync::Arc::new(HostOps), &model, 2, 64, 16).unwrap();
        let want = alone
            .forward(&a, &pos(a.len()), &vec![0; a.len()], &[19])
            .unwrap();
        let mut both = GpuForward::new(std::sync::Arc::new(HostOps), &model, 2, 64, 16).unwrap();
        // b first takes blocks, so a's blocks differ from the run alone.
        both.forward(&b, &pos(b.len()), &vec![1; b.len()], &[])
            .unwrap();
        let mut tokens = a[..12].to_vec();
        tokens.extend(&b[..1]);
        let mut positions = pos(12);
        positions.push(9);
        let mut slots = vec![0; 12];
        slots.push(1);
        both.forward(&tokens, &positions, &slots, &[]).unwrap();
        let got = both
            .forward(&a[12..], &(12..20).collect::<Vec<_>>(), &[0; 8], &[7])
            .unwrap();
        assert_eq!(want, got);
    }

    #[test]
    fn bad_batches_are_typed_errors() {
        let model = tiny_model(&TinyModelSpec::default()).unwrap();
        let mut d = GpuForward::new(std::sync::Arc::new(HostOps), &model, 1, 32, 16).unwrap();
        let e = d.forward(&[100_000], &[0], &[0], &[0]).unwrap_err();
        assert!(e.to_string().contains("outside the vocabulary"), "{e}");
        let e = d.forward(&[5], &[32], &[0], &[0]).unwrap_err();
        assert!(e.to_string().contains("outside the pool"), "{e}");
        let e = d.forward(&[5], &[0], &[1], &[0]).unwrap_err();
        assert!(e.to_string().contains("outside the pool"), "{e}");
        let e = d.forward(&[5], &[0], &[0], &[1]).unwrap_err();
        assert!(e.to_string().contains("logits requested"), "{e}");
    }
}
