//! NVIDIA GPUs for agentkv, with nothing of CUDA needed to build: the driver, NVRTC and cuBLAS
//! are opened at run time (`dlopen`; `AGENTKV_LIBCUDA`, `AGENTKV_LIBNVRTC` and
//! `AGENTKV_LIBCUBLAS` may name the files), the kernels ship as CUDA C source compiled by
//! NVRTC for the device at start, and every failure is a typed [`CudaError`] — on a machine
//! without a driver, [`probe`] says so and nothing else changes.
//!
//! Owns the FFI and its `unsafe`, device memory, launches checked against the kernel table,
//! and the kernel-level device check ([`selfcheck`]). It never knows a model, a batch or the
//! paged cache's bookkeeping: the GPU backend drives it.

mod cublas;
mod driver;
mod error;
pub mod kernels;
mod library;
mod nvrtc;
pub mod ops;
pub mod selfcheck;
pub mod timing;

pub use cublas::Cublas;
pub use driver::{probe, Arg, DeviceBuffer, DeviceInfo, DeviceScalar, Gpu};
pub use error::CudaError;
pub use nvrtc::Nvrtc;

/// A started GPU: device 0 with every kernel compiled for it and loaded, and a cuBLAS handle.
pub struct Cuda {
    pub gpu: Gpu,
    pub cublas: Cublas,
    /// NVRTC's path and version, for logs and reports.
    pub nvrtc: (String, (i32, i32)),
}

impl Cuda {
    /// Loads the driver and NVRTC, compiles the kernels for device 0 and opens cuBLAS.
    pub fn start() -> Result<Cuda, CudaError> {
        let info = probe()?;
        let nvrtc = Nvrtc::load()?;
        let ptx = kernels::compile_all(&nvrtc, &info.arch())?;
        let gpu = Gpu::open(&ptx)?;
        let cublas = Cublas::new(&gpu)?;
        Ok(Cuda {
            gpu,
            cublas,
            nvrtc: (nvrtc.path().to_string(), nvrtc.version()),
        })
    }
}
