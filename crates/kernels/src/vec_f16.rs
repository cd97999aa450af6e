//! Mixed f32 × f16 vector primitives for attention over an f16 K/V cache: `dot_f32_f16` and
//! `axpy_f16` (shapes: two equal-length `[n]` slices).
//!
//! Owns only the fused "widen f16 to f32, then the f32 primitive" loops. Widening f16 to f32 is
//! exact, so `dot_f32_f16(a, b)` is bit-identical to `dot_f32(a, widen(b))` (same canonical
//! operation order, see [`super::vec_f32`]) and `axpy_f16(a, x, y)` to `axpy_f32(a, widen(x), y)`;
//! the AVX2 path widens eight lanes at a time with F16C instead of one element at a time. It never
//! allocates and never parallelises.

use half::f16;

use super::cpu::{cpu_features, CpuFeatures};
use super::vec_f32::dot_scalar_by;

/// `Σ a[i] * f32(b[i])` in the canonical `dot_f32` order. Panics if the lengths differ (a caller
/// bug: shapes are fixed by the model).
pub fn dot_f32_f16(a: &[f32], b: &[f16]) -> f32 {
    dot_f32_f16_with(cpu_features(), a, b)
}

/// [`dot_f32_f16`] on an explicit path (`features` is clamped to what the CPU has).
pub fn dot_f32_f16_with(features: CpuFeatures, a: &[f32], b: &[f16]) -> f32 {
    assert_eq!(a.len(), b.len(), "dot_f32_f16 needs equal lengths");
    #[cfg(target_arch = "x86_64")]
    if features.clamp_to_detected().avx2 {
        // SAFETY: AVX2+FMA+F16C presence was checked at runtime just above.
        return unsafe { avx2::dot(a, b) };
    }
    let _ = features;
    dot_scalar_by(a, |k| b[k].to_f32())
}

/// `y[i] += a * f32(x[i])` with one fused multiply-add per element. Panics if lengths differ.
pub fn axpy_f16(a: f32, x: &[f16], y: &mut [f32]) {
    axpy_f16_with(cpu_features(), a, x, y)
}

/// [`axpy_f16`] on an explicit path.
pub fn axpy_f16_with(features: CpuFeatures, a: f32, x: &[f16], y: &mut [f32]) {
    assert_eq!(x.len(), y.len(), "axpy_f16 needs equal lengths");
    #[cfg(target_arch = "x86_64")]
    if features.clamp_to_detected().avx2 {
        // SAFETY: AVX2+FMA+F16C presence was checked at runtime just above.
        unsafe { avx2::axpy(a, x, y) };
        return;
    }
    let _ = features;
    for (yi, xi) in y.iter_mut().zip(x) {
        *yi = a.mul_add(xi.to_f32(), *yi);
    }
}

#[cfg(target_arch = "x86_64")]
pub(super) mod avx2 {
    //! AVX2 bodies; callers must have checked AVX2+FMA+F16C at runtime.
    use super::super::vec_f32::avx2::hsum8_ps;
    use half::f16;
    use std::arch::x86_64::*;

    /// Eight f16 at `p` widened to f32.
    ///
    /// # Safety
    /// `p` points at 8 readable `f16` (16 bytes); F16C is available.
    #[target_feature(enable = "avx2,fma,f16c")]
    #[inline]
    pub(crate) unsafe fn load8(p: *const f16) -> __m256 {
        // SAFETY: the caller guarantees 16 readable bytes; `f16` is a plain `u16`, unaligned load.
        _mm256_cvtph_ps(unsafe { _mm_loadu_si128(p.cast()) })
    }

    /// Twin of `vec_f32::avx2::dot` with `b` widened on load (same accumulators, same order).
    #[target_feature(enable = "avx2,fma,f16c")]
    #[inline]
    pub(super) fn dot(a: &[f32], b: &[f16]) -> f32 {
        let n = a.len().min(b.len());
        let (pa, pb) = (a.as_ptr(), b.as_ptr());
        let mut acc = [_mm256_setzero_ps(); 4];
        let mut i = 0;
        while i + 32 <= n {
            for (j, accj) in acc.iter_mut().enumerate() {
                // SAFETY: `i + 8 * j + 8 <= n` by the loop condition and both slices hold at
                // least `n` elements; unaligned loads are allowed.
                let (x, y) =
                    unsafe { (_mm256_loadu_ps(pa.add(i + 8 * j)), load8(pb.add(i + 8 * j))) };
                *accj = _mm256_fmadd_ps(x, y, *accj);
            }
            i += 32;
        }
        while i + 8 <= n {
            // SAFETY: `i + 8 <= n`, as above.
            let (x, y) = unsafe { (_mm256_loadu_ps(pa.add(i)), load8(pb.add(i))) };
            acc[0] = _mm256_fmadd_ps(x, y, acc[0]);
            i += 8;
        }
        let s = _mm256_add_ps(_mm256_add_ps(acc[0], acc[1]), _mm256_add_ps(acc[2], acc[3]));
        let mut r = hsum8_ps(s);
        while i < n {
            r = a[i].mul_add(b[i].to_f32(), r);
            i += 1;
        }
        r
    }

    /// Twin of `vec_f32::avx2::axpy` with `x` widened on load.
    #[target_feature(enable = "avx2,fma,f16c")]
    #[inline]
    pub(crate) fn axpy(a: f32, x: &[f16], y: &mut [f32]) {
        let n = x.len().min(y.len());
        let av = _mm256_set1_ps(a);
        let mut i = 0;
        while i + 8 <= n {
            // SAFETY: `i + 8 <= n` and both slices hold at least `n` elements.
            unsafe {
                let xv = load8(x.as_ptr().add(i));
                let yv = _mm256_loadu_ps(y.as_ptr().add(i));
                _mm256_storeu_ps(y.as_mut_ptr().add(i), _mm256_fmadd_ps(av, xv, yv));
            }
            i += 8;
        }
        while i < n {
            y[i] = a.mul_add(x[i].to_f32(), y[i]);
            i += 1;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::vec_f32::{axpy_f32_with, dot_f32_with};
    use super::*;
    use rand::{Rng, SeedableRng};

    fn rand_f16(rng: &mut rand_chacha::ChaCha8Rng, n: usize) -> Vec<f16> {
        (0..n)
            .map(|_| f16::from_f32(rng.gen_range(-2.0f32..2.0)))
            .collect()
    }

    #[test]
    fn dot_equals_f32_dot_of_widened_on_both_paths() {
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(11);
        for n in [0usize, 1, 7, 8, 9, 31, 32, 33, 63, 64, 100, 128, 577] {
            let a: Vec<f32> = (0..n).map(|_| rng.gen_range(-2.0f32..2.0)).collect();
            let b = rand_f16(&mut rng, n);
            let wide: Vec<f32> = b.iter().map(|v| v.to_f32()).collect();
            let want = dot_f32_with(CpuFeatures::PORTABLE, &a, &wide).to_bits();
            for features in [CpuFeatures::PORTABLE, CpuFeatures::detect()] {
                assert_eq!(dot_f32_f16_with(features, &a, &b).to_bits(), want, "n={n}");
            }
            assert_eq!(dot_f32_f16(&a, &b).to_bits(), want);
        }
    }

    #[test]
    fn axpy_equals_f32_axpy_of_widened_on_both_paths() {
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(12);
        for n in [0usize, 3, 8, 17, 64, 577] {
            let x = rand_f16(&mut rng, n);
            let wide: Vec<f32> = x.iter().map(|v| v.to_f32()).collect();
            let y0: Vec<f32> = (0..n).map(|_| rng.gen_range(-2.0f32..2.0)).collect();
            let mut want = y0.clone();
            axpy_f32_with(CpuFeatures::PORTABLE, -0.71, &wide, &mut want);
            for features in [CpuFeatures::PORTABLE, CpuFeatures::detect()] {
                let mut y = y0.clone();
                axpy_f16_with(features, -0.71, &x, &mut y);
                let bits = |v: &[f32]| v.iter().map(|f| f.to_bits()).collect::<Vec<_>>();
                assert_eq!(bits(&y), bits(&want), "n={n}");
            }
            let mut y = y0.clone();
            axpy_f16(-0.71, &x, &mut y);
            assert_eq!(y, want);
        }
    }
}
