//! Round-trip property tests: every codec's documented error bound (see `quant::row`) holds for
//! random rows over a wide magnitude range, asymmetric rows, constant rows, and rows with NaN,
//! ±inf, huge and tiny values mixed in (which must never panic). Also checks that the integer
//! codecs' online scale is tight, not merely safe (int4: tight for its clipped range, and its
//! squared error never above the min/max encoding's). Rotated codecs (`int8h`, `int4h`) are exactly
//! their storage codec applied to the rotated row, and decode with the same Euclidean error.

use proptest::prelude::*;
use quant::{
    decode_row, dot_row, encode_row_to_vec, hadamard_rotate, KvCodecKind, F16_MAX, FP8_SCALE_BYTES,
    INT_PARAM_BYTES_PER_GROUP,
};

const HEAD_DIM: usize = 64;
/// The largest fraction of a group's range the int4 encoder may clip off either end (see
/// `quant::row`).
const CLIP: f64 = 0.15;

fn kinds() -> Vec<KvCodecKind> {
    vec![
        KvCodecKind::F32,
        KvCodecKind::F16,
        KvCodecKind::Bf16,
        KvCodecKind::Fp8E4m3,
        KvCodecKind::Int8 { group: 64 },
        KvCodecKind::Int8 { group: 32 },
        KvCodecKind::Int4 { group: 64 },
        KvCodecKind::Int4 { group: 32 },
        KvCodecKind::Int8Hadamard { group: 64 },
        KvCodecKind::Int4Hadamard { group: 32 },
        KvCodecKind::Int4Hadamard { group: 64 },
    ]
}

/// Rows `(center + v)·2^e` with v in [-1, 1]: covers symmetric and offset rows at any scale.
fn scaled_row() -> impl Strategy<Value = Vec<f32>> {
    (
        -60i32..60,
        -4.0f32..4.0,
        prop::collection::vec(-1.0f32..1.0, HEAD_DIM),
    )
        .prop_map(|(e, center, v)| {
            let m = 2f32.powi(e);
            v.into_iter().map(|x| (center + x) * m).collect()
        })
}

fn constant_row() -> impl Strategy<Value = Vec<f32>> {
    prop_oneof![
        Just(0.0f32),
        -1e6f32..1e6,
        -1e-3f32..1e-3,
        Just(1.0f32),
        Just(-65504.0f32)
    ]
    .prop_map(|c| vec![c; HEAD_DIM])
}

fn special_value() -> impl Strategy<Value = f32> {
    prop_oneof![
        Just(f32::NAN),
        Just(f32::INFINITY),
        Just(f32::NEG_INFINITY),
        Just(f32::MAX),
        Just(-1e38f32),
        Just(1e-40f32),
        Just(-0.0f32),
        Just(70000.0f32),
    ]
}

/// A scaled row with up to 4 special values written over random positions.
fn row_with_specials() -> impl Strategy<Value = Vec<f32>> {
    (
        scaled_row(),
        prop::collection::vec((0..HEAD_DIM, special_value()), 0..4),
    )
        .prop_map(|(mut row, specials)| {
            for (i, s) in specials {
                row[i] = s;
            }
            row
        })
}

fn any_row() -> impl Strategy<Value = Vec<f32>> {
    prop_oneof![6 => scaled_row(), 2 => constant_row(), 2 => row_with_specials()]
}

fn f16_param(bytes: &[u8], i: usize) -> f32 {
    half::f16::from_bits(u16::from_le_bytes([bytes[2 * i], bytes[2 * i + 1]])).to_f32()
}

fn norm(v: impl Iterator<Item = f64>) -> f64 {
    v.map(|e| e * e).sum::<f64>().sqrt()
}

/// A rotated codec stores exactly what its storage codec stores for the rotated, sanitised row
/// (NaN → 0, ±65504 clamp), meeting that codec's bound; decoding rotates back, so the decoded
/// row's Euclidean error (against the rotated-back stored reference) is the stored error's.
fn check_rotated_bound(kind: KvCodecKind, x: &[f32]) -> Result<(), String> {
    let storage = kind.storage();
    let mut rotated: Vec<f32> = x
        .iter()
        .map(|&v| {
            if v.is_nan() {
                0.0
            } else {
                v.clamp(-F16_MAX, F16_MAX)
            }
        })
        .collect();
    hadamard_rotate(&mut rotated).map_err(|e| e.to_string())?;
    let bytes = encode_row_to_vec(kind, x).map_err(|e| e.to_string())?;
    if bytes != encode_row_to_vec(storage, &rotated).map_err(|e| e.to_string())? {
        return Err(format!(
            "{kind}: bytes differ from {storage} of the rotated row"
        ));
    }
    check_bound(storage, &rotated)?;
    let mut stored = vec![0f32; x.len()];
    decode_row(storage, &bytes, &mut stored).map_err(|e| e.to_string())?;
    let mut xh = vec![0f32; x.len()];
    decode_row(kind, &bytes, &mut xh).map_err(|e| e.to_string())?;
    if xh.iter().any(|v| !v.is_finite()) {
        return Err(format!("{kind}: decoded a non-finite value"));
    }
    // The reference: the stored row's target (saturated as the storage codec does), rotated back.
    let mut reference: Vec<f32> = rotated.iter().map(|v| v.clamp(-F16_MAX, F16_MAX)).collect();
    let stored_err = norm(
        stored
            .iter()
            .zip(&reference)
            .map(|(a, b)| f64::from(*a) - f64::from(*b)),
    );
    hadamard_rotate(&mut reference).map_err(|e| e.to_string())?;
    let decoded_err = norm(
        xh.iter()
            .zip(&reference)
            .map(|(a, b)| f64::from(*a) - f64::from(*b)),
    );
    let scale =
        norm(xh.iter().map(|&v| f64::from(v))) + norm(reference.iter().map(|&v| f64::from(v)));
    if decoded_err > stored_err + 1e-6 * scale + 1e-30 {
        return Err(format!(
            "{kind}: decoded error {decoded_err:e} > stored error {stored_err:e} (+ rounding)"
        ));
    }
    Ok(())
}

/// Checks the bound of `kind` on one row; returns an error message on violation.
fn check_bound(kind: KvCodecKind, x: &[f32]) -> Result<(), String> {
    if kind.is_rotated() {
        return check_rotated_bound(kind, x);
    }
    let bytes = encode_row_to_vec(kind, x).map_err(|e| e.to_string())?;
    let mut xh = vec![0f32; x.len()];
    decode_row(kind, &bytes, &mut xh).map_err(|e| e.to_string())?;
    let fail = |i: usize, bound: f64| {
        format!(
            "{kind}: x[{i}] = {:e} decoded {:e}, error {:e} > bound {bound:e}",
            x[i],
            xh[i],
            (f64::from(x[i]) - f64::from(xh[i])).abs()
        )
    };
    let err = |i: usize, reference: f32| (f64::from(reference) - f64::from(xh[i])).abs();
    match kind {
        KvCodecKind::Int4Channel { .. } => {
            return Err(format!("{kind} is a block codec, not a row codec"))
        }
        KvCodecKind::F32 => {
            for i in 0..x.len() {
                if x[i].to_bits() != xh[i].to_bits() {
                    return Err(fail(i, 0.0));
                }
            }
        }
        KvCodecKind::F16 | KvCodecKind::Bf16 => {
            let (rel, abs, limit) = if kind == KvCodecKind::F16 {
                (2f64.powi(-11), 2f64.powi(-25), 65504.0f32)
            } else {
                (2f64.powi(-8), 2f64.powi(-134), 3.0e38f32)
            };
            for i in 0..x.len() {
                if x[i].is_nan() {
                    if !xh[i].is_nan() {
                        return Err(format!("{kind}: NaN did not stay NaN"));
                    }
                } else if x[i].abs() <= limit {
                    let bound = rel * f64::from(x[i].abs()) + abs;
                    if err(i, x[i]) > bound {
                        return Err(fail(i, bound));
                    }
                } else if x[i].is_infinite() && xh[i] != x[i] {
                    return Err(format!("{kind}: inf did not stay inf"));
                }
            }
        }
        KvCodecKind::Fp8E4m3 => {
            let scale = f32::from_le_bytes(bytes[..FP8_SCALE_BYTES].try_into().unwrap());
            let amax = x
                .iter()
                .filter(|v| v.is_finite())
                .fold(0f32, |m, v| m.max(v.abs()));
            if scale != amax / 448.0 {
                return Err(format!("{kind}: scale {scale} is not amax/448 ({amax})"));
            }
            for i in 0..x.len() {
                if !xh[i].is_finite() {
                    return Err(format!("{kind}: decoded a non-finite value at {i}"));
                }
                if !x[i].is_finite() {
                    continue;
                }
                let bound = if scale >= f32::MIN_POSITIVE {
                    let (xa, s) = (f64::from(x[i].abs()), f64::from(scale));
                    2f64.powi(-4) * xa + 2f64.powi(-10) * s + 2f64.powi(-22) * xa
                } else {
                    f64::from(amax)
                };
                if err(i, x[i]) > bound {
                    return Err(fail(i, bound));
                }
            }
        }
        KvCodecKind::Int8 { group } | KvCodecKind::Int4 { group } => {
            let clipped = matches!(kind, KvCodecKind::Int4 { .. });
            let qmax = if clipped { 15.0 } else { 255.0 };
            let params = &bytes[..INT_PARAM_BYTES_PER_GROUP * (x.len() / group)];
            for (g, xg) in x.chunks_exact(group).enumerate() {
                let (s, o) = (f16_param(params, 2 * g), f16_param(params, 2 * g + 1));
                let clamped: Vec<f32> = xg
                    .iter()
                    .filter(|v| !v.is_nan())
                    .map(|v| v.clamp(-F16_MAX, F16_MAX))
                    .collect();
                // The scale is tight: at most one f16 ulp over (max − offset)/qmax, and the offset
                // is the minimum rounded down by at most one f16 ulp.
                if let (Some(min), Some(max)) = (
                    clamped.iter().copied().reduce(f32::min),
                    clamped.iter().copied().reduce(f32::max),
                ) {
                    let ulp_min = f64::from(min.abs()) * 2f64.powi(-10) + 2f64.powi(-24);
                    // int4 may clip up to CLIP·range off either end (f32 slack on the ends).
                    let (min64, max64) = (f64::from(min), f64::from(max));
                    let clip = if clipped { CLIP * (max64 - min64) } else { 0.0 };
                    let slack = 2f64.powi(-22) * min64.abs().max(max64.abs());
                    let (o64, s64) = (f64::from(o), f64::from(s));
                    if o64 > min64 + clip + slack || o64 < min64 - ulp_min {
                        return Err(format!("{kind}: offset {o} vs min {min}"));
                    }
                    let wanted = (max64 - o64) / qmax;
                    let least = (max64 - clip - slack - o64) / qmax;
                    if s64 < least || s64 > wanted * (1.0 + 2f64.powi(-10)) + 2f64.powi(-24) {
                        return Err(format!("{kind}: scale {s} vs needed {wanted}"));
                    }
                    if clipped {
                        // Never worse than the min/max encoding, whose error per element is at
                        // most half its (tight) scale.
                        let omm = min64 - ulp_min;
                        let smm = (max64 - omm) / qmax * (1.0 + 2f64.powi(-10)) + 2f64.powi(-24);
                        let (mut sse, mut sse_mm) = (0f64, 0f64);
                        for (k, &v) in xg.iter().enumerate() {
                            if !v.is_nan() {
                                let i = g * group + k;
                                sse += err(i, v.clamp(-F16_MAX, F16_MAX)).powi(2);
                                let e = smm / 2.0 + 2f64.powi(-24) * f64::from(xh[i].abs());
                                sse_mm += e * e;
                            }
                        }
                        if sse > sse_mm * (1.0 + 1e-4) {
                            return Err(format!("{kind}: group {g} squared error {sse:e} above the min/max bound {sse_mm:e}"));
                        }
                    }
                }
                for (k, &v) in xg.iter().enumerate() {
                    let i = g * group + k;
                    if !xh[i].is_finite() {
                        return Err(format!("{kind}: decoded a non-finite value at {i}"));
                    }
                    if v.is_nan() {
                        if xh[i] != o {
                            return Err(format!("{kind}: NaN should decode to the offset"));
                        }
                        continue;
                    }
                    let v = v.clamp(-F16_MAX, F16_MAX);
                    // Distance to the stored range: non-zero only for values int4 clipped.
                    let (lo, hi) = (f64::from(o), f64::from(o) + qmax * f64::from(s));
                    let d = (lo - f64::from(v)).max(f64::from(v) - hi).max(0.0);
                    let bound =
                        (f64::from(s) / 2.0).max(d) + 2f64.powi(-24) * f64::from(xh[i].abs());
                    if err(i, v) > bound {
                        return Err(fail(i, bound));
                    }
                }
            }
        }
        KvCodecKind::Int8Hadamard { .. } | KvCodecKind::Int4Hadamard { .. } => {
            unreachable!("rotated codecs are checked by check_rotated_bound")
        }
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    #[test]
    fn every_codec_meets_its_documented_bound(x in any_row()) {
        for kind in kinds() {
            if let Err(msg) = check_bound(kind, &x) {
                prop_assert!(false, "{}", msg);
            }
        }
    }

    #[test]
    fn kernels_never_panic_on_special_values(x in row_with_specials(), q in scaled_row()) {
        for kind in kinds() {
            let bytes = encode_row_to_vec(kind, &x).unwrap();
            let d = dot_row(kind, &q, &bytes);
            let finite_codec = !matches!(kind, KvCodecKind::F32 | KvCodecKind::F16 | KvCodecKind::Bf16);
            if finite_codec && q.iter().all(|v| v.is_finite()) {
                // Quantised codecs only ever hold finite values; the dot can still overflow f32
                // for huge q, so only NaN is ruled out.
                prop_assert!(!d.is_nan(), "{} gave NaN", kind);
            }
        }
    }
}

#[test]
fn constant_f16_exact_rows_are_exact_in_int_codecs() {
    for c in [0.0f32, 1.5, -3.25, 65504.0] {
        for kind in [
            KvCodecKind::Int8 { group: 32 },
            KvCodecKind::Int4 { group: 64 },
        ] {
            let bytes = encode_row_to_vec(kind, &[c; HEAD_DIM]).unwrap();
            let mut xh = [0f32; HEAD_DIM];
            decode_row(kind, &bytes, &mut xh).unwrap();
            assert!(xh.iter().all(|&v| v == c), "{kind} {c}: {xh:?}");
            assert_eq!(f16_param(&bytes, 0), 0.0, "scale of a constant row is 0");
        }
    }
}
