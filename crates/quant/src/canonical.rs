//! The canonical summation order of every f32 dot product in the workspace (portable form): the
//! one definition the bit-identity guarantees rest on. This crate's quantized dots and the model's
//! f32/f16 kernels (`kernels::vec_f32`) both call it, and their SIMD paths are tested
//! bit-identical to it.
//!
//! Order: 4 accumulators of 8 lanes fed by fused multiply-adds over 32-element strides, leftover
//! whole 8-element chunks into accumulator 0, lane-wise `(a0 + a1) + (a2 + a3)`, the fixed 8-lane
//! horizontal sum [`hsum8`], then a sequential fused tail. The AVX2 kernels (`avx2.rs`) perform
//! exactly these operations, so both paths are bit-identical. Never allocates.

/// Fixed horizontal sum of 8 lanes: `((v0+v4)+(v2+v6)) + ((v1+v5)+(v3+v7))`, the order the AVX2
/// reduction (`extract high half, add, movehl, add, shuffle, add`) produces.
#[inline(always)]
pub fn hsum8(v: &[f32; 8]) -> f32 {
    let t = [v[0] + v[4], v[1] + v[5], v[2] + v[6], v[3] + v[7]];
    (t[0] + t[2]) + (t[1] + t[3])
}

/// `Σ a(k)·b(k)` for `k in 0..n` in the canonical order.
#[inline(always)]
pub fn dot_by(n: usize, a: impl Fn(usize) -> f32, b: impl Fn(usize) -> f32) -> f32 {
    let mut acc = [[0f32; 8]; 4];
    let mut i = 0;
    while i + 32 <= n {
        for (j, accj) in acc.iter_mut().enumerate() {
            for (l, lane) in accj.iter_mut().enumerate() {
                let k = i + 8 * j + l;
                *lane = a(k).mul_add(b(k), *lane);
            }
        }
        i += 32;
    }
    while i + 8 <= n {
        for (l, lane) in acc[0].iter_mut().enumerate() {
            *lane = a(i + l).mul_add(b(i + l), *lane);
        }
        i += 8;
    }
    let mut s = [0f32; 8];
    for (l, sl) in s.iter_mut().enumerate() {
        *sl = (acc[0][l] + acc[1][l]) + (acc[2][l] + acc[3][l]);
    }
    let mut r = hsum8(&s);
    while i < n {
        r = a(i).mul_add(b(i), r);
        i += 1;
    }
    r
}

/// `Σ a[k]` in the canonical order (a dot product with ones: `fma(x, 1, y)` rounds like `x + y`).
#[inline(always)]
pub fn sum(a: &[f32]) -> f32 {
    dot_by(a.len(), |k| a[k], |_| 1.0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dot_matches_f64_within_rounding() {
        for n in [0usize, 1, 7, 8, 9, 31, 32, 33, 64, 100] {
            let a: Vec<f32> = (0..n).map(|i| ((i * 37 % 11) as f32 - 5.0) * 0.3).collect();
            let b: Vec<f32> = (0..n).map(|i| ((i * 13 % 7) as f32 - 3.0) * 0.7).collect();
            let exact: f64 = a
                .iter()
                .zip(&b)
                .map(|(x, y)| f64::from(*x) * f64::from(*y))
                .sum();
            let got = dot_by(n, |k| a[k], |k| b[k]);
            assert!(
                (f64::from(got) - exact).abs() <= 1e-5 * (1.0 + n as f64),
                "n={n}"
            );
            let s: f64 = a.iter().map(|&x| f64::from(x)).sum();
            assert!((f64::from(sum(&a)) - s).abs() <= 1e-5 * (1.0 + n as f64));
        }
    }
}
