//! AVX2 and AVX-512 VNNI (256-bit) tiles for the K-quant integer dot products.
//!
//! Owns the `T tokens × R rows` tile that follows the canonical orders of [`super::kquant`]
//! exactly: `maddubs` (unsigned weights × signed activations, pairs into i16, never saturating
//! for these ranges), then `madd` with the 16-element group scale (AVX2) or `vpdpwssd` (VNNI)
//! into eight exact i32 lanes per super-block (Q6_K's offset subtracted through `madd` of the
//! scales with the per-16 activation sums), then per the order one fused multiply-add per lane,
//! per super-block or per 64 elements, and the mins through `madd` of the per-32 mins with the
//! activation sums. The unpacking lives in [`super::kquant_avx2`]. Callers must have checked
//! AVX2+FMA+F16C (and AVX-512 VNNI+VL for the `_vnni` tile) at runtime. It never allocates.
#![cfg(target_arch = "x86_64")]

use std::arch::x86_64::*;

use super::kquant::{order, ActQ8K, QK_K};
use super::kquant_avx2::KQuantAvx2;
use super::vec_f32::avx2::hsum8_ps;

/// Sum of the eight i32 lanes (exact: no order matters).
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
fn hsum_epi32(v: __m256i) -> i32 {
    hsum4_epi32(_mm_add_epi32(
        _mm256_castsi256_si128(v),
        _mm256_extracti128_si256::<1>(v),
    ))
}

/// i32 lane `i < 4` of `v`.
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
fn lane_epi32(v: __m128i, i: usize) -> i32 {
    let mut a = [0i32; 4];
    // SAFETY: `a` holds 16 writable bytes; unaligned store.
    unsafe { _mm_storeu_si128(a.as_mut_ptr().cast(), v) };
    a[i]
}

/// Sum of the four i32 lanes (exact).
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
fn hsum4_epi32(v: __m128i) -> i32 {
    let u = _mm_add_epi32(v, _mm_shuffle_epi32::<0x4E>(v));
    _mm_cvtsi128_si32(_mm_add_epi32(u, _mm_shuffle_epi32::<0xB1>(u)))
}

/// 4-lane horizontal sum `(v0 + v2) + (v1 + v3)` (the order of the module doc of `kquant`).
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
fn hsum4_ps(v: __m128) -> f32 {
    let u = _mm_add_ps(v, _mm_movehl_ps(v, v));
    _mm_cvtss_f32(_mm_add_ss(u, _mm_shuffle_ps(u, u, 1)))
}

/// `acc + madd(p, s)`: pairs of i16 products summed into the i32 lanes.
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
fn lanes_madd(acc: __m256i, p: __m256i, s: __m256i) -> __m256i {
    _mm256_add_epi32(acc, _mm256_madd_epi16(p, s))
}

/// The same with AVX-512 VNNI's `vpdpwssd` (one instruction, identical integers).
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512vnni,avx512vl")]
#[inline]
fn lanes_vnni(acc: __m256i, p: __m256i, s: __m256i) -> __m256i {
    _mm256_dpwssd_epi32(acc, p, s)
}

/// How far (bytes) beyond the tile's own rows the decode tile prefetches (as for the 32-element
/// block types).
const PF_DIST: usize = 4096;

macro_rules! define_tile {
    ($name:ident, $features:literal, $lanes:ident) => {
        /// `out[t][r] = dot(W[row0 + r], X[tok0 + t])` for a `T × R` tile, canonical order
        /// `ORDER` (one of [`order`]). `w` is the whole weight matrix with rows of
        /// `row_bytes` bytes; `PF` prefetches the weight stream beyond the tile (for `T == 1`).
        ///
        /// Panics (internal bug) if the tile is out of range.
        #[target_feature(enable = $features)]
        pub(crate) fn $name<
            K: KQuantAvx2,
            const T: usize,
            const R: usize,
            const PF: bool,
            const ORDER: u8,
        >(
            w: &[u8],
            row_bytes: usize,
            row0: usize,
            act: &ActQ8K,
            tok0: usize,
            out: &mut [[f32; R]; T],
        ) {
            let nb = act.num_blocks;
            assert!(
                row_bytes == nb * K::BYTES && (row0 + R) * row_bytes <= w.len(),
                "tile rows in range"
            );
            assert!(tok0 + T <= act.num_tokens, "tile tokens in range");
            assert!(
                act.qs.len() >= act.num_tokens * nb * QK_K
                    && act.bs16.len() >= act.num_tokens * nb * 16,
                "activation buffers hold the whole shape"
            );
            let row_len = nb * QK_K;
            let wbase = w.as_ptr();
            let xq = act.qs.as_ptr();
            let mut acc = [[_mm256_setzero_ps(); R]; T];
            let mut accm = [[_mm_setzero_ps(); R]; T];
            let mut acc1 = [[0f32; R]; T];
            let mut accm1 = [[0f32; R]; T];
            let flat = ORDER != order::LANES;
            let one_min = flat || K::ONE_MIN_LANE;
            let pf_step = R * K::BYTES;
            let pf_start = (row0 + R) * row_bytes + PF_DIST;
            let mut pf_next = pf_start;
            for b in 0..nb {
                if PF {
                    let pf_end = (pf_start + (b + 1) * pf_step).min(w.len());
                    while pf_next < pf_end {
                        // SAFETY: `pf_next < w.len()`, so the address lies inside `w`; a
                        // prefetch never faults and has no architectural effect.
                        unsafe { _mm_prefetch::<_MM_HINT_T0>(wbase.add(pf_next).cast()) };
                        pf_next += 64;
                    }
                }
                // Block `b` of row `row0 + r`; for `r < R` it lies inside `w`:
                // `(row0 + r) * row_bytes + (b + 1) * K::BYTES <= w.len()` by the assert above.
                let blk = |r: usize| wbase.wrapping_add((row0 + r) * row_bytes + b * K::BYTES);
                // SAFETY: see above.
                let mut prep = [unsafe { K::prep(blk(0)) }; R];
                for (r, pr) in prep.iter_mut().enumerate().skip(1) {
                    // SAFETY: see above.
                    *pr = unsafe { K::prep(blk(r)) };
                }
                let mut isum = [[_mm256_setzero_si256(); R]; T];
                for c in 0..4 {
                    let mut wv = [[_mm256_setzero_si256(); 2]; R];
                    let mut sv = [[_mm256_setzero_si256(); 2]; R];
                    for r in 0..R {
                        // SAFETY: see above; `c < 4`, so `2 * c + 1 < 8`.
                        unsafe {
                            wv[r] = K::chunk(blk(r), c);
                            sv[r] = [K::scale(&prep[r], 2 * c), K::scale(&prep[r], 2 * c + 1)];
                        }
                    }
                    for t in 0..T {
                        let at = (tok0 + t) * row_len + b * QK_K + 64 * c;
                        // SAFETY: `tok0 + t < num_tokens` and `b < nb`, so the 64 bytes at `at`
                        // lie inside `act.qs` (asserted to hold the whole shape).
                        let (x0, x1) = unsafe {
                            (
                                _mm256_loadu_si256(xq.add(at).cast()),
                                _mm256_loadu_si256(xq.add(at + 32).cast()),
                            )
                        };
                        for r in 0..R {
                            let p0 = _mm256_maddubs_epi16(wv[r][0], x0);
                            let p1 = _mm256_maddubs_epi16(wv[r][1], x1);
                            isum[t][r] = $lanes(isum[t][r], p0, sv[r][0]);
                            isum[t][r] = $lanes(isum[t][r], p1, sv[r][1]);
                        }
                    }
                    if ORDER == order::FLAT64 {
                        // One fused multiply-add per 64 elements (values and mins).
                        for t in 0..T {
                            let ab = (tok0 + t) * nb + b;
                            let dx = act.d[ab];
                            // SAFETY: `ab < num_tokens * nb`: 16 i16 at `ab * 16` lie inside
                            // `act.bs16` (asserted above).
                            let bs16 = unsafe {
                                _mm256_loadu_si256(act.bs16.as_ptr().add(ab * 16).cast())
                            };
                            let bs32 = _mm_hadd_epi16(
                                _mm256_castsi256_si128(bs16),
                                _mm256_extracti128_si256::<1>(bs16),
                            );
                            for r in 0..R {
                                let s = hsum_epi32(isum[t][r]) as f32;
                                acc1[t][r] = s.mul_add(prep[r].d * dx, acc1[t][r]);
                                isum[t][r] = _mm256_setzero_si256();
                                if K::HAS_MIN {
                                    let ml = _mm_madd_epi16(prep[r].mins, bs32);
                                    let m = lane_epi32(ml, c) as f32;
                                    accm1[t][r] = m.mul_add(prep[r].dmin * dx, accm1[t][r]);
                                }
                            }
                        }
                    }
                }
                if ORDER == order::FLAT64 {
                    continue;
                }
                for t in 0..T {
                    let ab = (tok0 + t) * nb + b;
                    let dx = act.d[ab];
                    // SAFETY: `ab < num_tokens * nb`, so 16 i16 at `ab * 16` lie inside
                    // `act.bs16` (asserted above).
                    let bs16 = unsafe { _mm256_loadu_si256(act.bs16.as_ptr().add(ab * 16).cast()) };
                    let bs32 = _mm_hadd_epi16(
                        _mm256_castsi256_si128(bs16),
                        _mm256_extracti128_si256::<1>(bs16),
                    );
                    for r in 0..R {
                        let mut lanes = isum[t][r];
                        if K::OFFSET != 0 {
                            // SAFETY: AVX2 is enabled for this function.
                            let sc16 = unsafe { K::scales16(&prep[r]) };
                            let s = _mm256_madd_epi16(bs16, sc16);
                            let s = _mm256_mullo_epi32(s, _mm256_set1_epi32(K::OFFSET));
                            lanes = _mm256_sub_epi32(lanes, s);
                        }
                        if ORDER == order::TILED {
                            let mut res = prep[r].d * hsum_epi32(lanes) as f32;
                            if K::HAS_MIN {
                                let m = hsum4_epi32(_mm_madd_epi16(prep[r].mins, bs32)) as f32;
                                res = (-prep[r].dmin).mul_add(m, res);
                            }
                            acc1[t][r] = res.mul_add(dx, acc1[t][r]);
                            continue;
                        }
                        let d = prep[r].d * dx;
                        if flat {
                            acc1[t][r] = (hsum_epi32(lanes) as f32).mul_add(d, acc1[t][r]);
                        } else {
                            let dv = _mm256_set1_ps(d);
                            acc[t][r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(lanes), dv, acc[t][r]);
                        }
                        if K::HAS_MIN {
                            let ml = _mm_madd_epi16(prep[r].mins, bs32);
                            let dm = prep[r].dmin * dx;
                            if one_min {
                                accm1[t][r] = (hsum4_epi32(ml) as f32).mul_add(dm, accm1[t][r]);
                            } else {
                                let dmv = _mm_set1_ps(dm);
                                accm[t][r] = _mm_fmadd_ps(_mm_cvtepi32_ps(ml), dmv, accm[t][r]);
                            }
                        }
                    }
                }
            }
            for t in 0..T {
                for r in 0..R {
                    let s = if flat {
                        acc1[t][r]
                    } else {
                        hsum8_ps(acc[t][r])
                    };
                    out[t][r] = if ORDER == order::TILED || !K::HAS_MIN {
                        s
                    } else if one_min {
                        s - accm1[t][r]
                    } else {
                        s - hsum4_ps(accm[t][r])
                    };
                }
            }
        }
    };
}

define_tile!(tile, "avx2,fma,f16c", lanes_madd);
define_tile!(
    tile_vnni,
    "avx2,fma,f16c,avx512f,avx512vnni,avx512vl",
    lanes_vnni
);
