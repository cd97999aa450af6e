//! Dequantization and quantization against the python `gguf` package, plus round-trip error
//! bounds of the reference quantizers for all 11 types.
//!
//! Vectors: `tests/data/gguf/quant_vectors.gguf` (see `gen_vectors.py` next to it).

use gguf::{dequantize_row, quantize_row, GgmlType, GgufFile};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

const ALL: [GgmlType; 11] = [
    GgmlType::F32,
    GgmlType::F16,
    GgmlType::BF16,
    GgmlType::Q4_0,
    GgmlType::Q4_1,
    GgmlType::Q5_0,
    GgmlType::Q5_1,
    GgmlType::Q8_0,
    GgmlType::Q4K,
    GgmlType::Q5K,
    GgmlType::Q6K,
];

/// The python package's name for a type (`GGMLQuantizationType.name`).
fn py_name(ty: GgmlType) -> String {
    ty.name().to_uppercase()
}

fn vectors() -> GgufFile {
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/data/gguf/quant_vectors.gguf"
    );
    GgufFile::from_bytes(std::fs::read(path).unwrap()).unwrap()
}

fn dequant(file: &GgufFile, name: &str) -> Vec<f32> {
    let info = file
        .tensor(name)
        .unwrap_or_else(|| panic!("{name} missing"));
    let mut out = vec![0f32; info.num_elems() as usize];
    dequantize_row(info.ty, file.tensor_data(info), &mut out).unwrap();
    out
}

#[test]
fn dequantize_matches_python_bit_for_bit() {
    let v = vectors();
    for ty in ALL {
        let q = v.tensor(&format!("{}.quant", py_name(ty))).unwrap();
        assert_eq!(q.ty, ty);
        let got = dequant(&v, &q.name);
        let expected = dequant(&v, &format!("{}.expected", py_name(ty)));
        assert_eq!(got.len(), 512);
        let mismatches = got
            .iter()
            .zip(&expected)
            .filter(|(a, b)| a.to_bits() != b.to_bits())
            .count();
        assert_eq!(mismatches, 0, "{ty:?}: {mismatches} of 512 differ");
        assert!(
            expected.iter().any(|&x| x != 0.0),
            "{ty:?} vector is trivial"
        );
    }
}

#[test]
fn quantize_matches_python_bytes() {
    let v = vectors();
    for ty in ALL {
        let Some(input) = v.tensor(&format!("{}.input", py_name(ty))) else {
            // K-quants: the python package cannot quantize them (vectors are random bytes).
            assert!(matches!(ty, GgmlType::Q4K | GgmlType::Q5K | GgmlType::Q6K));
            continue;
        };
        let input = dequant(&v, &input.name);
        let expected = v.tensor_data(v.tensor(&format!("{}.quant", py_name(ty))).unwrap());
        let mut got = Vec::new();
        quantize_row(ty, &input, &mut got).unwrap();
        assert_eq!(got.len(), expected.len(), "{ty:?}");
        let differing = got.iter().zip(expected).filter(|(a, b)| a != b).count();
        assert_eq!(differing, 0, "{ty:?}: {differing} bytes differ from python");
    }
}

/// Largest |x - dequant(quant(x))| relative to the block's max |x|, per type.
fn max_relative_error(ty: GgmlType, x: &[f32]) -> f32 {
    let mut q = Vec::new();
    quantize_row(ty, x, &mut q).unwrap();
    assert_eq!(q.len(), ty.row_bytes(x.len()).unwrap());
    let mut y = vec![0f32; x.len()];
    dequantize_row(ty, &q, &mut y).unwrap();
    let block = ty.block_elems().max(32);
    x.chunks(block)
        .zip(y.chunks(block))
        .map(|(xb, yb)| {
            let amax = xb.iter().fold(0f32, |a, v| a.max(v.abs()));
            let err = xb
                .iter()
                .zip(yb)
                .fold(0f32, |a, (p, q)| a.max((p - q).abs()));
            if amax == 0.0 {
                err
            } else {
                err / amax
            }
        })
        .fold(0f32, f32::max)
}

#[test]
fn round_trip_error_is_bounded() {
    let mut rng = ChaCha8Rng::seed_from_u64(7);
    // Bounds relative to the block's absolute max. Q4_0/Q5_0 map -max to level 15/31 of
    // (q-8)/(q-16) steps, so the far end loses a whole step (1/8, 1/16); the affine types lose
    // half a step of (max-min); the K-quants add 6-bit sub-scale rounding.
    let bound = |ty| match ty {
        GgmlType::F32 => 0.0,
        GgmlType::F16 => 1e-3,
        GgmlType::BF16 => 8e-3,
        GgmlType::Q8_0 => 0.005,
        GgmlType::Q4_0 => 0.126,
        GgmlType::Q4_1 => 0.069,
        GgmlType::Q5_0 => 0.0635,
        GgmlType::Q5_1 => 0.034,
        GgmlType::Q4K => 0.12,
        GgmlType::Q5K => 0.07,
        GgmlType::Q6K => 0.035,
    };
    for ty in ALL {
        for trial in 0..20 {
            // Magnitudes where the f16 block scale stays normal: with tiny blocks (|x| < ~1e-2)
            // the scale goes subnormal in f16 and loses relative precision, in ggml as here.
            let scale = 10f32.powf(rng.gen_range(-2.0..2.0));
            let shift = if trial % 2 == 0 {
                0.0
            } else {
                scale * rng.gen_range(-1.0..1.0)
            };
            let x: Vec<f32> = (0..1024)
                .map(|_| rng.gen_range(-1.0..1.0f32) * scale + shift)
                .collect();
            let err = max_relative_error(ty, &x);
            if std::env::var_os("GGUF_PRINT_ERR").is_some() {
                eprintln!("{ty:?} {trial} {err}");
            }
            assert!(
                err <= bound(ty),
                "{ty:?} trial {trial}: relative error {err} > {}",
                bound(ty)
            );
        }
    }
}

#[test]
fn degenerate_inputs_round_trip_without_nan() {
    for ty in ALL {
        for x in [vec![0f32; 256], vec![1.0; 256], vec![-3.5; 256]] {
            let mut q = Vec::new();
            quantize_row(ty, &x, &mut q).unwrap();
            let mut y = vec![f32::NAN; 256];
            dequantize_row(ty, &q, &mut y).unwrap();
            for (a, b) in x.iter().zip(&y) {
                assert!(
                    (a - b).abs() <= 0.02 * a.abs().max(1e-6) + 1e-6,
                    "{ty:?}: {a} -> {b}"
                );
            }
        }
    }
}
