//! AVX2+FMA+F16C paths of the integer encoders' range choice: [`choose_clipped`] (the 4-bit
//! clipped-range search of one `int4` row group; the 7 candidate ranges of [`CLIP_CANDIDATES`]
//! sit in the 8 f32 lanes), [`choose`] (the whole range of an `int8` group) and
//! [`encode_channels8`] (8 channels of an `int4c` group; channels in the lanes, tokens down the
//! rows: range, search, codes and nibble packing in one pass).
//!
//! Both perform, per group and per candidate, the operations of the portable
//! `affine::choose_clipped` / `affine::code` in the same order — the f16 rounding of `covering`
//! done by F16C with directed rounding (`RD(lo)` for the offset; `RU(RU_f32(w))`, which equals
//! `RU_f16(w)` since every f16 is an f32, for the scale), the squared error summed in the
//! portable 8-lane order — so every chosen scale, offset and code is bit-identical to the
//! portable path (tested). Groups holding NaN or values beyond ±65504 take the portable path.
//!
//! Callers must have checked AVX2+FMA+F16C at runtime (`Isa::use_avx2`). Never allocates, never
//! chooses which path runs.

use std::arch::x86_64::*;

use half::f16;

use crate::affine::{self, Affine, CLIP_CANDIDATES, F16_MAX};

/// `2^23`: adding and subtracting it rounds to the nearest integer (as `affine::squared_error`).
const ROUND: f32 = 8_388_608.0;

/// Lanes of a candidate vector: the 7 candidates, then candidate 0 again (never selected: the
/// selection is strict and in candidate order).
const LANES: usize = 8;

/// `RU_f32(w)` for `w ≥ 0` (4 lanes): the nearest-even conversion, bumped one ulp up where it
/// fell below `w`.
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
fn round_up_pd_ps(w: __m256d) -> __m128 {
    let r = _mm256_cvtpd_ps(w);
    let below = _mm256_castpd_si256(_mm256_cmp_pd::<_CMP_LT_OQ>(_mm256_cvtps_pd(r), w));
    // The 4 64-bit masks narrowed to 4 32-bit lanes (all-ones = −1: subtracting adds one ulp
    // to a non-negative float's bits).
    let m = _mm256_castsi256_si128(_mm256_permutevar8x32_epi32(
        below,
        _mm256_setr_epi32(0, 2, 4, 6, 0, 2, 4, 6),
    ));
    _mm_castsi128_ps(_mm_sub_epi32(_mm_castps_si128(r), m))
}

/// The stored `(offset, scale)` of `affine::covering(lo, hi, qmax)` per lane, as f16 bits.
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
fn covering8(lo: __m256, hi: __m256, qmax: __m256d) -> (__m128i, __m128i) {
    // Offset: lo rounded down to f16 (= nearest, stepped down when above `lo`).
    let off_h = _mm256_cvtps_ph::<{ _MM_FROUND_TO_NEG_INF }>(lo);
    let off = _mm256_cvtph_ps(off_h);
    // Scale: (hi − offset)/qmax in f64, rounded up to f16.
    let w = |h: __m128, o: __m128| {
        _mm256_div_pd(_mm256_sub_pd(_mm256_cvtps_pd(h), _mm256_cvtps_pd(o)), qmax)
    };
    let w_lo = w(_mm256_castps256_ps128(hi), _mm256_castps256_ps128(off));
    let w_hi = w(
        _mm256_extractf128_ps::<1>(hi),
        _mm256_extractf128_ps::<1>(off),
    );
    let s = _mm256_set_m128(round_up_pd_ps(w_hi), round_up_pd_ps(w_lo));
    let scale_h = _mm256_cvtps_ph::<{ _MM_FROUND_TO_POS_INF }>(s);
    (off_h, scale_h)
}

/// `1/scale`, or 0 where `scale` is 0 (as `affine::squared_error`).
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
fn inverse(scale: __m256) -> __m256 {
    let zero = _mm256_setzero_ps();
    let inv = _mm256_div_ps(_mm256_set1_ps(1.0), scale);
    _mm256_andnot_ps(_mm256_cmp_ps::<_CMP_EQ_OQ>(scale, zero), inv)
}

/// The squared error of `x` decoded with `(offset, scale)` per lane: the operations of
/// `affine::squared_error`'s `err` (unfused, `2^23` rounding), squared.
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
fn squared_err8(x: __m256, off: __m256, scale: __m256, inv: __m256, top: __m256) -> __m256 {
    let round = _mm256_set1_ps(ROUND);
    let y = _mm256_mul_ps(_mm256_sub_ps(x, off), inv);
    // `if y > 0 { y } else { 0 }` and `if y < top { y } else { top }` (y is never NaN here).
    let y = _mm256_min_ps(_mm256_max_ps(y, _mm256_setzero_ps()), top);
    let c = _mm256_sub_ps(_mm256_add_ps(y, round), round);
    let d = _mm256_sub_ps(x, _mm256_add_ps(_mm256_mul_ps(c, scale), off));
    _mm256_mul_ps(d, d)
}

/// True in the lanes holding NaN or a value beyond ±65504 (those need sanitising first).
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
fn needs_sanitising(x: __m256) -> __m256 {
    let abs = _mm256_andnot_ps(_mm256_set1_ps(-0.0), x);
    _mm256_or_ps(
        _mm256_cmp_ps::<_CMP_UNORD_Q>(x, x),
        _mm256_cmp_ps::<_CMP_GT_OQ>(abs, _mm256_set1_ps(F16_MAX)),
    )
}

/// `f32` lanes of a vector.
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
fn lanes(v: __m256) -> [f32; LANES] {
    let mut out = [0f32; LANES];
    // SAFETY: `out` is 32 bytes, exactly one __m256.
    unsafe { _mm256_storeu_ps(out.as_mut_ptr(), v) };
    out
}

/// `u16` lanes of 8 f16 values.
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
fn halves(v: __m128i) -> [u16; LANES] {
    let mut out = [0u16; LANES];
    // SAFETY: `out` is 16 bytes, exactly one __m128i.
    unsafe { _mm_storeu_si128(out.as_mut_ptr().cast::<__m128i>(), v) };
    out
}

/// `affine::finite_range(values)` for a group that needs no sanitising, 8 values at a time:
/// `None` when the group holds a NaN or a value beyond ±65504 (the caller takes the portable
/// path) or has fewer than 8 values.
#[target_feature(enable = "avx2,fma,f16c")]
fn plain_range(values: &[f32]) -> Option<(f32, f32)> {
    let n8 = values.len() / LANES * LANES;
    if n8 == 0 {
        return None;
    }
    let ld = |i: usize| {
        assert!(i + LANES <= values.len());
        // SAFETY: i + 8 <= values.len() (asserted): the 32 bytes read lie inside `values`.
        unsafe { _mm256_loadu_ps(values.as_ptr().add(i)) }
    };
    let (mut mn, mut mx) = (ld(0), ld(0));
    let mut bad = _mm256_setzero_ps();
    for i in (0..n8).step_by(LANES) {
        let x = ld(i);
        bad = _mm256_or_ps(bad, needs_sanitising(x));
        mn = _mm256_min_ps(x, mn);
        mx = _mm256_max_ps(x, mx);
    }
    if _mm256_movemask_ps(bad) != 0 || values[n8..].iter().any(|x| x.is_nan() || x.abs() > F16_MAX)
    {
        return None;
    }
    let fold = |v: [f32; LANES], tail: &[f32], pick: fn(f32, f32) -> bool| {
        let mut m = v[0];
        for &x in v[1..].iter().chain(tail) {
            if pick(x, m) {
                m = x;
            }
        }
        m
    };
    let mut min = fold(lanes(mn), &values[n8..], |x, m| x < m);
    let mut max = fold(lanes(mx), &values[n8..], |x, m| x > m);
    // The portable scan keeps the first of equal values: only the sign of a zero can tell.
    let first_zero = || *values.iter().find(|&&x| x == 0.0).expect("a zero extreme");
    if min == 0.0 {
        min = first_zero();
    }
    if max == 0.0 {
        max = first_zero();
    }
    Some((min, max))
}

/// `affine::choose(values, qmax)` (the whole finite range: `int8`), bit-identical.
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) fn choose(values: &[f32], qmax: u32) -> Affine {
    match plain_range(values) {
        Some((min, max)) => affine::covering(min, max, qmax),
        None => affine::choose(values, qmax),
    }
}

/// `affine::choose_clipped(values, qmax)`, bit-identical, with the candidates in lanes.
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) fn choose_clipped(values: &[f32], qmax: u32) -> Affine {
    const { assert!(CLIP_CANDIDATES.len() == LANES - 1) };
    let Some((min, max)) = plain_range(values) else {
        return affine::choose_clipped(values, qmax);
    };
    let n8 = values.len() / LANES * LANES;
    let range = max - min;
    let mut low = [0f32; LANES];
    let mut high = [0f32; LANES];
    for (k, &(l, h)) in CLIP_CANDIDATES.iter().enumerate() {
        (low[k], high[k]) = (l, h);
    }
    // SAFETY: both arrays are 32 bytes, exactly one __m256.
    let (low, high) = unsafe {
        (
            _mm256_loadu_ps(low.as_ptr()),
            _mm256_loadu_ps(high.as_ptr()),
        )
    };
    let (vmin, vmax, vrange) = (
        _mm256_set1_ps(min),
        _mm256_set1_ps(max),
        _mm256_set1_ps(range),
    );
    // Lanes 0 and 7 are the full range itself (not `min + 0·range`, which turns −0 into +0).
    let full = _mm256_castsi256_ps(_mm256_setr_epi32(-1, 0, 0, 0, 0, 0, 0, -1));
    let lo = _mm256_blendv_ps(_mm256_add_ps(vmin, _mm256_mul_ps(low, vrange)), vmin, full);
    let hi = _mm256_blendv_ps(_mm256_sub_ps(vmax, _mm256_mul_ps(high, vrange)), vmax, full);
    let (off_h, scale_h) = covering8(lo, hi, _mm256_set1_pd(f64::from(qmax)));
    let (off_b, scale_b) = (halves(off_h), halves(scale_h));
    let pick = |k: usize| Affine {
        scale: f16::from_bits(scale_b[k]),
        offset: f16::from_bits(off_b[k]),
    };
    if min == max {
        return pick(0);
    }
    let (off, scale) = (_mm256_cvtph_ps(off_h), _mm256_cvtph_ps(scale_h));
    let (inv, top) = (inverse(scale), _mm256_set1_ps(qmax as f32));
    let mut acc = [_mm256_setzero_ps(); LANES];
    for chunk in values[..n8].chunks_exact(LANES) {
        for (a, &x) in acc.iter_mut().zip(chunk) {
            *a = _mm256_add_ps(*a, squared_err8(_mm256_set1_ps(x), off, scale, inv, top));
        }
    }
    let mut tail = _mm256_setzero_ps();
    for &x in &values[n8..] {
        tail = _mm256_add_ps(tail, squared_err8(_mm256_set1_ps(x), off, scale, inv, top));
    }
    let mut total = acc[0];
    for a in &acc[1..] {
        total = _mm256_add_ps(total, *a);
    }
    let e = lanes(_mm256_add_ps(total, tail));
    let mut best = 0;
    for (k, &ek) in e.iter().enumerate().take(CLIP_CANDIDATES.len()).skip(1) {
        if ek < e[best] {
            best = k;
        }
    }
    pick(best)
}

/// Encodes channels `c0..c0 + 8` of an `int4c` group: `rows` is `[tokens, hd]`, `params` the
/// group's `(scale, offset)` header (4 bytes per channel), `codes` its `tokens` rows of `hd / 2`
/// bytes (bytes `c0/2..c0/2 + 4` of each row are overwritten). The result equals the portable
/// per-channel encoder's (`affine::choose_clipped` then `affine::code` on each column) bit for
/// bit. Returns false, writing nothing, when a channel holds NaN or a value beyond ±65504 (the
/// caller encodes those channels on the portable path).
///
/// # Panics
/// If `c0` is odd, or a slice is shorter than the shapes above (a caller bug).
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) fn encode_channels8(
    rows: &[f32],
    tokens: usize,
    hd: usize,
    c0: usize,
    params: &mut [u8],
    codes: &mut [u8],
) -> bool {
    assert!(tokens > 0 && c0.is_multiple_of(2) && c0 + LANES <= hd);
    assert!(rows.len() >= tokens * hd && params.len() >= 4 * hd && codes.len() >= tokens * hd / 2);
    let ld = |t: usize| {
        assert!(t < tokens);
        // SAFETY: t < tokens and c0 + 8 <= hd, so the 32 bytes read lie inside `rows`
        // (tokens · hd values, asserted above).
        unsafe { _mm256_loadu_ps(rows.as_ptr().add(t * hd + c0)) }
    };
    // Range per channel in token order (`x < min` / `x > max` keep the first of equal values,
    // as the portable scan).
    let (mut mn, mut mx) = (ld(0), ld(0));
    let mut bad = _mm256_setzero_ps();
    for t in 0..tokens {
        let x = ld(t);
        bad = _mm256_or_ps(bad, needs_sanitising(x));
        mn = _mm256_min_ps(x, mn);
        mx = _mm256_max_ps(x, mx);
    }
    if _mm256_movemask_ps(bad) != 0 {
        return false;
    }
    let range = _mm256_sub_ps(mx, mn);
    let constant = _mm256_cmp_ps::<_CMP_EQ_OQ>(mn, mx);
    let qmax = _mm256_set1_pd(15.0);
    let top = _mm256_set1_ps(15.0);
    let n8 = tokens / LANES * LANES;
    let (mut best_e, mut best_off, mut best_scale) = (
        _mm256_setzero_ps(),
        _mm256_setzero_ps(),
        _mm256_setzero_ps(),
    );
    for (k, &(l, h)) in CLIP_CANDIDATES.iter().enumerate() {
        let (lo, hi) = if k == 0 {
            (mn, mx)
        } else {
            (
                _mm256_add_ps(mn, _mm256_mul_ps(_mm256_set1_ps(l), range)),
                _mm256_sub_ps(mx, _mm256_mul_ps(_mm256_set1_ps(h), range)),
            )
        };
        let (off_h, scale_h) = covering8(lo, hi, qmax);
        let (off, scale) = (_mm256_cvtph_ps(off_h), _mm256_cvtph_ps(scale_h));
        let inv = inverse(scale);
        let mut acc = [_mm256_setzero_ps(); LANES];
        for t in 0..n8 {
            acc[t % LANES] =
                _mm256_add_ps(acc[t % LANES], squared_err8(ld(t), off, scale, inv, top));
        }
        let mut tail = _mm256_setzero_ps();
        for t in n8..tokens {
            tail = _mm256_add_ps(tail, squared_err8(ld(t), off, scale, inv, top));
        }
        let mut e = acc[0];
        for a in &acc[1..] {
            e = _mm256_add_ps(e, *a);
        }
        let e = _mm256_add_ps(e, tail);
        if k == 0 {
            (best_e, best_off, best_scale) = (e, off, scale);
        } else {
            // Strictly better, and never for a constant channel (the portable search returns
            // the full range for it before trying any candidate).
            let better = _mm256_andnot_ps(constant, _mm256_cmp_ps::<_CMP_LT_OQ>(e, best_e));
            best_e = _mm256_blendv_ps(best_e, e, better);
            best_off = _mm256_blendv_ps(best_off, off, better);
            best_scale = _mm256_blendv_ps(best_scale, scale, better);
        }
    }
    // Header: exact f16 values back to their bits (any rounding mode; the sign of zero stays).
    let (scale_b, off_b) = (
        halves(_mm256_cvtps_ph::<{ _MM_FROUND_TO_NEAREST_INT }>(best_scale)),
        halves(_mm256_cvtps_ph::<{ _MM_FROUND_TO_NEAREST_INT }>(best_off)),
    );
    let header = &mut params[4 * c0..4 * (c0 + LANES)];
    for ((p, s), o) in header.chunks_exact_mut(4).zip(scale_b).zip(off_b) {
        p[..2].copy_from_slice(&s.to_le_bytes());
        p[2..].copy_from_slice(&o.to_le_bytes());
    }
    // Codes: `affine::code` per value in f64 (IEEE division, nearest-even, clamp to 0..=15;
    // code 0 where the scale is 0), packed two channels per byte (even channel low).
    let widen = |v: __m256| {
        (
            _mm256_cvtps_pd(_mm256_castps256_ps128(v)),
            _mm256_cvtps_pd(_mm256_extractf128_ps::<1>(v)),
        )
    };
    let (s_lo, s_hi) = widen(best_scale);
    let (o_lo, o_hi) = widen(best_off);
    let zero_pd = _mm256_setzero_pd();
    let (z_lo, z_hi) = (
        _mm256_cmp_pd::<_CMP_EQ_OQ>(s_lo, zero_pd),
        _mm256_cmp_pd::<_CMP_EQ_OQ>(s_hi, zero_pd),
    );
    let top_pd = _mm256_set1_pd(15.0);
    let code4 = |x: __m256d, o: __m256d, s: __m256d, z: __m256d| {
        let c = _mm256_div_pd(_mm256_sub_pd(x, o), s);
        let r = _mm256_round_pd::<{ _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC }>(c);
        let r = _mm256_andnot_pd(z, _mm256_min_pd(_mm256_max_pd(r, zero_pd), top_pd));
        _mm256_cvtpd_epi32(r)
    };
    let row_bytes = hd / 2;
    for t in 0..tokens {
        let (x_lo, x_hi) = widen(ld(t));
        // Codes 0..=15 of channels c0..c0+8 as 16-bit lanes, then even | odd << 4 per pair.
        let c16 = _mm_packs_epi32(code4(x_lo, o_lo, s_lo, z_lo), code4(x_hi, o_hi, s_hi, z_hi));
        let pairs = _mm_or_si128(
            _mm_and_si128(c16, _mm_set1_epi32(0x0F)),
            _mm_srli_epi32::<12>(c16),
        );
        let bytes = _mm_packus_epi16(_mm_packs_epi32(pairs, pairs), _mm_setzero_si128());
        let packed = (_mm_cvtsi128_si32(bytes) as u32).to_le_bytes();
        let at = t * row_bytes + c0 / 2;
        codes[at..at + 4].copy_from_slice(&packed);
    }
    true
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::isa::Isa;
    use rand::{Rng, SeedableRng};

    /// A seeded group of `n` values in one of several shapes: spreads over many magnitudes,
    /// outliers, constants, signed zeros at the extremes, values on a grid (ties), f16 values,
    /// the f16 range's ends and f16 subnormals, and (`with_bad`) NaN, ±inf and out-of-range values.
    pub(crate) fn group(rng: &mut impl Rng, n: usize, with_bad: bool) -> Vec<f32> {
        let shapes = if with_bad { 10 } else { 9 };
        let a = 10f32.powf(rng.gen_range(-6.0..4.5));
        let mut v: Vec<f32> = match rng.gen_range(0..shapes) {
            0 => (0..n).map(|_| rng.gen_range(-a..a)).collect(),
            1 => (0..n)
                .map(|i| {
                    if i == n / 3 {
                        8.0 * a
                    } else {
                        rng.gen_range(-a..a)
                    }
                })
                .collect(),
            2 => vec![if rng.gen() { a } else { -0.0 }; n],
            3 => (0..n)
                .map(|_| match rng.gen_range(0..3) {
                    0 => 0.0,
                    1 => -0.0,
                    _ => rng.gen_range(0.0..a),
                })
                .collect(),
            4 => (0..n)
                .map(|_| match rng.gen_range(0..3) {
                    0 => 0.0,
                    1 => -0.0,
                    _ => -rng.gen_range(0.0..a),
                })
                .collect(),
            5 => (0..n)
                .map(|_| rng.gen_range(0..16) as f32 * 0.25 - 1.0)
                .collect(),
            6 => (0..n)
                .map(|_| f16::from_f32(rng.gen_range(-a..a)).to_f32())
                .collect(),
            7 => (0..n)
                .map(|_| match rng.gen_range(0..4) {
                    0 => F16_MAX,
                    1 => -F16_MAX,
                    _ => rng.gen_range(-F16_MAX..F16_MAX),
                })
                .collect(),
            8 => (0..n)
                .map(|_| rng.gen_range(-1e-6f32..1e-6) * rng.gen_range(0.0..1.0))
                .collect(),
            _ => (0..n).map(|_| rng.gen_range(-a..a)).collect(),
        };
        if with_bad && rng.gen_range(0..3) == 0 {
            let i = rng.gen_range(0..n);
            v[i] = [f32::NAN, f32::INFINITY, f32::NEG_INFINITY, 1e6, -7e4][rng.gen_range(0..5)];
        }
        v
    }

    /// 20,000 groups of `group`'s shapes (sizes cycling through `sizes`, NaN/±inf/out-of-range
    /// values included) choose the same scale and offset on the AVX2 path as on the portable one.
    fn assert_choice_matches_portable(
        seed: u64,
        sizes: [usize; 9],
        portable: impl Fn(&[f32]) -> Affine,
        avx2: impl Fn(&[f32]) -> Affine,
    ) {
        if Isa::detect() == Isa::Portable {
            return;
        }
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(seed);
        for case in 0..20_000 {
            let v = group(&mut rng, sizes[case % 9], true);
            let (want, got) = (portable(&v), avx2(&v));
            assert_eq!(
                (got.scale.to_bits(), got.offset.to_bits()),
                (want.scale.to_bits(), want.offset.to_bits()),
                "case {case}: {v:?}"
            );
        }
    }

    #[test]
    fn full_range_matches_the_portable_choice_bit_for_bit() {
        assert_choice_matches_portable(
            19,
            [64, 32, 16, 8, 9, 31, 40, 1, 3],
            |v| affine::choose(v, 255),
            // SAFETY: called only when AVX2, FMA and F16C were detected (not Portable).
            |v| unsafe { choose(v, 255) },
        );
    }

    #[test]
    fn row_search_matches_the_portable_search_bit_for_bit() {
        assert_choice_matches_portable(
            18,
            [32, 64, 16, 8, 9, 31, 40, 1, 3],
            |v| affine::choose_clipped(v, 15),
            // SAFETY: called only when AVX2, FMA and F16C were detected (not Portable).
            |v| unsafe { choose_clipped(v, 15) },
        );
    }
}
