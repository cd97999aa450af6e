//! The x86 bodies of `flash_tile_codes` (AVX2, AVX-VNNI, AVX-512 VNNI): the code-word
//! transposes, query quantisation, integer score blocks and the coded-V / sealed-`int4c` row
//! steps, each performing exactly the operations of the portable definition in the parent
//! module. Callers check the features at runtime; nothing here allocates or reads a KV store.

use super::super::flash_tile::avx2::{finish_rows, ValueRows};
use super::super::flash_tile_wide::x86::{finish, scores16, softmax16};

/// `flash_tile_wide`'s step for `R` rows with V read as codes.
///
/// # Safety
/// AVX-512 F, AVX2, FMA, F16C present; shapes as [`tile_update_wide_codes`] asserts.
#[target_feature(enable = "avx512f,avx512vl,avx2,fma,f16c")]
pub(super) unsafe fn wide_rows<const R: usize>(
    sts: &mut [TileSoftmax; R],
    accs: &mut [&mut [f32]; R],
    qs: &[&[f32]; R],
    valid: usize,
    kt: &[f32],
    vals: &EncodedRows<'_>,
    scale: f32,
) {
    // SAFETY: forwarded caller's contract.
    let s = unsafe { scores16::<R>(qs, kt, scale) };
    // SAFETY: as above; `softmax16` masks positions past `valid`.
    let p = unsafe { softmax16::<R>(sts, accs, s, valid) };
    let aps: [*mut f32; R] = std::array::from_fn(|r| accs[r].as_mut_ptr());
    // SAFETY: every accumulator holds `hd` floats; `vals` holds `valid` rows of an
    // accepted codec (asserted by the caller).
    unsafe { pv_codes::<R>(&aps, vals, &p, valid) };
}
use super::*;
use std::arch::x86_64::*;

/// 16 rows of 16 dwords at `src + t · stride` transposed into `kt[(j0 + j) · 16 + t]`.
///
/// # Safety
/// AVX-512 F present; `src + t·stride` readable for 64 bytes for `t < 16`; `kt` holds
/// `(j0 + 16) · 16` words.
#[target_feature(enable = "avx512f,avx2")]
pub(super) unsafe fn transpose16(src: *const u8, stride: usize, kt: &mut [u32], j0: usize) {
    assert!(kt.len() >= (j0 + 16) * TILE_POSITIONS);
    // SAFETY: caller's contract (16 readable rows of 64 bytes).
    let r: [__m512i; 16] =
        std::array::from_fn(|t| unsafe { _mm512_loadu_si512(src.add(t * stride).cast()) });
    let t: [__m512i; 16] = std::array::from_fn(|i| {
        let (a, b) = (r[2 * (i / 2)], r[2 * (i / 2) + 1]);
        if i % 2 == 0 {
            _mm512_unpacklo_epi32(a, b)
        } else {
            _mm512_unpackhi_epi32(a, b)
        }
    });
    // u[4g + k]: within each 128-bit lane L, dword 4L + k of rows 4g..4g + 4.
    let u: [__m512i; 16] = std::array::from_fn(|i| {
        let (g, k) = (i / 4, i % 4);
        let (a, b) = (t[4 * g + (k / 2)], t[4 * g + 2 + (k / 2)]);
        if k % 2 == 0 {
            _mm512_unpacklo_epi64(a, b)
        } else {
            _mm512_unpackhi_epi64(a, b)
        }
    });
    let dp = kt.as_mut_ptr();
    for k in 0..4 {
        let v0 = _mm512_shuffle_i32x4::<0x44>(u[k], u[4 + k]);
        let v1 = _mm512_shuffle_i32x4::<0xEE>(u[k], u[4 + k]);
        let v2 = _mm512_shuffle_i32x4::<0x44>(u[8 + k], u[12 + k]);
        let v3 = _mm512_shuffle_i32x4::<0xEE>(u[8 + k], u[12 + k]);
        let outs = [
            (k, _mm512_shuffle_i32x4::<0x88>(v0, v2)),
            (4 + k, _mm512_shuffle_i32x4::<0xDD>(v0, v2)),
            (8 + k, _mm512_shuffle_i32x4::<0x88>(v1, v3)),
            (12 + k, _mm512_shuffle_i32x4::<0xDD>(v1, v3)),
        ];
        for (c, o) in outs {
            // SAFETY: row `j0 + c < j0 + 16` of `kt` (asserted above).
            unsafe { _mm512_storeu_si512(dp.add((j0 + c) * TILE_POSITIONS).cast(), o) };
        }
    }
}

/// [`CodedTile::widen_channels`] 16 positions at a time.
///
/// # Safety
/// AVX-512 F present; `kt` holds `scales.len() / 4 · 16` words, `kt32` `scales.len() · 16`
/// floats, `offsets` as many as `scales`.
#[target_feature(enable = "avx512f,avx2,fma")]
pub(super) unsafe fn widen_channels(kt: &[u32], scales: &[f32], offsets: &[f32], kt32: &mut [f32]) {
    let hd = scales.len();
    assert!(kt.len() >= hd / 4 * 16 && kt32.len() >= hd * 16 && offsets.len() >= hd);
    let low = _mm512_set1_epi32(0xFF);
    let dp = kt32.as_mut_ptr();
    for j in 0..hd / 4 {
        // SAFETY: row `j < hd / 4` of `kt` holds 16 words.
        let w = unsafe { _mm512_loadu_si512(kt.as_ptr().add(16 * j).cast()) };
        let bytes = [
            _mm512_and_si512(w, low),
            _mm512_and_si512(_mm512_srli_epi32::<8>(w), low),
            _mm512_and_si512(_mm512_srli_epi32::<16>(w), low),
            _mm512_srli_epi32::<24>(w),
        ];
        for (i, b) in bytes.into_iter().enumerate() {
            let c = 4 * j + i;
            let x = _mm512_fmadd_ps(
                _mm512_cvtepi32_ps(b),
                _mm512_set1_ps(scales[c]),
                _mm512_set1_ps(offsets[c]),
            );
            // SAFETY: row `c < hd` of `kt32` holds 16 floats.
            unsafe { _mm512_storeu_ps(dp.add(16 * c), x) };
        }
    }
}

/// [`unpack_nibbles`](super::unpack_nibbles) 16 bytes at a time.
///
/// # Safety
/// AVX2 present; `out.len() == 2 · packed.len()`.
#[target_feature(enable = "avx2")]
pub(super) unsafe fn unpack_nibbles(packed: &[u8], out: &mut [u8]) {
    let mask = _mm_set1_epi8(0x0F);
    let mut i = 0;
    while i + 16 <= packed.len() {
        // SAFETY: bytes `i..i + 16` of `packed`, `2i..2i + 32` of `out`.
        unsafe {
            let v = _mm_loadu_si128(packed.as_ptr().add(i).cast());
            let lo = _mm_and_si128(v, mask);
            let hi = _mm_and_si128(_mm_srli_epi16::<4>(v), mask);
            let op = out.as_mut_ptr().add(2 * i);
            _mm_storeu_si128(op.cast(), _mm_unpacklo_epi8(lo, hi));
            _mm_storeu_si128(op.add(16).cast(), _mm_unpackhi_epi8(lo, hi));
        }
        i += 16;
    }
    for j in i..packed.len() {
        out[2 * j] = packed[j] & 0x0F;
        out[2 * j + 1] = packed[j] >> 4;
    }
}

/// [`quantize_def`] in 512-bit lanes: the same maximum (order-free), product, rounding
/// and clamp per element (NaN elements to 0, as Rust's saturating cast does), exact sums.
#[target_feature(enable = "avx512f,avx512vl,avx2,fma,f16c")]
pub(super) unsafe fn quantize(x: &[f32], out: &mut [u32]) -> (f32, f32) {
    let n = x.len();
    assert!(n.is_multiple_of(16) && out.len() * 4 == n);
    let xp = x.as_ptr();
    let mut m = _mm512_setzero_ps();
    for i in (0..n).step_by(16) {
        // SAFETY: `i + 16 <= n`.
        let v = unsafe { _mm512_loadu_ps(xp.add(i)) };
        // `max(|v|, m)` returns `m` for a NaN `v` (f32::max ignores NaN too).
        m = _mm512_max_ps(_mm512_abs_ps(v), m);
    }
    let a = _mm512_reduce_max_ps(m);
    if !(a > 0.0 && a.is_finite()) {
        out.fill(0);
        return (0.0, 0.0);
    }
    let viq = _mm512_set1_ps(127.0 / a);
    let (lo, hi) = (_mm512_set1_ps(-127.0), _mm512_set1_ps(127.0));
    let mut sum = _mm512_setzero_si512();
    let op = out.as_mut_ptr();
    for i in (0..n).step_by(16) {
        // SAFETY: `i + 16 <= n`.
        let v = unsafe { _mm512_loadu_ps(xp.add(i)) };
        let y = _mm512_roundscale_ps::<{ _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC }>(
            _mm512_mul_ps(v, viq),
        );
        let y = _mm512_min_ps(_mm512_max_ps(y, lo), hi);
        let finite = _mm512_cmp_ps_mask::<_CMP_ORD_Q>(v, v);
        let q = _mm512_maskz_mov_epi32(finite, _mm512_cvttps_epi32(y));
        sum = _mm512_add_epi32(sum, q);
        // SAFETY: words `i/4..i/4 + 4` of `out` (16 bytes).
        unsafe { _mm_storeu_si128(op.add(i / 4).cast(), _mm512_cvtepi32_epi8(q)) };
    }
    (a / 127.0, _mm512_reduce_add_epi32(sum) as f32)
}

/// [`channel_bias_def`] compiled for AVX-512 (same operations).
#[target_feature(enable = "avx512f,avx512vl,avx2,fma,f16c")]
pub(super) unsafe fn channel_bias(q: &[f32], offsets: &[f32]) -> f32 {
    channel_bias_def(q, offsets)
}

/// The 16 positions' integer dot products of `q8` with the tile, in 256-bit registers:
/// `vpdpbusd` (AVX-512 VNNI VL or AVX-VNNI) or AVX2's exact `vpmaddwd` on bytes split into
/// 16-bit halves.
///
/// # Safety
/// AVX2 present (and the VNNI form used only when `features` says so, clamped);
/// `kt.len() >= q8.len() · 16`.
#[target_feature(enable = "avx2,fma")]
pub(super) unsafe fn dots16(features: CpuFeatures, q8: &[u32], kt: &[u32]) -> [i32; 16] {
    assert!(kt.len() >= q8.len() * TILE_POSITIONS);
    let mut out = [0i32; 16];
    let kp = kt.as_ptr();
    for h in 0..2 {
        // SAFETY: words `16j + 8h .. + 8` of `kt` for `j < q8.len()` (asserted above).
        let acc = unsafe {
            if features.vnni {
                dots8_vnni(q8, kp.add(8 * h))
            } else if features.avxvnni {
                dots8_avxvnni(q8, kp.add(8 * h))
            } else {
                dots8_madd(q8, kp.add(8 * h))
            }
        };
        // SAFETY: `out` holds 16 i32.
        unsafe { _mm256_storeu_si256(out.as_mut_ptr().add(8 * h).cast(), acc) };
    }
    out
}

/// # Safety
/// AVX-512 VNNI+VL present; `kp + 16j` readable for 8 words, `j < q8.len()`.
#[target_feature(enable = "avx2,avx512f,avx512vl,avx512vnni")]
unsafe fn dots8_vnni(q8: &[u32], kp: *const u32) -> __m256i {
    let mut acc = _mm256_setzero_si256();
    for (j, &w) in q8.iter().enumerate() {
        // SAFETY: caller's contract.
        let k = unsafe { _mm256_loadu_si256(kp.add(16 * j).cast()) };
        acc = _mm256_dpbusd_epi32(acc, k, _mm256_set1_epi32(w as i32));
    }
    acc
}

/// # Safety
/// AVX-VNNI present; `kp + 16j` readable for 8 words, `j < q8.len()`.
#[target_feature(enable = "avx2,avxvnni")]
unsafe fn dots8_avxvnni(q8: &[u32], kp: *const u32) -> __m256i {
    let mut acc = _mm256_setzero_si256();
    for (j, &w) in q8.iter().enumerate() {
        // SAFETY: caller's contract.
        let k = unsafe { _mm256_loadu_si256(kp.add(16 * j).cast()) };
        acc = _mm256_dpbusd_avx_epi32(acc, k, _mm256_set1_epi32(w as i32));
    }
    acc
}

/// # Safety
/// AVX2 present; `kp + 16j` readable for 8 words, `j < q8.len()`.
#[target_feature(enable = "avx2")]
unsafe fn dots8_madd(q8: &[u32], kp: *const u32) -> __m256i {
    let low = _mm256_set1_epi16(0x00FF);
    let mut acc = _mm256_setzero_si256();
    for (j, &w) in q8.iter().enumerate() {
        let (even_pair, odd_pair) = query_pairs(w);
        let q_even = _mm256_set1_epi32(even_pair as i32);
        let q_odd = _mm256_set1_epi32(odd_pair as i32);
        // SAFETY: caller's contract.
        let k = unsafe { _mm256_loadu_si256(kp.add(16 * j).cast()) };
        let even = _mm256_and_si256(k, low);
        let odd = _mm256_srli_epi16::<8>(k);
        acc = _mm256_add_epi32(acc, _mm256_madd_epi16(even, q_even));
        acc = _mm256_add_epi32(acc, _mm256_madd_epi16(odd, q_odd));
    }
    acc
}

/// 8 rows of 8 dwords at `src + t · stride` transposed into `kt[(j0 + j) · 16 + p0 + t]`.
///
/// # Safety
/// AVX2 present; `src + t·stride` readable for 32 bytes for `t < 8`; `kt` holds
/// `(j0 + 7) · 16 + p0 + 8` words.
#[target_feature(enable = "avx2")]
pub(super) unsafe fn transpose8(
    src: *const u8,
    stride: usize,
    kt: &mut [u32],
    j0: usize,
    p0: usize,
) {
    assert!(kt.len() >= (j0 + 7) * TILE_POSITIONS + p0 + 8);
    // SAFETY: caller's contract (8 readable rows of 32 bytes).
    let columns = unsafe { columns8(src, stride) };
    let dp = kt.as_mut_ptr();
    for (j, column) in columns.into_iter().enumerate() {
        // SAFETY: words `(j0 + j) · 16 + p0 .. + 8` for `j < 8` (asserted above).
        unsafe { _mm256_storeu_si256(dp.add((j0 + j) * TILE_POSITIONS + p0).cast(), column) };
    }
}

/// The 8 dword columns of the 8 rows of 32 bytes at `src + t · stride`: lane `t` of column `j`
/// is dword `j` of row `t`.
///
/// # Safety
/// AVX2 present; `src + t·stride` readable for 32 bytes for `t < 8`.
#[target_feature(enable = "avx2")]
#[inline]
unsafe fn columns8(src: *const u8, stride: usize) -> [__m256i; 8] {
    // SAFETY: caller's contract (8 readable rows of 32 bytes).
    let r: [__m256i; 8] =
        std::array::from_fn(|t| unsafe { _mm256_loadu_si256(src.add(t * stride).cast()) });
    // t[2i], t[2i + 1]: dwords of rows 2i, 2i + 1 interleaved (low, high pairs per lane).
    let t: [__m256i; 8] = std::array::from_fn(|i| {
        let (a, b) = (r[2 * (i / 2)], r[2 * (i / 2) + 1]);
        if i % 2 == 0 {
            _mm256_unpacklo_epi32(a, b)
        } else {
            _mm256_unpackhi_epi32(a, b)
        }
    });
    // u[4g + k]: columns k (low lane) and k + 4 (high lane) of rows 4g..4g + 4.
    let u: [__m256i; 8] = std::array::from_fn(|i| {
        let (g, k) = (i / 4, i % 4);
        let (a, b) = (t[4 * g + k / 2], t[4 * g + 2 + k / 2]);
        if k % 2 == 0 {
            _mm256_unpacklo_epi64(a, b)
        } else {
            _mm256_unpackhi_epi64(a, b)
        }
    });
    std::array::from_fn(|j| {
        let k = j % 4;
        if j < 4 {
            _mm256_permute2x128_si256::<0x20>(u[k], u[4 + k])
        } else {
            _mm256_permute2x128_si256::<0x31>(u[k], u[4 + k])
        }
    })
}

/// [`CodedTile::widen_channel_rows`](super::CodedTile::widen_channel_rows) for 8 rows: the
/// packed codes (channel `2k` in the low nibble of byte `k`, so channel `8j + i` in bits
/// `4i..4i + 4` of dword `j`) transposed as dwords, then each channel widened,
/// `kt32[c · 16 + p0 + t] = fma(code_{t,c}, scales[c], offsets[c])` for `t < 8`, `c < hd`.
///
/// # Safety
/// AVX2 and FMA present; `src + t·stride` readable for `hd / 2` bytes for `t < 8`, where
/// `hd = scales.len()`.
#[target_feature(enable = "avx2,fma")]
pub(super) unsafe fn widen_packed8(
    src: *const u8,
    stride: usize,
    scales: &[f32],
    offsets: &[f32],
    kt32: &mut [f32],
    p0: usize,
) {
    let hd = scales.len();
    assert!(
        hd.is_multiple_of(64)
            && offsets.len() >= hd
            && kt32.len() >= hd * TILE_POSITIONS
            && p0 + 8 <= TILE_POSITIONS
    );
    let nibble = _mm256_set1_epi32(0x0F);
    let dp = kt32.as_mut_ptr();
    for block in 0..hd / 64 {
        // SAFETY: bytes `32·block..32·block + 32 <= hd / 2` of each row (caller's contract).
        let columns = unsafe { columns8(src.add(32 * block), stride) };
        for (j, w) in columns.into_iter().enumerate() {
            for i in 0..8 {
                let c = 64 * block + 8 * j + i;
                let code =
                    _mm256_and_si256(_mm256_srl_epi32(w, _mm_cvtsi32_si128(4 * i as i32)), nibble);
                let x = _mm256_fmadd_ps(
                    _mm256_cvtepi32_ps(code),
                    _mm256_set1_ps(scales[c]),
                    _mm256_set1_ps(offsets[c]),
                );
                // SAFETY: floats `c · 16 + p0 .. + 8` with `c < hd`, `p0 + 8 <= 16` (asserted).
                unsafe { _mm256_storeu_ps(dp.add(c * TILE_POSITIONS + p0), x) };
            }
        }
    }
}

/// The eight nibbles of the 4 bytes at `p` (element `2k` low, `2k + 1` high in byte `k`)
/// as 32-bit lanes in element order: the word broadcast, lane `i` shifted right by `4i`.
///
/// # Safety
/// AVX2 present; `p` readable for 4 bytes.
#[target_feature(enable = "avx2")]
#[inline]
unsafe fn nibbles8(p: *const u8) -> __m256i {
    // SAFETY: caller's contract; `read_unaligned` has no alignment need.
    let w = _mm256_set1_epi32(unsafe { p.cast::<i32>().read_unaligned() });
    let shifts = _mm256_setr_epi32(0, 4, 8, 12, 16, 20, 24, 28);
    _mm256_and_si256(_mm256_srlv_epi32(w, shifts), _mm256_set1_epi32(0x0F))
}

/// V rows kept as `int8` / `int4` codes, decoded in the register on load:
/// `fma(code, scale_g, offset_g)` (what `quant::decode_rows` gives, bit for bit).
#[derive(Clone, Copy)]
pub(super) struct CodedRows<const FOUR_BIT: bool, const ONE_GROUP: bool> {
    base: *const u8,
    row_bytes: usize,
    /// Byte offset of the codes in a row (after the `(scale, offset)` f16 pairs).
    codes_at: usize,
    /// Per 8-element chunk `c`, the byte offset `4 · (8c / group)` of its group's pair.
    pair_at: [u8; MAX_CODED_HEAD_DIM / 8],
}

/// A row of [`CodedRows`] opened for its loads: its first byte and, when one group spans the
/// row (`ONE_GROUP`: `group == hd`, `int8`'s default), that group's scale and offset broadcast
/// (widened once per row instead of once per load).
#[derive(Clone, Copy)]
pub(super) struct CodedRow {
    row: *const u8,
    scale: __m256,
    offset: __m256,
}

/// The `(scale, offset)` f16 pair at `at`, widened and broadcast.
///
/// # Safety
/// F16C and AVX2 present; `at` holds 4 bytes.
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
unsafe fn pair_at(at: *const u8) -> (__m256, __m256) {
    // SAFETY: 4 bytes at `at` (caller's contract).
    let pair = _mm_cvtph_ps(_mm_cvtsi32_si128(unsafe {
        at.cast::<i32>().read_unaligned()
    }));
    (
        _mm256_broadcastss_ps(pair),
        _mm256_broadcastss_ps(_mm_movehdup_ps(pair)),
    )
}

/// Whether rows of `v` (a codec [`values_from_codes`] accepts) are one group each.
pub(super) fn one_group(v: &EncodedRows<'_>) -> bool {
    matches!(v.kind(), KvCodecKind::Int8 { group } | KvCodecKind::Int4 { group }
        if group == v.head_dim())
}

impl<const FOUR_BIT: bool, const ONE_GROUP: bool> CodedRows<FOUR_BIT, ONE_GROUP> {
    /// The rows of `v` (a codec [`values_from_codes`] accepts, `int4` iff `FOUR_BIT`, one
    /// group per row iff `ONE_GROUP`).
    pub(super) fn new(v: &EncodedRows<'_>) -> Self {
        let hd = v.head_dim();
        let group = match v.kind() {
            KvCodecKind::Int8 { group } if !FOUR_BIT => group,
            KvCodecKind::Int4 { group } if FOUR_BIT => group,
            k => unreachable!("coded values of {k:?}"),
        };
        assert!(
            values_from_codes(v.kind(), hd)
                && hd <= MAX_CODED_HEAD_DIM
                && ONE_GROUP == (group == hd)
        );
        let mut pair_at = [0u8; MAX_CODED_HEAD_DIM / 8];
        for (c, p) in pair_at.iter_mut().enumerate().take(hd / 8) {
            // `hd / group <= 32` pairs (groups of at least 16), so `4g < 128`.
            *p = (4 * (8 * c / group)) as u8;
        }
        CodedRows {
            base: v.bytes().as_ptr(),
            row_bytes: v.row_bytes(),
            codes_at: 4 * (hd / group),
            pair_at,
        }
    }
}

impl<const FOUR_BIT: bool, const ONE_GROUP: bool> ValueRows for CodedRows<FOUR_BIT, ONE_GROUP> {
    type Row = CodedRow;

    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn row(self, t: usize) -> CodedRow {
        // SAFETY: row `t` lies in the tile (caller's contract); its first pair is its first
        // 4 bytes.
        unsafe {
            let row = self.base.add(t * self.row_bytes);
            let (scale, offset) = if ONE_GROUP {
                pair_at(row)
            } else {
                (_mm256_setzero_ps(), _mm256_setzero_ps())
            };
            CodedRow { row, scale, offset }
        }
    }

    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn load8_in(self, row: CodedRow, e: usize) -> __m256 {
        // SAFETY: AVX2+FMA+F16C present and the row holds elements `e..e + 8` (caller's
        // contract): its group's pair and codes lie inside the row.
        unsafe {
            let (sc, of) = if ONE_GROUP {
                (row.scale, row.offset)
            } else {
                pair_at(row.row.add(self.pair_at[e / 8] as usize))
            };
            let codes = row.row.add(self.codes_at);
            let c = if FOUR_BIT {
                nibbles8(codes.add(e / 2))
            } else {
                _mm256_cvtepu8_epi32(_mm_loadl_epi64(codes.add(e).cast()))
            };
            _mm256_fmadd_ps(_mm256_cvtepi32_ps(c), sc, of)
        }
    }
}

/// K rows of a sealed `int4c` group as nibble codes, decoded in the register on load:
/// `fma(code, σ_c, ω_c)` (what `quant::decode_rows` gives, bit for bit).
#[derive(Clone, Copy)]
pub(super) struct ChannelRows {
    pub(super) codes: *const u8,
    pub(super) row_bytes: usize,
    pub(super) scales: *const f32,
    pub(super) offsets: *const f32,
}

impl ValueRows for ChannelRows {
    type Row = *const u8;

    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn row(self, t: usize) -> *const u8 {
        // SAFETY: row `t` lies in the group (caller's contract).
        unsafe { self.codes.add(t * self.row_bytes) }
    }

    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn load8_in(self, row: *const u8, e: usize) -> __m256 {
        // SAFETY: AVX2+FMA+F16C present; the row holds elements `e..e + 8` (bytes
        // `e/2..e/2 + 4`) and the parameters `hd >= e + 8` channels (caller's contract).
        unsafe {
            let c = nibbles8(row.add(e / 2));
            _mm256_fmadd_ps(
                _mm256_cvtepi32_ps(c),
                _mm256_loadu_ps(self.scales.add(e)),
                _mm256_loadu_ps(self.offsets.add(e)),
            )
        }
    }
}

/// The integer dot products of `R` query rows with the tile's first `8H` positions, every
/// K load shared: AVX2's exact `vpmaddwd` on the codes split into even and odd bytes
/// (zero-extended) against the query bytes sign-extended to 16 bits.
///
/// # Safety
/// AVX2 present; `kt.len() >= words · 16` with `words = qs[r].q8.len()` and
/// `qs[r].pairs.len() == 2 · words` for every row.
#[allow(clippy::needless_range_loop)]
#[target_feature(enable = "avx2")]
#[inline]
unsafe fn dots_madd<const R: usize, const H: usize>(
    qs: &[QueryRef<'_>; R],
    kt: &[u32],
    out: &mut [[i32; TILE_POSITIONS]; R],
) {
    let words = qs[0].q8.len();
    debug_assert!(qs.iter().all(|q| q.pairs.len() == 2 * words));
    let pairs: [*const u32; R] = std::array::from_fn(|r| qs[r].pairs.as_ptr());
    let kp = kt.as_ptr();
    let low = _mm256_set1_epi16(0x00FF);
    let mut acc = [[_mm256_setzero_si256(); H]; R];
    for j in 0..words {
        let mut even = [_mm256_setzero_si256(); H];
        let mut odd = [_mm256_setzero_si256(); H];
        for h in 0..H {
            // SAFETY: words `16j + 8h .. + 8` of `kt` (caller's contract).
            let k = unsafe { _mm256_loadu_si256(kp.add(16 * j + 8 * h).cast()) };
            even[h] = _mm256_and_si256(k, low);
            odd[h] = _mm256_srli_epi16::<8>(k);
        }
        for r in 0..R {
            // Bytes 0, 2 (even) and 1, 3 (odd) of the word as signed 16-bit lanes, prepared
            // with the query (`QueryCodes`' pairs): broadcast from memory.
            // SAFETY: `2j + 1 < 2 · words = pairs.len()` (caller's contract).
            let (q_even, q_odd) = unsafe {
                (
                    _mm256_set1_epi32(*pairs[r].add(2 * j) as i32),
                    _mm256_set1_epi32(*pairs[r].add(2 * j + 1) as i32),
                )
            };
            for h in 0..H {
                let x = _mm256_add_epi32(
                    _mm256_madd_epi16(even[h], q_even),
                    _mm256_madd_epi16(odd[h], q_odd),
                );
                acc[r][h] = _mm256_add_epi32(acc[r][h], x);
            }
        }
    }
    for r in 0..R {
        for h in 0..H {
            // SAFETY: `8h + 8 <= 16` integers of `out[r]`.
            unsafe { _mm256_storeu_si256(out[r].as_mut_ptr().add(8 * h).cast(), acc[r][h]) };
        }
    }
}

/// `R` rows sharing `valid` on AVX2: integer dot products ([`dots_madd`], every K load
/// shared; or [`dots16`] per row where a VNNI form is present — the same integers), the
/// module doc's scores eight positions at a time, then `flash_tile`'s shared steps 2–4
/// (`W` accumulator chunks per row in registers).
///
/// # Safety
/// AVX2, FMA, F16C present (VNNI forms used only when `features` says so, clamped); shapes
/// as [`tile_update_codes`] asserts, `vals` holding `valid` rows of `hd`.
#[allow(clippy::too_many_arguments, clippy::needless_range_loop)]
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn rows_avx2<V: ValueRows, const R: usize, const W: usize>(
    features: CpuFeatures,
    keys: KeyCodes,
    sts: &mut [TileSoftmax; R],
    accs: &mut [&mut [f32]; R],
    qs: &[QueryRef<'_>; R],
    valid: usize,
    tile: &CodedTile,
    vals: V,
    scale: f32,
) {
    let halves = valid.div_ceil(8);
    let mut dots = [[0i32; TILE_POSITIONS]; R];
    if features.vnni || features.avxvnni {
        for r in 0..R {
            // SAFETY: forwarded caller's contract.
            dots[r] = unsafe { dots16(features, qs[r].q8, &tile.kt) };
        }
    } else if halves == 1 {
        // SAFETY: the tile holds `hd / 4 · 16` words (caller's contract).
        unsafe { dots_madd::<R, 1>(qs, &tile.kt, &mut dots) };
    } else {
        // SAFETY: as above.
        unsafe { dots_madd::<R, 2>(qs, &tile.kt, &mut dots) };
    }
    let vscale = _mm256_set1_ps(scale);
    let lane_ids = _mm256_setr_ps(0.0, 1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0);
    let mut scores = [[f32::NEG_INFINITY; TILE_POSITIONS]; R];
    let mut vmax = [_mm256_set1_ps(f32::NEG_INFINITY); R];
    for h in 0..halves {
        // SAFETY: `8h + 8 <= 16` floats of each array.
        let (ks, ko) = unsafe {
            (
                _mm256_loadu_ps(tile.k_scale.as_ptr().add(8 * h)),
                _mm256_loadu_ps(tile.k_offset.as_ptr().add(8 * h)),
            )
        };
        // Lanes at or past `valid` become −∞ (weight exactly 0, never the maximum).
        let limit = _mm256_set1_ps((valid - 8 * h) as f32);
        let live = _mm256_cmp_ps::<_CMP_LT_OQ>(lane_ids, limit);
        for r in 0..R {
            let q = &qs[r];
            // SAFETY: `8h + 8 <= 16` integers of `dots[r]`.
            let d = _mm256_cvtepi32_ps(unsafe {
                _mm256_loadu_si256(dots[r].as_ptr().add(8 * h).cast())
            });
            let s = match keys {
                KeyCodes::Rows => {
                    let off = _mm256_mul_ps(ko, _mm256_set1_ps(q.sum8));
                    let x = _mm256_fmadd_ps(ks, d, off);
                    _mm256_mul_ps(_mm256_mul_ps(x, _mm256_set1_ps(q.s)), vscale)
                }
                KeyCodes::Channels => _mm256_mul_ps(
                    _mm256_fmadd_ps(_mm256_set1_ps(q.s), d, _mm256_set1_ps(q.bias)),
                    vscale,
                ),
            };
            let s = _mm256_blendv_ps(_mm256_set1_ps(f32::NEG_INFINITY), s, live);
            // SAFETY: `8h + 8 <= 16` floats of `scores[r]`.
            unsafe { _mm256_storeu_ps(scores[r].as_mut_ptr().add(8 * h), s) };
            vmax[r] = _mm256_max_ps(vmax[r], s);
        }
    }
    // SAFETY: forwarded caller's contract.
    unsafe { finish_rows::<V, R, W>(sts, accs, &scores, &vmax, vals, valid) };
}

/// `R` rows sharing `valid`: scores of 16 positions from `vpdpbusd` (two chains per row),
/// scaled as the module doc says, then `flash_tile_wide`'s steps 2–4.
///
/// # Safety
/// AVX-512 F+VL+VNNI, AVX2, FMA, F16C present; shapes as [`tile_update_codes`] asserts.
#[allow(clippy::too_many_arguments, clippy::needless_range_loop)]
#[target_feature(enable = "avx512f,avx512vl,avx512vnni,avx2,fma,f16c")]
pub(super) unsafe fn rows<const R: usize>(
    keys: KeyCodes,
    sts: &mut [TileSoftmax; R],
    accs: &mut [&mut [f32]; R],
    qs: &[QueryRef<'_>; R],
    valid: usize,
    tile: &CodedTile,
    vals: TileValues<'_>,
    scale: f32,
) {
    let words = tile.hd / 4;
    let kp = tile.kt.as_ptr();
    let mut a = [[_mm512_setzero_si512(); 2]; R];
    let mut j = 0;
    while j + 2 <= words {
        for h in 0..2 {
            // SAFETY: row `j + h < words` of the tile holds 16 words.
            let k = unsafe { _mm512_loadu_si512(kp.add((j + h) * TILE_POSITIONS).cast()) };
            for r in 0..R {
                let q = _mm512_set1_epi32(qs[r].q8[j + h] as i32);
                a[r][h] = _mm512_dpbusd_epi32(a[r][h], k, q);
            }
        }
        j += 2;
    }
    if j < words {
        // SAFETY: row `j < words` of the tile holds 16 words.
        let k = unsafe { _mm512_loadu_si512(kp.add(j * TILE_POSITIONS).cast()) };
        for r in 0..R {
            let q = _mm512_set1_epi32(qs[r].q8[j] as i32);
            a[r][0] = _mm512_dpbusd_epi32(a[r][0], k, q);
        }
    }
    let vscale = _mm512_set1_ps(scale);
    // SAFETY: the arrays hold 16 floats.
    let (ks, ko) = unsafe {
        (
            _mm512_loadu_ps(tile.k_scale.as_ptr()),
            _mm512_loadu_ps(tile.k_offset.as_ptr()),
        )
    };
    let s: [__m512; R] = std::array::from_fn(|r| {
        let d = _mm512_cvtepi32_ps(_mm512_add_epi32(a[r][0], a[r][1]));
        let q = &qs[r];
        match keys {
            KeyCodes::Rows => {
                let off = _mm512_mul_ps(ko, _mm512_set1_ps(q.sum8));
                let x = _mm512_fmadd_ps(ks, d, off);
                _mm512_mul_ps(_mm512_mul_ps(x, _mm512_set1_ps(q.s)), vscale)
            }
            KeyCodes::Channels => _mm512_mul_ps(
                _mm512_fmadd_ps(_mm512_set1_ps(q.s), d, _mm512_set1_ps(q.bias)),
                vscale,
            ),
        }
    });
    match vals {
        // SAFETY: forwarded caller's contract (`finish` masks positions past `valid`).
        TileValues::Decoded(v) => unsafe { finish::<R>(sts, accs, s, valid, v) },
        TileValues::Codes(v) => {
            // SAFETY: as above; `softmax16` masks positions past `valid`.
            let p = unsafe { softmax16::<R>(sts, accs, s, valid) };
            let aps: [*mut f32; R] = std::array::from_fn(|r| accs[r].as_mut_ptr());
            // SAFETY: every accumulator holds `hd` floats; `v` holds `valid` rows of an
            // accepted codec (asserted by `tile_update_codes`).
            unsafe { pv_codes::<R>(&aps, &v, &p, valid) };
        }
    }
}

/// Sixteen values of an integer row decoded in a register: `fma(code, scale, offset)` for
/// elements `e0..e0 + 16` (one group).
///
/// # Safety
/// AVX-512 F present; `row` is one row of an accepted codec of `hd` values, `e0 + 16 <= hd`.
#[target_feature(enable = "avx512f,avx512vl,avx2,fma,f16c")]
#[inline]
unsafe fn value16(row: *const u8, hd: usize, group: usize, four_bit: bool, e0: usize) -> __m512 {
    let g = e0 / group;
    // SAFETY: the header holds `hd / group` (scale, offset) f16 pairs (caller's contract).
    let (sc, of) = unsafe {
        let pair = _mm_cvtph_ps(_mm_cvtsi32_si128(
            row.add(4 * g).cast::<i32>().read_unaligned(),
        ));
        (
            _mm512_broadcastss_ps(pair),
            _mm512_broadcastss_ps(_mm_movehdup_ps(pair)),
        )
    };
    let codes = row.wrapping_add(4 * (hd / group));
    let c = if four_bit {
        // SAFETY: bytes `e0/2..e0/2 + 8` of the codes (caller's contract).
        let v = unsafe { _mm_loadl_epi64(codes.add(e0 / 2).cast()) };
        let mask = _mm_set1_epi8(0x0F);
        let lo = _mm_and_si128(v, mask);
        let hi = _mm_and_si128(_mm_srli_epi16::<4>(v), mask);
        _mm512_cvtepu8_epi32(_mm_unpacklo_epi8(lo, hi))
    } else {
        // SAFETY: bytes `e0..e0 + 16` of the codes (caller's contract).
        _mm512_cvtepu8_epi32(unsafe { _mm_loadu_si128(codes.add(e0).cast()) })
    };
    _mm512_fmadd_ps(_mm512_cvtepi32_ps(c), sc, of)
}

/// Step 4 over coded values: `acc_r += p[r][t]·v̂[t]` in position order, `v̂` decoded in
/// registers, four vectors per row held at a time.
///
/// # Safety
/// AVX-512 F present; every `aps[r]` holds `hd` floats; `v` holds `valid` rows of a codec
/// [`values_from_codes`] accepts.
#[allow(clippy::needless_range_loop)]
#[target_feature(enable = "avx512f,avx512vl,avx2,fma,f16c")]
unsafe fn pv_codes<const R: usize>(
    aps: &[*mut f32; R],
    v: &EncodedRows<'_>,
    p: &[[f32; TILE_POSITIONS]; R],
    valid: usize,
) {
    let hd = v.head_dim();
    let (group, four_bit) = match v.kind() {
        KvCodecKind::Int8 { group } => (group, false),
        KvCodecKind::Int4 { group } => (group, true),
        _ => unreachable!("checked by values_from_codes"),
    };
    let (base, rb) = (v.bytes().as_ptr(), v.row_bytes());
    let mut e0 = 0;
    while e0 + 64 <= hd {
        // SAFETY: elements `e0..e0 + 64 <= hd` (caller's contract).
        unsafe { pv_block::<R, 4>(aps, base, rb, hd, group, four_bit, e0, p, valid) };
        e0 += 64;
    }
    while e0 < hd {
        // SAFETY: elements `e0..e0 + 16 <= hd` (`hd` is a multiple of 16).
        unsafe { pv_block::<R, 1>(aps, base, rb, hd, group, four_bit, e0, p, valid) };
        e0 += 16;
    }
}

/// [`pv_codes`] for elements `e0..e0 + 16W`, the `W` accumulators of every row held in
/// registers (a constant width, so they never leave them).
///
/// # Safety
/// As [`pv_codes`]; `e0 + 16W <= hd`; `base + t·rb` is row `t < valid`.
#[allow(clippy::too_many_arguments, clippy::needless_range_loop)]
#[target_feature(enable = "avx512f,avx512vl,avx2,fma,f16c")]
#[inline]
unsafe fn pv_block<const R: usize, const W: usize>(
    aps: &[*mut f32; R],
    base: *const u8,
    rb: usize,
    hd: usize,
    group: usize,
    four_bit: bool,
    e0: usize,
    p: &[[f32; TILE_POSITIONS]; R],
    valid: usize,
) {
    let mut acc = [[_mm512_setzero_ps(); W]; R];
    for r in 0..R {
        for i in 0..W {
            // SAFETY: elements `e0 + 16i + 16 <= hd` of the accumulator.
            acc[r][i] = unsafe { _mm512_loadu_ps(aps[r].add(e0 + 16 * i)) };
        }
    }
    for t in 0..valid {
        let bp: [__m512; R] = std::array::from_fn(|r| _mm512_set1_ps(p[r][t]));
        for i in 0..W {
            // SAFETY: row `t < valid`, elements `e0 + 16i + 16 <= hd` (caller's contract).
            let x = unsafe { value16(base.add(t * rb), hd, group, four_bit, e0 + 16 * i) };
            for r in 0..R {
                acc[r][i] = _mm512_fmadd_ps(bp[r], x, acc[r][i]);
            }
        }
    }
    for r in 0..R {
        for i in 0..W {
            // SAFETY: as above.
            unsafe { _mm512_storeu_ps(aps[r].add(e0 + 16 * i), acc[r][i]) };
        }
    }
}
