//! The per-step prefill budget that keeps decoders moving: an online model of what a forward
//! step costs, and the largest prefill chunk that fits a step-time target when decodes share
//! the step.
//!
//! Owns the cost model (least squares with exponential forgetting over the features below) and
//! the cap it implies. It never schedules, never times anything itself (the engine passes each
//! step's measured duration) and never touches the model.
//!
//! A step's cost is modelled as `t = c0 + c1·tokens + c2·pairs`, where `tokens` counts every
//! row of the batch (matrix products are linear in it) and `pairs` counts (query, key)
//! position pairs of attention (a decode at depth `D` adds `D + 1`; a prefill chunk of `L`
//! tokens starting at `S` adds `L·S + L(L+1)/2`): attention at depth is what makes a 300-token
//! agent prefill on top of 5K cached tokens cost several times a 300-token prefill from empty.

use std::time::Duration;

/// Features of one planned step.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct StepLoad {
    pub tokens: f64,
    pub pairs: f64,
}

impl StepLoad {
    /// Adds `len` tokens of one sequence starting at position `start`.
    pub fn add(&mut self, start: usize, len: usize) {
        let (s, l) = (start as f64, len as f64);
        self.tokens += l;
        self.pairs += l * s + l * (l + 1.0) / 2.0;
    }

    fn features(&self) -> [f64; 3] {
        [1.0, self.tokens, self.pairs]
    }
}

/// Forgetting factor per observed step (≈ the last 50 steps weigh most).
const FORGET: f64 = 0.98;
/// Steps observed before the model is trusted (until then no cap applies).
const WARMUP_STEPS: u32 = 8;

/// Online least-squares estimate of step time from [`StepLoad`].
#[derive(Debug, Clone)]
pub struct StepCostModel {
    xtx: [[f64; 3]; 3],
    xty: [f64; 3],
    observed: u32,
    coef: Option<[f64; 3]>,
}

impl Default for StepCostModel {
    fn default() -> Self {
        StepCostModel {
            xtx: [[0.0; 3]; 3],
            xty: [0.0; 3],
            observed: 0,
            coef: None,
        }
    }
}

impl StepCostModel {
    /// Records that a step with `load` took `took`.
    pub fn observe(&mut self, load: StepLoad, took: Duration) {
        let x = load.features();
        let y = took.as_secs_f64();
        for i in 0..3 {
            for j in 0..3 {
                self.xtx[i][j] = FORGET * self.xtx[i][j] + x[i] * x[j];
            }
            self.xty[i] = FORGET * self.xty[i] + x[i] * y;
        }
        self.observed = self.observed.saturating_add(1);
        if self.observed >= WARMUP_STEPS {
            self.coef = solve_nonneg(&self.xtx, &self.xty).or(self.coef);
        }
    }

    /// Predicted seconds for `load`, once enough steps were seen.
    pub fn predict(&self, load: StepLoad) -> Option<f64> {
        let c = self.coef?;
        let x = load.features();
        Some(c[0] * x[0] + c[1] * x[1] + c[2] * x[2])
    }
}

/// Solves the 3×3 normal equations with a small ridge; coefficients below zero are clamped to
/// zero (a cost is never negative). `None` when the system is degenerate.
fn solve_nonneg(a: &[[f64; 3]; 3], b: &[f64; 3]) -> Option<[f64; 3]> {
    // Scale each feature to unit diagonal so the ridge is relative.
    let d: Vec<f64> = (0..3).map(|i| a[i][i].sqrt().max(1e-300)).collect();
    let mut m = [[0.0f64; 4]; 3];
    for i in 0..3 {
        for j in 0..3 {
            m[i][j] = a[i][j] / (d[i] * d[j]) + if i == j { 1e-6 } else { 0.0 };
        }
        m[i][3] = b[i] / d[i];
    }
    // Gaussian elimination with partial pivoting.
    for col in 0..3 {
        let piv = (col..3).max_by(|&x, &y| m[x][col].abs().total_cmp(&m[y][col].abs()))?;
        if m[piv][col].abs() < 1e-12 {
            return None;
        }
        m.swap(col, piv);
        for r in 0..3 {
            if r != col {
                let f = m[r][col] / m[col][col];
                let pivot = m[col];
                for (x, p) in m[r].iter_mut().zip(pivot).skip(col) {
                    *x -= f * p;
                }
            }
        }
    }
    let mut x = [0.0; 3];
    for i in 0..3 {
        x[i] = (m[i][3] / m[i][i] / d[i]).max(0.0);
        if !x[i].is_finite() {
            return None;
        }
    }
    Some(x)
}

/// The prefill cap of one step with decodes in it.
#[derive(Debug, Clone, Copy)]
pub struct StepBudget {
    /// Target duration of a step that carries decodes (`None`: no cap beyond the token budget).
    pub target: Option<Duration>,
    /// Prefill tokens (in all, over its chunks) a step with decodes may always carry, so
    /// prompts never starve.
    pub min_prefill_tokens: usize,
}

impl StepBudget {
    /// The largest prefill chunk, at most `want` tokens starting at position `start`, that keeps
    /// the step (already holding `load`, of which `prefill_in_step` prefill tokens) within the
    /// target: `want` when there is no target, no decode in the step or no trusted model yet;
    /// never below what is left of `min_prefill_tokens` for the step (nor above `want`). 0 means
    /// no more prefill fits in this step.
    pub fn cap(
        &self,
        model: &StepCostModel,
        load: &StepLoad,
        has_decodes: bool,
        prefill_in_step: usize,
        start: usize,
        want: usize,
    ) -> usize {
        let (Some(target), true) = (self.target, has_decodes) else {
            return want;
        };
        let target = target.as_secs_f64();
        let fits = |len: usize| {
            let mut l = *load;
            l.add(start, len);
            model.predict(l).is_none_or(|t| t <= target)
        };
        let floor = self
            .min_prefill_tokens
            .saturating_sub(prefill_in_step)
            .min(want);
        if fits(want) {
            return want;
        }
        // Largest fitting length by bisection (the cost grows with the length).
        let (mut lo, mut hi) = (floor, want);
        while lo + 1 < hi {
            let mid = lo + (hi - lo) / 2;
            if fits(mid) {
                lo = mid;
            } else {
                hi = mid;
            }
        }
        lo.max(floor)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn load(parts: &[(usize, usize)]) -> StepLoad {
        let mut l = StepLoad::default();
        for &(s, n) in parts {
            l.add(s, n);
        }
        l
    }

    /// Steps generated from a known cost law are fitted back and predicted.
    #[test]
    fn the_model_recovers_a_linear_cost_law() {
        let law = |l: StepLoad| 0.002 + 1e-3 * l.tokens + 2e-8 * l.pairs;
        let mut m = StepCostModel::default();
        assert_eq!(m.predict(load(&[(0, 10)])), None);
        for i in 0..60usize {
            let l = load(&[
                (1000 + 97 * i, 1),
                (3000, 1),
                ((i * 53) % 4000, 20 + (i * 37) % 300),
            ]);
            m.observe(l, Duration::from_secs_f64(law(l)));
        }
        for probe in [
            load(&[(5000, 1)]),
            load(&[(4000, 256), (6000, 1), (6000, 1)]),
        ] {
            let (got, want) = (m.predict(probe).unwrap(), law(probe));
            assert!((got - want).abs() < 0.02 * want, "{got} vs {want}");
        }
    }

    #[test]
    fn pairs_count_causal_attention() {
        let l = load(&[(0, 3)]);
        assert_eq!((l.tokens, l.pairs), (3.0, 6.0));
        let l = load(&[(100, 1)]);
        assert_eq!(l.pairs, 101.0);
    }

    #[test]
    fn the_cap_fits_the_target_and_respects_the_floor() {
        let law = |l: StepLoad| 0.001 + 1e-3 * l.tokens + 1e-7 * l.pairs;
        let mut m = StepCostModel::default();
        for i in 0..40usize {
            let l = load(&[(2000, 1), (500 * (i % 8), 10 + i * 7)]);
            m.observe(l, Duration::from_secs_f64(law(l)));
        }
        let b = StepBudget {
            target: Some(Duration::from_millis(100)),
            min_prefill_tokens: 16,
        };
        let decodes = load(&[(4000, 1), (4000, 1)]);
        let cap = b.cap(&m, &decodes, true, 0, 4000, 512);
        let mut with = decodes;
        with.add(4000, cap);
        assert!(m.predict(with).unwrap() <= 0.1);
        let mut over = decodes;
        over.add(4000, cap + 2);
        assert!(
            m.predict(over).unwrap() > 0.1,
            "cap {cap} is the largest fit"
        );
        assert!(cap > 16 && cap < 512, "{cap}");
        // No decodes, no target or a tiny target.
        assert_eq!(b.cap(&m, &StepLoad::default(), false, 0, 4000, 512), 512);
        let none = StepBudget { target: None, ..b };
        assert_eq!(none.cap(&m, &decodes, true, 0, 4000, 512), 512);
        let tiny = StepBudget {
            target: Some(Duration::from_micros(1)),
            ..b
        };
        assert_eq!(tiny.cap(&m, &decodes, true, 0, 4000, 512), 16);
        assert_eq!(tiny.cap(&m, &decodes, true, 0, 4000, 5), 5);
        // The floor is per step: what earlier chunks of the step used is subtracted.
        assert_eq!(tiny.cap(&m, &decodes, true, 10, 4000, 512), 6);
        assert_eq!(tiny.cap(&m, &decodes, true, 16, 4000, 512), 0);
    }
}
