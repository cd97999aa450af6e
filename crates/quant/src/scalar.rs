//! Portable kernels over the codes of one row (or one channel group): dot with a query, fused
//! `acc += w·x̂`, decode, and the per-value encoders (integer codes, f16, bf16, fp8). Bit-identical to `avx2.rs` by construction (same operations in the
//! canonical order of `canonical.rs`).
//!
//! Slices are element-indexed views into encoded rows; callers pass matching lengths (checked
//! with indexing, so a caller bug panics rather than reading out of bounds). Never allocates.

use crate::affine::dequant;
use crate::canonical::dot_by;
use crate::fp8::{e4m3_to_f32, f32_to_e4m3, E4M3_MAX};
use crate::kind::FP8_SCALE_BYTES;
use crate::layout::{f32_at, u16_at, u4_at};
use half::{bf16, f16};

#[inline(always)]
fn f16_at(b: &[u8], i: usize) -> f32 {
    f16::from_bits(u16_at(b, i)).to_f32()
}

#[inline(always)]
fn bf16_at(b: &[u8], i: usize) -> f32 {
    bf16::from_bits(u16_at(b, i)).to_f32()
}

pub(crate) fn sum(q: &[f32]) -> f32 {
    crate::canonical::sum(q)
}

pub(crate) fn dot_f32(q: &[f32], row: &[u8]) -> f32 {
    dot_by(q.len(), |k| q[k], |k| f32_at(row, k))
}

pub(crate) fn dot_f16(q: &[f32], row: &[u8]) -> f32 {
    dot_by(q.len(), |k| q[k], |k| f16_at(row, k))
}

pub(crate) fn dot_bf16(q: &[f32], row: &[u8]) -> f32 {
    dot_by(q.len(), |k| q[k], |k| bf16_at(row, k))
}

/// `Σ q·e4m3(code)` (unscaled).
pub(crate) fn dot_e4m3(q: &[f32], codes: &[u8]) -> f32 {
    dot_by(q.len(), |k| q[k], |k| e4m3_to_f32(codes[k]))
}

/// `Σ q·code` over 8-bit codes.
pub(crate) fn dot_u8(q: &[f32], codes: &[u8]) -> f32 {
    dot_by(q.len(), |k| q[k], |k| f32::from(codes[k]))
}

/// `Σ q·code` over packed 4-bit codes.
pub(crate) fn dot_u4(q: &[f32], codes: &[u8]) -> f32 {
    dot_by(q.len(), |k| q[k], |k| f32::from(u4_at(codes, k)))
}

#[inline(always)]
fn axpy_by(w: f32, acc: &mut [f32], x: impl Fn(usize) -> f32) {
    for (i, a) in acc.iter_mut().enumerate() {
        *a = w.mul_add(x(i), *a);
    }
}

pub(crate) fn axpy_f32(w: f32, row: &[u8], acc: &mut [f32]) {
    axpy_by(w, acc, |i| f32_at(row, i));
}

pub(crate) fn axpy_f16(w: f32, row: &[u8], acc: &mut [f32]) {
    axpy_by(w, acc, |i| f16_at(row, i));
}

pub(crate) fn axpy_bf16(w: f32, row: &[u8], acc: &mut [f32]) {
    axpy_by(w, acc, |i| bf16_at(row, i));
}

pub(crate) fn axpy_e4m3(w: f32, scale: f32, codes: &[u8], acc: &mut [f32]) {
    axpy_by(w, acc, |i| e4m3_to_f32(codes[i]) * scale);
}

pub(crate) fn axpy_u8(w: f32, scale: f32, offset: f32, codes: &[u8], acc: &mut [f32]) {
    axpy_by(w, acc, |i| dequant(codes[i], scale, offset));
}

pub(crate) fn axpy_u4(w: f32, scale: f32, offset: f32, codes: &[u8], acc: &mut [f32]) {
    axpy_by(w, acc, |i| dequant(u4_at(codes, i), scale, offset));
}

pub(crate) fn decode_f32(row: &[u8], out: &mut [f32]) {
    for (i, o) in out.iter_mut().enumerate() {
        *o = f32_at(row, i);
    }
}

pub(crate) fn decode_f16(row: &[u8], out: &mut [f32]) {
    for (i, o) in out.iter_mut().enumerate() {
        *o = f16_at(row, i);
    }
}

pub(crate) fn decode_bf16(row: &[u8], out: &mut [f32]) {
    for (i, o) in out.iter_mut().enumerate() {
        *o = bf16_at(row, i);
    }
}

pub(crate) fn decode_e4m3(scale: f32, codes: &[u8], out: &mut [f32]) {
    for (o, &c) in out.iter_mut().zip(codes) {
        *o = e4m3_to_f32(c) * scale;
    }
}

pub(crate) fn decode_u8(scale: f32, offset: f32, codes: &[u8], out: &mut [f32]) {
    for (o, &c) in out.iter_mut().zip(codes) {
        *o = dequant(c, scale, offset);
    }
}

pub(crate) fn decode_u4(scale: f32, offset: f32, codes: &[u8], out: &mut [f32]) {
    for (i, o) in out.iter_mut().enumerate() {
        *o = dequant(u4_at(codes, i), scale, offset);
    }
}

/// One `int4c` row: `out[c] = code_c·scales[c] + offsets[c]` (fused), each channel with its
/// own parameters (hoisted out of the group header once per group).
pub(crate) fn decode_u4_channels(scales: &[f32], offsets: &[f32], codes: &[u8], out: &mut [f32]) {
    for (i, o) in out.iter_mut().enumerate() {
        *o = dequant(u4_at(codes, i), scales[i], offsets[i]);
    }
}

crate::row_drivers::int_row_drivers!();

/// Integer codes of `x` under the widened parameters `(scale, offset)`: [`affine::code`] per
/// value (the reference every encode path must match bit for bit).
pub(crate) fn encode_codes(x: &[f32], wide: (f64, f64), qmax: u32, out: &mut [u8]) {
    for (o, &v) in out.iter_mut().zip(x) {
        *o = crate::affine::code(v, wide, qmax);
    }
}

/// `x` rounded to bfloat16 as `half::bf16::from_f32` does (nearest, ties to even; a NaN keeps
/// its sign and top payload bits and becomes quiet), little-endian.
pub(crate) fn encode_bf16(x: &[f32], out: &mut [u8]) {
    for (o, v) in out.chunks_exact_mut(2).zip(x) {
        o.copy_from_slice(&bf16::from_f32(*v).to_bits().to_le_bytes());
    }
}

/// One `fp8` row: the f32 scale (the largest finite magnitude / 448), then each value divided by
/// it and rounded to E4M3 ([`f32_to_e4m3`]). A row without a finite non-zero value has scale 0:
/// infinities saturate to ±448, everything else encodes as 0.
pub(crate) fn encode_fp8(x: &[f32], out: &mut [u8]) {
    let amax = x
        .iter()
        .filter(|v| v.is_finite())
        .fold(0f32, |m, v| m.max(v.abs()));
    let scale = amax / E4M3_MAX;
    let (head, codes) = out.split_at_mut(FP8_SCALE_BYTES);
    head.copy_from_slice(&scale.to_le_bytes());
    encode_e4m3_codes(x, scale, codes);
}

/// The codes of an `fp8` row with scale `scale` (also the tail of the AVX2 path).
pub(crate) fn encode_e4m3_codes(x: &[f32], scale: f32, codes: &mut [u8]) {
    for (c, &v) in codes.iter_mut().zip(x) {
        *c = if scale > 0.0 {
            f32_to_e4m3(v / scale)
        } else {
            // All-zero (or all non-finite) row: every value decodes to 0·scale = 0.
            f32_to_e4m3(if v.is_infinite() { v } else { 0.0 })
        };
    }
}

/// `x` rounded to binary16 (nearest, ties to even), little-endian.
pub(crate) fn encode_f16(x: &[f32], out: &mut [u8]) {
    for (o, v) in out.chunks_exact_mut(2).zip(x) {
        o.copy_from_slice(&f16::from_f32(*v).to_bits().to_le_bytes());
    }
}
