//! `--device` / `model.device`: which processor runs the forward pass. `cpu` is this
//! machine's cores; `cuda` starts NVIDIA GPU 0 (driver, NVRTC, cuBLAS, the kernels compiled for
//! it) and fails at start, with the reason, where that cannot be done; `auto` (the default)
//! takes the GPU when it starts and the CPU otherwise, saying which in the log.
//!
//! Owns that choice only. The GPU runtime is the `cuda` crate's, the backend over it the
//! model's (`model::GpuBackend`).

use std::sync::Arc;

use anyhow::{anyhow, Result};
use cuda::ops::CudaOps;

pub use crate::config::Device;

/// What runs the forward pass, once chosen.
pub enum Chosen {
    Cpu,
    Cuda(Arc<CudaOps>),
}

impl Chosen {
    pub fn name(&self) -> &'static str {
        match self {
            Chosen::Cpu => "cpu",
            Chosen::Cuda(_) => "cuda",
        }
    }
}

fn start() -> Result<Arc<CudaOps>, cuda::CudaError> {
    let c = cuda::Cuda::start()?;
    tracing::info!(gpu = %c.gpu.info(), nvrtc = %c.nvrtc.0, "CUDA runtime started");
    Ok(Arc::new(CudaOps::new(c.gpu, c.cublas)))
}

/// Resolves `requested` on this machine.
pub fn choose(requested: Device) -> Result<Chosen> {
    match requested {
        Device::Cpu => Ok(Chosen::Cpu),
        Device::Cuda => start()
            .map(Chosen::Cuda)
            .map_err(|e| anyhow!("--device cuda: no usable NVIDIA GPU: {e}")),
        Device::Auto => match start() {
            Ok(ops) => Ok(Chosen::Cuda(ops)),
            Err(e) => {
                tracing::info!(reason = %e, "device auto: no GPU, using the CPU");
                Ok(Chosen::Cpu)
            }
        },
    }
}
