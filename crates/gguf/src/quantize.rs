//! Reference quantization of `f32` rows into GGML block formats.
//!
//! Owns `quantize_row` for F32, F16, BF16, Q4_0, Q4_1, Q5_0, Q5_1 and Q8_0, the same math as
//! ggml's scalar `quantize_row_*_ref` (and bit-identical to the python `gguf` package on the
//! committed vectors), plus the K-quants via `quantize_k.rs`. Used by tests and by the GGUF writer
//! to make small models; it is not an inference path and never reads files.

use half::f16;

use super::dequant::check_sizes;
use super::error::GgufError;
use super::quantize_k;
use super::types::GgmlType;

/// Appends the encoding of `src` as type `ty` to `dst`. `src.len()` must be a whole number of
/// blocks of `ty`.
pub fn quantize_row(ty: GgmlType, src: &[f32], dst: &mut Vec<u8>) -> Result<(), GgufError> {
    let num_bytes = ty.row_bytes(src.len()).ok_or(GgufError::PartialBlock {
        ty,
        num_elems: src.len(),
        block_elems: ty.block_elems(),
    })?;
    let start = dst.len();
    dst.reserve(num_bytes);
    let blocks = src.chunks_exact(ty.block_elems());
    match ty {
        GgmlType::F32 => src
            .iter()
            .for_each(|x| dst.extend_from_slice(&x.to_le_bytes())),
        GgmlType::F16 => src
            .iter()
            .for_each(|&x| dst.extend_from_slice(&f16::from_f32(x).to_le_bytes())),
        GgmlType::BF16 => src
            .iter()
            .for_each(|&x| dst.extend_from_slice(&f32_to_bf16_bits(x).to_le_bytes())),
        GgmlType::Q4_0 => blocks.for_each(|b| block_q4_0(b, dst)),
        GgmlType::Q4_1 => blocks.for_each(|b| block_q4_1(b, dst)),
        GgmlType::Q5_0 => blocks.for_each(|b| block_q5_0(b, dst)),
        GgmlType::Q5_1 => blocks.for_each(|b| block_q5_1(b, dst)),
        GgmlType::Q8_0 => blocks.for_each(|b| block_q8_0(b, dst)),
        GgmlType::Q4K => blocks.for_each(|b| quantize_k::block_q4_k(b, dst)),
        GgmlType::Q5K => blocks.for_each(|b| quantize_k::block_q5_k(b, dst)),
        GgmlType::Q6K => blocks.for_each(|b| quantize_k::block_q6_k(b, dst)),
    }
    // An internal invariant: each block encoder writes exactly `block_bytes`.
    check_sizes(ty, dst.len() - start, src.len())
}

/// ggml's `ggml_compute_fp32_to_bf16`: round to nearest even, NaN forced quiet.
pub fn f32_to_bf16_bits(x: f32) -> u16 {
    let u = x.to_bits();
    if (u & 0x7fff_ffff) > 0x7f80_0000 {
        return ((u >> 16) | 64) as u16;
    }
    ((u as u64 + (0x7fff + ((u >> 16) & 1)) as u64) >> 16) as u16
}

fn push_f16(dst: &mut Vec<u8>, x: f32) {
    dst.extend_from_slice(&f16::from_f32(x).to_le_bytes());
}

/// The value of largest magnitude (first one on ties), as ggml picks it.
fn signed_absmax(x: &[f32]) -> f32 {
    let (mut amax, mut max) = (0.0f32, 0.0f32);
    for &v in x {
        if amax < v.abs() {
            amax = v.abs();
            max = v;
        }
    }
    max
}

fn min_max(x: &[f32]) -> (f32, f32) {
    x.iter()
        .fold((f32::MAX, -f32::MAX), |(lo, hi), &v| (lo.min(v), hi.max(v)))
}

fn inv(d: f32) -> f32 {
    if d != 0.0 {
        1.0 / d
    } else {
        0.0
    }
}

/// Saturating float→int like C's `(int8_t)` cast of an in-range value, then clamped to `max`.
fn to_level(v: f32, max: u8) -> u8 {
    (v as i32).clamp(0, max as i32) as u8
}

fn block_q4_0(x: &[f32], dst: &mut Vec<u8>) {
    let d = signed_absmax(x) / -8.0;
    let id = inv(d);
    push_f16(dst, d);
    for j in 0..16 {
        let q0 = to_level(x[j] * id + 8.5, 15);
        let q1 = to_level(x[j + 16] * id + 8.5, 15);
        dst.push(q0 | (q1 << 4));
    }
}

fn block_q4_1(x: &[f32], dst: &mut Vec<u8>) {
    let (min, max) = min_max(x);
    let d = (max - min) / 15.0;
    let id = inv(d);
    push_f16(dst, d);
    push_f16(dst, min);
    for j in 0..16 {
        let q0 = to_level((x[j] - min) * id + 0.5, 15);
        let q1 = to_level((x[j + 16] - min) * id + 0.5, 15);
        dst.push(q0 | (q1 << 4));
    }
}

fn block_q5_0(x: &[f32], dst: &mut Vec<u8>) {
    let d = signed_absmax(x) / -16.0;
    let id = inv(d);
    push_f16(dst, d);
    let q: Vec<u8> = x.iter().map(|&v| to_level(v * id + 16.5, 31)).collect();
    push_q5(&q, dst);
}

fn block_q5_1(x: &[f32], dst: &mut Vec<u8>) {
    let (min, max) = min_max(x);
    let d = (max - min) / 31.0;
    let id = inv(d);
    push_f16(dst, d);
    push_f16(dst, min);
    let q: Vec<u8> = x
        .iter()
        .map(|&v| to_level((v - min) * id + 0.5, 31))
        .collect();
    push_q5(&q, dst);
}

/// `qh: u32` (bit j = bit 4 of element j) then 16 bytes of low nibbles (j | j+16 << 4).
fn push_q5(q: &[u8], dst: &mut Vec<u8>) {
    let qh = q
        .iter()
        .enumerate()
        .fold(0u32, |h, (j, &v)| h | (((v >> 4) & 1) as u32) << j);
    dst.extend_from_slice(&qh.to_le_bytes());
    for j in 0..16 {
        dst.push((q[j] & 0x0F) | ((q[j + 16] & 0x0F) << 4));
    }
}

fn block_q8_0(x: &[f32], dst: &mut Vec<u8>) {
    let amax = x.iter().fold(0.0f32, |a, &v| a.max(v.abs()));
    let d = amax / 127.0;
    let id = inv(d);
    push_f16(dst, d);
    // `f32::round` rounds half away from zero, like C's `roundf`.
    dst.extend(x.iter().map(|&v| (v * id).round() as i8 as u8));
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bf16_rounding_matches_ggml() {
        assert_eq!(f32_to_bf16_bits(1.0), 0x3f80);
        // 1 + 2^-8 is exactly half-way: ties to even (down).
        assert_eq!(f32_to_bf16_bits(f32::from_bits(0x3f80_8000)), 0x3f80);
        assert_eq!(f32_to_bf16_bits(f32::from_bits(0x3f81_8000)), 0x3f82);
        assert_eq!(f32_to_bf16_bits(f32::from_bits(0x7f80_0001)), 0x7fc0);
    }

    #[test]
    fn all_zero_block_is_all_zero_scale() {
        for ty in [
            GgmlType::Q4_0,
            GgmlType::Q4_1,
            GgmlType::Q5_0,
            GgmlType::Q5_1,
            GgmlType::Q8_0,
        ] {
            let mut out = Vec::new();
            quantize_row(ty, &[0.0; 32], &mut out).unwrap();
            assert_eq!(out.len(), ty.block_bytes());
            let mut back = [1.0f32; 32];
            super::super::dequant::dequantize_row(ty, &out, &mut back).unwrap();
            assert!(back.iter().all(|&v| v == 0.0), "{ty:?}: {back:?}");
        }
    }

    #[test]
    fn partial_block_is_an_error() {
        assert!(quantize_row(GgmlType::Q4_0, &[0.0; 31], &mut Vec::new()).is_err());
    }
}
