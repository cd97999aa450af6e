//! Asymmetric integer quantisation of one channel group: choosing the f16 scale and offset, and
//! mapping values to unsigned codes `0..=qmax` (255 for int8, 15 for int4).
//!
//! Owns the rounding rules that make the documented bound hold *with the stored (f16)
//! parameters*: the offset is the group minimum rounded **down** to f16, the scale is
//! `(max − offset)/qmax` rounded **up** to f16, so every in-range value has a code within half a
//! step. [`choose_clipped`] (int4) instead searches a few shrunk ranges for the smallest squared
//! error of the group, trading a larger error on clipped extremes for a finer step. Non-finite
//! input: NaN takes code 0 (decodes to the offset) and is ignored when choosing the range; ±inf
//! and finite values beyond ±65504 saturate to ±65504 (the f16 range). Never touches row layout.

use half::f16;

/// The AVX2 twin of the clipped-range search (bit-identical).
#[cfg(target_arch = "x86_64")]
pub(crate) mod clip_avx2;

/// Largest finite f16; integer codecs saturate inputs to ±this so parameters always fit in f16.
pub const F16_MAX: f32 = 65504.0;

/// The stored parameters of one group, widened to f32 (`x̂ = code·scale + offset`).
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct Affine {
    pub scale: f16,
    pub offset: f16,
}

fn f16_next_up(h: f16) -> f16 {
    let b = h.to_bits();
    match b {
        0x0000 | 0x8000 => f16::from_bits(0x0001),
        _ if b & 0x8000 == 0 => f16::from_bits(b + 1),
        _ => f16::from_bits(b - 1),
    }
}

fn f16_next_down(h: f16) -> f16 {
    let b = h.to_bits();
    match b {
        0x0000 | 0x8000 => f16::from_bits(0x8001),
        _ if b & 0x8000 == 0 => f16::from_bits(b - 1),
        _ => f16::from_bits(b + 1),
    }
}

/// `x` saturated to the f16 range, or `None` for NaN.
#[inline]
pub(crate) fn sanitize(x: f32) -> Option<f32> {
    if x.is_nan() {
        None
    } else {
        Some(x.clamp(-F16_MAX, F16_MAX))
    }
}

/// Parameters for `values` with codes `0..=qmax`, covering the whole finite range `[min, max]`.
pub(crate) fn choose(values: &[f32], qmax: u32) -> Affine {
    match finite_range(values) {
        Some((min, max)) => covering(min, max, qmax),
        None => ALL_NAN,
    }
}

/// Clipping candidates of [`choose_clipped`]: `(low, high)` shrink fractions of the range
/// `max − min`, the range tried being `[min + low·range, max − high·range]`. The first is the
/// full range, so the search can only lower the squared error.
pub(crate) const CLIP_CANDIDATES: &[(f32, f32)] = &[
    (0.0, 0.0),
    (0.025, 0.025),
    (0.05, 0.05),
    (0.075, 0.075),
    (0.1, 0.1),
    (0.125, 0.125),
    (0.15, 0.15),
];

/// Parameters for `values` with codes `0..=qmax` minimising the group's squared reconstruction
/// error over the ranges of [`CLIP_CANDIDATES`] (the full range wins ties). Values outside the
/// chosen range clamp to code 0 or `qmax`.
pub(crate) fn choose_clipped(values: &[f32], qmax: u32) -> Affine {
    let Some((min, max)) = finite_range(values) else {
        return ALL_NAN;
    };
    let full = covering(min, max, qmax);
    if min == max {
        return full;
    }
    let range = max - min;
    let mut best = (squared_error(values, full, qmax), full);
    for &(low, high) in &CLIP_CANDIDATES[1..] {
        let p = covering(min + low * range, max - high * range, qmax);
        let e = squared_error(values, p, qmax);
        if e < best.0 {
            best = (e, p);
        }
    }
    best.1
}

/// [`choose_clipped`] on an explicit instruction-set path (bit-identical on every path).
pub(crate) fn choose_clipped_with(isa: crate::isa::Isa, values: &[f32], qmax: u32) -> Affine {
    #[cfg(target_arch = "x86_64")]
    if isa.use_avx2() {
        // SAFETY: `use_avx2` is true only when AVX2, FMA and F16C were detected at runtime.
        return unsafe { crate::affine::clip_avx2::choose_clipped(values, qmax) };
    }
    let _ = isa;
    choose_clipped(values, qmax)
}

/// [`choose`] on the AVX2 path where `isa` allows (bit-identical).
pub(crate) fn choose_with(isa: crate::isa::Isa, values: &[f32], qmax: u32) -> Affine {
    #[cfg(target_arch = "x86_64")]
    if isa.use_avx2() {
        // SAFETY: `use_avx2` is true only when AVX2, FMA and F16C were detected at runtime.
        return unsafe { crate::affine::clip_avx2::choose(values, qmax) };
    }
    let _ = isa;
    choose(values, qmax)
}

const ALL_NAN: Affine = Affine {
    scale: f16::ZERO,
    offset: f16::ZERO,
};

/// `(min, max)` of the sanitised values (the first of equal values: a zero extreme keeps the
/// sign of the first zero), or `None` when all are NaN.
fn finite_range(values: &[f32]) -> Option<(f32, f32)> {
    let (mut min, mut max) = (f32::INFINITY, f32::NEG_INFINITY);
    // Explicit comparisons (what `f32::min`/`max` compile to on x86-64): the first of equal
    // values is kept, so the sign of a zero extreme is defined and the SIMD paths can match it.
    for x in values.iter().filter_map(|&x| sanitize(x)) {
        if x < min {
            min = x;
        }
        if x > max {
            max = x;
        }
    }
    (min <= max).then_some((min, max))
}

/// Stored parameters whose grid covers `[lo, hi]` (`lo ≤ hi`, both within the f16 range):
/// offset = `lo` rounded down to f16, scale = `(hi − offset)/qmax` rounded up.
pub(crate) fn covering(lo: f32, hi: f32, qmax: u32) -> Affine {
    let mut offset = f16::from_f32(lo);
    if offset.to_f32() > lo {
        offset = f16_next_down(offset);
    }
    // Exact in f64: both operands are f32 values within the f16 range.
    let range = f64::from(hi) - offset.to_f64();
    let wanted = range / f64::from(qmax);
    let mut scale = f16::from_f64(wanted);
    if scale.to_f64() < wanted {
        scale = f16_next_up(scale);
    }
    Affine { scale, offset }
}

/// Sum of squared errors of `values` (NaN skipped) decoded with `p`. Branch-free over lanes of
/// 8 so it vectorises; uses an f32 reciprocal, `2^23`-addition rounding and an unfused
/// multiply-add (no libm `fmaf` call), so a code or reconstruction may
/// differ from [`code`]'s on near-ties, which only affects the ranking, never the stored codes
/// (those always come from [`code`]).
fn squared_error(values: &[f32], p: Affine, qmax: u32) -> f32 {
    const LANES: usize = 8;
    // Adding and subtracting 2^23 rounds a value in [0, 2^23) to the nearest integer, ties to
    // even (the default rounding mode), without a libm call on targets lacking `roundps`.
    const ROUND: f32 = 8_388_608.0;
    let (scale, offset) = (p.scale.to_f32(), p.offset.to_f32());
    let inv = if scale == 0.0 { 0.0 } else { 1.0 / scale };
    let top = qmax as f32;
    // Error of one value within ±F16_MAX. Plain comparisons rather than `clamp`/`max`/`min`
    // (whose NaN rules keep LLVM from vectorising the lanes below).
    let err = |x: f32| -> f32 {
        let y = (x - offset) * inv;
        let y = if y > 0.0 { y } else { 0.0 };
        let y = if y < top { y } else { top };
        let c = (y + ROUND) - ROUND;
        x - (c * scale + offset)
    };
    if values.iter().any(|x| x.is_nan() || x.abs() > F16_MAX) {
        // Rare: NaN (contributes nothing) or values to saturate first.
        return values
            .iter()
            .filter_map(|&x| sanitize(x))
            .map(|x| err(x) * err(x))
            .sum();
    }
    let mut acc = [0f32; LANES];
    let chunks = values.chunks_exact(LANES);
    let tail: f32 = chunks.remainder().iter().map(|&x| err(x) * err(x)).sum();
    for chunk in chunks {
        let lanes: &[f32; LANES] = chunk.try_into().expect("chunks_exact yields LANES values");
        for (a, &x) in acc.iter_mut().zip(lanes) {
            let d = err(x);
            *a += d * d;
        }
    }
    acc.iter().sum::<f32>() + tail
}

/// `p`'s scale and offset widened to f64 once per group, for [`code`].
#[inline]
pub(crate) fn widen(p: Affine) -> (f64, f64) {
    (p.scale.to_f64(), p.offset.to_f64())
}

/// The code of `x` under the widened parameters `(scale, offset)` (nearest, ties to even,
/// clamped to `0..=qmax`).
#[inline]
pub(crate) fn code(x: f32, (scale, offset): (f64, f64), qmax: u32) -> u8 {
    let Some(x) = sanitize(x) else {
        return 0;
    };
    if scale == 0.0 {
        return 0;
    }
    let c = ((f64::from(x) - offset) / scale).round_ties_even();
    c.clamp(0.0, f64::from(qmax)) as u8
}

/// `code·scale + offset` with one rounding (the dequantisation every path uses).
#[inline(always)]
pub(crate) fn dequant(code: u8, scale: f32, offset: f32) -> f32 {
    f32::from(code).mul_add(scale, offset)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stored_parameters_cover_the_range() {
        for (lo, hi) in [
            (-1.0f32, 1.0f32),
            (0.1, 0.1000001),
            (-65504.0, 65504.0),
            (3.3, 3.3),
        ] {
            let vals = [lo, hi, (lo + hi) / 2.0];
            for qmax in [15u32, 255] {
                let p = choose(&vals, qmax);
                let (s, o) = (p.scale.to_f32(), p.offset.to_f32());
                assert!(o <= lo, "offset {o} above min {lo}");
                assert!(f64::from(o) + f64::from(s) * f64::from(qmax) >= f64::from(hi));
                for &x in &vals {
                    let xh = dequant(code(x, widen(p), qmax), s, o);
                    assert!(
                        (x - xh).abs() <= s / 2.0 + 1e-7 * x.abs().max(1e-30),
                        "{x} {xh}"
                    );
                }
            }
        }
    }

    fn exact_squared_error(values: &[f32], p: Affine, qmax: u32) -> f64 {
        let (s, o) = (p.scale.to_f32(), p.offset.to_f32());
        values
            .iter()
            .map(|&x| f64::from(x - dequant(code(x, widen(p), qmax), s, o)).powi(2))
            .sum()
    }

    #[test]
    fn clipping_lowers_the_error_of_a_group_with_an_outlier() {
        // 31 values spread over [-1, 1] and one outlier at 6: the full range wastes most codes.
        let mut vals: Vec<f32> = (0..31).map(|i| -1.0 + i as f32 / 15.0).collect();
        vals.push(6.0);
        let full = choose(&vals, 15);
        let clipped = choose_clipped(&vals, 15);
        assert_ne!(clipped, full);
        assert!(clipped.offset.to_f32() + 15.0 * clipped.scale.to_f32() < 6.0);
        let (e_full, e_clip) = (
            exact_squared_error(&vals, full, 15),
            exact_squared_error(&vals, clipped, 15),
        );
        assert!(e_clip < e_full, "{e_clip} !< {e_full}");
    }

    #[test]
    fn values_on_the_full_grid_keep_the_full_range() {
        // Exactly representable on the min/max grid: zero error, no candidate can beat it.
        let vals: Vec<f32> = (0..32).map(|i| (i % 16) as f32 * 0.25 - 1.0).collect();
        assert_eq!(choose_clipped(&vals, 15), choose(&vals, 15));
        assert_eq!(exact_squared_error(&vals, choose(&vals, 15), 15), 0.0);
        // Constant and all-NaN groups too.
        assert_eq!(choose_clipped(&[2.5; 8], 15), choose(&[2.5; 8], 15));
        assert_eq!(
            choose_clipped(&[f32::NAN; 8], 15),
            choose(&[f32::NAN; 8], 15)
        );
    }

    #[test]
    fn next_up_and_down_step_one_ulp() {
        assert_eq!(f16_next_up(f16::ONE).to_f32(), 1.0 + 2f32.powi(-10));
        assert_eq!(f16_next_down(f16::ONE).to_f32(), 1.0 - 2f32.powi(-11));
        assert_eq!(f16_next_down(f16::NEG_ONE).to_f32(), -1.0 - 2f32.powi(-10));
        assert_eq!(f16_next_up(f16::ZERO).to_f32(), 2f32.powi(-24));
        assert_eq!(f16_next_down(f16::ZERO).to_f32(), -(2f32.powi(-24)));
    }

    #[test]
    fn nan_and_infinity_do_not_break_the_range() {
        let p = choose(&[f32::NAN, 1.0, 2.0], 255);
        assert_eq!(p.offset.to_f32(), 1.0);
        assert_eq!(code(f32::NAN, widen(p), 255), 0);
        let p = choose(&[f32::NAN, f32::NAN], 15);
        assert_eq!((p.scale.to_f32(), p.offset.to_f32()), (0.0, 0.0));
        let p = choose(&[f32::INFINITY, f32::NEG_INFINITY], 255);
        assert_eq!(p.offset.to_f32(), -F16_MAX);
        assert!(p.scale.is_finite());
    }
}
