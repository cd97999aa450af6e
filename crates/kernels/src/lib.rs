//! CPU compute kernels: the hot path of the forward pass, and (nearly) all of the workspace's
//! `unsafe` — each block with a `// SAFETY:` note and tests of bit-identity beside it.
//!
//! Owns the thread pool ([`pool`]), runtime CPU feature detection ([`cpu`]), f32 vector primitives
//! ([`vec_f32`]: `dot_f32`, `axpy_f32`; [`vec_f16`]: the same with an f16 operand widened on
//! load; [`flash_f16`]: ggml's flash-attention primitives with an f16 accumulator), SwiGLU with
//! ggml's vectorised `expf` ([`swiglu`]), activation quantisation to 8-bit blocks ([`act_quant`]),
//! per-block integer dot products for the 32-element quant types ([`block32`], with a portable
//! scalar path and an AVX2 path; row-interleaved Q4_0 / Q4_1 / Q5_0 / Q8_0 matrices packed at load and
//! their 16-rows-per-instruction kernels: [`packed32`]), the same for the K-quant super-block types Q4_K / Q5_K / Q6_K
//! against 256-element activation blocks ([`kquant`], AVX2 / VNNI tiles in `kquant_tile`, their unpacking in `kquant_avx2`, the driver in `kquant_rows`), row conversion to f32 for everything else ([`row_f32`]) and the
//! matrix-times-activations driver ([`matmul`]; several matrices sharing one input in one dispatch:
//! [`matmul_many`]), llama.cpp's tiled flash attention reproduced op for op ([`ggml_tiled`]),
//! disjoint row access from parallel tasks ([`par`]) and huge-page buffers ([`hugepages`]). It
//! never reads files, never allocates per task,
//! and never decides what a model layer is.
//!
//! Register widths. A definition runs at the widest width the CPU proves, chosen in one place
//! per definition; where an AVX2 and an AVX-512 body both exist they differ in more than the
//! lane count (a body that would differ only in width is one body compiled for both, as
//! `ggml_tiled`'s portable body is for AVX-512):
//!
//! | definition | chosen in | 256-bit body | 512-bit body | what differs besides width |
//! |---|---|---|---|---|
//! | attention tile over transposed K | [`flash_tile_transposed`] | [`flash_tile_narrow`] | [`flash_tile_wide`] | a row's 16 scores are two vectors, not one; 16 registers run a triple's eight lane chains as four pairs, 32 hold them all |
//! | K-quant integer tile | `kquant_rows` | `kquant_tile` (`maddubs` + `madd`, or 256-bit `vpdpwssd`) | `kquant_tile512` | two 32-element vectors per register under per-chunk scale index tables, halves added before the float operations |
//! | packed 32-element prefill | `packed32_run` | `packed32_prefill_avx2` | `packed32_prefill` | eight lane accumulators per token do not fit 16 registers: a lane-by-lane sweep with `maddubs`, against 3-token tiles of `vpdpbusd` with a broadcast memory operand |
//! | llama.cpp's tiled attention | [`ggml_tiled`] | `ggml_tiled/avx2` (register-blocked rows) | the portable body compiled for AVX-512 | — |
//!
//! Numerical contract (the engine relies on it):
//! - **Batch invariance.** `y[t, r]` of [`matmul`] is bit-identical whatever `num_tokens` is,
//!   whatever position `t` has in the batch, whatever the thread count and task split: every
//!   output element is produced by one fixed sequence of float operations.
//! - **Path invariance.** The portable scalar path reproduces the AVX2 path's exact operation
//!   order (same lane partial sums, same fused multiply-adds, same horizontal reduction), so both
//!   give bit-identical results; tests pin this. Packed 32-element matrices have two such
//!   orders ([`PackedDef`]); which one a call takes is part of its [`MatmulArith`], never of the
//!   path, the batch or the thread split.

pub mod act_quant;
pub mod block32;
mod both_ends;
pub mod coded_pair_layout;
pub mod cpu;
pub mod flash_f16;
pub mod flash_tile;
pub mod flash_tile_codes;
pub mod flash_tile_narrow;
pub mod flash_tile_pairs;
pub mod flash_tile_pairs_coded;
pub mod flash_tile_transposed;
pub mod flash_tile_wide;
pub mod ggml_tiled;
pub mod hugepages;
pub mod kquant;
#[cfg(target_arch = "x86_64")]
mod kquant_avx2;
mod kquant_rows;
#[cfg(target_arch = "x86_64")]
mod kquant_tile;
#[cfg(target_arch = "x86_64")]
mod kquant_tile512;
pub mod matmul;
pub mod matmul_many;
mod out_ptr;
pub mod packed32;
mod packed32_blocksum;
#[cfg(target_arch = "x86_64")]
mod packed32_prefill;
#[cfg(target_arch = "x86_64")]
mod packed32_prefill_avx2;
mod packed32_run;
#[cfg(target_arch = "x86_64")]
mod packed32_x86;
mod page_prefetch;
pub mod pair_layout;
pub mod pair_layout_groups;
pub mod par;
pub mod peak;
pub mod pool;
pub mod row_f32;
pub mod swiglu;
pub mod thread_cpu;
pub mod vec_f16;
pub mod vec_f32;

#[cfg(test)]
mod tests;
#[cfg(test)]
mod tests_kquant;

pub use cpu::{cpu_features, set_force_portable, CpuFeatures};
pub use kquant_rows::matmul_kquant_f32;
pub use matmul::{matmul, matmul_with_arith, matmul_with_features, MatmulArith, QMatrix};
pub use matmul_many::{matmul_many, matmul_many_with_arith, matmul_many_with_features, MAX_FUSED};
pub use packed32::{Packed32, PackedDef};
pub use pool::ThreadPool;
pub use vec_f16::{axpy_f16, dot_f32_f16};
pub use vec_f32::{axpy_f32, dot_f32};

use gguf::GgmlType;

/// Errors from kernel entry points; all are caller bugs or malformed tensors, never panics.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum KernelError {
    /// `row_len` is not a whole number of blocks of the weight type.
    #[error("row length {row_len} is not a multiple of the {ty:?} block size {block_elems}")]
    RowLenNotBlockMultiple {
        ty: GgmlType,
        row_len: usize,
        block_elems: usize,
    },
    /// The weight byte slice does not hold exactly `num_rows` rows.
    #[error("weight data has {actual} bytes, expected {expected} ({num_rows} rows of {ty:?})")]
    WeightBytes {
        ty: GgmlType,
        num_rows: usize,
        expected: usize,
        actual: usize,
    },
    /// The activation slice is not `[num_tokens, row_len]`.
    #[error("activations have {actual} elements, expected {expected} = num_tokens * row_len")]
    ActivationLen { expected: usize, actual: usize },
    /// The output slice is not `[num_tokens, num_rows]`.
    #[error("output has {actual} elements, expected {expected} = num_tokens * num_rows")]
    OutputLen { expected: usize, actual: usize },
    /// A fused call got a different number of matrices and outputs.
    #[error("{matrices} matrices but {outputs} outputs")]
    FusedCount { matrices: usize, outputs: usize },
    /// The weight type has no row-interleaved layout (only Q4_0, Q4_1 and Q8_0 do).
    #[error("{ty:?} weights cannot be packed")]
    NotPackable { ty: GgmlType },
    /// A packed matrix does not describe the same matrix as its `QMatrix`.
    #[error("packed matrix does not match its weights ({ty:?}, {num_rows} x {row_len})")]
    PackedMismatch {
        ty: GgmlType,
        num_rows: usize,
        row_len: usize,
    },
    /// A size computation overflowed `usize`.
    #[error("shape overflows usize")]
    Overflow,
}
