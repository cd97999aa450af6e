//! `acc += w · dequant(row)` computed straight from encoded bytes (the attention value kernel).
//!
//! Owns the weighted-sum arithmetic per codec: each element is dequantised in a register
//! (`x̂ = code·scale + offset` for integer codecs, `e4m3(code)·scale` for fp8) and accumulated
//! with one fused multiply-add, `acc[i] = fma(w, x̂[i], acc[i])` — bit-identical to
//! `decode_row` followed by a fused f32 axpy, on both instruction-set paths. It never writes rows.

use crate::dispatch::pick;
use crate::isa::Isa;
use crate::kind::KvCodecKind;
use crate::layout::{assert_row, split_fp8, split_int};

/// `acc += w · dequant(bytes)`; `acc` is `[head_dim]`.
///
/// # Panics
/// If `kind` rejects `acc.len()` or `bytes` is not `kind.bytes_per_row(acc.len())` long (a
/// caller bug: shapes are fixed when the KV store is built).
pub fn axpy_row(kind: KvCodecKind, w: f32, bytes: &[u8], acc: &mut [f32]) {
    axpy_row_with(Isa::detect(), kind, w, bytes, acc)
}

/// [`axpy_row`] on an explicit instruction-set path (bit-identical results on every path).
#[track_caller]
pub fn axpy_row_with(isa: Isa, kind: KvCodecKind, w: f32, bytes: &[u8], acc: &mut [f32]) {
    assert_row(kind, acc.len(), bytes.len());
    let head_dim = acc.len();
    match kind {
        KvCodecKind::F32 => pick!(isa, axpy_f32(w, bytes, acc)),
        KvCodecKind::F16 => pick!(isa, axpy_f16(w, bytes, acc)),
        KvCodecKind::Bf16 => pick!(isa, axpy_bf16(w, bytes, acc)),
        KvCodecKind::Fp8E4m3 => {
            let (scale, codes) = split_fp8(bytes);
            pick!(isa, axpy_e4m3(w, scale, codes, acc))
        }
        KvCodecKind::Int8 { group } | KvCodecKind::Int4 { group } => {
            let four_bit = matches!(kind, KvCodecKind::Int4 { .. });
            let (params, codes) = split_int(bytes, head_dim, group);
            pick!(isa, axpy_int_row(w, params, codes, group, four_bit, acc))
        }
    }
}
