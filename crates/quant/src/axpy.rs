//! `acc += w · dequant(row)` computed straight from encoded bytes (the attention value kernel).
//!
//! Owns the weighted-sum arithmetic per codec: each element is dequantised in a register
//! (`x̂ = code·scale + offset` for integer codecs, `e4m3(code)·scale` for fp8) and accumulated
//! with one fused multiply-add, `acc[i] = fma(w, x̂[i], acc[i])` — bit-identical to
//! `decode_row` followed by a fused f32 axpy, on both instruction-set paths.
//!
//! Rotated codecs (`int8h`, `int4h`) store `H·x`. [`axpy_row`] rotates each row back (exact
//! semantics, one transform per row); attention instead sums the rows as stored with
//! [`axpy_row_stored`] and rotates the sum once with [`unrotate_stored_sum`] (`Σ w·H·x̂ᵣ =
//! H·Σ w·x̂ᵣ`, `H` linear). It never writes rows.

use crate::dispatch::pick;
use crate::hadamard;
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
    if kind.is_rotated() {
        return hadamard::with_scratch(acc.len(), |row| {
            crate::row::decode_row_with(isa, kind, bytes, row)
                .expect("shape checked by assert_row");
            for (a, &x) in acc.iter_mut().zip(row.iter()) {
                *a = w.mul_add(x, *a);
            }
        });
    }
    axpy_stored(isa, kind, w, bytes, acc)
}

/// `acc += w · stored(bytes)`: as [`axpy_row`], except that a rotated codec's row is added as
/// stored (rotated, `H·x̂`), so that a weighted sum of many rows needs one
/// [`unrotate_stored_sum`] at the end instead of one rotation per row. Identical to
/// [`axpy_row`] for every other codec.
///
/// # Panics
/// As [`axpy_row`].
pub fn axpy_row_stored(kind: KvCodecKind, w: f32, bytes: &[u8], acc: &mut [f32]) {
    axpy_row_stored_with(Isa::detect(), kind, w, bytes, acc)
}

/// [`axpy_row_stored`] on an explicit instruction-set path.
#[track_caller]
pub fn axpy_row_stored_with(isa: Isa, kind: KvCodecKind, w: f32, bytes: &[u8], acc: &mut [f32]) {
    assert_row(kind, acc.len(), bytes.len());
    axpy_stored(isa, kind, w, bytes, acc)
}

/// Turns a sum built with [`axpy_row_stored`] (starting from zero) into the sum of the decoded
/// rows: rotates `acc` back for a rotated codec, leaves it as is otherwise.
///
/// # Panics
/// If `kind` rejects `acc.len()` (a caller bug, as in [`axpy_row`]).
#[track_caller]
pub fn unrotate_stored_sum(kind: KvCodecKind, acc: &mut [f32]) {
    if let Err(e) = kind.validate(acc.len()) {
        panic!(
            "unrotate_stored_sum: {kind} with head_dim {}: {e}",
            acc.len()
        );
    }
    if kind.is_rotated() {
        hadamard::fwht(acc);
    }
}

/// The weighted sum of one row as stored, shape checked.
fn axpy_stored(isa: Isa, kind: KvCodecKind, w: f32, bytes: &[u8], acc: &mut [f32]) {
    let head_dim = acc.len();
    match kind {
        KvCodecKind::F32 => pick!(isa, axpy_f32(w, bytes, acc)),
        KvCodecKind::F16 => pick!(isa, axpy_f16(w, bytes, acc)),
        KvCodecKind::Bf16 => pick!(isa, axpy_bf16(w, bytes, acc)),
        KvCodecKind::Fp8E4m3 => {
            let (scale, codes) = split_fp8(bytes);
            pick!(isa, axpy_e4m3(w, scale, codes, acc))
        }
        KvCodecKind::Int4Channel { .. } => unreachable!("assert_row rejects block codecs"),
        KvCodecKind::Int8 { group }
        | KvCodecKind::Int4 { group }
        | KvCodecKind::Int8Hadamard { group }
        | KvCodecKind::Int4Hadamard { group } => {
            let four_bit = matches!(kind.storage(), KvCodecKind::Int4 { .. });
            let (params, codes) = split_int(bytes, head_dim, group);
            pick!(isa, axpy_int_row(w, params, codes, group, four_bit, acc))
        }
    }
}
