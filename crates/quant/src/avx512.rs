//! AVX-512 (F+BW) decode kernels for tiles of integer rows: 16 values per instruction instead of
//! AVX2's 8. Each value is `fma(code, scale, offset)` in f32, the same single rounding as
//! [`crate::affine::dequant`], so results are bit-identical to the portable and AVX2 paths.
//!
//! Callers must have checked AVX-512 F+BW (and AVX2) at runtime (`Isa::use_avx512`) before
//! calling any of these `#[target_feature]` functions. Each asserts its slice lengths up front.

use std::arch::x86_64::*;

use crate::affine::dequant;
use crate::layout::u4_at;

/// Sixteen int8 codes at `p` widened to f32.
///
/// # Safety
/// `p` must be valid for reads of 16 bytes.
#[target_feature(enable = "avx512f,avx512bw,avx2,fma,f16c")]
#[inline]
unsafe fn ld16_u8(p: *const u8) -> __m512 {
    // SAFETY: the caller guarantees 16 readable bytes; loadu has no alignment need.
    let b = unsafe { _mm_loadu_si128(p.cast::<__m128i>()) };
    _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(b))
}

/// Sixteen packed nibbles (element 2j low, 2j+1 high) at `p` widened to f32.
///
/// # Safety
/// `p` must be valid for reads of 8 bytes.
#[target_feature(enable = "avx512f,avx512bw,avx2,fma,f16c")]
#[inline]
unsafe fn ld16_u4(p: *const u8) -> __m512 {
    // SAFETY: the caller guarantees 8 readable bytes; loadl has no alignment need.
    let v = unsafe { _mm_loadl_epi64(p.cast::<__m128i>()) };
    let mask = _mm_set1_epi8(0x0F);
    let lo = _mm_and_si128(v, mask);
    let hi = _mm_and_si128(_mm_srli_epi16::<4>(v), mask);
    _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_unpacklo_epi8(lo, hi)))
}

/// `(scale, offset)` of group `g` of an integer row's header widened to f32 with one F16C
/// conversion (exact; the value `layout::group_params` gives).
///
/// # Panics
/// If `params` is shorter than `4·(g + 1)` bytes.
#[target_feature(enable = "avx512f,avx512bw,avx2,fma,f16c")]
#[inline]
pub(crate) fn group_params_f16c(params: &[u8], g: usize) -> (f32, f32) {
    let b: [u8; 4] = params[4 * g..4 * g + 4].try_into().expect("4 bytes");
    let v = _mm_cvtph_ps(_mm_cvtsi32_si128(i32::from_le_bytes(b)));
    (_mm_cvtss_f32(v), _mm_cvtss_f32(_mm_movehdup_ps(v)))
}

/// Every row of a run of `int4` rows into `out` (`[rows, hd]`): `bytes` holds whole rows, each
/// the `(scale, offset)` header of its `hd / group` groups then the packed codes. Each value is
/// `fma(nibble, scale_g, offset_g)`, as [`decode_u4`] per group; the row loop runs here so a
/// tile pays no call per row or group.
///
/// # Panics
/// If `group` is not a positive multiple of 16 dividing `hd`, `out` is not whole rows, or
/// `bytes` holds fewer rows than `out` (a caller bug).
#[target_feature(enable = "avx512f,avx512bw,avx2,fma,f16c")]
pub(crate) fn decode_u4_rows(bytes: &[u8], hd: usize, group: usize, out: &mut [f32]) {
    assert!(group > 0 && group.is_multiple_of(16) && hd.is_multiple_of(group));
    let header = 4 * (hd / group);
    let row_bytes = header + hd / 2;
    let n = out.len() / hd;
    assert!(
        out.len() == n * hd && bytes.len() >= n * row_bytes,
        "int4 rows too short"
    );
    for (row, o) in bytes.chunks_exact(row_bytes).zip(out.chunks_exact_mut(hd)) {
        for g in 0..hd / group {
            let (scale, offset) = group_params_f16c(row, g);
            let (sv, ov) = (_mm512_set1_ps(scale), _mm512_set1_ps(offset));
            for x in (g * group..(g + 1) * group).step_by(16) {
                // SAFETY: x + 16 <= hd, so the 8 code bytes at header + x/2 lie inside the row
                // (header + hd/2 bytes) and the 16 values stored lie inside `o` (hd values).
                unsafe {
                    let v = _mm512_fmadd_ps(ld16_u4(row.as_ptr().add(header + x / 2)), sv, ov);
                    _mm512_storeu_ps(o.as_mut_ptr().add(x), v);
                }
            }
        }
    }
}

/// `out[i] = fma(codes[i], scale, offset)` (int8 codes).
#[target_feature(enable = "avx512f,avx512bw,avx2,fma,f16c")]
pub(crate) fn decode_u8(scale: f32, offset: f32, codes: &[u8], out: &mut [f32]) {
    assert!(codes.len() >= out.len(), "int8 codes too short");
    let (sv, ov) = (_mm512_set1_ps(scale), _mm512_set1_ps(offset));
    let n = out.len();
    let mut i = 0;
    while i + 16 <= n {
        // SAFETY: i + 16 <= n <= codes.len(), out.len(): loads and store in bounds.
        unsafe {
            let x = _mm512_fmadd_ps(ld16_u8(codes.as_ptr().add(i)), sv, ov);
            _mm512_storeu_ps(out.as_mut_ptr().add(i), x);
        }
        i += 16;
    }
    for (k, o) in out.iter_mut().enumerate().skip(i) {
        *o = dequant(codes[k], scale, offset);
    }
}

/// `out[i] = fma(nibble i, scale, offset)` (packed int4 codes).
#[target_feature(enable = "avx512f,avx512bw,avx2,fma,f16c")]
pub(crate) fn decode_u4(scale: f32, offset: f32, codes: &[u8], out: &mut [f32]) {
    assert!(2 * codes.len() >= out.len(), "int4 codes too short");
    let (sv, ov) = (_mm512_set1_ps(scale), _mm512_set1_ps(offset));
    let n = out.len();
    let mut i = 0;
    while i + 16 <= n {
        // SAFETY: bytes i/2..i/2 + 8 lie inside codes (2·codes.len() >= n >= i + 16).
        unsafe {
            let x = _mm512_fmadd_ps(ld16_u4(codes.as_ptr().add(i / 2)), sv, ov);
            _mm512_storeu_ps(out.as_mut_ptr().add(i), x);
        }
        i += 16;
    }
    for (k, o) in out.iter_mut().enumerate().skip(i) {
        *o = dequant(u4_at(codes, k), scale, offset);
    }
}

/// `out[i] = fma(nibble i, scales[i], offsets[i])` (one `int4c` row).
#[target_feature(enable = "avx512f,avx512bw,avx2,fma,f16c")]
pub(crate) fn decode_u4_channels(scales: &[f32], offsets: &[f32], codes: &[u8], out: &mut [f32]) {
    let n = out.len();
    assert!(
        2 * codes.len() >= n && scales.len() >= n && offsets.len() >= n,
        "int4c row too short"
    );
    let mut i = 0;
    while i + 16 <= n {
        // SAFETY: i + 16 <= n bounds every load and the store (asserted above).
        unsafe {
            let x = _mm512_fmadd_ps(
                ld16_u4(codes.as_ptr().add(i / 2)),
                _mm512_loadu_ps(scales.as_ptr().add(i)),
                _mm512_loadu_ps(offsets.as_ptr().add(i)),
            );
            _mm512_storeu_ps(out.as_mut_ptr().add(i), x);
        }
        i += 16;
    }
    for (k, o) in out.iter_mut().enumerate().skip(i) {
        *o = dequant(u4_at(codes, k), scales[k], offsets[k]);
    }
}
