//! SwiGLU, `gate[i] = silu(gate[i]) * up[i]` with `silu(x) = x / (1 + exp(-x))`, computed exactly
//! as ggml's `ggml_vec_swiglu_f32` does on AVX2+FMA (llama.cpp `ggml-cpu/vec.h`, `vec.cpp`): the
//! exponential is ggml's `ggml_v_expf` (a polynomial adapted from Arm's optimized routines, at
//! most ~1.5 ulp from the true value), not the C library's `expf`, so our FFN activations round
//! like llama.cpp's.
//!
//! Owns [`swiglu`] and the lane function [`expf_ggml`]; the AVX2 path and the portable path
//! perform the same IEEE operations lane by lane and agree bit for bit (tests pin this). It never
//! allocates and never parallelises.

use super::cpu::{cpu_features, CpuFeatures};

// ggml_v_expf's constants (hex float literals in the C source).
const SHIFT: u32 = 0x4b40_0000; // 0x1.8p23
const LOG2E: u32 = 0x3fb8_aa3b; // 0x1.715476p+0
const LN2_LO: u32 = 0x35bf_be8e; // 0x1.7f7d1cp-20
const LN2_HI: u32 = 0x3f31_7200; // 0x1.62e4p-1
const C4: u32 = 0x3c07_2010; // 0x1.0e4020p-7
const C3: u32 = 0x3d2b_9f17; // 0x1.573e2ep-5
const C2: u32 = 0x3e2a_af33; // 0x1.555e66p-3
const C1: u32 = 0x3eff_fedb; // 0x1.fffdb6p-2
const C0: u32 = 0x3f7f_fff6; // 0x1.ffffecp-1

#[inline(always)]
fn c(bits: u32) -> f32 {
    f32::from_bits(bits)
}

/// One lane of ggml's `ggml_v_expf` (AVX2 version), including its overflow/underflow branches.
pub fn expf_ggml(x: f32) -> f32 {
    let r = c(SHIFT);
    let z = x.mul_add(c(LOG2E), r);
    let n = z - r;
    let b = (-n).mul_add(c(LN2_LO), (-n).mul_add(c(LN2_HI), x));
    let e = z.to_bits() << 23;
    let k = f32::from_bits(e.wrapping_add(1f32.to_bits()));
    let big = n.abs() > 126.0;
    let u = b * b;
    let j = c(C4)
        .mul_add(b, c(C3))
        .mul_add(u, c(C2).mul_add(b, c(C1)))
        .mul_add(u, c(C0) * b);
    if !big {
        return j.mul_add(k, k);
    }
    let g: u32 = if n <= 0.0 { 0x8200_0000 } else { 0 };
    let s1 = f32::from_bits(g.wrapping_add(0x7f00_0000));
    let s2 = f32::from_bits(e.wrapping_sub(g));
    if n.abs() > 192.0 {
        s1 * s1
    } else {
        s2.mul_add(j, s2) * s1
    }
}

/// `gate[i] = silu(gate[i]) * up[i]` in place, ggml's arithmetic. Panics if lengths differ.
pub fn swiglu(gate: &mut [f32], up: &[f32]) {
    swiglu_with(cpu_features(), gate, up)
}

/// [`swiglu`] on an explicit path (`features` is clamped to what the CPU has).
pub fn swiglu_with(features: CpuFeatures, gate: &mut [f32], up: &[f32]) {
    assert_eq!(gate.len(), up.len(), "swiglu needs equal lengths");
    #[cfg(target_arch = "x86_64")]
    if features.clamp_to_detected().avx2 {
        // SAFETY: AVX2+FMA+F16C presence was checked at runtime just above.
        unsafe { avx2::swiglu(gate, up) };
        return;
    }
    let _ = features;
    let body = gate.len() & !7;
    for (g, &u) in gate[..body].iter_mut().zip(up) {
        *g = *g / (1.0 + expf_ggml(0.0 - *g)) * u;
    }
    tail(&mut gate[body..], &up[body..]);
}

/// ggml's scalar leftover loop (`n % 8` elements) uses the C library's `expf`.
#[inline(always)]
fn tail(gate: &mut [f32], up: &[f32]) {
    for (g, &u) in gate.iter_mut().zip(up) {
        *g = *g / (1.0 + (-*g).exp()) * u;
    }
}

#[cfg(target_arch = "x86_64")]
pub(crate) mod avx2 {
    //! AVX2 bodies; callers must have checked AVX2+FMA at runtime.
    use super::{c, C0, C1, C2, C3, C4, LN2_HI, LN2_LO, LOG2E, SHIFT};
    use std::arch::x86_64::*;

    /// `ggml_v_expf`, transcribed intrinsic for intrinsic.
    #[target_feature(enable = "avx2,fma,f16c")]
    #[inline]
    pub(crate) fn expf8(x: __m256) -> __m256 {
        let r = _mm256_set1_ps(c(SHIFT));
        let z = _mm256_fmadd_ps(x, _mm256_set1_ps(c(LOG2E)), r);
        let n = _mm256_sub_ps(z, r);
        let b = _mm256_fnmadd_ps(
            n,
            _mm256_set1_ps(c(LN2_LO)),
            _mm256_fnmadd_ps(n, _mm256_set1_ps(c(LN2_HI)), x),
        );
        let e = _mm256_slli_epi32::<23>(_mm256_castps_si256(z));
        let k = _mm256_castsi256_ps(_mm256_add_epi32(
            e,
            _mm256_castps_si256(_mm256_set1_ps(1.0)),
        ));
        let abs_n = _mm256_andnot_ps(_mm256_set1_ps(-0.0), n);
        let cm = _mm256_cmp_ps::<_CMP_GT_OQ>(abs_n, _mm256_set1_ps(126.0));
        let u = _mm256_mul_ps(b, b);
        let j = _mm256_fmadd_ps(
            _mm256_fmadd_ps(
                _mm256_fmadd_ps(_mm256_set1_ps(c(C4)), b, _mm256_set1_ps(c(C3))),
                u,
                _mm256_fmadd_ps(_mm256_set1_ps(c(C2)), b, _mm256_set1_ps(c(C1))),
            ),
            u,
            _mm256_mul_ps(_mm256_set1_ps(c(C0)), b),
        );
        if _mm256_movemask_ps(cm) == 0 {
            return _mm256_fmadd_ps(j, k, k);
        }
        let g = _mm256_and_si256(
            _mm256_castps_si256(_mm256_cmp_ps::<_CMP_LE_OQ>(n, _mm256_setzero_ps())),
            _mm256_set1_epi32(0x8200_0000u32 as i32),
        );
        let s1 = _mm256_castsi256_ps(_mm256_add_epi32(g, _mm256_set1_epi32(0x7f00_0000)));
        let s2 = _mm256_castsi256_ps(_mm256_sub_epi32(e, g));
        let d = _mm256_cmp_ps::<_CMP_GT_OQ>(abs_n, _mm256_set1_ps(192.0));
        _mm256_or_ps(
            _mm256_and_ps(d, _mm256_mul_ps(s1, s1)),
            _mm256_andnot_ps(
                d,
                _mm256_or_ps(
                    _mm256_and_ps(cm, _mm256_mul_ps(_mm256_fmadd_ps(s2, j, s2), s1)),
                    _mm256_andnot_ps(cm, _mm256_fmadd_ps(k, j, k)),
                ),
            ),
        )
    }

    #[target_feature(enable = "avx2,fma,f16c")]
    pub(super) fn swiglu(gate: &mut [f32], up: &[f32]) {
        let n = gate.len().min(up.len());
        let one = _mm256_set1_ps(1.0);
        let mut i = 0;
        while i + 8 <= n {
            // SAFETY: `i + 8 <= n` and both slices hold at least `n` elements; unaligned access.
            unsafe {
                let x = _mm256_loadu_ps(gate.as_ptr().add(i));
                let g = _mm256_loadu_ps(up.as_ptr().add(i));
                let ex = expf8(_mm256_sub_ps(_mm256_setzero_ps(), x));
                let silu = _mm256_div_ps(x, _mm256_add_ps(one, ex));
                _mm256_storeu_ps(gate.as_mut_ptr().add(i), _mm256_mul_ps(silu, g));
            }
            i += 8;
        }
        super::tail(&mut gate[i..n], &up[i..n]);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::{Rng, SeedableRng};

    #[test]
    fn expf_is_close_to_exp_including_the_extreme_branches() {
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(31);
        for _ in 0..10_000 {
            let x = rng.gen_range(-87.0f32..88.0);
            let (got, want) = (expf_ggml(x), (x as f64).exp());
            assert!(
                ((got as f64) - want).abs() <= want * 4e-7,
                "x={x}: {got} vs {want}"
            );
        }
        // Subnormal results and the flush branches.
        for x in [-100.0f32, -103.0] {
            let (got, want) = (expf_ggml(x) as f64, (x as f64).exp());
            assert!((got - want).abs() <= want * 1e-3 + 1e-45, "x={x}");
        }
        assert_eq!(expf_ggml(-200.0), 0.0);
        assert_eq!(expf_ggml(100.0), f32::INFINITY);
        assert_eq!(expf_ggml(0.0), 1.0);
    }

    #[test]
    fn swiglu_paths_agree_bit_for_bit() {
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(32);
        for n in [0usize, 5, 8, 37, 1536] {
            let mut gate: Vec<f32> = (0..n).map(|_| rng.gen_range(-12.0f32..12.0)).collect();
            if n > 10 {
                gate[3] = -95.0; // a lane in the |n| > 126 branch (exp(95) ≈ 2^137)
                gate[9] = 150.0; // and one in the flush branch
            }
            let up: Vec<f32> = (0..n).map(|_| rng.gen_range(-3.0f32..3.0)).collect();
            let mut a = gate.clone();
            let mut b = gate.clone();
            swiglu_with(CpuFeatures::PORTABLE, &mut a, &up);
            swiglu_with(CpuFeatures::detect(), &mut b, &up);
            let bits = |v: &[f32]| v.iter().map(|f| f.to_bits()).collect::<Vec<_>>();
            assert_eq!(bits(&a), bits(&b), "n={n}");
            for i in 0..n {
                let x = f64::from(gate[i]);
                let want = x / (1.0 + (-x).exp()) * f64::from(up[i]);
                assert!(
                    (f64::from(a[i]) - want).abs() <= 1e-5 * (1.0 + want.abs()),
                    "i={i}"
                );
                assert!(
                    (f64::from(b[i]) - want).abs() <= 1e-5 * (1.0 + want.abs()),
                    "i={i}"
                );
            }
        }
    }
}
