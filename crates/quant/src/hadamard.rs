//! The normalised Walsh–Hadamard rotation of one row, used by the rotated integer codecs
//! (`int4h`, `int8h`).
//!
//! `H = H_n / √n` with `H_n` the Sylvester Hadamard matrix (`H_1 = [1]`,
//! `H_2n = [[H_n, H_n], [H_n, −H_n]]`) is orthogonal and symmetric, hence its own inverse:
//! `q·k = (Hq)·(Hk)` and `H(Hx) = x` in exact arithmetic. A K row with a few outlier channels
//! becomes a row whose energy is spread over all channels, so a per-group integer range fits it
//! far better. The transform is the in-place fast butterfly (O(n log n), n a power of two) in one
//! fixed order, followed by one multiply by `1/√n` (exact when n is a power of 4, e.g. 64 → 1/8);
//! it is portable code only, so every instruction-set path gives the same bits. Owns the
//! transform and a stack scratch row; it never quantises.

use crate::affine::F16_MAX;
use crate::error::QuantError;

/// Rows up to this many values use a stack scratch buffer; longer ones allocate.
const STACK_ROW: usize = 256;

/// Rotates `x` in place by the normalised Walsh–Hadamard matrix (applying it twice gives `x`
/// back, within rounding). `x.len()` must be a power of two.
pub fn hadamard_rotate(x: &mut [f32]) -> Result<(), QuantError> {
    if !x.len().is_power_of_two() {
        return Err(QuantError::RotationNeedsPowerOfTwo { head_dim: x.len() });
    }
    fwht(x);
    Ok(())
}

/// The normalised transform on a slice whose length the caller has validated as a power of two.
pub(crate) fn fwht(x: &mut [f32]) {
    let n = x.len();
    debug_assert!(n.is_power_of_two(), "validated by KvCodecKind::validate");
    let mut half = 1;
    while half < n {
        for block in x.chunks_exact_mut(2 * half) {
            let (lo, hi) = block.split_at_mut(half);
            for (a, b) in lo.iter_mut().zip(hi.iter_mut()) {
                let (s, d) = (*a + *b, *a - *b);
                *a = s;
                *b = d;
            }
        }
        half *= 2;
    }
    let norm = (1.0 / (n as f64).sqrt()) as f32;
    for v in x.iter_mut() {
        *v *= norm;
    }
}

/// Copies `x` into `out` with NaN → 0 and values clamped to ±65504 (what the integer codecs do
/// to non-finite input anyway), then rotates: one bad channel never spreads NaN or ±inf over
/// the whole row.
pub(crate) fn rotate_sanitised(x: &[f32], out: &mut [f32]) {
    for (o, &v) in out.iter_mut().zip(x) {
        *o = if v.is_nan() {
            0.0
        } else {
            v.clamp(-F16_MAX, F16_MAX)
        };
    }
    fwht(out);
}

/// Runs `f` on a zeroed scratch row of `n` values (on the stack up to [`STACK_ROW`]).
pub(crate) fn with_scratch<R>(n: usize, f: impl FnOnce(&mut [f32]) -> R) -> R {
    if n <= STACK_ROW {
        let mut buf = [0f32; STACK_ROW];
        f(&mut buf[..n])
    } else {
        f(&mut vec![0f32; n])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Column `j` of the normalised matrix: the transform of the unit vector `e_j`.
    fn matrix(n: usize) -> Vec<Vec<f32>> {
        (0..n)
            .map(|j| {
                let mut e = vec![0f32; n];
                e[j] = 1.0;
                fwht(&mut e);
                e
            })
            .collect()
    }

    #[test]
    fn h_is_orthogonal_symmetric_and_its_own_inverse() {
        for n in [1usize, 2, 8, 32, 64, 128, 512] {
            let h = matrix(n);
            for i in 0..n {
                for j in 0..n {
                    // Symmetric, entries ±1/√n.
                    assert_eq!(h[i][j], h[j][i], "n={n}");
                    assert!((h[i][j].abs() - 1.0 / (n as f32).sqrt()).abs() < 1e-7);
                    // (H·H)[i][j] = Σ_k H[i][k]·H[k][j] = δ_ij.
                    let hh: f64 = (0..n)
                        .map(|k| f64::from(h[i][k]) * f64::from(h[k][j]))
                        .sum();
                    let want = if i == j { 1.0 } else { 0.0 };
                    assert!((hh - want).abs() < 1e-6, "n={n} ({i},{j}): {hh}");
                }
            }
        }
    }

    #[test]
    fn rotation_preserves_dot_products_and_round_trips() {
        let n = 64;
        let a: Vec<f32> = (0..n)
            .map(|i| ((i * 37 % 11) as f32 - 5.0) * 0.3 + if i == 5 { 40.0 } else { 0.0 })
            .collect();
        let b: Vec<f32> = (0..n).map(|i| ((i * 13 % 7) as f32 - 3.0) * 0.7).collect();
        let dot = |x: &[f32], y: &[f32]| -> f64 {
            x.iter()
                .zip(y)
                .map(|(p, q)| f64::from(*p) * f64::from(*q))
                .sum()
        };
        let (mut ha, mut hb) = (a.clone(), b.clone());
        hadamard_rotate(&mut ha).unwrap();
        hadamard_rotate(&mut hb).unwrap();
        let (before, after) = (dot(&a, &b), dot(&ha, &hb));
        assert!((before - after).abs() < 1e-6 * dot(&a, &a).sqrt() * dot(&b, &b).sqrt());
        assert!((dot(&a, &a) - dot(&ha, &ha)).abs() < 1e-6 * dot(&a, &a));
        // The outlier (+40 in channel 5) is spread over all channels (40/√64 = 5 each).
        let amax = |v: &[f32]| v.iter().fold(0f32, |m, x| m.max(x.abs()));
        assert!(amax(&ha) < 0.25 * amax(&a), "{} vs {}", amax(&ha), amax(&a));
        hadamard_rotate(&mut ha).unwrap();
        for (x, y) in a.iter().zip(&ha) {
            assert!((x - y).abs() < 1e-5, "{x} vs {y}");
        }
    }

    #[test]
    fn non_power_of_two_is_a_typed_error_and_bad_values_stay_finite() {
        assert_eq!(
            hadamard_rotate(&mut [0.0; 48]),
            Err(QuantError::RotationNeedsPowerOfTwo { head_dim: 48 })
        );
        assert_eq!(
            hadamard_rotate(&mut []),
            Err(QuantError::RotationNeedsPowerOfTwo { head_dim: 0 })
        );
        let x = [f32::NAN, f32::INFINITY, 1.0, f32::NEG_INFINITY];
        let mut out = [0f32; 4];
        rotate_sanitised(&x, &mut out);
        assert!(out.iter().all(|v| v.is_finite()), "{out:?}");
        let long = with_scratch(STACK_ROW + 1, |buf| buf.len());
        assert_eq!(long, STACK_ROW + 1);
    }
}
