//! When does a conversation come back? Learned online from the gaps between a turn and the turn
//! that continues it ([`crate::TurnKind::Continue`]), in a log-spaced histogram, no oracle: only
//! gaps already observed count. Yields the retention TTL for an inferred conversation's latest
//! turn: a quantile of the observed gaps, clamped; a default until enough gaps are seen.
//!
//! Owns the histogram only; never reads a clock (gaps are milliseconds passed in) and never
//! touches the cache.

/// Histogram bins per octave of milliseconds.
const BINS_PER_OCTAVE: f64 = 8.0;
/// Octaves covered (1 ms … ~2^34 ms ≈ 200 days; larger gaps land in the last bin).
const NUM_BINS: usize = 34 * 8;
/// Samples after which all counts are halved (older behaviour fades out).
const HALF_LIFE_SAMPLES: u64 = 20_000;

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
