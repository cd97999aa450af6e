//! `--device` / `model.device`: which processor runs the forward pass. `cpu` is this
//! machine's cores; `cuda` starts NVIDIA GPU 0 (driver, NVRTC, cuBLAS, the kernels compiled for
//! it and checked against their definitions) and fails at start, with the reason, where that
//! cannot be done; `auto` (the default) takes the GPU when it starts and passes the check, and
//! the CPU otherwise, saying which in the log.
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

/// Starts the runtime and runs the kernel self-check (`cuda::selfcheck`, milliseconds on a
/// GPU): a device whose kernels disagree with their definitions is never served from.
fn start() -> Result<Arc<CudaOps>, cuda::CudaError> {
    let c = cuda::Cuda::start()?;
    tracing::info!(gpu = %c.gpu.info(), nvrtc = %c.nvrtc.0, "CUDA runtime started");
    let ops = CudaOps::new(c.gpu, c.cublas);
    let failed: Vec<String> = cuda::selfcheck::run_all(&ops, 7)?
        .into_iter()
        .filter(|r| !r.passed)
        .map(|r| r.to_string())
        .collect();
    if !failed.is_empty() {
        return Err(cuda::CudaError::Invalid(format!(
            "the GPU kernels' self-check failed: {}",
            failed.join("; ")
        )));
    }
    Ok(Arc::new(ops))
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
