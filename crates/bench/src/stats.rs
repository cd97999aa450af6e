//! Summary statistics over latency samples: mean, min, max and percentiles by linear
//! interpolation between closest ranks (numpy's default), plus empirical CDF points for plots.
//! Pure functions; NaN samples are dropped, never compared.

use serde::{Deserialize, Serialize};

/// The `p`-th percentile (0–100) of ascending `sorted` samples; `None` when empty or p out of range.
pub fn percentile(sorted: &[f64], p: f64) -> Option<f64> {
    if sorted.is_empty() || !(0.0..=100.0).contains(&p) {
        return None;
    }
    let rank = p / 100.0 * (sorted.len() - 1) as f64;
    let lo = rank.floor() as usize;
    let hi = rank.ceil() as usize;
    let frac = rank - lo as f64;
    Some(sorted[lo] + (sorted[hi] - sorted[lo]) * frac)
}

/// Summary of one metric, in the samples' unit (seconds for latencies).
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct Summary {
    pub count: usize,
    pub mean: f64,
    pub min: f64,
    pub p50: f64,
    pub p95: f64,
    pub p99: f64,
    pub max: f64,
}

/// Sorted copy of the finite samples.
pub fn sorted_finite(values: impl IntoIterator<Item = f64>) -> Vec<f64> {
    let mut v: Vec<f64> = values.into_iter().filter(|x| x.is_finite()).collect();
    v.sort_by(f64::total_cmp);
    v
}

/// `None` when there is no finite sample.
pub fn summarize(values: impl IntoIterator<Item = f64>) -> Option<Summary> {
    let v = sorted_finite(values);
    let n = v.len();
    Some(Summary {
        count: n,
        mean: v.iter().sum::<f64>() / n as f64,
        min: *v.first()?,
        p50: percentile(&v, 50.0)?,
        p95: percentile(&v, 95.0)?,
        p99: percentile(&v, 99.0)?,
        max: *v.last()?,
    })
}

/// Empirical CDF of ascending samples: `(value, fraction ≤ value)` per sample.
pub fn cdf_points(sorted: &[f64]) -> Vec<(f64, f64)> {
    let n = sorted.len() as f64;
    sorted
        .iter()
        .enumerate()
        .map(|(i, &x)| (x, (i + 1) as f64 / n))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentiles_match_numpy_linear() {
        // numpy.percentile([1..=10], [50, 95, 99]) = 5.5, 9.55, 9.91
        let v: Vec<f64> = (1..=10).map(f64::from).collect();
        assert_eq!(percentile(&v, 50.0), Some(5.5));
        assert!((percentile(&v, 95.0).unwrap() - 9.55).abs() < 1e-12);
        assert!((percentile(&v, 99.0).unwrap() - 9.91).abs() < 1e-12);
        assert_eq!(percentile(&v, 0.0), Some(1.0));
        assert_eq!(percentile(&v, 100.0), Some(10.0));
        assert_eq!(percentile(&[], 50.0), None);
        assert_eq!(percentile(&v, 101.0), None);
        assert_eq!(percentile(&[4.0], 99.0), Some(4.0));
    }

    #[test]
    fn summary_drops_nan_and_sorts() {
        let s = summarize([3.0, f64::NAN, 1.0, 2.0]).unwrap();
        assert_eq!(
            (s.count, s.min, s.p50, s.max, s.mean),
            (3, 1.0, 2.0, 3.0, 2.0)
        );
        assert!(summarize([f64::NAN]).is_none());
        assert_eq!(cdf_points(&[1.0, 2.0]), vec![(1.0, 0.5), (2.0, 1.0)]);
    }
}
