//! When does a conversation come back, and does it? Learned online from the gaps between a turn
//! and the turn that continues it ([`crate::TurnKind::Continue`]), in a log-spaced histogram,
//! and from how often a conversation's `k`-th turn was continued at all, per `k`; no oracle:
//! only what was already observed counts. Yields the retention TTL for an inferred
//! conversation's latest turn (a quantile of the observed gaps, clamped; a default until enough
//! gaps are seen) and the probability that a turn left `elapsed` ago still returns
//! ([`ReturnModel::return_probability`]), which ranks retentions under pressure.
//!
//! Owns the histogram only; never reads a clock (gaps are milliseconds passed in) and never
//! touches the cache.

/// Histogram bins per octave of milliseconds.
const BINS_PER_OCTAVE: f64 = 8.0;
/// Octaves covered (1 ms … ~2^34 ms ≈ 200 days; larger gaps land in the last bin).
const NUM_BINS: usize = 34 * 8;
/// Samples after which all counts are halved (older behaviour fades out).
const HALF_LIFE_SAMPLES: u64 = 20_000;
/// Turn depths counted apart for the continuation probability (deeper turns share the last).
const DEPTHS: usize = 16;

/// How the TTL follows the learned gaps.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct ReturnModelConfig {
    /// The TTL is this quantile of the observed gaps (0 < q ≤ 1).
    pub quantile: f64,
    pub min_ttl_ms: u64,
    pub max_ttl_ms: u64,
    /// TTL while fewer than `min_samples` gaps were observed.
    pub default_ttl_ms: u64,
    pub min_samples: u64,
}

impl Default for ReturnModelConfig {
    fn default() -> Self {
        ReturnModelConfig {
            quantile: 0.75,
            min_ttl_ms: 5_000,
            max_ttl_ms: 1_800_000,
            default_ttl_ms: 300_000,
            min_samples: 20,
        }
    }
}

/// The learned distribution of return gaps.
#[derive(Clone, Debug)]
pub struct ReturnModel {
    config: ReturnModelConfig,
    bins: Vec<u64>,
    samples: u64,
    /// Samples since the last halving.
    since_halving: u64,
    /// Per turn depth `k` (turns before it, capped at `DEPTHS - 1`): turns seen, and turns that
    /// a later turn continued.
    turns_at: [u64; DEPTHS],
    continued_at: [u64; DEPTHS],
}

fn bin_of(gap_ms: u64) -> usize {
    (((gap_ms as f64) + 1.0).log2() * BINS_PER_OCTAVE) as usize
}

/// The upper edge (ms) of a bin.
fn upper_edge_ms(bin: usize) -> u64 {
    ((bin as f64 + 1.0) / BINS_PER_OCTAVE).exp2() as u64
}

impl ReturnModel {
    pub fn new(config: ReturnModelConfig) -> ReturnModel {
        ReturnModel {
            config,
            bins: vec![0; NUM_BINS],
            samples: 0,
            since_halving: 0,
            turns_at: [0; DEPTHS],
            continued_at: [0; DEPTHS],
        }
    }

    /// Records a turn with `index` turns before it (continued or not: the chance that a turn
    /// returns is continued / seen at its depth).
    pub fn observe_turn(&mut self, index: u32) {
        let k = (index as usize).min(DEPTHS - 1);
        self.turns_at[k] += 1;
        if self.turns_at[k] >= HALF_LIFE_SAMPLES {
            self.turns_at[k] /= 2;
            self.continued_at[k] /= 2;
        }
        if index > 0 {
            // This turn continues the one before it.
            let j = (index as usize - 1).min(DEPTHS - 1);
            self.continued_at[j] = (self.continued_at[j] + 1).min(self.turns_at[j]);
        }
    }

    /// The chance that a turn with `index` turns before it is continued at all (Laplace-smoothed
    /// count at its depth).
    pub fn continue_probability(&self, index: u32) -> f64 {
        let k = (index as usize).min(DEPTHS - 1);
        (self.continued_at[k] as f64 + 1.0) / (self.turns_at[k] as f64 + 2.0)
    }

    /// The share of observed gaps longer than `elapsed_ms` (1 before any gap).
    pub fn survival(&self, elapsed_ms: u64) -> f64 {
        if self.samples == 0 {
            return 1.0;
        }
        let b = bin_of(elapsed_ms).min(NUM_BINS - 1);
        let longer: u64 = self.bins[b + 1..].iter().sum();
        // Within its own bin a gap is as likely above as below `elapsed_ms`.
        (longer as f64 + 0.5 * self.bins[b] as f64) / self.samples as f64
    }

    /// The mean time (ms) until a return that has not come within `elapsed_ms` does come: the
    /// mean residual of the observed gaps beyond `elapsed_ms` (bins at their geometric middle;
    /// `None` when no observed gap is longer).
    pub fn mean_residual_ms(&self, elapsed_ms: u64) -> Option<f64> {
        let b0 = bin_of(elapsed_ms).min(NUM_BINS - 1);
        let (mut weight, mut sum) = (0.0, 0.0);
        for (b, &n) in self.bins.iter().enumerate().skip(b0) {
            if n == 0 {
                continue;
            }
            let lower = if b == 0 {
                0.0
            } else {
                upper_edge_ms(b - 1) as f64
            };
            let mid = (lower.max(1.0) * upper_edge_ms(b) as f64).sqrt();
            let residual = (mid - elapsed_ms as f64).max(1.0);
            weight += n as f64;
            sum += n as f64 * residual;
        }
        (weight > 0.0).then(|| sum / weight)
    }

    /// What keeping a turn's blocks retained is worth per block and millisecond held: the chance
    /// it returns ([`ReturnModel::return_probability`]) over the mean time until it does. A turn
    /// whose return is likely and near ranks above one that may come back much later; with
    /// gaps that cluster (tool pauses) a turn close to its return ranks above a fresh one, so
    /// retentions are not thrashed.
    pub fn retention_value(&self, index: u32, elapsed_ms: u64) -> f64 {
        let p = self.return_probability(index, elapsed_ms);
        match self.mean_residual_ms(elapsed_ms) {
            Some(wait) => p / wait,
            None => 0.0,
        }
    }

    /// The chance that a turn with `index` turns before it, finished `elapsed_ms` ago and not
    /// continued since, is still continued: `p·S / (1 − p + p·S)` with `p` the continuation
    /// probability at its depth and `S` the survival of the gaps at `elapsed_ms`.
    pub fn return_probability(&self, index: u32, elapsed_ms: u64) -> f64 {
        let p = self.continue_probability(index);
        let s = self.survival(elapsed_ms);
        let num = p * s;
        let den = 1.0 - p + num;
        if den > 0.0 {
            num / den
        } else {
            0.0
        }
    }

    pub fn config(&self) -> &ReturnModelConfig {
        &self.config
    }

    /// Records one observed return gap.
    pub fn observe_gap(&mut self, gap_ms: u64) {
        self.bins[bin_of(gap_ms).min(NUM_BINS - 1)] += 1;
        self.samples += 1;
        self.since_halving += 1;
        if self.since_halving >= HALF_LIFE_SAMPLES {
            self.since_halving = 0;
            for b in &mut self.bins {
                *b /= 2;
            }
            self.samples = self.bins.iter().sum();
        }
    }

    /// Observed gaps (weighted: halvings fade old ones).
    pub fn num_samples(&self) -> u64 {
        self.samples
    }

    /// The `q` quantile of the observed gaps (upper bin edge), `None` before any.
    pub fn quantile_ms(&self, q: f64) -> Option<u64> {
        if self.samples == 0 {
            return None;
        }
        let target = (q.clamp(0.0, 1.0) * self.samples as f64).ceil().max(1.0) as u64;
        let mut acc = 0;
        for (i, n) in self.bins.iter().enumerate() {
            acc += n;
            if acc >= target {
                return Some(upper_edge_ms(i));
            }
        }
        Some(upper_edge_ms(NUM_BINS - 1))
    }

    /// The learned TTL, `None` while fewer than `min_samples` gaps were observed.
    pub fn learned_ttl_ms(&self) -> Option<u64> {
        (self.num_samples() >= self.config.min_samples).then(|| self.ttl_ms())
    }

    /// The retention TTL for a conversation's latest turn.
    pub fn ttl_ms(&self) -> u64 {
        let c = &self.config;
        let ttl = if self.num_samples() < c.min_samples {
            c.default_ttl_ms
        } else {
            self.quantile_ms(c.quantile).unwrap_or(c.default_ttl_ms)
        };
        ttl.clamp(c.min_ttl_ms, c.max_ttl_ms.max(c.min_ttl_ms))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quantiles_follow_the_gaps_within_a_bin() {
        let mut m = ReturnModel::new(ReturnModelConfig::default());
        assert_eq!(m.quantile_ms(0.5), None);
        assert_eq!(m.ttl_ms(), 300_000, "default before any gap");
        for g in 1..=100u64 {
            m.observe_gap(g * 1000);
        }
        for (q, want) in [(0.5, 50_000.0), (0.75, 75_000.0), (0.9, 90_000.0)] {
            let got = m.quantile_ms(q).unwrap() as f64;
            // One bin is 1/8 octave: ≤ 9% above the exact quantile, never below it.
            assert!(got >= want && got <= want * 1.095, "q{q}: {got} vs {want}");
        }
        assert_eq!(m.ttl_ms(), m.quantile_ms(0.75).unwrap());
    }

    #[test]
    fn return_probability_falls_with_elapsed_time_and_follows_depth() {
        let mut m = ReturnModel::new(ReturnModelConfig::default());
        assert_eq!(m.survival(1_000), 1.0, "before any gap");
        for g in 1..=100u64 {
            m.observe_gap(g * 1000);
        }
        assert!(
            (m.survival(50_000) - 0.5).abs() < 0.06,
            "{}",
            m.survival(50_000)
        );
        assert!(m.survival(0) > 0.99 && m.survival(10_000_000) == 0.0);
        // First turns are continued one time in four, second turns always.
        for c in 0..400u32 {
            m.observe_turn(0);
            if c % 4 == 0 {
                m.observe_turn(1);
            }
        }
        assert!((m.continue_probability(0) - 0.25).abs() < 0.01);
        assert!(m.continue_probability(1) < 0.02, "no third turn was seen");
        let fresh = m.return_probability(0, 0);
        assert!((fresh - 0.25).abs() < 0.02, "{fresh}");
        let mut last = fresh;
        for e in [10_000, 40_000, 80_000, 99_000] {
            let p = m.return_probability(0, e);
            assert!(p < last, "falls with elapsed time: {p} at {e} ms");
            last = p;
        }
        assert_eq!(m.return_probability(0, 10_000_000), 0.0);
    }

    #[test]
    fn the_ttl_is_clamped_and_old_gaps_fade() {
        let cfg = ReturnModelConfig {
            min_samples: 1,
            ..ReturnModelConfig::default()
        };
        let mut m = ReturnModel::new(cfg);
        m.observe_gap(10);
        assert_eq!(m.ttl_ms(), cfg.min_ttl_ms);
        let mut m = ReturnModel::new(cfg);
        m.observe_gap(u64::MAX);
        assert_eq!(m.ttl_ms(), cfg.max_ttl_ms);
        // After many long gaps, a regime of short ones takes over within a few half-lives.
        let mut m = ReturnModel::new(cfg);
        for _ in 0..HALF_LIFE_SAMPLES {
            m.observe_gap(600_000);
        }
        for _ in 0..3 * HALF_LIFE_SAMPLES {
            m.observe_gap(20_000);
        }
        assert!(m.quantile_ms(0.75).unwrap() < 25_000);
    }
}
