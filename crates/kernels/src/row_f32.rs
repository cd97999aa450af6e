//! Weight row conversion to f32 for types without an integer fast path (F32, F16, BF16 and the
//! K-quants Q4_K / Q5_K / Q6_K), used by matmul's "convert row, then `dot_f32`" fallback.
//!
//! Owns the exact decoding of one row `[row_len]` from its on-disk bytes. Float conversions are
//! exact (F16C on AVX2, `half` otherwise), so both paths give the same floats. Quantised types are
//! decoded by `gguf::dequant::dequantize_row` (ggml's operation order). It never allocates.

use super::cpu::CpuFeatures;
use gguf::dequant::dequantize_row;
use gguf::GgmlType;

/// Decodes one row: `src` holds exactly `ty.row_bytes(dst.len())` bytes (checked by the caller).
pub(crate) fn row_to_f32(features: CpuFeatures, ty: GgmlType, src: &[u8], dst: &mut [f32]) {
    debug_assert_eq!(ty.row_bytes(dst.len()), Some(src.len()));
    match ty {
        GgmlType::F32 => {
            for (d, s) in dst.iter_mut().zip(src.chunks_exact(4)) {
                *d = f32::from_le_bytes([s[0], s[1], s[2], s[3]]);
            }
        }
        GgmlType::F16 => {
            #[cfg(target_arch = "x86_64")]
            if features.clamp_to_detected().avx2 {
                // SAFETY: AVX2+FMA+F16C presence was checked at runtime just above.
                unsafe { avx2::f16_row(src, dst) };
                return;
            }
            for (d, s) in dst.iter_mut().zip(src.chunks_exact(2)) {
                *d = half::f16::from_bits(u16::from_le_bytes([s[0], s[1]])).to_f32();
            }
        }
        GgmlType::BF16 => {
            for (d, s) in dst.iter_mut().zip(src.chunks_exact(2)) {
                *d = f32::from_bits(u32::from(u16::from_le_bytes([s[0], s[1]])) << 16);
            }
        }
        GgmlType::Q4_0
        | GgmlType::Q4_1
        | GgmlType::Q5_0
        | GgmlType::Q5_1
        | GgmlType::Q8_0
        | GgmlType::Q4K
        | GgmlType::Q5K
        | GgmlType::Q6K => dequantize_row(ty, src, dst)
            .expect("matmul validated the row size against the type before converting rows"),
    }
    let _ = features;
}

#[cfg(target_arch = "x86_64")]
mod avx2 {
    use std::arch::x86_64::*;

    #[target_feature(enable = "avx2,fma,f16c")]
    pub(super) fn f16_row(src: &[u8], dst: &mut [f32]) {
        let n = dst.len().min(src.len() / 2);
        let mut i = 0;
        while i + 8 <= n {
            // SAFETY: `i + 8 <= n`, so 16 source bytes at `2 * i` and 8 floats at `i` are in range.
            unsafe {
                let h = _mm_loadu_si128(src.as_ptr().add(2 * i).cast());
                _mm256_storeu_ps(dst.as_mut_ptr().add(i), _mm256_cvtph_ps(h));
            }
            i += 8;
        }
        while i < n {
            dst[i] =
                half::f16::from_bits(u16::from_le_bytes([src[2 * i], src[2 * i + 1]])).to_f32();
            i += 1;
        }
    }
}
