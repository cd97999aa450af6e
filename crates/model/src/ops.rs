//! Per-token elementwise operations of the transformer: RMSNorm, RoPE, SwiGLU, GeGLU, softcap,
//! softmax.
//!
//! Each function works on one token's row and performs the same float operations whatever batch
//! the row came from (batch invariance). Matrix products live in `kernels`; attention in
//! `attention`.

use crate::config::RopeStyle;
use crate::rope_scaling::RopeScaling;

/// `out = x / sqrt(mean(x²) + eps) * weight` as ggml computes it: each square rounded to f32,
/// the squares summed in f64, the mean rounded to f32. Shapes: `x`, `weight`, `out` are `[hidden]`.
pub fn rms_norm(x: &[f32], weight: &[f32], eps: f32, out: &mut [f32]) {
    let sum_sq: f64 = x.iter().map(|&v| f64::from(v * v)).sum();
    let mean = (sum_sq / x.len() as f64) as f32;
    let scale = 1.0 / (mean + eps).sqrt();
    for ((o, &v), &w) in out.iter_mut().zip(x).zip(weight) {
        *o = v * scale * w;
    }
}

/// Precomputed RoPE angles for one position: `cos`/`sin` are `[rope_dim / 2]`.
#[derive(Debug, Clone)]
pub struct RopeAngles {
    pub cos: Vec<f32>,
    pub sin: Vec<f32>,
}

/// Rotary-embedding parameters shared by every position.
#[derive(Debug, Clone)]
pub struct Rope {
    pub rope_dim: usize,
    pub head_dim: usize,
    pub base: f32,
    pub style: RopeStyle,
    /// Frequency scaling (linear, YaRN) and magnitude, as llama.cpp hands them to ggml.
    pub scaling: RopeScaling,
    /// Optional per-pair frequency divisors (`rope_freqs.weight`, Llama 3; Phi 3's long or short
    /// factors): `[rope_dim / 2]`.
    pub freq_factors: Option<Vec<f32>>,
}

impl Rope {
    /// Angles for `pos`, computed like ggml (`theta *= theta_scale` in f32, from `pos`; then
    /// `÷ ff` and the scaling's `rope_yarn`).
    pub fn angles(&self, pos: u32) -> RopeAngles {
        let half = self.rope_dim / 2;
        let theta_scale = self.base.powf(-2.0 / self.rope_dim as f32);
        let mut theta = pos as f32;
        let mut cos = Vec::with_capacity(half);
        let mut sin = Vec::with_capacity(half);
        for i in 0..half {
            let ff = self.freq_factors.as_ref().map_or(1.0, |f| f[i]);
            let (c, s) = self.scaling.cos_sin(theta / ff, i);
            cos.push(c);
            sin.push(s);
            theta *= theta_scale;
        }
        RopeAngles { cos, sin }
    }

    /// Rotates every head of `x` (`[num_heads * head_dim]`) in place: `x0·cos − x1·sin` and
    /// `x0·sin + x1·cos`, each with its first product fused (`fma(x0, cos, −x1·sin)`), which is
    /// how the compiler contracts ggml's `rotate_pairs` (llama.cpp is built with FMA enabled).
    /// On CPUs with FMA the same loop runs compiled for AVX2+FMA (`mul_add` is one `vfmadd`
    /// there instead of a call to the C library's `fmaf`): the same fused operations, the same
    /// bits.
    pub fn apply(&self, x: &mut [f32], angles: &RopeAngles) {
        #[cfg(target_arch = "x86_64")]
        if kernels::cpu_features().avx2 {
            // SAFETY: AVX2+FMA+F16C were detected (`cpu_features` only reports what the CPU
            // has).
            unsafe { self.apply_avx2(x, angles) };
            return;
        }
        self.apply_portable(x, angles);
    }

    /// [`Rope::apply`] compiled with AVX2+FMA enabled.
    ///
    /// # Safety
    /// The CPU has AVX2 and FMA.
    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx2,fma")]
    unsafe fn apply_avx2(&self, x: &mut [f32], angles: &RopeAngles) {
        self.apply_portable(x, angles);
    }

    /// The rotation loop of [`Rope::apply`] (inlined into each compiled copy).
    #[inline(always)]
    fn apply_portable(&self, x: &mut [f32], angles: &RopeAngles) {
        let half = self.rope_dim / 2;
        let (cos, sin) = (&angles.cos[..half], &angles.sin[..half]);
        for head in x.chunks_exact_mut(self.head_dim) {
            match self.style {
                RopeStyle::Interleaved => {
                    for (pair, (&c, &s)) in head[..2 * half]
                        .chunks_exact_mut(2)
                        .zip(cos.iter().zip(sin))
                    {
                        let (a, b) = (pair[0], pair[1]);
                        pair[0] = a.mul_add(c, -(b * s));
                        pair[1] = a.mul_add(s, b * c);
                    }
                }
                RopeStyle::Neox => {
                    let (lo, hi) = head[..2 * half].split_at_mut(half);
                    for (((x0, x1), &c), &s) in lo.iter_mut().zip(hi).zip(cos).zip(sin) {
                        let (a, b) = (*x0, *x1);
                        *x0 = a.mul_add(c, -(b * s));
                        *x1 = a.mul_add(s, b * c);
                    }
                }
            }
        }
    }
}

/// `gate[i] = silu(gate[i]) * up[i]`, in place, with ggml's arithmetic (see
/// [`kernels::swiglu`]). Shapes: `[ffn]`.
pub fn swiglu(gate: &mut [f32], up: &[f32]) {
    kernels::swiglu::swiglu(gate, up)
}

/// `gate[i] = gelu_tanh(gate[i]) * up[i]`, in place, with ggml's CPU arithmetic (our reference):
/// the GELU of the gate rounded to f16 and back, looked up at the f16 value of the gate, for
/// gates in (-10, 10); 0 below, the gate itself above. Shapes: `[ffn]`.
pub fn geglu(gate: &mut [f32], up: &[f32]) {
    let table = gelu_table();
    let n = gate.len().min(up.len());
    #[cfg(target_arch = "x86_64")]
    let done = if kernels::cpu_features().avx2 {
        // SAFETY: AVX2+FMA+F16C were detected (`cpu_features` only reports what the CPU has).
        unsafe { geglu_avx2(table, &mut gate[..n], &up[..n]) }
    } else {
        0
    };
    #[cfg(not(target_arch = "x86_64"))]
    let done = 0;
    geglu_scalar(table, &mut gate[done..n], &up[done..n]);
}

/// The portable GeGLU loop over the table (also the tail of the AVX2 path).
fn geglu_scalar(table: &[f32; 1 << 16], gate: &mut [f32], up: &[f32]) {
    for (g, &u) in gate.iter_mut().zip(up) {
        let x = *g;
        *g = if x <= -10.0 {
            0.0
        } else if x >= 10.0 {
            x * u
        } else {
            table[usize::from(half::f16::from_f32(x).to_bits())] * u
        };
    }
}

/// AVX2 twin of [`geglu_scalar`], 8 gates at a time: the same f16 rounding (F16C's
/// round-to-nearest-even, what `half` uses), the same table entry (a gather) and the same
/// products, so bit-identical. Returns how many leading elements it did (a multiple of 8).
///
/// # Safety
/// AVX2, FMA and F16C are available; `gate.len() == up.len()`.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn geglu_avx2(table: &[f32; 1 << 16], gate: &mut [f32], up: &[f32]) -> usize {
    use std::arch::x86_64::*;
    let n = gate.len() / 8 * 8;
    let (lo, hi) = (_mm256_set1_ps(-10.0), _mm256_set1_ps(10.0));
    for i in (0..n).step_by(8) {
        // SAFETY: `i + 8 <= n <= gate.len() == up.len()`; every gathered index is a u16, inside
        // the 65536-entry table.
        unsafe {
            let x = _mm256_loadu_ps(gate.as_ptr().add(i));
            let u = _mm256_loadu_ps(up.as_ptr().add(i));
            let h = _mm256_cvtps_ph::<_MM_FROUND_TO_NEAREST_INT>(x);
            let g = _mm256_i32gather_ps::<4>(table.as_ptr(), _mm256_cvtepu16_epi32(h));
            let mid = _mm256_mul_ps(g, u);
            let y = _mm256_blendv_ps(mid, _mm256_mul_ps(x, u), _mm256_cmp_ps::<_CMP_GE_OQ>(x, hi));
            let y = _mm256_andnot_ps(_mm256_cmp_ps::<_CMP_LE_OQ>(x, lo), y);
            _mm256_storeu_ps(gate.as_mut_ptr().add(i), y);
        }
    }
    n
}

/// [`gelu_f16`] of every f16 bit pattern (256 KiB, built once on first use): ggml's table, so a
/// gate costs one lookup instead of a `tanh` (same values).
fn gelu_table() -> &'static [f32; 1 << 16] {
    static TABLE: std::sync::OnceLock<Box<[f32; 1 << 16]>> = std::sync::OnceLock::new();
    TABLE.get_or_init(|| {
        let mut t = Box::new([0f32; 1 << 16]);
        for (bits, v) in t.iter_mut().enumerate() {
            *v = gelu_f16(half::f16::from_bits(bits as u16));
        }
        t
    })
}

/// `gelu_tanh(x)` of an f16 input, computed in f32 and rounded to f16 (ggml's table entry), with
/// the fused multiply-add its compiler makes of `1 + a·x·x` (`fma(a·x, x, 1)`; without it one
/// entry in a few thousand rounds to the neighbouring f16, e.g. at x = −1.999).
fn gelu_f16(x: half::f16) -> f32 {
    const SQRT_2_OVER_PI: f32 = 0.797_884_6;
    const COEF_A: f32 = 0.044715;
    let x = x.to_f32();
    let inner = (COEF_A * x).mul_add(x, 1.0);
    let y = 0.5 * x * (1.0 + (SQRT_2_OVER_PI * x * inner).tanh());
    half::f16::from_f32(y).to_f32()
}

/// `x = cap * tanh(x / cap)` for every element (logit soft-capping).
pub fn softcap(x: &mut [f32], cap: f32) {
    for v in x.iter_mut() {
        *v = (*v * (1.0 / cap)).tanh() * cap;
    }
}

/// Log-softmax of `logits` at `index`: `logits[index] - logsumexp(logits)`, summed in f64.
pub fn log_softmax_at(logits: &[f32], index: usize) -> f32 {
    let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let sum: f64 = logits.iter().map(|&l| ((l - max) as f64).exp()).sum();
    ((logits[index] - max) as f64 - sum.ln()) as f32
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rms_norm_unit_weight_gives_unit_rms() {
        let x = [1.0f32, -2.0, 3.0, -4.0];
        let mut out = [0.0f32; 4];
        rms_norm(&x, &[1.0; 4], 0.0, &mut out);
        let rms = (out.iter().map(|v| v * v).sum::<f32>() / 4.0).sqrt();
        assert!((rms - 1.0).abs() < 1e-6);
    }

    #[test]
    fn rope_at_zero_is_identity_and_preserves_norm() {
        let rope = Rope {
            rope_dim: 8,
            head_dim: 8,
            base: 10000.0,
            style: RopeStyle::Interleaved,
            scaling: RopeScaling::default(),
            freq_factors: None,
        };
        let orig: Vec<f32> = (0..16).map(|i| i as f32 * 0.1 - 0.5).collect();
        let mut x = orig.clone();
        rope.apply(&mut x, &rope.angles(0));
        assert_eq!(x, orig);
        rope.apply(&mut x, &rope.angles(17));
        let n0: f32 = orig.iter().map(|v| v * v).sum();
        let n1: f32 = x.iter().map(|v| v * v).sum();
        assert!((n0 - n1).abs() < 1e-4);
        assert_ne!(x, orig);
    }

    /// The AVX2+FMA copy of the rotation equals the portable loop (the C library's `fmaf` on
    /// x86-64 without FMA codegen) bit for bit: both styles, full and partial rotary widths,
    /// several heads, positions far from zero.
    #[test]
    fn rope_paths_agree_bitwise() {
        use rand::{Rng, SeedableRng};
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(11);
        for style in [RopeStyle::Interleaved, RopeStyle::Neox] {
            for (head_dim, rope_dim) in [(64, 64), (80, 80), (128, 64), (8, 8), (96, 32)] {
                let rope = Rope {
                    rope_dim,
                    head_dim,
                    base: 10000.0,
                    style,
                    scaling: RopeScaling::default(),
                    freq_factors: None,
                };
                for pos in [0u32, 1, 37, 4095, 131_000] {
                    let orig: Vec<f32> = (0..3 * head_dim)
                        .map(|_| rng.gen_range(-30.0f32..30.0))
                        .collect();
                    let angles = rope.angles(pos);
                    let (mut fast, mut portable) = (orig.clone(), orig.clone());
                    rope.apply(&mut fast, &angles);
                    rope.apply_portable(&mut portable, &angles);
                    let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
                    assert_eq!(
                        bits(&fast),
                        bits(&portable),
                        "{style:?} {head_dim}/{rope_dim} @{pos}"
                    );
                    assert_eq!(fast[rope_dim..head_dim], orig[rope_dim..head_dim]);
                }
            }
        }
    }

    #[test]
    fn neox_and_interleaved_differ_but_both_rotate_pairs() {
        let mk = |style| Rope {
            rope_dim: 4,
            head_dim: 4,
            base: 100.0,
            style,
            scaling: RopeScaling::default(),
            freq_factors: None,
        };
        let mut a = vec![1.0, 0.0, 0.0, 0.0];
        let mut b = a.clone();
        mk(RopeStyle::Interleaved).apply(&mut a, &mk(RopeStyle::Interleaved).angles(1));
        mk(RopeStyle::Neox).apply(&mut b, &mk(RopeStyle::Neox).angles(1));
        assert!((a[0] - 1f32.cos()).abs() < 1e-6 && (a[1] - 1f32.sin()).abs() < 1e-6);
        assert!((b[0] - 1f32.cos()).abs() < 1e-6 && (b[2] - 1f32.sin()).abs() < 1e-6);
    }

    #[test]
    fn gelu_table_entry_matches_ggml_where_the_fused_multiply_add_matters() {
        // llama.cpp's AVX2 build, `ffn_geglu` of Gemma 3 270M layer 0 at a gate of −1.99904633
        // (f16 −1.9990234): its table entry is −0.045501709; unfused arithmetic gives the
        // neighbouring f16, −0.045471191.
        let x = half::f16::from_f32(-1.999_046_3);
        assert_eq!(x.to_f32(), -1.999_023_4);
        let ggml = half::f16::from_f32(-0.045_501_7).to_f32();
        assert_eq!(gelu_f16(x), ggml);
        assert_ne!(ggml, half::f16::from_f32(-0.045_471_2).to_f32());
    }

    /// The vector path (whole lengths and tails) equals the scalar loop bit for bit on every
    /// f16 value, values between them, the ±10 edges and beyond.
    #[test]
    fn geglu_paths_agree_bitwise() {
        let mut xs: Vec<f32> = (0..=u16::MAX)
            .map(|b| half::f16::from_bits(b).to_f32())
            .filter(|x| !x.is_nan())
            .collect();
        let mut v = -12.0f32;
        while v < 12.0 {
            xs.push(v);
            v += 0.000_731;
        }
        xs.extend([
            -10.0,
            10.0,
            -9.999_999,
            9.999_999,
            -10.000_001,
            10.000_001,
            0.0,
            -0.0,
        ]);
        xs.push(1.0); // an odd length: the tail takes the scalar loop
        let up: Vec<f32> = (0..xs.len()).map(|i| 0.5 + (i % 7) as f32 * 0.37).collect();
        let mut want = xs.clone();
        geglu_scalar(gelu_table(), &mut want, &up);
        let mut got = xs.clone();
        geglu(&mut got, &up);
        for i in 0..xs.len() {
            assert_eq!(got[i].to_bits(), want[i].to_bits(), "x = {}", xs[i]);
        }
    }

    /// The table holds exactly the per-element function for every gate in (-10, 10).
    #[test]
    fn geglu_table_equals_the_direct_computation() {
        let mut checked = 0;
        for bits in 0..=u16::MAX {
            let x = half::f16::from_bits(bits).to_f32();
            if !(x > -10.0 && x < 10.0) {
                continue;
            }
            let mut g = [x];
            geglu(&mut g, &[1.5]);
            let want = gelu_f16(half::f16::from_bits(bits)) * 1.5;
            assert_eq!(g[0].to_bits(), want.to_bits(), "x = {x}");
            checked += 1;
        }
        assert!(checked > 30_000);
    }

    #[test]
    fn geglu_matches_the_gelu_tanh_formula_within_f16_rounding() {
        let xs = [-12.0f32, -3.0, -0.5, 0.0, 0.25, 1.0, 2.5, 9.0, 11.0];
        let mut g = xs.to_vec();
        geglu(&mut g, &[2.0; 9]);
        for (&x, &y) in xs.iter().zip(&g) {
            let exact = 0.5
                * x
                * (1.0 + ((2.0 / std::f32::consts::PI).sqrt() * (x + 0.044715 * x * x * x)).tanh());
            let want = if x <= -10.0 { 0.0 } else { exact * 2.0 };
            assert!(
                (y - want).abs() <= 2e-3 * want.abs().max(1.0),
                "{x}: {y} vs {want}"
            );
        }
        assert_eq!(g[8], 22.0, "large gates pass through");
    }

    #[test]
    fn softcap_bounds_logits() {
        let mut x = [0.0f32, 1.0, 100.0, -100.0];
        softcap(&mut x, 30.0);
        assert_eq!(x[0], 0.0);
        assert!((x[1] - 30.0 * (1.0f32 / 30.0).tanh()).abs() < 1e-6);
        assert!(x[2] < 30.0 && x[2] > 29.0 && x[3] > -30.0);
    }

    #[test]
    fn log_softmax_matches_direct_formula() {
        let l = [1.0f32, 2.0, 3.0];
        let z: f32 = l.iter().map(|v| v.exp()).sum();
        assert!((log_softmax_at(&l, 2) - (3f32.exp() / z).ln()).abs() < 1e-6);
    }
}
