//! Finding and opening a shared library of NVIDIA's at run time: an explicit path from an
//! environment variable first, then the usual sonames through the dynamic loader's search path.
//! Owns the search order and the typed "not found" error; it never calls into a library.

use std::path::PathBuf;

use libloading::Library;

use crate::error::CudaError;

/// One library to look for: `env` may name a file to use instead of searching `names`.
pub(crate) struct LibrarySpec {
    pub what: &'static str,
    pub env: &'static str,
    pub names: &'static [&'static str],
}

pub(crate) const DRIVER: LibrarySpec = LibrarySpec {
    what: "the CUDA driver (libcuda)",
    env: "AGENTKV_LIBCUDA",
    names: &["libcuda.so.1", "libcuda.so"],
};

pub(crate) const NVRTC: LibrarySpec = LibrarySpec {
    what: "NVRTC (libnvrtc)",
    env: "AGENTKV_LIBNVRTC",
    names: &[
        "libnvrtc.so",
        "libnvrtc.so.13",
        "libnvrtc.so.12",
        "/usr/local/cuda/lib64/libnvrtc.so",
    ],
};

pub(crate) const CUBLAS: LibrarySpec = LibrarySpec {
    what: "cuBLAS (libcublas)",
    env: "AGENTKV_LIBCUBLAS",
    names: &[
        "libcublas.so",
        "libcublas.so.13",
        "libcublas.so.12",
        "/usr/local/cuda/lib64/libcublas.so",
    ],
};

/// Opens the first of `spec`'s candidates that loads; the path it used is returned beside it.
pub(crate) fn open(spec: &LibrarySpec) -> Result<(Library, String), CudaError> {
    let mut candidates: Vec<PathBuf> = Vec::new();
    if let Some(path) = std::env::var_os(spec.env).filter(|p| !p.is_empty()) {
        candidates.push(PathBuf::from(path));
    }
    candidates.extend(spec.names.iter().map(PathBuf::from));
    let mut reason = String::new();
    for path in &candidates {
        // SAFETY: loading runs the library's initialisers. These are NVIDIA's own libraries
        // (or the file an operator named in `spec.env`), whose initialisers only register the
        // library; nothing else of this process runs during the load. Exercised by the
        // `loads_nvrtc` and `a_missing_library_is_a_typed_error` tests.
        match unsafe { Library::new(path) } {
            Ok(lib) => return Ok((lib, path.display().to_string())),
            Err(e) => reason = e.to_string(),
        }
    }
    Err(CudaError::LibraryNotFound {
        what: spec.what,
        tried: candidates
            .iter()
            .map(|p| p.display().to_string())
            .collect::<Vec<_>>()
            .join(", "),
        reason,
    })
}

/// Copies function pointer `symbol` (NUL-terminated) out of `lib`.
///
/// # Safety
/// `T` must be the exact C signature of `symbol` in that library.
pub(crate) unsafe fn symbol<T: Copy>(
    lib: &Library,
    library: &str,
    symbol: &'static str,
) -> Result<T, CudaError> {
    debug_assert!(symbol.ends_with('\0'));
    // SAFETY: the caller guarantees `T` is the symbol's signature; the pointer is copied out
    // and used only while `lib` stays loaded (every holder keeps its `Library` beside it).
    match unsafe { lib.get::<T>(symbol.as_bytes()) } {
        Ok(f) => Ok(*f),
        Err(_) => Err(CudaError::SymbolMissing {
            library: library.to_string(),
            symbol: symbol.trim_end_matches('\0'),
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_missing_library_is_a_typed_error() {
        let spec = LibrarySpec {
            what: "a library that does not exist",
            env: "AGENTKV_TEST_NO_SUCH_LIBRARY",
            names: &["libagentkv-no-such-library.so.7"],
        };
        let Err(err) = open(&spec) else {
            panic!("opened a library that does not exist")
        };
        let text = err.to_string();
        assert!(matches!(err, CudaError::LibraryNotFound { .. }));
        assert!(text.contains("libagentkv-no-such-library.so.7"), "{text}");
    }
}
