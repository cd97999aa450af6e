//! The three vector primitives of ggml's CPU flash attention over an f16 K/V cache
//! (`ggml_compute_forward_flash_attn_ext_f16_one_chunk` in llama.cpp's `ggml-cpu/ops.cpp`), with
//! ggml's exact operation order so our attention rounds the way llama.cpp's does:
//!
//! - [`dot_f16`]: `ggml_vec_dot_f16` (`vec.cpp`): both operands f16, four 8-lane f32 accumulators
//!   fed by fused multiply-adds over 32-element strides, reduced as `(a0 + a2) + (a1 + a3)`, then
//!   `lo128 + hi128` and two horizontal adds; leftovers (`n % 32`) summed in f64.
//! - [`mad_f16`]: `ggml_vec_mad_f16`: `y[i] = f16(fma(x[i], v, y[i]))` — the accumulator is f16.
//! - [`scale_f16`]: `ggml_vec_scale_f16`: `y[i] = f16(y[i] * v)`.
//!
//! [`accumulate_rows`] runs the whole online-softmax loop of that kernel over a run of K/V rows
//! (one dispatch per run, so the per-position work inlines): `s = dot(q, k) * scale`; on a new
//! maximum `M` the accumulator is scaled by `ms = expf(M_old - s)` and `vs = 1`, otherwise
//! `vs = expf(s - M)`; then `acc += v * vs` and `S = fma(S, ms, vs)`. With `round_f16 == false`
//! the accumulator stays f32 (no rounding), everything else unchanged. The query is taken as
//! given (f32): callers pass it rounded to f16 for ggml's arithmetic, or unrounded for the f32
//! arithmetic of llama.cpp's tiled prefill kernel.
//!
//! The f16 accumulator is held as f32 values that are exactly representable in f16. The AVX2
//! path, the AVX-512 path of [`accumulate_rows`] (head sizes 64, 128, 256: the accumulator in
//! 512-bit registers) and the portable path perform the same IEEE operations and agree bit for
//! bit (tests pin this). It never allocates and never parallelises.

use half::f16;

use super::cpu::{cpu_features, CpuFeatures};

#[inline(always)]
fn round16(x: f32) -> f32 {
    f16::from_f32(x).to_f32()
}

/// Running maximum and sum of ggml's online softmax for one query row.
#[derive(Debug, Clone, Copy)]
pub struct OnlineSoftmax {
    pub max: f32,
    pub sum: f32,
}

impl Default for OnlineSoftmax {
    fn default() -> Self {
        OnlineSoftmax {
            max: f32::NEG_INFINITY,
            sum: 0.0,
        }
    }
}

impl OnlineSoftmax {
    /// The `(ms, vs)` factors for score `s`, updating the maximum.
    #[inline(always)]
    fn factors(&mut self, s: f32) -> (f32, f32) {
        if s > self.max {
            let ms = (self.max - s).exp();
            self.max = s;
            (ms, 1.0)
        } else {
            (1.0, (s - self.max).exp())
        }
    }
}

/// The online-softmax loop over `keys`/`vals` (`[n, head_dim]` each, `head_dim = q.len() =
/// acc.len()`): see the module doc. `q` holds the query already rounded to f16 (as f32 values).
/// Panics on a shape mismatch.
#[inline]
pub fn accumulate_rows(
    st: &mut OnlineSoftmax,
    acc: &mut [f32],
    q: &[f32],
    keys: &[f16],
    vals: &[f16],
    scale: f32,
    round_f16: bool,
) {
    accumulate_rows_with(cpu_features(), st, acc, q, keys, vals, scale, round_f16)
}

/// [`accumulate_rows`] on an explicit path.
#[allow(clippy::too_many_arguments)]
pub fn accumulate_rows_with(
    features: CpuFeatures,
    st: &mut OnlineSoftmax,
    acc: &mut [f32],
    q: &[f32],
    keys: &[f16],
    vals: &[f16],
    scale: f32,
    round_f16: bool,
) {
    let hd = q.len();
    assert!(
        hd > 0 && acc.len() == hd && keys.len() == vals.len() && keys.len().is_multiple_of(hd),
        "keys and vals are whole [head_dim] rows"
    );
    #[cfg(target_arch = "x86_64")]
    if features.clamp_to_detected().avx512 && avx512::head_dim_supported(hd) {
        // SAFETY: AVX-512 F (and AVX2+FMA+F16C) presence was checked at runtime just above.
        unsafe {
            if round_f16 {
                avx512::accumulate_rows::<true>(st, acc, q, keys, vals, scale)
            } else {
                avx512::accumulate_rows::<false>(st, acc, q, keys, vals, scale)
            }
        }
        return;
    }
    #[cfg(target_arch = "x86_64")]
    if features.clamp_to_detected().avx2 {
        // SAFETY: AVX2+FMA+F16C presence was checked at runtime just above.
        unsafe {
            if round_f16 {
                avx2::accumulate_rows::<true>(st, acc, q, keys, vals, scale)
            } else {
                avx2::accumulate_rows::<false>(st, acc, q, keys, vals, scale)
            }
        }
        return;
    }
    let _ = features;
    let p = CpuFeatures::PORTABLE;
    for (k, v) in keys.chunks_exact(hd).zip(vals.chunks_exact(hd)) {
        let (ms, vs) = st.factors(dot_wide(q, k) * scale);
        if round_f16 {
            if ms != 1.0 {
                scale_f16_with(p, acc, ms);
            }
            mad_f16_with(p, acc, v, vs);
        } else {
            if ms != 1.0 {
                acc.iter_mut().for_each(|a| *a *= ms);
            }
            for (a, x) in acc.iter_mut().zip(v) {
                *a = x.to_f32().mul_add(vs, *a);
            }
        }
        st.sum = st.sum.mul_add(ms, vs);
    }
}

/// `Σ q[i] * k[i]` for an f32 query and f16 keys in [`dot_f16`]'s order (the portable twin of the
/// AVX2 `dot_wide`); for a query already rounded to f16 it equals `dot_f16` of the two.
fn dot_wide(q: &[f32], k: &[f16]) -> f32 {
    let n = q.len().min(k.len());
    let np = n & !31;
    let mut acc = [[0f32; 8]; 4];
    for i in (0..np).step_by(32) {
        for (j, accj) in acc.iter_mut().enumerate() {
            for (l, lane) in accj.iter_mut().enumerate() {
                let e = i + 8 * j + l;
                *lane = q[e].mul_add(k[e].to_f32(), *lane);
            }
        }
    }
    let mut s = [0f32; 8];
    for (l, sl) in s.iter_mut().enumerate() {
        *sl = (acc[0][l] + acc[2][l]) + (acc[1][l] + acc[3][l]);
    }
    let t = [s[0] + s[4], s[1] + s[5], s[2] + s[6], s[3] + s[7]];
    let mut sum = f64::from((t[0] + t[1]) + (t[2] + t[3]));
    for (x, y) in q[np..n].iter().zip(&k[np..n]) {
        sum += f64::from(x * y.to_f32());
    }
    sum as f32
}

/// `Σ a[i] * b[i]` over f16 operands in `ggml_vec_dot_f16`'s order. Panics if lengths differ.
pub fn dot_f16(a: &[f16], b: &[f16]) -> f32 {
    dot_f16_with(cpu_features(), a, b)
}

/// [`dot_f16`] on an explicit path (`features` is clamped to what the CPU has).
pub fn dot_f16_with(features: CpuFeatures, a: &[f16], b: &[f16]) -> f32 {
    assert_eq!(a.len(), b.len(), "dot_f16 needs equal lengths");
    #[cfg(target_arch = "x86_64")]
    if features.clamp_to_detected().avx2 {
        // SAFETY: AVX2+FMA+F16C presence was checked at runtime just above.
        return unsafe { avx2::dot(a, b) };
    }
    let _ = features;
    let n = a.len();
    let np = n & !31;
    let mut acc = [[0f32; 8]; 4];
    for i in (0..np).step_by(32) {
        for (j, accj) in acc.iter_mut().enumerate() {
            for (l, lane) in accj.iter_mut().enumerate() {
                let k = i + 8 * j + l;
                *lane = a[k].to_f32().mul_add(b[k].to_f32(), *lane);
            }
        }
    }
    let mut s = [0f32; 8];
    for (l, sl) in s.iter_mut().enumerate() {
        *sl = (acc[0][l] + acc[2][l]) + (acc[1][l] + acc[3][l]);
    }
    let t = [s[0] + s[4], s[1] + s[5], s[2] + s[6], s[3] + s[7]];
    finish_dot((t[0] + t[1]) + (t[2] + t[3]), &a[np..], &b[np..])
}

/// ggml's leftover loop: the SIMD sum and each f32 product of the tail added in f64.
#[inline(always)]
fn finish_dot(simd: f32, a: &[f16], b: &[f16]) -> f32 {
    let mut sum = f64::from(simd);
    for (x, y) in a.iter().zip(b) {
        sum += f64::from(x.to_f32() * y.to_f32());
    }
    sum as f32
}

/// `y[i] = f32(f16(fma(x[i], v, y[i])))`. Panics if lengths differ.
pub fn mad_f16(y: &mut [f32], x: &[f16], v: f32) {
    mad_f16_with(cpu_features(), y, x, v)
}

/// [`mad_f16`] on an explicit path.
pub fn mad_f16_with(features: CpuFeatures, y: &mut [f32], x: &[f16], v: f32) {
    assert_eq!(x.len(), y.len(), "mad_f16 needs equal lengths");
    #[cfg(target_arch = "x86_64")]
    if features.clamp_to_detected().avx2 {
        // SAFETY: AVX2+FMA+F16C presence was checked at runtime just above.
        unsafe { avx2::mad(y, x, v) };
        return;
    }
    let _ = features;
    for (yi, xi) in y.iter_mut().zip(x) {
        *yi = round16(xi.to_f32().mul_add(v, *yi));
    }
}

/// `y[i] = f32(f16(y[i] * v))`.
pub fn scale_f16(y: &mut [f32], v: f32) {
    scale_f16_with(cpu_features(), y, v)
}

/// [`scale_f16`] on an explicit path.
pub fn scale_f16_with(features: CpuFeatures, y: &mut [f32], v: f32) {
    #[cfg(target_arch = "x86_64")]
    if features.clamp_to_detected().avx2 {
        // SAFETY: AVX2+FMA+F16C presence was checked at runtime just above.
        unsafe { avx2::scale(y, v) };
        return;
    }
    let _ = features;
    for yi in y.iter_mut() {
        *yi = round16(*yi * v);
    }
}

#[cfg(target_arch = "x86_64")]
mod avx2 {
    //! AVX2 bodies; callers must have checked AVX2+FMA+F16C at runtime.
    use super::super::vec_f16::avx2::{axpy, load8};
    use half::f16;
    use std::arch::x86_64::*;

    /// Rounds 8 lanes to f16 and back (round to nearest even).
    #[target_feature(enable = "avx2,fma,f16c")]
    #[inline]
    fn round8(v: __m256) -> __m256 {
        _mm256_cvtph_ps(_mm256_cvtps_ph::<_MM_FROUND_TO_NEAREST_INT>(v))
    }

    /// `ggml_vec_dot_f16` with the first operand already widened (exact) to f32.
    ///
    /// # Safety
    /// `a` and `b` hold at least `n` elements.
    #[target_feature(enable = "avx2,fma,f16c")]
    #[inline]
    unsafe fn dot_wide(a: *const f32, b: *const f16, n: usize) -> f32 {
        let np = n & !31;
        let mut acc = [_mm256_setzero_ps(); 4];
        let mut i = 0;
        while i < np {
            for (j, accj) in acc.iter_mut().enumerate() {
                // SAFETY: `i + 8 * j + 8 <= np <= n`; the caller guarantees `n` elements.
                let (x, y) =
                    unsafe { (_mm256_loadu_ps(a.add(i + 8 * j)), load8(b.add(i + 8 * j))) };
                *accj = _mm256_fmadd_ps(x, y, *accj);
            }
            i += 32;
        }
        let r = reduce(acc);
        let mut sum = f64::from(r);
        while i < n {
            // SAFETY: `i < n`.
            sum += f64::from(unsafe { *a.add(i) * (*b.add(i)).to_f32() });
            i += 1;
        }
        sum as f32
    }

    /// GGML_F32x8_REDUCE: pairs at distance 2, then 1, then halves and two hadds.
    #[target_feature(enable = "avx2,fma,f16c")]
    #[inline]
    fn reduce(acc: [__m256; 4]) -> f32 {
        let s = _mm256_add_ps(_mm256_add_ps(acc[0], acc[2]), _mm256_add_ps(acc[1], acc[3]));
        let t0 = _mm_add_ps(_mm256_castps256_ps128(s), _mm256_extractf128_ps(s, 1));
        let t1 = _mm_hadd_ps(t0, t0);
        _mm_cvtss_f32(_mm_hadd_ps(t1, t1))
    }

    #[target_feature(enable = "avx2,fma,f16c")]
    pub(super) fn accumulate_rows<const ROUND: bool>(
        st: &mut super::OnlineSoftmax,
        acc: &mut [f32],
        q: &[f32],
        keys: &[f16],
        vals: &[f16],
        kq_scale: f32,
    ) {
        let hd = q.len().min(acc.len());
        // Head sizes of 64 and 128 keep the accumulator in registers across the run.
        if hd == 64 && acc.len() == 64 {
            // SAFETY: `acc` holds 64 elements; `keys`/`vals` are whole rows of `hd` (checked by
            // `accumulate_rows_with`).
            unsafe { accumulate_rows_reg::<ROUND, 8>(st, acc, q, keys, vals, kq_scale) };
            return;
        }
        if hd == 128 && acc.len() == 128 {
            // SAFETY: as above with 128.
            unsafe { accumulate_rows_reg::<ROUND, 16>(st, acc, q, keys, vals, kq_scale) };
            return;
        }
        // Scores do not depend on the running state: compute a group of them first (independent
        // dot products pipeline well), then run the sequential online update over the group.
        const GROUP: usize = 16;
        let mut scores = [0f32; GROUP];
        for (kg, vg) in keys.chunks(GROUP * hd).zip(vals.chunks(GROUP * hd)) {
            for (sc, k) in scores.iter_mut().zip(kg.chunks_exact(hd)) {
                // SAFETY: `q` and `k` hold `hd` elements.
                *sc = unsafe { dot_wide(q.as_ptr(), k.as_ptr(), hd) } * kq_scale;
            }
            for (&s, v) in scores.iter().zip(vg.chunks_exact(hd)) {
                let (ms, vs) = st.factors(s);
                if ms != 1.0 {
                    if ROUND {
                        scale(acc, ms);
                    } else {
                        acc.iter_mut().for_each(|a| *a *= ms);
                    }
                }
                if ROUND {
                    mad(acc, v, vs);
                } else {
                    axpy(vs, v, acc);
                }
                st.sum = st.sum.mul_add(ms, vs);
            }
        }
    }

    /// [`accumulate_rows`] for a head of `8 * C` elements with the accumulator held in `C`
    /// registers across the whole run: per element exactly the operations of `scale`/`mad`
    /// (`ROUND`) or of the f32 scaling and `axpy` (not `ROUND`), in the same order, so the
    /// result is bit-identical to the in-memory loop.
    ///
    /// # Safety
    /// `acc` and `q` hold `8 * C` elements, `keys` and `vals` whole rows of `8 * C`.
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn accumulate_rows_reg<const ROUND: bool, const C: usize>(
        st: &mut super::OnlineSoftmax,
        acc: &mut [f32],
        q: &[f32],
        keys: &[f16],
        vals: &[f16],
        kq_scale: f32,
    ) {
        let hd = 8 * C;
        let ap = acc.as_mut_ptr();
        let mut a = [_mm256_setzero_ps(); C];
        for (c, ac) in a.iter_mut().enumerate() {
            // SAFETY: `8c + 8 <= hd = acc.len()`.
            *ac = unsafe { _mm256_loadu_ps(ap.add(8 * c)) };
        }
        const GROUP: usize = 16;
        let mut scores = [0f32; GROUP];
        for (kg, vg) in keys.chunks(GROUP * hd).zip(vals.chunks(GROUP * hd)) {
            for (sc, k) in scores.iter_mut().zip(kg.chunks_exact(hd)) {
                // SAFETY: `q` and `k` hold `hd` elements.
                *sc = unsafe { dot_wide(q.as_ptr(), k.as_ptr(), hd) } * kq_scale;
            }
            for (&s, v) in scores.iter().zip(vg.chunks_exact(hd)) {
                let (ms, vs) = st.factors(s);
                if ms != 1.0 {
                    let vm = _mm256_set1_ps(ms);
                    for ac in a.iter_mut() {
                        let x = _mm256_mul_ps(*ac, vm);
                        *ac = if ROUND { round8(x) } else { x };
                    }
                }
                let vv = _mm256_set1_ps(vs);
                let vp = v.as_ptr();
                for (c, ac) in a.iter_mut().enumerate() {
                    // SAFETY: `v` holds `hd` elements, `8c + 8 <= hd`.
                    let xv = unsafe { load8(vp.add(8 * c)) };
                    *ac = if ROUND {
                        round8(_mm256_fmadd_ps(xv, vv, *ac))
                    } else {
                        _mm256_fmadd_ps(vv, xv, *ac)
                    };
                }
                st.sum = st.sum.mul_add(ms, vs);
            }
        }
        for (c, ac) in a.iter().enumerate() {
            // SAFETY: as at the load above.
            unsafe { _mm256_storeu_ps(ap.add(8 * c), *ac) };
        }
    }

    #[target_feature(enable = "avx2,fma,f16c")]
    pub(super) fn dot(a: &[f16], b: &[f16]) -> f32 {
        let n = a.len().min(b.len());
        let np = n & !31;
        let (pa, pb) = (a.as_ptr(), b.as_ptr());
        let mut acc = [_mm256_setzero_ps(); 4];
        let mut i = 0;
        while i < np {
            for (j, accj) in acc.iter_mut().enumerate() {
                // SAFETY: `i + 8 * j + 8 <= np <= n` and both slices hold at least `n` elements.
                let (x, y) = unsafe { (load8(pa.add(i + 8 * j)), load8(pb.add(i + 8 * j))) };
                *accj = _mm256_fmadd_ps(x, y, *accj);
            }
            i += 32;
        }
        super::finish_dot(reduce(acc), &a[np..n], &b[np..n])
    }

    #[target_feature(enable = "avx2,fma,f16c")]
    #[inline]
    pub(super) fn mad(y: &mut [f32], x: &[f16], v: f32) {
        let n = x.len().min(y.len());
        let vv = _mm256_set1_ps(v);
        let mut i = 0;
        while i + 8 <= n {
            // SAFETY: `i + 8 <= n` and both slices hold at least `n` elements.
            unsafe {
                let xv = load8(x.as_ptr().add(i));
                let yv = _mm256_loadu_ps(y.as_ptr().add(i));
                _mm256_storeu_ps(y.as_mut_ptr().add(i), round8(_mm256_fmadd_ps(xv, vv, yv)));
            }
            i += 8;
        }
        while i < n {
            y[i] = super::round16(x[i].to_f32().mul_add(v, y[i]));
            i += 1;
        }
    }

    #[target_feature(enable = "avx2,fma,f16c")]
    #[inline]
    pub(super) fn scale(y: &mut [f32], v: f32) {
        let n = y.len();
        let vv = _mm256_set1_ps(v);
        let mut i = 0;
        while i + 8 <= n {
            // SAFETY: `i + 8 <= n = y.len()`.
            unsafe {
                let yv = _mm256_loadu_ps(y.as_ptr().add(i));
                _mm256_storeu_ps(y.as_mut_ptr().add(i), round8(_mm256_mul_ps(yv, vv)));
            }
            i += 8;
        }
        while i < n {
            y[i] = super::round16(y[i] * v);
            i += 1;
        }
    }
}

#[cfg(target_arch = "x86_64")]
mod avx512 {
    //! The online-softmax loop with the accumulator of a whole head (64, 128 or 256 elements) in
    //! 512-bit registers (16 of them for Gemma 3's 256). Per element exactly the operations of
    //! the AVX2 path, in the same order: the dot product keeps ggml's four 8-lane accumulators
    //! as the two halves of two registers (elements `32i..32i+16` and `32i+16..32i+32`), so the
    //! reduction `(a0 + a2) + (a1 + a3)` is one 512-bit add and one add of its halves, then the
    //! same 128-bit steps; the f16 rounding of the accumulator is the same conversion 16 lanes at
    //! a time. Callers must have checked AVX-512 F and AVX2+FMA+F16C at runtime.
    use half::f16;
    use std::arch::x86_64::*;

    /// Head sizes with a register-resident accumulator here.
    pub(super) fn head_dim_supported(hd: usize) -> bool {
        matches!(hd, 64 | 128 | 256)
    }

    /// Rounds 16 lanes to f16 and back (round to nearest even).
    #[target_feature(enable = "avx512f,avx2,fma,f16c")]
    #[inline]
    fn round16(v: __m512) -> __m512 {
        _mm512_cvtph_ps(_mm512_cvtps_ph::<_MM_FROUND_TO_NEAREST_INT>(v))
    }

    /// 16 f16 values widened to f32.
    ///
    /// # Safety
    /// `p` points at 16 readable `f16`.
    #[target_feature(enable = "avx512f,avx2,fma,f16c")]
    #[inline]
    unsafe fn load16(p: *const f16) -> __m512 {
        // SAFETY: the caller guarantees 32 readable bytes; unaligned load.
        _mm512_cvtph_ps(unsafe { _mm256_loadu_si256(p.cast()) })
    }

    /// `ggml_vec_dot_f16` of a widened query and an f16 key of `32 * C2` elements (see the
    /// module doc for why the order is ggml's).
    ///
    /// # Safety
    /// `a` and `b` hold `32 * C2` elements.
    #[target_feature(enable = "avx512f,avx2,fma,f16c")]
    #[inline]
    unsafe fn dot_wide<const C2: usize>(a: *const f32, b: *const f16) -> f32 {
        let (mut lo, mut hi) = (_mm512_setzero_ps(), _mm512_setzero_ps());
        for i in 0..C2 {
            // SAFETY: `32i + 32 <= 32 * C2` elements of each operand.
            unsafe {
                let e = 32 * i;
                lo = _mm512_fmadd_ps(_mm512_loadu_ps(a.add(e)), load16(b.add(e)), lo);
                hi = _mm512_fmadd_ps(_mm512_loadu_ps(a.add(e + 16)), load16(b.add(e + 16)), hi);
            }
        }
        // [a0 + a2 | a1 + a3], then (a0 + a2) + (a1 + a3): GGML_F32x8_REDUCE's first two steps.
        let c = _mm512_add_ps(lo, hi);
        let s = _mm256_add_ps(
            _mm512_castps512_ps256(c),
            _mm256_castpd_ps(_mm512_extractf64x4_pd::<1>(_mm512_castps_pd(c))),
        );
        let t0 = _mm_add_ps(_mm256_castps256_ps128(s), _mm256_extractf128_ps::<1>(s));
        let t1 = _mm_hadd_ps(t0, t0);
        // Widened to f64 and back, as the AVX2 path does with its (empty) leftover loop.
        f64::from(_mm_cvtss_f32(_mm_hadd_ps(t1, t1))) as f32
    }

    #[target_feature(enable = "avx512f,avx2,fma,f16c")]
    pub(super) fn accumulate_rows<const ROUND: bool>(
        st: &mut super::OnlineSoftmax,
        acc: &mut [f32],
        q: &[f32],
        keys: &[f16],
        vals: &[f16],
        kq_scale: f32,
    ) {
        let hd = q.len();
        assert!(
            acc.len() == hd && head_dim_supported(hd),
            "supported head size"
        );
        // SAFETY: `acc` and `q` hold `hd` elements, `keys`/`vals` whole rows of `hd` (checked by
        // `accumulate_rows_with`), for each of the three head sizes.
        unsafe {
            match hd {
                64 => run::<ROUND, 4, 2>(st, acc, q, keys, vals, kq_scale),
                128 => run::<ROUND, 8, 4>(st, acc, q, keys, vals, kq_scale),
                _ => run::<ROUND, 16, 8>(st, acc, q, keys, vals, kq_scale),
            }
        }
    }

    /// The loop for a head of `16 * C = 32 * C2` elements.
    ///
    /// # Safety
    /// `acc` and `q` hold `16 * C` elements, `keys` and `vals` whole rows of `16 * C`.
    #[target_feature(enable = "avx512f,avx2,fma,f16c")]
    unsafe fn run<const ROUND: bool, const C: usize, const C2: usize>(
        st: &mut super::OnlineSoftmax,
        acc: &mut [f32],
        q: &[f32],
        keys: &[f16],
        vals: &[f16],
        kq_scale: f32,
    ) {
        let hd = 16 * C;
        let ap = acc.as_mut_ptr();
        let mut a = [_mm512_setzero_ps(); C];
        for (c, ac) in a.iter_mut().enumerate() {
            // SAFETY: `16c + 16 <= hd = acc.len()`.
            *ac = unsafe { _mm512_loadu_ps(ap.add(16 * c)) };
        }
        const GROUP: usize = 16;
        let mut scores = [0f32; GROUP];
        for (kg, vg) in keys.chunks(GROUP * hd).zip(vals.chunks(GROUP * hd)) {
            for (sc, k) in scores.iter_mut().zip(kg.chunks_exact(hd)) {
                // SAFETY: `q` and `k` hold `hd = 32 * C2` elements.
                *sc = unsafe { dot_wide::<C2>(q.as_ptr(), k.as_ptr()) } * kq_scale;
            }
            for (&s, v) in scores.iter().zip(vg.chunks_exact(hd)) {
                let (ms, vs) = st.factors(s);
                if ms != 1.0 {
                    let vm = _mm512_set1_ps(ms);
                    for ac in a.iter_mut() {
                        let x = _mm512_mul_ps(*ac, vm);
                        *ac = if ROUND { round16(x) } else { x };
                    }
                }
                let vv = _mm512_set1_ps(vs);
                let vp = v.as_ptr();
                for (c, ac) in a.iter_mut().enumerate() {
                    // SAFETY: `v` holds `hd` elements, `16c + 16 <= hd`.
                    let xv = unsafe { load16(vp.add(16 * c)) };
                    *ac = if ROUND {
                        round16(_mm512_fmadd_ps(xv, vv, *ac))
                    } else {
                        _mm512_fmadd_ps(vv, xv, *ac)
                    };
                }
                st.sum = st.sum.mul_add(ms, vs);
            }
        }
        for (c, ac) in a.iter().enumerate() {
            // SAFETY: as at the load above.
            unsafe { _mm512_storeu_ps(ap.add(16 * c), *ac) };
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::{Rng, SeedableRng};

    fn rand_f16(rng: &mut rand_chacha::ChaCha8Rng, n: usize) -> Vec<f16> {
        (0..n)
            .map(|_| f16::from_f32(rng.gen_range(-2.0f32..2.0)))
            .collect()
    }

    #[test]
    fn dot_paths_agree_and_match_f64() {
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(21);
        for n in [0usize, 1, 7, 31, 32, 33, 64, 80, 128, 130] {
            let a = rand_f16(&mut rng, n);
            let b = rand_f16(&mut rng, n);
            let exact: f64 = a
                .iter()
                .zip(&b)
                .map(|(x, y)| f64::from(x.to_f32()) * f64::from(y.to_f32()))
                .sum();
            let scalar = dot_f16_with(CpuFeatures::PORTABLE, &a, &b);
            assert!((f64::from(scalar) - exact).abs() <= 1e-5 * (1.0 + n as f64));
            assert_eq!(
                scalar.to_bits(),
                dot_f16_with(CpuFeatures::detect(), &a, &b).to_bits()
            );
            assert_eq!(scalar.to_bits(), dot_f16(&a, &b).to_bits(), "n={n}");
        }
    }

    #[test]
    fn mad_and_scale_round_to_f16_on_both_paths() {
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(22);
        for n in [0usize, 3, 8, 17, 64] {
            let x = rand_f16(&mut rng, n);
            let y0: Vec<f32> = rand_f16(&mut rng, n).iter().map(|v| v.to_f32()).collect();
            let want_mad: Vec<u32> = x
                .iter()
                .zip(&y0)
                .map(|(xi, yi)| round16(xi.to_f32().mul_add(0.37, *yi)).to_bits())
                .collect();
            let want_scale: Vec<u32> = y0.iter().map(|yi| round16(yi * 0.61).to_bits()).collect();
            for features in [CpuFeatures::PORTABLE, CpuFeatures::detect()] {
                let mut y = y0.clone();
                mad_f16_with(features, &mut y, &x, 0.37);
                assert_eq!(y.iter().map(|v| v.to_bits()).collect::<Vec<_>>(), want_mad);
                let mut y = y0.clone();
                scale_f16_with(features, &mut y, 0.61);
                assert_eq!(
                    y.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
                    want_scale
                );
            }
            let mut y = y0.clone();
            mad_f16(&mut y, &x, 0.37);
            scale_f16(&mut y, 0.61);
            assert!(y.iter().all(|v| round16(*v) == *v), "values stay f16");
        }
    }

    #[test]
    fn accumulate_rows_paths_agree_and_compose_the_primitives() {
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(23);
        for (hd, n) in [
            (64usize, 0usize),
            (64, 1),
            (64, 40),
            (128, 37),
            (256, 1),
            (256, 53),
            (40, 9),
            (8, 3),
        ] {
            let q: Vec<f32> = rand_f16(&mut rng, hd).iter().map(|v| v.to_f32()).collect();
            let keys = rand_f16(&mut rng, n * hd);
            let vals = rand_f16(&mut rng, n * hd);
            for round in [true, false] {
                // The composition of the public primitives, written out.
                let q16: Vec<f16> = q.iter().map(|&x| f16::from_f32(x)).collect();
                let (mut m, mut sum) = (f32::NEG_INFINITY, 0f32);
                let mut want = vec![0f32; hd];
                for (k, v) in keys.chunks_exact(hd).zip(vals.chunks_exact(hd)) {
                    let s = dot_f16(&q16, k) * 0.3;
                    let (ms, vs) = if s > m {
                        let ms = (m - s).exp();
                        m = s;
                        (ms, 1.0)
                    } else {
                        (1.0, (s - m).exp())
                    };
                    if round {
                        scale_f16(&mut want, ms);
                        mad_f16(&mut want, v, vs);
                    } else {
                        want.iter_mut().for_each(|a| *a *= ms);
                        for (a, x) in want.iter_mut().zip(v) {
                            *a = x.to_f32().mul_add(vs, *a);
                        }
                    }
                    sum = sum.mul_add(ms, vs);
                }
                for features in [
                    CpuFeatures::PORTABLE,
                    CpuFeatures::AVX2,
                    CpuFeatures::detect(),
                ] {
                    let mut st = OnlineSoftmax::default();
                    let mut acc = vec![0f32; hd];
                    accumulate_rows_with(features, &mut st, &mut acc, &q, &keys, &vals, 0.3, round);
                    let bits = |v: &[f32]| v.iter().map(|f| f.to_bits()).collect::<Vec<_>>();
                    assert_eq!(bits(&acc), bits(&want), "hd={hd} n={n} round={round}");
                    assert_eq!(st.sum.to_bits(), sum.to_bits());
                    assert_eq!(st.max.to_bits(), m.to_bits());
                }
            }
        }
    }
}
