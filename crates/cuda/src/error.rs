//! [`CudaError`]: every way loading or using a GPU can fail, typed, with the library, call and
//! code named. Owns the error type only.

use thiserror::Error;

#[derive(Debug, Error)]
pub enum CudaError {
    /// None of a library's names could be opened (no driver, toolkit or wheel installed).
    #[error("{what} not found: tried {tried}; last error: {reason}")]
    LibraryNotFound {
        what: &'static str,
        tried: String,
        reason: String,
    },
    /// The library opened but lacks a function this crate calls (too old a version).
    #[error("{library} has no symbol {symbol} (too old a version?)")]
    SymbolMissing {
        library: String,
        symbol: &'static str,
    },
    /// A CUDA driver call returned an error.
    #[error("CUDA driver call {call} failed: {name} ({code})")]
    Driver {
        call: &'static str,
        code: i32,
        name: String,
    },
    /// The driver loaded but reports no device.
    #[error("the CUDA driver reports no GPU")]
    NoDevice,
    /// NVRTC refused a kernel source; `log` is its compile log.
    #[error("NVRTC could not compile {source_name}: {message}\n{log}")]
    Compile {
        source_name: String,
        message: String,
        log: String,
    },
    /// A cuBLAS call returned an error status.
    #[error("cuBLAS call {call} failed with status {status}")]
    Cublas { call: &'static str, status: i32 },
    /// A launch or copy whose arguments do not fit the kernel or the buffers.
    #[error("{0}")]
    Invalid(String),
}
