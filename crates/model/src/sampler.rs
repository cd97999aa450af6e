//! Token sampling from logits: greedy, temperature, top-k, top-p, min-p, repetition / presence /
//! frequency penalties, seeded reproducible randomness, and logprobs. Without top-k, the draw is
//! `sample_temperature`'s (no ordering of the vocabulary); top-k selects its candidates first.
//!
//! Owns the per-request [`Sampler`] (its RNG is private to the
//! request, so a seeded request draws the same tokens whatever else runs). Logprobs are those of
//! the model's raw distribution (log-softmax of the unmodified logits), as vLLM reports by
//! default. It never touches the model or the tokenizer.

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha12Rng;

use crate::sample_temperature::{order_key, radix_sort_high};

pub use frontend::sampling::{
    ConstraintError, ConstraintFactory, ConstraintSpec, SamplingError, SamplingParams,
    TokenConstraint,
};

/// One sampled token with its logprob and the top alternatives (`(id, logprob)`, best first).
/// The logprob is NaN unless the request asked for logprobs (`SamplingParams::logprobs` or
/// `top_logprobs`).
#[derive(Debug, Clone, PartialEq)]
pub struct SampledToken {
    pub id: u32,
    pub logprob: f32,
    pub top: Vec<(u32, f32)>,
}

/// Per-request sampler state.
pub struct Sampler {
    params: SamplingParams,
    constraint: Option<Box<dyn TokenConstraint>>,
    rng: ChaCha12Rng,
    output_counts: std::collections::HashMap<u32, u32>,
    work: Vec<f32>,
    /// The draw's weights and candidates (`sample_temperature`), kept between tokens.
    weights: Vec<f32>,
    candidates: Vec<u64>,
}

impl Sampler {
    pub fn new(params: SamplingParams) -> Self {
        let seed = params.seed.unwrap_or_else(rand::random);
        Sampler {
            constraint: params.constraint.as_ref().map(|c| c.0.start()),
            params,
            rng: ChaCha12Rng::seed_from_u64(seed),
            output_counts: Default::default(),
            work: Vec::new(),
            weights: Vec::new(),
            candidates: Vec::new(),
        }
    }

    pub fn params(&self) -> &SamplingParams {
        &self.params
    }

    /// True when a constraint decides which tokens may come next.
    pub fn is_constrained(&self) -> bool {
        self.constraint.is_some()
    }

    /// Computes the constraint's mask for the next token ahead of [`Sampler::sample`] (see
    /// [`TokenConstraint::prepare`]); a no-op without a constraint.
    pub fn prepare_constraint(&mut self) {
        if let Some(c) = self.constraint.as_mut() {
            c.prepare();
        }
    }

    /// Records a generated token (for presence / frequency / repetition penalties).
    pub fn observe(&mut self, id: u32) {
        *self.output_counts.entry(id).or_insert(0) += 1;
    }

    /// Samples the next token. `prompt` is used by the repetition penalty only. Fails only when
    /// the constraint cannot continue: no token is allowed (a grammar that dead-ends, or one
    /// that failed), checked after masking whatever the constraint says.
    pub fn sample(
        &mut self,
        logits: &[f32],
        prompt: &[u32],
    ) -> Result<SampledToken, ConstraintError> {
        let p = &self.params;
        self.work.clear();
        self.work.extend_from_slice(logits);
        let work = &mut self.work;
        if p.repetition_penalty != 1.0 {
            let mut seen: Vec<u32> = prompt
                .iter()
                .copied()
                .chain(self.output_counts.keys().copied())
                .collect();
            seen.sort_unstable();
            seen.dedup();
            for id in seen {
                if let Some(l) = work.get_mut(id as usize) {
                    *l = if *l > 0.0 {
                        *l / p.repetition_penalty
                    } else {
                        *l * p.repetition_penalty
                    };
                }
            }
        }
        if p.presence_penalty != 0.0 || p.frequency_penalty != 0.0 {
            for (&id, &count) in &self.output_counts {
                if let Some(l) = work.get_mut(id as usize) {
                    *l -= p.presence_penalty + p.frequency_penalty * count as f32;
                }
            }
        }
        for &(id, bias) in &p.logit_bias {
            if let Some(l) = work.get_mut(id as usize) {
                *l += bias;
            }
        }
        if let Some(c) = self.constraint.as_mut() {
            c.mask_logits(work)?;
            if !work.iter().any(|l| *l > f32::NEG_INFINITY) {
                return Err(ConstraintError(
                    "the output constraint allows no next token".into(),
                ));
            }
        }
        let id = if p.is_greedy() {
            argmax(work)
        } else {
            let bufs = (&mut self.weights, &mut self.candidates);
            sample_filtered(work, p, &mut self.rng, bufs)
        };
        if let Some(c) = self.constraint.as_mut() {
            c.accept(id);
        }
        let (logprob, top) = if p.logprobs || p.top_logprobs > 0 {
            logprobs_with(
                logits,
                id,
                p.top_logprobs,
                (&mut self.weights, &mut self.candidates),
            )
        } else {
            (f32::NAN, Vec::new())
        };
        Ok(SampledToken { id, logprob, top })
    }
}

/// Index of the largest value; ties go to the lowest index (`+0.0` and `-0.0` tie), NaNs are
/// never chosen unless `x[0]` is one (then `0`). Empty input gives `0`. On AVX2 the same index is
/// found in two vector passes (the maximum, then its first occurrence) instead of a serial
/// compare chain over the vocabulary.
pub fn argmax(x: &[f32]) -> u32 {
    #[cfg(target_arch = "x86_64")]
    if kernels::cpu_features().avx2 {
        // SAFETY: AVX2 was detected (`cpu_features` only reports what the CPU has).
        return unsafe { argmax_avx2(x) };
    }
    argmax_portable(x)
}

/// The definition of [`argmax`]: the first index whose value is greater than every earlier one.
fn argmax_portable(x: &[f32]) -> u32 {
    let mut best = 0usize;
    for (i, &v) in x.iter().enumerate() {
        if v > x[best] {
            best = i;
        }
    }
    best as u32
}

/// [`argmax_portable`]'s index in two passes: `m` = the maximum of the non-NaN values (`maxps`
/// returns its second operand, the running maximum, when a lane of `x` is NaN), then the first
/// index holding a value equal to `m`. That is the definition's index: every value before the
/// first one equal to `m` is smaller, so the definition moves onto it and never leaves it.
///
/// # Safety
/// The CPU has AVX2.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn argmax_avx2(x: &[f32]) -> u32 {
    use std::arch::x86_64::*;
    let Some(&first) = x.first() else {
        return 0;
    };
    if first.is_nan() {
        return 0;
    }
    let chunks = x.chunks_exact(8);
    let tail = chunks.remainder();
    let mut acc = _mm256_set1_ps(first);
    for c in chunks.clone() {
        // SAFETY: `c` holds 8 floats.
        let v = unsafe { _mm256_loadu_ps(c.as_ptr()) };
        acc = _mm256_max_ps(v, acc);
    }
    let mut lanes = [0f32; 8];
    // SAFETY: `lanes` holds 8 floats.
    unsafe { _mm256_storeu_ps(lanes.as_mut_ptr(), acc) };
    let m = lanes
        .iter()
        .chain(tail)
        .fold(first, |m, &v| if v > m { v } else { m });
    let vm = _mm256_set1_ps(m);
    for (i, c) in chunks.enumerate() {
        // SAFETY: `c` holds 8 floats.
        let v = unsafe { _mm256_loadu_ps(c.as_ptr()) };
        let hits = _mm256_movemask_ps(_mm256_cmp_ps::<_CMP_EQ_OQ>(v, vm));
        if hits != 0 {
            return (8 * i + hits.trailing_zeros() as usize) as u32;
        }
    }
    let body = x.len() - tail.len();
    let at = tail.iter().position(|&v| v == m).unwrap_or(0);
    (body + at) as u32
}

/// The ids of the `top_k` first tokens in the sampling order ([`order_key`]), all of them when
/// `top_k` is 0 or covers the vocabulary. The whole vocabulary (only where `sample_temperature`
/// declines: logits with a NaN) is ordered by a stable radix sort of the keys' high halves over
/// ids taken in ascending order — the same order as sorting the whole keys, in three passes over
/// the vocabulary instead of a comparison sort that read two logits per comparison (2 ms a
/// token on a 49K vocabulary, paid by every sequence of the step: `sampler_cost`); a top-k
/// cut selects its keys first and sorts only those ([`first_keys`]).
fn candidates(logits: &[f32], top_k: usize) -> Vec<u32> {
    let mut keys = Vec::new();
    if top_k > 0 && top_k < logits.len() {
        first_keys(logits, top_k, &mut keys);
    } else {
        keys_in_id_order(logits, &mut keys);
        radix_sort_high(&mut keys);
    }
    keys.into_iter().map(|k| k as u32).collect()
}

/// Every token's [`order_key`] into `keys`, in id order.
fn keys_in_id_order(logits: &[f32], keys: &mut Vec<u64>) {
    keys.clear();
    keys.extend(
        logits
            .iter()
            .enumerate()
            .map(|(i, &l)| order_key(l, i as u32)),
    );
}

/// The keys of the `n` (`1 ≤ n ≤ logits.len()`) first tokens in the sampling order, sorted:
/// selected among all keys, then only those sorted.
fn first_keys(logits: &[f32], n: usize, keys: &mut Vec<u64>) {
    keys_in_id_order(logits, keys);
    keys.select_nth_unstable(n - 1);
    keys.truncate(n);
    keys.sort_unstable();
}

/// A token drawn under temperature `p.temperature` from the candidates the cuts leave: without
/// top-k, by `sample_temperature`'s definition (in token-id order, or over the few candidates a
/// top-p or min-p cut can keep); with top-k, or where that path declines (NaN logits), in the
/// sorted order below.
fn sample_filtered(
    logits: &[f32],
    p: &SamplingParams,
    rng: &mut ChaCha12Rng,
    (weights, keys): (&mut Vec<f32>, &mut Vec<u64>),
) -> u32 {
    if p.top_k == 0 || p.top_k >= logits.len() {
        let inv_t = 1.0 / p.temperature;
        let drawn = if p.top_p >= 1.0 && p.min_p <= 0.0 {
            crate::sample_temperature::draw(logits, inv_t, rng, weights)
        } else {
            let cuts = (p.top_p, p.min_p);
            crate::sample_temperature::draw_cut(logits, inv_t, cuts, rng, weights, keys)
        };
        if let Some(id) = drawn {
            return id;
        }
    }
    // Candidates sorted by logit descending (ties: lower id first), truncated by top-k.
    let idx = candidates(logits, p.top_k);
    let inv_t = 1.0 / p.temperature;
    let max = logits[idx[0] as usize];
    let mut probs: Vec<f64> = idx
        .iter()
        .map(|&i| (((logits[i as usize] - max) * inv_t) as f64).exp())
        .collect();
    let total: f64 = probs.iter().sum();
    probs.iter_mut().for_each(|q| *q /= total);
    // min-p: keep tokens with prob >= min_p * p_max (p_max = probs[0]).
    let mut keep = probs.len();
    if p.min_p > 0.0 {
        let floor = p.min_p as f64 * probs[0];
        keep = probs.iter().take_while(|&&q| q >= floor).count().max(1);
    }
    // top-p: smallest prefix whose mass reaches top_p.
    if p.top_p < 1.0 {
        let mut acc = 0.0;
        let mut n = 0;
        for &q in &probs[..keep] {
            acc += q;
            n += 1;
            if acc >= p.top_p as f64 {
                break;
            }
        }
        keep = n.max(1);
    }
    let mass: f64 = probs[..keep].iter().sum();
    let r = rng.gen::<f64>() * mass;
    let mut acc = 0.0;
    for (j, &q) in probs[..keep].iter().enumerate() {
        acc += q;
        if r < acc {
            return idx[j];
        }
    }
    idx[keep - 1]
}

/// Log-softmax of `logits` at `id` and the `top_n` best `(id, logprob)`.
pub fn logprobs(logits: &[f32], id: u32, top_n: usize) -> (f32, Vec<(u32, f32)>) {
    logprobs_with(logits, id, top_n, (&mut Vec::new(), &mut Vec::new()))
}

/// [`logprobs`] with the caller's buffers for the weights and the order keys. The normaliser
/// is `sample_temperature`'s weight total at temperature 1 (vector passes); logits it declines
/// (a NaN, no finite maximum) take the `f64` sum of `exp` over the vocabulary, as before. The
/// `top_n` best are top-k's candidates ([`first_keys`]: logit descending, ties to the lower id).
fn logprobs_with(
    logits: &[f32],
    id: u32,
    top_n: usize,
    (weights, keys): (&mut Vec<f32>, &mut Vec<u64>),
) -> (f32, Vec<(u32, f32)>) {
    let lse = match crate::sample_temperature::max_and_total(logits, 1.0, weights) {
        Some((max, total)) => total.ln() as f32 + max,
        None => {
            let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max);
            (logits
                .iter()
                .map(|&l| ((l - max) as f64).exp())
                .sum::<f64>())
            .ln() as f32
                + max
        }
    };
    let mut top = Vec::new();
    let n = top_n.min(logits.len());
    if n > 0 {
        first_keys(logits, n, keys);
        top = keys
            .iter()
            .map(|&k| (k as u32, logits[k as u32 as usize] - lse))
            .collect();
    }
    (logits[id as usize] - lse, top)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    fn logits() -> Vec<f32> {
        vec![1.0, 3.0, 2.0, 3.0, -1.0, 0.5]
    }

    /// Seeded random vectors against the definition: lengths around the vector width and a
    /// vocabulary's, values drawn from a few levels (ties), signed zeros, infinities and NaNs
    /// anywhere, the first element included.
    #[test]
    fn argmax_matches_the_definition() {
        use rand::{Rng, SeedableRng};
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(17);
        let specials = [
            0.0,
            -0.0,
            f32::INFINITY,
            f32::NEG_INFINITY,
            f32::NAN,
            3.0,
            -3.0,
        ];
        let mut lens: Vec<usize> = (0..40).collect();
        lens.extend([49_152, 49_155, 151_936]);
        for &len in &lens {
            for round in 0..60 {
                let x: Vec<f32> = (0..len)
                    .map(|_| match rng.gen_range(0..10) {
                        0 => specials[rng.gen_range(0..specials.len())],
                        1..=4 => rng.gen_range(-4i32..4) as f32,
                        _ => rng.gen_range(-30.0f32..30.0),
                    })
                    .collect();
                assert_eq!(
                    argmax(&x),
                    argmax_portable(&x),
                    "len {len} round {round}: {x:?}"
                );
            }
        }
        let all_nan = vec![f32::NAN; 20];
        assert_eq!(argmax(&all_nan), 0);
        let mut zeros = vec![-1.0f32; 19];
        zeros[9] = -0.0;
        zeros[13] = 0.0;
        assert_eq!(argmax(&zeros), 9);
    }

    #[test]
    fn greedy_picks_max_lowest_id_on_tie() {
        let mut s = Sampler::new(SamplingParams::default());
        let t = s.sample(&logits(), &[]).unwrap();
        assert_eq!(t.id, 1);
    }

    /// Without `logprobs` (nor `top_logprobs`) the token is the same and its logprob is not
    /// computed (NaN); asked, it is the log-softmax's.
    #[test]
    fn the_logprob_is_computed_only_when_asked() {
        for temperature in [0.0, 0.8] {
            let params = |logprobs| SamplingParams {
                temperature,
                seed: Some(5),
                logprobs,
                ..Default::default()
            };
            let (mut quiet, mut asked) = (Sampler::new(params(false)), Sampler::new(params(true)));
            for _ in 0..20 {
                let (a, b) = (
                    quiet.sample(&logits(), &[]).unwrap(),
                    asked.sample(&logits(), &[]).unwrap(),
                );
                assert_eq!(a.id, b.id, "the same draws");
                assert!(a.logprob.is_nan() && a.top.is_empty());
                assert_eq!(b.logprob, logprobs(&logits(), b.id, 0).0);
            }
        }
    }

    #[test]
    fn logprobs_are_normalised_and_top_sorted() {
        let mut s = Sampler::new(SamplingParams {
            top_logprobs: 3,
            ..Default::default()
        });
        let t = s.sample(&logits(), &[]).unwrap();
        let total: f32 = logits().iter().map(|&l| (l - 3.0).exp()).sum();
        assert!((t.logprob - (1.0 / total).ln()).abs() < 1e-5);
        assert_eq!(t.top.iter().map(|x| x.0).collect::<Vec<_>>(), vec![1, 3, 2]);
    }

    /// Logprobs against an `f64` log-softmax on a vocabulary's worth of random logits (masked
    /// and tied ones included): within `f32` rounding; the top alternatives in the comparison
    /// order (ties to the lower id); NaN logits take the `f64` path.
    #[test]
    fn logprobs_match_the_f64_log_softmax_and_the_comparison_order() {
        use rand::{Rng, SeedableRng};
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(37);
        for n in [5usize, 49_152] {
            let l: Vec<f32> = (0..n)
                .map(|i| match i % 50 {
                    0 => f32::NEG_INFINITY,
                    1 | 2 => 4.0,
                    _ => (rng.gen_range(-20.0f32..4.0) * 4.0).round() / 4.0,
                })
                .collect();
            let max = l.iter().copied().fold(f32::NEG_INFINITY, f32::max);
            let lse = l
                .iter()
                .map(|&x| f64::from(x - max).exp())
                .sum::<f64>()
                .ln()
                + f64::from(max);
            for id in [0u32, 1, 3, (n - 1) as u32] {
                let (lp, top) = logprobs(&l, id, 20);
                let want = f64::from(l[id as usize]) - lse;
                if want.is_finite() {
                    assert!(
                        (f64::from(lp) - want).abs() < 4e-6,
                        "id {id}: {lp} vs {want}"
                    );
                } else {
                    assert_eq!(lp, f32::NEG_INFINITY);
                }
                let mut ids: Vec<u32> = (0..n as u32).collect();
                ids.sort_by(|a, b| l[*b as usize].total_cmp(&l[*a as usize]).then(a.cmp(b)));
                ids.truncate(20);
                assert_eq!(top.iter().map(|t| t.0).collect::<Vec<_>>(), ids);
                for &(i, v) in &top {
                    let want = f64::from(l[i as usize]) - lse;
                    if want.is_finite() {
                        assert!((f64::from(v) - want).abs() < 4e-6, "top {i}: {v} vs {want}");
                    } else {
                        assert_eq!(v, f32::NEG_INFINITY);
                    }
                }
            }
        }
        let (lp, _) = logprobs(&[0.0, f32::NAN, 1.0], 0, 2);
        assert!(
            lp.is_nan(),
            "NaN logits give NaN logprobs, as the f64 path always did"
        );
    }

    /// The candidates' order (`candidates`: radix-sorted keys, or selected and sorted keys
    /// under top-k) is the comparison sort's by `total_cmp` descending, ties to the lower id:
    /// on random logits with heavy ties, signed zeros, infinities and NaNs of both signs,
    /// across sizes around the radix digits and a vocabulary's.
    #[test]
    fn candidates_come_in_the_comparison_order() {
        use rand::{Rng, SeedableRng};
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(36);
        let specials = [
            0.0f32,
            -0.0,
            f32::INFINITY,
            f32::NEG_INFINITY,
            f32::NAN,
            -f32::NAN,
            f32::MIN_POSITIVE,
            -1e-40,
        ];
        for n in [1usize, 2, 7, 100, 2048, 2049, 49_152] {
            let logits: Vec<f32> = (0..n)
                .map(|_| match rng.gen_range(0..10) {
                    0 => specials[rng.gen_range(0..specials.len())],
                    1..=4 => rng.gen_range(-4i32..4) as f32 * 0.5,
                    _ => rng.gen_range(-30.0f32..30.0),
                })
                .collect();
            let mut want: Vec<u32> = (0..n as u32).collect();
            want.sort_by(|a, b| {
                logits[*b as usize]
                    .total_cmp(&logits[*a as usize])
                    .then(a.cmp(b))
            });
            assert_eq!(candidates(&logits, 0), want, "n={n}");
            for k in [1, 3, n / 2 + 1, n] {
                let k = k.clamp(1, n);
                assert_eq!(candidates(&logits, k), want[..k], "n={n} top_k={k}");
            }
        }
        // Every key the same in its top digits: those passes are skipped, the order holds.
        let same: Vec<f32> = (0..5000).map(|i| 1.0 + (i % 3) as f32 * 1e-6).collect();
        let mut want: Vec<u32> = (0..5000).collect();
        want.sort_by(|a, b| {
            same[*b as usize]
                .total_cmp(&same[*a as usize])
                .then(a.cmp(b))
        });
        assert_eq!(candidates(&same, 0), want);
    }

    #[test]
    fn seeded_sampling_is_reproducible_and_seed_dependent() {
        let params = |seed| SamplingParams {
            temperature: 1.5,
            seed: Some(seed),
            ..Default::default()
        };
        let draw = |seed| {
            let mut s = Sampler::new(params(seed));
            (0..50)
                .map(|_| s.sample(&logits(), &[]).unwrap().id)
                .collect::<Vec<_>>()
        };
        assert_eq!(draw(7), draw(7));
        assert_ne!(draw(7), draw(8));
    }

    #[test]
    fn top_k_restricts_candidates() {
        let mut s = Sampler::new(SamplingParams {
            temperature: 5.0,
            top_k: 2,
            seed: Some(1),
            ..Default::default()
        });
        for _ in 0..200 {
            let id = s.sample(&logits(), &[]).unwrap().id;
            assert!(id == 1 || id == 3, "got {id}");
        }
    }

    #[test]
    fn top_p_and_min_p_restrict_candidates() {
        let mut s = Sampler::new(SamplingParams {
            temperature: 1.0,
            top_p: 0.5,
            seed: Some(3),
            ..Default::default()
        });
        for _ in 0..200 {
            let id = s.sample(&logits(), &[]).unwrap().id;
            assert!(id == 1 || id == 3, "top_p got {id}");
        }
        let mut s = Sampler::new(SamplingParams {
            temperature: 1.0,
            min_p: 0.5,
            seed: Some(3),
            ..Default::default()
        });
        for _ in 0..200 {
            let id = s.sample(&logits(), &[]).unwrap().id;
            assert!([1, 2, 3].contains(&id), "min_p got {id}");
        }
    }

    #[test]
    fn penalties_change_the_greedy_choice() {
        let mut s = Sampler::new(SamplingParams {
            presence_penalty: 1.5,
            ..Default::default()
        });
        s.observe(1);
        s.observe(3);
        assert_eq!(s.sample(&logits(), &[]).unwrap().id, 2);
        let mut s = Sampler::new(SamplingParams {
            repetition_penalty: 2.0,
            ..Default::default()
        });
        assert_eq!(s.sample(&logits(), &[1, 3]).unwrap().id, 2);
        let mut s = Sampler::new(SamplingParams {
            frequency_penalty: 0.6,
            ..Default::default()
        });
        s.observe(1);
        s.observe(1);
        assert_eq!(s.sample(&logits(), &[]).unwrap().id, 3);
    }

    #[test]
    fn logit_bias_moves_the_choice_and_leaves_logprobs_raw() {
        let mut s = Sampler::new(SamplingParams {
            logit_bias: vec![(1, -100.0), (3, -100.0)],
            logprobs: true,
            ..Default::default()
        });
        let t = s.sample(&logits(), &[]).unwrap();
        assert_eq!(t.id, 2);
        let plain = Sampler::new(SamplingParams::default())
            .sample(&logits(), &[])
            .unwrap();
        let (raw, _) = logprobs(&logits(), 2, 0);
        assert_eq!(t.logprob, raw);
        assert_eq!(plain.id, 1);
        let mut s = Sampler::new(SamplingParams {
            logit_bias: vec![(5, 100.0), (999, 100.0)],
            temperature: 1.0,
            seed: Some(1),
            ..Default::default()
        });
        for _ in 0..50 {
            assert_eq!(s.sample(&logits(), &[]).unwrap().id, 5);
        }
    }

    /// Allows only the token after the last accepted one (starting at 4), wrapping at 6.
    struct Counting(std::sync::Mutex<Vec<u32>>);
    struct CountingState(u32, Arc<Counting>);
    impl TokenConstraint for CountingState {
        fn mask_logits(&mut self, logits: &mut [f32]) -> Result<(), ConstraintError> {
            for (i, l) in logits.iter_mut().enumerate() {
                if i as u32 != self.0 {
                    *l = f32::NEG_INFINITY;
                }
            }
            Ok(())
        }
        fn accept(&mut self, id: u32) {
            self.1 .0.lock().unwrap().push(id);
            self.0 = (id + 1) % 6;
        }
    }
    struct CountingFactory(Arc<Counting>);
    impl ConstraintFactory for CountingFactory {
        fn start(&self) -> Box<dyn TokenConstraint> {
            Box::new(CountingState(4, self.0.clone()))
        }
        fn describe(&self) -> String {
            "counting".into()
        }
    }

    #[test]
    fn a_constraint_decides_the_token_and_sees_every_choice() {
        let seen = Arc::new(Counting(Default::default()));
        let spec = ConstraintSpec(Arc::new(CountingFactory(seen.clone())));
        for temperature in [0.0, 1.5] {
            let mut s = Sampler::new(SamplingParams {
                temperature,
                seed: Some(9),
                top_logprobs: 1,
                constraint: Some(spec.clone()),
                ..Default::default()
            });
            let ids: Vec<u32> = (0..4)
                .map(|_| s.sample(&logits(), &[]).unwrap().id)
                .collect();
            assert_eq!(ids, vec![4, 5, 0, 1]);
            // Logprobs stay those of the raw distribution.
            let t = s.sample(&logits(), &[]).unwrap();
            assert_eq!((t.id, t.top[0].0), (2, 1));
        }
        assert_eq!(seen.0.lock().unwrap().len(), 10);
        assert_eq!(spec, spec.clone());
        let other = ConstraintSpec(Arc::new(CountingFactory(seen)));
        assert_ne!(spec, other);
    }

    /// Allows every token until `.0` steps were taken, then none (a grammar that dead-ends).
    struct DeadEnd(usize, Arc<std::sync::atomic::AtomicUsize>);
    impl TokenConstraint for DeadEnd {
        fn mask_logits(&mut self, logits: &mut [f32]) -> Result<(), ConstraintError> {
            if self.0 == 0 {
                logits.fill(f32::NEG_INFINITY);
            }
            Ok(())
        }
        fn accept(&mut self, _: u32) {
            self.0 -= 1;
            self.1.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        }
    }
    struct DeadEndFactory(Arc<std::sync::atomic::AtomicUsize>);
    impl ConstraintFactory for DeadEndFactory {
        fn start(&self) -> Box<dyn TokenConstraint> {
            Box::new(DeadEnd(2, self.0.clone()))
        }
        fn describe(&self) -> String {
            "dead end".into()
        }
    }

    #[test]
    fn a_constraint_that_allows_nothing_is_an_error_not_a_token() {
        let accepted = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        for temperature in [0.0, 1.0] {
            let mut s = Sampler::new(SamplingParams {
                temperature,
                seed: Some(3),
                constraint: Some(ConstraintSpec(Arc::new(DeadEndFactory(accepted.clone())))),
                ..Default::default()
            });
            assert!(s.sample(&logits(), &[]).is_ok());
            assert!(s.sample(&logits(), &[]).is_ok());
            let e = s.sample(&logits(), &[]).unwrap_err();
            assert!(e.0.contains("allows no next token"), "{e}");
        }
        // The failed step accepted nothing.
        assert_eq!(accepted.load(std::sync::atomic::Ordering::Relaxed), 4);
    }

    #[test]
    fn validation_rejects_bad_values() {
        assert!(SamplingParams {
            logit_bias: vec![(1, 100.5)],
            ..Default::default()
        }
        .validate()
        .is_err());
        assert!(SamplingParams {
            logit_bias: vec![(1, f32::NAN)],
            ..Default::default()
        }
        .validate()
        .is_err());
        assert!(SamplingParams {
            temperature: -1.0,
            ..Default::default()
        }
        .validate()
        .is_err());
        assert!(SamplingParams {
            top_p: 0.0,
            ..Default::default()
        }
        .validate()
        .is_err());
        assert!(SamplingParams {
            top_p: f32::NAN,
            ..Default::default()
        }
        .validate()
        .is_err());
        assert!(SamplingParams {
            min_p: 1.5,
            ..Default::default()
        }
        .validate()
        .is_err());
        assert!(SamplingParams {
            top_logprobs: 21,
            ..Default::default()
        }
        .validate()
        .is_err());
        assert!(SamplingParams::default().validate().is_ok());
    }
}
