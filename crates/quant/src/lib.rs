//! KV-cache row codecs and the attention kernels that read encoded rows directly.
//!
//! A *row* is one token × one KV head: `head_dim` f32 values. [`KvCodecKind`] names a codec
//! (f32, f16, bf16, fp8 e4m3, int8, int4, and int8h/int4h: int8/int4 of the Walsh–Hadamard-rotated
//! row, which spreads K's outlier channels — K and V may use different ones), its stable id and
//! version (for the cache namespace) and its exact bytes per row. [`encode_row`] computes scales
//! and offsets online from the row being written; [`decode_row`] undoes it; [`dot_row`] /
//! [`PreparedQuery::dot`] (scores) and [`axpy_row`] (weighted values) work on the encoded bytes
//! without materialising a dequantised block. Error bounds are documented in [`row`].
//!
//! Pure: no I/O, no threads, no allocation on the kernel paths. SIMD (AVX2+FMA+F16C) is chosen
//! at runtime and is bit-identical to the portable path. Design note: `docs/quantization.md`.

mod affine;
#[cfg(target_arch = "x86_64")]
mod avx2;
#[cfg(target_arch = "x86_64")]
mod avx512;
mod axpy;
pub mod canonical;
pub mod channel;
mod codecs;
mod dispatch;
mod dot;
mod error;
pub mod fp8;
mod hadamard;
mod isa;
mod kind;
mod layout;
pub mod row;
mod row_drivers;
mod rows;
mod scalar;
mod tile;
pub mod transcode;

pub use affine::F16_MAX;
pub use axpy::{
    axpy_row, axpy_row_stored, axpy_row_stored_with, axpy_row_with, unrotate_stored_sum,
};
pub use channel::ChannelQuery;
pub use codecs::KvCodecs;
pub use dot::{dot_row, dot_row_with, PreparedQuery};
pub use error::QuantError;
pub use hadamard::hadamard_rotate;
pub use isa::Isa;
pub use kind::{
    KvCodecKind, DEFAULT_CHANNEL_TOKENS, DEFAULT_INT4_GROUP, DEFAULT_INT8_GROUP, FP8_SCALE_BYTES,
    INT_PARAM_BYTES_PER_GROUP,
};
pub use row::{decode_row, decode_row_with, encode_row, encode_row_to_vec, encode_row_with};
pub use rows::EncodedRows;
pub use tile::{decode_rows, decode_rows_with};
pub use transcode::{serialized_len, transcode_rows};
