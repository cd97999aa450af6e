//! cuBLAS, loaded at run time: the f32 matrix product `y[rows, out] = x[rows, in] · W[out, in]ᵀ`
//! on row-major buffers, in true f32 (cuBLAS's default math mode: no TF32 unless
//! `NVIDIA_TF32_OVERRIDE` asks for it) — the speed reference of the forward pass's own
//! batch-invariant `linear_f32` kernel (cuBLAS chooses its algorithm by shape, so a row's result
//! may depend on the batch).
//!
//! Owns the handle and that one call. It never allocates (buffers are [`crate::Gpu`]'s).

use std::ffi::{c_int, c_void};

use libloading::Library;

use crate::driver::{DeviceBuffer, Gpu};
use crate::error::CudaError;
use crate::library::{self, symbol};

type Handle = *mut c_void;
type Status = c_int;
const OP_N: c_int = 0;
const OP_T: c_int = 1;

#[derive(Clone, Copy)]
struct Fns {
    create: unsafe extern "C" fn(*mut Handle) -> Status,
    destroy: unsafe extern "C" fn(Handle) -> Status,
    #[allow(clippy::type_complexity)]
    sgemm: unsafe extern "C" fn(
        Handle,
        c_int,
        c_int,
        c_int,
        c_int,
        c_int,
        *const f32,
        *const f32,
        c_int,
        *const f32,
        c_int,
        *const f32,
        *mut f32,
        c_int,
    ) -> Status,
}

/// A cuBLAS handle on the current device's default stream.
pub struct Cublas {
    fns: Fns,
    handle: Handle,
    _lib: Library,
}

// SAFETY: a cuBLAS handle may be used from any thread, one call at a time; `&mut self` on
// every call serialises them.
unsafe impl Send for Cublas {}

impl Cublas {
    /// Opens cuBLAS (`AGENTKV_LIBCUBLAS`, else the loader's search path) on `gpu`'s context.
    pub fn new(gpu: &Gpu) -> Result<Cublas, CudaError> {
        gpu.synchronize()?; // makes the context current on this thread
        let (lib, path) = library::open(&library::CUBLAS)?;
        // SAFETY: the C signatures of cublasCreate_v2, cublasDestroy_v2 and cublasSgemm_v2 in
        // cublas_api.h (handles are pointers, enums int, pointer mode host by default).
        let fns = unsafe {
            Fns {
                create: symbol(&lib, &path, "cublasCreate_v2\0")?,
                destroy: symbol(&lib, &path, "cublasDestroy_v2\0")?,
                sgemm: symbol(&lib, &path, "cublasSgemm_v2\0")?,
            }
        };
        let mut handle: Handle = std::ptr::null_mut();
        // SAFETY: a valid out-pointer, with a current context.
        let status = unsafe { (fns.create)(&mut handle) };
        if status != 0 {
            return Err(CudaError::Cublas {
                call: "cublasCreate",
                status,
            });
        }
        Ok(Cublas {
            fns,
            handle,
            _lib: lib,
        })
    }

    /// `y[rows, out] = x[rows, in] · w[out, in]ᵀ`, every buffer row-major f32 (`x_at` and
    /// `y_at` are element offsets into `x` and `y`).
    #[allow(clippy::too_many_arguments)]
    pub fn linear(
        &mut self,
        x: &DeviceBuffer<f32>,
        x_at: usize,
        w: &DeviceBuffer<f32>,
        y: &DeviceBuffer<f32>,
        y_at: usize,
        rows: usize,
        in_dim: usize,
        out_dim: usize,
    ) -> Result<(), CudaError> {
        if w.len() != out_dim * in_dim
            || x_at + rows * in_dim > x.len()
            || y_at + rows * out_dim > y.len()
        {
            return Err(CudaError::Invalid(format!(
                "linear {rows}×{in_dim} · ({out_dim}×{in_dim})ᵀ on buffers of {}, {}, {}",
                x.len(),
                w.len(),
                y.len()
            )));
        }
        if rows == 0 {
            return Ok(());
        }
        let dims = [rows, in_dim, out_dim].map(|d| c_int::try_from(d).ok());
        let [Some(n), Some(k), Some(m)] = dims else {
            return Err(CudaError::Invalid("linear dimensions past i32".into()));
        };
        let (alpha, beta) = (1.0f32, 0.0f32);
        // Column-major view: Yᵀ[out, rows] = (W as col-major [in, out])ᵀ · Xᵀ[in, rows].
        // SAFETY: device pointers of live buffers whose sizes were checked above cover
        // m·k, k·n and m·n elements; alpha and beta are host pointers (the default mode).
        let status = unsafe {
            (self.fns.sgemm)(
                self.handle,
                OP_T,
                OP_N,
                m,
                n,
                k,
                &alpha,
                w.device_ptr() as *const f32,
                k,
                x.device_ptr_at(x_at) as *const f32,
                k,
                &beta,
                y.device_ptr_at(y_at) as *mut f32,
                m,
            )
        };
        if status != 0 {
            return Err(CudaError::Cublas {
                call: "cublasSgemm",
                status,
            });
        }
        Ok(())
    }
}

impl Drop for Cublas {
    fn drop(&mut self) {
        // SAFETY: the handle from cublasCreate_v2, destroyed once.
        unsafe { (self.fns.destroy)(self.handle) };
    }
}
