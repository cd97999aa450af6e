//! Activation quantisation: f32 rows `[num_tokens, row_len]` to 8-bit blocks of 32.
//!
//! Owns [`ActQ8`], the per-matmul scratch holding, for every token and every 32-element block,
//! the scale `d = f16(amax / 127)`, the signed 8-bit values `q = round_ties_even(x * (127 / amax))`
//! and the scaled sum `s = f16((amax / 127) * Σq)` (the Q8_1 "sum term" that zero-point weight
//! types need), plus the exact integer sums of each four consecutive `q` and of each block (the
//! packed kernels' corrections for their unsigned operands, per lane and per block, see
//! `packed32` and `packed32_blocksum`). This is exactly ggml's `quantize_row_q8_0` / `quantize_row_q8_1` (x86 AVX2 path):
//! the multiplier is `127 / amax` (not `1 / d`), and `d` and `s` are rounded to f16 (stored as the
//! f32 value of that f16), so our integer dot products see the same operands as llama.cpp's.
//! The AVX2 and scalar paths perform the same IEEE operations and give bit-identical blocks (for
//! inputs without NaN).
//! It never allocates once its buffers have grown to the largest shape seen.

use super::cpu::CpuFeatures;
use super::pool::ThreadPool;

/// Elements per activation block.
pub const QK8: usize = 32;

/// Quantised activations. Layouts: `d`, `s`: `[num_tokens, num_blocks]`; `qs`:
/// `[num_tokens, row_len]` with `row_len = num_blocks * 32`.
#[derive(Debug, Default, Clone)]
pub struct ActQ8 {
    pub num_tokens: usize,
    pub num_blocks: usize,
    pub d: Vec<f32>,
    pub s: Vec<f32>,
    /// `Σ q[4l..4l+4]` for the eight lanes `l` of each block: `[num_tokens, num_blocks, 8]`.
    pub lane_sums: Vec<i32>,
    /// `Σ q` of each block (the sum of its eight lane sums): `[num_tokens, num_blocks]`.
    pub block_sums: Vec<i32>,
    pub qs: Vec<i8>,
}

impl ActQ8 {
    /// Quantises `x` (`[num_tokens, row_len]`, `row_len` a multiple of 32, checked by the caller)
    /// into `self`, reusing its buffers.
    pub fn quantize(
        &mut self,
        features: CpuFeatures,
        x: &[f32],
        num_tokens: usize,
        row_len: usize,
    ) {
        self.shape(x, num_tokens, row_len);
        quantize_blocks(
            features,
            x,
            &mut Blocks {
                qs: &mut self.qs,
                d: &mut self.d,
                s: &mut self.s,
                lane_sums: &mut self.lane_sums,
                block_sums: &mut self.block_sums,
            },
        );
    }

    /// [`ActQ8::quantize`] with the tokens spread over `pool` from [`PAR_QUANTIZE_MIN_TOKENS`]
    /// tokens on (a prefill step's inputs; a decode quantises on the caller): each block is
    /// quantised by the same code whichever task takes it, so the result is the same bits.
    pub fn quantize_on(
        &mut self,
        pool: &ThreadPool,
        features: CpuFeatures,
        x: &[f32],
        num_tokens: usize,
        row_len: usize,
    ) {
        if pool.num_threads() == 1 || num_tokens < PAR_QUANTIZE_MIN_TOKENS {
            return self.quantize(features, x, num_tokens, row_len);
        }
        self.shape(x, num_tokens, row_len);
        let per = num_tokens.div_ceil(2 * pool.num_threads());
        let nb = row_len / QK8;
        // Each task's tokens: disjoint slices of every buffer, handed out once.
        let parts: Vec<std::sync::Mutex<(&[f32], Blocks<'_>)>> = x
            .chunks(per * row_len)
            .zip(self.qs.chunks_mut(per * row_len))
            .zip(self.d.chunks_mut(per * nb))
            .zip(self.s.chunks_mut(per * nb))
            .zip(self.lane_sums.chunks_mut(per * nb * 8))
            .zip(self.block_sums.chunks_mut(per * nb))
            .map(|(((((x, qs), d), s), lane_sums), block_sums)| {
                std::sync::Mutex::new((
                    x,
                    Blocks {
                        qs,
                        d,
                        s,
                        lane_sums,
                        block_sums,
                    },
                ))
            })
            .collect();
        pool.for_each(parts.len(), &|task| {
            let mut part = parts[task].lock().unwrap_or_else(|e| e.into_inner());
            let (x, blocks) = &mut *part;
            quantize_blocks(features, x, blocks);
        });
    }

    /// Sets the shape and sizes the buffers for `num_tokens` rows of `row_len`.
    fn shape(&mut self, x: &[f32], num_tokens: usize, row_len: usize) {
        assert!(
            row_len.is_multiple_of(QK8) && x.len() == num_tokens * row_len,
            "caller checks shapes"
        );
        let num_blocks = row_len / QK8;
        self.num_tokens = num_tokens;
        self.num_blocks = num_blocks;
        let total_blocks = num_tokens * num_blocks;
        self.d.resize(total_blocks, 0.0);
        self.s.resize(total_blocks, 0.0);
        self.lane_sums.resize(total_blocks * 8, 0);
        self.block_sums.resize(total_blocks, 0);
        self.qs.resize(num_tokens * row_len, 0);
    }
}

/// Fewest tokens for which [`ActQ8::quantize_on`] (and the K-quant twin, `ActQ8K::quantize_on`)
/// spreads the blocks over the pool.
pub(super) const PAR_QUANTIZE_MIN_TOKENS: usize = 8;

/// The outputs of a run of whole blocks (`x.len() / 32` of them).
struct Blocks<'a> {
    qs: &'a mut [i8],
    d: &'a mut [f32],
    s: &'a mut [f32],
    lane_sums: &'a mut [i32],
    block_sums: &'a mut [i32],
}

/// Quantises the blocks of `x` into `out` (the module doc's fields, block by block).
fn quantize_blocks(features: CpuFeatures, x: &[f32], out: &mut Blocks<'_>) {
    let blocks = x.chunks_exact(QK8).zip(out.qs.chunks_exact_mut(QK8));
    let scales = out.d.iter_mut().zip(out.s.iter_mut());
    let lanes = out
        .lane_sums
        .chunks_exact_mut(8)
        .zip(out.block_sums.iter_mut());
    for ((xb, qb), ((d, s), (lane_sums, block_sum))) in blocks.zip(scales.zip(lanes)) {
        let xb: &[f32; QK8] = xb.try_into().expect("chunks_exact yields 32 elements");
        let qb: &mut [i8; QK8] = qb.try_into().expect("chunks_exact yields 32 elements");
        let lane_sums: &mut [i32; 8] = lane_sums.try_into().expect("chunks of 8 lanes");
        #[cfg(target_arch = "x86_64")]
        if features.clamp_to_detected().avx2 {
            // SAFETY: AVX2+FMA+F16C presence was checked at runtime just above.
            (*d, *s, *block_sum) = unsafe { avx2::quantize_block(xb, qb, lane_sums) };
            continue;
        }
        (*d, *s) = quantize_block_scalar(xb, qb);
        for (l, ls) in lane_sums.iter_mut().enumerate() {
            *ls = qb[4 * l..4 * l + 4].iter().map(|q| i32::from(*q)).sum();
        }
        *block_sum = lane_sums.iter().sum();
    }
    let _ = features;
}

/// Scale for a block whose largest magnitude is `amax` (unrounded f32), and the quantisation
/// multiplier `127 / amax` (0 for an all-zero block), as ggml computes them.
#[inline(always)]
fn scale_and_inverse(amax: f32) -> (f32, f32) {
    let d = amax / 127.0;
    let id = if amax != 0.0 { 127.0 / amax } else { 0.0 };
    (d, id)
}

/// `f32(f16(x))`, round to nearest even (what ggml's `GGML_CPU_FP32_TO_FP16` does with F16C).
#[inline(always)]
fn through_f16(x: f32) -> f32 {
    half::f16::from_f32(x).to_f32()
}

/// The stored `(d, s)` of a block: both rounded to f16, `s` computed from the unrounded `d`.
#[inline(always)]
fn stored_scales(d: f32, sum: i32) -> (f32, f32) {
    (through_f16(d), through_f16(d * sum as f32))
}

pub(crate) fn quantize_block_scalar(x: &[f32; QK8], q: &mut [i8; QK8]) -> (f32, f32) {
    let amax = x.iter().fold(0f32, |m, v| m.max(v.abs()));
    let (d, id) = scale_and_inverse(amax);
    let mut sum = 0i32;
    for (qi, xi) in q.iter_mut().zip(x) {
        let v = (xi * id).round_ties_even() as i32;
        *qi = v as i8;
        sum += v;
    }
    stored_scales(d, sum)
}

#[cfg(target_arch = "x86_64")]
mod avx2 {
    use super::{scale_and_inverse, QK8};
    use std::arch::x86_64::*;

    /// AVX2 twin of [`super::quantize_block_scalar`], which also writes the block's eight lane
    /// sums and returns `(d, s, Σq)`: the same integers and the same f16 roundings (one F16C
    /// conversion of both scales, round to nearest even, as `half` does with F16C).
    #[target_feature(enable = "avx2,fma,f16c")]
    pub(super) fn quantize_block(
        x: &[f32; QK8],
        q: &mut [i8; QK8],
        lane_sums: &mut [i32; 8],
    ) -> (f32, f32, i32) {
        // SAFETY: `x` holds 32 floats, read as four unaligned 8-lane vectors.
        let v = unsafe {
            let p = x.as_ptr();
            [
                _mm256_loadu_ps(p),
                _mm256_loadu_ps(p.add(8)),
                _mm256_loadu_ps(p.add(16)),
                _mm256_loadu_ps(p.add(24)),
            ]
        };
        let sign = _mm256_set1_ps(-0.0);
        let a = v.map(|vi| _mm256_andnot_ps(sign, vi));
        let m = _mm256_max_ps(_mm256_max_ps(a[0], a[1]), _mm256_max_ps(a[2], a[3]));
        let m4 = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps(m, 1));
        let m2 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
        let m1 = _mm_max_ss(m2, _mm_movehdup_ps(m2));
        let (d, id) = scale_and_inverse(_mm_cvtss_f32(m1));
        let idv = _mm256_set1_ps(id);
        let i = v.map(|vi| {
            let r = _mm256_round_ps(
                _mm256_mul_ps(vi, idv),
                _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC,
            );
            _mm256_cvtps_epi32(r)
        });
        // Lane sums: two horizontal adds leave [l0 l2 l4 l6 | l1 l3 l5 l7] (each 128-bit half
        // adds its own pairs), the permute puts the lanes in order.
        let h = _mm256_hadd_epi32(_mm256_hadd_epi32(i[0], i[1]), _mm256_hadd_epi32(i[2], i[3]));
        let lanes = _mm256_permutevar8x32_epi32(h, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
        // SAFETY: `lane_sums` holds exactly 8 i32.
        unsafe { _mm256_storeu_si256(lane_sums.as_mut_ptr().cast(), lanes) };
        let s4 = _mm_add_epi32(
            _mm256_castsi256_si128(lanes),
            _mm256_extracti128_si256(lanes, 1),
        );
        let s2 = _mm_add_epi32(s4, _mm_unpackhi_epi64(s4, s4));
        let s1 = _mm_add_epi32(s2, _mm_shuffle_epi32(s2, 1));
        let sum = _mm_cvtsi128_si32(s1);
        // Pack 32 x i32 to 32 x i8; packs work per 128-bit lane, the permute restores order.
        let p01 = _mm256_packs_epi32(i[0], i[1]);
        let p23 = _mm256_packs_epi32(i[2], i[3]);
        let p = _mm256_packs_epi16(p01, p23);
        let p = _mm256_permutevar8x32_epi32(p, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
        // SAFETY: `q` holds exactly 32 bytes.
        unsafe { _mm256_storeu_si256(q.as_mut_ptr().cast(), p) };
        // `stored_scales(d, sum)`: both through f16 in one conversion.
        let ds = _mm_setr_ps(d, d * sum as f32, 0.0, 0.0);
        let r = _mm_cvtph_ps(_mm_cvtps_ph::<_MM_FROUND_TO_NEAREST_INT>(ds));
        (_mm_cvtss_f32(r), _mm_cvtss_f32(_mm_movehdup_ps(r)), sum)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::{Rng, SeedableRng};

    /// The pool-spread quantisation equals the caller's, field by field, whatever the pool and
    /// the token count (below the threshold, at it, uneven splits).
    #[test]
    fn pool_spread_quantisation_equals_the_serial_one() {
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(9);
        let row_len = 96;
        for threads in [1, 2, 3] {
            let pool = ThreadPool::new(threads);
            for toks in [
                1,
                PAR_QUANTIZE_MIN_TOKENS - 1,
                PAR_QUANTIZE_MIN_TOKENS,
                37,
                130,
            ] {
                let x: Vec<f32> = (0..toks * row_len)
                    .map(|_| rng.gen_range(-4.0f32..4.0))
                    .collect();
                let (mut a, mut b) = (ActQ8::default(), ActQ8::default());
                a.quantize(CpuFeatures::detect(), &x, toks, row_len);
                // A reused scratch of another shape first: the buffers are resized, not stale.
                b.quantize(CpuFeatures::detect(), &x[..row_len], 1, row_len);
                b.quantize_on(&pool, CpuFeatures::detect(), &x, toks, row_len);
                let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
                assert_eq!((a.num_tokens, a.num_blocks), (b.num_tokens, b.num_blocks));
                assert_eq!(a.qs, b.qs, "{threads} threads, {toks} tokens");
                assert_eq!(bits(&a.d), bits(&b.d));
                assert_eq!(bits(&a.s), bits(&b.s));
                assert_eq!(a.lane_sums, b.lane_sums);
                assert_eq!(a.block_sums, b.block_sums);
            }
        }
    }

    /// Blocks from f16-subnormal to f16-overflowing scales (`d` and `s` rounded through f16 in
    /// the vector path by F16C, in the portable one by `half`): every field agrees bit for bit.
    #[test]
    fn paths_agree_across_magnitudes() {
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(8);
        let scales = [1e-9f32, 1e-6, 3e-4, 1.0, 300.0, 1e4, 1e30];
        let row_len = QK8 * scales.len() * 4;
        let x: Vec<f32> = (0..2 * row_len)
            .map(|i| scales[(i / QK8) % scales.len()] * rng.gen_range(-1.0f32..1.0))
            .collect();
        let (mut a, mut b) = (ActQ8::default(), ActQ8::default());
        a.quantize(CpuFeatures::PORTABLE, &x, 2, row_len);
        b.quantize(CpuFeatures::detect(), &x, 2, row_len);
        let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
        assert_eq!(a.qs, b.qs);
        assert_eq!(bits(&a.d), bits(&b.d));
        assert_eq!(bits(&a.s), bits(&b.s));
        assert_eq!(a.lane_sums, b.lane_sums);
        assert_eq!(a.block_sums, b.block_sums);
        assert!(
            a.s.iter().any(|s| s.is_infinite())
                && a.d.iter().any(|d| *d != 0.0 && d.abs() < 6.1e-5)
        );
    }

    #[test]
    fn blocks_round_trip_within_half_step_and_paths_agree() {
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(3);
        let num_tokens = 3;
        let row_len = 96;
        let mut x: Vec<f32> = (0..num_tokens * row_len)
            .map(|_| rng.gen_range(-5.0f32..5.0))
            .collect();
        x[32..64].iter_mut().for_each(|v| *v = 0.0); // an all-zero block
        x[70] = 0.5; // exact ties after scaling are possible; both paths use ties-to-even
        let mut a = ActQ8::default();
        let mut b = ActQ8::default();
        a.quantize(CpuFeatures::PORTABLE, &x, num_tokens, row_len);
        b.quantize(CpuFeatures::detect(), &x, num_tokens, row_len);
        assert_eq!(a.qs, b.qs);
        assert_eq!(
            a.d.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
            b.d.iter().map(|v| v.to_bits()).collect::<Vec<_>>()
        );
        assert_eq!(
            a.s.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
            b.s.iter().map(|v| v.to_bits()).collect::<Vec<_>>()
        );
        for blk in 0..num_tokens * row_len / QK8 {
            let d = a.d[blk];
            let amax = x[blk * QK8..(blk + 1) * QK8]
                .iter()
                .fold(0f32, |m, v| m.max(v.abs()));
            assert_eq!(
                d,
                half::f16::from_f32(amax / 127.0).to_f32(),
                "d is f16-rounded"
            );
            let mut sum = 0i32;
            for k in 0..QK8 {
                let q = a.qs[blk * QK8 + k];
                assert!(q != i8::MIN);
                // Within half a step of the unrounded scale, plus the f16 rounding of d.
                let err = (f32::from(q) * d - x[blk * QK8 + k]).abs();
                assert!(err <= 0.5 * d * 1.0001 + 127.0 * d / 1024.0 + 1e-7);
                sum += i32::from(q);
            }
            let s_want = half::f16::from_f32((amax / 127.0) * sum as f32).to_f32();
            assert_eq!(a.s[blk], s_want, "s is f16((amax / 127) * sum)");
        }
        assert_eq!(a.lane_sums, b.lane_sums);
        assert_eq!(a.block_sums, b.block_sums);
        for (i, sum) in a.lane_sums.iter().enumerate() {
            let want: i32 = a.qs[4 * i..4 * i + 4].iter().map(|q| i32::from(*q)).sum();
            assert_eq!(*sum, want);
        }
        assert_eq!(a.d[1], 0.0);
        assert!(a.qs[32..64].iter().all(|q| *q == 0));
    }
}
