//! Integer block dot products for the 32-element quant types (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0)
//! against [`ActQ8`] activations.
//!
//! Owns the canonical per-output operation sequence for these types. For weight row `W[r]` and
//! token `t`, over blocks `b` in order:
//! ```text
//! dd       = d_w[b] * d_x[b]                          (f32 multiply)
//! isum[l]  = Σ_{k=4l..4l+3} w[b,k] * q_x[b,k]         (exact integers, l = 0..8)
//! acc[l]   = fma(isum[l] as f32, dd, acc[l])
//! summs    = fma(m_w[b], s_x[b], summs)               (zero-point types only)
//! y[t, r]  = hsum8(acc) (+ summs)
//! ```
//! The AVX2 tile (`maddubs` + `madd` give exactly those lane sums) and the scalar tile run the
//! same sequence, so they agree bit for bit; a `T × R` tile (tokens × rows) only interleaves
//! independent sequences, so the tile shape never changes a result. It never allocates.

use super::act_quant::{ActQ8, QK8};
use super::vec_f32::hsum8;

#[inline(always)]
fn f16_at(b: &[u8], off: usize) -> f32 {
    half::f16::from_bits(u16::from_le_bytes([b[off], b[off + 1]])).to_f32()
}

/// One 32-element weight block format.
pub(crate) trait Block32 {
    /// Bytes per block.
    const BYTES: usize;
    /// Zero-point types (`x = d * q + m`) add `m * s_x` per block.
    const HAS_MIN: bool;
    /// Values are signed (AVX2 uses the sign trick) rather than unsigned `0..32`.
    const SIGNED: bool;
    /// `(d, m)`; `m` is 0 for types without a zero point.
    fn scales(b: &[u8]) -> (f32, f32);
    /// The 32 integer values (signed for signed types, `0..32` otherwise).
    fn values(b: &[u8]) -> [i8; 32];
}

pub(crate) struct Q4_0;
pub(crate) struct Q4_1;
pub(crate) struct Q5_0;
pub(crate) struct Q5_1;
pub(crate) struct Q8_0;

fn nibbles(qs: &[u8], bias: i8) -> [i8; 32] {
    let mut v = [0i8; 32];
    for j in 0..16 {
        v[j] = (qs[j] & 0x0F) as i8 - bias;
        v[j + 16] = (qs[j] >> 4) as i8 - bias;
    }
    v
}

fn nibbles5(qh: &[u8], qs: &[u8], bias: i8) -> [i8; 32] {
    let h = u32::from_le_bytes([qh[0], qh[1], qh[2], qh[3]]);
    let mut v = [0i8; 32];
    for j in 0..16 {
        v[j] = ((qs[j] & 0x0F) | (((h >> j) & 1) << 4) as u8) as i8 - bias;
        v[j + 16] = ((qs[j] >> 4) | (((h >> (j + 16)) & 1) << 4) as u8) as i8 - bias;
    }
    v
}

impl Block32 for Q4_0 {
    const BYTES: usize = 18;
    const HAS_MIN: bool = false;
    const SIGNED: bool = true;
    fn scales(b: &[u8]) -> (f32, f32) {
        (f16_at(b, 0), 0.0)
    }
    fn values(b: &[u8]) -> [i8; 32] {
        nibbles(&b[2..18], 8)
    }
}

impl Block32 for Q4_1 {
    const BYTES: usize = 20;
    const HAS_MIN: bool = true;
    const SIGNED: bool = false;
    fn scales(b: &[u8]) -> (f32, f32) {
        (f16_at(b, 0), f16_at(b, 2))
    }
    fn values(b: &[u8]) -> [i8; 32] {
        nibbles(&b[4..20], 0)
    }
}

impl Block32 for Q5_0 {
    const BYTES: usize = 22;
    const HAS_MIN: bool = false;
    const SIGNED: bool = true;
    fn scales(b: &[u8]) -> (f32, f32) {
        (f16_at(b, 0), 0.0)
    }
    fn values(b: &[u8]) -> [i8; 32] {
        nibbles5(&b[2..6], &b[6..22], 16)
    }
}

impl Block32 for Q5_1 {
    const BYTES: usize = 24;
    const HAS_MIN: bool = true;
    const SIGNED: bool = false;
    fn scales(b: &[u8]) -> (f32, f32) {
        (f16_at(b, 0), f16_at(b, 2))
    }
    fn values(b: &[u8]) -> [i8; 32] {
        nibbles5(&b[4..8], &b[8..24], 0)
    }
}

impl Block32 for Q8_0 {
    const BYTES: usize = 34;
    const HAS_MIN: bool = false;
    const SIGNED: bool = true;
    fn scales(b: &[u8]) -> (f32, f32) {
        (f16_at(b, 0), 0.0)
    }
    fn values(b: &[u8]) -> [i8; 32] {
        let mut v = [0i8; 32];
        for (vi, bi) in v.iter_mut().zip(&b[2..34]) {
            *vi = *bi as i8;
        }
        v
    }
}

/// Scalar dot of one weight row (`num_blocks * B::BYTES` bytes) with token `tok` of `act`, in the
/// canonical order of the module doc.
pub(crate) fn dot_row_scalar<B: Block32>(w_row: &[u8], act: &ActQ8, tok: usize) -> f32 {
    let nb = act.num_blocks;
    let xq = &act.qs[tok * nb * QK8..(tok + 1) * nb * QK8];
    let xd = &act.d[tok * nb..(tok + 1) * nb];
    let xs = &act.s[tok * nb..(tok + 1) * nb];
    let mut acc = [0f32; 8];
    let mut summs = 0f32;
    for (b, blk) in w_row.chunks_exact(B::BYTES).take(nb).enumerate() {
        let (d, m) = B::scales(blk);
        let v = B::values(blk);
        let dd = d * xd[b];
        let x = &xq[b * QK8..(b + 1) * QK8];
        for (l, a) in acc.iter_mut().enumerate() {
            let isum: i32 = (4 * l..4 * l + 4)
                .map(|k| i32::from(v[k]) * i32::from(x[k]))
                .sum();
            *a = (isum as f32).mul_add(dd, *a);
        }
        if B::HAS_MIN {
            summs = m.mul_add(xs[b], summs);
        }
    }
    let r = hsum8(&acc);
    if B::HAS_MIN {
        r + summs
    } else {
        r
    }
}

#[cfg(target_arch = "x86_64")]
pub(crate) mod avx2 {
    //! AVX2 tile kernels; callers must have checked AVX2+FMA+F16C at runtime.
    use super::super::act_quant::{ActQ8, QK8};
    use super::super::vec_f32::avx2::hsum8_ps;
    use super::Block32;
    use std::arch::x86_64::*;

    /// Per-type AVX2 unpacking of one block at `p` (which must point at `B::BYTES` readable bytes).
    pub(crate) trait Block32Avx2: Block32 {
        /// The 32 values as bytes, byte `k` = element `k`.
        ///
        /// # Safety
        /// `p` points at one whole block; AVX2 is available.
        unsafe fn values_avx2(p: *const u8) -> __m256i;
        /// `(d, m)` via F16C (exact, equal to [`Block32::scales`]).
        ///
        /// # Safety
        /// As above.
        unsafe fn scales_avx2(p: *const u8) -> (f32, f32);
    }

    #[target_feature(enable = "avx2,fma,f16c")]
    #[inline]
    fn f16x2(bits: u32) -> (f32, f32) {
        let v = _mm_cvtph_ps(_mm_cvtsi32_si128(bits as i32));
        (_mm_cvtss_f32(v), _mm_cvtss_f32(_mm_movehdup_ps(v)))
    }

    /// Reads `N` bytes at `p` as a little-endian u32 (`N <= 4`).
    ///
    /// # Safety
    /// `p` points at 4 readable bytes.
    #[inline(always)]
    unsafe fn read_u32(p: *const u8) -> u32 {
        // SAFETY: the caller guarantees 4 readable bytes; unaligned read.
        u32::from_le(unsafe { p.cast::<u32>().read_unaligned() })
    }

    /// 16 bytes of packed nibbles to 32 bytes: low nibbles in bytes 0..16, high in 16..32.
    #[target_feature(enable = "avx2,fma,f16c")]
    #[inline]
    unsafe fn nibbles_avx2(p: *const u8) -> __m256i {
        // SAFETY: the caller guarantees 16 readable bytes at `p`.
        let q = unsafe { _mm_loadu_si128(p.cast()) };
        let hi = _mm_srli_epi16(q, 4);
        _mm256_and_si256(_mm256_set_m128i(hi, q), _mm256_set1_epi8(0x0F))
    }

    /// Bit `k` of the 32-bit `qh` at `p` to byte `k` = `0x10` if set, else `0`.
    #[target_feature(enable = "avx2,fma,f16c")]
    #[inline]
    unsafe fn high_bits_avx2(p: *const u8) -> __m256i {
        // SAFETY: the caller guarantees 4 readable bytes at `p`.
        let h = unsafe { read_u32(p) } as i32;
        let shuf = _mm256_set_epi64x(
            0x0303030303030303,
            0x0202020202020202,
            0x0101010101010101,
            0,
        );
        let bytes = _mm256_shuffle_epi8(_mm256_set1_epi32(h), shuf);
        let bytes = _mm256_or_si256(bytes, _mm256_set1_epi64x(0x7fbfdfeff7fbfdfe));
        let set = _mm256_cmpeq_epi8(bytes, _mm256_set1_epi64x(-1));
        _mm256_and_si256(set, _mm256_set1_epi8(0x10))
    }

    impl Block32Avx2 for super::Q4_0 {
        #[target_feature(enable = "avx2,fma,f16c")]
        unsafe fn values_avx2(p: *const u8) -> __m256i {
            // SAFETY: a Q4_0 block holds its 16 nibble bytes at offset 2.
            _mm256_sub_epi8(unsafe { nibbles_avx2(p.add(2)) }, _mm256_set1_epi8(8))
        }
        #[target_feature(enable = "avx2,fma,f16c")]
        unsafe fn scales_avx2(p: *const u8) -> (f32, f32) {
            // SAFETY: a Q4_0 block is 18 bytes, so 4 bytes at offset 0 are readable.
            (f16x2(unsafe { read_u32(p) }).0, 0.0)
        }
    }

    impl Block32Avx2 for super::Q4_1 {
        #[target_feature(enable = "avx2,fma,f16c")]
        unsafe fn values_avx2(p: *const u8) -> __m256i {
            // SAFETY: a Q4_1 block holds its 16 nibble bytes at offset 4.
            unsafe { nibbles_avx2(p.add(4)) }
        }
        #[target_feature(enable = "avx2,fma,f16c")]
        unsafe fn scales_avx2(p: *const u8) -> (f32, f32) {
            // SAFETY: d and m are the first 4 bytes of the block.
            f16x2(unsafe { read_u32(p) })
        }
    }

    impl Block32Avx2 for super::Q5_0 {
        #[target_feature(enable = "avx2,fma,f16c")]
        unsafe fn values_avx2(p: *const u8) -> __m256i {
            // SAFETY: a Q5_0 block holds qh at offset 2 (4 bytes) and nibbles at 6 (16 bytes).
            let v = unsafe { _mm256_or_si256(nibbles_avx2(p.add(6)), high_bits_avx2(p.add(2))) };
            _mm256_sub_epi8(v, _mm256_set1_epi8(16))
        }
        #[target_feature(enable = "avx2,fma,f16c")]
        unsafe fn scales_avx2(p: *const u8) -> (f32, f32) {
            // SAFETY: a Q5_0 block is 22 bytes, so 4 bytes at offset 0 are readable.
            (f16x2(unsafe { read_u32(p) }).0, 0.0)
        }
    }

    impl Block32Avx2 for super::Q5_1 {
        #[target_feature(enable = "avx2,fma,f16c")]
        unsafe fn values_avx2(p: *const u8) -> __m256i {
            // SAFETY: a Q5_1 block holds qh at offset 4 (4 bytes) and nibbles at 8 (16 bytes).
            unsafe { _mm256_or_si256(nibbles_avx2(p.add(8)), high_bits_avx2(p.add(4))) }
        }
        #[target_feature(enable = "avx2,fma,f16c")]
        unsafe fn scales_avx2(p: *const u8) -> (f32, f32) {
            // SAFETY: d and m are the first 4 bytes of the block.
            f16x2(unsafe { read_u32(p) })
        }
    }

    impl Block32Avx2 for super::Q8_0 {
        #[target_feature(enable = "avx2,fma,f16c")]
        unsafe fn values_avx2(p: *const u8) -> __m256i {
            // SAFETY: a Q8_0 block holds 32 value bytes at offset 2.
            unsafe { _mm256_loadu_si256(p.add(2).cast()) }
        }
        #[target_feature(enable = "avx2,fma,f16c")]
        unsafe fn scales_avx2(p: *const u8) -> (f32, f32) {
            // SAFETY: a Q8_0 block is 34 bytes, so 4 bytes at offset 0 are readable.
            (f16x2(unsafe { read_u32(p) }).0, 0.0)
        }
    }

    /// How far (bytes) beyond the tile's own rows the decode tile prefetches: about one DRAM
    /// latency of streaming at ~20 GB/s per core. Measured on Zen 3 (1 thread, real model
    /// weights, Q4_1 layer matrices): 0 → 15.5 GB/s, 1024 → 17.5, 2048 → 18.8, 4096 → 20.7,
    /// 16384 → 19 GB/s; the Q8_0 output head goes from 26 to 29 GB/s.
    const PF_DIST: usize = 4096;

    /// Defines one tile kernel: `$lanes(u8 weights, i8 activations, ones)` gives the eight
    /// 32-bit sums of four products each (identical integers on every path).
    macro_rules! define_tile {
        ($name:ident, $features:literal, $lanes:ident) => {
            /// `out[t][r] = dot(W[row0 + r], X[tok0 + t])` for a `T × R` tile, canonical order.
            /// `w` is the whole weight matrix with rows of `row_bytes` bytes.
            ///
            /// `PF` turns on software prefetching of the rows after the tile (for streaming, `T == 1`).
            ///
            /// Panics (internal bug) if the tile is out of range.
            #[target_feature(enable = $features)]
            pub(crate) fn $name<B: Block32Avx2, const T: usize, const R: usize, const PF: bool>(
                w: &[u8],
                row_bytes: usize,
                row0: usize,
                act: &ActQ8,
                tok0: usize,
                out: &mut [[f32; R]; T],
            ) {
                let nb = act.num_blocks;
                assert!(
                    row_bytes == nb * B::BYTES && (row0 + R) * row_bytes <= w.len(),
                    "tile rows in range"
                );
                assert!(tok0 + T <= act.num_tokens, "tile tokens in range");
                let row_len = nb * QK8;
                let ones = _mm256_set1_epi16(1);
                let mut acc = [[_mm256_setzero_ps(); R]; T];
                let mut summs = [[0f32; R]; T];
                let wbase = w.as_ptr();
                let xq = act.qs.as_ptr();
                let mut wv = [_mm256_setzero_si256(); R];
                let mut wa = [_mm256_setzero_si256(); R];
                let mut dw = [_mm256_setzero_ps(); R];
                let mut mw = [0f32; R];
                // Software prefetch when `PF` (decode streams every weight once from DRAM, and the
                // interleaved short rows defeat the hardware prefetcher): while block `b` is read, fetch
                // the matching slice of the bytes `PF_DIST` beyond this tile's rows, one request per
                // cache line, never past `w`. Prefetching has no effect on results.
                let pf_step = R * B::BYTES;
                let pf_start = (row0 + R) * row_bytes + PF_DIST;
                let mut pf_next = pf_start;
                for b in 0..nb {
                    if PF {
                        let pf_end = (pf_start + (b + 1) * pf_step).min(w.len());
                        while pf_next < pf_end {
                            // SAFETY: `pf_next < w.len()`, so the address lies inside `w`; a prefetch
                            // never faults and has no architectural effect.
                            unsafe { _mm_prefetch::<_MM_HINT_T0>(wbase.add(pf_next).cast()) };
                            pf_next += 64;
                        }
                    }
                    for r in 0..R {
                        // SAFETY: `(row0 + r) * row_bytes + (b + 1) * B::BYTES <= w.len()` by the assert
                        // above (b < nb, r < R), so the block is inside `w`.
                        let (v, (d, m)) = unsafe {
                            let p = wbase.add((row0 + r) * row_bytes + b * B::BYTES);
                            (B::values_avx2(p), B::scales_avx2(p))
                        };
                        wv[r] = v;
                        if B::SIGNED {
                            wa[r] = _mm256_sign_epi8(v, v);
                        }
                        dw[r] = _mm256_set1_ps(d);
                        mw[r] = m;
                    }
                    for t in 0..T {
                        let tok = tok0 + t;
                        let at = tok * row_len + b * QK8;
                        // SAFETY: `tok < num_tokens` and `b < nb`, so the 32 bytes at `at` lie
                        // inside `act.qs` (`num_tokens * row_len` long).
                        let x = unsafe { _mm256_loadu_si256(xq.add(at).cast()) };
                        let dx = _mm256_set1_ps(act.d[tok * nb + b]);
                        let sx = act.s[tok * nb + b];
                        for r in 0..R {
                            let isum = if B::SIGNED {
                                $lanes(wa[r], _mm256_sign_epi8(x, wv[r]), ones)
                            } else {
                                $lanes(wv[r], x, ones)
                            };
                            let dd = _mm256_mul_ps(dw[r], dx);
                            acc[t][r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum), dd, acc[t][r]);
                            if B::HAS_MIN {
                                summs[t][r] = mw[r].mul_add(sx, summs[t][r]);
                            }
                        }
                    }
                }
                for t in 0..T {
                    for r in 0..R {
                        let s = hsum8_ps(acc[t][r]);
                        out[t][r] = if B::HAS_MIN { s + summs[t][r] } else { s };
                    }
                }
            }
        };
    }

    /// Lane sums with `maddubs` (pairs into i16, no saturation for these value ranges) and
    /// `madd` (pairs of i16 into i32).
    #[target_feature(enable = "avx2,fma,f16c")]
    #[inline]
    fn lanes_madd(u: __m256i, s: __m256i, ones: __m256i) -> __m256i {
        _mm256_madd_epi16(_mm256_maddubs_epi16(u, s), ones)
    }

    /// Lane sums with AVX-512 VNNI's `vpdpbusd` on 256 bits (exact 32-bit sums of the same four
    /// products).
    #[target_feature(enable = "avx2,fma,f16c,avx512f,avx512vnni,avx512vl")]
    #[inline]
    fn lanes_vnni(u: __m256i, s: __m256i, _ones: __m256i) -> __m256i {
        _mm256_dpbusd_epi32(_mm256_setzero_si256(), u, s)
    }

    /// Lane sums with AVX-VNNI's VEX-encoded `vpdpbusd` (the same sums as [`lanes_vnni`]).
    #[target_feature(enable = "avx2,fma,f16c,avxvnni")]
    #[inline]
    fn lanes_avxvnni(u: __m256i, s: __m256i, _ones: __m256i) -> __m256i {
        _mm256_dpbusd_avx_epi32(_mm256_setzero_si256(), u, s)
    }

    define_tile!(tile, "avx2,fma,f16c", lanes_madd);
    define_tile!(tile_avxvnni, "avx2,fma,f16c,avxvnni", lanes_avxvnni);
    define_tile!(
        tile_vnni,
        "avx2,fma,f16c,avx512f,avx512vnni,avx512vl",
        lanes_vnni
    );
}
