//! AVX2 unpacking of the K-quant super-blocks (Q4_K / Q5_K / Q6_K) for the integer tiles of
//! `kquant_tile.rs`: stored values as unsigned bytes per 32-element vector, the integer
//! group scales expanded for `madd` / `vpdpwssd`, the per-32 mins and the float scales. Callers
//! must have checked AVX2+FMA+F16C at runtime. It never allocates and computes no dot product.
#![cfg(target_arch = "x86_64")]

use std::arch::x86_64::*;

use super::kquant::KQuant;

/// What one row's super-block contributes besides its values: float scales, the packed integer
/// scales (expanded per 32-element vector by [`KQuantAvx2::scale`]) and the eight per-32 mins
/// as i16.
#[derive(Clone, Copy)]
pub(crate) struct Prep {
    pub(super) d: f32,
    pub(super) dmin: f32,
    pub(super) scales: __m256i,
    pub(super) mins: __m128i,
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
    /// The sixteen integer 16-element group scales as i16 (only called for types with an
    /// `OFFSET`).
    ///
    /// # Safety
    /// AVX2 is available.
    #[inline(always)]
    unsafe fn scales16(prep: &Prep) -> __m256i {
        // SAFETY: AVX2 is the caller's contract.
        unsafe { _mm256_cvtepi8_epi16(_mm256_castsi256_si128(prep.scales)) }
    }
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
