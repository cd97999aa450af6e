//! `--device` / `model.device`: which processor runs the forward pass. `cpu` is this
//! machine's cores; `cuda` asks for NVIDIA GPU 0 and fails at start, with the reason, where
//! there is none; `auto` (the default) takes the GPU when one can run the model and the CPU
//! otherwise, saying which in the log.
//!
//! Owns that choice only. The GPU runtime is the `cuda` crate's; which backend serves is the
//! engine's, given the choice.

use anyhow::{bail, Result};

pub use crate::config::Device;

/// What runs the forward pass, once chosen.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Chosen {
    Cpu,
}

/// Resolves `requested` on this machine. The CUDA backend's kernels, memory and cuBLAS run
/// (`agentkv gpu-check`), but it does not run a model's forward pass yet: `cuda` is refused
/// with what was found, and `auto` chooses the CPU.
pub fn choose(requested: Device) -> Result<Chosen> {
    match requested {
        Device::Cpu => Ok(Chosen::Cpu),
        Device::Cuda => match cuda::probe() {
            Err(e) => bail!("--device cuda: no usable NVIDIA GPU: {e}"),
            Ok(info) => bail!(
                "--device cuda: found {info}, but this build runs models on the CPU only (its \
                 CUDA kernels are checked by `agentkv gpu-check`; the GPU forward pass is not \
                 in it yet): use --device cpu or auto"
            ),
        },
        Device::Auto => {
            match cuda::probe() {
                Ok(info) => tracing::info!(
                    gpu = %info,
                    "device auto: a GPU is present but this build runs models on the CPU only"
                ),
                Err(e) => tracing::info!(reason = %e, "device auto: no GPU, using the CPU"),
            }
            Ok(Chosen::Cpu)
        }
    }
}
