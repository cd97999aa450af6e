//! AVX2 and AVX-512 VNNI (256-bit) tiles for the K-quant integer dot products.
//!
//! Owns the SIMD unpacking of Q4_K / Q5_K / Q6_K super-blocks (values, 6-bit scales and mins)
//! and the `T tokens × R rows` tile that follows the canonical order of [`super::kquant`]
//! exactly: `maddubs` (unsigned weights × signed activations, pairs into i16, never saturating
//! for these ranges), then `madd` with the 16-element group scale (AVX2) or `vpdpwssd` (VNNI)
//! into eight exact i32 lanes per super-block, one fused multiply-add per lane and super-block,
//! and the mins through `madd` of the per-32 mins with the activation sums. Callers must have
//! checked AVX2+FMA+F16C (and AVX-512 VNNI+VL for the `_vnni` tile) at runtime. It never
//! allocates.
#![cfg(target_arch = "x86_64")]

use std::arch::x86_64::*;

use super::kquant::{ActQ8K, KQuant, QK_K};
use super::vec_f32::avx2::hsum8_ps;

/// What one row's super-block contributes besides its values: float scales, the packed integer
/// scales (expanded per 32-element vector by [`KQuantAvx2::scale`]) and the eight per-32 mins
/// as i16.
#[derive(Clone, Copy)]
pub(crate) struct Prep {
    d: f32,
    dmin: f32,
    scales: __m256i,
    mins: __m128i,
}

/// Per-type AVX2 unpacking of a super-block at `p` (which must point at `K::BYTES` readable
/// bytes).
pub(crate) trait KQuantAvx2: KQuant {
    /// Scales, scale vectors and mins of the super-block.
    ///
    /// # Safety
    /// `p` points at one whole super-block; AVX2+FMA+F16C are available.
    unsafe fn prep(p: *const u8) -> Prep;
    /// The integer scale vector of 32-element vector `v` (i16 lanes 0..8 for its elements
    /// 0..16, lanes 8..16 for elements 16..32).
    ///
    /// # Safety
    /// AVX2 is available; `v < 8`.
    unsafe fn scale(prep: &Prep, v: usize) -> __m256i;
    /// The unsigned stored values of elements `64c..64c + 32` and `64c + 32..64c + 64`.
    ///
    /// # Safety
    /// As above, and `c < 4`.
    unsafe fn chunk(p: *const u8, c: usize) -> [__m256i; 2];
}

/// Reads 4 bytes at `p` as a little-endian u32.
///
/// # Safety
/// `p` points at 4 readable bytes.
#[inline(always)]
unsafe fn read_u32(p: *const u8) -> u32 {
    // SAFETY: the caller guarantees 4 readable bytes; unaligned read.
    u32::from_le(unsafe { p.cast::<u32>().read_unaligned() })
}

/// Two f16 values packed in `bits` (low half first) as f32, via F16C (exact).
///
/// # Safety
/// F16C is available (inlined into the tiles, which enable it).
#[inline(always)]
unsafe fn f16x2(bits: u32) -> (f32, f32) {
    // SAFETY: F16C/SSE2 availability is the caller's contract.
    unsafe {
        let v = _mm_cvtph_ps(_mm_cvtsi32_si128(bits as i32));
        (_mm_cvtss_f32(v), _mm_cvtss_f32(_mm_movehdup_ps(v)))
    }
}

/// Byte-shuffle patterns broadcasting i16 word `v` of a 128-bit lane to all eight words.
const WORD_PATTERNS: [[u8; 32]; 8] = {
    let mut p = [[0u8; 32]; 8];
    let mut v = 0;
    while v < 8 {
        let mut k = 0;
        while k < 32 {
            p[v][k] = (2 * v + (k & 1)) as u8;
            k += 1;
        }
        v += 1;
    }
    p
};

/// Byte-shuffle patterns: bytes `2v` (×8) then `2v + 1` (×8).
const BYTE_PAIR_PATTERNS: [[u8; 16]; 8] = {
    let mut p = [[0u8; 16]; 8];
    let mut v = 0;
    while v < 8 {
        let mut k = 0;
        while k < 16 {
            p[v][k] = (2 * v + k / 8) as u8;
            k += 1;
        }
        v += 1;
    }
    p
};

/// Q4_K / Q5_K: the 12 packed scale bytes at `p` to (scales per 32, mins per 32) as bytes
/// (the bit layout of `gguf::dequant::scale_min_k4`, four sub-blocks per 32-bit word).
///
/// # Safety
/// `p` points at 12 readable bytes.
#[inline(always)]
unsafe fn scales_mins_k4(p: *const u8) -> (u64, u64) {
    // SAFETY: 12 readable bytes at `p` (caller).
    let (a, b, c) = unsafe { (read_u32(p), read_u32(p.add(4)), read_u32(p.add(8))) };
    let sc_lo = a & 0x3f3f_3f3f;
    let m_lo = b & 0x3f3f_3f3f;
    let sc_hi = (c & 0x0f0f_0f0f) | ((a >> 2) & 0x3030_3030);
    let m_hi = ((c >> 4) & 0x0f0f_0f0f) | ((b >> 2) & 0x3030_3030);
    (
        u64::from(sc_lo) | (u64::from(sc_hi) << 32),
        u64::from(m_lo) | (u64::from(m_hi) << 32),
    )
}

/// Q4_K / Q5_K prep: shared by both (same header layout).
///
/// # Safety
/// `p` points at a whole Q4_K or Q5_K super-block; AVX2+F16C are available (this is inlined
/// into the tiles, which enable them).
#[inline(always)]
unsafe fn prep_k4(p: *const u8) -> Prep {
    // SAFETY: the header (d, dmin, 12 scale bytes) is the first 16 bytes of the block; the CPU
    // features are the caller's contract.
    unsafe {
        let ((d, dmin), (sc, m)) = (f16x2(read_u32(p)), scales_mins_k4(p.add(4)));
        Prep {
            d,
            dmin,
            scales: _mm256_broadcastsi128_si256(_mm_cvtepu8_epi16(_mm_cvtsi64_si128(sc as i64))),
            mins: _mm_cvtepu8_epi16(_mm_cvtsi64_si128(m as i64)),
        }
    }
}

/// Q4_K / Q5_K scale vector of 32-element vector `v`: its per-32 scale in all 16 lanes.
///
/// # Safety
/// AVX2 is available; `v < 8`.
#[inline(always)]
unsafe fn scale_k4(prep: &Prep, v: usize) -> __m256i {
    // SAFETY: the pattern table holds 32 bytes per entry and `v < 8`; AVX2 is the caller's
    // contract.
    unsafe {
        let pat = _mm256_loadu_si256(WORD_PATTERNS[v].as_ptr().cast());
        _mm256_shuffle_epi8(prep.scales, pat)
    }
}

/// Low and high nibbles of 32 bytes at `p`.
///
/// # Safety
/// `p` points at 32 readable bytes; AVX2 is available.
#[inline(always)]
unsafe fn nibbles(p: *const u8) -> [__m256i; 2] {
    // SAFETY: 32 readable bytes and AVX2 (caller).
    unsafe {
        let q = _mm256_loadu_si256(p.cast());
        let m = _mm256_set1_epi8(0x0F);
        [
            _mm256_and_si256(q, m),
            _mm256_and_si256(_mm256_srli_epi16(q, 4), m),
        ]
    }
}

impl KQuantAvx2 for super::kquant::Q4K {
    #[inline(always)]
    unsafe fn prep(p: *const u8) -> Prep {
        // SAFETY: `p` is a whole Q4_K block and the features are present (caller).
        unsafe { prep_k4(p) }
    }
    #[inline(always)]
    unsafe fn scale(prep: &Prep, v: usize) -> __m256i {
        // SAFETY: as the caller guarantees.
        unsafe { scale_k4(prep, v) }
    }
    #[inline(always)]
    unsafe fn chunk(p: *const u8, c: usize) -> [__m256i; 2] {
        // SAFETY: the 128 value bytes start at offset 16; chunk `c < 4` reads 32 of them.
        unsafe { nibbles(p.add(16 + 32 * c)) }
    }
}

impl KQuantAvx2 for super::kquant::Q5K {
    #[inline(always)]
    unsafe fn prep(p: *const u8) -> Prep {
        // SAFETY: `p` is a whole Q5_K block and the features are present (caller).
        unsafe { prep_k4(p) }
    }
    #[inline(always)]
    unsafe fn scale(prep: &Prep, v: usize) -> __m256i {
        // SAFETY: as the caller guarantees.
        unsafe { scale_k4(prep, v) }
    }
    #[inline(always)]
    unsafe fn chunk(p: *const u8, c: usize) -> [__m256i; 2] {
        // SAFETY: qh is 32 bytes at offset 16, the nibbles 128 bytes at offset 48; `c < 4`;
        // AVX2 is the caller's contract.
        unsafe {
            let [lo, hi] = nibbles(p.add(48 + 32 * c));
            let qh = _mm256_loadu_si256(p.add(16).cast());
            let bit16 = _mm256_set1_epi8(0x10);
            let m1 = _mm256_set1_epi8((1u8 << (2 * c)) as i8);
            let m2 = _mm256_set1_epi8((2u8 << (2 * c)) as i8);
            let h1 = _mm256_and_si256(_mm256_cmpeq_epi8(_mm256_and_si256(qh, m1), m1), bit16);
            let h2 = _mm256_and_si256(_mm256_cmpeq_epi8(_mm256_and_si256(qh, m2), m2), bit16);
            [_mm256_or_si256(lo, h1), _mm256_or_si256(hi, h2)]
        }
    }
}

impl KQuantAvx2 for super::kquant::Q6K {
    #[inline(always)]
    unsafe fn prep(p: *const u8) -> Prep {
        // SAFETY: the 16 scale bytes are at offset 192 and d at 208 (block of 210 bytes), so 4
        // bytes at 206 are readable (d is the high half); features are the caller's contract.
        unsafe {
            let scb = _mm_loadu_si128(p.add(192).cast());
            let (_, d) = f16x2(read_u32(p.add(206)));
            Prep {
                d,
                dmin: 0.0,
                scales: _mm256_castsi128_si256(scb),
                mins: _mm_setzero_si128(),
            }
        }
    }
    #[inline(always)]
    unsafe fn scale(prep: &Prep, v: usize) -> __m256i {
        // SAFETY: the pattern table holds 16 bytes per entry and `v < 8`; AVX2 is the caller's
        // contract.
        unsafe {
            let pat = _mm_loadu_si128(BYTE_PAIR_PATTERNS[v].as_ptr().cast());
            let scb = _mm256_castsi256_si128(prep.scales);
            _mm256_cvtepi8_epi16(_mm_shuffle_epi8(scb, pat))
        }
    }
    #[inline(always)]
    unsafe fn chunk(p: *const u8, c: usize) -> [__m256i; 2] {
        let n = c / 2;
        // SAFETY: ql is 128 bytes at 0, qh 64 bytes at 128; `c < 4` keeps every load inside;
        // AVX2 is the caller's contract.
        unsafe {
            let ql0 = _mm256_loadu_si256(p.add(64 * n).cast());
            let ql1 = _mm256_loadu_si256(p.add(64 * n + 32).cast());
            let qh = _mm256_loadu_si256(p.add(128 + 32 * n).cast());
            let m4 = _mm256_set1_epi8(0x0F);
            let m30 = _mm256_set1_epi8(0x30);
            if c.is_multiple_of(2) {
                [
                    _mm256_or_si256(
                        _mm256_and_si256(ql0, m4),
                        _mm256_and_si256(_mm256_slli_epi16(qh, 4), m30),
                    ),
                    _mm256_or_si256(
                        _mm256_and_si256(ql1, m4),
                        _mm256_and_si256(_mm256_slli_epi16(qh, 2), m30),
                    ),
                ]
            } else {
                [
                    _mm256_or_si256(
                        _mm256_and_si256(_mm256_srli_epi16(ql0, 4), m4),
                        _mm256_and_si256(qh, m30),
                    ),
                    _mm256_or_si256(
                        _mm256_and_si256(_mm256_srli_epi16(ql1, 4), m4),
                        _mm256_and_si256(_mm256_srli_epi16(qh, 2), m30),
                    ),
                ]
            }
        }
    }
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
        /// `out[t][r] = dot(W[row0 + r], X[tok0 + t])` for a `T × R` tile, canonical order.
        /// `w` is the whole weight matrix with rows of `row_bytes` bytes; `PF` prefetches the
        /// weight stream beyond the tile (for `T == 1`).
        ///
        /// Panics (internal bug) if the tile is out of range.
        #[target_feature(enable = $features)]
        pub(crate) fn $name<K: KQuantAvx2, const T: usize, const R: usize, const PF: bool>(
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
                    && act.bs32.len() >= act.num_tokens * nb * 8,
                "activation buffers hold the whole shape"
            );
            let row_len = nb * QK_K;
            let wbase = w.as_ptr();
            let xq = act.qs.as_ptr();
            let off = _mm256_set1_epi8(K::OFFSET as i8);
            let mut acc = [[_mm256_setzero_ps(); R]; T];
            let mut accm = [[_mm_setzero_ps(); R]; T];
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
                        let (o0, o1) = if K::OFFSET != 0 {
                            (_mm256_maddubs_epi16(off, x0), _mm256_maddubs_epi16(off, x1))
                        } else {
                            (_mm256_setzero_si256(), _mm256_setzero_si256())
                        };
                        for r in 0..R {
                            let mut p0 = _mm256_maddubs_epi16(wv[r][0], x0);
                            let mut p1 = _mm256_maddubs_epi16(wv[r][1], x1);
                            if K::OFFSET != 0 {
                                p0 = _mm256_sub_epi16(p0, o0);
                                p1 = _mm256_sub_epi16(p1, o1);
                            }
                            isum[t][r] = $lanes(isum[t][r], p0, sv[r][0]);
                            isum[t][r] = $lanes(isum[t][r], p1, sv[r][1]);
                        }
                    }
                }
                for t in 0..T {
                    let ab = (tok0 + t) * nb + b;
                    let dx = act.d[ab];
                    let bs = if K::HAS_MIN {
                        // SAFETY: `ab < num_tokens * nb`, so 8 i16 at `ab * 8` lie inside
                        // `act.bs32` (asserted above).
                        unsafe { _mm_loadu_si128(act.bs32.as_ptr().add(ab * 8).cast()) }
                    } else {
                        _mm_setzero_si128()
                    };
                    for r in 0..R {
                        let d = _mm256_set1_ps(prep[r].d * dx);
                        acc[t][r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum[t][r]), d, acc[t][r]);
                        if K::HAS_MIN {
                            let ml = _mm_cvtepi32_ps(_mm_madd_epi16(prep[r].mins, bs));
                            let dm = _mm_set1_ps(prep[r].dmin * dx);
                            accm[t][r] = _mm_fmadd_ps(ml, dm, accm[t][r]);
                        }
                    }
                }
            }
            for t in 0..T {
                for r in 0..R {
                    let s = hsum8_ps(acc[t][r]);
                    out[t][r] = if K::HAS_MIN {
                        s - hsum4_ps(accm[t][r])
                    } else {
                        s
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
