//! Cross-module kernel tests: decoding against llama.cpp's Python reference, matmul against an
//! f64 reference dot with a derived quantisation bound, scalar == AVX2 bit for bit, and batch /
//! thread-split invariance. Test-only; owns no production code.

use super::act_quant::QK8;
use super::cpu::CpuFeatures;
use super::matmul::{matmul_with_features, QMatrix};
use super::pool::ThreadPool;
use super::row_f32::row_to_f32;
use super::KernelError;
use gguf::GgmlType;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

const ALL_TYPES: [GgmlType; 11] = [
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

/// Portable, AVX2 without VNNI, AVX2 with AVX-VNNI (only where the CPU has it: elsewhere this
/// clamps to plain AVX2) and everything detected (each clamped to this CPU).
pub(super) fn both_paths() -> [CpuFeatures; 4] {
    [
        CpuFeatures::PORTABLE,
        CpuFeatures::AVX2.clamp_to_detected(),
        CpuFeatures {
            avxvnni: true,
            ..CpuFeatures::AVX2
        }
        .clamp_to_detected(),
        CpuFeatures::detect(),
    ]
}

/// Byte offsets of the f16 scale fields inside one block.
fn scale_offsets(ty: GgmlType) -> &'static [usize] {
    match ty {
        GgmlType::Q4_0 | GgmlType::Q5_0 | GgmlType::Q8_0 => &[0],
        GgmlType::Q4_1 | GgmlType::Q5_1 | GgmlType::Q4K | GgmlType::Q5K => &[0, 2],
        GgmlType::Q6K => &[208],
        GgmlType::F32 | GgmlType::F16 | GgmlType::BF16 => &[],
    }
}

/// Random but well-formed weights: random bits, finite scales.
pub(super) fn random_matrix(
    rng: &mut ChaCha8Rng,
    ty: GgmlType,
    num_rows: usize,
    row_len: usize,
) -> Vec<u8> {
    let n = num_rows * row_len;
    match ty {
        GgmlType::F32 => (0..n)
            .flat_map(|_| rng.gen_range(-1.0f32..1.0).to_le_bytes())
            .collect(),
        GgmlType::F16 => (0..n)
            .flat_map(|_| {
                half::f16::from_f32(rng.gen_range(-1.0f32..1.0))
                    .to_bits()
                    .to_le_bytes()
            })
            .collect(),
        GgmlType::BF16 => (0..n)
            .flat_map(|_| {
                half::bf16::from_f32(rng.gen_range(-1.0f32..1.0))
                    .to_bits()
                    .to_le_bytes()
            })
            .collect(),
        _ => {
            let bytes = ty.row_bytes(row_len).expect("whole blocks") * num_rows;
            let mut data: Vec<u8> = (0..bytes).map(|_| rng.gen()).collect();
            for blk in data.chunks_exact_mut(ty.block_bytes()) {
                for &off in scale_offsets(ty) {
                    let v = half::f16::from_f32(rng.gen_range(-0.05f32..0.05));
                    blk[off..off + 2].copy_from_slice(&v.to_bits().to_le_bytes());
                }
            }
            data
        }
    }
}

pub(super) fn random_acts(rng: &mut ChaCha8Rng, num_tokens: usize, row_len: usize) -> Vec<f32> {
    (0..num_tokens * row_len)
        .map(|_| rng.gen_range(-3.0f32..3.0))
        .collect()
}

pub(super) fn dequant_matrix(
    ty: GgmlType,
    data: &[u8],
    num_rows: usize,
    row_len: usize,
) -> Vec<f32> {
    let rb = ty.row_bytes(row_len).expect("whole blocks");
    let mut out = vec![0f32; num_rows * row_len];
    for r in 0..num_rows {
        row_to_f32(
            CpuFeatures::PORTABLE,
            ty,
            &data[r * rb..(r + 1) * rb],
            &mut out[r * row_len..(r + 1) * row_len],
        );
    }
    out
}

/// The activation block size of types on an integer path (`Q8_0`-like blocks of 32 for the
/// 32-element types, `Q8_K`-like blocks of 256 for the K-quants), `None` for float types.
fn act_block(ty: GgmlType) -> Option<usize> {
    match ty {
        GgmlType::Q4_0 | GgmlType::Q4_1 | GgmlType::Q5_0 | GgmlType::Q5_1 | GgmlType::Q8_0 => {
            Some(QK8)
        }
        GgmlType::Q4K | GgmlType::Q5K | GgmlType::Q6K => Some(256),
        GgmlType::F32 | GgmlType::F16 | GgmlType::BF16 => None,
    }
}

#[test]
fn row_decoding_matches_llama_cpp_python_reference() {
    let cases: Vec<serde_json::Value> =
        serde_json::from_str(include_str!("../tests/data/kernels_dequant.json"))
            .expect("valid test data");
    assert_eq!(cases.len(), 8);
    for case in cases {
        let ty = match case["type"].as_str().expect("type") {
            "Q4_0" => GgmlType::Q4_0,
            "Q4_1" => GgmlType::Q4_1,
            "Q5_0" => GgmlType::Q5_0,
            "Q5_1" => GgmlType::Q5_1,
            "Q8_0" => GgmlType::Q8_0,
            "Q4_K" => GgmlType::Q4K,
            "Q5_K" => GgmlType::Q5K,
            "Q6_K" => GgmlType::Q6K,
            other => panic!("unexpected type {other}"),
        };
        let hex = case["bytes_hex"].as_str().expect("hex");
        let bytes: Vec<u8> = (0..hex.len() / 2)
            .map(|i| u8::from_str_radix(&hex[2 * i..2 * i + 2], 16).expect("hex"))
            .collect();
        let expected: Vec<f32> = case["values"]
            .as_array()
            .expect("values")
            .iter()
            .map(|v| v.as_f64().expect("f") as f32)
            .collect();
        let mut got = vec![0f32; expected.len()];
        for f in both_paths() {
            row_to_f32(f, ty, &bytes, &mut got);
            for (i, (g, e)) in got.iter().zip(&expected).enumerate() {
                assert!(
                    (g - e).abs() <= 1e-6 * e.abs().max(1e-3),
                    "{ty:?} elem {i}: {g} vs {e}"
                );
            }
        }
    }
}

#[test]
fn matmul_matches_f64_reference_within_quantisation_bound_and_paths_agree() {
    let mut rng = ChaCha8Rng::seed_from_u64(11);
    let pool = ThreadPool::new(2);
    for ty in ALL_TYPES {
        for (num_rows, row_len, num_tokens) in
            [(37usize, 256usize, 5usize), (8, 512, 1), (3, 256, 9)]
        {
            let data = random_matrix(&mut rng, ty, num_rows, row_len);
            let x = random_acts(&mut rng, num_tokens, row_len);
            let w = QMatrix {
                ty,
                num_rows,
                row_len,
                data: &data,
                packed: None,
            };
            let wf = dequant_matrix(ty, &data, num_rows, row_len);
            let mut ys = Vec::new();
            for f in both_paths() {
                let mut y = vec![f32::NAN; num_tokens * num_rows];
                matmul_with_features(&pool, &w, &x, num_tokens, &mut y, f).expect("valid shapes");
                ys.push(y);
            }
            let bits = |v: &Vec<f32>| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
            assert_eq!(bits(&ys[0]), bits(&ys[1]), "{ty:?}: scalar and AVX2 differ");
            assert_eq!(bits(&ys[0]), bits(&ys[2]), "{ty:?}: scalar and VNNI differ");
            assert_within_quant_bound(ty, &wf, &x, &ys[0], num_rows, row_len, num_tokens);
        }
    }
}

/// Every output of `y` (`[num_tokens, num_rows]`) within the 8-bit activation bound of the f64
/// dot of the dequantised rows `wf` with `x`.
pub(super) fn assert_within_quant_bound(
    ty: GgmlType,
    wf: &[f32],
    x: &[f32],
    y: &[f32],
    num_rows: usize,
    row_len: usize,
    num_tokens: usize,
) {
    for t in 0..num_tokens {
        let xt = &x[t * row_len..(t + 1) * row_len];
        for r in 0..num_rows {
            let wr = &wf[r * row_len..(r + 1) * row_len];
            let exact: f64 = wr
                .iter()
                .zip(xt)
                .map(|(a, b)| f64::from(*a) * f64::from(*b))
                .sum();
            let mag: f64 = wr
                .iter()
                .zip(xt)
                .map(|(a, b)| f64::from(a.abs()) * f64::from(b.abs()))
                .sum();
            // 8-bit activations: each x is off by at most half a step d_x = amax/127
            // of its block.
            let quant_bound: f64 = if let Some(block) = act_block(ty) {
                wr.chunks(block)
                    .zip(xt.chunks(block))
                    .map(|(wb, xb)| {
                        let dx = f64::from(xb.iter().fold(0f32, |m, v| m.max(v.abs()))) / 127.0;
                        wb.iter().map(|v| f64::from(v.abs())).sum::<f64>() * dx * 0.5
                    })
                    .sum()
            } else {
                0.0
            };
            let tol = quant_bound * 1.001 + 2e-6 * mag + 1e-6;
            let got = f64::from(y[t * num_rows + r]);
            assert!(
                (got - exact).abs() <= tol,
                "{ty:?} t={t} r={r}: {got} vs {exact} (tol {tol})"
            );
        }
    }
}

#[test]
fn matmul_is_batch_position_and_thread_invariant() {
    let mut rng = ChaCha8Rng::seed_from_u64(12);
    let pools = [ThreadPool::new(1), ThreadPool::new(2), ThreadPool::new(3)];
    let max_tokens = 17;
    for ty in ALL_TYPES {
        let (num_rows, row_len) = (67, 256);
        let data = random_matrix(&mut rng, ty, num_rows, row_len);
        let w = QMatrix {
            ty,
            num_rows,
            row_len,
            data: &data,
            packed: None,
        };
        let x = random_acts(&mut rng, max_tokens + 3, row_len);
        for f in both_paths() {
            // Reference: every token alone, single thread.
            let single: Vec<Vec<u32>> = (0..max_tokens + 3)
                .map(|t| {
                    let mut y = vec![0f32; num_rows];
                    matmul_with_features(
                        &pools[0],
                        &w,
                        &x[t * row_len..(t + 1) * row_len],
                        1,
                        &mut y,
                        f,
                    )
                    .expect("ok");
                    y.iter().map(|v| v.to_bits()).collect()
                })
                .collect();
            for pool in &pools {
                for num_tokens in 1..=max_tokens {
                    for first in [0usize, 3] {
                        let xs = &x[first * row_len..(first + num_tokens) * row_len];
                        let mut y = vec![0f32; num_tokens * num_rows];
                        matmul_with_features(pool, &w, xs, num_tokens, &mut y, f).expect("ok");
                        for t in 0..num_tokens {
                            let got: Vec<u32> = y[t * num_rows..(t + 1) * num_rows]
                                .iter()
                                .map(|v| v.to_bits())
                                .collect();
                            assert_eq!(
                                got,
                                single[first + t],
                                "{ty:?} {f:?} threads={} n={num_tokens} t={t}",
                                pool.num_threads()
                            );
                        }
                    }
                }
            }
        }
    }
}

#[test]
fn matmul_rejects_bad_shapes() {
    let pool = ThreadPool::new(1);
    let data = vec![0u8; 2 * 20];
    let w = QMatrix {
        ty: GgmlType::Q4_1,
        num_rows: 2,
        row_len: 32,
        data: &data,
        packed: None,
    };
    let mut y = vec![0f32; 2];
    assert!(matches!(
        matmul_with_features(&pool, &w, &[0.0; 31], 1, &mut y, CpuFeatures::PORTABLE),
        Err(KernelError::ActivationLen { .. })
    ));
    assert!(matches!(
        matmul_with_features(&pool, &w, &[0.0; 32], 1, &mut y[..1], CpuFeatures::PORTABLE),
        Err(KernelError::OutputLen { .. })
    ));
    let short = QMatrix {
        data: &data[..39],
        packed: None,
        ..w
    };
    assert!(matches!(
        matmul_with_features(&pool, &short, &[0.0; 32], 1, &mut y, CpuFeatures::PORTABLE),
        Err(KernelError::WeightBytes { .. })
    ));
    let odd = QMatrix { row_len: 33, ..w };
    assert!(matches!(
        matmul_with_features(&pool, &odd, &[0.0; 33], 1, &mut y, CpuFeatures::PORTABLE),
        Err(KernelError::RowLenNotBlockMultiple { .. })
    ));
    // Zero tokens is a no-op, not an error.
    assert_eq!(
        matmul_with_features(&pool, &w, &[], 0, &mut [], CpuFeatures::PORTABLE),
        Ok(())
    );
}

#[test]
fn fused_matmul_equals_separate_matmuls_bit_for_bit() {
    // Q/K/V-like group of block types (one fused dispatch), and a group with a float type
    // (falls back to separate calls).
    check_fused_groups(
        21,
        96,
        &[
            &[
                (GgmlType::Q4_1, 37),
                (GgmlType::Q4_1, 9),
                (GgmlType::Q8_0, 16),
            ],
            &[(GgmlType::Q5_0, 5), (GgmlType::F16, 7)],
            &[
                (GgmlType::Q4_0, 3),
                (GgmlType::Q5_1, 0),
                (GgmlType::Q8_0, 70),
            ],
        ],
    );
}

#[test]
fn fused_kquant_matmul_equals_separate_matmuls_bit_for_bit() {
    // All K-quants (one fused dispatch on Q8_K activations); K-quants mixed with a 32-element
    // type (separate calls).
    check_fused_groups(
        23,
        512,
        &[
            &[(GgmlType::Q4K, 37), (GgmlType::Q6K, 9), (GgmlType::Q5K, 16)],
            &[(GgmlType::Q4K, 5), (GgmlType::Q8_0, 7), (GgmlType::Q6K, 3)],
        ],
    );
}

fn check_fused_groups(seed: u64, row_len: usize, groups: &[&[(GgmlType, usize)]]) {
    use super::matmul_many::matmul_many_with_features;
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    for &group in groups {
        let datas: Vec<Vec<u8>> = group
            .iter()
            .map(|&(ty, rows)| random_matrix(&mut rng, ty, rows, row_len))
            .collect();
        let ws: Vec<QMatrix> = group
            .iter()
            .zip(&datas)
            .map(|(&(ty, num_rows), data)| QMatrix {
                ty,
                num_rows,
                row_len,
                data,
                packed: None,
            })
            .collect();
        for num_tokens in [0usize, 1, 5] {
            let x = random_acts(&mut rng, num_tokens, row_len);
            for threads in [1usize, 2, 3] {
                let pool = ThreadPool::new(threads);
                for features in both_paths() {
                    let want: Vec<Vec<f32>> = ws
                        .iter()
                        .map(|w| {
                            let mut y = vec![0f32; num_tokens * w.num_rows];
                            matmul_with_features(&pool, w, &x, num_tokens, &mut y, features)
                                .expect("valid shapes");
                            y
                        })
                        .collect();
                    let mut got: Vec<Vec<f32>> = ws
                        .iter()
                        .map(|w| vec![f32::NAN; num_tokens * w.num_rows])
                        .collect();
                    let mut ys: Vec<&mut [f32]> = got.iter_mut().map(|y| &mut y[..]).collect();
                    matmul_many_with_features(&pool, &ws, &x, num_tokens, &mut ys, features)
                        .expect("valid shapes");
                    for (g, w) in got.iter().zip(&want) {
                        let bits = |v: &[f32]| v.iter().map(|f| f.to_bits()).collect::<Vec<_>>();
                        assert_eq!(bits(g), bits(w), "threads={threads} tokens={num_tokens}");
                    }
                }
            }
        }
    }
}

#[test]
fn fused_matmul_rejects_bad_shapes_before_writing() {
    use super::matmul_many::matmul_many;
    let mut rng = ChaCha8Rng::seed_from_u64(22);
    let row_len = 64;
    let a = random_matrix(&mut rng, GgmlType::Q4_1, 4, row_len);
    let b = random_matrix(&mut rng, GgmlType::Q8_0, 2, row_len);
    let ws = [
        QMatrix {
            ty: GgmlType::Q4_1,
            num_rows: 4,
            row_len,
            data: &a,
            packed: None,
        },
        QMatrix {
            ty: GgmlType::Q8_0,
            num_rows: 2,
            row_len,
            data: &b,
            packed: None,
        },
    ];
    let pool = ThreadPool::new(2);
    let x = random_acts(&mut rng, 1, row_len);
    let (mut y0, mut y1) = (vec![7f32; 4], vec![7f32; 3]);
    let err = matmul_many(&pool, &ws, &x, 1, &mut [&mut y0, &mut y1]).unwrap_err();
    assert_eq!(
        err,
        KernelError::OutputLen {
            expected: 2,
            actual: 3
        }
    );
    assert!(y0.iter().all(|&v| v == 7.0), "nothing written on error");
    let err = matmul_many(&pool, &ws, &x, 1, &mut [&mut y0]).unwrap_err();
    assert_eq!(
        err,
        KernelError::FusedCount {
            matrices: 2,
            outputs: 1
        }
    );
    let mut y1 = vec![0f32; 2];
    matmul_many(&pool, &ws, &x, 1, &mut [&mut y0, &mut y1]).expect("valid shapes");
    assert!(y0.iter().chain(&y1).all(|v| v.is_finite() && *v != 7.0));
}

/// Golden: which float order a packed matrix takes per arithmetic. llama.cpp repacks Q4_0
/// matrices of a multiple of 8 rows (AVX2) and sums those per block (`BlockSum`); every other
/// packed type, and Q4_0 with other row counts, keeps ggml's `vec_dot` order in its arithmetic.
#[test]
fn llama_cpp_arithmetic_takes_block_sums_for_the_q4_0_matrices_it_repacks() {
    use super::matmul::MatmulArith;
    use super::packed32::PackedDef;
    for arith in [MatmulArith::LlamaCpp, MatmulArith::InvariantGgml] {
        assert_eq!(
            arith.packed_def_for(GgmlType::Q4_0, 256),
            PackedDef::BlockSum
        );
        assert_eq!(arith.packed_def_for(GgmlType::Q4_0, 260), PackedDef::Ggml);
        for ty in [GgmlType::Q4_1, GgmlType::Q5_0, GgmlType::Q8_0] {
            assert_eq!(arith.packed_def_for(ty, 256), PackedDef::Ggml, "{ty:?}");
        }
    }
    let inv = MatmulArith::Invariant;
    assert_eq!(
        inv.packed_def_for(GgmlType::Q8_0, 256),
        PackedDef::invariant()
    );
    assert_eq!(
        inv.packed_def_for(GgmlType::Q4_0, 256),
        PackedDef::invariant()
    );
}
