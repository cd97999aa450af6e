//! The row kernels against each other and against decode + f32 arithmetic: portable vs AVX2
//! (bit-identical), `PreparedQuery` vs `dot_row` (bit-identical), `axpy_row` vs decode + fused
//! axpy (bit-identical), `dot_row` vs an f64 dot of the decoded row (within rounding), and the
//! shape errors. On AVX2 machines these run every `unsafe` SIMD loader.

use quant::{
    axpy_row, axpy_row_stored_with, axpy_row_with, decode_row_with, dot_row, dot_row_with,
    encode_row, encode_row_to_vec, encode_row_with, unrotate_stored_sum, Isa, KvCodecKind,
    PreparedQuery, QuantError,
};
use rand::{Rng, SeedableRng};

fn kinds_for(head_dim: usize) -> Vec<KvCodecKind> {
    let mut kinds = vec![
        KvCodecKind::F32,
        KvCodecKind::F16,
        KvCodecKind::Bf16,
        KvCodecKind::Fp8E4m3,
    ];
    for group in [8, 16, 32, 64, 128] {
        for kind in [
            KvCodecKind::Int8 { group },
            KvCodecKind::Int4 { group },
            KvCodecKind::Int8Hadamard { group },
            KvCodecKind::Int4Hadamard { group },
        ] {
            if kind.validate(head_dim).is_ok() {
                kinds.push(kind);
            }
        }
    }
    kinds
}

fn random_row(rng: &mut rand_chacha::ChaCha8Rng, n: usize) -> Vec<f32> {
    let center = rng.gen_range(-3.0f32..3.0);
    let spread = 10f32.powi(rng.gen_range(-3..3));
    (0..n)
        .map(|_| center + spread * rng.gen_range(-1.0f32..1.0))
        .collect()
}

#[test]
fn paths_are_bit_identical_and_match_decoded_arithmetic() {
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(11);
    for head_dim in [1usize, 7, 8, 13, 32, 40, 64, 100, 128] {
        for kind in kinds_for(head_dim) {
            for _ in 0..20 {
                let x = random_row(&mut rng, head_dim);
                let q = random_row(&mut rng, head_dim);
                let row = encode_row_to_vec(kind, &x).unwrap();

                let mut dec_p = vec![0f32; head_dim];
                let mut dec_v = vec![0f32; head_dim];
                decode_row_with(Isa::Portable, kind, &row, &mut dec_p).unwrap();
                decode_row_with(Isa::Avx2, kind, &row, &mut dec_v).unwrap();
                assert_eq!(bits(&dec_p), bits(&dec_v), "{kind} decode d={head_dim}");

                let dot_p = dot_row_with(Isa::Portable, kind, &q, &row);
                let dot_v = dot_row_with(Isa::Avx2, kind, &q, &row);
                assert_eq!(dot_p.to_bits(), dot_v.to_bits(), "{kind} dot d={head_dim}");
                assert_eq!(dot_p.to_bits(), dot_row(kind, &q, &row).to_bits());
                for isa in [Isa::Portable, Isa::Avx2] {
                    let prep = PreparedQuery::new_with(isa, kind, &q).unwrap();
                    assert_eq!(prep.dot(&row).to_bits(), dot_p.to_bits(), "{kind} prepared");
                }
                let exact: f64 = q
                    .iter()
                    .zip(&dec_p)
                    .map(|(a, b)| f64::from(*a) * f64::from(*b))
                    .sum();
                let magnitude: f64 = q
                    .iter()
                    .zip(&dec_p)
                    .map(|(a, b)| (f64::from(*a) * f64::from(*b)).abs())
                    .sum();
                assert!(
                    (f64::from(dot_p) - exact).abs() <= 1e-5 * magnitude + 1e-30,
                    "{kind} d={head_dim}: dot {dot_p} vs decoded {exact} (|terms| {magnitude})"
                );

                let w = rng.gen_range(-1.0f32..1.0);
                let acc0: Vec<f32> = (0..head_dim).map(|_| rng.gen_range(-1.0f32..1.0)).collect();
                let mut acc_p = acc0.clone();
                let mut acc_v = acc0.clone();
                axpy_row_with(Isa::Portable, kind, w, &row, &mut acc_p);
                axpy_row_with(Isa::Avx2, kind, w, &row, &mut acc_v);
                assert_eq!(bits(&acc_p), bits(&acc_v), "{kind} axpy d={head_dim}");
                let fused: Vec<f32> = acc0
                    .iter()
                    .zip(&dec_p)
                    .map(|(a, x)| w.mul_add(*x, *a))
                    .collect();
                assert_eq!(bits(&acc_p), bits(&fused), "{kind} axpy = decode + fma");
            }
        }
    }
}

/// Rotated codecs: a weighted sum of rows as stored, rotated back once, equals the sum of
/// `axpy_row` (which rotates each row back) within rounding, on both paths; unrotated codecs are
/// unchanged by the stored-domain kernels.
#[test]
fn stored_sums_rotated_back_once_match_per_row_axpy() {
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(13);
    for kind in kinds_for(64) {
        let rows: Vec<Vec<u8>> = (0..9)
            .map(|_| encode_row_to_vec(kind, &random_row(&mut rng, 64)).unwrap())
            .collect();
        let ws: Vec<f32> = (0..9).map(|_| rng.gen_range(0.0f32..1.0)).collect();
        let mut want = vec![0f32; 64];
        for (w, row) in ws.iter().zip(&rows) {
            axpy_row(kind, *w, row, &mut want);
        }
        for isa in [Isa::Portable, Isa::Avx2] {
            let mut got = vec![0f32; 64];
            for (w, row) in ws.iter().zip(&rows) {
                axpy_row_stored_with(isa, kind, *w, row, &mut got);
            }
            unrotate_stored_sum(kind, &mut got);
            if !kind.is_rotated() {
                assert_eq!(bits(&got), bits(&want), "{kind}");
                continue;
            }
            let scale = want.iter().map(|v| v.abs()).fold(0f32, f32::max);
            for (g, w) in got.iter().zip(&want) {
                assert!((g - w).abs() <= 1e-5 * scale, "{kind}: {g} vs {w}");
            }
        }
    }
}

#[test]
fn rotated_codecs_refuse_non_power_of_two_head_dims() {
    let kind = KvCodecKind::Int4Hadamard { group: 8 };
    let err = QuantError::RotationNeedsPowerOfTwo { head_dim: 40 };
    assert_eq!(kind.validate(40), Err(err.clone()));
    let mut out = vec![0u8; kind.bytes_per_row(40)];
    assert_eq!(encode_row(kind, &[1.0; 40], &mut out), Err(err.clone()));
    assert_eq!(
        decode_row_with(Isa::Portable, kind, &out, &mut [0.0; 40]),
        Err(err.clone())
    );
    assert_eq!(PreparedQuery::new(kind, &[0.0; 40]).unwrap_err(), err);
    assert!(err.to_string().contains("power-of-two head_dim"));
}

#[test]
fn results_are_repeatable_call_after_call() {
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(12);
    for kind in kinds_for(64) {
        let x = random_row(&mut rng, 64);
        let q = random_row(&mut rng, 64);
        let row = encode_row_to_vec(kind, &x).unwrap();
        assert_eq!(row, encode_row_to_vec(kind, &x).unwrap(), "{kind} encode");
        let first = dot_row(kind, &q, &row);
        for _ in 0..3 {
            assert_eq!(dot_row(kind, &q, &row).to_bits(), first.to_bits());
        }
    }
}

#[test]
fn int_dot_uses_scale_and_offset_of_each_group() {
    // Two groups with very different ranges: a wrong group index would show up at once.
    let kind = KvCodecKind::Int8 { group: 32 };
    let x: Vec<f32> = (0..64)
        .map(|i| {
            if i < 32 {
                100.0 + i as f32
            } else {
                -0.5 + 0.01 * i as f32
            }
        })
        .collect();
    let q = vec![1.0f32; 64];
    let row = encode_row_to_vec(kind, &x).unwrap();
    let want: f32 = x.iter().sum();
    assert!(
        (dot_row(kind, &q, &row) - want).abs() < 0.2,
        "{}",
        dot_row(kind, &q, &row)
    );
}

#[test]
fn bad_shapes_are_errors_not_panics_for_encode_and_decode() {
    let kind = KvCodecKind::Int4 { group: 32 };
    let mut out = vec![0u8; 39];
    assert_eq!(
        encode_row(kind, &[0.0; 64], &mut out),
        Err(QuantError::LengthMismatch {
            what: "encoded row bytes",
            expected: 40,
            got: 39
        })
    );
    let mut dec = vec![0f32; 48];
    assert!(matches!(
        decode_row_with(Isa::Portable, kind, &[0u8; 40], &mut dec),
        Err(QuantError::BadGroup { .. })
    ));
    assert_eq!(
        encode_row(KvCodecKind::F16, &[], &mut []),
        Err(QuantError::ZeroHeadDim)
    );
    assert!(PreparedQuery::new(KvCodecKind::Int8 { group: 12 }, &[0.0; 48]).is_err());
}

#[test]
#[should_panic(expected = "invalid row")]
fn dot_on_a_row_of_the_wrong_length_is_a_caller_bug() {
    dot_row(KvCodecKind::Fp8E4m3, &[0.0; 64], &[0u8; 64]);
}

fn bits(v: &[f32]) -> Vec<u32> {
    v.iter().map(|x| x.to_bits()).collect()
}

/// Encoding: every codec's bytes are identical on the portable and the SIMD path, for ordinary
/// rows and for rows with NaN (signalling and quiet payloads), ±inf, values beyond the f16
/// range, subnormals, exact ties and constant groups. Runs the AVX2 encoders (`encode_codes`,
/// `encode_f16`) on AVX2 machines.
#[test]
fn encode_paths_are_bit_identical() {
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(29);
    let specials = [
        f32::NAN,
        f32::from_bits(0x7f80_0001), // signalling NaN
        f32::from_bits(0xffc1_2345), // negative quiet NaN with a payload
        f32::INFINITY,
        f32::NEG_INFINITY,
        70000.0,
        -1.0e9,
        1.0e-8,
        65520.0,
        0.5,
        -0.0,
    ];
    for head_dim in [8usize, 24, 64, 128] {
        for kind in kinds_for(head_dim) {
            for trial in 0..60 {
                let mut x = random_row(&mut rng, head_dim);
                match trial % 4 {
                    1 => {
                        for _ in 0..3 {
                            let i = rng.gen_range(0..head_dim);
                            x[i] = specials[rng.gen_range(0..specials.len())];
                        }
                    }
                    2 => x.iter_mut().for_each(|v| *v = 1.25),
                    3 => x
                        .iter_mut()
                        .enumerate()
                        .for_each(|(i, v)| *v = (i % 7) as f32 * 0.5),
                    _ => {}
                }
                if kind.validate(head_dim).is_err() {
                    continue;
                }
                let n = kind.bytes_per_row(head_dim);
                let (mut p, mut v) = (vec![0u8; n], vec![0u8; n]);
                encode_row_with(Isa::Portable, kind, &x, &mut p).unwrap();
                encode_row_with(Isa::Avx2, kind, &x, &mut v).unwrap();
                assert_eq!(p, v, "{kind} head_dim {head_dim} trial {trial}: {x:?}");
            }
        }
    }
}

/// Encodes `values` as rows of lengths cycling through 1..=40 (every SIMD tail) on the portable
/// and the AVX2 path, with `lead` (if any) as each row's first value; the bytes must be equal.
fn encoders_agree(kind: KvCodecKind, values: &[f32], lead: Option<f32>) {
    let (mut at, mut len) = (0, 1);
    while at < values.len() {
        let take = len.min(values.len() - at);
        let row: Vec<f32> = lead
            .into_iter()
            .chain(values[at..at + take].iter().copied())
            .collect();
        let n = kind.bytes_per_row(row.len());
        let (mut p, mut v) = (vec![0u8; n], vec![0u8; n]);
        encode_row_with(Isa::Portable, kind, &row, &mut p).unwrap();
        encode_row_with(Isa::Avx2, kind, &row, &mut v).unwrap();
        assert_eq!(p, v, "{kind}: {row:?}");
        at += take;
        len = len % 40 + 1;
    }
}

/// The bf16 and fp8 encoders agree bit for bit on every path across the f32 range: a stride
/// through all 2^32 bit patterns (NaNs, infinities, subnormals included), every bf16 rounding
/// tie and its neighbours, and, for fp8 with a row scale of exactly 1 (a leading 448), every
/// E4M3 tie (normal and subnormal) and its neighbours.
#[test]
fn bf16_and_fp8_encoders_agree_across_the_f32_range() {
    let stride: Vec<f32> = (0..=u32::MAX).step_by(40_009).map(f32::from_bits).collect();
    let bf16_ties: Vec<f32> = (0..1u32 << 16)
        .step_by(7)
        .flat_map(|hi| [0x8000, 0x7FFF, 0x8001].map(|lo| f32::from_bits(hi << 16 | lo)))
        .collect();
    for values in [&stride, &bf16_ties] {
        encoders_agree(KvCodecKind::Bf16, values, None);
        encoders_agree(KvCodecKind::Fp8E4m3, values, None);
    }
    // Normal E4M3 ties: 3 kept mantissa bits, the dropped 20 at, just below and above half.
    let mut fp8_ties = Vec::new();
    for exp in 120u32..=135 {
        for kept in 0..8u32 {
            for low in [0x8_0000u32, 0x7_FFFF, 0x8_0001, 0, 0xF_FFFF] {
                for sign in [0, 1u32 << 31] {
                    let v = f32::from_bits(sign | exp << 23 | kept << 20 | low);
                    if v.abs() < 448.0 {
                        fp8_ties.push(v);
                    }
                }
            }
        }
    }
    // Subnormal E4M3 ties: a·512 = k + 1/2, and values just around them.
    for k in 0..8 {
        let t = (k as f32 + 0.5) / 512.0;
        for v in [
            t,
            f32::from_bits(t.to_bits() - 1),
            f32::from_bits(t.to_bits() + 1),
        ] {
            fp8_ties.extend([v, -v]);
        }
    }
    fp8_ties.extend([1.0 / 64.0, -1.0 / 64.0, 447.99997, 0.0, -0.0]);
    encoders_agree(KvCodecKind::Fp8E4m3, &fp8_ties, Some(448.0));
}
