//! x86 kernels of [`super::packed32`]: one group of 16 interleaved rows × up to
//! [`TILE_TOKENS`] tokens, AVX-512 VNNI (one 512-bit `vpdpbusd` per four elements of all 16 rows)
//! or AVX2 (`maddubs` + `madd` on two 8-row halves).
//!
//! Owns only the SIMD twins of `packed32::group_scalar`: the same exact integer lane sums (the
//! unsigned-operand forms are corrected exactly: Q4_0 nibbles carry `+8`, Q5_0 values `+16`
//! (nibble plus the fifth bit from the group's high-bit chunk), Q8_0 bytes are
//! flipped to `w + 128` for `vpdpbusd`, and the accumulator starts at `-8·Σq_x` / `-128·Σq_x`
//! (`-16·Σq_x`) of the lane's four activations; AVX2 handles Q8_0's signs with `psignb` instead) followed by
//! the same float operations (one fused multiply-add per lane and block, `hsum8`'s tree as
//! vertical adds), so every path gives bit-identical outputs. It never allocates.

use std::arch::x86_64::*;

use super::act_quant::{ActQ8, QK8};
use super::cpu::CpuFeatures;
use super::packed32::{Packed32, Q4_0, Q4_1, Q5_0, Q8_0, TILE_TOKENS};
use gguf::GgmlType;

/// Computes `out` (one row of 16 outputs per token `tok0..tok0 + out.len()`) for group `g` on the
/// best SIMD path `features` allows; `false` when there is none (the caller runs the scalar twin).
pub(super) fn group(
    p: &Packed32,
    features: CpuFeatures,
    g: usize,
    act: &ActQ8,
    tok0: usize,
    out: &mut [[f32; 16]],
) -> bool {
    let f = features.clamp_to_detected();
    assert!(
        g < p.num_groups()
            && tok0 + out.len() <= act.num_tokens
            && act.num_blocks == p.num_blocks(),
        "group and tokens in range"
    );
    assert!(out.len() <= TILE_TOKENS, "at most one tile of tokens");
    let kind = match p.ty() {
        GgmlType::Q4_0 => Q4_0,
        GgmlType::Q4_1 => Q4_1,
        GgmlType::Q5_0 => Q5_0,
        _ => Q8_0,
    };
    macro_rules! dispatch {
        ($kernel:ident) => {
            match (kind, out.len()) {
                (Q4_0, 2) => $kernel::<Q4_0, 2>(p, g, act, tok0, out),
                (Q4_1, 2) => $kernel::<Q4_1, 2>(p, g, act, tok0, out),
                (Q8_0, 2) => $kernel::<Q8_0, 2>(p, g, act, tok0, out),
                (Q5_0, 2) => $kernel::<Q5_0, 2>(p, g, act, tok0, out),
                (Q4_0, _) => (0..out.len())
                    .for_each(|t| $kernel::<Q4_0, 1>(p, g, act, tok0 + t, &mut out[t..t + 1])),
                (Q4_1, _) => (0..out.len())
                    .for_each(|t| $kernel::<Q4_1, 1>(p, g, act, tok0 + t, &mut out[t..t + 1])),
                (Q5_0, _) => (0..out.len())
                    .for_each(|t| $kernel::<Q5_0, 1>(p, g, act, tok0 + t, &mut out[t..t + 1])),
                _ => (0..out.len())
                    .for_each(|t| $kernel::<Q8_0, 1>(p, g, act, tok0 + t, &mut out[t..t + 1])),
            }
        };
    }
    if f.vnni && f.avx512 {
        // SAFETY: AVX-512 F+VL+VNNI (and AVX2+FMA+F16C) were detected on this CPU; shapes were
        // checked above.
        unsafe { dispatch!(group512) };
        true
    } else if f.avx2 {
        // SAFETY: AVX2+FMA+F16C were detected on this CPU; shapes were checked above.
        unsafe { dispatch!(group256) };
        true
    } else {
        false
    }
}

/// A decode's groups `groups` (token 0 of `act`, which holds one token) on the best SIMD path
/// `features` allows, into `out` (the rows of those groups, `out[0]` = row `16 * groups.start`);
/// `false` when there is none. Same kernels as [`group`], checked once per range.
pub(super) fn groups_one_token(
    p: &Packed32,
    features: CpuFeatures,
    groups: std::ops::Range<usize>,
    act: &ActQ8,
    out: &mut [f32],
) -> bool {
    let f = features.clamp_to_detected();
    assert!(
        groups.start <= groups.end
            && groups.end <= p.num_groups()
            && act.num_tokens == 1
            && act.num_blocks == p.num_blocks()
            && out.len()
                == (groups.end * 16).min(p.num_rows()) - (groups.start * 16).min(p.num_rows()),
        "groups, token and output in range"
    );
    let kind = match p.ty() {
        GgmlType::Q4_0 => Q4_0,
        GgmlType::Q4_1 => Q4_1,
        GgmlType::Q5_0 => Q5_0,
        _ => Q8_0,
    };
    macro_rules! run {
        ($kernel:ident) => {{
            let mut tile = [[0f32; 16]; 1];
            for (g, o) in groups.clone().zip(out.chunks_mut(16)) {
                match kind {
                    Q4_0 => $kernel::<Q4_0, 1>(p, g, act, 0, &mut tile),
                    Q4_1 => $kernel::<Q4_1, 1>(p, g, act, 0, &mut tile),
                    Q5_0 => $kernel::<Q5_0, 1>(p, g, act, 0, &mut tile),
                    _ => $kernel::<Q8_0, 1>(p, g, act, 0, &mut tile),
                }
                o.copy_from_slice(&tile[0][..o.len()]);
            }
        }};
    }
    if f.vnni && f.avx512 {
        // SAFETY: AVX-512 F+VL+VNNI (and AVX2+FMA+F16C) were detected on this CPU; shapes were
        // checked above.
        unsafe { run!(group512) };
        true
    } else if f.avx2 {
        // SAFETY: AVX2+FMA+F16C were detected on this CPU; shapes were checked above.
        unsafe { run!(group256) };
        true
    } else {
        false
    }
}

/// Reads 4 bytes at `p` as an i32 (unaligned).
///
/// # Safety
/// `p` points at 4 readable bytes.
#[inline(always)]
unsafe fn read_i32(p: *const i8) -> i32 {
    // SAFETY: guaranteed by the caller.
    unsafe { p.cast::<i32>().read_unaligned() }
}

/// `hsum8` of the eight lane accumulators, lane by lane of the vectors (the canonical tree:
/// `((a0 + a4) + (a2 + a6)) + ((a1 + a5) + (a3 + a7))`).
macro_rules! hsum8_lanes {
    ($add:ident, $a:expr) => {{
        let a = $a;
        let t = [
            $add(a[0], a[4]),
            $add(a[1], a[5]),
            $add(a[2], a[6]),
            $add(a[3], a[7]),
        ];
        $add($add(t[0], t[2]), $add(t[1], t[3]))
    }};
}
pub(super) use hsum8_lanes;

/// The factor of an activation sum that corrects the unsigned weight operand of `vpdpbusd`
/// exactly: Q4_0 nibbles carry `+8`, Q5_0 values `+16`, Q8_0's signed bytes `+128` (top bit
/// flipped); Q4_1 has none. (AVX2's `maddubs` paths take Q8_0's signs with `psignb` instead:
/// `packed32::correction`.)
pub(super) const fn vnni_correction(k: u8) -> i32 {
    match k {
        Q4_0 => -8,
        Q5_0 => -16,
        Q8_0 => -128,
        _ => 0,
    }
}

/// Start value of lane `l`'s integer sum: minus the correction for the unsigned operand form.
#[inline(always)]
fn lane_start<const K: u8>(act: &ActQ8, xi: usize, l: usize, avx512: bool) -> i32 {
    let c = if avx512 {
        vnni_correction(K)
    } else {
        super::packed32::correction(K)
    };
    if c == 0 {
        0
    } else {
        c * act.lane_sums[xi * 8 + l]
    }
}

/// Q5_0's fifth bit of lane `$l` as `0x10` per byte, from the group's rearranged high-bit
/// chunk `$h` (bit `l` of each byte; see `packed32`): shifted to bit 4 and masked. 32-bit shifts
/// by at most 3 never carry another byte's bit into bit 4.
macro_rules! high_bit {
    ($sll:ident, $srl:ident, $and:ident, $h:expr, $l:expr, $m:expr) => {
        match $l {
            0 => $and($sll::<4>($h), $m),
            1 => $and($sll::<3>($h), $m),
            2 => $and($sll::<2>($h), $m),
            3 => $and($sll::<1>($h), $m),
            4 => $and($h, $m),
            5 => $and($srl::<1>($h), $m),
            6 => $and($srl::<2>($h), $m),
            _ => $and($srl::<3>($h), $m),
        }
    };
}

/// Q5_0's lanes `c` and `4 + c` (`c < 4`) of eight rows as unsigned bytes `nibble | fifth_bit
/// << 4`, from the same 32-byte half of quant chunk `c` (`q`) and of the rearranged high-bit
/// chunk (`hb`).
#[target_feature(enable = "avx2")]
#[inline]
pub(super) fn q5_lanes256(q: __m256i, hb: __m256i, c: usize) -> (__m256i, __m256i) {
    let nib = _mm256_set1_epi8(0x0F);
    let bit = _mm256_set1_epi8(0x10);
    let lo = high_bit!(
        _mm256_slli_epi32,
        _mm256_srli_epi32,
        _mm256_and_si256,
        hb,
        c,
        bit
    );
    let hi = high_bit!(
        _mm256_slli_epi32,
        _mm256_srli_epi32,
        _mm256_and_si256,
        hb,
        4 + c,
        bit
    );
    (
        _mm256_or_si256(_mm256_and_si256(q, nib), lo),
        _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi32::<4>(q), nib), hi),
    )
}

/// The 512-bit twin of [`q5_lanes256`]: Q5_0 lanes `c` and `4 + c` of all 16 rows of a block as
/// 5-bit values, from chunk `c` (`q`) and the block's rearranged high-bit chunk (`hb`).
#[target_feature(enable = "avx512f")]
#[inline]
pub(super) fn q5_lanes512(q: __m512i, hb: __m512i, c: usize) -> (__m512i, __m512i) {
    let nib = _mm512_set1_epi8(0x0F);
    let bit = _mm512_set1_epi8(0x10);
    let lo = high_bit!(
        _mm512_slli_epi32,
        _mm512_srli_epi32,
        _mm512_and_si512,
        hb,
        c,
        bit
    );
    let hi = high_bit!(
        _mm512_slli_epi32,
        _mm512_srli_epi32,
        _mm512_and_si512,
        hb,
        4 + c,
        bit
    );
    (
        _mm512_or_si512(_mm512_and_si512(q, nib), lo),
        _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi32::<4>(q), nib), hi),
    )
}

/// How far ahead (bytes) the single-token kernel prefetches the packed stream (as the unpacked
/// decode tile does: the hardware prefetcher stops at page boundaries). The prefetch goes to L2
/// (`T1`), not L1: a 4 KiB run of L1 prefetches outnumbers the core's L1 miss buffers, and
/// measured on the streaming decode (`examples/packed_stream.rs`, Zen 4, 2 threads) `T1` moved
/// 21–28 GB/s where `T0` moved 13–19 GB/s.
const PF_DIST: usize = 4096;

/// Prefetches (to L2) the `len` bytes [`PF_DIST`] beyond byte `off` of the matrix `all`, never
/// past its end: a decode kernel calls it for each block it reads.
#[inline(always)]
pub(super) fn prefetch_ahead(all: &[u8], off: usize, len: usize) {
    let start = off + PF_DIST;
    let end = (start + len).min(all.len());
    let mut at = start;
    while at < end {
        // SAFETY: `at < all.len()`: the address lies inside the matrix; a prefetch never faults
        // and has no architectural effect (SSE, always present on x86-64).
        unsafe { _mm_prefetch::<_MM_HINT_T1>(all.as_ptr().add(at).cast()) };
        at += 64;
    }
}

/// Prefetches (to L2) the first line of the page that starts among the `len` bytes [`PF_DIST`]
/// beyond byte `off` of the matrix `all`, if one does (and it lies inside the matrix): the
/// AVX-512 one-token kernels call it for each block they read (`page_prefetch` says why one
/// request a page, not one a line: on Zen 4 the one-token stream moved 22.7 against 17.6 GB/s
/// on one thread, medians of six interleaved rounds). The AVX2 kernels (Zen 3, where every
/// line's request was measured to help) and the AVX-512 kernel of a few tokens (4 tokens on 2
/// threads streamed at 0.90× with page starts, four interleaved rounds on Zen 4) keep
/// [`prefetch_ahead`].
#[inline(always)]
pub(super) fn prefetch_next_page(all: &[u8], off: usize, len: usize) {
    if let Some(page) = super::page_prefetch::page_start_within(
        all.as_ptr() as usize,
        off + PF_DIST,
        len,
        all.len(),
    ) {
        // SAFETY: `page < all.len()`: the address lies inside the matrix; a prefetch never
        // faults and has no architectural effect (SSE, always present on x86-64).
        unsafe { _mm_prefetch::<_MM_HINT_T1>(all.as_ptr().add(page).cast()) };
    }
}

/// Prefetches (to L2) the [`PF_DIST`] bytes of `p`'s stream from group `g` on (never past the
/// matrix's end): the start of a decode chunk.
pub(super) fn prefetch_first(p: &Packed32, g: usize) {
    let all = p.bytes();
    let off = p.group(g).as_ptr() as usize - all.as_ptr() as usize;
    let end = (off + PF_DIST).min(all.len());
    for at in (off..end).step_by(64) {
        // SAFETY: `at < all.len()`: the address lies inside the matrix; a prefetch never faults
        // and has no architectural effect (SSE, always present on x86-64).
        unsafe { _mm_prefetch::<_MM_HINT_T1>(all.as_ptr().add(at).cast()) };
    }
}

/// AVX-512 VNNI kernel: `T` tokens of group `g`.
///
/// # Safety
/// AVX-512 F+VL+VNNI, AVX2, FMA, F16C present; `g`, `tok0 + T` in range (checked by [`group`]).
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512vl,avx512vnni")]
unsafe fn group512<const K: u8, const T: usize>(
    p: &Packed32,
    g: usize,
    act: &ActQ8,
    tok0: usize,
    out: &mut [[f32; 16]],
) {
    let (nb, bb) = (p.num_blocks(), p.block_bytes());
    let grp = p.group(g);
    let chunks = match K {
        Q8_0 => 8,
        Q5_0 => 5,
        _ => 4,
    };
    let scales = chunks * 64;
    let row_len = nb * QK8;
    let nib = _mm512_set1_epi8(0x0F);
    let flip = _mm512_set1_epi8(-128);
    let mut acc = [[_mm512_setzero_ps(); 8]; T];
    let mut summs = [_mm512_setzero_ps(); T];
    let all = p.bytes();
    let grp_off = grp.as_ptr() as usize - all.as_ptr() as usize;
    for b in 0..nb {
        let blk = &grp[b * bb..(b + 1) * bb];
        let bp = blk.as_ptr();
        if T == 1 {
            prefetch_next_page(all, grp_off + b * bb, bb);
        }
        // SAFETY: a packed block holds `chunks` 64-byte chunks, then 32 bytes of d (and 32 of m
        // for Q4_1), all inside `blk` (length `bb`).
        let (d, m, w) = unsafe {
            let d = _mm512_cvtph_ps(_mm256_loadu_si256(bp.add(scales).cast()));
            let m = if K == Q4_1 {
                _mm512_cvtph_ps(_mm256_loadu_si256(bp.add(scales + 32).cast()))
            } else {
                _mm512_setzero_ps()
            };
            // w[l] holds lane l (elements 4l..4l+4) of all 16 rows.
            let mut w = [_mm512_setzero_si512(); 8];
            if K == Q8_0 {
                for (c, wc) in w.iter_mut().enumerate() {
                    *wc = _mm512_xor_si512(_mm512_loadu_si512(bp.add(64 * c).cast()), flip);
                }
            } else if K == Q5_0 {
                let h = _mm512_loadu_si512(bp.add(64 * 4).cast());
                for c in 0..4 {
                    let v = _mm512_loadu_si512(bp.add(64 * c).cast());
                    (w[c], w[4 + c]) = q5_lanes512(v, h, c);
                }
            } else {
                for c in 0..4 {
                    let v = _mm512_loadu_si512(bp.add(64 * c).cast());
                    w[c] = _mm512_and_si512(v, nib);
                    w[4 + c] = _mm512_and_si512(_mm512_srli_epi32(v, 4), nib);
                }
            }
            (d, m, w)
        };
        for t in 0..T {
            let tok = tok0 + t;
            let xb = &act.qs[tok * row_len + b * QK8..][..QK8];
            let x = xb.as_ptr();
            let xi = tok * nb + b;
            let dd = _mm512_mul_ps(d, _mm512_set1_ps(act.d[xi]));
            for (l, wl) in w.iter().enumerate() {
                let start = _mm512_set1_epi32(lane_start::<K>(act, xi, l, true));
                // SAFETY: 4l + 4 <= 32, inside `xb`.
                let xs = _mm512_set1_epi32(unsafe { read_i32(x.add(4 * l)) });
                let i = _mm512_dpbusd_epi32(start, *wl, xs);
                acc[t][l] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(i), dd, acc[t][l]);
            }
            if K == Q4_1 {
                summs[t] = _mm512_fmadd_ps(m, _mm512_set1_ps(act.s[xi]), summs[t]);
            }
        }
    }
    for t in 0..T {
        let r = hsum8_lanes!(_mm512_add_ps, acc[t]);
        let y = if K == Q4_1 {
            _mm512_add_ps(r, summs[t])
        } else {
            r
        };
        // SAFETY: `out[t]` holds 16 floats.
        unsafe { _mm512_storeu_ps(out[t].as_mut_ptr(), y) };
    }
}

/// AVX2 kernel: `T` tokens of group `g`, the 16 rows as two 8-row halves.
///
/// # Safety
/// AVX2, FMA, F16C present; `g`, `tok0 + T` in range (checked by [`group`]).
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn group256<const K: u8, const T: usize>(
    p: &Packed32,
    g: usize,
    act: &ActQ8,
    tok0: usize,
    out: &mut [[f32; 16]],
) {
    let (nb, bb) = (p.num_blocks(), p.block_bytes());
    let grp = p.group(g);
    let chunks = match K {
        Q8_0 => 8,
        Q5_0 => 5,
        _ => 4,
    };
    let scales = chunks * 64;
    let row_len = nb * QK8;
    let nib = _mm256_set1_epi8(0x0F);
    let ones = _mm256_set1_epi16(1);
    let all = p.bytes();
    let grp_off = grp.as_ptr() as usize - all.as_ptr() as usize;
    for h in 0..2 {
        let mut acc = [[_mm256_setzero_ps(); 8]; T];
        let mut summs = [_mm256_setzero_ps(); T];
        for b in 0..nb {
            let blk = &grp[b * bb..(b + 1) * bb];
            let bp = blk.as_ptr();
            if T == 1 && h == 0 {
                // A decode streams the matrix once: the first half's pass prefetches (as
                // `group512`); the second half's pass reads the group again from cache.
                prefetch_ahead(all, grp_off + b * bb, bb);
            }
            // SAFETY: as in `group512`; half `h` of each chunk / scale run is inside it.
            let (d, m, w) = unsafe {
                let d = _mm256_cvtph_ps(_mm_loadu_si128(bp.add(scales + 16 * h).cast()));
                let m = if K == Q4_1 {
                    _mm256_cvtph_ps(_mm_loadu_si128(bp.add(scales + 32 + 16 * h).cast()))
                } else {
                    _mm256_setzero_ps()
                };
                let mut w = [_mm256_setzero_si256(); 8];
                if K == Q8_0 {
                    for (c, wc) in w.iter_mut().enumerate() {
                        *wc = _mm256_loadu_si256(bp.add(64 * c + 32 * h).cast());
                    }
                } else if K == Q5_0 {
                    let hb = _mm256_loadu_si256(bp.add(64 * 4 + 32 * h).cast());
                    for c in 0..4 {
                        let v = _mm256_loadu_si256(bp.add(64 * c + 32 * h).cast());
                        (w[c], w[4 + c]) = q5_lanes256(v, hb, c);
                    }
                } else {
                    for c in 0..4 {
                        let v = _mm256_loadu_si256(bp.add(64 * c + 32 * h).cast());
                        w[c] = _mm256_and_si256(v, nib);
                        w[4 + c] = _mm256_and_si256(_mm256_srli_epi32(v, 4), nib);
                    }
                }
                (d, m, w)
            };
            for t in 0..T {
                let tok = tok0 + t;
                let xb = &act.qs[tok * row_len + b * QK8..][..QK8];
                let x = xb.as_ptr();
                let xi = tok * nb + b;
                let dd = _mm256_mul_ps(d, _mm256_set1_ps(act.d[xi]));
                for (l, wl) in w.iter().enumerate() {
                    // SAFETY: 4l + 4 <= 32, inside `xb`.
                    let xs = _mm256_set1_epi32(unsafe { read_i32(x.add(4 * l)) });
                    let prod = if K == Q8_0 {
                        _mm256_maddubs_epi16(_mm256_sign_epi8(*wl, *wl), _mm256_sign_epi8(xs, *wl))
                    } else {
                        _mm256_maddubs_epi16(*wl, xs)
                    };
                    let start = _mm256_set1_epi32(lane_start::<K>(act, xi, l, false));
                    let i = _mm256_add_epi32(start, _mm256_madd_epi16(prod, ones));
                    acc[t][l] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(i), dd, acc[t][l]);
                }
                if K == Q4_1 {
                    summs[t] = _mm256_fmadd_ps(m, _mm256_set1_ps(act.s[xi]), summs[t]);
                }
            }
        }
        for t in 0..T {
            let r = hsum8_lanes!(_mm256_add_ps, acc[t]);
            let y = if K == Q4_1 {
                _mm256_add_ps(r, summs[t])
            } else {
                r
            };
            // SAFETY: `out[t]` holds 16 floats; half `h` is 8 of them.
            unsafe { _mm256_storeu_ps(out[t].as_mut_ptr().add(8 * h), y) };
        }
    }
}
