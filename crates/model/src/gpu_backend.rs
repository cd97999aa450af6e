//! [`GpuBackend`]: the engine's [`Backend`] on a device — the forward pass of [`GpuModel`]
//! over the engine's paged K/V pool, which lives in the device's memory ([`DeviceBlocks`],
//! handed to the engine by [`Backend::device_kv_memory`]) and which the engine's block tables
//! index directly. With `CudaOps` that is the GPU; with `HostOps`, each kernel's definition on
//! the CPU, which is how the engine's GPU path is tested on machines without one.
//!
//! Owns that adaptation only: the engine schedules, shares and evicts blocks as on the CPU.

use std::sync::{Arc, Mutex};

use cuda::ops::Ops;
use frontend::Frontend;

use crate::backend::{Backend, ModelShape};
use crate::forward::{ForwardBatch, ForwardError};
use crate::gpu_forward::{GpuForwardError, GpuModel};
use crate::gpu_kv::{DeviceBlocks, DevicePool};
use crate::kv::{DeviceKvMemory, KvDtype, KvError, KvStore};
use crate::model::Model;

/// A model's forward pass on a device, for the engine.
pub struct GpuBackend<O: Ops> {
    model: GpuModel<O>,
    shape: ModelShape,
    frontend: Arc<Frontend>,
    fingerprint: [u8; 32],
    scaled_rope: bool,
    /// The engine's pool, once [`Backend::device_kv_memory`] made it.
    pool: Option<Arc<Mutex<DevicePool<O>>>>,
}

impl<O: Ops> GpuBackend<O> {
    /// `model`'s weights on `ops`' device.
    pub fn new(ops: Arc<O>, model: &Model) -> Result<Self, GpuForwardError> {
        let c = model.config();
        Ok(GpuBackend {
            shape: ModelShape {
                num_layers: c.num_layers,
                num_kv_heads: c.num_kv_heads,
                head_dim: c.head_dim,
                vocab_size: c.vocab_size,
                context_length: c.context_length,
            },
            frontend: model.frontend().clone(),
            fingerprint: model.fingerprint(),
            scaled_rope: c.rope_scaling.is_scaled() || model.weights().rope_long_short.is_some(),
            model: GpuModel::new(ops, model)?,
            pool: None,
        })
    }
}

impl<O: Ops> Backend for GpuBackend<O> {
    fn name(&self) -> &'static str {
        self.model.ops().name()
    }

    fn shape(&self) -> ModelShape {
        self.shape
    }

    fn frontend(&self) -> &Arc<Frontend> {
        &self.frontend
    }

    fn weights_fingerprint(&self) -> [u8; 32] {
        self.fingerprint
    }

    fn kv_settings(&self) -> Vec<u8> {
        // Another arithmetic than the CPU's (f32 weights, the device's summation orders): its
        // blocks are never shared with a CPU server's.
        let mut s = b";backend=device-f32".to_vec();
        if self.scaled_rope {
            s.extend_from_slice(b";rope-scaling=llama.cpp");
        }
        s
    }

    fn forward(
        &mut self,
        batch: &ForwardBatch<'_>,
        kv: &mut dyn KvStore,
    ) -> Result<Vec<f32>, ForwardError> {
        let tables = kv.device_tables().ok_or_else(|| {
            ForwardError::Device("the device backend runs over its own K/V memory only".into())
        })?;
        let pool = self
            .pool
            .as_ref()
            .ok_or_else(|| ForwardError::Device("the device K/V pool was never made".into()))?;
        let mut pool = pool.lock().unwrap_or_else(|p| p.into_inner());
        let slots: Vec<usize> = batch.slots.iter().map(|s| s.0 as usize).collect();
        self.model
            .step(
                &mut pool,
                tables,
                batch.tokens,
                batch.positions,
                &slots,
                batch.logits_for,
            )
            .map_err(|e| match e {
                GpuForwardError::BadBatch(m) => ForwardError::BadBatch(m),
                e => ForwardError::Device(e.to_string()),
            })
    }

    fn device_kv_memory(
        &mut self,
        num_blocks: usize,
        block_size: usize,
        dtype: KvDtype,
    ) -> Option<Result<Box<dyn DeviceKvMemory>, KvError>> {
        if dtype != KvDtype::F16 {
            return Some(Err(KvError::Codec(format!(
                "the device keeps K/V in f16 only, not {dtype}"
            ))));
        }
        let layout = self.model.kv_layout(num_blocks, block_size);
        Some(DevicePool::new(&**self.model.ops(), layout).map(|pool| {
            let pool = Arc::new(Mutex::new(pool));
            self.pool = Some(pool.clone());
            Box::new(DeviceBlocks::new(self.model.ops().clone(), pool)) as Box<dyn DeviceKvMemory>
        }))
    }
}
