//! The draw of a token under temperature alone — no top-k, top-p or min-p cut, the common case
//! of a client that sends only `temperature` (or nothing: OpenAI's default is 1) — in token-id
//! order, without ordering the vocabulary. Inverse-CDF sampling gives every token its softmax
//! probability whatever order the cumulative sum runs in, so the sorted order of the cut paths
//! (`sampler::candidates`: a radix sort of 49K keys, then an `f64` `exp` per token, ~1 ms a
//! token) buys nothing here; this path reads the logits three times in vector passes instead.
//!
//! # The definition (every path performs exactly these operations: same bits, same token)
//! 1. `m` = the largest logit (the caller sends logits with a NaN, or whose largest is not
//!    finite, to the sorted path).
//! 2. `x_i = (l_i − m) · inv_t` in `f32` (the subtraction, then the multiplication, each
//!    rounded, as the sorted path computes it).
//! 3. `w_i =` [`exp_weight`]`(x_i)`: `0` for `x_i < EXP_FLOOR` (a token `e^87` times less
//!    likely than the best, and every masked `−∞`); else `e^x_i` by range reduction
//!    (`n = round_ties_even(x · log2 e)`, `r = x − n · ln 2` in two fused steps) and a degree-6
//!    Taylor polynomial in fused multiply-adds, times `2^n` (exact: `n ≥ −126`). Relative
//!    error below `3·10⁻⁷` of `e^x` (test), far below any sampling decision's resolution.
//! 4. `total = Σ w_i` in `f64` over eight lanes — lane `j` adds `w_i` for `i ≡ j (mod 8)` in
//!    ascending `i` — combined as `((s0 + s4) + (s2 + s6)) + ((s1 + s5) + (s3 + s7))`.
//! 5. `r = u · total`, `u` the request RNG's next `f64` in `[0, 1)` (one draw per token, as on
//!    the sorted path).
//! 6. The token is the first id `i` (ascending) with `r < c_i`, where `c_i = c_{i−1} + w_i` in
//!    `f64` from `c_{−1} = 0`; a token of weight 0 is never chosen. Where rounding leaves `r` at
//!    or above every `c_i` (the lane sums of step 4 round differently), the last id of
//!    positive weight.
//!
//! **With a top-p or min-p cut** (and no top-k) steps 1–4 are the same, then:
//! 5. The candidates are the tokens of weight at least `φ = max(min_p, τ)`, `τ = (1 − top_p) ·
//!    total / n` (`n` the vocabulary; `τ = 0` without top-p), in the sampling order (logit
//!    descending, ties to the lower id: [`order_key`]). The best token's weight is exactly 1
//!    (`x = 0`), so min-p's `w ≥ min_p · w_max` is `w ≥ min_p`; and the tokens below `τ` hold
//!    less than `n · τ = (1 − top_p) · total` together, so top-p's prefix never reaches them:
//!    only the candidates are ordered (few for a peaked distribution), not the vocabulary.
//! 6. Top-p keeps the shortest prefix of the candidates whose weights (`f64`, in order) reach
//!    `top_p · total`, all of them if none does.
//! 7. `r = u · mass`, `mass` the kept weights' `f64` sum in order; the token is the first kept
//!    one whose running sum exceeds `r`, the last kept one if rounding leaves none.
//!
//! **Logprobs** (`sampler::logprobs`) use steps 1–4 at `T = 1`: `log Σ e^(l − m) = ln(total)`,
//! so a token's logprob is `l − (ln(total) + m)` (the `f32` rounding of the `f64` logarithm,
//! then the addition, as before; the sum's terms are now the polynomial's, within `3·10⁻⁷` of
//! `e^x`: logprobs move by about an `f32` unit in the last place).
//!
//! The AVX2 path computes steps 1–4 on eight lanes with the same operations (the tail of a
//! vocabulary that is not a multiple of 8 through the scalar steps, into its lanes); steps 5–6
//! are scalar on every path. A seeded request so draws the same tokens on every CPU — but not
//! the tokens it drew before this path existed (then the draw ran in the sorted order).
//!
//! Owns the draw, the weights' total that logprobs normalise by, and the sampling order's keys
//! and radix sort (which the sorted path shares); never reads penalties or constraints (the
//! sampler applied them), and allocates only in the caller's buffers (and the radix sort's
//! scratch).

use rand::Rng;
use rand_chacha::ChaCha12Rng;

/// Below this `x = (l − m) / T` a token's weight is exactly 0 (`e^−87 ≈ 1.6·10⁻³⁸`).
const EXP_FLOOR: f32 = -87.0;
/// `ln 2` split for the range reduction: `LN2_HI` has few significant bits, so `n · LN2_HI` is
/// exact for every `n` in range.
const LN2_HI: f32 = 0.693_359_4;
const LN2_LO: f32 = -2.121_944_4e-4;
/// Taylor coefficients `1/k!`, `k = 2..=6` (`k = 0, 1` are 1).
const C2: f32 = 0.5;
const C3: f32 = 1.0 / 6.0;
const C4: f32 = 1.0 / 24.0;
const C5: f32 = 1.0 / 120.0;
const C6: f32 = 1.0 / 720.0;
/// Lanes of step 4's sum.
const LANES: usize = 8;
/// Candidates above which a cut's candidates are radix-sorted (`radix_sort_high`).
const RADIX_FROM: usize = 4096;

/// Step 3 of the definition: the weight of a token `x = (l − m) · inv_t` below the best
/// (`x ≤ 0`).
pub(crate) fn exp_weight(x: f32) -> f32 {
    // Also NaN (never sent here) and `−∞`.
    if x.is_nan() || x < EXP_FLOOR {
        return 0.0;
    }
    let n = (x * std::f32::consts::LOG2_E).round_ties_even();
    let r = n.mul_add(-LN2_HI, x);
    let r = n.mul_add(-LN2_LO, r);
    let mut p = C6;
    p = p.mul_add(r, C5);
    p = p.mul_add(r, C4);
    p = p.mul_add(r, C3);
    p = p.mul_add(r, C2);
    p = p.mul_add(r, 1.0);
    p = p.mul_add(r, 1.0);
    p * f32::from_bits(((n as i32 + 127) as u32) << 23)
}

/// Draws a token from `logits` under temperature `1 / inv_t` (the module's definition), the
/// weights written to `weights` (resized). `None` when the logits hold a NaN, their largest is
/// not finite or `inv_t` is not (a temperature so small that `1 / T` overflows), or no token
/// has weight: the caller's sorted path decides those.
pub(crate) fn draw(
    logits: &[f32],
    inv_t: f32,
    rng: &mut ChaCha12Rng,
    weights: &mut Vec<f32>,
) -> Option<u32> {
    let total = weights_and_total(logits, inv_t, weights)?;
    let r = rng.gen::<f64>() * total;
    Some(scan(weights, r))
}

/// Draws a token under temperature `1 / inv_t` with a top-p (`top_p < 1`) and/or min-p
/// (`min_p > 0`) cut, steps 1–7 of the module's definition; `candidates` is a buffer for the
/// candidates' keys. `None` as [`draw`].
pub(crate) fn draw_cut(
    logits: &[f32],
    inv_t: f32,
    (top_p, min_p): (f32, f32),
    rng: &mut ChaCha12Rng,
    weights: &mut Vec<f32>,
    candidates: &mut Vec<u64>,
) -> Option<u32> {
    let total = weights_and_total(logits, inv_t, weights)?;
    let kept = kept_candidates(logits, weights, total, (top_p, min_p), candidates)?;
    let weight = |k: u64| f64::from(weights[k as u32 as usize]);
    let mass: f64 = kept.iter().map(|&k| weight(k)).sum();
    let r = rng.gen::<f64>() * mass;
    let mut c = 0f64;
    for &k in kept {
        c += weight(k);
        if r < c {
            return Some(k as u32);
        }
    }
    kept.last().map(|&k| k as u32)
}

/// Steps 5–6: the kept candidates' keys, in the sampling order. `None` when no token reaches
/// the floor (a degenerate weight vector: the caller's sorted path decides).
fn kept_candidates<'a>(
    logits: &[f32],
    weights: &[f32],
    total: f64,
    (top_p, min_p): (f32, f32),
    candidates: &'a mut Vec<u64>,
) -> Option<&'a [u64]> {
    let tau = if top_p < 1.0 {
        (1.0 - f64::from(top_p)) * total / logits.len() as f64
    } else {
        0.0
    };
    let floor = tau.max(f64::from(min_p));
    candidates.clear();
    candidates.extend(
        weights
            .iter()
            .enumerate()
            .filter(|&(_, &w)| w > 0.0 && f64::from(w) >= floor)
            .map(|(i, _)| order_key(logits[i], i as u32)),
    );
    if candidates.is_empty() {
        return None;
    }
    // Few candidates (a peaked distribution, the usual case): a comparison sort; many (a flat
    // one under a top-p near 1): the radix sort, whose three passes cost less than `n log n`
    // comparisons there. Keys were pushed in id order, so both give the keys' order.
    if candidates.len() > RADIX_FROM {
        radix_sort_high(candidates);
    } else {
        candidates.sort_unstable();
    }
    let mut keep = candidates.len();
    if top_p < 1.0 {
        let goal = f64::from(top_p) * total;
        let mut acc = 0f64;
        for (j, &k) in candidates.iter().enumerate() {
            acc += f64::from(weights[k as u32 as usize]);
            if acc >= goal {
                keep = j + 1;
                break;
            }
        }
    }
    Some(&candidates[..keep])
}

/// One token's place in the sampling order — logit descending by [`f32::total_cmp`], ties to
/// the lower id — as a single integer: the logit's total-order key inverted in the high half,
/// the id in the low half. Keys of distinct ids are distinct, so ascending keys are exactly
/// that order, whatever sort produces them.
pub(crate) fn order_key(logit: f32, id: u32) -> u64 {
    let bits = logit.to_bits() as i32;
    // `total_cmp`'s key (compared as a signed integer), then shifted to compare unsigned.
    let ordered = (bits ^ ((((bits >> 31) as u32) >> 1) as i32)) as u32 ^ 0x8000_0000;
    (u64::from(!ordered) << 32) | u64::from(id)
}

/// Sorts `keys` by their high 32 bits, stably (equal high halves keep their order): least
/// significant digit first, digits of 11, 11 and 10 bits.
pub(crate) fn radix_sort_high(keys: &mut Vec<u64>) {
    let mut out = vec![0u64; keys.len()];
    let mut count = vec![0usize; 1 << 11];
    for (shift, bits) in [(32u32, 11u32), (43, 11), (54, 10)] {
        let mask = (1u64 << bits) - 1;
        let digit = |k: u64| ((k >> shift) & mask) as usize;
        count[..1 << bits].fill(0);
        for &k in keys.iter() {
            count[digit(k)] += 1;
        }
        if count[digit(keys[0])] == keys.len() {
            continue; // every key has this digit: the pass would move nothing
        }
        let mut at = 0;
        for c in count[..1 << bits].iter_mut() {
            let here = *c;
            *c = at;
            at += here;
        }
        for &k in keys.iter() {
            let d = digit(k);
            out[count[d]] = k;
            count[d] += 1;
        }
        std::mem::swap(keys, &mut out);
    }
}

/// Steps 1–4: the weights into `weights` (resized) and their total; `None` for logits with a
/// NaN or no finite maximum, an `inv_t` that is not finite, or a total that is not positive
/// and finite.
fn weights_and_total(logits: &[f32], inv_t: f32, weights: &mut Vec<f32>) -> Option<f64> {
    max_and_total(logits, inv_t, weights).map(|(_, total)| total)
}

/// Steps 1–4 as [`weights_and_total`], also returning the largest logit `m`.
pub(crate) fn max_and_total(
    logits: &[f32],
    inv_t: f32,
    weights: &mut Vec<f32>,
) -> Option<(f32, f64)> {
    let (m, nan) = max_and_nan(logits);
    if nan || !m.is_finite() || !inv_t.is_finite() {
        return None;
    }
    weights.clear();
    weights.resize(logits.len(), 0.0);
    let lanes = weigh(logits, m, inv_t, weights);
    let total = ((lanes[0] + lanes[4]) + (lanes[2] + lanes[6]))
        + ((lanes[1] + lanes[5]) + (lanes[3] + lanes[7]));
    if total.is_nan() || total <= 0.0 || total.is_infinite() {
        return None;
    }
    Some((m, total))
}

/// Step 1, and whether any logit is NaN.
/// Eight independent lanes, so the compiler vectorises it (compare and blend; the maximum of
/// numbers does not depend on the order, and a NaN sends the logits elsewhere anyway).
fn max_and_nan(logits: &[f32]) -> (f32, bool) {
    let mut m = [f32::NEG_INFINITY; LANES];
    let mut nan = [false; LANES];
    let chunks = logits.chunks_exact(LANES);
    let tail = chunks.remainder();
    for c in chunks {
        for j in 0..LANES {
            nan[j] |= c[j].is_nan();
            m[j] = if c[j] > m[j] { c[j] } else { m[j] };
        }
    }
    let mut best = f32::NEG_INFINITY;
    let mut any_nan = nan.iter().any(|&n| n);
    for &l in m.iter().chain(tail) {
        any_nan |= l.is_nan();
        best = if l > best { l } else { best };
    }
    (best, any_nan)
}

/// Steps 2–4: the weights into `weights` (as long as `logits`) and the eight lane sums.
fn weigh(logits: &[f32], m: f32, inv_t: f32, weights: &mut [f32]) -> [f64; LANES] {
    #[cfg(target_arch = "x86_64")]
    {
        if kernels::cpu_features().avx2 {
            // SAFETY: AVX2 with FMA was detected (`avx2` includes FMA); the slices have the
            // same length (caller).
            return unsafe { x86::weigh_avx2(logits, m, inv_t, weights) };
        }
    }
    weigh_portable(logits, m, inv_t, weights, 0)
}

/// Steps 2–4 on ids `from..`, one at a time (the definition; the AVX2 path's tail).
fn weigh_portable(
    logits: &[f32],
    m: f32,
    inv_t: f32,
    weights: &mut [f32],
    from: usize,
) -> [f64; LANES] {
    let mut lanes = [0f64; LANES];
    weigh_into(logits, m, inv_t, weights, from, &mut lanes);
    lanes
}

fn weigh_into(
    logits: &[f32],
    m: f32,
    inv_t: f32,
    weights: &mut [f32],
    from: usize,
    lanes: &mut [f64; LANES],
) {
    for i in from..logits.len() {
        let w = exp_weight((logits[i] - m) * inv_t);
        weights[i] = w;
        lanes[i % LANES] += f64::from(w);
    }
}

/// Step 6.
fn scan(weights: &[f32], r: f64) -> u32 {
    let mut c = 0f64;
    let mut last = 0usize;
    for (i, &w) in weights.iter().enumerate() {
        if w > 0.0 {
            c += f64::from(w);
            if r < c {
                return i as u32;
            }
            last = i;
        }
    }
    last as u32
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use std::arch::x86_64::*;

    use super::{C2, C3, C4, C5, C6, EXP_FLOOR, LANES, LN2_HI, LN2_LO};

    /// Steps 2–4 on eight lanes (the same operations as [`super::exp_weight`] per lane: a
    /// lane below the floor or NaN-free `−∞` is zeroed by the mask, as the scalar returns 0),
    /// the tail through [`super::weigh_into`].
    ///
    /// # Safety
    /// AVX2 and FMA present; `weights.len() == logits.len()`.
    #[target_feature(enable = "avx2,fma")]
    pub(super) unsafe fn weigh_avx2(
        logits: &[f32],
        m: f32,
        inv_t: f32,
        weights: &mut [f32],
    ) -> [f64; LANES] {
        assert_eq!(weights.len(), logits.len(), "one weight per logit");
        let (vm, vt) = (_mm256_set1_ps(m), _mm256_set1_ps(inv_t));
        let floor = _mm256_set1_ps(EXP_FLOOR);
        let log2e = _mm256_set1_ps(std::f32::consts::LOG2_E);
        let (hi, lo) = (_mm256_set1_ps(-LN2_HI), _mm256_set1_ps(-LN2_LO));
        let one = _mm256_set1_ps(1.0);
        let (mut s03, mut s47) = (_mm256_setzero_pd(), _mm256_setzero_pd());
        let body = logits.len() / LANES * LANES;
        for i in (0..body).step_by(LANES) {
            // SAFETY: `i + 8 <= body <= len` for both slices.
            let l = unsafe { _mm256_loadu_ps(logits.as_ptr().add(i)) };
            let x = _mm256_mul_ps(_mm256_sub_ps(l, vm), vt);
            let keep = _mm256_cmp_ps::<_CMP_GE_OQ>(x, floor);
            let n = _mm256_round_ps::<{ _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC }>(
                _mm256_mul_ps(x, log2e),
            );
            let r = _mm256_fmadd_ps(n, hi, x);
            let r = _mm256_fmadd_ps(n, lo, r);
            let mut p = _mm256_fmadd_ps(_mm256_set1_ps(C6), r, _mm256_set1_ps(C5));
            p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(C4));
            p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(C3));
            p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(C2));
            p = _mm256_fmadd_ps(p, r, one);
            p = _mm256_fmadd_ps(p, r, one);
            // `2^n` from its exponent bits; lanes outside the range are masked off below.
            let e = _mm256_slli_epi32::<23>(_mm256_add_epi32(
                _mm256_cvtps_epi32(n),
                _mm256_set1_epi32(127),
            ));
            let w = _mm256_and_ps(_mm256_mul_ps(p, _mm256_castsi256_ps(e)), keep);
            // SAFETY: as the load.
            unsafe { _mm256_storeu_ps(weights.as_mut_ptr().add(i), w) };
            s03 = _mm256_add_pd(s03, _mm256_cvtps_pd(_mm256_castps256_ps128(w)));
            s47 = _mm256_add_pd(s47, _mm256_cvtps_pd(_mm256_extractf128_ps::<1>(w)));
        }
        let mut lanes = [0f64; LANES];
        // SAFETY: `lanes` holds 8 doubles.
        unsafe {
            _mm256_storeu_pd(lanes.as_mut_ptr(), s03);
            _mm256_storeu_pd(lanes.as_mut_ptr().add(4), s47);
        }
        super::weigh_into(logits, m, inv_t, weights, body, &mut lanes);
        lanes
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::SeedableRng;

    fn logits(n: usize, seed: u64) -> Vec<f32> {
        let mut rng = ChaCha12Rng::seed_from_u64(seed);
        (0..n)
            .map(|i| match i % 97 {
                0 => f32::NEG_INFINITY,
                1 => -200.0,
                _ => rng.gen_range(-30.0f32..12.0),
            })
            .collect()
    }

    #[test]
    fn the_weight_is_exp_within_its_error_and_exact_at_the_ends() {
        assert_eq!(exp_weight(0.0), 1.0);
        assert_eq!(exp_weight(f32::NEG_INFINITY), 0.0);
        assert_eq!(exp_weight(EXP_FLOOR - 0.001), 0.0);
        let mut worst = 0f64;
        let mut x = EXP_FLOOR;
        while x <= 0.0 {
            let want = f64::from(x).exp();
            let got = f64::from(exp_weight(x));
            worst = worst.max(((got - want) / want).abs());
            x += 0.000_731;
        }
        assert!(worst < 3e-7, "relative error {worst:e}");
    }

    #[test]
    fn every_path_gives_the_definitions_weights_and_sums() {
        for n in [1usize, 7, 8, 9, 63, 1000, 49_152] {
            let l = logits(n, n as u64);
            let (m, nan) = max_and_nan(&l);
            assert!(!nan);
            for inv_t in [1.0f32, 1.0 / 0.7, 1.0 / 1.9] {
                let mut want = vec![0f32; n];
                let lanes_want = weigh_portable(&l, m, inv_t, &mut want, 0);
                let mut got = vec![f32::NAN; n];
                let lanes_got = weigh(&l, m, inv_t, &mut got);
                assert_eq!(
                    got.iter().map(|w| w.to_bits()).collect::<Vec<_>>(),
                    want.iter().map(|w| w.to_bits()).collect::<Vec<_>>(),
                    "weights, n {n}"
                );
                assert_eq!(lanes_got.map(f64::to_bits), lanes_want.map(f64::to_bits));
            }
        }
    }

    #[test]
    fn draws_follow_the_softmax_and_never_pick_a_masked_token() {
        let l = [
            1.0f32,
            f32::NEG_INFINITY,
            0.0,
            2.5,
            -1.0,
            f32::NEG_INFINITY,
            0.5,
        ];
        let inv_t = 1.0 / 0.8;
        let m = 2.5f32;
        let p: Vec<f64> = l
            .iter()
            .map(|&x| f64::from((x - m) * inv_t).exp())
            .collect();
        let z: f64 = p.iter().sum();
        let mut rng = ChaCha12Rng::seed_from_u64(7);
        let mut w = Vec::new();
        let draws = 200_000;
        let mut count = [0usize; 7];
        for _ in 0..draws {
            count[draw(&l, inv_t, &mut rng, &mut w).unwrap() as usize] += 1;
        }
        assert_eq!(count[1] + count[5], 0, "masked tokens drawn");
        for (i, &c) in count.iter().enumerate() {
            let want = p[i] / z * draws as f64;
            let sd = (want * (1.0 - p[i] / z)).sqrt().max(1.0);
            assert!(
                (c as f64 - want).abs() < 5.0 * sd,
                "token {i}: {c} draws, expected {want:.0}"
            );
        }
    }

    #[test]
    fn a_nan_or_no_finite_logit_goes_to_the_sorted_path() {
        let mut rng = ChaCha12Rng::seed_from_u64(1);
        let mut w = Vec::new();
        assert_eq!(draw(&[0.0, f32::NAN], 1.0, &mut rng, &mut w), None);
        assert_eq!(draw(&[f32::NEG_INFINITY; 3], 1.0, &mut rng, &mut w), None);
        assert_eq!(draw(&[0.0, f32::INFINITY], 1.0, &mut rng, &mut w), None);
        // A NaN in the vector body, and in the tail, of a longer vocabulary.
        for at in [3usize, 17, 20] {
            let mut l = logits(21, 3);
            l[at] = f32::NAN;
            assert!(max_and_nan(&l).1, "NaN at {at}");
            assert_eq!(draw(&l, 1.0, &mut rng, &mut w), None);
        }
        let l = logits(1001, 5);
        let want = l.iter().copied().fold(f32::NEG_INFINITY, f32::max);
        assert_eq!(max_and_nan(&l), (want, false));
        assert_eq!(
            draw(&[0.0; 4], f32::INFINITY, &mut rng, &mut w),
            None,
            "1 / T overflowed"
        );
    }

    /// The cuts as the sorted path defines them, in `f64` over the whole sorted vocabulary:
    /// min-p's `take_while`, then top-p's prefix, as sets of ids.
    fn kept_by_the_sorted_definition(l: &[f32], inv_t: f32, top_p: f32, min_p: f32) -> Vec<u32> {
        let mut ids: Vec<u32> = (0..l.len() as u32).collect();
        ids.sort_by_key(|&i| order_key(l[i as usize], i));
        let m = l[ids[0] as usize];
        let q: Vec<f64> = ids
            .iter()
            .map(|&i| f64::from((l[i as usize] - m) * inv_t).exp())
            .collect();
        let total: f64 = q.iter().sum();
        let mut keep = q
            .iter()
            .take_while(|&&x| x >= f64::from(min_p) * q[0])
            .count();
        if top_p < 1.0 {
            let mut acc = 0.0;
            let mut n = 0;
            for &x in &q[..keep] {
                acc += x / total;
                n += 1;
                if acc >= f64::from(top_p) {
                    break;
                }
            }
            keep = n;
        }
        let mut kept = ids[..keep.max(1)].to_vec();
        kept.sort_unstable();
        kept
    }

    #[test]
    fn the_cuts_keep_the_sorted_definitions_tokens() {
        let mut cand = Vec::new();
        let mut w = Vec::new();
        for seed in 0..40u64 {
            let n = [50usize, 1000, 49_152][seed as usize % 3];
            let mut rng = ChaCha12Rng::seed_from_u64(seed);
            let spread = [2.0f32, 8.0, 30.0][(seed / 3) as usize % 3];
            let l: Vec<f32> = (0..n).map(|_| rng.gen_range(-spread..spread)).collect();
            for (top_p, min_p) in [
                (0.9f32, 0.0f32),
                (0.5, 0.0),
                (0.99, 0.0),
                (1.0, 0.05),
                (0.95, 0.1),
                (0.9999, 0.0),
            ] {
                let inv_t = 1.0 / 0.7;
                let total = weights_and_total(&l, inv_t, &mut w).unwrap();
                let kept = kept_candidates(&l, &w, total, (top_p, min_p), &mut cand).unwrap();
                let ordered: Vec<u64> = {
                    let mut k = kept.to_vec();
                    k.sort_unstable();
                    k
                };
                assert_eq!(kept, &ordered[..], "kept in the sampling order");
                let mut got: Vec<u32> = kept.iter().map(|&k| k as u32).collect();
                got.sort_unstable();
                assert_eq!(
                    got,
                    kept_by_the_sorted_definition(&l, inv_t, top_p, min_p),
                    "seed {seed}, n {n}, top_p {top_p}, min_p {min_p}"
                );
            }
        }
    }

    #[test]
    fn cut_draws_follow_the_renormalised_softmax_of_the_kept_tokens() {
        let l = [3.0f32, 2.0, 1.0, 0.0, -1.0, f32::NEG_INFINITY, 2.5];
        let inv_t = 1.0;
        let mut rng = ChaCha12Rng::seed_from_u64(11);
        let (mut w, mut cand) = (Vec::new(), Vec::new());
        // Probabilities 0.459 (3.0), 0.279 (2.5), 0.169 (2.0), 0.062, 0.023, 0.008: top-p 0.8
        // keeps the first three (0.738, then 0.907), min-p 0.2 the weights 1, 0.607, 0.368
        // (1.0's 0.135 is below 0.2), top-p 0.5 the first two.
        for (cuts, kept) in [
            ((0.8f32, 0.0f32), vec![0usize, 6, 1]),
            ((1.0, 0.2), vec![0, 6, 1]),
            ((0.5, 0.0), vec![0, 6]),
        ] {
            let z: f64 = kept.iter().map(|&i| f64::from(l[i] - 3.0).exp()).sum();
            let draws = 100_000;
            let mut count = [0usize; 7];
            for _ in 0..draws {
                count[draw_cut(&l, inv_t, cuts, &mut rng, &mut w, &mut cand).unwrap() as usize] +=
                    1;
            }
            for (i, &c) in count.iter().enumerate() {
                let p = if kept.contains(&i) {
                    f64::from(l[i] - 3.0).exp() / z
                } else {
                    0.0
                };
                let want = p * draws as f64;
                let sd = (want * (1.0 - p)).sqrt().max(1.0);
                assert!(
                    (c as f64 - want).abs() < 5.0 * sd,
                    "{cuts:?}: token {i}: {c}, expected {want:.0}"
                );
            }
        }
    }

    #[test]
    fn the_scan_takes_the_first_crossing_and_the_last_weighted_id_past_the_end() {
        let w = [0.0f32, 0.25, 0.0, 0.5, 0.25, 0.0];
        assert_eq!(scan(&w, 0.0), 1);
        assert_eq!(scan(&w, 0.2499), 1);
        assert_eq!(scan(&w, 0.25), 3);
        assert_eq!(scan(&w, 0.9), 4);
        assert_eq!(
            scan(&w, 1.0),
            4,
            "at or past the total: the last weighted id"
        );
    }
}
