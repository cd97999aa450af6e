//! The tiled online-softmax kernel for attention at depth: one query row against a tile of up to
//! [`TILE_POSITIONS`] K/V rows already widened to f32, with a vectorised exponential.
//!
//! Owns the arithmetic of one tile step and of merging position segments; it never reads a KV
//! store, never allocates and never parallelises (the caller — `attention::tiled` — streams
//! each K/V tile once for all query rows of a GQA group and a run of tokens, and splits long
//! contexts into segments that run in parallel).
//!
//! The arithmetic of one tile step for a row with state `(m, l, acc[hd])` and `valid` positions:
//! 1. scores `s[t] = dot(q, k[t]) · scale`, where `dot` keeps eight lane sums, each a chain of
//!    fused multiply-adds over `hd / 8` chunks in order, reduced as
//!    `((x0+x1)+(x2+x3)) + ((x4+x5)+(x6+x7))`;
//! 2. `m' = max(m, max_t s[t])`; when `m' > m`: `f = exp(m − m')`, `acc *= f`, `l *= f`;
//! 3. `p[t] = exp(s[t] − m')`; `l += Σ_g hsum8(p[8g..8g+8])` (groups in order, masked lanes 0);
//! 4. `acc[e] = fma(p[t], v[t][e], acc[e])` for `t` in order.
//!
//! `exp` is [`exp_poly`] (Cephes' single-precision polynomial with fused multiply-adds; ≤ 2 ulp
//! over the range used, 0 below −87). Segments `(m_j, l_j, acc_j)` are merged in order by
//! [`merge_segments`]. The AVX2 path performs exactly these IEEE operations, so both paths give
//! bit-identical results (tests pin this), and a row's result depends only on its query, its
//! K/V and its position count — never on which other rows share the tile. Many rows sharing a
//! widened tile run the same arithmetic in 512-bit registers over the tile's K transposed
//! (`flash_tile_wide`, AVX-512 F) or, without AVX-512, in 256-bit registers over the same
//! transposed tile (`flash_tile_narrow`, AVX2), also bit-identical.

use half::f16;

use super::cpu::{cpu_features, CpuFeatures};

/// A K/V element the tile kernel reads: f32, or f16 / bf16 widened on load (exact, so f32 and
/// f16 give the same bits for the same values).
pub trait TileElem: Copy + Default + Send + Sync + 'static {
    fn widen(self) -> f32;
    /// Eight elements at `p` as f32 lanes.
    ///
    /// # Safety
    /// AVX2+F16C present; `p` points to 8 readable elements.
    #[cfg(target_arch = "x86_64")]
    unsafe fn load8(p: *const Self) -> std::arch::x86_64::__m256;
    /// Sixteen elements at `p` as f32 lanes (the values of two [`TileElem::load8`]).
    ///
    /// # Safety
    /// AVX-512 F (with AVX2, F16C) present; `p` points to 16 readable elements.
    #[cfg(target_arch = "x86_64")]
    unsafe fn load16(p: *const Self) -> std::arch::x86_64::__m512;
}

impl TileElem for f32 {
    #[inline(always)]
    fn widen(self) -> f32 {
        self
    }
    #[cfg(target_arch = "x86_64")]
    #[inline]
    #[target_feature(enable = "avx2,f16c")]
    unsafe fn load8(p: *const f32) -> std::arch::x86_64::__m256 {
        // SAFETY: the caller guarantees 8 readable floats.
        unsafe { std::arch::x86_64::_mm256_loadu_ps(p) }
    }
    #[cfg(target_arch = "x86_64")]
    #[inline]
    #[target_feature(enable = "avx512f,avx2,f16c")]
    unsafe fn load16(p: *const f32) -> std::arch::x86_64::__m512 {
        // SAFETY: the caller guarantees 16 readable floats.
        unsafe { std::arch::x86_64::_mm512_loadu_ps(p) }
    }
}

impl TileElem for f16 {
    #[inline(always)]
    fn widen(self) -> f32 {
        self.to_f32()
    }
    #[cfg(target_arch = "x86_64")]
    #[inline]
    #[target_feature(enable = "avx2,f16c")]
    unsafe fn load8(p: *const f16) -> std::arch::x86_64::__m256 {
        use std::arch::x86_64::*;
        // SAFETY: the caller guarantees 8 readable halves (16 bytes).
        unsafe { _mm256_cvtph_ps(_mm_loadu_si128(p.cast())) }
    }
    #[cfg(target_arch = "x86_64")]
    #[inline]
    #[target_feature(enable = "avx512f,avx2,f16c")]
    unsafe fn load16(p: *const f16) -> std::arch::x86_64::__m512 {
        use std::arch::x86_64::*;
        // SAFETY: the caller guarantees 16 readable halves (32 bytes).
        unsafe { _mm512_cvtph_ps(_mm256_loadu_si256(p.cast())) }
    }
}

impl TileElem for half::bf16 {
    #[inline(always)]
    fn widen(self) -> f32 {
        self.to_f32()
    }
    #[cfg(target_arch = "x86_64")]
    #[inline]
    #[target_feature(enable = "avx2,f16c")]
    unsafe fn load8(p: *const half::bf16) -> std::arch::x86_64::__m256 {
        use std::arch::x86_64::*;
        // SAFETY: the caller guarantees 8 readable bf16 (16 bytes). A bf16 is the top half of
        // its f32: zero-extend and shift (exact).
        unsafe {
            _mm256_castsi256_ps(_mm256_slli_epi32::<16>(_mm256_cvtepu16_epi32(
                _mm_loadu_si128(p.cast()),
            )))
        }
    }
    #[cfg(target_arch = "x86_64")]
    #[inline]
    #[target_feature(enable = "avx512f,avx2,f16c")]
    unsafe fn load16(p: *const half::bf16) -> std::arch::x86_64::__m512 {
        use std::arch::x86_64::*;
        // SAFETY: the caller guarantees 16 readable bf16 (32 bytes).
        unsafe {
            _mm512_castsi512_ps(_mm512_slli_epi32::<16>(_mm512_cvtepu16_epi32(
                _mm256_loadu_si256(p.cast()),
            )))
        }
    }
}

/// Prefetches (to L1) the `len` bytes from `start`, one request per cache line: the next tile
/// of a decode's K/V stream. `start` may point anywhere (the next tile can lie past the current
/// chunk, in unrelated memory): a prefetch never faults, and changes no result. No-op off x86-64.
#[inline(always)]
pub fn prefetch_l1(start: *const u8, len: usize) {
    #[cfg(target_arch = "x86_64")]
    for at in (0..len).step_by(64) {
        use std::arch::x86_64::{_mm_prefetch, _MM_HINT_T0};
        // SAFETY: SSE is always present on x86-64; `wrapping_add` computes an address without
        // claiming it lies in an allocation, and a prefetch has no architectural effect.
        unsafe { _mm_prefetch::<_MM_HINT_T0>(start.wrapping_add(at).cast()) };
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = (start, len);
}

/// `dst[i] = f32(src[i])` (exact). Panics if lengths differ.
#[inline]
pub fn widen_f16(src: &[f16], dst: &mut [f32]) {
    assert_eq!(src.len(), dst.len(), "widen_f16 needs equal lengths");
    #[cfg(target_arch = "x86_64")]
    if cpu_features().avx2 {
        // SAFETY: AVX2+F16C presence was checked at runtime just above.
        unsafe { avx2::widen(src, dst) };
        return;
    }
    for (d, s) in dst.iter_mut().zip(src) {
        *d = s.to_f32();
    }
}

/// Positions per softmax tile (tiles start at multiples of this, counted from position 0).
pub const TILE_POSITIONS: usize = 16;

/// Running maximum and sum of the tiled online softmax for one query row.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct TileSoftmax {
    pub max: f32,
    pub sum: f32,
}

impl Default for TileSoftmax {
    fn default() -> Self {
        TileSoftmax {
            max: f32::NEG_INFINITY,
            sum: 0.0,
        }
    }
}

pub(super) const LOG2E: f32 = std::f32::consts::LOG2_E;
pub(super) const LN2_HI: f32 = 0.693_359_4;
pub(super) const LN2_LO: f32 = -2.121_944_4e-4;
pub(super) const EXP_MIN: f32 = -87.0;
pub(super) const P0: f32 = 1.987_569_1e-4;
pub(super) const P1: f32 = 1.398_199_9e-3;
pub(super) const P2: f32 = 8.333_452e-3;
pub(super) const P3: f32 = 4.166_579_6e-2;
pub(super) const P4: f32 = 1.666_666_5e-1;
pub(super) const P5: f32 = 0.5;

/// `e^x` for `x ≤ 0` (the only arguments softmax needs): 0 below −87, else Cephes' polynomial.
/// The AVX2 lanes compute exactly this.
#[inline]
pub fn exp_poly(x: f32) -> f32 {
    #[cfg(target_arch = "x86_64")]
    if cpu_features().avx2 && !x.is_nan() {
        // SAFETY: AVX2+FMA presence was checked at runtime just above.
        return unsafe { avx2::exp1(x) };
    }
    exp_poly_portable(x)
}

/// [`exp_poly`] in scalar operations.
#[inline]
pub fn exp_poly_portable(x: f32) -> f32 {
    if x.is_nan() || x < EXP_MIN {
        return if x.is_nan() { x } else { 0.0 };
    }
    let x = x.min(0.0);
    let n = (x * LOG2E).round_ties_even();
    let r = n.mul_add(-LN2_HI, x);
    let r = n.mul_add(-LN2_LO, r);
    let z = r * r;
    let mut y = P0.mul_add(r, P1);
    y = y.mul_add(r, P2);
    y = y.mul_add(r, P3);
    y = y.mul_add(r, P4);
    y = y.mul_add(r, P5);
    y = y.mul_add(z, r);
    y += 1.0;
    y * f32::from_bits(((n as i32 + 127) << 23) as u32)
}

/// `((x0+x1)+(x2+x3)) + ((x4+x5)+(x6+x7))`.
#[inline(always)]
fn hsum8(x: &[f32; 8]) -> f32 {
    ((x[0] + x[1]) + (x[2] + x[3])) + ((x[4] + x[5]) + (x[6] + x[7]))
}

/// One tile step (module doc) for one query row: `q`, `acc` are `[hd]` (`hd` a multiple of 8);
/// `keys`, `vals` hold at least `valid` rows of `hd` (keys rounded up to a multiple of 8 rows:
/// rows past `valid` are read but masked). Panics on a shape mismatch.
#[allow(clippy::too_many_arguments)]
pub fn tile_update<E: TileElem>(
    st: &mut TileSoftmax,
    acc: &mut [f32],
    q: &[f32],
    keys: &[E],
    vals: &[E],
    valid: usize,
    scale: f32,
) {
    tile_update_with(cpu_features(), st, acc, q, keys, vals, valid, scale)
}

/// [`tile_update`] on an explicit path.
#[allow(clippy::too_many_arguments)]
pub fn tile_update_with<E: TileElem>(
    features: CpuFeatures,
    st: &mut TileSoftmax,
    acc: &mut [f32],
    q: &[f32],
    keys: &[E],
    vals: &[E],
    valid: usize,
    scale: f32,
) {
    let hd = q.len();
    let groups = valid.div_ceil(8);
    assert!(
        hd > 0
            && hd.is_multiple_of(8)
            && acc.len() == hd
            && (1..=TILE_POSITIONS).contains(&valid)
            && keys.len() >= groups * 8 * hd
            && vals.len() >= valid * hd,
        "tile shapes: hd={hd} valid={valid} keys={} vals={}",
        keys.len(),
        vals.len()
    );
    let mut scores = [0f32; TILE_POSITIONS];
    #[cfg(target_arch = "x86_64")]
    if features.clamp_to_detected().avx2 {
        // SAFETY: AVX2+FMA presence was checked at runtime just above; shapes were checked by
        // the assertion (keys hold `groups * 8` rows, vals `valid` rows, q/acc `hd`).
        unsafe { avx2::tile(st, acc, q, keys, vals, valid, scale, &mut scores) };
        return;
    }
    let _ = features;
    // Scores, eight lane chains per position.
    for (t, s) in scores.iter_mut().enumerate().take(valid) {
        let k = &keys[t * hd..(t + 1) * hd];
        let mut lanes = [0f32; 8];
        for (qc, kc) in q.chunks_exact(8).zip(k.chunks_exact(8)) {
            for l in 0..8 {
                lanes[l] = qc[l].mul_add(kc[l].widen(), lanes[l]);
            }
        }
        *s = hsum8(&lanes) * scale;
    }
    finish_portable(st, acc, &scores, vals, valid);
}

/// Steps 2–4 of the module doc in scalar operations, for scores already computed.
fn finish_portable<E: TileElem>(
    st: &mut TileSoftmax,
    acc: &mut [f32],
    scores: &[f32; TILE_POSITIONS],
    vals: &[E],
    valid: usize,
) {
    let hd = acc.len();
    let groups = valid.div_ceil(8);
    let tile_max = scores[..valid]
        .iter()
        .copied()
        .fold(f32::NEG_INFINITY, f32::max);
    if tile_max > st.max {
        let f = exp_poly_portable(st.max - tile_max);
        acc.iter_mut().for_each(|a| *a *= f);
        st.sum *= f;
        st.max = tile_max;
    }
    let mut p = [0f32; TILE_POSITIONS];
    for t in 0..valid {
        p[t] = exp_poly_portable(scores[t] - st.max);
    }
    let mut tile_sum = 0f32;
    for g in 0..groups {
        tile_sum += hsum8(p[g * 8..g * 8 + 8].try_into().expect("8 lanes"));
    }
    st.sum += tile_sum;
    for (t, &pt) in p.iter().enumerate().take(valid) {
        for (a, &v) in acc.iter_mut().zip(&vals[t * hd..(t + 1) * hd]) {
            *a = pt.mul_add(v.widen(), *a);
        }
    }
}

/// Steps 2–4 of the module doc (softmax update and `p·V`) for one row whose scores
/// `scores[..valid]` (already multiplied by the softmax scale) were computed elsewhere — from
/// integer K codes (`flash_tile_codes`). The same operations as those steps of [`tile_update`],
/// on every path. Panics on a shape mismatch.
#[inline]
pub fn tile_update_scored(
    features: CpuFeatures,
    st: &mut TileSoftmax,
    acc: &mut [f32],
    scores: &[f32; TILE_POSITIONS],
    vals: &[f32],
    valid: usize,
) {
    let hd = acc.len();
    assert!(
        hd > 0
            && hd.is_multiple_of(8)
            && (1..=TILE_POSITIONS).contains(&valid)
            && vals.len() >= valid * hd,
        "scored tile shapes: hd={hd} valid={valid} vals={}",
        vals.len()
    );
    #[cfg(target_arch = "x86_64")]
    if features.clamp_to_detected().avx2 {
        // SAFETY: AVX2+FMA presence was checked at runtime just above; shapes by the assertion.
        unsafe { avx2::tile_scored(st, acc, scores, vals, valid) };
        return;
    }
    let _ = features;
    finish_portable(st, acc, scores, vals, valid);
}

/// Rows one register-blocked transposed tile step takes (`flash_tile_transposed`): the heads of
/// a GQA group of three (other rows run one at a time, same bits).
pub const TRIPLE_ROWS: usize = 3;

/// Rows one [`tile_update_rows`] call takes.
pub const TILE_ROWS: usize = 3;

/// [`tile_update`] for [`TILE_ROWS`] rows sharing one tile and `valid`: bit-identical to three
/// [`tile_update`] calls in turn (each row's arithmetic is unchanged), with every K and V load
/// shared by the rows. Panics on a shape mismatch.
#[allow(clippy::too_many_arguments)]
pub fn tile_update_rows<E: TileElem>(
    sts: &mut [TileSoftmax; TILE_ROWS],
    accs: &mut [&mut [f32]; TILE_ROWS],
    qs: &[&[f32]; TILE_ROWS],
    keys: &[E],
    vals: &[E],
    valid: usize,
    scale: f32,
) {
    tile_update_rows_with(cpu_features(), sts, accs, qs, keys, vals, valid, scale)
}

/// [`tile_update_rows`] on an explicit path.
#[allow(clippy::too_many_arguments)]
pub fn tile_update_rows_with<E: TileElem>(
    features: CpuFeatures,
    sts: &mut [TileSoftmax; TILE_ROWS],
    accs: &mut [&mut [f32]; TILE_ROWS],
    qs: &[&[f32]; TILE_ROWS],
    keys: &[E],
    vals: &[E],
    valid: usize,
    scale: f32,
) {
    let features = features.clamp_to_detected();
    #[cfg(target_arch = "x86_64")]
    if features.avx2 {
        let hd = qs[0].len();
        let groups = valid.div_ceil(8);
        assert!(
            hd > 0
                && hd.is_multiple_of(8)
                && qs.iter().all(|q| q.len() == hd)
                && accs.iter().all(|a| a.len() == hd)
                && (1..=TILE_POSITIONS).contains(&valid)
                && keys.len() >= groups * 8 * hd
                && vals.len() >= valid * hd,
            "tile shapes: hd={hd} valid={valid} keys={} vals={}",
            keys.len(),
            vals.len()
        );
        // SAFETY: AVX2+FMA+F16C (and for the second, AVX-512 F+VL) presence was checked at
        // runtime (`clamp_to_detected`); shapes were checked by the assertion.
        unsafe {
            if features.avx512 {
                avx2::tile_rows3_avx512(sts, accs, qs, keys, vals, valid, scale);
            } else {
                avx2::tile_rows3(sts, accs, qs, keys, vals, valid, scale);
            }
        }
        return;
    }
    for r in 0..TILE_ROWS {
        tile_update_with(
            features,
            &mut sts[r],
            accs[r],
            qs[r],
            keys,
            vals,
            valid,
            scale,
        );
    }
}

/// Merges per-segment states in segment order into `out` (`[hd]`): with `M = max_j m_j` and
/// `e_j = exp(m_j − M)`, `L = Σ l_j·e_j`, `O = Σ acc_j·e_j` (multiply, then add), `out = O · (1/L)`
/// (0 when `L` is 0). `segments` yields `(state, acc_j)`.
pub fn merge_segments<'a>(
    segments: impl Iterator<Item = (TileSoftmax, &'a [f32])> + Clone,
    out: &mut [f32],
) {
    let m = segments
        .clone()
        .map(|(s, _)| s.max)
        .fold(f32::NEG_INFINITY, f32::max);
    out.fill(0.0);
    let mut l = 0f32;
    for (st, acc) in segments {
        let e = if st.max == f32::NEG_INFINITY {
            0.0
        } else {
            exp_poly(st.max - m)
        };
        l += st.sum * e;
        for (o, &a) in out.iter_mut().zip(acc) {
            *o += a * e;
        }
    }
    let inv = if l == 0.0 { 0.0 } else { 1.0 / l };
    out.iter_mut().for_each(|o| *o *= inv);
}

#[cfg(target_arch = "x86_64")]
pub(crate) mod avx2 {
    //! AVX2 bodies; callers must have checked AVX2+FMA at runtime.
    use super::*;
    use std::arch::x86_64::*;

    /// [`exp_poly`] on eight lanes (arguments ≤ 0 or −∞; NaN lanes are not expected).
    #[target_feature(enable = "avx2,fma")]
    #[inline]
    pub(crate) fn exp8(x: __m256) -> __m256 {
        let below = _mm256_cmp_ps::<_CMP_LT_OQ>(x, _mm256_set1_ps(EXP_MIN));
        let x = _mm256_min_ps(
            _mm256_max_ps(x, _mm256_set1_ps(EXP_MIN)),
            _mm256_setzero_ps(),
        );
        let n = _mm256_round_ps::<{ _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC }>(
            _mm256_mul_ps(x, _mm256_set1_ps(LOG2E)),
        );
        let r = _mm256_fmadd_ps(n, _mm256_set1_ps(-LN2_HI), x);
        let r = _mm256_fmadd_ps(n, _mm256_set1_ps(-LN2_LO), r);
        let z = _mm256_mul_ps(r, r);
        let mut y = _mm256_fmadd_ps(_mm256_set1_ps(P0), r, _mm256_set1_ps(P1));
        y = _mm256_fmadd_ps(y, r, _mm256_set1_ps(P2));
        y = _mm256_fmadd_ps(y, r, _mm256_set1_ps(P3));
        y = _mm256_fmadd_ps(y, r, _mm256_set1_ps(P4));
        y = _mm256_fmadd_ps(y, r, _mm256_set1_ps(P5));
        y = _mm256_fmadd_ps(y, z, r);
        y = _mm256_add_ps(y, _mm256_set1_ps(1.0));
        let bits = _mm256_slli_epi32::<23>(_mm256_add_epi32(
            _mm256_cvtps_epi32(n),
            _mm256_set1_epi32(127),
        ));
        let res = _mm256_mul_ps(y, _mm256_castsi256_ps(bits));
        _mm256_andnot_ps(below, res)
    }

    /// `acc[0..8W] = fma(p[t], v[t][0..8W], acc)` for `t < valid`, the `W` accumulators held in
    /// registers; `v` rows are `row_stride` elements apart.
    ///
    /// # Safety
    /// `acc` holds `8W` floats; `v + t·row_stride` holds `8W` elements for every `t < valid`.
    #[target_feature(enable = "avx2,fma,f16c")]
    #[inline]
    unsafe fn axpy_block<const W: usize, E: TileElem>(
        acc: *mut f32,
        v: *const E,
        row_stride: usize,
        p: &[f32; TILE_POSITIONS],
        valid: usize,
    ) {
        let mut r = [_mm256_setzero_ps(); W];
        for (i, ri) in r.iter_mut().enumerate() {
            // SAFETY: `8i + 8 <= 8W` floats of `acc`.
            *ri = unsafe { _mm256_loadu_ps(acc.add(8 * i)) };
        }
        for (t, &pt) in p.iter().enumerate().take(valid) {
            let vpt = _mm256_set1_ps(pt);
            for (i, ri) in r.iter_mut().enumerate() {
                // SAFETY: row `t < valid`, lanes `8i..8i + 8` of `8W` (caller's contract).
                let x = unsafe { E::load8(v.add(t * row_stride + 8 * i)) };
                *ri = _mm256_fmadd_ps(vpt, x, *ri);
            }
        }
        for (i, ri) in r.iter().enumerate() {
            // SAFETY: as above.
            unsafe { _mm256_storeu_ps(acc.add(8 * i), *ri) };
        }
    }

    /// [`exp_poly`] of one value through the vector lanes (same bits).
    #[target_feature(enable = "avx2,fma")]
    #[inline]
    pub(crate) fn exp1(x: f32) -> f32 {
        _mm256_cvtss_f32(exp8(_mm256_set1_ps(x)))
    }

    /// `dst[i] = f32(src[i])`, eight at a time.
    #[target_feature(enable = "avx2,f16c")]
    pub(super) fn widen(src: &[half::f16], dst: &mut [f32]) {
        let n = src.len().min(dst.len());
        let mut i = 0;
        while i + 8 <= n {
            // SAFETY: `i + 8 <= n` elements remain in both slices.
            unsafe {
                let x = _mm256_cvtph_ps(_mm_loadu_si128(src.as_ptr().add(i).cast()));
                _mm256_storeu_ps(dst.as_mut_ptr().add(i), x);
            }
            i += 8;
        }
        for j in i..n {
            dst[j] = src[j].to_f32();
        }
    }

    /// [`exp8`] for the lane-equality test.
    #[cfg(test)]
    #[target_feature(enable = "avx2,fma")]
    pub(super) fn exp8_for_test(x: __m256) -> __m256 {
        exp8(x)
    }

    /// Eight vectors' lane sums `((x0+x1)+(x2+x3)) + ((x4+x5)+(x6+x7))`, lane `j` from `a[j]`.
    #[target_feature(enable = "avx2,fma")]
    #[inline]
    fn reduce8x8(a: &[__m256; 8]) -> __m256 {
        let h01 = _mm256_hadd_ps(a[0], a[1]);
        let h23 = _mm256_hadd_ps(a[2], a[3]);
        let h45 = _mm256_hadd_ps(a[4], a[5]);
        let h67 = _mm256_hadd_ps(a[6], a[7]);
        let ha = _mm256_hadd_ps(h01, h23); // [a0..a3: 0123 | a0..a3: 4567]
        let hb = _mm256_hadd_ps(h45, h67); // [a4..a7: 0123 | a4..a7: 4567]
        let lo = _mm256_permute2f128_ps::<0x20>(ha, hb);
        let hi = _mm256_permute2f128_ps::<0x31>(ha, hb);
        _mm256_add_ps(lo, hi)
    }

    /// One vector's `((x0+x1)+(x2+x3)) + ((x4+x5)+(x6+x7))`.
    #[target_feature(enable = "avx2,fma")]
    #[inline]
    pub(crate) fn hsum(x: __m256) -> f32 {
        let h = _mm256_hadd_ps(x, x); // [x0+x1, x2+x3, .. | x4+x5, x6+x7, ..]
        let h = _mm256_hadd_ps(h, h); // [(01)+(23) .. | (45)+(67) ..]
        _mm_cvtss_f32(_mm_add_ss(
            _mm256_castps256_ps128(h),
            _mm256_extractf128_ps::<1>(h),
        ))
    }

    /// Steps 2–3 of the module doc for one row whose scores (−∞ past `valid`) are in `scores`
    /// and whose lane maxima are `vmax`: rescales `acc` and the state, returns `p`.
    #[target_feature(enable = "avx2,fma")]
    #[inline]
    fn softmax_step(
        st: &mut TileSoftmax,
        acc: &mut [f32],
        scores: &[f32; TILE_POSITIONS],
        vmax: __m256,
        groups: usize,
    ) -> [f32; TILE_POSITIONS] {
        let ap = acc.as_mut_ptr();
        let chunks = acc.len() / 8;
        let mut m8 = [0f32; 8];
        // SAFETY: `m8` holds 8 floats.
        unsafe { _mm256_storeu_ps(m8.as_mut_ptr(), vmax) };
        let tile_max = m8.iter().copied().fold(f32::NEG_INFINITY, f32::max);
        if tile_max > st.max {
            let f = exp1(st.max - tile_max);
            let vf = _mm256_set1_ps(f);
            for c in 0..chunks {
                // SAFETY: `8c + 8 <= hd = acc.len()`.
                unsafe {
                    let x = _mm256_loadu_ps(ap.add(8 * c));
                    _mm256_storeu_ps(ap.add(8 * c), _mm256_mul_ps(x, vf));
                }
            }
            st.sum *= f;
            st.max = tile_max;
        }
        let vm = _mm256_set1_ps(st.max);
        let mut tile_sum = 0f32;
        let mut p = [0f32; TILE_POSITIONS];
        for g in 0..groups {
            // SAFETY: `8g + 8 <= TILE_POSITIONS` for both arrays.
            unsafe {
                let s = _mm256_loadu_ps(scores.as_ptr().add(8 * g));
                let e = exp8(_mm256_sub_ps(s, vm));
                tile_sum += hsum(e);
                _mm256_storeu_ps(p.as_mut_ptr().add(8 * g), e);
            }
        }
        st.sum += tile_sum;
        p
    }

    /// The whole tile step; see the module doc. `scores` is scratch of `TILE_POSITIONS`.
    ///
    /// # Safety
    /// `q`, `acc` hold `hd` (a multiple of 8) elements, `keys` `ceil(valid/8)*8` rows of `hd`,
    /// `vals` `valid` rows of `hd` (checked by the caller).
    #[allow(clippy::too_many_arguments)]
    #[target_feature(enable = "avx2,fma,f16c")]
    pub(super) unsafe fn tile<E: TileElem>(
        st: &mut TileSoftmax,
        acc: &mut [f32],
        q: &[f32],
        keys: &[E],
        vals: &[E],
        valid: usize,
        scale: f32,
        scores: &mut [f32; TILE_POSITIONS],
    ) {
        let hd = q.len();
        let chunks = hd / 8;
        let groups = valid.div_ceil(8);
        let (qp, kp) = (q.as_ptr(), keys.as_ptr());
        let vscale = _mm256_set1_ps(scale);
        let mut vmax = _mm256_set1_ps(f32::NEG_INFINITY);
        let lane_ids = _mm256_setr_ps(0.0, 1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0);
        for g in 0..groups {
            let mut a = [_mm256_setzero_ps(); 8];
            for c in 0..chunks {
                // SAFETY: `c < hd / 8`, so `8c + 8 <= hd`.
                let qc = unsafe { _mm256_loadu_ps(qp.add(8 * c)) };
                for (j, aj) in a.iter_mut().enumerate() {
                    // SAFETY: row `8g + j < groups * 8`, which `keys` holds.
                    let kc = unsafe { E::load8(kp.add((8 * g + j) * hd + 8 * c)) };
                    *aj = _mm256_fmadd_ps(qc, kc, *aj);
                }
            }
            let s = _mm256_mul_ps(reduce8x8(&a), vscale);
            // Lanes at or past `valid` become −∞ (weight exactly 0, never the maximum).
            let limit = _mm256_set1_ps((valid - 8 * g) as f32);
            let live = _mm256_cmp_ps::<_CMP_LT_OQ>(lane_ids, limit);
            let s = _mm256_blendv_ps(_mm256_set1_ps(f32::NEG_INFINITY), s, live);
            // SAFETY: `8g + 8 <= groups * 8 <= TILE_POSITIONS`.
            unsafe { _mm256_storeu_ps(scores.as_mut_ptr().add(8 * g), s) };
            vmax = _mm256_max_ps(vmax, s);
        }
        // SAFETY: forwarded caller's contract.
        unsafe { finish(st, acc, scores, vmax, vals, valid) };
    }

    /// Steps 2–4 of the module doc for one row whose scores (−∞ past `valid`) are in `scores`
    /// and whose lane maxima are `vmax`.
    ///
    /// # Safety
    /// `acc` holds `hd` (a multiple of 8) floats, `vals` `valid` rows of `hd`.
    #[target_feature(enable = "avx2,fma,f16c")]
    #[inline]
    unsafe fn finish<E: TileElem>(
        st: &mut TileSoftmax,
        acc: &mut [f32],
        scores: &[f32; TILE_POSITIONS],
        vmax: __m256,
        vals: &[E],
        valid: usize,
    ) {
        let hd = acc.len();
        let chunks = hd / 8;
        let groups = valid.div_ceil(8);
        let vp = vals.as_ptr();
        let p = softmax_step(st, acc, scores, vmax, groups);
        let ap = acc.as_mut_ptr();
        // acc += Σ_t p[t]·v[t], eight chunks (64 floats) held in registers at a time.
        let mut c0 = 0;
        while c0 + 8 <= chunks {
            // SAFETY: chunks `c0..c0 + 8` lie inside `acc` and every `vals` row.
            unsafe { axpy_block::<8, E>(ap.add(8 * c0), vp.add(8 * c0), hd, &p, valid) };
            c0 += 8;
        }
        while c0 < chunks {
            // SAFETY: chunk `c0` lies inside `acc` and every `vals` row.
            unsafe { axpy_block::<1, E>(ap.add(8 * c0), vp.add(8 * c0), hd, &p, valid) };
            c0 += 1;
        }
    }
    /// Steps 2–4 for scores computed elsewhere (`tile_update_scored`).
    ///
    /// # Safety
    /// AVX2+FMA+F16C present; `acc` holds `hd` (a multiple of 8) floats, `vals` `valid` rows.
    #[target_feature(enable = "avx2,fma,f16c")]
    pub(super) unsafe fn tile_scored(
        st: &mut TileSoftmax,
        acc: &mut [f32],
        scores: &[f32; TILE_POSITIONS],
        vals: &[f32],
        valid: usize,
    ) {
        let lane_ids = _mm256_setr_ps(0.0, 1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0);
        let mut masked = [f32::NEG_INFINITY; TILE_POSITIONS];
        let mut vmax = _mm256_set1_ps(f32::NEG_INFINITY);
        for g in 0..valid.div_ceil(8) {
            // SAFETY: `8g + 8 <= TILE_POSITIONS` for both arrays.
            unsafe {
                let s = _mm256_loadu_ps(scores.as_ptr().add(8 * g));
                let limit = _mm256_set1_ps((valid - 8 * g) as f32);
                let live = _mm256_cmp_ps::<_CMP_LT_OQ>(lane_ids, limit);
                let s = _mm256_blendv_ps(_mm256_set1_ps(f32::NEG_INFINITY), s, live);
                _mm256_storeu_ps(masked.as_mut_ptr().add(8 * g), s);
                vmax = _mm256_max_ps(vmax, s);
            }
        }
        // SAFETY: forwarded caller's contract.
        unsafe { finish(st, acc, &masked, vmax, vals, valid) };
    }

    /// Four vectors' lane sums `((x0+x1)+(x2+x3)) + ((x4+x5)+(x6+x7))` (the tree of
    /// [`reduce8x8`]), lane `j` from `a[j]`.
    #[target_feature(enable = "avx2,fma")]
    #[inline]
    fn reduce4x8(a: &[__m256; 4]) -> __m128 {
        let h = _mm256_hadd_ps(_mm256_hadd_ps(a[0], a[1]), _mm256_hadd_ps(a[2], a[3]));
        _mm_add_ps(_mm256_castps256_ps128(h), _mm256_extractf128_ps::<1>(h))
    }

    /// `R` query rows against one tile, each with exactly the arithmetic of [`tile`] (same lane
    /// chains, reduction tree, softmax and accumulation order), but every K and V load shared
    /// by the `R` rows; `W` chunks of 8 accumulators per row are held in registers in the
    /// `p·V` loop. Instantiated for 16 vector registers (AVX2) and for 32 (AVX-512 VL).
    ///
    /// # Safety
    /// As [`tile`], for every row (all rows share `valid`).
    #[allow(clippy::too_many_arguments, clippy::needless_range_loop)]
    #[target_feature(enable = "avx2,fma,f16c")]
    #[inline]
    unsafe fn tile_rows_impl<E: TileElem, const R: usize, const W: usize>(
        sts: &mut [TileSoftmax; R],
        accs: &mut [&mut [f32]; R],
        qs: &[&[f32]; R],
        keys: &[E],
        vals: &[E],
        valid: usize,
        scale: f32,
    ) {
        // SAFETY: forwarded caller's contract.
        let p = unsafe { tile_rows_weights::<E, R>(sts, accs, qs, keys, valid, scale) };
        // SAFETY: forwarded caller's contract.
        unsafe { tile_rows_values8::<E, R, W>(accs, &p, vals, valid) };
    }

    /// Steps 1–3 of [`tile_rows_impl`] (scores with their lane chains and reduction tree, the
    /// softmax update of the states and accumulators): returns the weights `p` of step 4.
    ///
    /// # Safety
    /// As [`tile_rows_impl`].
    #[allow(clippy::needless_range_loop)]
    #[target_feature(enable = "avx2,fma,f16c")]
    #[inline]
    unsafe fn tile_rows_weights<E: TileElem, const R: usize>(
        sts: &mut [TileSoftmax; R],
        accs: &mut [&mut [f32]; R],
        qs: &[&[f32]; R],
        keys: &[E],
        valid: usize,
        scale: f32,
    ) -> [[f32; TILE_POSITIONS]; R] {
        let hd = qs[0].len();
        let chunks = hd / 8;
        let groups = valid.div_ceil(8);
        let kp = keys.as_ptr();
        let mut vmax = [_mm256_set1_ps(f32::NEG_INFINITY); R];
        let mut scores = [[0f32; TILE_POSITIONS]; R];
        for g in 0..groups {
            let mut halves = [[_mm_setzero_ps(); 2]; R];
            for (h, half) in [0usize, 4].into_iter().enumerate() {
                let mut a = [[_mm256_setzero_ps(); 4]; R];
                for c in 0..chunks {
                    let mut q = [_mm256_setzero_ps(); R];
                    for (qr, src) in q.iter_mut().zip(qs) {
                        // SAFETY: `c < hd / 8`, so `8c + 8 <= hd`.
                        *qr = unsafe { _mm256_loadu_ps(src.as_ptr().add(8 * c)) };
                    }
                    for j in 0..4 {
                        // SAFETY: row `8g + half + j < groups * 8`, which `keys` holds.
                        let kc = unsafe { E::load8(kp.add((8 * g + half + j) * hd + 8 * c)) };
                        for r in 0..R {
                            a[r][j] = _mm256_fmadd_ps(q[r], kc, a[r][j]);
                        }
                    }
                }
                for r in 0..R {
                    halves[r][h] = reduce4x8(&a[r]);
                }
            }
            let raw = std::array::from_fn(|r| _mm256_set_m128(halves[r][1], halves[r][0]));
            store_group_scores(raw, g, valid, scale, &mut scores, &mut vmax);
        }
        std::array::from_fn(|r| softmax_step(&mut sts[r], accs[r], &scores[r], vmax[r], groups))
    }

    /// The end of step 1 for group `g` of a tile's rows (`raw[r]`: row `r`'s unscaled scores of
    /// positions `8g..8g + 8`): scaled, positions at or past `valid` set to −∞ (weight exactly
    /// 0, never the maximum), stored into `scores[r]` and folded into the lane maxima `vmax[r]`.
    /// Shared by the 256-bit and 512-bit score loops.
    #[target_feature(enable = "avx2,fma,f16c")]
    #[inline]
    fn store_group_scores<const R: usize>(
        raw: [__m256; R],
        g: usize,
        valid: usize,
        scale: f32,
        scores: &mut [[f32; TILE_POSITIONS]; R],
        vmax: &mut [__m256; R],
    ) {
        let lane_ids = _mm256_setr_ps(0.0, 1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0);
        let live = _mm256_cmp_ps::<_CMP_LT_OQ>(lane_ids, _mm256_set1_ps((valid - 8 * g) as f32));
        for (r, s) in raw.into_iter().enumerate() {
            let s = _mm256_mul_ps(s, _mm256_set1_ps(scale));
            let s = _mm256_blendv_ps(_mm256_set1_ps(f32::NEG_INFINITY), s, live);
            // SAFETY: `8g + 8 <= TILE_POSITIONS` (a tile's groups).
            unsafe { _mm256_storeu_ps(scores[r].as_mut_ptr().add(8 * g), s) };
            vmax[r] = _mm256_max_ps(vmax[r], s);
        }
    }

    /// [`tile_rows_weights`] with the eight positions of a group scored at once in 512-bit
    /// registers: accumulator `j` holds position `8g + j` in its low 256 bits and `8g + 4 + j`
    /// in its high 256 bits, so each 256-bit half runs exactly the lane chains of the 256-bit
    /// kernel (the query chunk broadcast to both halves), and the reduction is [`reduce4x8`]'s
    /// tree per half (its horizontal adds emulated by even/odd shuffles and one add: the same
    /// operands in the same order). Same bits as [`tile_rows_weights`].
    ///
    /// # Safety
    /// As [`tile_rows_impl`]; AVX-512 F+VL present.
    #[allow(clippy::needless_range_loop)]
    #[target_feature(enable = "avx2,fma,f16c,avx512f,avx512vl")]
    #[inline]
    unsafe fn tile_rows_weights512<E: TileElem, const R: usize>(
        sts: &mut [TileSoftmax; R],
        accs: &mut [&mut [f32]; R],
        qs: &[&[f32]; R],
        keys: &[E],
        valid: usize,
        scale: f32,
    ) -> [[f32; TILE_POSITIONS]; R] {
        let hd = qs[0].len();
        let chunks = hd / 8;
        let groups = valid.div_ceil(8);
        let kp = keys.as_ptr();
        let mut vmax = [_mm256_set1_ps(f32::NEG_INFINITY); R];
        let mut scores = [[0f32; TILE_POSITIONS]; R];
        // `hadd` of the 256-bit kernel on each 128-bit lane of two 512-bit vectors.
        let hadd = |a: __m512, b: __m512| {
            _mm512_add_ps(
                _mm512_shuffle_ps::<0x88>(a, b),
                _mm512_shuffle_ps::<0xDD>(a, b),
            )
        };
        for g in 0..groups {
            let mut a = [[_mm512_setzero_ps(); 4]; R];
            for c in 0..chunks {
                let q: [__m512; R] = std::array::from_fn(|r| {
                    // SAFETY: `c < hd / 8`, so `8c + 8 <= hd`.
                    let q8 = unsafe { _mm256_loadu_ps(qs[r].as_ptr().add(8 * c)) };
                    _mm512_castpd_ps(_mm512_broadcast_f64x4(_mm256_castps_pd(q8)))
                });
                for j in 0..4 {
                    // SAFETY: rows `8g + j` and `8g + 4 + j` are below `groups * 8`, which
                    // `keys` holds.
                    let kc = unsafe {
                        let lo = E::load8(kp.add((8 * g + j) * hd + 8 * c));
                        let hi = E::load8(kp.add((8 * g + 4 + j) * hd + 8 * c));
                        join256(lo, hi)
                    };
                    for r in 0..R {
                        a[r][j] = _mm512_fmadd_ps(q[r], kc, a[r][j]);
                    }
                }
            }
            let raw = std::array::from_fn(|r| {
                let x = hadd(hadd(a[r][0], a[r][1]), hadd(a[r][2], a[r][3]));
                // Per 256-bit half: low 128 + high 128 (`reduce4x8`'s last add).
                let y = _mm512_add_ps(x, _mm512_shuffle_f32x4::<0xB1>(x, x));
                // Positions `8g..8g + 4` sit in 128-bit block 0, `8g + 4..8g + 8` in block 2.
                _mm512_castps512_ps256(_mm512_shuffle_f32x4::<0x08>(y, y))
            });
            store_group_scores(raw, g, valid, scale, &mut scores, &mut vmax);
        }
        std::array::from_fn(|r| softmax_step(&mut sts[r], accs[r], &scores[r], vmax[r], groups))
    }

    /// `[lo | hi]` as one 512-bit vector (AVX-512 F only: the 256-bit halves as f64 lanes).
    #[target_feature(enable = "avx512f")]
    #[inline]
    fn join256(lo: __m256, hi: __m256) -> __m512 {
        _mm512_castpd_ps(_mm512_insertf64x4::<1>(
            _mm512_castpd256_pd512(_mm256_castps_pd(lo)),
            _mm256_castps_pd(hi),
        ))
    }

    /// Step 4 of [`tile_rows_impl`]: `acc += p[t]·v[t]` in position order, `W` chunks of 8
    /// accumulators per row held in registers, each V load shared by the `R` rows.
    ///
    /// # Safety
    /// As [`tile_rows_impl`].
    #[allow(clippy::needless_range_loop)]
    #[target_feature(enable = "avx2,fma,f16c")]
    #[inline]
    unsafe fn tile_rows_values8<E: TileElem, const R: usize, const W: usize>(
        accs: &mut [&mut [f32]; R],
        p: &[[f32; TILE_POSITIONS]; R],
        vals: &[E],
        valid: usize,
    ) {
        let hd = accs[0].len();
        let chunks = hd / 8;
        let aps: [*mut f32; R] = std::array::from_fn(|r| accs[r].as_mut_ptr());
        let vp = vals.as_ptr();
        let mut c0 = 0;
        while c0 < chunks {
            let w = (chunks - c0).min(W);
            let mut acc = [[_mm256_setzero_ps(); W]; R];
            for r in 0..R {
                for (i, ai) in acc[r].iter_mut().enumerate().take(w) {
                    // SAFETY: chunk `c0 + i < chunks` lies inside the row's `acc`.
                    *ai = unsafe { _mm256_loadu_ps(aps[r].add(8 * (c0 + i))) };
                }
            }
            for t in 0..valid {
                let bp: [__m256; R] = std::array::from_fn(|r| _mm256_set1_ps(p[r][t]));
                for i in 0..w {
                    // SAFETY: row `t < valid`, chunk `c0 + i < chunks` (caller's contract).
                    let x = unsafe { E::load8(vp.add(t * hd + 8 * (c0 + i))) };
                    for r in 0..R {
                        acc[r][i] = _mm256_fmadd_ps(bp[r], x, acc[r][i]);
                    }
                }
            }
            for r in 0..R {
                for (i, ai) in acc[r].iter().enumerate().take(w) {
                    // SAFETY: as above.
                    unsafe { _mm256_storeu_ps(aps[r].add(8 * (c0 + i)), *ai) };
                }
            }
            c0 += w;
        }
    }

    /// [`tile_rows_impl`] with K and V rows read through [`ValueRows`] (plain rows, or codes
    /// decoded in the register by `flash_tile_codes`: the same values, so the same bits).
    ///
    /// # Safety
    /// AVX2+FMA+F16C present; `qs[r]`, `accs[r]` hold `hd` (a multiple of 8) floats; `keys`
    /// holds `ceil(valid/8)·8` rows of `hd`, `vals` `valid` rows; `1 <= valid <= 16`.
    #[allow(clippy::too_many_arguments, clippy::needless_range_loop)]
    #[target_feature(enable = "avx2,fma,f16c")]
    #[inline]
    pub(crate) unsafe fn tile_rows_values<
        K: ValueRows,
        V: ValueRows,
        const R: usize,
        const W: usize,
    >(
        sts: &mut [TileSoftmax; R],
        accs: &mut [&mut [f32]; R],
        qs: &[&[f32]; R],
        keys: K,
        vals: V,
        valid: usize,
        scale: f32,
    ) {
        let hd = qs[0].len();
        let chunks = hd / 8;
        let groups = valid.div_ceil(8);
        let vscale = _mm256_set1_ps(scale);
        let lane_ids = _mm256_setr_ps(0.0, 1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0);
        let mut vmax = [_mm256_set1_ps(f32::NEG_INFINITY); R];
        let mut scores = [[0f32; TILE_POSITIONS]; R];
        for g in 0..groups {
            let mut halves = [[_mm_setzero_ps(); 2]; R];
            for (h, half) in [0usize, 4].into_iter().enumerate() {
                let mut a = [[_mm256_setzero_ps(); 4]; R];
                for c in 0..chunks {
                    let mut q = [_mm256_setzero_ps(); R];
                    for (qr, src) in q.iter_mut().zip(qs) {
                        // SAFETY: `c < hd / 8`, so `8c + 8 <= hd`.
                        *qr = unsafe { _mm256_loadu_ps(src.as_ptr().add(8 * c)) };
                    }
                    for j in 0..4 {
                        // SAFETY: row `8g + half + j < groups * 8`, which `keys` holds.
                        let kc = unsafe { keys.load8(8 * g + half + j, 8 * c) };
                        for r in 0..R {
                            a[r][j] = _mm256_fmadd_ps(q[r], kc, a[r][j]);
                        }
                    }
                }
                for r in 0..R {
                    halves[r][h] = reduce4x8(&a[r]);
                }
            }
            let limit = _mm256_set1_ps((valid - 8 * g) as f32);
            let live = _mm256_cmp_ps::<_CMP_LT_OQ>(lane_ids, limit);
            for r in 0..R {
                let s = _mm256_set_m128(halves[r][1], halves[r][0]);
                let s = _mm256_mul_ps(s, vscale);
                // Lanes at or past `valid` become −∞ (weight exactly 0, never the maximum).
                let s = _mm256_blendv_ps(_mm256_set1_ps(f32::NEG_INFINITY), s, live);
                // SAFETY: `8g + 8 <= groups * 8 <= TILE_POSITIONS`.
                unsafe { _mm256_storeu_ps(scores[r].as_mut_ptr().add(8 * g), s) };
                vmax[r] = _mm256_max_ps(vmax[r], s);
            }
        }
        // SAFETY: forwarded caller's contract (`vals` holds `valid` rows of `hd`).
        unsafe { finish_rows::<_, R, W>(sts, accs, &scores, &vmax, vals, valid) };
    }

    /// A tile's V rows as the shared `p·V` loop of [`finish_rows`] reads them: eight values of
    /// row `t` from element `e` as f32 lanes (plain rows widen on load; `flash_tile_codes`
    /// decodes integer codes in the register).
    ///
    /// A row is opened once ([`ValueRows::row`]: what its loads share, e.g. a coded row's scale
    /// and offset) and read eight elements at a time ([`ValueRows::load8_in`]).
    pub(crate) trait ValueRows: Copy {
        /// What the loads of one row share.
        type Row: Copy;

        /// # Safety
        /// AVX2+FMA+F16C present; the tile holds row `t`.
        unsafe fn row(self, t: usize) -> Self::Row;

        /// # Safety
        /// AVX2+FMA+F16C present; `row` opened by [`ValueRows::row`] of a row that holds
        /// elements `e..e + 8`.
        unsafe fn load8_in(self, row: Self::Row, e: usize) -> __m256;

        /// # Safety
        /// AVX2+FMA+F16C present; row `t` of the tile holds elements `e..e + 8`.
        #[inline]
        #[target_feature(enable = "avx2,fma,f16c")]
        unsafe fn load8(self, t: usize, e: usize) -> __m256 {
            // SAFETY: forwarded caller's contract.
            unsafe { self.load8_in(self.row(t), e) }
        }
    }

    /// Row-major rows of `hd` elements at `p`.
    #[derive(Clone, Copy)]
    pub(crate) struct ElemRows<E: TileElem> {
        pub p: *const E,
        pub hd: usize,
    }

    impl<E: TileElem> ValueRows for ElemRows<E> {
        type Row = *const E;

        #[inline]
        #[target_feature(enable = "avx2,fma,f16c")]
        unsafe fn row(self, t: usize) -> *const E {
            // SAFETY: row `t` lies in the tile (caller's contract).
            unsafe { self.p.add(t * self.hd) }
        }

        #[inline]
        #[target_feature(enable = "avx2,fma,f16c")]
        unsafe fn load8_in(self, row: *const E, e: usize) -> __m256 {
            // SAFETY: forwarded caller's contract.
            unsafe { E::load8(row.add(e)) }
        }
    }

    /// Steps 2–4 of the module doc for `R` rows sharing `valid`, each with its scores (−∞ at
    /// and past `valid`) and lane maxima `vmax`: every row's arithmetic that of [`finish`]
    /// (softmax step, then `acc = fma(p[t], v[t], acc)` for `t` in order), every V load shared
    /// by the rows; `W` chunks of 8 accumulators per row are held in registers.
    ///
    /// # Safety
    /// AVX2+FMA+F16C present; every `accs[r]` holds `hd` (a multiple of 8) floats; `vals`
    /// holds `valid` rows of `hd`.
    #[allow(clippy::needless_range_loop)]
    #[target_feature(enable = "avx2,fma,f16c")]
    #[inline]
    pub(crate) unsafe fn finish_rows<V: ValueRows, const R: usize, const W: usize>(
        sts: &mut [TileSoftmax; R],
        accs: &mut [&mut [f32]; R],
        scores: &[[f32; TILE_POSITIONS]; R],
        vmax: &[__m256; R],
        vals: V,
        valid: usize,
    ) {
        let chunks = accs[0].len() / 8;
        let groups = valid.div_ceil(8);
        let mut p = [[0f32; TILE_POSITIONS]; R];
        for r in 0..R {
            p[r] = softmax_step(&mut sts[r], accs[r], &scores[r], vmax[r], groups);
        }
        let aps: [*mut f32; R] = std::array::from_fn(|r| accs[r].as_mut_ptr());
        // Whole blocks of `W` chunks, then single chunks: every block's width is a constant, so
        // its accumulators live in registers (a width known only at run time kept them in
        // memory). Each element's chain is the same either way.
        let mut c0 = 0;
        while c0 + W <= chunks {
            // SAFETY: chunks `c0..c0 + W` lie inside every row (forwarded caller's contract).
            unsafe { pv_block::<V, R, W>(&aps, 8 * c0, &p, vals, valid) };
            c0 += W;
        }
        while c0 < chunks {
            // SAFETY: chunk `c0 < chunks`, as above.
            unsafe { pv_block::<V, R, 1>(&aps, 8 * c0, &p, vals, valid) };
            c0 += 1;
        }
    }

    /// `acc[e0..e0 + 8W] = fma(p[t], v[t][e0..e0 + 8W], acc)` for `t < valid` in order, for
    /// each of `R` rows, every V load shared by the rows and the `R · W` accumulators held in
    /// registers.
    ///
    /// # Safety
    /// AVX2+FMA+F16C present; `aps[r] + e0` holds `8W` floats for every row; `vals` holds
    /// elements `e0..e0 + 8W` of rows `t < valid`.
    #[allow(clippy::needless_range_loop)]
    #[target_feature(enable = "avx2,fma,f16c")]
    #[inline]
    unsafe fn pv_block<V: ValueRows, const R: usize, const W: usize>(
        aps: &[*mut f32; R],
        e0: usize,
        p: &[[f32; TILE_POSITIONS]; R],
        vals: V,
        valid: usize,
    ) {
        let mut acc = [[_mm256_setzero_ps(); W]; R];
        for r in 0..R {
            for i in 0..W {
                // SAFETY: caller's contract.
                acc[r][i] = unsafe { _mm256_loadu_ps(aps[r].add(e0 + 8 * i)) };
            }
        }
        for t in 0..valid {
            let mut bp = [_mm256_setzero_ps(); R];
            for r in 0..R {
                bp[r] = _mm256_set1_ps(p[r][t]);
            }
            // SAFETY: row `t < valid` (caller's contract).
            let row = unsafe { vals.row(t) };
            for i in 0..W {
                // SAFETY: elements `e0 + 8i..+8` of row `t` (caller's contract).
                let x = unsafe { vals.load8_in(row, e0 + 8 * i) };
                for r in 0..R {
                    acc[r][i] = _mm256_fmadd_ps(bp[r], x, acc[r][i]);
                }
            }
        }
        for r in 0..R {
            for i in 0..W {
                // SAFETY: caller's contract.
                unsafe { _mm256_storeu_ps(aps[r].add(e0 + 8 * i), acc[r][i]) };
            }
        }
    }

    /// [`tile_rows_impl`] for three rows with AVX2's 16 vector registers.
    ///
    /// # Safety
    /// As [`tile_rows_impl`]; AVX2+FMA+F16C present.
    #[allow(clippy::too_many_arguments)]
    #[target_feature(enable = "avx2,fma,f16c")]
    pub(super) unsafe fn tile_rows3<E: TileElem>(
        sts: &mut [TileSoftmax; 3],
        accs: &mut [&mut [f32]; 3],
        qs: &[&[f32]; 3],
        keys: &[E],
        vals: &[E],
        valid: usize,
        scale: f32,
    ) {
        prefetch_next_tile(keys, vals, qs[0].len());
        // SAFETY: forwarded caller's contract.
        unsafe { tile_rows_impl::<E, 3, 4>(sts, accs, qs, keys, vals, valid, scale) }
    }

    /// Tiles ahead of the one being scored whose K and V rows a three-row decode step prefetches.
    const PREFETCH_TILES: usize = 1;

    /// Prefetches (to L1) the K and V rows [`PREFETCH_TILES`] tiles past `keys` and `vals`: a
    /// decode streams each (layer, KV head) run of the cache once, and its softmax chain keeps
    /// too few loads in flight for the hardware prefetcher alone (measured: +10–17% decode at
    /// depth 4096). Where the tile was copied to a scratch, or the next tile lies in a block
    /// elsewhere (the paged store prefetches that block itself), the addresses are unrelated
    /// memory: a prefetch never faults and changes no result.
    #[inline(always)]
    fn prefetch_next_tile<E: TileElem>(keys: &[E], vals: &[E], hd: usize) {
        let bytes = TILE_POSITIONS * hd * std::mem::size_of::<E>();
        let ahead = PREFETCH_TILES * bytes;
        super::prefetch_l1(keys.as_ptr().cast::<u8>().wrapping_add(ahead), bytes);
        super::prefetch_l1(vals.as_ptr().cast::<u8>().wrapping_add(ahead), bytes);
    }

    /// [`tile_rows_impl`] for three rows with AVX-512: the same 256-bit score and softmax
    /// operations (32 vector registers), `p·V` in 512-bit registers when `hd` is a multiple of
    /// 16 (the same lane-wise operations): the same bits as [`tile_rows3`].
    ///
    /// # Safety
    /// As [`tile_rows_impl`]; AVX2+FMA+F16C and AVX-512 F+VL present.
    #[allow(clippy::too_many_arguments)]
    #[target_feature(enable = "avx2,fma,f16c,avx512f,avx512vl")]
    pub(super) unsafe fn tile_rows3_avx512<E: TileElem>(
        sts: &mut [TileSoftmax; 3],
        accs: &mut [&mut [f32]; 3],
        qs: &[&[f32]; 3],
        keys: &[E],
        vals: &[E],
        valid: usize,
        scale: f32,
    ) {
        if !qs[0].len().is_multiple_of(16) {
            // SAFETY: forwarded caller's contract.
            return unsafe { tile_rows_impl::<E, 3, 8>(sts, accs, qs, keys, vals, valid, scale) };
        }
        prefetch_next_tile(keys, vals, qs[0].len());
        // SAFETY: forwarded caller's contract (AVX-512 F+VL present).
        let p = unsafe { tile_rows_weights512::<E, 3>(sts, accs, qs, keys, valid, scale) };
        // Step 4 in 512-bit registers: each element's `fma(p[t], v[t][e], acc[e])` in position
        // order is lane-wise, so the width changes no bit.
        // SAFETY: AVX-512 F present (caller's contract); `hd` is a multiple of 16 and `vals`
        // holds `valid` rows of `hd`.
        unsafe { values16::<E, 3>(accs, &p, valid, vals) };
    }

    /// Step 4 of a tile step (`flash_tile_wide`'s `finish`, the decode's three-row step):
    /// `acc += p[t]·v[t]` in position order, up to four vectors per row
    /// held in registers (constant block widths, so the accumulators never leave registers).
    ///
    /// # Safety
    /// AVX-512 F, AVX2, FMA, F16C present; every `accs[r]` holds a multiple of 16 floats;
    /// `vals` holds `valid <= 16` rows of that many.
    #[allow(clippy::needless_range_loop)]
    #[target_feature(enable = "avx512f,avx2,fma,f16c")]
    #[inline]
    pub(crate) unsafe fn values16<E: TileElem, const R: usize>(
        accs: &mut [&mut [f32]; R],
        p: &[[f32; TILE_POSITIONS]; R],
        valid: usize,
        vals: &[E],
    ) {
        let hd = accs[0].len();
        let aps: [*mut f32; R] = std::array::from_fn(|r| accs[r].as_mut_ptr());
        let vp = vals.as_ptr();
        let mut e0 = 0;
        while e0 + 64 <= hd {
            // SAFETY: elements `e0..e0 + 64 <= hd` of every accumulator and `vals` row.
            unsafe { pv::<E, R, 4>(&aps, vp, hd, e0, p, valid) };
            e0 += 64;
        }
        while e0 < hd {
            // SAFETY: elements `e0..e0 + 16 <= hd` (`hd` is a multiple of 16).
            unsafe { pv::<E, R, 1>(&aps, vp, hd, e0, p, valid) };
            e0 += 16;
        }
    }

    /// `acc_r[e0..e0 + 16W] = fma(p[r][t], v[t][e0..e0 + 16W], acc_r)` for `t < valid` in
    /// order, every row's `W` vectors held in registers and each V load shared by the rows.
    ///
    /// # Safety
    /// AVX-512 F present; `aps[r] + e0` holds `16W` floats; `vp + t·hd + e0` holds `16W` floats
    /// for every `t < valid <= 16`.
    #[allow(clippy::needless_range_loop)]
    #[target_feature(enable = "avx512f,avx2,fma,f16c")]
    #[inline]
    unsafe fn pv<E: TileElem, const R: usize, const W: usize>(
        aps: &[*mut f32; R],
        vp: *const E,
        hd: usize,
        e0: usize,
        p: &[[f32; TILE_POSITIONS]; R],
        valid: usize,
    ) {
        let mut acc = [[_mm512_setzero_ps(); W]; R];
        for r in 0..R {
            for i in 0..W {
                // SAFETY: caller's contract.
                acc[r][i] = unsafe { _mm512_loadu_ps(aps[r].add(e0 + 16 * i)) };
            }
        }
        for t in 0..valid {
            let bp: [__m512; R] = std::array::from_fn(|r| _mm512_set1_ps(p[r][t]));
            for i in 0..W {
                // SAFETY: caller's contract (row `t < valid`).
                let x = unsafe { E::load16(vp.add(t * hd + e0 + 16 * i)) };
                for r in 0..R {
                    acc[r][i] = _mm512_fmadd_ps(bp[r], x, acc[r][i]);
                }
            }
        }
        for r in 0..R {
            for i in 0..W {
                // SAFETY: caller's contract.
                unsafe { _mm512_storeu_ps(aps[r].add(e0 + 16 * i), acc[r][i]) };
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::{Rng, SeedableRng};

    #[test]
    fn exp_poly_is_accurate_and_exact_at_zero() {
        assert_eq!(exp_poly(0.0), 1.0);
        assert_eq!(exp_poly(f32::NEG_INFINITY), 0.0);
        assert_eq!(exp_poly(-100.0), 0.0);
        let mut worst = 0f64;
        let mut x = -87.0f32;
        while x <= 0.0 {
            let want = (x as f64).exp();
            let rel = ((exp_poly(x) as f64 - want) / want).abs();
            worst = worst.max(rel);
            x += 0.0137;
        }
        assert!(
            worst < 3.0 * f32::EPSILON as f64,
            "worst relative error {worst}"
        );
    }

    #[test]
    fn exp_lanes_match_the_scalar_function() {
        #[cfg(target_arch = "x86_64")]
        if CpuFeatures::detect().avx2 {
            use std::arch::x86_64::*;
            let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(5);
            for _ in 0..2000 {
                let xs: [f32; 8] = std::array::from_fn(|_| -rng.gen_range(0.0f32..95.0));
                let mut got = [0f32; 8];
                #[target_feature(enable = "avx2,fma")]
                fn run(xs: &[f32; 8], got: &mut [f32; 8]) {
                    // SAFETY: both arrays hold 8 floats.
                    unsafe {
                        let x = _mm256_loadu_ps(xs.as_ptr());
                        _mm256_storeu_ps(got.as_mut_ptr(), avx2::exp8_for_test(x));
                    }
                }
                // SAFETY: AVX2+FMA presence was checked at runtime above.
                unsafe { run(&xs, &mut got) };
                for (x, g) in xs.iter().zip(got) {
                    assert_eq!(exp_poly_portable(*x).to_bits(), g.to_bits(), "x={x}");
                    assert_eq!(exp_poly(*x).to_bits(), g.to_bits(), "x={x}");
                }
            }
        }
    }

    /// Softmax attention in f64 over `n` rows.
    fn exact(q: &[f32], ks: &[f32], vs: &[f32], n: usize, scale: f64) -> Vec<f64> {
        let hd = q.len();
        let s: Vec<f64> = (0..n)
            .map(|t| {
                (0..hd)
                    .map(|e| q[e] as f64 * ks[t * hd + e] as f64)
                    .sum::<f64>()
                    * scale
            })
            .collect();
        let m = s.iter().copied().fold(f64::NEG_INFINITY, f64::max);
        let z: f64 = s.iter().map(|x| (x - m).exp()).sum();
        (0..hd)
            .map(|e| {
                (0..n)
                    .map(|t| (s[t] - m).exp() / z * vs[t * hd + e] as f64)
                    .sum()
            })
            .collect()
    }

    fn run_tiles<E: TileElem>(
        features: CpuFeatures,
        q: &[f32],
        ks: &[E],
        vs: &[E],
        n: usize,
    ) -> Vec<f32> {
        let hd = q.len();
        let mut st = TileSoftmax::default();
        let mut acc = vec![0f32; hd];
        let mut kbuf = vec![E::default(); TILE_POSITIONS * hd];
        let mut vbuf = vec![E::default(); TILE_POSITIONS * hd];
        let mut t0 = 0;
        while t0 < n {
            let valid = (n - t0).min(TILE_POSITIONS);
            kbuf[..valid * hd].copy_from_slice(&ks[t0 * hd..(t0 + valid) * hd]);
            vbuf[..valid * hd].copy_from_slice(&vs[t0 * hd..(t0 + valid) * hd]);
            tile_update_with(features, &mut st, &mut acc, q, &kbuf, &vbuf, valid, 0.125);
            t0 += valid;
        }
        let mut out = vec![0f32; hd];
        merge_segments(std::iter::once((st, &acc[..])), &mut out);
        out
    }

    #[test]
    fn tiles_match_exact_attention_and_paths_agree_bitwise() {
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(17);
        for (hd, n) in [
            (64usize, 1usize),
            (64, 7),
            (64, 32),
            (64, 33),
            (128, 300),
            (8, 65),
            (72, 40),
        ] {
            let q: Vec<f32> = (0..hd).map(|_| rng.gen_range(-2.0f32..2.0)).collect();
            let ks: Vec<f32> = (0..n * hd).map(|_| rng.gen_range(-2.0f32..2.0)).collect();
            let vs: Vec<f32> = (0..n * hd).map(|_| rng.gen_range(-3.0f32..3.0)).collect();
            // K/V exactly representable in f16, so the f16 tiles must give the same bits.
            let ks: Vec<f32> = ks.iter().map(|&x| f16::from_f32(x).to_f32()).collect();
            let vs: Vec<f32> = vs.iter().map(|&x| f16::from_f32(x).to_f32()).collect();
            let want = exact(&q, &ks, &vs, n, 0.125);
            let portable = run_tiles(CpuFeatures::PORTABLE, &q, &ks, &vs, n);
            let native = run_tiles(CpuFeatures::detect(), &q, &ks, &vs, n);
            let ks16: Vec<f16> = ks.iter().map(|&x| f16::from_f32(x)).collect();
            let vs16: Vec<f16> = vs.iter().map(|&x| f16::from_f32(x)).collect();
            let native16 = run_tiles(CpuFeatures::detect(), &q, &ks16, &vs16, n);
            let portable16 = run_tiles(CpuFeatures::PORTABLE, &q, &ks16, &vs16, n);
            let mut widened = vec![0f32; ks16.len()];
            widen_f16(&ks16, &mut widened);
            assert_eq!(widened, ks);
            for e in 0..hd {
                assert!(
                    (portable[e] as f64 - want[e]).abs() < 1e-4,
                    "hd={hd} n={n} e={e}"
                );
                assert_eq!(
                    portable[e].to_bits(),
                    native[e].to_bits(),
                    "hd={hd} n={n} e={e}"
                );
                assert_eq!(
                    native16[e].to_bits(),
                    native[e].to_bits(),
                    "hd={hd} n={n} e={e}"
                );
                assert_eq!(
                    portable16[e].to_bits(),
                    native[e].to_bits(),
                    "hd={hd} n={n} e={e}"
                );
            }
        }
    }

    /// Every path's three-row kernel against three single-row portable steps, over several
    /// tiles (so the running state and rescaling are exercised), f32 and f16 tiles.
    #[test]
    #[allow(clippy::needless_range_loop)]
    fn three_row_tiles_match_single_rows_bitwise_on_every_path() {
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(23);
        let paths = [
            CpuFeatures::PORTABLE,
            CpuFeatures::AVX2,
            CpuFeatures::detect(),
        ];
        for (hd, valids) in [
            (64usize, vec![16usize, 16, 9, 1]),
            (72, vec![16, 8, 16]),
            (8, vec![3, 16]),
            (128, vec![16, 15, 16]),
            (80, vec![16, 11, 16]),
        ] {
            let qs: Vec<Vec<f32>> = (0..TILE_ROWS)
                .map(|_| {
                    (0..hd)
                        .map(|_| f16::from_f32(rng.gen_range(-2.0f32..2.0)).to_f32())
                        .collect()
                })
                .collect();
            let tiles: Vec<(Vec<f16>, Vec<f16>)> = valids
                .iter()
                .map(|_| {
                    let mut gen = |s: f32| -> Vec<f16> {
                        (0..TILE_POSITIONS * hd)
                            .map(|_| f16::from_f32(rng.gen_range(-s..s)))
                            .collect()
                    };
                    (gen(3.0), gen(2.0))
                })
                .collect();
            // Reference: one row at a time, portable.
            let mut want_st = [TileSoftmax::default(); TILE_ROWS];
            let mut want_acc = vec![vec![0f32; hd]; TILE_ROWS];
            for ((k, v), &valid) in tiles.iter().zip(&valids) {
                for r in 0..TILE_ROWS {
                    tile_update_with(
                        CpuFeatures::PORTABLE,
                        &mut want_st[r],
                        &mut want_acc[r],
                        &qs[r],
                        k,
                        v,
                        valid,
                        0.125,
                    );
                }
            }
            for features in paths {
                for widened in [false, true] {
                    let mut sts = [TileSoftmax::default(); TILE_ROWS];
                    let mut accs = vec![vec![0f32; hd]; TILE_ROWS];
                    for ((k, v), &valid) in tiles.iter().zip(&valids) {
                        let [a, b, c] = &mut accs[..] else {
                            unreachable!()
                        };
                        let mut acc_refs = [&mut a[..], &mut b[..], &mut c[..]];
                        let q_refs = [&qs[0][..], &qs[1][..], &qs[2][..]];
                        if widened {
                            let k32: Vec<f32> = k.iter().map(|x| x.to_f32()).collect();
                            let v32: Vec<f32> = v.iter().map(|x| x.to_f32()).collect();
                            tile_update_rows_with(
                                features,
                                &mut sts,
                                &mut acc_refs,
                                &q_refs,
                                &k32,
                                &v32,
                                valid,
                                0.125,
                            );
                        } else {
                            tile_update_rows_with(
                                features,
                                &mut sts,
                                &mut acc_refs,
                                &q_refs,
                                k,
                                v,
                                valid,
                                0.125,
                            );
                        }
                    }
                    for r in 0..TILE_ROWS {
                        assert_eq!(sts[r], want_st[r], "{features:?} hd={hd} row {r}");
                        let bits = |x: &[f32]| x.iter().map(|v| v.to_bits()).collect::<Vec<_>>();
                        assert_eq!(
                            bits(&accs[r]),
                            bits(&want_acc[r]),
                            "{features:?} widened={widened} hd={hd} row {r}"
                        );
                    }
                }
            }
        }
    }

    #[test]
    fn segments_merge_to_the_unsplit_result() {
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(18);
        let (hd, n) = (64, 200);
        let q: Vec<f32> = (0..hd).map(|_| rng.gen_range(-2.0f32..2.0)).collect();
        let ks: Vec<f32> = (0..n * hd).map(|_| rng.gen_range(-2.0f32..2.0)).collect();
        let vs: Vec<f32> = (0..n * hd).map(|_| rng.gen_range(-3.0f32..3.0)).collect();
        let want = exact(&q, &ks, &vs, n, 0.125);
        // Three segments of 64, 64 and 72 positions.
        let mut states = Vec::new();
        for (a, b) in [(0, 64), (64, 128), (128, 200)] {
            let mut st = TileSoftmax::default();
            let mut acc = vec![0f32; hd];
            let mut t0 = a;
            while t0 < b {
                let valid = (b - t0).min(TILE_POSITIONS);
                let mut kbuf = vec![0f32; TILE_POSITIONS * hd];
                kbuf[..valid * hd].copy_from_slice(&ks[t0 * hd..(t0 + valid) * hd]);
                tile_update(&mut st, &mut acc, &q, &kbuf, &vs[t0 * hd..], valid, 0.125);
                t0 += valid;
            }
            states.push((st, acc));
        }
        let mut out = vec![0f32; hd];
        merge_segments(states.iter().map(|(s, a)| (*s, &a[..])), &mut out);
        for e in 0..hd {
            assert!((out[e] as f64 - want[e]).abs() < 1e-4, "e={e}");
        }
    }
}
