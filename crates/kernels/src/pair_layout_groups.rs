//! Whole groups of the bf16-pair layout (`pair_layout`) to and from row-major bf16 rows kept as
//! little-endian bytes — the form a KV store's tiers save rows in — so a tier's save or load of
//! a store's 16-row blocks converts a group at a time: K by 16×16 word transposes and V by
//! 16-bit interleaves in 512-bit moves (AVX-512 F/BW, which AVX-512 BF16 implies, and head
//! sizes a multiple of 32), else in scalar words. Both give the words `pair_layout::write_row`
//! writes and read the values `pair_layout::read_row` reads (tests pin both).
//!
//! Owns these two conversions only: it never decides which rows form whole groups (the store
//! does), never allocates and never reads or writes a store itself.

use crate::pair_layout::{group_words, PAIR_GROUP_ROWS};

const ROWS: usize = PAIR_GROUP_ROWS;

/// Writes the group `keys` / `values` (each [`group_words`]`(head_dim)` words) from 16 rows of
/// K and of V: `k_bytes` and `v_bytes` hold rows `0..16` of `head_dim` bf16 values each, as
/// little-endian bytes (`32 · head_dim` bytes each). Panics on a shape mismatch.
pub fn group_from_le_bytes(
    k_bytes: &[u8],
    v_bytes: &[u8],
    keys: &mut [u32],
    values: &mut [u32],
    head_dim: usize,
) {
    check(
        k_bytes.len(),
        v_bytes.len(),
        keys.len(),
        values.len(),
        head_dim,
    );
    #[cfg(target_arch = "x86_64")]
    if head_dim.is_multiple_of(32) && crate::cpu::cpu_features().bf16 {
        // SAFETY: AVX-512 F/BW were detected (`bf16` implies them); the shapes were checked
        // (16 rows of `head_dim` values on the byte side, `8 · head_dim` words a side of the
        // group) and `head_dim` is a multiple of 32.
        unsafe { x86::from_rows(k_bytes, v_bytes, keys, values, head_dim) };
        return;
    }
    from_rows_portable(k_bytes, v_bytes, keys, values, head_dim);
}

/// The inverse of [`group_from_le_bytes`]: rows `0..16` of the group as row-major little-endian
/// bf16 bytes, K into `k_bytes` and V into `v_bytes`. Panics on a shape mismatch.
pub fn group_to_le_bytes(
    keys: &[u32],
    values: &[u32],
    k_bytes: &mut [u8],
    v_bytes: &mut [u8],
    head_dim: usize,
) {
    check(
        k_bytes.len(),
        v_bytes.len(),
        keys.len(),
        values.len(),
        head_dim,
    );
    #[cfg(target_arch = "x86_64")]
    if head_dim.is_multiple_of(32) && crate::cpu::cpu_features().bf16 {
        // SAFETY: as in `group_from_le_bytes`.
        unsafe { x86::to_rows(keys, values, k_bytes, v_bytes, head_dim) };
        return;
    }
    to_rows_portable(keys, values, k_bytes, v_bytes, head_dim);
}

fn check(k_bytes: usize, v_bytes: usize, keys: usize, values: usize, hd: usize) {
    let (bytes, words) = (2 * ROWS * hd, group_words(hd));
    assert!(
        hd.is_multiple_of(2)
            && k_bytes == bytes
            && v_bytes == bytes
            && keys == words
            && values == words,
        "pair group of head_dim {hd}: row bytes {k_bytes} / {v_bytes} (want {bytes}), \
         words {keys} / {values} (want {words})"
    );
}

/// The bf16 value `e` of row `t` (`[16][hd]` little-endian bytes) as bits.
#[inline]
fn value(bytes: &[u8], hd: usize, t: usize, e: usize) -> u32 {
    let at = 2 * (t * hd + e);
    u16::from_le_bytes([bytes[at], bytes[at + 1]]) as u32
}

/// Stores bf16 bits `x` as value `e` of row `t`.
#[inline]
fn set_value(bytes: &mut [u8], hd: usize, t: usize, e: usize, x: u32) {
    let at = 2 * (t * hd + e);
    bytes[at..at + 2].copy_from_slice(&(x as u16).to_le_bytes());
}

fn from_rows_portable(k: &[u8], v: &[u8], keys: &mut [u32], values: &mut [u32], hd: usize) {
    for i in 0..hd / 2 {
        for t in 0..ROWS {
            keys[i * ROWS + t] = value(k, hd, t, 2 * i) | value(k, hd, t, 2 * i + 1) << 16;
        }
    }
    for j in 0..ROWS / 2 {
        for e in 0..hd {
            values[j * hd + e] = value(v, hd, 2 * j, e) | value(v, hd, 2 * j + 1, e) << 16;
        }
    }
}

fn to_rows_portable(keys: &[u32], values: &[u32], k: &mut [u8], v: &mut [u8], hd: usize) {
    for i in 0..hd / 2 {
        for t in 0..ROWS {
            let w = keys[i * ROWS + t];
            set_value(k, hd, t, 2 * i, w & 0xFFFF);
            set_value(k, hd, t, 2 * i + 1, w >> 16);
        }
    }
    for j in 0..ROWS / 2 {
        for e in 0..hd {
            let w = values[j * hd + e];
            set_value(v, hd, 2 * j, e, w & 0xFFFF);
            set_value(v, hd, 2 * j + 1, e, w >> 16);
        }
    }
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use std::arch::x86_64::*;

    use super::ROWS;

    /// 64-bit lanes of two 16-bit interleaves, in the order that makes them a row of position
    /// pairs (`flash_tile_pairs`' staging takes the same).
    const LO_IDX: [i64; 8] = [0, 1, 8, 9, 2, 3, 10, 11];
    const HI_IDX: [i64; 8] = [4, 5, 12, 13, 6, 7, 14, 15];

    /// 16-bit lanes `0, 2, …, 62` (even) and `1, 3, …, 63` (odd) of two vectors: the low and
    /// the high halves of 32 words.
    const EVEN: [u16; 32] = {
        let mut a = [0u16; 32];
        let mut i = 0;
        while i < 32 {
            a[i] = 2 * i as u16;
            i += 1;
        }
        a
    };
    const ODD: [u16; 32] = {
        let mut a = [0u16; 32];
        let mut i = 0;
        while i < 32 {
            a[i] = 2 * i as u16 + 1;
            i += 1;
        }
        a
    };

    /// The transpose of a 16×16 matrix of words (`r[t]` lane `c` → `out[c]` lane `t`), written
    /// out in full so the 64 shuffles stay in registers: pairs of rows, then quadruples,
    /// within each 128-bit lane; then the lanes.
    #[target_feature(enable = "avx512f,avx2")]
    #[inline]
    fn transpose16(r: [__m512i; 16]) -> [__m512i; 16] {
        let [r0, r1, r2, r3, r4, r5, r6, r7, r8, r9, r10, r11, r12, r13, r14, r15] = r;
        let a0 = _mm512_unpacklo_epi32(r0, r1);
        let a1 = _mm512_unpackhi_epi32(r0, r1);
        let a2 = _mm512_unpacklo_epi32(r2, r3);
        let a3 = _mm512_unpackhi_epi32(r2, r3);
        let a4 = _mm512_unpacklo_epi32(r4, r5);
        let a5 = _mm512_unpackhi_epi32(r4, r5);
        let a6 = _mm512_unpacklo_epi32(r6, r7);
        let a7 = _mm512_unpackhi_epi32(r6, r7);
        let a8 = _mm512_unpacklo_epi32(r8, r9);
        let a9 = _mm512_unpackhi_epi32(r8, r9);
        let a10 = _mm512_unpacklo_epi32(r10, r11);
        let a11 = _mm512_unpackhi_epi32(r10, r11);
        let a12 = _mm512_unpacklo_epi32(r12, r13);
        let a13 = _mm512_unpackhi_epi32(r12, r13);
        let a14 = _mm512_unpacklo_epi32(r14, r15);
        let a15 = _mm512_unpackhi_epi32(r14, r15);
        // b[4k + c], lane L: column 4L + c of rows 4k..4k + 4.
        let b0 = _mm512_unpacklo_epi64(a0, a2);
        let b1 = _mm512_unpackhi_epi64(a0, a2);
        let b2 = _mm512_unpacklo_epi64(a1, a3);
        let b3 = _mm512_unpackhi_epi64(a1, a3);
        let b4 = _mm512_unpacklo_epi64(a4, a6);
        let b5 = _mm512_unpackhi_epi64(a4, a6);
        let b6 = _mm512_unpacklo_epi64(a5, a7);
        let b7 = _mm512_unpackhi_epi64(a5, a7);
        let b8 = _mm512_unpacklo_epi64(a8, a10);
        let b9 = _mm512_unpackhi_epi64(a8, a10);
        let b10 = _mm512_unpacklo_epi64(a9, a11);
        let b11 = _mm512_unpackhi_epi64(a9, a11);
        let b12 = _mm512_unpacklo_epi64(a12, a14);
        let b13 = _mm512_unpackhi_epi64(a12, a14);
        let b14 = _mm512_unpacklo_epi64(a13, a15);
        let b15 = _mm512_unpackhi_epi64(a13, a15);
        let e00 = _mm512_shuffle_i32x4::<0x44>(b0, b4);
        let e01 = _mm512_shuffle_i32x4::<0xEE>(b0, b4);
        let f00 = _mm512_shuffle_i32x4::<0x44>(b8, b12);
        let f01 = _mm512_shuffle_i32x4::<0xEE>(b8, b12);
        let e10 = _mm512_shuffle_i32x4::<0x44>(b1, b5);
        let e11 = _mm512_shuffle_i32x4::<0xEE>(b1, b5);
        let f10 = _mm512_shuffle_i32x4::<0x44>(b9, b13);
        let f11 = _mm512_shuffle_i32x4::<0xEE>(b9, b13);
        let e20 = _mm512_shuffle_i32x4::<0x44>(b2, b6);
        let e21 = _mm512_shuffle_i32x4::<0xEE>(b2, b6);
        let f20 = _mm512_shuffle_i32x4::<0x44>(b10, b14);
        let f21 = _mm512_shuffle_i32x4::<0xEE>(b10, b14);
        let e30 = _mm512_shuffle_i32x4::<0x44>(b3, b7);
        let e31 = _mm512_shuffle_i32x4::<0xEE>(b3, b7);
        let f30 = _mm512_shuffle_i32x4::<0x44>(b11, b15);
        let f31 = _mm512_shuffle_i32x4::<0xEE>(b11, b15);
        [
            _mm512_shuffle_i32x4::<0x88>(e00, f00),
            _mm512_shuffle_i32x4::<0x88>(e10, f10),
            _mm512_shuffle_i32x4::<0x88>(e20, f20),
            _mm512_shuffle_i32x4::<0x88>(e30, f30),
            _mm512_shuffle_i32x4::<0xDD>(e00, f00),
            _mm512_shuffle_i32x4::<0xDD>(e10, f10),
            _mm512_shuffle_i32x4::<0xDD>(e20, f20),
            _mm512_shuffle_i32x4::<0xDD>(e30, f30),
            _mm512_shuffle_i32x4::<0x88>(e01, f01),
            _mm512_shuffle_i32x4::<0x88>(e11, f11),
            _mm512_shuffle_i32x4::<0x88>(e21, f21),
            _mm512_shuffle_i32x4::<0x88>(e31, f31),
            _mm512_shuffle_i32x4::<0xDD>(e01, f01),
            _mm512_shuffle_i32x4::<0xDD>(e11, f11),
            _mm512_shuffle_i32x4::<0xDD>(e21, f21),
            _mm512_shuffle_i32x4::<0xDD>(e31, f31),
        ]
    }

    /// `super::group_from_le_bytes` in 512-bit moves.
    ///
    /// # Safety
    /// AVX-512 F/BW present; shapes as `super::check` checks, `hd` a multiple of 32.
    #[target_feature(enable = "avx512f,avx512bw,avx2")]
    pub(super) unsafe fn from_rows(
        k: &[u8],
        v: &[u8],
        keys: &mut [u32],
        values: &mut [u32],
        hd: usize,
    ) {
        let row_bytes = 2 * hd;
        for blk in 0..hd / 32 {
            let rows: [__m512i; ROWS] = std::array::from_fn(|t| {
                // SAFETY: row `t < 16` of `k` holds `2 hd` bytes; `64 blk + 64 <= 2 hd`.
                unsafe { _mm512_loadu_si512(k.as_ptr().add(t * row_bytes + 64 * blk).cast()) }
            });
            for (c, col) in transpose16(rows).into_iter().enumerate() {
                // SAFETY: K word row `16 blk + c < hd / 2` holds 16 words.
                unsafe {
                    _mm512_storeu_si512(keys.as_mut_ptr().add((16 * blk + c) * ROWS).cast(), col)
                };
            }
        }
        // SAFETY: each table is 64 bytes.
        let (lo_idx, hi_idx) = unsafe {
            (
                _mm512_loadu_si512(LO_IDX.as_ptr().cast()),
                _mm512_loadu_si512(HI_IDX.as_ptr().cast()),
            )
        };
        for j in 0..ROWS / 2 {
            for c in 0..hd / 32 {
                // SAFETY: rows `2j + 1 < 16` of `v` hold `2 hd` bytes; `64 c + 64 <= 2 hd`.
                let (r0, r1) = unsafe {
                    (
                        _mm512_loadu_si512(v.as_ptr().add(2 * j * row_bytes + 64 * c).cast()),
                        _mm512_loadu_si512(v.as_ptr().add((2 * j + 1) * row_bytes + 64 * c).cast()),
                    )
                };
                let lo = _mm512_unpacklo_epi16(r0, r1);
                let hi = _mm512_unpackhi_epi16(r0, r1);
                let at = values.as_mut_ptr().wrapping_add(j * hd + 32 * c);
                // SAFETY: pair row `j < 8` holds `hd` words; `32 c + 32 <= hd`.
                unsafe {
                    _mm512_storeu_si512(at.cast(), _mm512_permutex2var_epi64(lo, lo_idx, hi));
                    _mm512_storeu_si512(
                        at.add(16).cast(),
                        _mm512_permutex2var_epi64(lo, hi_idx, hi),
                    );
                }
            }
        }
    }

    /// `super::group_to_le_bytes` in 512-bit moves.
    ///
    /// # Safety
    /// As [`from_rows`].
    #[target_feature(enable = "avx512f,avx512bw,avx2")]
    pub(super) unsafe fn to_rows(
        keys: &[u32],
        values: &[u32],
        k: &mut [u8],
        v: &mut [u8],
        hd: usize,
    ) {
        let row_bytes = 2 * hd;
        for blk in 0..hd / 32 {
            let cols: [__m512i; ROWS] = std::array::from_fn(|c| {
                // SAFETY: K word row `16 blk + c < hd / 2` holds 16 words.
                unsafe { _mm512_loadu_si512(keys.as_ptr().add((16 * blk + c) * ROWS).cast()) }
            });
            for (t, row) in transpose16(cols).into_iter().enumerate() {
                // SAFETY: row `t < 16` of `k` holds `2 hd` bytes; `64 blk + 64 <= 2 hd`.
                unsafe {
                    _mm512_storeu_si512(k.as_mut_ptr().add(t * row_bytes + 64 * blk).cast(), row)
                };
            }
        }
        // SAFETY: each table is 64 bytes.
        let (even, odd) = unsafe {
            (
                _mm512_loadu_si512(EVEN.as_ptr().cast()),
                _mm512_loadu_si512(ODD.as_ptr().cast()),
            )
        };
        for j in 0..ROWS / 2 {
            for c in 0..hd / 32 {
                let at = values.as_ptr().wrapping_add(j * hd + 32 * c);
                // SAFETY: pair row `j < 8` holds `hd` words; `32 c + 32 <= hd`.
                let (w0, w1) = unsafe {
                    (
                        _mm512_loadu_si512(at.cast()),
                        _mm512_loadu_si512(at.add(16).cast()),
                    )
                };
                let r0 = _mm512_permutex2var_epi16(w0, even, w1);
                let r1 = _mm512_permutex2var_epi16(w0, odd, w1);
                // SAFETY: rows `2j + 1 < 16` of `v` hold `2 hd` bytes; `64 c + 64 <= 2 hd`.
                unsafe {
                    _mm512_storeu_si512(v.as_mut_ptr().add(2 * j * row_bytes + 64 * c).cast(), r0);
                    _mm512_storeu_si512(
                        v.as_mut_ptr().add((2 * j + 1) * row_bytes + 64 * c).cast(),
                        r1,
                    );
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pair_layout::{read_row, write_row};
    use half::bf16;
    use rand::{Rng, SeedableRng};

    /// Both conversions, on every path the CPU has, give `pair_layout`'s row-by-row words and
    /// values, for random bits (NaNs, denormals and all) and several head sizes; a round trip
    /// returns the bytes.
    #[test]
    fn groups_convert_as_rows_are_written_and_read() {
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(36);
        for hd in [8usize, 16, 32, 64, 96, 128] {
            let n = 2 * ROWS * hd;
            let k: Vec<u8> = (0..n).map(|_| rng.gen()).collect();
            let v: Vec<u8> = (0..n).map(|_| rng.gen()).collect();
            let w = group_words(hd);
            // The reference: rows written one by one over stale words.
            let (mut rk, mut rv) = (vec![0xDEAD_BEEFu32; w], vec![0x1234_5678u32; w]);
            let as_row = |b: &[u8], t: usize| -> Vec<bf16> {
                (0..hd)
                    .map(|e| bf16::from_bits(value(b, hd, t, e) as u16))
                    .collect()
            };
            for t in 0..ROWS {
                write_row(&mut rk, &mut rv, t, &as_row(&k, t), &as_row(&v, t));
            }
            let (mut pk, mut pv) = (vec![7u32; w], vec![7u32; w]);
            from_rows_portable(&k, &v, &mut pk, &mut pv, hd);
            assert_eq!((&pk, &pv), (&rk, &rv), "hd={hd}: portable words");
            let (mut gk, mut gv) = (vec![9u32; w], vec![9u32; w]);
            group_from_le_bytes(&k, &v, &mut gk, &mut gv, hd);
            assert_eq!((&gk, &gv), (&rk, &rv), "hd={hd}: dispatched words");
            let (mut ko, mut vo) = (vec![0u8; n], vec![0u8; n]);
            group_to_le_bytes(&gk, &gv, &mut ko, &mut vo, hd);
            assert_eq!((&ko, &vo), (&k, &v), "hd={hd}: round trip");
            let (mut kp, mut vp) = (vec![1u8; n], vec![1u8; n]);
            to_rows_portable(&gk, &gv, &mut kp, &mut vp, hd);
            assert_eq!((&kp, &vp), (&k, &v), "hd={hd}: portable rows");
            let (mut kr, mut vr) = (vec![bf16::ZERO; hd], vec![bf16::ZERO; hd]);
            for t in [0, 5, 15] {
                read_row(&gk, &gv, t, &mut kr, &mut vr);
                let bits = |x: &[bf16]| x.iter().map(|y| y.to_bits()).collect::<Vec<_>>();
                assert_eq!(
                    (bits(&kr), bits(&vr)),
                    (bits(&as_row(&k, t)), bits(&as_row(&v, t))),
                    "hd={hd} t={t}"
                );
            }
        }
    }

    #[test]
    #[should_panic(expected = "pair group of head_dim 64")]
    fn a_short_row_side_is_refused() {
        let w = group_words(64);
        let (mut gk, mut gv) = (vec![0u32; w], vec![0u32; w]);
        group_from_le_bytes(&[0u8; 10], &[0u8; 2048], &mut gk, &mut gv, 64);
    }
}
