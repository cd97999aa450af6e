//! The tile step of `flash_tile` for many query rows against a K tile stored transposed
//! (`[head_dim][TILE_POSITIONS]` f32, as `flash_tile_wide::transpose_keys` writes it), in AVX2
//! (256-bit) registers: the AVX2 counterpart of `flash_tile_wide` for CPUs without AVX-512.
//!
//! One score vector holds eight positions, so a row's 16 scores are two vectors. The eight lane
//! chains of a dot product (`flash_tile`'s module doc, step 1) are vector accumulators fed by
//! broadcast-FMA chains over the transposed K rows, and the reduction tree
//! `((x0+x1)+(x2+x3)) + ((x4+x5)+(x6+x7))` is vertical adds — no horizontal sums per position.
//! With 16 vector registers, three rows sharing `valid` (a GQA group) run the chains as four
//! pairs (`0–1`, `2–3`, `4–5`, `6–7`, each over both halves of the tile), so every K load feeds
//! six multiply-adds, and their `p·V` shares every V load; a row alone runs two passes of four
//! chains. The softmax runs on the two score vectors per row, and `p·V` broadcasts each `p[t]`
//! over V rows into register accumulators.
//!
//! Every IEEE operation is the one `flash_tile::tile_update` performs (same chains, same tree,
//! same exponential lanes, same accumulation order; a rescale by exactly 1 where the maximum did
//! not grow, which changes no bit), so the results are bit-identical to the row-major kernels
//! and the portable definition (tests pin this).
//!
//! Owns the 256-bit transposed tile step; it never reads a KV store, never allocates, never
//! transposes (`flash_tile_wide::transpose_keys` does) and never decides which rows share a tile
//! (`attention_tiled` does).

use super::cpu::{cpu_features, CpuFeatures};
#[cfg(target_arch = "x86_64")]
use super::flash_tile::TRIPLE_ROWS;
#[cfg(target_arch = "x86_64")]
use super::flash_tile::{TileSoftmax, TILE_POSITIONS};

/// Proof that the 256-bit transposed tile step may run here (AVX2, FMA and F16C detected and not
/// overridden): obtained once per task, so the kernel checks no feature per call.
#[derive(Debug, Clone, Copy)]
pub struct NarrowTiles(());

impl NarrowTiles {
    /// The token when `features` (clamped to what the CPU has) allow the AVX2 kernel.
    pub fn with(features: CpuFeatures) -> Option<NarrowTiles> {
        features.clamp_to_detected().avx2.then_some(NarrowTiles(()))
    }

    /// [`NarrowTiles::with`] the process's features.
    pub fn here() -> Option<NarrowTiles> {
        NarrowTiles::with(cpu_features())
    }
}

#[cfg(target_arch = "x86_64")]
pub(crate) mod x86 {
    //! The AVX2 bodies; callers hold a `NarrowTiles` token.
    use super::super::flash_tile::avx2::{exp1, exp8, hsum};
    use super::*;
    use std::arch::x86_64::*;

    /// Every row in turn, software-pipelined: the scores of row `r + 1` are computed between the
    /// softmax of row `r` and its `p·V`, so the softmax's serial chain (maximum, exponentials,
    /// sums) overlaps independent multiply-adds. Each row's operations are those of the
    /// definition, in its order.
    ///
    /// # Safety
    /// AVX2, FMA, F16C present; `qs[r]`, `accs[r]` hold `hd` (a multiple of 8) floats, `kt`
    /// `hd · 16`, `vals` `valids[r] · hd`; `1 <= valids[r] <= 16`; equal lengths.
    #[target_feature(enable = "avx2,fma,f16c")]
    pub(crate) unsafe fn rows(
        sts: &mut [TileSoftmax],
        accs: &mut [&mut [f32]],
        qs: &[&[f32]],
        valids: &[usize],
        kt: &[f32],
        vals: &[f32],
        scale: f32,
    ) {
        let n = qs.len();
        let hd = qs[0].len();
        let ktp = kt.as_ptr();
        // SAFETY: forwarded caller's contract.
        let mut s = unsafe { scores(qs[0].as_ptr(), hd, ktp, scale) };
        for r in 0..n {
            let mut p = [0f32; TILE_POSITIONS];
            let f = softmax(&mut sts[r], s, valids[r], &mut p);
            if r + 1 < n {
                // SAFETY: forwarded caller's contract.
                s = unsafe { scores(qs[r + 1].as_ptr(), hd, ktp, scale) };
            }
            // SAFETY: forwarded caller's contract.
            unsafe { values(accs[r], f, &p, valids[r], vals.as_ptr()) };
        }
    }

    /// Consecutive triples of rows that all see `valid` positions (`sts.len()` a multiple of
    /// three), each triple sharing every K and V load, software-pipelined like [`rows`]: the
    /// scores of the next triple are computed between the softmax of the current one and its
    /// `p·V`. Each row's operations are those of [`rows`], in the same order: same bits.
    ///
    /// # Safety
    /// As [`rows`], every row seeing `valid` positions.
    #[target_feature(enable = "avx2,fma,f16c")]
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
        let hd = qs[0].len();
        let ktp = kt.as_ptr();
        let q3 = |b: usize| -> [*const f32; R] { std::array::from_fn(|r| qs[b * R + r].as_ptr()) };
        // SAFETY: forwarded caller's contract.
        let mut s = unsafe { scores3(q3(0), hd, ktp, scale) };
        for b in 0..n {
            let mut p = [[0f32; TILE_POSITIONS]; R];
            let f: [f32; R] =
                std::array::from_fn(|r| softmax(&mut sts[b * R + r], s[r], valid, &mut p[r]));
            if b + 1 < n {
                // SAFETY: forwarded caller's contract.
                s = unsafe { scores3(q3(b + 1), hd, ktp, scale) };
            }
            let (a3, _) = accs[b * R..].split_first_chunk_mut::<R>().expect("3 rows");
            // SAFETY: forwarded caller's contract.
            unsafe { values3(a3, f, &p, valid, vals.as_ptr()) };
        }
    }

    /// Lane chains `L0` and `L0 + 1` of three rows over both halves of the tile (each K load
    /// shared by the rows), summed per row and half: `xL0 + xL0+1`, a pair of the definition's
    /// tree.
    ///
    /// # Safety
    /// AVX2, FMA present; every `qs[r]` holds `hd` (a multiple of 8) floats, `kt` `hd · 16`.
    #[allow(clippy::needless_range_loop)]
    #[target_feature(enable = "avx2,fma")]
    #[inline]
    unsafe fn pair3<const L0: usize>(
        qs: [*const f32; TRIPLE_ROWS],
        hd: usize,
        kt: *const f32,
    ) -> [[__m256; 2]; TRIPLE_ROWS] {
        // `a[r][j][h]`: row `r`, chain `L0 + j`, half `h`. Chunk 0 starts every chain from +0.
        let mut a = [[[_mm256_setzero_ps(); 2]; 2]; TRIPLE_ROWS];
        for c in 0..hd / 8 {
            for j in 0..2 {
                let d = 8 * c + L0 + j;
                // SAFETY: `d < hd`: row `d` of `kt` (16 floats), element `d` of every query.
                unsafe {
                    let k0 = _mm256_loadu_ps(kt.add(d * TILE_POSITIONS));
                    let k1 = _mm256_loadu_ps(kt.add(d * TILE_POSITIONS + 8));
                    for r in 0..TRIPLE_ROWS {
                        let qb = _mm256_broadcast_ss(&*qs[r].add(d));
                        a[r][j][0] = _mm256_fmadd_ps(qb, k0, a[r][j][0]);
                        a[r][j][1] = _mm256_fmadd_ps(qb, k1, a[r][j][1]);
                    }
                }
            }
        }
        a.map(|x| [0, 1].map(|h| _mm256_add_ps(x[0][h], x[1][h])))
    }

    /// Step 1 for three rows sharing every K load: `((x0+x1)+(x2+x3)) + ((x4+x5)+(x6+x7))`,
    /// scaled, per row and half.
    ///
    /// # Safety
    /// As [`pair3`].
    #[allow(clippy::needless_range_loop)]
    #[target_feature(enable = "avx2,fma")]
    #[inline]
    unsafe fn scores3(
        qs: [*const f32; TRIPLE_ROWS],
        hd: usize,
        kt: *const f32,
        scale: f32,
    ) -> [[__m256; 2]; TRIPLE_ROWS] {
        // SAFETY: forwarded caller's contract.
        let (x01, x23) = unsafe { (pair3::<0>(qs, hd, kt), pair3::<2>(qs, hd, kt)) };
        let left: [[__m256; 2]; TRIPLE_ROWS] =
            std::array::from_fn(|r| [0, 1].map(|h| _mm256_add_ps(x01[r][h], x23[r][h])));
        // SAFETY: forwarded caller's contract.
        let (x45, x67) = unsafe { (pair3::<4>(qs, hd, kt), pair3::<6>(qs, hd, kt)) };
        let vscale = _mm256_set1_ps(scale);
        std::array::from_fn(|r| {
            [0, 1].map(|h| {
                let right = _mm256_add_ps(x45[r][h], x67[r][h]);
                _mm256_mul_ps(_mm256_add_ps(left[r][h], right), vscale)
            })
        })
    }

    /// Step 4 for three rows sharing `valid` and every V load: [`values`] for each row, four
    /// vectors (32 floats) of each row held in registers at a time.
    ///
    /// # Safety
    /// AVX2, FMA present; every `accs[r]` holds `hd` (a multiple of 8) floats, `vp` `valid`
    /// rows of `hd`.
    #[target_feature(enable = "avx2,fma")]
    #[inline]
    unsafe fn values3(
        accs: &mut [&mut [f32]; TRIPLE_ROWS],
        f: [f32; TRIPLE_ROWS],
        p: &[[f32; TILE_POSITIONS]; TRIPLE_ROWS],
        valid: usize,
        vp: *const f32,
    ) {
        let hd = accs[0].len();
        let aps: [*mut f32; TRIPLE_ROWS] = std::array::from_fn(|r| accs[r].as_mut_ptr());
        let vf = f.map(|x| _mm256_set1_ps(x));
        let mut e0 = 0;
        while e0 + 32 <= hd {
            // SAFETY: elements `e0..e0 + 32 <= hd` of every accumulator and `vals` row.
            unsafe { block3::<4>(&aps, e0, vf, p, valid, vp, hd) };
            e0 += 32;
        }
        while e0 < hd {
            // SAFETY: elements `e0..e0 + 8 <= hd` (`hd` is a multiple of 8).
            unsafe { block3::<1>(&aps, e0, vf, p, valid, vp, hd) };
            e0 += 8;
        }
    }

    /// [`values3`] for elements `e0..e0 + 8W`.
    ///
    /// # Safety
    /// `aps[r] + e0` holds `8W` floats; `vp + t·stride + e0` holds `8W` floats for every
    /// `t < valid <= 16`.
    #[allow(clippy::needless_range_loop)]
    #[target_feature(enable = "avx2,fma")]
    #[inline]
    unsafe fn block3<const W: usize>(
        aps: &[*mut f32; TRIPLE_ROWS],
        e0: usize,
        vf: [__m256; TRIPLE_ROWS],
        p: &[[f32; TILE_POSITIONS]; TRIPLE_ROWS],
        valid: usize,
        vp: *const f32,
        stride: usize,
    ) {
        let mut a = [[_mm256_setzero_ps(); W]; TRIPLE_ROWS];
        for r in 0..TRIPLE_ROWS {
            for i in 0..W {
                // SAFETY: caller's contract.
                a[r][i] = _mm256_mul_ps(unsafe { _mm256_loadu_ps(aps[r].add(e0 + 8 * i)) }, vf[r]);
            }
        }
        for t in 0..valid {
            let pb: [__m256; TRIPLE_ROWS] = std::array::from_fn(|r| _mm256_set1_ps(p[r][t]));
            for i in 0..W {
                // SAFETY: caller's contract (row `t < valid`).
                let v = unsafe { _mm256_loadu_ps(vp.add(t * stride + e0 + 8 * i)) };
                for r in 0..TRIPLE_ROWS {
                    a[r][i] = _mm256_fmadd_ps(pb[r], v, a[r][i]);
                }
            }
        }
        for r in 0..TRIPLE_ROWS {
            for i in 0..W {
                // SAFETY: caller's contract.
                unsafe { _mm256_storeu_ps(aps[r].add(e0 + 8 * i), a[r][i]) };
            }
        }
    }

    /// Four lane chains `L0..L0 + 4` of one row over both halves of the tile, reduced to
    /// `(xL0 + xL0+1) + (xL0+2 + xL0+3)` per half (one subtree of the definition's tree).
    ///
    /// # Safety
    /// AVX2, FMA present; `q` holds `hd` (a multiple of 8) floats, `kt` `hd · 16`.
    #[allow(clippy::needless_range_loop)]
    #[target_feature(enable = "avx2,fma")]
    #[inline]
    unsafe fn subtree<const L0: usize>(q: *const f32, hd: usize, kt: *const f32) -> [__m256; 2] {
        // Chunk 0 starts every chain from +0 (`fma(q, k, 0)`, as the definition does).
        let mut a: [[__m256; 4]; 2] = [[_mm256_setzero_ps(); 4]; 2];
        for j in 0..4 {
            let d = L0 + j;
            // SAFETY: `d < 8 <= hd`: element `d` of `q`, row `d` of `kt` (16 floats).
            unsafe {
                let qb = _mm256_broadcast_ss(&*q.add(d));
                for h in 0..2 {
                    let k = _mm256_loadu_ps(kt.add(d * TILE_POSITIONS + 8 * h));
                    a[h][j] = _mm256_fmadd_ps(qb, k, _mm256_setzero_ps());
                }
            }
        }
        for c in 1..hd / 8 {
            for j in 0..4 {
                let d = 8 * c + L0 + j;
                // SAFETY: `d < hd`: element `d` of `q`, row `d` of `kt`.
                unsafe {
                    let qb = _mm256_broadcast_ss(&*q.add(d));
                    for h in 0..2 {
                        let k = _mm256_loadu_ps(kt.add(d * TILE_POSITIONS + 8 * h));
                        a[h][j] = _mm256_fmadd_ps(qb, k, a[h][j]);
                    }
                }
            }
        }
        [0, 1].map(|h| {
            _mm256_add_ps(
                _mm256_add_ps(a[h][0], a[h][1]),
                _mm256_add_ps(a[h][2], a[h][3]),
            )
        })
    }

    /// Step 1: the scaled scores of one row, positions `0..8` and `8..16`.
    ///
    /// # Safety
    /// As [`subtree`].
    #[target_feature(enable = "avx2,fma")]
    #[inline]
    unsafe fn scores(q: *const f32, hd: usize, kt: *const f32, scale: f32) -> [__m256; 2] {
        // SAFETY: forwarded caller's contract.
        let (lo, hi) = unsafe { (subtree::<0>(q, hd, kt), subtree::<4>(q, hd, kt)) };
        let vscale = _mm256_set1_ps(scale);
        [0, 1].map(|h| _mm256_mul_ps(_mm256_add_ps(lo[h], hi[h]), vscale))
    }

    /// Steps 2–3 for one row with scores `s` (positions at or past `valid` masked to −∞): updates
    /// the state, writes the weights `p` and returns the factor the accumulator is rescaled by
    /// (exactly 1 when the maximum did not grow).
    #[target_feature(enable = "avx2,fma")]
    #[inline]
    fn softmax(
        st: &mut TileSoftmax,
        s: [__m256; 2],
        valid: usize,
        p: &mut [f32; TILE_POSITIONS],
    ) -> f32 {
        let lane_ids = _mm256_setr_ps(0.0, 1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0);
        let limit = _mm256_set1_ps(valid as f32);
        let s = [0usize, 1].map(|h| {
            let ids = _mm256_add_ps(lane_ids, _mm256_set1_ps((8 * h) as f32));
            let live = _mm256_cmp_ps::<_CMP_LT_OQ>(ids, limit);
            _mm256_blendv_ps(_mm256_set1_ps(f32::NEG_INFINITY), s[h], live)
        });
        let m = _mm256_max_ps(s[0], s[1]);
        let m = _mm256_max_ps(m, _mm256_permute2f128_ps::<0x01>(m, m));
        let m = _mm256_max_ps(m, _mm256_permute_ps::<0x4E>(m));
        let m = _mm256_max_ps(m, _mm256_permute_ps::<0xB1>(m));
        let tile_max = _mm256_cvtss_f32(m);
        let mut f = 1.0;
        if tile_max > st.max {
            f = exp1(st.max - tile_max);
            st.sum *= f;
            st.max = tile_max;
        }
        let vm = _mm256_set1_ps(st.max);
        let e = [0usize, 1].map(|h| exp8(_mm256_sub_ps(s[h], vm)));
        // SAFETY: `p` holds 16 floats.
        unsafe {
            _mm256_storeu_ps(p.as_mut_ptr(), e[0]);
            _mm256_storeu_ps(p.as_mut_ptr().add(8), e[1]);
        }
        // The definition adds the groups' sums to +0 in order; a second group of masked lanes
        // sums to +0, which adds exactly nothing.
        st.sum += hsum(e[0]) + hsum(e[1]);
        f
    }

    /// Step 4 for one row: `acc = acc · f`, then `acc = fma(p[t], v[t], acc)` for `t < valid`
    /// in order, eight vectors (64 floats) held in registers at a time.
    ///
    /// # Safety
    /// AVX2, FMA present; `acc` holds `hd` (a multiple of 8) floats, `vp` `valid` rows of `hd`.
    #[target_feature(enable = "avx2,fma")]
    #[inline]
    unsafe fn values(
        acc: &mut [f32],
        f: f32,
        p: &[f32; TILE_POSITIONS],
        valid: usize,
        vp: *const f32,
    ) {
        let hd = acc.len();
        let ap = acc.as_mut_ptr();
        let vf = _mm256_set1_ps(f);
        let mut e0 = 0;
        while e0 + 64 <= hd {
            // SAFETY: elements `e0..e0 + 64 <= hd` of `acc` and of every `vals` row.
            unsafe { block::<8>(ap.add(e0), vf, p, valid, vp.add(e0), hd) };
            e0 += 64;
        }
        while e0 < hd {
            // SAFETY: elements `e0..e0 + 8 <= hd` (`hd` is a multiple of 8).
            unsafe { block::<1>(ap.add(e0), vf, p, valid, vp.add(e0), hd) };
            e0 += 8;
        }
    }

    /// [`values`] for `8W` floats at `ap` (V rows `stride` apart from `vp`).
    ///
    /// # Safety
    /// `ap` holds `8W` floats; `vp + t·stride` holds `8W` floats for every `t < valid <= 16`.
    #[target_feature(enable = "avx2,fma")]
    #[inline]
    unsafe fn block<const W: usize>(
        ap: *mut f32,
        vf: __m256,
        p: &[f32; TILE_POSITIONS],
        valid: usize,
        vp: *const f32,
        stride: usize,
    ) {
        // SAFETY: caller's contract (`8W` floats at `ap`).
        let mut a: [__m256; W] =
            std::array::from_fn(|i| _mm256_mul_ps(unsafe { _mm256_loadu_ps(ap.add(8 * i)) }, vf));
        for (t, pt) in p.iter().enumerate().take(valid) {
            let pb = _mm256_set1_ps(*pt);
            for (i, ai) in a.iter_mut().enumerate() {
                // SAFETY: caller's contract (row `t < valid`).
                let v = unsafe { _mm256_loadu_ps(vp.add(t * stride + 8 * i)) };
                *ai = _mm256_fmadd_ps(pb, v, *ai);
            }
        }
        for (i, ai) in a.iter().enumerate() {
            // SAFETY: caller's contract.
            unsafe { _mm256_storeu_ps(ap.add(8 * i), *ai) };
        }
    }
}
