//! The tile step of `flash_tile` for many query rows against a K tile stored transposed
//! (`[head_dim][TILE_POSITIONS]` f32), in AVX-512 (512-bit) registers: one score vector holds
//! all 16 positions of the tile, so the eight lane chains of a dot product (`flash_tile`'s
//! module doc, step 1) are eight vector accumulators fed by broadcast-FMA chains, and their
//! reduction tree `((x0+x1)+(x2+x3)) + ((x4+x5)+(x6+x7))` is seven vertical adds — no horizontal
//! sums per position. The softmax runs on the 16-lane score vector, and `p·V` broadcasts each
//! `p[t]` over V rows into register accumulators shared by up to three rows (a GQA triple, `flash_tile_transposed`'s schedule).
//!
//! Every IEEE operation is the one `flash_tile::tile_update` performs (same chains, same tree,
//! same exponential lanes, same accumulation order), so the results are bit-identical to the
//! row-major kernels and to the portable definition (tests pin this): a row's result still
//! depends only on its query, its K/V and its position count.
//!
//! Owns transposing a widened K tile and the 512-bit tile step; it never reads a KV store,
//! never allocates and never decides which rows share a tile (`attention_tiled` does).

use super::cpu::{cpu_features, CpuFeatures};
#[cfg(target_arch = "x86_64")]
use super::flash_tile::TRIPLE_ROWS;
use super::flash_tile::{TileElem, TileSoftmax, TILE_POSITIONS};

/// Proof that the 512-bit tile step may run here (AVX-512 F with AVX2, FMA and F16C detected
/// and not overridden): obtained once per task, so the kernel checks no feature per call.
#[derive(Debug, Clone, Copy)]
pub struct WideTiles(());

impl WideTiles {
    /// The token when `features` (clamped to what the CPU has) allow the 512-bit kernel.
    pub fn with(features: CpuFeatures) -> Option<WideTiles> {
        features.clamp_to_detected().avx512.then_some(WideTiles(()))
    }

    /// [`WideTiles::with`] the process's features.
    pub fn here() -> Option<WideTiles> {
        WideTiles::with(cpu_features())
    }
}

/// `kt[d · TILE_POSITIONS + at + t] = f32(keys[t · hd + d])` for `t < n` and `d < hd` (a run of
/// `n` K rows, f32 or f16 widened exactly, landing at tile position `at`); other positions of
/// `kt` are left as they are (the kernel masks them). Panics on a shape mismatch.
pub fn transpose_keys<E: TileElem>(keys: &[E], n: usize, hd: usize, kt: &mut [f32], at: usize) {
    assert!(
        at + n <= TILE_POSITIONS && keys.len() >= n * hd && kt.len() >= hd * TILE_POSITIONS,
        "transpose shapes: n={n} at={at} hd={hd} keys={} kt={}",
        keys.len(),
        kt.len()
    );
    let mut t0 = 0;
    #[cfg(target_arch = "x86_64")]
    if cpu_features().avx2 && hd.is_multiple_of(8) {
        while t0 + 8 <= n {
            for d0 in (0..hd).step_by(8) {
                // SAFETY: AVX2+F16C presence was checked at runtime; rows `t0..t0 + 8 <= n` of
                // `keys` hold columns `d0..d0 + 8 <= hd`, and `kt` holds rows `d0..d0 + 8` of
                // `TILE_POSITIONS` with columns `at + t0..at + t0 + 8 <= 16` (the assertion).
                unsafe { x86::transpose8(keys, hd, t0, d0, kt, at + t0) };
            }
            t0 += 8;
        }
    }
    for t in t0..n {
        for d in 0..hd {
            kt[d * TILE_POSITIONS + at + t] = keys[t * hd + d].widen();
        }
    }
}

#[cfg(target_arch = "x86_64")]
pub(crate) mod x86 {
    //! AVX2 transposition and AVX-512 tile bodies; callers check the features at runtime.
    use super::super::flash_tile::avx2::values16;
    use super::super::flash_tile::{
        exp_poly, EXP_MIN, LN2_HI, LN2_LO, LOG2E, P0, P1, P2, P3, P4, P5,
    };
    use super::*;
    use std::arch::x86_64::*;

    /// The 8×8 transpose of eight 8-lane registers: lane `i` of output `j` is lane `j` of input
    /// `i` (unpack, shuffle, 128-bit permute; pure data movement). Shared with `ggml_tiled`'s
    /// AVX2 path.
    #[target_feature(enable = "avx2")]
    pub(crate) fn transpose8x8(r: [__m256; 8]) -> [__m256; 8] {
        let t0 = _mm256_unpacklo_ps(r[0], r[1]);
        let t1 = _mm256_unpackhi_ps(r[0], r[1]);
        let t2 = _mm256_unpacklo_ps(r[2], r[3]);
        let t3 = _mm256_unpackhi_ps(r[2], r[3]);
        let t4 = _mm256_unpacklo_ps(r[4], r[5]);
        let t5 = _mm256_unpackhi_ps(r[4], r[5]);
        let t6 = _mm256_unpacklo_ps(r[6], r[7]);
        let t7 = _mm256_unpackhi_ps(r[6], r[7]);
        let s0 = _mm256_shuffle_ps::<0x44>(t0, t2);
        let s1 = _mm256_shuffle_ps::<0xEE>(t0, t2);
        let s2 = _mm256_shuffle_ps::<0x44>(t1, t3);
        let s3 = _mm256_shuffle_ps::<0xEE>(t1, t3);
        let s4 = _mm256_shuffle_ps::<0x44>(t4, t6);
        let s5 = _mm256_shuffle_ps::<0xEE>(t4, t6);
        let s6 = _mm256_shuffle_ps::<0x44>(t5, t7);
        let s7 = _mm256_shuffle_ps::<0xEE>(t5, t7);
        [
            _mm256_permute2f128_ps::<0x20>(s0, s4),
            _mm256_permute2f128_ps::<0x20>(s1, s5),
            _mm256_permute2f128_ps::<0x20>(s2, s6),
            _mm256_permute2f128_ps::<0x20>(s3, s7),
            _mm256_permute2f128_ps::<0x31>(s0, s4),
            _mm256_permute2f128_ps::<0x31>(s1, s5),
            _mm256_permute2f128_ps::<0x31>(s2, s6),
            _mm256_permute2f128_ps::<0x31>(s3, s7),
        ]
    }

    /// Transposes the 8×8 block of rows `t0..t0+8`, columns `d0..d0+8` of `keys` (row stride
    /// `hd`, widened to f32) into rows `d0..d0+8`, columns `c0..c0+8` of `kt` (row stride 16).
    ///
    /// # Safety
    /// AVX2+F16C present; both blocks lie inside their slices.
    #[target_feature(enable = "avx2,f16c")]
    pub(super) unsafe fn transpose8<E: TileElem>(
        keys: &[E],
        hd: usize,
        t0: usize,
        d0: usize,
        kt: &mut [f32],
        c0: usize,
    ) {
        let kp = keys.as_ptr();
        // SAFETY: rows `t0 + i` of `keys`, columns `d0..d0 + 8` (caller's contract).
        let r: [__m256; 8] =
            std::array::from_fn(|i| unsafe { E::load8(kp.add((t0 + i) * hd + d0)) });
        let out = transpose8x8(r);
        let dp = kt.as_mut_ptr();
        for (j, o) in out.iter().enumerate() {
            // SAFETY: row `d0 + j` of `kt`, columns `t0..t0 + 8` (caller's contract).
            unsafe { _mm256_storeu_ps(dp.add((d0 + j) * TILE_POSITIONS + c0), *o) };
        }
    }

    /// `flash_tile`'s exponential on 16 lanes (the same operations as its 8-lane form, lane by
    /// lane; arguments ≤ 0 or −∞).
    #[target_feature(enable = "avx512f,avx2,fma,f16c")]
    #[inline]
    pub(crate) fn exp16(x: __m512) -> __m512 {
        let below = _mm512_cmp_ps_mask::<_CMP_LT_OQ>(x, _mm512_set1_ps(EXP_MIN));
        let x = _mm512_min_ps(
            _mm512_max_ps(x, _mm512_set1_ps(EXP_MIN)),
            _mm512_setzero_ps(),
        );
        let n = _mm512_roundscale_ps::<{ _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC }>(
            _mm512_mul_ps(x, _mm512_set1_ps(LOG2E)),
        );
        let r = _mm512_fmadd_ps(n, _mm512_set1_ps(-LN2_HI), x);
        let r = _mm512_fmadd_ps(n, _mm512_set1_ps(-LN2_LO), r);
        let z = _mm512_mul_ps(r, r);
        let mut y = _mm512_fmadd_ps(_mm512_set1_ps(P0), r, _mm512_set1_ps(P1));
        y = _mm512_fmadd_ps(y, r, _mm512_set1_ps(P2));
        y = _mm512_fmadd_ps(y, r, _mm512_set1_ps(P3));
        y = _mm512_fmadd_ps(y, r, _mm512_set1_ps(P4));
        y = _mm512_fmadd_ps(y, r, _mm512_set1_ps(P5));
        y = _mm512_fmadd_ps(y, z, r);
        y = _mm512_add_ps(y, _mm512_set1_ps(1.0));
        let bits = _mm512_slli_epi32::<23>(_mm512_add_epi32(
            _mm512_cvtps_epi32(n),
            _mm512_set1_epi32(127),
        ));
        let res = _mm512_mul_ps(y, _mm512_castsi512_ps(bits));
        _mm512_maskz_mov_ps(!below, res)
    }

    /// Step 2 of the tiled softmax for one row: when `tile_max` exceeds the running maximum,
    /// the accumulator (a multiple of 16 floats) and the sum are scaled by
    /// `exp(max − tile_max)` and the maximum moves up; otherwise nothing changes.
    #[target_feature(enable = "avx512f,avx2,fma,f16c")]
    #[inline]
    pub(crate) fn raise_max16(st: &mut TileSoftmax, acc: &mut [f32], tile_max: f32) {
        if tile_max > st.max {
            let f = exp_poly(st.max - tile_max);
            let vf = _mm512_set1_ps(f);
            for chunk in acc.chunks_exact_mut(16) {
                // SAFETY: `chunk` holds 16 floats.
                unsafe {
                    let v = _mm512_loadu_ps(chunk.as_ptr());
                    _mm512_storeu_ps(chunk.as_mut_ptr(), _mm512_mul_ps(v, vf));
                }
            }
            st.sum *= f;
            st.max = tile_max;
        }
    }

    /// `hsum8(x[0..8]) + hsum8(x[8..16])` of a 16-lane vector, in registers: lane pairs,
    /// then pairs of pairs, then halves of each group of eight are added (IEEE addition
    /// commutes, so every lane holding a partial sum holds exactly `hsum8`'s partial sum), and
    /// lanes 0 and 8 end up holding the two groups' sums — no store-to-load round trip.
    #[target_feature(enable = "avx512f,avx2,fma,f16c")]
    #[inline]
    pub(crate) fn group_sums(x: __m512) -> f32 {
        let a = _mm512_add_ps(x, _mm512_permute_ps::<0xB1>(x));
        let b = _mm512_add_ps(a, _mm512_permute_ps::<0x4E>(a));
        let c = _mm512_add_ps(b, _mm512_shuffle_f32x4::<0xB1>(b, b));
        let g0 = _mm512_cvtss_f32(c);
        let g1 = _mm_cvtss_f32(_mm512_extractf32x4_ps::<2>(c));
        g0 + g1
    }

    /// `R` rows sharing `valid` against one transposed tile (module doc).
    ///
    /// # Safety
    /// AVX-512 F, AVX2, FMA, F16C present; every `qs[r]`, `accs[r]` holds `hd` (a multiple of
    /// 16) floats, `kt` `hd · 16`, `vals` `valid · hd`; `1 <= valid <= 16`.
    #[allow(clippy::needless_range_loop)]
    #[target_feature(enable = "avx512f,avx2,fma,f16c")]
    pub(crate) unsafe fn rows<const R: usize>(
        sts: &mut [TileSoftmax; R],
        accs: &mut [&mut [f32]; R],
        qs: &[&[f32]; R],
        valid: usize,
        kt: &[f32],
        vals: &[f32],
        scale: f32,
    ) {
        // SAFETY: forwarded caller's contract.
        let s = unsafe { scores16::<R>(qs, kt, scale) };
        // SAFETY: forwarded caller's contract.
        unsafe { finish::<R>(sts, accs, s, valid, vals) };
    }

    /// [`rows`] for each row on its own (`valids[r]` positions for row `r`).
    ///
    /// # Safety
    /// As [`rows`], for every row.
    #[target_feature(enable = "avx512f,avx2,fma,f16c")]
    pub(crate) unsafe fn alone(
        sts: &mut [TileSoftmax],
        accs: &mut [&mut [f32]],
        qs: &[&[f32]],
        valids: &[usize],
        kt: &[f32],
        vals: &[f32],
        scale: f32,
    ) {
        for r in 0..qs.len() {
            let (s1, _) = sts[r..].split_first_chunk_mut::<1>().expect("1 row");
            let (a1, _) = accs[r..].split_first_chunk_mut::<1>().expect("1 row");
            let q1: &[&[f32]; 1] = qs[r..r + 1].try_into().expect("1 row");
            // SAFETY: forwarded caller's contract.
            unsafe { rows::<1>(s1, a1, q1, valids[r], kt, vals, scale) };
        }
    }

    /// [`rows`] for consecutive triples of rows (`sts.len()` a multiple of three, every row
    /// seeing `valid` positions), software-pipelined: the scores of the next triple are
    /// computed between the softmax of the current one and its `p·V`, so the softmax's serial
    /// chain (maximum, exponential, sums) overlaps independent multiply-adds instead of
    /// stalling the core once per triple. Each row's operations are those of [`rows`], in the
    /// same order: same bits.
    ///
    /// # Safety
    /// As [`rows`], for every row.
    #[target_feature(enable = "avx512f,avx2,fma,f16c")]
    pub(crate) unsafe fn triples(
        sts: &mut [TileSoftmax],
        accs: &mut [&mut [f32]],
        qs: &[&[f32]],
        valid: usize,
        kt: &[f32],
        vals: &[f32],
        scale: f32,
    ) {
        const R: usize = TRIPLE_ROWS;
        let n = sts.len() / R;
        debug_assert!(sts.len() == n * R && accs.len() == n * R && qs.len() == n * R);
        let q3 = |b: usize| -> &[&[f32]; R] { qs[b * R..b * R + R].try_into().expect("3 rows") };
        // SAFETY: forwarded caller's contract.
        let mut s = unsafe { scores16::<R>(q3(0), kt, scale) };
        for b in 0..n {
            let (s3, _) = sts[b * R..].split_first_chunk_mut::<R>().expect("3 rows");
            let (a3, _) = accs[b * R..].split_first_chunk_mut::<R>().expect("3 rows");
            // SAFETY: forwarded caller's contract.
            let p = unsafe { softmax16::<R>(s3, a3, s, valid) };
            if b + 1 < n {
                // SAFETY: forwarded caller's contract.
                s = unsafe { scores16::<R>(q3(b + 1), kt, scale) };
            }
            // SAFETY: forwarded caller's contract.
            unsafe { values16::<f32, R>(a3, &p, valid, vals) };
        }
    }

    /// Step 1 of [`rows`]: the scaled score vectors (16 positions) of `R` rows.
    ///
    /// # Safety
    /// AVX-512 F, AVX2, FMA, F16C present; every `qs[r]` holds `hd` (a multiple of 16)
    /// floats, `kt` `hd · 16`.
    #[allow(clippy::needless_range_loop)]
    #[target_feature(enable = "avx512f,avx2,fma,f16c")]
    #[inline]
    pub(crate) unsafe fn scores16<const R: usize>(
        qs: &[&[f32]; R],
        kt: &[f32],
        scale: f32,
    ) -> [__m512; R] {
        let hd = qs[0].len();
        let ktp = kt.as_ptr();
        let qps: [*const f32; R] = std::array::from_fn(|r| qs[r].as_ptr());
        // Step 1: lane chain `l` of every position is accumulator `l` (columns `d ≡ l mod 8`).
        // Chunk 0 starts every chain from +0 (`fma(q, k, 0)`, as the definition does), written
        // as one expression so the accumulators start in registers (no zeroed stack array).
        let k0: [__m512; 8] = std::array::from_fn(|l| {
            // SAFETY: `l < 8 <= hd`: row `l` of `kt` holds 16 floats.
            unsafe { _mm512_loadu_ps(ktp.add(l * TILE_POSITIONS)) }
        });
        let mut a: [[__m512; 8]; R] = std::array::from_fn(|r| {
            std::array::from_fn(|l| {
                // SAFETY: `l < 8 <= hd`: element `l` of the query.
                let q = _mm512_set1_ps(unsafe { *qps[r].add(l) });
                _mm512_fmadd_ps(q, k0[l], _mm512_setzero_ps())
            })
        });
        for c in 1..hd / 8 {
            for l in 0..8 {
                let d = 8 * c + l;
                // SAFETY: `d < hd`: row `d` of `kt` holds 16 floats.
                let k = unsafe { _mm512_loadu_ps(ktp.add(d * TILE_POSITIONS)) };
                for r in 0..R {
                    // SAFETY: `d < hd`: element `d` of the query.
                    let q = _mm512_set1_ps(unsafe { *qps[r].add(d) });
                    a[r][l] = _mm512_fmadd_ps(q, k, a[r][l]);
                }
            }
        }
        let vscale = _mm512_set1_ps(scale);
        std::array::from_fn(|r| {
            let x = a[r];
            let s = _mm512_add_ps(
                _mm512_add_ps(_mm512_add_ps(x[0], x[1]), _mm512_add_ps(x[2], x[3])),
                _mm512_add_ps(_mm512_add_ps(x[4], x[5]), _mm512_add_ps(x[6], x[7])),
            );
            _mm512_mul_ps(s, vscale)
        })
    }

    /// Steps 2–4 (softmax update, `p·V` in position order) for `R` rows sharing `valid`, whose
    /// scaled score vectors (16 positions each) are `s`: the tail of [`rows`], also used for
    /// scores computed from integer K codes (`flash_tile_codes`).
    ///
    /// # Safety
    /// AVX-512 F, AVX2, FMA, F16C present; every `accs[r]` holds `hd` (a multiple of 16)
    /// floats, `vals` `valid · hd`; `1 <= valid <= 16`.
    #[allow(clippy::needless_range_loop)]
    #[target_feature(enable = "avx512f,avx2,fma,f16c")]
    #[inline]
    pub(crate) unsafe fn finish<const R: usize>(
        sts: &mut [TileSoftmax; R],
        accs: &mut [&mut [f32]; R],
        s: [__m512; R],
        valid: usize,
        vals: &[f32],
    ) {
        // SAFETY: forwarded caller's contract.
        let p = unsafe { softmax16::<R>(sts, accs, s, valid) };
        // SAFETY: forwarded caller's contract.
        unsafe { values16::<f32, R>(accs, &p, valid, vals) };
    }

    /// Steps 2–3 for `R` rows (masking positions past `valid`, rescaling `accs` and the
    /// states): returns the weights `p` of step 4.
    ///
    /// # Safety
    /// AVX-512 F, AVX2, FMA, F16C present; every `accs[r]` holds a multiple of 16 floats;
    /// `1 <= valid <= 16`.
    #[allow(clippy::needless_range_loop)]
    #[target_feature(enable = "avx512f,avx2,fma,f16c")]
    #[inline]
    pub(crate) unsafe fn softmax16<const R: usize>(
        sts: &mut [TileSoftmax; R],
        accs: &mut [&mut [f32]; R],
        s: [__m512; R],
        valid: usize,
    ) -> [[f32; TILE_POSITIONS]; R] {
        let live: __mmask16 = if valid >= TILE_POSITIONS {
            0xFFFF
        } else {
            (1u16 << valid) - 1
        };
        let mut p = [[0f32; TILE_POSITIONS]; R];
        for r in 0..R {
            let s = s[r];
            // Lanes at or past `valid` become −∞ (weight exactly 0, never the maximum).
            let s = _mm512_mask_blend_ps(live, _mm512_set1_ps(f32::NEG_INFINITY), s);
            // Step 2.
            let st = &mut sts[r];
            let tile_max = _mm512_reduce_max_ps(s);
            raise_max16(st, accs[r], tile_max);
            // Step 3: the two groups of eight summed in order (the second is all zeros when
            // `valid <= 8`, which adds exactly nothing).
            let e = exp16(_mm512_sub_ps(s, _mm512_set1_ps(st.max)));
            // SAFETY: `p[r]` holds 16 floats.
            unsafe { _mm512_storeu_ps(p[r].as_mut_ptr(), e) };
            st.sum += group_sums(e);
        }
        p
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use half::f16;
    use rand::{Rng, SeedableRng};

    #[test]
    fn transpose_matches_the_definition() {
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(3);
        for (n, at, hd) in [
            (16usize, 0usize, 64usize),
            (9, 0, 64),
            (8, 8, 16),
            (3, 5, 8),
            (16, 0, 72),
            (1, 15, 128),
            (11, 3, 64),
        ] {
            let keys: Vec<f32> = (0..n * hd)
                .map(|_| f16::from_f32(rng.gen_range(-1.0f32..1.0)).to_f32())
                .collect();
            let keys16: Vec<f16> = keys.iter().map(|&x| f16::from_f32(x)).collect();
            for from_f16 in [false, true] {
                let mut kt = vec![f32::NAN; hd * TILE_POSITIONS];
                if from_f16 {
                    transpose_keys(&keys16, n, hd, &mut kt, at);
                } else {
                    transpose_keys(&keys, n, hd, &mut kt, at);
                }
                for c in 0..TILE_POSITIONS {
                    for d in 0..hd {
                        let got = kt[d * TILE_POSITIONS + c];
                        if (at..at + n).contains(&c) {
                            let want = keys[(c - at) * hd + d];
                            assert_eq!(got.to_bits(), want.to_bits(), "n={n} at={at} c={c} d={d}");
                        } else {
                            assert!(got.is_nan(), "n={n} at={at}: position {c} was written");
                        }
                    }
                }
            }
        }
    }
}

/// The shared check of the transposed tile steps (`flash_tile_wide`, `flash_tile_narrow`).
#[cfg(test)]
pub(crate) mod check {
    use super::super::flash_tile::{tile_update_with, TileSoftmax, TILE_POSITIONS};
    use super::super::CpuFeatures;
    use super::transpose_keys;
    use half::f16;
    use rand::{Rng, SeedableRng};

    /// Runs `step` (scale 0.125, K transposed by [`transpose_keys`]) over `tiles` — per tile,
    /// each row's `valid` — for every head size of `hds`, and asserts every row's state and
    /// accumulator equal the portable row-major definition's, bit for bit, after each tile.
    /// K/V are f16-exact with a larger K spread in later tiles (so the running maximum grows and
    /// accumulators are rescaled); positions past the longest `valid` hold 1e30 (stale keys must
    /// not leak).
    #[allow(clippy::needless_range_loop, clippy::type_complexity)]
    pub(crate) fn check_transposed_step<const ROWS: usize>(
        seed: u64,
        hds: &[usize],
        tiles: &[[usize; ROWS]],
        mut step: impl FnMut(&mut [TileSoftmax], &mut [&mut [f32]], &[&[f32]], &[usize], &[f32], &[f32]),
    ) {
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(seed);
        for &hd in hds {
            let qs: Vec<Vec<f32>> = (0..ROWS)
                .map(|_| (0..hd).map(|_| rng.gen_range(-2.0f32..2.0)).collect())
                .collect();
            let mut want_st = vec![TileSoftmax::default(); ROWS];
            let mut want_acc = vec![vec![0f32; hd]; ROWS];
            let mut sts = vec![TileSoftmax::default(); ROWS];
            let mut accs = vec![vec![0f32; hd]; ROWS];
            let mut kt = vec![0f32; hd * TILE_POSITIONS];
            for (i, valids) in tiles.iter().enumerate() {
                let s = 1.0 + 2.0 * i as f32;
                let mut gen = |s: f32| -> Vec<f32> {
                    (0..TILE_POSITIONS * hd)
                        .map(|_| f16::from_f32(rng.gen_range(-s..s)).to_f32())
                        .collect()
                };
                let (keys, vals) = (gen(s), gen(2.0));
                for r in 0..ROWS {
                    tile_update_with(
                        CpuFeatures::PORTABLE,
                        &mut want_st[r],
                        &mut want_acc[r],
                        &qs[r],
                        &keys,
                        &vals,
                        valids[r],
                        0.125,
                    );
                }
                kt.iter_mut().for_each(|x| *x = 1e30);
                let max_valid = *valids.iter().max().expect("rows");
                transpose_keys(&keys, max_valid, hd, &mut kt, 0);
                let mut acc_refs: Vec<&mut [f32]> = accs.iter_mut().map(|a| &mut a[..]).collect();
                let q_refs: Vec<&[f32]> = qs.iter().map(|q| &q[..]).collect();
                step(&mut sts, &mut acc_refs, &q_refs, valids, &kt, &vals);
                for r in 0..ROWS {
                    assert_eq!(sts[r], want_st[r], "hd={hd} tile {i} row {r}");
                    let bits = |x: &[f32]| x.iter().map(|v| v.to_bits()).collect::<Vec<_>>();
                    assert_eq!(
                        bits(&accs[r]),
                        bits(&want_acc[r]),
                        "hd={hd} tile {i} row {r}"
                    );
                }
            }
        }
    }
}
