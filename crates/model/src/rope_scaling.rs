//! RoPE frequency scaling as llama.cpp applies it: a GGUF file's `rope.scaling.*` keys turned into
//! ggml's rope parameters (`freq_scale`, `ext_factor`, `attn_factor`, YaRN's correction dims),
//! the way `llama_model::load_hparams` and `llama_context` do, and the per-pair angle and
//! magnitude of ggml's `rope_yarn`.
//!
//! Kinds: none; linear (positions scaled by `1/factor`; also what llama.cpp assumes when a file
//! names a factor but no type); YaRN (interpolation blended with extrapolation per dimension
//! pair between the correction dims, magnitudes scaled by `1 + 0.1·ln(factor)`); longrope (Phi 3
//! 128K: no position scaling here — its per-pair factors are `rope_factors_long/short`, chosen by
//! the caller — and a magnitude `rope.scaling.attn_factor`). It owns this arithmetic only; the
//! rotation itself is `ops::Rope`.

/// How a file scales RoPE (`rope.scaling.type`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ScalingKind {
    None,
    Linear,
    Yarn,
    LongRope,
}

impl ScalingKind {
    /// The kind a `rope.scaling.type` value names (llama.cpp's `LLAMA_ROPE_SCALING_TYPES`), or
    /// `None` for a value llama.cpp does not know either.
    pub fn from_name(name: &str) -> Option<ScalingKind> {
        Some(match name {
            "none" => ScalingKind::None,
            "linear" => ScalingKind::Linear,
            "yarn" => ScalingKind::Yarn,
            "longrope" => ScalingKind::LongRope,
            _ => return None,
        })
    }
}

/// YaRN's default `beta_fast` / `beta_slow` (llama.cpp's, for every architecture agentkv loads).
const YARN_BETA_FAST: f32 = 32.0;
const YARN_BETA_SLOW: f32 = 1.0;

/// ggml's rope parameters for one model (global layers; sliding-window layers take
/// [`RopeScaling::unscaled`]).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RopeScaling {
    /// The file's kind (for reports; the fields below are what the arithmetic uses).
    pub kind: ScalingKind,
    /// Interpolation: angles are multiplied by this (`1/factor`; 1 = none).
    pub freq_scale: f32,
    /// YaRN's extrapolation mix (1 for YaRN, else 0).
    pub ext_factor: f32,
    /// Magnitude of `cos`/`sin` (`attn_factor` as llama.cpp hands it to ggml).
    pub attn_factor: f32,
    /// YaRN's correction dims: pairs below `[0]` extrapolate, above `[1]` interpolate.
    pub corr_dims: [f32; 2],
}

impl Default for RopeScaling {
    fn default() -> Self {
        RopeScaling {
            kind: ScalingKind::None,
            freq_scale: 1.0,
            ext_factor: 0.0,
            attn_factor: 1.0,
            corr_dims: [0.0, 0.0],
        }
    }
}

impl RopeScaling {
    /// llama.cpp's parameters for a file with scaling `kind`, `rope.scaling.factor` `factor` (0
    /// when absent), `rope.scaling.original_context_length` `orig_ctx`, RoPE width `rope_dim` and
    /// base `base`, and `rope.scaling.attn_factor` `attn_factor_key` (1 when absent).
    pub fn from_file(
        kind: ScalingKind,
        factor: f32,
        orig_ctx: usize,
        rope_dim: usize,
        base: f32,
        attn_factor_key: f32,
    ) -> RopeScaling {
        let freq_scale = match kind {
            ScalingKind::None => 1.0,
            _ if factor == 0.0 => 1.0,
            _ => 1.0 / factor,
        };
        let ext_factor = if kind == ScalingKind::Yarn { 1.0 } else { 0.0 };
        let mut attn_factor = 1.0f32;
        if ext_factor != 0.0 {
            // `llama_context`: YaRN's magnitude, cancelled by the one `rope_yarn` applies (libllama
            // is compiled without FMA: no contraction).
            let factor = 1.0 / freq_scale;
            let mscale = if factor <= 1.0 {
                1.0
            } else {
                0.1f32 * 1.0 * factor.ln() + 1.0
            };
            attn_factor = mscale * (1.0 / (1.0 + 0.1f32 * factor.ln()));
        }
        attn_factor *= attn_factor_key;
        RopeScaling {
            kind,
            freq_scale,
            ext_factor,
            attn_factor,
            corr_dims: corr_dims(rope_dim, orig_ctx, base),
        }
    }

    /// The same parameters without position scaling (llama.cpp's sliding-window layers:
    /// `rope_freq_scale_train_swa` is 1).
    pub fn unscaled(self) -> RopeScaling {
        RopeScaling {
            freq_scale: 1.0,
            ..self
        }
    }

    /// Whether it changes any angle or magnitude (then [`Self::describe`] is not empty).
    pub fn is_scaled(&self) -> bool {
        match self.kind {
            ScalingKind::Linear => self.freq_scale != 1.0 || self.attn_factor != 1.0,
            ScalingKind::Yarn | ScalingKind::LongRope => true,
            ScalingKind::None => self.attn_factor != 1.0,
        }
    }

    /// How reports describe it (empty when nothing is scaled): the kind, its factor and the
    /// magnitude `cos`/`sin` end up with.
    pub fn describe(&self) -> String {
        if !self.is_scaled() {
            return String::new();
        }
        let factor = 1.0 / self.freq_scale;
        match self.kind {
            ScalingKind::Linear if self.freq_scale != 1.0 => format!("linear ×{factor}"),
            ScalingKind::Yarn => format!(
                "YaRN ×{factor} (correction dims {}–{}, magnitude {:.4})",
                self.corr_dims[0],
                self.corr_dims[1],
                self.cos_sin(0.0, 0).0
            ),
            ScalingKind::LongRope => format!("longrope (magnitude {:.4})", self.attn_factor),
            _ => format!("magnitude {:.4}", self.attn_factor),
        }
    }

    /// `(cos, sin)` of pair `i` whose unscaled angle is `theta_extrap` (position × base
    /// frequency ÷ frequency factor), as ggml's `rope_yarn` computes them (its products
    /// contracted the way GCC compiles ggml's CPU backend with FMA).
    #[inline]
    pub fn cos_sin(&self, theta_extrap: f32, i: usize) -> (f32, f32) {
        let theta_interp = self.freq_scale * theta_extrap;
        let mut theta = theta_interp;
        let mut mscale = self.attn_factor;
        if self.ext_factor != 0.0 {
            let ramp_mix = ramp(self.corr_dims[0], self.corr_dims[1], i) * self.ext_factor;
            theta = theta_interp.mul_add(1.0 - ramp_mix, theta_extrap * ramp_mix);
            mscale *= 0.1f32.mul_add((1.0 / self.freq_scale).ln(), 1.0);
        }
        (theta.cos() * mscale, theta.sin() * mscale)
    }
}

/// ggml's `rope_yarn_ramp` for pair `i`.
fn ramp(low: f32, high: f32, i: usize) -> f32 {
    let y = (i as f32 - low) / 0.001f32.max(high - low);
    1.0 - y.clamp(0.0, 1.0)
}

/// ggml's `ggml_rope_yarn_corr_dims` with llama.cpp's default betas.
fn corr_dims(rope_dim: usize, orig_ctx: usize, base: f32) -> [f32; 2] {
    let dim = |beta: f32| {
        rope_dim as f32 * (orig_ctx as f32 / (beta * 2.0 * std::f32::consts::PI)).ln()
            / (2.0 * base.ln())
    };
    let start = dim(YARN_BETA_FAST).floor();
    let end = dim(YARN_BETA_SLOW).ceil();
    [start.max(0.0), end.min(rope_dim as f32 - 1.0)]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn no_scaling_leaves_angles_alone() {
        let s = RopeScaling::from_file(ScalingKind::None, 8.0, 4096, 64, 10000.0, 1.0);
        assert_eq!((s.freq_scale, s.ext_factor, s.attn_factor), (1.0, 0.0, 1.0));
        assert_eq!(s.cos_sin(1.25, 3), (1.25f32.cos(), 1.25f32.sin()));
    }

    #[test]
    fn linear_divides_angles_by_the_factor() {
        let s = RopeScaling::from_file(ScalingKind::Linear, 4.0, 4096, 64, 10000.0, 1.0);
        assert_eq!(s.freq_scale, 0.25);
        assert_eq!(s.cos_sin(2.0, 5), (0.5f32.cos(), 0.5f32.sin()));
        // No factor: nothing to scale (llama.cpp's `ropescale == 0`).
        let s = RopeScaling::from_file(ScalingKind::Linear, 0.0, 4096, 64, 10000.0, 1.0);
        assert_eq!(s.freq_scale, 1.0);
    }

    #[test]
    fn yarn_extrapolates_high_frequencies_and_interpolates_low_ones() {
        // Qwen 2.5's YaRN: factor 4 over 32K, head size 128, base 1e6.
        let s = RopeScaling::from_file(ScalingKind::Yarn, 4.0, 32768, 128, 1_000_000.0, 1.0);
        let [low, high] = s.corr_dims;
        assert!(0.0 < low && low < high && high < 127.0, "{low} {high}");
        // The magnitude llama.cpp ends up with: its attn_factor ≈ 1, times 1 + 0.1·ln 4.
        assert!((s.attn_factor - 1.0).abs() < 1e-6);
        let m = 1.0 + 0.1 * 4f32.ln();
        let (c, _) = s.cos_sin(0.0, 0);
        assert!((c - m).abs() < 1e-6);
        // Pair 0 (below `low`): the unscaled angle; the last pair (above `high`): ÷ 4.
        let (c0, _) = s.cos_sin(1.0, 0);
        assert!((c0 - 1f32.cos() * m).abs() < 1e-6);
        let (c63, _) = s.cos_sin(1.0, 63);
        assert!((c63 - 0.25f32.cos() * m).abs() < 1e-6);
    }

    #[test]
    fn longrope_only_scales_magnitudes() {
        let s = RopeScaling::from_file(ScalingKind::LongRope, 0.0, 4096, 96, 10000.0, 1.19);
        assert_eq!(
            (s.freq_scale, s.ext_factor, s.attn_factor),
            (1.0, 0.0, 1.19)
        );
        let (c, sn) = s.cos_sin(0.7, 2);
        assert_eq!((c, sn), (0.7f32.cos() * 1.19, 0.7f32.sin() * 1.19));
        assert_eq!(s.unscaled(), s);
    }

    #[test]
    fn descriptions_name_what_is_scaled() {
        let d = |kind, factor, attn| {
            RopeScaling::from_file(kind, factor, 128, 64, 10000.0, attn).describe()
        };
        assert_eq!(d(ScalingKind::None, 0.0, 1.0), "");
        assert_eq!(d(ScalingKind::Linear, 0.0, 1.0), "", "no factor");
        assert_eq!(d(ScalingKind::Linear, 8.0, 1.0), "linear ×8");
        assert!(d(ScalingKind::Yarn, 4.0, 1.0).starts_with("YaRN ×4"));
        assert_eq!(
            d(ScalingKind::LongRope, 0.0, 1.25),
            "longrope (magnitude 1.2500)"
        );
        assert_eq!(d(ScalingKind::Linear, 0.0, 1.25), "magnitude 1.2500");
    }

    #[test]
    fn kinds_are_llama_cpps() {
        for (name, kind) in [
            ("none", ScalingKind::None),
            ("linear", ScalingKind::Linear),
            ("yarn", ScalingKind::Yarn),
            ("longrope", ScalingKind::LongRope),
        ] {
            assert_eq!(ScalingKind::from_name(name), Some(kind));
        }
        assert_eq!(ScalingKind::from_name("dynamic"), None);
    }
}
