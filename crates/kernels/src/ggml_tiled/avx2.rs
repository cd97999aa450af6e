//! Explicit AVX2+FMA body of [`attend_rows`](super::attend_rows), register-blocked over query
//! rows and bit-identical to the portable body (`ggml_tiled::tests` pin it over many shapes).
//!
//! Every row keeps the operation order of the module doc of [`ggml_tiled`](super); only the
//! loops around it change:
//! - each K/V tile is widened once (K transposed by 8×8 register transposes; widening f16 is
//!   exact, so the layout changes no value);
//! - scores: [`ROWS`] rows at a time, lanes = positions, one accumulator register per row and
//!   8 positions, each K vector loaded once for the block; every lane is its own fused
//!   multiply-add chain over `dk` from 0, then `× scale`; lanes outside a row's range are set to
//!   `-inf` (what the portable body leaves there);
//! - maximum, `expf` rescaling and the weights per row as in the portable body: the maximum of
//!   the non-NaN scores (order-free), the same libm `expf`, [`expf8`] (ggml's `ggml_v_expf`
//!   lane for lane), the same 8-lane horizontal sum added in f64 in group order; a group of 8
//!   slots with no attended position is skipped when the maximum is finite (its weights are
//!   exactly 0 and adding `+0.0` to the non-negative f64 sum changes nothing);
//! - weighted values: [`ROWS`] rows at a time over the positions all of them attend, each V
//!   vector loaded once for the block, accumulators in registers, positions in order; a row's
//!   positions before (after) that common span run for the row alone before (after) it, so each
//!   accumulator element still sees its positions in increasing order.

use std::arch::x86_64::*;

use half::f16;

use super::{RowsScratch, KV_TILE};
use crate::flash_tile_wide::x86::transpose8x8;
use crate::swiglu::avx2::expf8;

/// Query rows per register block (2 rows × 4 vectors of accumulators, the K or V vectors and
/// the broadcasts fit the 16 `ymm` registers).
const ROWS: usize = 2;

/// [`super::attend_rows`] for `head_dim % 8 == 0` with AVX2+FMA+F16C; the shapes were checked
/// by the caller, which also sized `scratch.kt`, `vt`, `acc`, `m` and `sum`.
///
/// # Safety
/// The CPU must have AVX2, FMA and F16C.
#[allow(clippy::too_many_arguments)]
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn attend_rows(
    q: &[f32],
    k: &[f16],
    v: &[f16],
    base: usize,
    ranges: &[(usize, usize)],
    scale: f32,
    scratch: &mut RowsScratch,
    out: &mut [f32],
) {
    let rows = ranges.len();
    let hd = q.len() / rows;
    debug_assert!(hd.is_multiple_of(8));
    scratch.s.resize(rows * KV_TILE, 0.0);
    let RowsScratch {
        kt,
        vt,
        s,
        acc,
        m,
        sum,
    } = scratch;
    let (kt, vt, s) = (
        &mut kt[..hd * KV_TILE],
        &mut vt[..KV_TILE * hd],
        &mut s[..rows * KV_TILE],
    );
    let (acc, m, sum) = (&mut acc[..rows * hd], &mut m[..rows], &mut sum[..rows]);
    acc.fill(0.0);
    m.fill(f32::NEG_INFINITY);
    sum.fill(0.0);
    let lo_all = ranges.iter().map(|r| r.0).min().expect("rows");
    let hi_all = ranges.iter().map(|r| r.1).max().expect("rows");
    // Rows attending the current tile, with their tile-relative spans.
    let mut live: Vec<(usize, usize, usize)> = Vec::with_capacity(rows);
    let mut tile = lo_all / KV_TILE * KV_TILE;
    while tile < hi_all {
        let (tlo, thi) = (lo_all.max(tile), hi_all.min(tile + KV_TILE));
        // SAFETY: `tile <= tlo < thi <= tile + KV_TILE` and the caller checked that `k`, `v`
        // hold positions `base..hi_all` of `hd` values each; `kt`, `vt` hold one tile.
        unsafe { widen_tile(k, v, base, tile, tlo - tile, thi - tile, hd, kt, vt) };
        live.clear();
        live.extend(ranges.iter().enumerate().filter_map(|(r, &(first, end))| {
            let (lo, hi) = (first.max(tile), end.min(tile + KV_TILE));
            // `attend_row` never visits a tile without an attended position.
            (lo < hi).then(|| (r, lo - tile, hi - tile))
        }));
        // 1. Scores (`s[r]` row of each live row; `-inf` where the row does not attend).
        let (sp, qp) = (s.as_mut_ptr(), q.as_ptr());
        for block in live.chunks(ROWS) {
            // SAFETY (pointers): rows of `s` (`KV_TILE` slots) and `q` (`hd` values).
            let srow = |i: usize| sp.wrapping_add(block[i].0 * KV_TILE);
            let qrow = |i: usize| qp.wrapping_add(block[i].0 * hd);
            if let [a, b] = *block {
                let spans = [(a.1, a.2), (b.1, b.2)];
                // SAFETY: rows `a.0 != b.0` of `q` and `s`; spans lie in the tile.
                unsafe {
                    scores_rows::<2>(kt, hd, [qrow(0), qrow(1)], spans, scale, [srow(0), srow(1)])
                };
            } else {
                let a = block[0];
                // SAFETY: as above, one row.
                unsafe { scores_rows::<1>(kt, hd, [qrow(0)], [(a.1, a.2)], scale, [srow(0)]) };
            }
        }
        // 2.–3. Running maximum, rescaling, weights and their sum, per row.
        for &(r, a, b) in &live {
            let sr = &mut s[r * KV_TILE..(r + 1) * KV_TILE];
            let accr = &mut acc[r * hd..(r + 1) * hd];
            softmax_row(sr, a, b, &mut m[r], &mut sum[r], accr);
        }
        // 4. Weighted values.
        for block in live.chunks(ROWS) {
            if let [x, y] = *block {
                let (from, to) = (x.1.max(y.1), x.2.min(y.2));
                if from < to {
                    // Each row's own leading positions, the common span for both, then each
                    // row's trailing positions: every row still sees its positions in order.
                    for &(r, a, _) in block {
                        // SAFETY: see `pv_span`; `a..from` lies in row `r`'s span.
                        unsafe { pv_one(vt, hd, s, acc, r, a, from) };
                    }
                    let sp = s.as_ptr();
                    let ps = [
                        sp.wrapping_add(x.0 * KV_TILE),
                        sp.wrapping_add(y.0 * KV_TILE),
                    ];
                    let ap = acc.as_mut_ptr();
                    let accs = [ap.wrapping_add(x.0 * hd), ap.wrapping_add(y.0 * hd)];
                    // SAFETY: distinct rows `x.0`, `y.0`; `from..to` lies in both spans.
                    unsafe { pv_span::<2>(vt, hd, ps, from, to, accs) };
                    for &(r, _, b) in block {
                        // SAFETY: `to..b` lies in row `r`'s span.
                        unsafe { pv_one(vt, hd, s, acc, r, to, b) };
                    }
                    continue;
                }
            }
            for &(r, a, b) in block {
                // SAFETY: `a..b` is row `r`'s span.
                unsafe { pv_one(vt, hd, s, acc, r, a, b) };
            }
        }
        tile += KV_TILE;
    }
    for r in 0..rows {
        let inv = if sum[r] == 0.0 { 0.0 } else { 1.0 / sum[r] };
        for (o, &x) in out[r * hd..(r + 1) * hd]
            .iter_mut()
            .zip(&acc[r * hd..(r + 1) * hd])
        {
            *o = x * inv;
        }
    }
}

/// Widens positions `tile + pa..tile + pb` of `k` (transposed into `kt`, `[hd, KV_TILE]`) and
/// `v` (into `vt`, `[KV_TILE, hd]`); `k`, `v` hold positions from `base`.
///
/// # Safety
/// AVX2+F16C; `pa < pb <= KV_TILE`; `k`, `v` hold positions `base..tile + pb`, `hd % 8 == 0`.
#[allow(clippy::too_many_arguments)]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn widen_tile(
    k: &[f16],
    v: &[f16],
    base: usize,
    tile: usize,
    pa: usize,
    pb: usize,
    hd: usize,
    kt: &mut [f32],
    vt: &mut [f32],
) {
    debug_assert!(pa < pb && pb <= KV_TILE && (tile + pb - base) * hd <= k.len());
    let row = |p: usize| (tile + p - base) * hd;
    let mut p = pa;
    while p < pb {
        if p.is_multiple_of(8) && p + 8 <= pb {
            for d in (0..hd).step_by(8) {
                // SAFETY: positions `p..p + 8` and dims `d..d + 8` are inside `k`; the 8
                // columns written are `kt[(d + i) * KV_TILE + p..+8]`, inside one tile.
                unsafe {
                    let mut r = [_mm256_setzero_ps(); 8];
                    for (i, ri) in r.iter_mut().enumerate() {
                        let src = k.as_ptr().add(row(p + i) + d) as *const __m128i;
                        *ri = _mm256_cvtph_ps(_mm_loadu_si128(src));
                    }
                    let c = transpose8x8(r);
                    for (i, ci) in c.iter().enumerate() {
                        _mm256_storeu_ps(kt.as_mut_ptr().add((d + i) * KV_TILE + p), *ci);
                    }
                }
            }
            p += 8;
        } else {
            for (d, x) in k[row(p)..row(p) + hd].iter().enumerate() {
                kt[d * KV_TILE + p] = x.to_f32();
            }
            p += 1;
        }
    }
    for p in pa..pb {
        for d in (0..hd).step_by(8) {
            // SAFETY: position `p`, dims `d..d + 8` lie inside `v` and `vt`.
            unsafe {
                let src = v.as_ptr().add(row(p) + d) as *const __m128i;
                _mm256_storeu_ps(
                    vt.as_mut_ptr().add(p * hd + d),
                    _mm256_cvtph_ps(_mm_loadu_si128(src)),
                );
            }
        }
    }
}

/// Scores of `R` rows over the vectors of the tile that any of their spans touch, written to
/// `srows[i]` (`KV_TILE` slots, `-inf` outside `spans[i]`).
///
/// # Safety
/// AVX2+FMA; `kt` is one widened tile `[hd, KV_TILE]`; `qrows[i]` point at `hd` values and
/// `srows[i]` at `KV_TILE` slots of distinct rows; spans lie in `0..KV_TILE`.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn scores_rows<const R: usize>(
    kt: &[f32],
    hd: usize,
    qrows: [*const f32; R],
    spans: [(usize, usize); R],
    scale: f32,
    srows: [*mut f32; R],
) {
    let lo = spans.iter().map(|s| s.0).min().unwrap_or(0) / 8;
    let hi = spans.iter().map(|s| s.1).max().unwrap_or(0).div_ceil(8);
    let ninf = _mm256_set1_ps(f32::NEG_INFINITY);
    for sr in srows {
        for j in (0..lo).chain(hi..KV_TILE / 8) {
            // SAFETY: slot vector `j` of a `KV_TILE`-slot row.
            unsafe { _mm256_storeu_ps(sr.add(8 * j), ninf) };
        }
    }
    let mut j = lo;
    while j + 4 <= hi {
        // SAFETY: vectors `j..j + 4` lie in the tile.
        unsafe { scores_block::<R, 4>(kt, hd, j, qrows, spans, scale, srows) };
        j += 4;
    }
    while j < hi {
        // SAFETY: vector `j` lies in the tile.
        unsafe { scores_block::<R, 1>(kt, hd, j, qrows, spans, scale, srows) };
        j += 1;
    }
}

/// [`scores_rows`] for the `P` vectors from vector `j`: per lane `fma(k[dk], q[dk], ·)` for
/// `dk` in order from 0, then `× scale`, `-inf` outside the row's span.
///
/// # Safety
/// As [`scores_rows`], with `j + P <= KV_TILE / 8`.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
#[allow(clippy::needless_range_loop)] // register blocks: one index into several arrays
unsafe fn scores_block<const R: usize, const P: usize>(
    kt: &[f32],
    hd: usize,
    j: usize,
    qrows: [*const f32; R],
    spans: [(usize, usize); R],
    scale: f32,
    srows: [*mut f32; R],
) {
    debug_assert!(j + P <= KV_TILE / 8 && kt.len() >= hd * KV_TILE);
    let mut acc = [[_mm256_setzero_ps(); P]; R];
    let col0 = kt.as_ptr().wrapping_add(8 * j);
    for dk in 0..hd {
        // SAFETY: `dk < hd`: vectors `j..j + P` of column `dk` lie in `kt`; `qrows[r]` hold
        // `hd` values.
        unsafe {
            let col = col0.add(dk * KV_TILE);
            let mut kv = [_mm256_setzero_ps(); P];
            for (i, x) in kv.iter_mut().enumerate() {
                *x = _mm256_loadu_ps(col.add(8 * i));
            }
            for r in 0..R {
                let qd = _mm256_broadcast_ss(&*qrows[r].add(dk));
                for i in 0..P {
                    acc[r][i] = _mm256_fmadd_ps(kv[i], qd, acc[r][i]);
                }
            }
        }
    }
    let sc = _mm256_set1_ps(scale);
    let ninf = _mm256_set1_ps(f32::NEG_INFINITY);
    let lane = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
    for r in 0..R {
        let (a, b) = spans[r];
        let (below, end) = (_mm256_set1_epi32(a as i32 - 1), _mm256_set1_epi32(b as i32));
        for i in 0..P {
            let idx = _mm256_add_epi32(lane, _mm256_set1_epi32((8 * (j + i)) as i32));
            let inside =
                _mm256_and_si256(_mm256_cmpgt_epi32(idx, below), _mm256_cmpgt_epi32(end, idx));
            let x = _mm256_mul_ps(acc[r][i], sc);
            // SAFETY: slot vector `j + i` of row `r`'s `KV_TILE` slots.
            unsafe {
                _mm256_storeu_ps(
                    srows[r].add(8 * (j + i)),
                    _mm256_blendv_ps(ninf, x, _mm256_castsi256_ps(inside)),
                )
            };
        }
    }
}

/// Steps 2–3 of the module doc for one row: `sr` (its `KV_TILE` scores, `-inf` outside
/// `a..b`) becomes its weights; `m`, `sum`, `acc` are the row's running state.
#[target_feature(enable = "avx2,fma,f16c")]
fn softmax_row(sr: &mut [f32], a: usize, b: usize, m: &mut f32, sum: &mut f32, acc: &mut [f32]) {
    let sr = &mut sr[..KV_TILE];
    // The maximum of the non-NaN scores (`max_ps` returns its second operand when either is
    // NaN, and the running value never is), as the portable `fold(-inf, f32::max)`.
    let mut mx = _mm256_set1_ps(f32::NEG_INFINITY);
    for g in sr.chunks_exact(8) {
        // SAFETY: `g` holds 8 values.
        mx = _mm256_max_ps(unsafe { _mm256_loadu_ps(g.as_ptr()) }, mx);
    }
    let h = _mm_max_ps(_mm256_castps256_ps128(mx), _mm256_extractf128_ps::<1>(mx));
    let h = _mm_max_ps(h, _mm_movehl_ps(h, h));
    let tile_max = _mm_cvtss_f32(_mm_max_ss(h, _mm_movehdup_ps(h)));
    let m_new = m.max(tile_max);
    if m_new > *m {
        let ms = (*m - m_new).exp();
        for x in acc.iter_mut() {
            *x *= ms;
        }
        *sum *= ms;
    }
    *m = m_new;
    let mv = _mm256_set1_ps(m_new);
    let mut tile_sum = 0.0f64;
    for (gi, g) in sr.chunks_exact_mut(8).enumerate() {
        if m_new != f32::NEG_INFINITY && (8 * gi + 8 <= a || 8 * gi >= b) {
            // Every weight of this group is exactly 0: nothing to add.
            continue;
        }
        // SAFETY: `g` holds 8 values.
        let p = expf8(_mm256_sub_ps(unsafe { _mm256_loadu_ps(g.as_ptr()) }, mv));
        // SAFETY: as above.
        unsafe { _mm256_storeu_ps(g.as_mut_ptr(), p) };
        let x = _mm_add_ps(_mm256_castps256_ps128(p), _mm256_extractf128_ps::<1>(p));
        let x = _mm_add_ps(x, _mm_movehl_ps(x, x));
        let x = _mm_add_ss(x, _mm_movehdup_ps(x));
        tile_sum += f64::from(_mm_cvtss_f32(x));
    }
    *sum = (f64::from(*sum) + tile_sum) as f32;
}

/// Step 4 for row `r` alone over tile positions `t0..t1` (nothing when empty).
///
/// # Safety
/// AVX2+FMA; `t0..t1` within the row's span of the current tile; `s`, `acc` hold row `r`.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn pv_one(
    vt: &[f32],
    hd: usize,
    s: &[f32],
    acc: &mut [f32],
    r: usize,
    t0: usize,
    t1: usize,
) {
    if t0 < t1 {
        let ps = [s[r * KV_TILE..(r + 1) * KV_TILE].as_ptr()];
        let accs = [acc[r * hd..(r + 1) * hd].as_mut_ptr()];
        // SAFETY: one row's weights and accumulator; `t1 <= KV_TILE`.
        unsafe { pv_span::<1>(vt, hd, ps, t0, t1, accs) };
    }
}

/// Step 4 for `R` rows over tile positions `t0..t1`: `acc[e] = fma(v[t][e], p[t], acc[e])`,
/// `t` in order, accumulators in registers over blocks of dimensions.
///
/// # Safety
/// AVX2+FMA; `vt` is one widened tile `[KV_TILE, hd]`, `hd % 8 == 0`, `t1 <= KV_TILE`;
/// `ps[i]` point at `KV_TILE` weights and `accs[i]` at `hd` accumulators of distinct rows.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn pv_span<const R: usize>(
    vt: &[f32],
    hd: usize,
    ps: [*const f32; R],
    t0: usize,
    t1: usize,
    accs: [*mut f32; R],
) {
    debug_assert!(t1 <= KV_TILE && vt.len() >= KV_TILE * hd);
    let nv = hd / 8;
    let mut d = 0;
    if R == 1 {
        while d + 8 <= nv {
            // SAFETY: vectors `d..d + 8` of `hd / 8`; the caller's bounds.
            unsafe { pv_block::<R, 8>(vt, hd, 8 * d, ps, t0, t1, accs) };
            d += 8;
        }
    }
    while d + 4 <= nv {
        // SAFETY: vectors `d..d + 4` of `hd / 8`; the caller's bounds.
        unsafe { pv_block::<R, 4>(vt, hd, 8 * d, ps, t0, t1, accs) };
        d += 4;
    }
    while d < nv {
        // SAFETY: vector `d` of `hd / 8`; the caller's bounds.
        unsafe { pv_block::<R, 1>(vt, hd, 8 * d, ps, t0, t1, accs) };
        d += 1;
    }
}

/// [`pv_span`] for the `P` vectors of dimensions from `d0`.
///
/// # Safety
/// As [`pv_span`], with `d0 + 8 * P <= hd`.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
#[allow(clippy::needless_range_loop)] // register blocks: one index into several arrays
unsafe fn pv_block<const R: usize, const P: usize>(
    vt: &[f32],
    hd: usize,
    d0: usize,
    ps: [*const f32; R],
    t0: usize,
    t1: usize,
    accs: [*mut f32; R],
) {
    // SAFETY: the caller's bounds: dims `d0..d0 + 8P` of `hd`, positions `t0..t1` of the tile.
    unsafe {
        let mut acc = [[_mm256_setzero_ps(); P]; R];
        for r in 0..R {
            for i in 0..P {
                acc[r][i] = _mm256_loadu_ps(accs[r].add(d0 + 8 * i));
            }
        }
        let base = vt.as_ptr().add(d0);
        for t in t0..t1 {
            let row = base.add(t * hd);
            let mut vv = [_mm256_setzero_ps(); P];
            for (i, x) in vv.iter_mut().enumerate() {
                *x = _mm256_loadu_ps(row.add(8 * i));
            }
            for r in 0..R {
                let w = _mm256_broadcast_ss(&*ps[r].add(t));
                for i in 0..P {
                    acc[r][i] = _mm256_fmadd_ps(vv[i], w, acc[r][i]);
                }
            }
        }
        for r in 0..R {
            for i in 0..P {
                _mm256_storeu_ps(accs[r].add(d0 + 8 * i), acc[r][i]);
            }
        }
    }
}
