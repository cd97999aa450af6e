//! K-quant kernel tests beyond the shared ones of [`super::tests`]: llama.cpp's batch orders
//! (`MatmulArith::LlamaCpp`) on every ISA path against the portable one and the f64 reference,
//! and the dequantise-to-f32 path. Test-only; owns no production code.

use super::cpu::CpuFeatures;
use super::matmul::QMatrix;
use super::pool::ThreadPool;
use super::tests::{
    assert_within_quant_bound, both_paths, dequant_matrix, random_acts, random_matrix,
};
use gguf::GgmlType;
use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;

/// K-quant matrices in llama.cpp's batch orders (`MatmulArith::LlamaCpp`: repacked Q4_K's
/// 4-token groups, the tiled order from 8 tokens) and through the dequantise-to-f32 path: every
/// ISA path bit-identical to the portable one, all within the quantisation bound of the f64
/// reference dot, and a token's result in the invariant order independent of the batch.
#[test]
fn kquant_llama_cpp_orders_and_f32_path_match_reference_and_paths_agree() {
    use super::kquant_rows::matmul_kquant_f32;
    use super::matmul::{matmul_impl, MatmulArith};
    let mut rng = ChaCha8Rng::seed_from_u64(21);
    let pool = ThreadPool::new(2);
    for ty in [GgmlType::Q4K, GgmlType::Q5K, GgmlType::Q6K] {
        // Q4_K with 16 rows: 4-token groups and a tail; with 13 rows: lanes, tiled from 8.
        for (num_rows, row_len, num_tokens) in
            [(16usize, 512usize, 11usize), (13, 256, 9), (16, 256, 5)]
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
            let bits = |v: &Vec<f32>| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
            for arith in [MatmulArith::LlamaCpp, MatmulArith::Invariant] {
                let mut ys = Vec::new();
                for f in both_paths() {
                    let mut y = vec![f32::NAN; num_tokens * num_rows];
                    matmul_impl(&pool, &w, &x, num_tokens, &mut y, f, arith).expect("valid");
                    ys.push(y);
                }
                for y in &ys[1..] {
                    assert_eq!(bits(&ys[0]), bits(y), "{ty:?} {arith:?}: paths differ");
                }
                assert_within_quant_bound(ty, &wf, &x, &ys[0], num_rows, row_len, num_tokens);
                if arith == MatmulArith::Invariant {
                    let last = &x[(num_tokens - 1) * row_len..];
                    let mut y1 = vec![0f32; num_rows];
                    matmul_impl(&pool, &w, last, 1, &mut y1, CpuFeatures::PORTABLE, arith)
                        .expect("valid");
                    assert_eq!(
                        bits(&y1),
                        bits(&ys[0][(num_tokens - 1) * num_rows..].to_vec())
                    );
                }
            }
            for f in both_paths() {
                let mut y = vec![f32::NAN; num_tokens * num_rows];
                matmul_kquant_f32(&pool, &w, &x, num_tokens, &mut y, f).expect("valid");
                // No activation quantisation on this path: only float rounding.
                for t in 0..num_tokens {
                    for r in 0..num_rows {
                        let (wr, xt) = (
                            &wf[r * row_len..(r + 1) * row_len],
                            &x[t * row_len..(t + 1) * row_len],
                        );
                        let exact: f64 = wr
                            .iter()
                            .zip(xt)
                            .map(|(a, b)| f64::from(*a) * f64::from(*b))
                            .sum();
                        let mag: f64 = wr
                            .iter()
                            .zip(xt)
                            .map(|(a, b)| f64::from(a.abs() * b.abs()))
                            .sum();
                        let got = f64::from(y[t * num_rows + r]);
                        assert!(
                            (got - exact).abs() <= 2e-6 * mag + 1e-6,
                            "{ty:?} f32 path t={t} r={r}"
                        );
                    }
                }
            }
        }
    }
}
