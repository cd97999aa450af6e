//! Asymmetric integer quantisation of one channel group: choosing the f16 scale and offset, and
//! mapping values to unsigned codes `0..=qmax` (255 for int8, 15 for int4).
//!
//! Owns the rounding rules that make the documented bound hold *with the stored (f16)
//! parameters*: the offset is the group minimum rounded **down** to f16, the scale is
//! `(max − offset)/qmax` rounded **up** to f16, so every in-range value has a code within half a
//! step. Non-finite input: NaN takes code 0 (decodes to the offset) and is ignored when choosing
//! the range; ±inf and finite values beyond ±65504 saturate to ±65504 (the f16 range). Never
//! touches row layout.

use half::f16;

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

/// Parameters for `values` with codes `0..=qmax`.
pub(crate) fn choose(values: &[f32], qmax: u32) -> Affine {
    let (mut min, mut max) = (f32::INFINITY, f32::NEG_INFINITY);
    for x in values.iter().filter_map(|&x| sanitize(x)) {
        min = min.min(x);
        max = max.max(x);
    }
    if min > max {
        // All NaN: every code is 0 and decodes to 0.
        return Affine {
            scale: f16::ZERO,
            offset: f16::ZERO,
        };
    }
    let mut offset = f16::from_f32(min);
    if offset.to_f32() > min {
        offset = f16_next_down(offset);
    }
    // Exact in f64: both operands are f32 values within the f16 range.
    let range = f64::from(max) - offset.to_f64();
    let wanted = range / f64::from(qmax);
    let mut scale = f16::from_f64(wanted);
    if scale.to_f64() < wanted {
        scale = f16_next_up(scale);
    }
    Affine { scale, offset }
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
