//! AVX2+FMA+F16C kernels, one per function of `scalar.rs`, performing exactly the same
//! operations in the same order (so results are bit-identical to the portable path).
//!
//! Callers must have checked AVX2+FMA+F16C at runtime (`Isa::use_avx2`) before calling any of
//! these `#[target_feature]` functions. Each function asserts up front that its slices are long
//! enough, which is what makes every raw-pointer load below in bounds. Never allocates.

use crate::affine::dequant;
use crate::fp8::e4m3_to_f32;
use crate::layout::{f32_at, u16_at, u4_at};
use half::{bf16, f16};
use std::arch::x86_64::*;

/// 8-lane horizontal sum in the order of `canonical::hsum8`.
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
fn hsum8_ps(v: __m256) -> f32 {
    let t = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    let u = _mm_add_ps(t, _mm_movehl_ps(t, t));
    let r = _mm_add_ss(u, _mm_shuffle_ps(u, u, 1));
    _mm_cvtss_f32(r)
}

// Loaders: 8 consecutive elements starting at element `i` of an encoded array, widened to f32.
// Each is `unsafe` because it reads through a raw pointer: the caller guarantees that elements
// `i..i + 8` lie inside the allocation `p` points into.

/// # Safety
/// `p` must be valid for reads of bytes `4i..4i + 32`.
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
unsafe fn ld_f32(p: *const u8, i: usize) -> __m256 {
    // SAFETY: the caller guarantees bytes 4i..4i+32 are readable; loadu has no alignment need.
    unsafe { _mm256_loadu_ps(p.add(4 * i).cast::<f32>()) }
}

/// # Safety
/// `p` must be valid for reads of bytes `2i..2i + 16`.
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
unsafe fn ld_f16(p: *const u8, i: usize) -> __m256 {
    // SAFETY: the caller guarantees bytes 2i..2i+16 are readable; loadu has no alignment need.
    _mm256_cvtph_ps(unsafe { _mm_loadu_si128(p.add(2 * i).cast::<__m128i>()) })
}

/// # Safety
/// `p` must be valid for reads of bytes `2i..2i + 16`.
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
unsafe fn ld_bf16(p: *const u8, i: usize) -> __m256 {
    // SAFETY: the caller guarantees bytes 2i..2i+16 are readable; loadu has no alignment need.
    let h = unsafe { _mm_loadu_si128(p.add(2 * i).cast::<__m128i>()) };
    _mm256_castsi256_ps(_mm256_slli_epi32::<16>(_mm256_cvtepu16_epi32(h)))
}

/// E4M3 codes → f32 (unscaled): the code's bits are placed into an f16 (`sign << 8`,
/// `exponent|mantissa << 7`), converted with F16C and multiplied by 2^8 to fix the bias; exact.
///
/// # Safety
/// `p` must be valid for reads of bytes `i..i + 8`.
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
unsafe fn ld_e4m3(p: *const u8, i: usize) -> __m256 {
    // SAFETY: the caller guarantees bytes i..i+8 are readable; loadl has no alignment need.
    let b = unsafe { _mm_loadl_epi64(p.add(i).cast::<__m128i>()) };
    let w = _mm_cvtepu8_epi16(b);
    let sign = _mm_slli_epi16::<8>(_mm_and_si128(w, _mm_set1_epi16(0x80)));
    let rest = _mm_slli_epi16::<7>(_mm_and_si128(w, _mm_set1_epi16(0x7F)));
    _mm256_mul_ps(
        _mm256_cvtph_ps(_mm_or_si128(sign, rest)),
        _mm256_set1_ps(256.0),
    )
}

/// # Safety
/// `p` must be valid for reads of bytes `i..i + 8`.
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
unsafe fn ld_u8(p: *const u8, i: usize) -> __m256 {
    // SAFETY: the caller guarantees bytes i..i+8 are readable; loadl has no alignment need.
    let b = unsafe { _mm_loadl_epi64(p.add(i).cast::<__m128i>()) };
    _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(b))
}

/// Packed nibbles (element 2j low, 2j+1 high) → f32. `i` must be even.
///
/// # Safety
/// `p` must be valid for reads of bytes `i/2..i/2 + 4`.
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
unsafe fn ld_u4(p: *const u8, i: usize) -> __m256 {
    // SAFETY: the caller guarantees bytes i/2..i/2+4 are readable; read_unaligned has no
    // alignment need.
    let word = unsafe { p.add(i / 2).cast::<i32>().read_unaligned() };
    // Lane j holds nibble j of the little-endian word (bits 4j..4j+4): the word broadcast to
    // every lane, each lane shifted right by its own 4j, masked.
    let shifts = _mm256_setr_epi32(0, 4, 8, 12, 16, 20, 24, 28);
    let v = _mm256_srlv_epi32(_mm256_set1_epi32(word), shifts);
    _mm256_cvtepi32_ps(_mm256_and_si256(v, _mm256_set1_epi32(0x0F)))
}

/// Canonical-order `Σ q[k]·x[k]`, `x` loaded 8 at a time by `$ld($p, k)`, scalar tail `$tail(k)`.
/// The caller has asserted that `$p` holds `q.len()` elements for `$ld`.
macro_rules! dot8 {
    ($q:expr, $ld:ident, $p:expr, $tail:expr) => {{
        let q: &[f32] = $q;
        let n = q.len();
        let (qp, p) = (q.as_ptr(), $p);
        let mut acc = [_mm256_setzero_ps(); 4];
        let mut i = 0usize;
        while i + 32 <= n {
            for (j, accj) in acc.iter_mut().enumerate() {
                // SAFETY: i + 8j + 8 <= n: in bounds of q and (asserted by the caller) of p.
                let (x, y) = unsafe { (_mm256_loadu_ps(qp.add(i + 8 * j)), $ld(p, i + 8 * j)) };
                *accj = _mm256_fmadd_ps(x, y, *accj);
            }
            i += 32;
        }
        while i + 8 <= n {
            // SAFETY: i + 8 <= n, as above.
            let (x, y) = unsafe { (_mm256_loadu_ps(qp.add(i)), $ld(p, i)) };
            acc[0] = _mm256_fmadd_ps(x, y, acc[0]);
            i += 8;
        }
        let s = _mm256_add_ps(_mm256_add_ps(acc[0], acc[1]), _mm256_add_ps(acc[2], acc[3]));
        let mut r = hsum8_ps(s);
        let tail = $tail;
        while i < n {
            r = q[i].mul_add(tail(i), r);
            i += 1;
        }
        r
    }};
}

/// `acc[k] = fma(w, x̂[k], acc[k])` with `x̂ = $deq(loaded)` 8 at a time, scalar tail `$tail(k)`.
macro_rules! axpy8 {
    ($w:expr, $acc:expr, $ld:ident, $p:expr, $deq:expr, $tail:expr) => {{
        let w: f32 = $w;
        let acc: &mut [f32] = $acc;
        let n = acc.len();
        let (ap, p, wv, deq) = (acc.as_mut_ptr(), $p, _mm256_set1_ps(w), $deq);
        let mut i = 0usize;
        while i + 8 <= n {
            // SAFETY: i + 8 <= n: in bounds of acc and (asserted by the caller) of p.
            unsafe {
                let x = deq($ld(p, i));
                let a = _mm256_loadu_ps(ap.add(i));
                _mm256_storeu_ps(ap.add(i), _mm256_fmadd_ps(wv, x, a));
            }
            i += 8;
        }
        let tail = $tail;
        while i < n {
            acc[i] = w.mul_add(tail(i), acc[i]);
            i += 1;
        }
    }};
}

/// `out[k] = $deq(loaded)[k]` 8 at a time, scalar tail `$tail(k)`.
macro_rules! decode8 {
    ($out:expr, $ld:ident, $p:expr, $deq:expr, $tail:expr) => {{
        let out: &mut [f32] = $out;
        let n = out.len();
        let (op, p, deq) = (out.as_mut_ptr(), $p, $deq);
        let mut i = 0usize;
        while i + 8 <= n {
            // SAFETY: i + 8 <= n: in bounds of out and (asserted by the caller) of p.
            unsafe { _mm256_storeu_ps(op.add(i), deq($ld(p, i))) };
            i += 8;
        }
        let tail = $tail;
        while i < n {
            out[i] = tail(i);
            i += 1;
        }
    }};
}

#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
fn id(v: __m256) -> __m256 {
    v
}

#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) fn sum(q: &[f32]) -> f32 {
    let ones = [1f32; 8];
    let p = ones.as_ptr().cast::<u8>();
    // The "row" is a vector of ones re-read at offset 0 for every chunk.
    #[target_feature(enable = "avx2,fma,f16c")]
    #[inline]
    unsafe fn ld_one(_p: *const u8, _i: usize) -> __m256 {
        _mm256_set1_ps(1.0)
    }
    dot8!(q, ld_one, p, |_k: usize| 1.0f32)
}

#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) fn dot_f32(q: &[f32], row: &[u8]) -> f32 {
    assert!(row.len() >= 4 * q.len(), "f32 row too short");
    dot8!(q, ld_f32, row.as_ptr(), |k| f32_at(row, k))
}

#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) fn dot_f16(q: &[f32], row: &[u8]) -> f32 {
    assert!(row.len() >= 2 * q.len(), "f16 row too short");
    dot8!(q, ld_f16, row.as_ptr(), |k| f16::from_bits(u16_at(row, k))
        .to_f32())
}

#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) fn dot_bf16(q: &[f32], row: &[u8]) -> f32 {
    assert!(row.len() >= 2 * q.len(), "bf16 row too short");
    dot8!(q, ld_bf16, row.as_ptr(), |k| bf16::from_bits(u16_at(
        row, k
    ))
    .to_f32())
}

#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) fn dot_e4m3(q: &[f32], codes: &[u8]) -> f32 {
    assert!(codes.len() >= q.len(), "fp8 codes too short");
    dot8!(q, ld_e4m3, codes.as_ptr(), |k| e4m3_to_f32(codes[k]))
}

#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) fn dot_u8(q: &[f32], codes: &[u8]) -> f32 {
    assert!(codes.len() >= q.len(), "int8 codes too short");
    dot8!(q, ld_u8, codes.as_ptr(), |k| f32::from(codes[k]))
}

#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) fn dot_u4(q: &[f32], codes: &[u8]) -> f32 {
    assert!(2 * codes.len() >= q.len(), "int4 codes too short");
    dot8!(q, ld_u4, codes.as_ptr(), |k| f32::from(u4_at(codes, k)))
}

#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) fn axpy_f32(w: f32, row: &[u8], acc: &mut [f32]) {
    assert!(row.len() >= 4 * acc.len(), "f32 row too short");
    axpy8!(w, acc, ld_f32, row.as_ptr(), id, |k| f32_at(row, k))
}

#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) fn axpy_f16(w: f32, row: &[u8], acc: &mut [f32]) {
    assert!(row.len() >= 2 * acc.len(), "f16 row too short");
    axpy8!(w, acc, ld_f16, row.as_ptr(), id, |k| f16::from_bits(
        u16_at(row, k)
    )
    .to_f32())
}

#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) fn axpy_bf16(w: f32, row: &[u8], acc: &mut [f32]) {
    assert!(row.len() >= 2 * acc.len(), "bf16 row too short");
    axpy8!(w, acc, ld_bf16, row.as_ptr(), id, |k| bf16::from_bits(
        u16_at(row, k)
    )
    .to_f32())
}

#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) fn axpy_e4m3(w: f32, scale: f32, codes: &[u8], acc: &mut [f32]) {
    assert!(codes.len() >= acc.len(), "fp8 codes too short");
    let sv = _mm256_set1_ps(scale);
    axpy8!(
        w,
        acc,
        ld_e4m3,
        codes.as_ptr(),
        |v| _mm256_mul_ps(v, sv),
        |k| e4m3_to_f32(codes[k]) * scale
    )
}

#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) fn axpy_u8(w: f32, scale: f32, offset: f32, codes: &[u8], acc: &mut [f32]) {
    assert!(codes.len() >= acc.len(), "int8 codes too short");
    let (sv, ov) = (_mm256_set1_ps(scale), _mm256_set1_ps(offset));
    axpy8!(
        w,
        acc,
        ld_u8,
        codes.as_ptr(),
        |v| _mm256_fmadd_ps(v, sv, ov),
        |k| dequant(codes[k], scale, offset)
    )
}

#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) fn axpy_u4(w: f32, scale: f32, offset: f32, codes: &[u8], acc: &mut [f32]) {
    assert!(2 * codes.len() >= acc.len(), "int4 codes too short");
    let (sv, ov) = (_mm256_set1_ps(scale), _mm256_set1_ps(offset));
    axpy8!(
        w,
        acc,
        ld_u4,
        codes.as_ptr(),
        |v| _mm256_fmadd_ps(v, sv, ov),
        |k| dequant(u4_at(codes, k), scale, offset)
    )
}

#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) fn decode_f32(row: &[u8], out: &mut [f32]) {
    assert!(row.len() >= 4 * out.len(), "f32 row too short");
    decode8!(out, ld_f32, row.as_ptr(), id, |k| f32_at(row, k))
}

#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) fn decode_f16(row: &[u8], out: &mut [f32]) {
    assert!(row.len() >= 2 * out.len(), "f16 row too short");
    decode8!(out, ld_f16, row.as_ptr(), id, |k| f16::from_bits(u16_at(
        row, k
    ))
    .to_f32())
}

#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) fn decode_bf16(row: &[u8], out: &mut [f32]) {
    assert!(row.len() >= 2 * out.len(), "bf16 row too short");
    decode8!(out, ld_bf16, row.as_ptr(), id, |k| bf16::from_bits(u16_at(
        row, k
    ))
    .to_f32())
}

#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) fn decode_e4m3(scale: f32, codes: &[u8], out: &mut [f32]) {
    assert!(codes.len() >= out.len(), "fp8 codes too short");
    let sv = _mm256_set1_ps(scale);
    decode8!(
        out,
        ld_e4m3,
        codes.as_ptr(),
        |v| _mm256_mul_ps(v, sv),
        |k| e4m3_to_f32(codes[k]) * scale
    )
}

#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) fn decode_u8(scale: f32, offset: f32, codes: &[u8], out: &mut [f32]) {
    assert!(codes.len() >= out.len(), "int8 codes too short");
    let (sv, ov) = (_mm256_set1_ps(scale), _mm256_set1_ps(offset));
    decode8!(
        out,
        ld_u8,
        codes.as_ptr(),
        |v| _mm256_fmadd_ps(v, sv, ov),
        |k| dequant(codes[k], scale, offset)
    )
}

#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) fn decode_u4(scale: f32, offset: f32, codes: &[u8], out: &mut [f32]) {
    assert!(2 * codes.len() >= out.len(), "int4 codes too short");
    let (sv, ov) = (_mm256_set1_ps(scale), _mm256_set1_ps(offset));
    decode8!(
        out,
        ld_u4,
        codes.as_ptr(),
        |v| _mm256_fmadd_ps(v, sv, ov),
        |k| dequant(u4_at(codes, k), scale, offset)
    )
}

/// Every row of a run of `int4` (`FOUR_BIT`) or `int8` rows into `out` (`[rows, hd]`):
/// `bytes` holds whole rows, each the `(scale, offset)` header of its `hd / group` groups then
/// the codes (packed nibbles or bytes). Each value is `fma(code, scale_g, offset_g)`, as
/// [`decode_u4`] / [`decode_u8`] per group; the row loop runs here so a tile pays no call per
/// row or group, and a group's pair is widened inline by F16C.
///
/// # Panics
/// If `group` is not a positive multiple of 8 dividing `hd`, `out` is not whole rows, or
/// `bytes` holds fewer rows than `out` (a caller bug).
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) fn decode_int_rows<const FOUR_BIT: bool>(
    bytes: &[u8],
    hd: usize,
    group: usize,
    out: &mut [f32],
) {
    assert!(group > 0 && group.is_multiple_of(8) && hd.is_multiple_of(group));
    let header = 4 * (hd / group);
    let row_bytes = header + if FOUR_BIT { hd / 2 } else { hd };
    let n = out.len() / hd;
    assert!(
        out.len() == n * hd && bytes.len() >= n * row_bytes,
        "int rows too short"
    );
    for (row, o) in bytes.chunks_exact(row_bytes).zip(out.chunks_exact_mut(hd)) {
        for g in 0..hd / group {
            let b: [u8; 4] = row[4 * g..4 * g + 4].try_into().expect("4 bytes");
            // Scale and offset widened by one F16C conversion (exact: `group_params`' values).
            let sv = _mm_cvtph_ps(_mm_cvtsi32_si128(i32::from_le_bytes(b)));
            let (scale, offset) = (_mm_cvtss_f32(sv), _mm_cvtss_f32(_mm_movehdup_ps(sv)));
            let (sv, ov) = (_mm256_set1_ps(scale), _mm256_set1_ps(offset));
            for x in (g * group..(g + 1) * group).step_by(8) {
                // SAFETY: x + 8 <= hd, so the code bytes of values x..x+8 (at header + x/2 or
                // header + x) lie inside the row (header + hd/2 or header + hd bytes) and the
                // 8 values stored lie inside `o` (hd values).
                unsafe {
                    let codes = row.as_ptr().add(header);
                    let c = if FOUR_BIT {
                        ld_u4(codes, x)
                    } else {
                        ld_u8(codes, x)
                    };
                    _mm256_storeu_ps(o.as_mut_ptr().add(x), _mm256_fmadd_ps(c, sv, ov));
                }
            }
        }
    }
}

/// [`crate::scalar::decode_u4_channels`]: 8 values at a time, each with its own scale and offset.
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) fn decode_u4_channels(scales: &[f32], offsets: &[f32], codes: &[u8], out: &mut [f32]) {
    assert!(
        2 * codes.len() >= out.len() && scales.len() >= out.len() && offsets.len() >= out.len(),
        "int4c row too short"
    );
    let n = out.len();
    let (sp, op, cp, dst) = (
        scales.as_ptr(),
        offsets.as_ptr(),
        codes.as_ptr(),
        out.as_mut_ptr(),
    );
    let mut i = 0usize;
    while i + 8 <= n {
        // SAFETY: i + 8 <= n <= scales.len(), offsets.len(), out.len() and 2·codes.len()
        // (asserted above), so every load and the store are in bounds.
        unsafe {
            let v = ld_u4(cp, i);
            let x = _mm256_fmadd_ps(v, _mm256_loadu_ps(sp.add(i)), _mm256_loadu_ps(op.add(i)));
            _mm256_storeu_ps(dst.add(i), x);
        }
        i += 8;
    }
    while i < n {
        out[i] = dequant(u4_at(codes, i), scales[i], offsets[i]);
        i += 1;
    }
}

crate::row_drivers::int_row_drivers!(target_feature(enable = "avx2,fma,f16c"));

/// [`crate::scalar::encode_codes`], four values at a time in f64: sanitise (NaN → code 0,
/// clamp to ±65504), `(x − offset)/scale` with an IEEE division, round to nearest even, clamp
/// to `0..=qmax` — the same correctly rounded operations as `affine::code`, so the codes are
/// identical.
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) fn encode_codes(x: &[f32], wide: (f64, f64), qmax: u32, out: &mut [u8]) {
    assert!(out.len() >= x.len(), "codes too short");
    let (scale, offset) = wide;
    if scale == 0.0 {
        out[..x.len()].fill(0);
        return;
    }
    let n4 = x.len() / 4 * 4;
    let (sc, off) = (_mm256_set1_pd(scale), _mm256_set1_pd(offset));
    let (lo, hi) = (
        _mm256_set1_pd(-f64::from(crate::F16_MAX)),
        _mm256_set1_pd(f64::from(crate::F16_MAX)),
    );
    let (zero, top) = (_mm256_setzero_pd(), _mm256_set1_pd(f64::from(qmax)));
    let mut i = 0;
    while i < n4 {
        // SAFETY: i + 4 <= x.len(), so the 16 bytes read lie inside `x`.
        let xs = _mm256_cvtps_pd(unsafe { _mm_loadu_ps(x.as_ptr().add(i)) });
        let nan = _mm256_cmp_pd::<_CMP_UNORD_Q>(xs, xs);
        let clamped = _mm256_min_pd(_mm256_max_pd(xs, lo), hi);
        let c = _mm256_div_pd(_mm256_sub_pd(clamped, off), sc);
        let r = _mm256_round_pd::<{ _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC }>(c);
        let r = _mm256_andnot_pd(nan, _mm256_min_pd(_mm256_max_pd(r, zero), top));
        let ints = _mm256_cvtpd_epi32(r);
        let mut lanes = [0i32; 4];
        // SAFETY: `lanes` is 16 bytes, exactly one __m128i.
        unsafe { _mm_storeu_si128(lanes.as_mut_ptr().cast::<__m128i>(), ints) };
        for (o, &l) in out[i..i + 4].iter_mut().zip(&lanes) {
            *o = l as u8;
        }
        i += 4;
    }
    crate::scalar::encode_codes(&x[n4..], wide, qmax, &mut out[n4..x.len()]);
}

/// [`crate::scalar::encode_bf16`], 8 values at a time with integer operations on the f32 bits:
/// NaN → `(bits >> 16) | 0x40`; otherwise `bits >> 16`, plus one where the dropped half is above
/// a tie or a tie with an odd kept bit (`half`'s rounding, written the same way).
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) fn encode_bf16(x: &[f32], out: &mut [u8]) {
    assert!(out.len() >= 2 * x.len(), "bf16 row too short");
    let n8 = x.len() / 8 * 8;
    let abs_mask = _mm256_set1_epi32(0x7FFF_FFFF);
    let inf = _mm256_set1_epi32(0x7F80_0000);
    let round_bit = _mm256_set1_epi32(0x8000);
    let rest = _mm256_set1_epi32(3 * 0x8000 - 1);
    let quiet = _mm256_set1_epi32(0x40);
    let zero = _mm256_setzero_si256();
    let mut i = 0;
    while i < n8 {
        // SAFETY: i + 8 <= x.len() (32 bytes read) and 2(i + 8) <= out.len() (16 bytes written).
        unsafe {
            let b = _mm256_castps_si256(_mm256_loadu_ps(x.as_ptr().add(i)));
            let nan = _mm256_cmpgt_epi32(_mm256_and_si256(b, abs_mask), inf);
            let top = _mm256_srli_epi32::<16>(b);
            let has_round = _mm256_xor_si256(
                _mm256_cmpeq_epi32(_mm256_and_si256(b, round_bit), zero),
                _mm256_set1_epi32(-1),
            );
            let has_rest = _mm256_xor_si256(
                _mm256_cmpeq_epi32(_mm256_and_si256(b, rest), zero),
                _mm256_set1_epi32(-1),
            );
            // All-ones lanes are −1: subtracting the mask adds one.
            let rounded = _mm256_sub_epi32(top, _mm256_and_si256(has_round, has_rest));
            let r = _mm256_blendv_epi8(rounded, _mm256_or_si256(top, quiet), nan);
            // Eight 16-bit results: pack (each 128-bit half holds four), then order the halves.
            let packed = _mm256_permute4x64_epi64::<0b11_01_10_00>(_mm256_packus_epi32(r, zero));
            _mm_storeu_si128(
                out.as_mut_ptr().add(2 * i).cast::<__m128i>(),
                _mm256_castsi256_si128(packed),
            );
        }
        i += 8;
    }
    crate::scalar::encode_bf16(&x[n8..], &mut out[2 * n8..2 * x.len()]);
}

/// [`crate::scalar::encode_fp8`]: the largest finite magnitude and the codes 8 values at a time.
/// The division is IEEE in both paths; the E4M3 rounding is `fp8::f32_to_e4m3`'s, lane-wise (the
/// subnormal branch rounds `a·512` to nearest even, the normal one adds `0x7FFFF` plus the kept
/// bit to the f32 bits and shifts), so every code is identical. Rows with scale 0 take the
/// portable loop.
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) fn encode_fp8(x: &[f32], out: &mut [u8]) {
    use crate::fp8::E4M3_MAX;
    use crate::kind::FP8_SCALE_BYTES;
    assert!(out.len() >= FP8_SCALE_BYTES + x.len(), "fp8 row too short");
    let n8 = x.len() / 8 * 8;
    let ld = |i: usize| {
        assert!(i + 8 <= x.len());
        // SAFETY: i + 8 <= x.len() (asserted): the 32 bytes read lie inside `x`.
        unsafe { _mm256_loadu_ps(x.as_ptr().add(i)) }
    };
    let sign = _mm256_set1_ps(-0.0);
    let inf = _mm256_set1_ps(f32::INFINITY);
    let mut m = _mm256_setzero_ps();
    for i in (0..n8).step_by(8) {
        let a = _mm256_andnot_ps(sign, ld(i));
        let finite = _mm256_cmp_ps::<_CMP_LT_OQ>(a, inf);
        m = _mm256_max_ps(m, _mm256_and_ps(a, finite));
    }
    let mut lanes = [0f32; 8];
    // SAFETY: `lanes` is 32 bytes, exactly one __m256.
    unsafe { _mm256_storeu_ps(lanes.as_mut_ptr(), m) };
    // Maxima are exact, so the order of the fold does not matter.
    let amax = x[n8..]
        .iter()
        .filter(|v| v.is_finite())
        .fold(lanes.iter().fold(0f32, |m, &v| m.max(v)), |m, v| {
            m.max(v.abs())
        });
    let scale = amax / E4M3_MAX;
    let (head, codes) = out.split_at_mut(FP8_SCALE_BYTES);
    head.copy_from_slice(&scale.to_le_bytes());
    if scale <= 0.0 {
        crate::scalar::encode_e4m3_codes(x, scale, codes);
        return;
    }
    let sc = _mm256_set1_ps(scale);
    let big = _mm256_set1_ps(E4M3_MAX);
    let small = _mm256_set1_ps(1.0 / 64.0);
    let times512 = _mm256_set1_ps(512.0);
    let max_code = _mm256_set1_epi32(0x7E);
    let half_minus_one = _mm256_set1_epi32(0x7FFFF);
    let one = _mm256_set1_epi32(1);
    let bias = _mm256_set1_epi32((127 - 7) << 3);
    let order = _mm256_setr_epi8(
        0, 4, 8, 12, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, //
        0, 4, 8, 12, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1,
    );
    for i in (0..n8).step_by(8) {
        let y = _mm256_div_ps(ld(i), sc);
        let nan = _mm256_cmp_ps::<_CMP_UNORD_Q>(y, y);
        let a = _mm256_andnot_ps(sign, y);
        let sign_bit = _mm256_srli_epi32::<24>(_mm256_and_si256(
            _mm256_castps_si256(y),
            _mm256_castps_si256(sign),
        ));
        let sub = _mm256_cvtps_epi32(_mm256_round_ps::<
            { _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC },
        >(_mm256_mul_ps(a, times512)));
        let bits = _mm256_castps_si256(a);
        let kept = _mm256_and_si256(_mm256_srli_epi32::<20>(bits), one);
        let rounded = _mm256_srli_epi32::<20>(_mm256_add_epi32(
            _mm256_add_epi32(bits, half_minus_one),
            kept,
        ));
        let normal = _mm256_min_epi32(_mm256_sub_epi32(rounded, bias), max_code);
        let is_small = _mm256_castps_si256(_mm256_cmp_ps::<_CMP_LT_OQ>(a, small));
        let is_big = _mm256_castps_si256(_mm256_cmp_ps::<_CMP_GE_OQ>(a, big));
        let magnitude =
            _mm256_blendv_epi8(_mm256_blendv_epi8(normal, sub, is_small), max_code, is_big);
        let code = _mm256_andnot_si256(
            _mm256_castps_si256(nan),
            _mm256_or_si256(magnitude, sign_bit),
        );
        let bytes = _mm256_shuffle_epi8(code, order);
        let packed = _mm_unpacklo_epi32(
            _mm256_castsi256_si128(bytes),
            _mm256_extracti128_si256::<1>(bytes),
        );
        assert!(i + 8 <= codes.len());
        // SAFETY: i + 8 <= codes.len() (asserted): the 8 bytes written lie inside `codes`.
        unsafe { _mm_storel_epi64(codes.as_mut_ptr().add(i).cast::<__m128i>(), packed) };
    }
    crate::scalar::encode_e4m3_codes(&x[n8..], scale, &mut codes[n8..x.len()]);
}

/// [`crate::scalar::encode_f16`] with F16C's `vcvtps2ph` (round to nearest even, the same
/// result as `half::f16::from_f32` for every input, NaN payloads included — tested).
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) fn encode_f16(x: &[f32], out: &mut [u8]) {
    assert!(out.len() >= 2 * x.len(), "f16 row too short");
    let n8 = x.len() / 8 * 8;
    let mut i = 0;
    while i < n8 {
        // SAFETY: i + 8 <= x.len() (32 bytes read) and 2(i + 8) <= out.len() (16 bytes written).
        unsafe {
            let v = _mm256_loadu_ps(x.as_ptr().add(i));
            let h = _mm256_cvtps_ph::<_MM_FROUND_TO_NEAREST_INT>(v);
            _mm_storeu_si128(out.as_mut_ptr().add(2 * i).cast::<__m128i>(), h);
        }
        i += 8;
    }
    crate::scalar::encode_f16(&x[n8..], &mut out[2 * n8..2 * x.len()]);
}
