//! f32 vector primitives: `dot_f32` and `axpy_f32` (shapes: two equal-length `[n]` slices).
//!
//! Applies the canonical f32 dot-product operation order (defined once, in `quant::canonical`)
//! everywhere a float row meets a float vector: 4 accumulators of 8 lanes fed by fused multiply-adds over 32-element strides, leftover
//! whole 8-element chunks into accumulator 0, lane-wise `(a0 + a1) + (a2 + a3)`, the fixed 8-lane
//! horizontal sum [`hsum8`], then a sequential fused tail. The AVX2 path and the portable path
//! perform exactly these operations, so results are bit-identical across paths and calls.
//! It never allocates and never parallelises.

use super::cpu::{cpu_features, CpuFeatures};

/// The fixed 8-lane horizontal sum of the canonical order (defined once, in `quant`).
pub(crate) use quant::canonical::hsum8;

/// `Σ a[i] * b[i]` in the canonical order (see module doc). Panics if the lengths differ (a
/// caller bug: shapes are fixed by the model).
#[inline]
pub fn dot_f32(a: &[f32], b: &[f32]) -> f32 {
    dot_f32_with(cpu_features(), a, b)
}

/// [`dot_f32`] on an explicit path (`features` is clamped to what the CPU has).
pub fn dot_f32_with(features: CpuFeatures, a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len(), "dot_f32 needs equal lengths");
    #[cfg(target_arch = "x86_64")]
    if features.clamp_to_detected().avx2 {
        // SAFETY: AVX2+FMA+F16C presence was checked at runtime just above.
        return unsafe { avx2::dot(a, b) };
    }
    let _ = features;
    dot_scalar(a, b)
}

/// `y[i] += a * x[i]` with one fused multiply-add per element. Panics if lengths differ.
#[inline]
pub fn axpy_f32(a: f32, x: &[f32], y: &mut [f32]) {
    axpy_f32_with(cpu_features(), a, x, y)
}

/// [`axpy_f32`] on an explicit path.
pub fn axpy_f32_with(features: CpuFeatures, a: f32, x: &[f32], y: &mut [f32]) {
    assert_eq!(x.len(), y.len(), "axpy_f32 needs equal lengths");
    #[cfg(target_arch = "x86_64")]
    if features.clamp_to_detected().avx2 {
        // SAFETY: AVX2+FMA+F16C presence was checked at runtime just above.
        unsafe { avx2::axpy(a, x, y) };
        return;
    }
    let _ = features;
    for (yi, xi) in y.iter_mut().zip(x) {
        *yi = a.mul_add(*xi, *yi);
    }
}

fn dot_scalar(a: &[f32], b: &[f32]) -> f32 {
    dot_scalar_by(a, |k| b[k])
}

/// The canonical dot-product order of the module doc, with `b[k]` read through `b_at` (so the
/// f16 kernels can widen on the fly and still follow exactly the same operations).
#[inline(always)]
pub(crate) fn dot_scalar_by(a: &[f32], b_at: impl Fn(usize) -> f32) -> f32 {
    quant::canonical::dot_by(a.len(), |k| a[k], b_at)
}

#[cfg(target_arch = "x86_64")]
pub(crate) mod avx2 {
    //! AVX2 bodies; callers must have checked AVX2+FMA+F16C at runtime.
    use std::arch::x86_64::*;

    /// 8-lane horizontal sum in the order of [`super::hsum8`].
    #[target_feature(enable = "avx2,fma,f16c")]
    #[inline]
    pub(crate) fn hsum8_ps(v: __m256) -> f32 {
        let t = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
        let u = _mm_add_ps(t, _mm_movehl_ps(t, t));
        let r = _mm_add_ss(u, _mm_shuffle_ps(u, u, 1));
        _mm_cvtss_f32(r)
    }

    #[target_feature(enable = "avx2,fma,f16c")]
    pub(crate) fn dot(a: &[f32], b: &[f32]) -> f32 {
        let n = a.len().min(b.len());
        let (pa, pb) = (a.as_ptr(), b.as_ptr());
        let mut acc = [_mm256_setzero_ps(); 4];
        let mut i = 0;
        // SAFETY (all loads below): `i + 8 * j + 8 <= n` is guaranteed by the loop conditions,
        // and both slices have at least `n` elements; unaligned loads are allowed.
        while i + 32 <= n {
            for (j, accj) in acc.iter_mut().enumerate() {
                // SAFETY: see above.
                let (x, y) = unsafe {
                    (
                        _mm256_loadu_ps(pa.add(i + 8 * j)),
                        _mm256_loadu_ps(pb.add(i + 8 * j)),
                    )
                };
                *accj = _mm256_fmadd_ps(x, y, *accj);
            }
            i += 32;
        }
        while i + 8 <= n {
            // SAFETY: see above.
            let (x, y) = unsafe { (_mm256_loadu_ps(pa.add(i)), _mm256_loadu_ps(pb.add(i))) };
            acc[0] = _mm256_fmadd_ps(x, y, acc[0]);
            i += 8;
        }
        let s = _mm256_add_ps(_mm256_add_ps(acc[0], acc[1]), _mm256_add_ps(acc[2], acc[3]));
        let mut r = hsum8_ps(s);
        while i < n {
            r = a[i].mul_add(b[i], r);
            i += 1;
        }
        r
    }

    #[target_feature(enable = "avx2,fma,f16c")]
    pub(crate) fn axpy(a: f32, x: &[f32], y: &mut [f32]) {
        let n = x.len().min(y.len());
        let av = _mm256_set1_ps(a);
        let mut i = 0;
        while i + 8 <= n {
            // SAFETY: `i + 8 <= n` and both slices hold at least `n` elements.
            unsafe {
                let xv = _mm256_loadu_ps(x.as_ptr().add(i));
                let yv = _mm256_loadu_ps(y.as_ptr().add(i));
                _mm256_storeu_ps(y.as_mut_ptr().add(i), _mm256_fmadd_ps(av, xv, yv));
            }
            i += 8;
        }
        while i < n {
            y[i] = a.mul_add(x[i], y[i]);
            i += 1;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::{Rng, SeedableRng};

    fn rand_vec(rng: &mut rand_chacha::ChaCha8Rng, n: usize) -> Vec<f32> {
        (0..n).map(|_| rng.gen_range(-2.0f32..2.0)).collect()
    }

    #[test]
    fn dot_matches_f64_reference_and_paths_are_bit_identical() {
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(7);
        for n in [0usize, 1, 7, 8, 9, 31, 32, 33, 63, 64, 100, 576, 1537] {
            let a = rand_vec(&mut rng, n);
            let b = rand_vec(&mut rng, n);
            let exact: f64 = a
                .iter()
                .zip(&b)
                .map(|(x, y)| f64::from(*x) * f64::from(*y))
                .sum();
            let scalar = dot_f32_with(CpuFeatures::PORTABLE, &a, &b);
            let fast = dot_f32_with(CpuFeatures::detect(), &a, &b);
            assert!(
                (f64::from(scalar) - exact).abs() <= 1e-5 * (1.0 + n as f64),
                "n={n}"
            );
            assert_eq!(scalar.to_bits(), fast.to_bits(), "n={n}");
            assert_eq!(fast.to_bits(), dot_f32(&a, &b).to_bits());
        }
    }

    #[test]
    fn axpy_is_fused_and_paths_agree() {
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(8);
        for n in [0usize, 3, 8, 17, 576] {
            let x = rand_vec(&mut rng, n);
            let y0 = rand_vec(&mut rng, n);
            let mut y1 = y0.clone();
            let mut y2 = y0.clone();
            axpy_f32_with(CpuFeatures::PORTABLE, 0.37, &x, &mut y1);
            axpy_f32_with(CpuFeatures::detect(), 0.37, &x, &mut y2);
            for i in 0..n {
                assert_eq!(y1[i].to_bits(), 0.37f32.mul_add(x[i], y0[i]).to_bits());
                assert_eq!(y1[i].to_bits(), y2[i].to_bits());
            }
        }
    }
}
