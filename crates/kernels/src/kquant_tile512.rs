//! 512-bit AVX-512 (BW + VNNI) tiles for the K-quant integer dot products of multi-token steps
//! in the lane and flat orders (the engine's, [`super::MatmulArith::Invariant`]).
//!
//! The 256-bit tiles of [`super::kquant_tile`] spend one `maddubs` and one `vpdpwssd` per 32
//! elements, row and token, plus the unpacking of every 32-element vector. Here one 512-bit
//! register holds the 64 elements `64c..64c + 64` (the two 32-element vectors `2c`, `2c + 1` of
//! the canonical order as its low and high halves), so each instruction does twice the work. The
//! integers are the same: i32 lane `j < 8` of the 512-bit sum gathers exactly what canonical lane
//! `j` gets from vector `2c`, lane `j + 8` what it gets from vector `2c + 1`, and the halves are
//! added (exact) before the per-super-block float operations, which are those of
//! `kquant_tile::tile_vnni` unchanged. So results are bit-identical to every other path (tests
//! below and in `tests_kquant`). Callers must have checked AVX-512 F+BW+VL+VNNI and
//! AVX2+FMA+F16C at runtime ([`available`]). It never allocates.

use std::arch::x86_64::*;

use super::kquant::{order, ActQ8K, Q4K, Q5K, Q6K, QK_K};
use super::kquant_avx2::{KQuantAvx2, Prep};
use super::vec_f32::avx2::hsum8_ps;

/// Whether this CPU has what the tiles need beyond the VNNI path's features (AVX-512 BW, read
/// once).
pub(crate) fn available() -> bool {
    static BW: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *BW.get_or_init(|| {
        is_x86_feature_detected!("avx512bw")
            && is_x86_feature_detected!("avx512f")
            && is_x86_feature_detected!("avx512vl")
            && is_x86_feature_detected!("avx512vnni")
    })
}

/// Per-type 512-bit unpacking on top of the 256-bit one.
pub(crate) trait KQuant512: KQuantAvx2 {
    /// The integer scales of the super-block as i16 words, indexed by [`Self::SCALE_IDX`].
    ///
    /// # Safety
    /// AVX-512 F+BW+VL and AVX2 are available.
    unsafe fn scale_words(prep: &Prep) -> __m512i;
    /// For chunk `c`, the word of [`Self::scale_words`] that each of the 32 words of a 64-element
    /// register is multiplied by (word `k` covers elements `2k`, `2k + 1`).
    const SCALE_IDX: [[u16; 32]; 4];
    /// The unsigned stored values of elements `64c..64c + 64`.
    ///
    /// # Safety
    /// `p` points at one whole super-block; AVX-512 F+BW+VL and AVX2 are available; `c < 4`.
    #[inline(always)]
    unsafe fn chunk512(p: *const u8, c: usize) -> __m512i {
        // SAFETY: the caller's contract is `chunk`'s.
        unsafe {
            let [lo, hi] = Self::chunk(p, c);
            _mm512_inserti64x4::<1>(_mm512_castsi256_si512(lo), hi)
        }
    }
}

/// Index tables of types with one scale per 32 elements (`scale_words` = the 8 per-32 scales):
/// the low 16 words take scale `2c`, the high 16 scale `2c + 1`.
const IDX_PER32: [[u16; 32]; 4] = {
    let mut t = [[0u16; 32]; 4];
    let mut c = 0;
    while c < 4 {
        let mut k = 0;
        while k < 32 {
            t[c][k] = (2 * c + k / 16) as u16;
            k += 1;
        }
        c += 1;
    }
    t
};

/// Index tables of types with one scale per 16 elements (`scale_words` = the 16 scales).
const IDX_PER16: [[u16; 32]; 4] = {
    let mut t = [[0u16; 32]; 4];
    let mut c = 0;
    while c < 4 {
        let mut k = 0;
        while k < 32 {
            t[c][k] = (4 * c + k / 8) as u16;
            k += 1;
        }
        c += 1;
    }
    t
};

impl KQuant512 for Q4K {
    #[inline(always)]
    unsafe fn scale_words(prep: &Prep) -> __m512i {
        // `prep.scales` holds the 8 per-32 scales as words 0..8 (and again in the high lane).
        // SAFETY: AVX-512 F is the caller's contract.
        unsafe { _mm512_castsi256_si512(prep.scales) }
    }
    const SCALE_IDX: [[u16; 32]; 4] = IDX_PER32;
    #[inline(always)]
    unsafe fn chunk512(p: *const u8, c: usize) -> __m512i {
        // SAFETY: the 128 nibble bytes start at offset 16; chunk `c < 4` reads 32 of them. The
        // low nibbles are elements 64c..64c+32, the high ones 64c+32..64c+64.
        unsafe {
            let q = _mm512_broadcast_i64x4(_mm256_loadu_si256(p.add(16 + 32 * c).cast()));
            let q = _mm512_mask_srli_epi16::<4>(q, 0xFFFF_0000, q);
            _mm512_and_si512(q, _mm512_set1_epi8(0x0F))
        }
    }
}

impl KQuant512 for Q5K {
    #[inline(always)]
    unsafe fn scale_words(prep: &Prep) -> __m512i {
        // SAFETY: AVX-512 F is the caller's contract.
        unsafe { _mm512_castsi256_si512(prep.scales) }
    }
    const SCALE_IDX: [[u16; 32]; 4] = IDX_PER32;
}

impl KQuant512 for Q6K {
    #[inline(always)]
    unsafe fn scale_words(prep: &Prep) -> __m512i {
        // SAFETY: AVX2 and AVX-512 F are the caller's contract.
        unsafe { _mm512_castsi256_si512(Self::scales16(prep)) }
    }
    const SCALE_IDX: [[u16; 32]; 4] = IDX_PER16;
    #[inline(always)]
    unsafe fn chunk512(p: *const u8, c: usize) -> __m512i {
        let n = c / 2;
        // SAFETY: ql is 128 bytes at 0, qh 64 bytes at 128; `c < 4` keeps every load inside.
        // Low half: vector 2c (ql bytes 64n..64n+32), high half: vector 2c+1 (the next 32), each
        // with its two high bits from the same 32 qh bytes at a different shift.
        unsafe {
            let ql = _mm512_loadu_si512(p.add(64 * n).cast());
            let qh = _mm512_broadcast_i64x4(_mm256_loadu_si256(p.add(128 + 32 * n).cast()));
            let m4 = _mm512_set1_epi8(0x0F);
            let m30 = _mm512_set1_epi8(0x30);
            let (lo, hi) = if c.is_multiple_of(2) {
                let sh = _mm512_inserti64x4::<1>(_mm512_set1_epi16(4), _mm256_set1_epi16(2));
                (_mm512_and_si512(ql, m4), _mm512_sllv_epi16(qh, sh))
            } else {
                let sh = _mm512_inserti64x4::<1>(_mm512_set1_epi16(0), _mm256_set1_epi16(2));
                let l = _mm512_and_si512(_mm512_srli_epi16::<4>(ql), m4);
                (l, _mm512_srlv_epi16(qh, sh))
            };
            // lo | (hi & 0x30)
            _mm512_ternarylogic_epi32::<0xF8>(lo, hi, m30)
        }
    }
}

/// Sum of the eight i32 lanes (exact: no order matters).
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
fn hsum_epi32(v: __m256i) -> i32 {
    let v = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256::<1>(v));
    let u = _mm_add_epi32(v, _mm_shuffle_epi32::<0x4E>(v));
    _mm_cvtsi128_si32(_mm_add_epi32(u, _mm_shuffle_epi32::<0xB1>(u)))
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

/// Panics (internal bug) unless rows `rows` of a `w_len`-byte matrix with rows of `row_bytes`
/// bytes and tokens `tokens` of `act` lie in range, `act`'s buffers hold its whole shape and
/// `tile_order` is one the tiles compute: the entry check of [`tile512`].
#[inline]
fn assert_tile_shape<K: KQuant512>(
    w_len: usize,
    row_bytes: usize,
    rows: std::ops::Range<usize>,
    act: &ActQ8K,
    tokens: std::ops::Range<usize>,
    tile_order: u8,
) {
    let nb = act.num_blocks;
    assert!(
        tile_order == order::LANES || tile_order == order::FLAT,
        "lane or flat order"
    );
    assert!(
        row_bytes == nb * K::BYTES && rows.end * row_bytes <= w_len,
        "tile rows in range"
    );
    assert!(tokens.end <= act.num_tokens, "tile tokens in range");
    assert!(
        act.qs.len() >= act.num_tokens * nb * QK_K
            && act.bs16.len() >= act.num_tokens * nb * 16
            && act.d.len() >= act.num_tokens * nb,
        "activation buffers hold the whole shape"
    );
}

/// `out[t][r] = dot(W[row0 + r], X[tok0 + t])` for a `T × R` tile in order `ORDER`
/// ([`order::LANES`] or [`order::FLAT`]), as `kquant_tile::tile_vnni` computes it. `w` is the
/// whole weight matrix with rows of `row_bytes` bytes.
///
/// Panics (internal bug) if the tile is out of range or the order is another.
// The register tile indexes several arrays by token, row and lane at once.
#[allow(clippy::needless_range_loop)]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
pub(crate) fn tile512<K: KQuant512, const T: usize, const R: usize, const ORDER: u8>(
    w: &[u8],
    row_bytes: usize,
    row0: usize,
    act: &ActQ8K,
    tok0: usize,
    out: &mut [[f32; R]; T],
) {
    let nb = act.num_blocks;
    assert_tile_shape::<K>(
        w.len(),
        row_bytes,
        row0..row0 + R,
        act,
        tok0..tok0 + T,
        ORDER,
    );
    let row_len = nb * QK_K;
    let wbase = w.as_ptr();
    let xq = act.qs.as_ptr();
    let mut acc = [[_mm256_setzero_ps(); R]; T];
    let mut accm = [[_mm_setzero_ps(); R]; T];
    let mut acc1 = [[0f32; R]; T];
    let mut accm1 = [[0f32; R]; T];
    let flat = ORDER == order::FLAT;
    let one_min = flat || K::ONE_MIN_LANE;
    // The float tail of two rows at once ([`WideTail`]; Q4_K's four min lanes keep the per-pair
    // tail).
    let wide = R == 2 && T.is_multiple_of(2) && (!K::HAS_MIN || one_min);
    let mut wt = WideTail::<T>::new();
    for b in 0..nb {
        // Block `b` of row `row0 + r`; for `r < R` it lies inside `w`:
        // `(row0 + r) * row_bytes + (b + 1) * K::BYTES <= w.len()` by the assert above.
        let blk = |r: usize| wbase.wrapping_add((row0 + r) * row_bytes + b * K::BYTES);
        // SAFETY: see above.
        let mut prep = [unsafe { K::prep(blk(0)) }; R];
        for (r, pr) in prep.iter_mut().enumerate().skip(1) {
            // SAFETY: see above.
            *pr = unsafe { K::prep(blk(r)) };
        }
        let mut words = [_mm512_setzero_si512(); R];
        for (wd, pr) in words.iter_mut().zip(&prep) {
            // SAFETY: the features this function enables.
            *wd = unsafe { K::scale_words(pr) };
        }
        let mut isum = [[_mm512_setzero_si512(); R]; T];
        for c in 0..4 {
            // SAFETY: the table has 32 u16 per entry and `c < 4`.
            let idx = unsafe { _mm512_loadu_si512(K::SCALE_IDX[c].as_ptr().cast()) };
            let mut wv = [_mm512_setzero_si512(); R];
            let mut sv = [_mm512_setzero_si512(); R];
            for r in 0..R {
                // SAFETY: see above; `c < 4`.
                wv[r] = unsafe { K::chunk512(blk(r), c) };
                sv[r] = _mm512_permutexvar_epi16(idx, words[r]);
            }
            for t in 0..T {
                let at = (tok0 + t) * row_len + b * QK_K + 64 * c;
                // SAFETY: `tok0 + t < num_tokens` and `b < nb`, so the 64 bytes at `at` lie
                // inside `act.qs` (asserted to hold the whole shape).
                let x = unsafe { _mm512_loadu_si512(xq.add(at).cast()) };
                for r in 0..R {
                    let p = _mm512_maddubs_epi16(wv[r], x);
                    isum[t][r] = _mm512_dpwssd_epi32(isum[t][r], p, sv[r]);
                }
            }
        }
        if wide {
            let rows = [&prep[0], &prep[R - 1]];
            let pairs: [[__m512i; 2]; T] = std::array::from_fn(|t| [isum[t][0], isum[t][R - 1]]);
            // SAFETY: the features this function enables; `tok0 + t < num_tokens` and `b < nb`,
            // so the indices the tail reads lie inside `act.d` / `act.bs16` (asserted above).
            unsafe { wt.add_block::<K>(rows, &pairs, act, tok0, b, flat) };
            continue;
        }
        for t in 0..T {
            let ab = (tok0 + t) * nb + b;
            let dx = act.d[ab];
            // SAFETY: `ab < num_tokens * nb`, so 16 i16 at `ab * 16` lie inside `act.bs16`
            // (asserted above).
            let bs16 = unsafe { _mm256_loadu_si256(act.bs16.as_ptr().add(ab * 16).cast()) };
            let bs32 = _mm_hadd_epi16(
                _mm256_castsi256_si128(bs16),
                _mm256_extracti128_si256::<1>(bs16),
            );
            for r in 0..R {
                let v = isum[t][r];
                let mut lanes =
                    _mm256_add_epi32(_mm512_castsi512_si256(v), _mm512_extracti64x4_epi64::<1>(v));
                if K::OFFSET != 0 {
                    // SAFETY: AVX2 is enabled for this function.
                    let sc16 = unsafe { K::scales16(&prep[r]) };
                    let s = _mm256_madd_epi16(bs16, sc16);
                    let s = _mm256_mullo_epi32(s, _mm256_set1_epi32(K::OFFSET));
                    lanes = _mm256_sub_epi32(lanes, s);
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
    if wide {
        let (sums, mins) = wt.finish(flat);
        for t in 0..T {
            for r in 0..R {
                out[t][r] = if K::HAS_MIN {
                    sums[t][r.min(1)] - mins[t][r.min(1)]
                } else {
                    sums[t][r.min(1)]
                };
            }
        }
        return;
    }
    for t in 0..T {
        for r in 0..R {
            let s = if flat {
                acc1[t][r]
            } else {
                hsum8_ps(acc[t][r])
            };
            out[t][r] = if !K::HAS_MIN {
                s
            } else if one_min {
                s - accm1[t][r]
            } else {
                s - hsum4_ps(accm[t][r])
            };
        }
    }
}

/// `[a | b]`: two 256-bit float vectors as the halves of one 512-bit vector.
#[target_feature(enable = "avx512f,avx2")]
#[inline]
fn join_ps(a: __m256, b: __m256) -> __m512 {
    _mm512_castpd_ps(_mm512_insertf64x4::<1>(
        _mm512_castps_pd(_mm512_castps256_ps512(a)),
        _mm256_castps_pd(b),
    ))
}

/// The per-super-block float tail of a `T × 2` tile (two weight rows), for the orders whose
/// mins (types that have them) take one lane: the operations of [`tile512`]'s per-pair tail,
/// lane for lane, with two rows (lane order) or two rows and two tokens (flat order, mins) in
/// one 512-bit register, so each conversion, product and fused multiply-add serves two or
/// four (token, row) pairs. The integer sums are exact whatever their grouping; every float
/// operation is the per-pair one: `d = d_w · d_x` (a lane-wise product), `acc = fma(sum as f32,
/// d, acc)` (lane-wise), Q6_K's offset `OFFSET · (sc16 · bs16)` (integer) before the conversion.
///
/// Layouts: lane order, `acc[t]` = `[acc(t, 0) | acc(t, 1)]` (8 lanes each, the per-pair
/// accumulator); flat order `acc[p]` and mins `accm[p]` for tokens `2p`, `2p + 1`: four 128-bit
/// groups `(2p, 0), (2p, 1), (2p + 1, 0), (2p + 1, 1)`, each lane of a group the pair's value.
struct WideTail<const T: usize> {
    acc: [__m512; T],
    accm: [__m512; T],
}

impl<const T: usize> WideTail<T> {
    #[target_feature(enable = "avx512f,avx2")]
    fn new() -> Self {
        WideTail {
            acc: [_mm512_setzero_ps(); T],
            accm: [_mm512_setzero_ps(); T],
        }
    }

    /// Adds super-block `b` of rows `prep[0]`, `prep[1]` against tokens `tok0..tok0 + T`, whose
    /// integer sums are `isum[t][r]` (16 lanes; canonical lane `j` is lane `j` plus lane `j + 8`).
    ///
    /// # Safety
    /// AVX-512 F+BW+VL+VNNI and AVX2+FMA+F16C are available; `tok0 + T <= act.num_tokens`,
    /// `b < act.num_blocks`, and `act` holds the whole shape.
    #[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
    #[inline]
    unsafe fn add_block<K: KQuant512>(
        &mut self,
        prep: [&Prep; 2],
        isum: &[[__m512i; 2]; T],
        act: &ActQ8K,
        tok0: usize,
        b: usize,
        flat: bool,
    ) {
        let nb = act.num_blocks;
        // `[d_w0 × 8 | d_w1 × 8]`, and per 128-bit group `[d_w0, d_w1, d_w0, d_w1]`.
        let dw2 = join_ps(_mm256_set1_ps(prep[0].d), _mm256_set1_ps(prep[1].d));
        let dwq = _mm512_shuffle_f32x4::<0b10_00_10_00>(dw2, dw2);
        let dm2 = join_ps(_mm256_set1_ps(prep[0].dmin), _mm256_set1_ps(prep[1].dmin));
        let dmq = _mm512_shuffle_f32x4::<0b10_00_10_00>(dm2, dm2);
        let sc16 = if K::OFFSET != 0 {
            // SAFETY: AVX2 is enabled (the caller's contract).
            unsafe {
                _mm512_inserti64x4::<1>(
                    _mm512_castsi256_si512(K::scales16(prep[0])),
                    K::scales16(prep[1]),
                )
            }
        } else {
            _mm512_setzero_si512()
        };
        let m01 = _mm256_set_m128i(prep[1].mins, prep[0].mins);
        let minsq = _mm512_inserti64x4::<1>(_mm512_castsi256_si512(m01), m01);
        let mut x = [_mm512_setzero_si512(); T];
        let mut bs32 = [_mm_setzero_si128(); T];
        let mut dx = [0f32; T];
        for t in 0..T {
            let ab = (tok0 + t) * nb + b;
            dx[t] = act.d[ab];
            // SAFETY: `ab < num_tokens * nb`, so 16 i16 at `ab * 16` lie inside `act.bs16`.
            let bs16 = unsafe { _mm256_loadu_si256(act.bs16.as_ptr().add(ab * 16).cast()) };
            if K::HAS_MIN {
                bs32[t] = _mm_hadd_epi16(
                    _mm256_castsi256_si128(bs16),
                    _mm256_extracti128_si256::<1>(bs16),
                );
            }
            let [v0, v1] = isum[t];
            // `[v0.lo + v0.hi | v1.lo + v1.hi]`: the canonical lanes of both rows.
            let mut lanes = _mm512_add_epi32(
                _mm512_shuffle_i64x2::<0b01_00_01_00>(v0, v1),
                _mm512_shuffle_i64x2::<0b11_10_11_10>(v0, v1),
            );
            if K::OFFSET != 0 {
                let s = _mm512_madd_epi16(
                    _mm512_inserti64x4::<1>(_mm512_castsi256_si512(bs16), bs16),
                    sc16,
                );
                let s = if K::OFFSET == 32 {
                    _mm512_slli_epi32::<5>(s)
                } else {
                    _mm512_mullo_epi32(s, _mm512_set1_epi32(K::OFFSET))
                };
                lanes = _mm512_sub_epi32(lanes, s);
            }
            if flat {
                x[t] = lanes;
            } else {
                let d = _mm512_mul_ps(dw2, _mm512_set1_ps(dx[t]));
                self.acc[t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(lanes), d, self.acc[t]);
            }
        }
        for p in 0..T / 2 {
            let (t, u) = (2 * p, 2 * p + 1);
            let dxq = join_ps(_mm256_set1_ps(dx[t]), _mm256_set1_ps(dx[u]));
            if flat {
                // Groups (t, 0), (t, 1), (u, 0), (u, 1), each summed to every one of its lanes.
                let y = _mm512_add_epi32(
                    _mm512_shuffle_i64x2::<0b10_00_10_00>(x[t], x[u]),
                    _mm512_shuffle_i64x2::<0b11_01_11_01>(x[t], x[u]),
                );
                let y = group_sums(y);
                let d = _mm512_mul_ps(dwq, dxq);
                self.acc[p] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(y), d, self.acc[p]);
            }
            if K::HAS_MIN {
                let bq = _mm512_inserti64x4::<1>(
                    _mm512_castsi256_si512(_mm256_broadcastsi128_si256(bs32[t])),
                    _mm256_broadcastsi128_si256(bs32[u]),
                );
                let m = group_sums(_mm512_madd_epi16(minsq, bq));
                let dm = _mm512_mul_ps(dmq, dxq);
                self.accm[p] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(m), dm, self.accm[p]);
            }
        }
    }

    /// The per-pair sums `[t][r]` (lane order: [`hsum8_ps`] of the pair's 8 lanes; flat: the
    /// pair's value) and mins.
    #[target_feature(enable = "avx2,fma,f16c,avx512f")]
    fn finish(&self, flat: bool) -> ([[f32; 2]; T], [[f32; 2]; T]) {
        let mut sums = [[0f32; 2]; T];
        let mut mins = [[0f32; 2]; T];
        // SAFETY: a 512-bit vector is 16 f32 (any bits are valid).
        let lanes = |v: __m512| unsafe { std::mem::transmute::<__m512, [f32; 16]>(v) };
        for t in 0..T {
            let (p, g) = (t / 2, 2 * (t % 2));
            let m = lanes(self.accm[p]);
            for r in 0..2 {
                mins[t][r] = m[4 * (g + r)];
            }
            if flat {
                let a = lanes(self.acc[p]);
                for r in 0..2 {
                    sums[t][r] = a[4 * (g + r)];
                }
            } else {
                let v = _mm512_castps_pd(self.acc[t]);
                sums[t][0] = hsum8_ps(_mm256_castpd_ps(_mm512_castpd512_pd256(v)));
                sums[t][1] = hsum8_ps(_mm256_castpd_ps(_mm512_extractf64x4_pd::<1>(v)));
            }
        }
        (sums, mins)
    }
}

/// Every i32 lane of each 128-bit group replaced by the group's sum (exact).
#[target_feature(enable = "avx512f")]
#[inline]
fn group_sums(y: __m512i) -> __m512i {
    let y = _mm512_add_epi32(y, _mm512_shuffle_epi32::<0x4E>(y));
    _mm512_add_epi32(y, _mm512_shuffle_epi32::<0xB1>(y))
}
