//! [`Backend`]: what the engine needs from whatever computes the forward pass over paged K/V —
//! the model's shape, its [`Frontend`], what makes its K/V bytes differ from another backend's,
//! and one forward step. [`CpuBackend`] is today's (the [`Model`] on a [`ThreadPool`] with its
//! [`Scratch`]); a GPU backend implements the same trait, so the engine needs no change for it.
//!
//! Owns that boundary only. It never schedules, never owns the paged cache (K/V goes through the
//! engine's [`KvStore`]) and never samples.

use std::sync::Arc;

use frontend::Frontend;
use kernels::ThreadPool;

use crate::forward::{ForwardBatch, ForwardError, Scratch};
use crate::kv::{DeviceKvMemory, KvDtype, KvError, KvStore};
use crate::model::Model;

/// The sizes the engine plans with (paged K/V geometry, request checks, sampling).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ModelShape {
    pub num_layers: usize,
    pub num_kv_heads: usize,
    pub head_dim: usize,
    pub vocab_size: usize,
    /// Most tokens (prompt plus generated) one sequence may hold.
    pub context_length: usize,
}

/// One way of computing the forward pass. Implementations are deterministic: the same batch
/// over the same K/V gives the same logits bits (what the engine's cache-on/off and batching
/// identities rest on).
pub trait Backend: Send {
    /// Short lowercase name for logs and `/metrics` (`"cpu"`).
    fn name(&self) -> &'static str;
    fn shape(&self) -> ModelShape;
    /// Tokenizer, chat template and context length of the model.
    fn frontend(&self) -> &Arc<Frontend>;
    /// Identity of the weights (BLAKE3 of the model file): part of every cache key.
    fn weights_fingerprint(&self) -> [u8; 32];
    /// Settings of this backend that change the K/V it computes beyond the engine's numerics
    /// (`;`-separated `key=value` pairs, each with a leading `;`; empty when none): part of
    /// every cache key, so blocks computed differently are never shared.
    fn kv_settings(&self) -> Vec<u8>;
    /// Runs one step: writes K/V of `batch.tokens` through `kv` and returns the logits of the
    /// rows `batch.logits_for` names, `[logits_for.len(), vocab_size]`.
    fn forward(
        &mut self,
        batch: &ForwardBatch<'_>,
        kv: &mut dyn KvStore,
    ) -> Result<Vec<f32>, ForwardError>;

    /// The engine's paged K/V pool of `num_blocks` blocks of `block_size` positions in this
    /// backend's memory, when its forward pass runs on a device: the engine then keeps every
    /// block there, moves blocks to and from the tiers through it, and hands [`Self::forward`]
    /// views of it. `None` (the default): the pool is host memory.
    fn device_kv_memory(
        &mut self,
        num_blocks: usize,
        block_size: usize,
        dtype: KvDtype,
    ) -> Option<Result<Box<dyn DeviceKvMemory>, KvError>> {
        let _ = (num_blocks, block_size, dtype);
        None
    }
}

/// The forward pass on this machine's CPU cores.
pub struct CpuBackend {
    model: Arc<Model>,
    pool: ThreadPool,
    scratch: Scratch,
    fingerprint: [u8; 32],
}

impl CpuBackend {
    /// `model` on a pool of `threads` threads (at least one).
    pub fn new(model: Arc<Model>, threads: usize) -> CpuBackend {
        let fingerprint = model.fingerprint();
        CpuBackend {
            model,
            pool: ThreadPool::new(threads.max(1)),
            scratch: Scratch::default(),
            fingerprint,
        }
    }

    pub fn model(&self) -> &Arc<Model> {
        &self.model
    }
}

impl Backend for CpuBackend {
    fn name(&self) -> &'static str {
        "cpu"
    }

    fn shape(&self) -> ModelShape {
        let c = &self.model.config;
        ModelShape {
            num_layers: c.num_layers,
            num_kv_heads: c.num_kv_heads,
            head_dim: c.head_dim,
            vocab_size: c.vocab_size,
            context_length: c.context_length,
        }
    }

    fn frontend(&self) -> &Arc<Frontend> {
        &self.model.frontend
    }

    fn weights_fingerprint(&self) -> [u8; 32] {
        self.fingerprint
    }

    fn kv_settings(&self) -> Vec<u8> {
        let c = &self.model.config;
        if c.rope_scaling.is_scaled() || self.model.weights.rope_long_short.is_some() {
            // Scaled RoPE computed as llama.cpp does (linear in ggml's order, YaRN, longrope,
            // Gemma's sliding-window layers unscaled): apart from blocks of the earlier rule.
            b";rope-scaling=llama.cpp".to_vec()
        } else {
            Vec::new()
        }
    }

    fn forward(
        &mut self,
        batch: &ForwardBatch<'_>,
        kv: &mut dyn KvStore,
    ) -> Result<Vec<f32>, ForwardError> {
        let m = &*self.model;
        crate::forward::forward(
            &m.config,
            &m.weights,
            &m.rope,
            m.rope_local.as_ref(),
            &self.pool,
            batch,
            kv,
            &mut self.scratch,
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::numerics::{Numerics, RowKind};
    use crate::testing::{tiny_model, TinyModelSpec};

    #[test]
    fn cpu_backend_states_the_models_shape_and_runs_its_forward_pass() {
        let model = Arc::new(tiny_model(&TinyModelSpec::default()).unwrap());
        let mut backend = CpuBackend::new(model.clone(), 2);
        let shape = backend.shape();
        assert_eq!(shape.vocab_size, model.config.vocab_size);
        assert_eq!(shape.num_layers, model.config.num_layers);
        assert_eq!(backend.name(), "cpu");
        assert!(
            backend.kv_settings().is_empty(),
            "no scaled RoPE in the tiny model"
        );
        assert_eq!(backend.weights_fingerprint(), model.fingerprint());

        // The backend's step is the model's, bit for bit.
        let tokens = [1u32, 2, 3];
        let positions = [0u32, 1, 2];
        let mut kv_a = model.contiguous_kv(1, 8, crate::kv::KvDtype::F32).unwrap();
        let mut kv_b = model.contiguous_kv(1, 8, crate::kv::KvDtype::F32).unwrap();
        let batch = ForwardBatch {
            tokens: &tokens,
            positions: &positions,
            slots: &[crate::kv::SeqSlot(0); 3],
            logits_for: &[2],
            numerics: Numerics::Explicit {
                attention: crate::forward::AttnArith::Tiled,
                matmul: crate::forward::MatmulArith::Invariant,
            },
            rows: &RowKind::by_step(&[crate::kv::SeqSlot(0); 3]),
        };
        let via_backend = backend.forward(&batch, &mut kv_a).unwrap();
        let direct = model
            .forward(
                &ThreadPool::new(1),
                &batch,
                &mut kv_b,
                &mut Scratch::default(),
            )
            .unwrap();
        assert_eq!(via_backend.len(), shape.vocab_size);
        assert_eq!(
            via_backend.iter().map(|x| x.to_bits()).collect::<Vec<_>>(),
            direct.iter().map(|x| x.to_bits()).collect::<Vec<_>>()
        );
    }
}
