//! The [`PackedDef::BlockSum`](super::packed32::PackedDef) definition of a packed matrix's
//! outputs, its portable twin, its AVX2 and AVX-512 VNNI single-token (decode) kernels and the
//! AVX-512 VNNI kernel of a step of a few decodes (2 to [`FEW_TOKENS_MAX`] tokens, weights
//! streamed once for all of them; up to [`FEW_TOKENS_PASSES_MAX`] in two passes) and its AVX2
//! twin for 2 to [`FEW_TOKENS_AVX2_MAX`] tokens; the prefill
//! sweeps over more tokens live with the others
//! (`packed32_prefill_avx2`, `packed32_prefill`).
//!
//! Definition, per row `r` and token `t` over the blocks `b` in order:
//! ```text
//! acc = 0
//! for b: isum = Σ_k w[r, 32b + k] · x[t, 32b + k]        (exact, i32)
//!        acc  = fma(f32(isum), f16→f32(d[r, b]) · d_x[t, b], acc)
//!        acc  = fma(f16→f32(m[r, b]), s_x[t, b], acc)     (Q4_1 only)
//! y[t, r] = acc
//! ```
//! ggml's order (`PackedDef::Ggml`) converts and accumulates each of the block's eight lane sums
//! separately and adds the lanes at the end; here the lanes are added as integers first. On
//! AVX2 that turns eight `madd` + eight conversions + eight fused multiply-adds per block and
//! eight rows into 16-bit adds of the `maddubs` products (exact: Q4_* sums of sixteen products
//! `≤ 15 · 128` per 16-bit slot fit, Q5_0 takes two halves of eight, Q8_0 widens each lane) and one
//! `madd`, one conversion and one or two fused multiply-adds. Each output is still one fixed
//! sequence of float operations, so the batch-invariance contract of the module holds: outputs
//! do not depend on the batch, the tile, the chunk or the thread split (tests below and in
//! `packed32_prefill_avx2`), and every path here is bit-identical to [`token_scalar`]. They are
//! not bit-identical to `Ggml` (llama.cpp's order): the difference is float rounding only.
//!
//! It never allocates and never chooses the definition (that is `PackedDef::invariant`).

#[cfg(target_arch = "x86_64")]
use std::arch::x86_64::*;
use std::ops::Range;

use super::act_quant::{ActQ8, QK8};
use super::packed32::{
    correction, f16_at, quant_layout, value, Packed32, GROUP_ROWS, Q4_1, Q5_0, Q8_0,
};
use gguf::GgmlType;

/// One token's 16 outputs of group `g` in the `BlockSum` definition (the portable twin of every
/// SIMD path).
pub(super) fn token_scalar(p: &Packed32, g: usize, act: &ActQ8, tok: usize) -> [f32; GROUP_ROWS] {
    let (nb, bb) = (p.num_blocks(), p.block_bytes());
    let grp = p.group(g);
    let scales = quant_layout(p.ty()).1 * 64;
    let xq = &act.qs[tok * nb * QK8..(tok + 1) * nb * QK8];
    let mut y = [0f32; GROUP_ROWS];
    for (lane, yv) in y.iter_mut().enumerate() {
        let mut acc = 0f32;
        for b in 0..nb {
            let blk = &grp[b * bb..(b + 1) * bb];
            let x = &xq[b * QK8..(b + 1) * QK8];
            let isum: i32 = x
                .iter()
                .enumerate()
                .map(|(k, &xk)| value(p.ty(), blk, lane, k) * i32::from(xk))
                .sum();
            let dd = f16_at(blk, scales + lane * 2) * act.d[tok * nb + b];
            acc = (isum as f32).mul_add(dd, acc);
            if p.ty() == GgmlType::Q4_1 {
                acc = f16_at(blk, scales + 32 + lane * 2).mul_add(act.s[tok * nb + b], acc);
            }
        }
        *yv = acc;
    }
    y
}

/// The exact integer sums of one packed block's eight rows `8h..8h + 8` against one token's
/// eight broadcast activation lanes `xs`, before the correction (the unsigned weight operand).
///
/// # Safety
/// AVX2 present; `bp` points at a whole packed block of type `K`.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
unsafe fn half_isum<const K: u8>(bp: *const u8, h: usize, xs: &[__m256i; 8]) -> __m256i {
    let nib = _mm256_set1_epi8(0x0F);
    let ones = _mm256_set1_epi16(1);
    // SAFETY: a packed block holds its 64-byte chunks (and Q5_0's high-bit chunk) at `64c`; half
    // `h` of each is the 32 bytes at `32h` (caller's contract).
    unsafe {
        if K == Q8_0 {
            let mut i = _mm256_setzero_si256();
            for (c, x) in xs.iter().enumerate() {
                let q = _mm256_loadu_si256(bp.add(64 * c + 32 * h).cast());
                let prod = _mm256_maddubs_epi16(_mm256_sign_epi8(q, q), _mm256_sign_epi8(*x, q));
                i = _mm256_add_epi32(i, _mm256_madd_epi16(prod, ones));
            }
            i
        } else if K == Q5_0 {
            let hb = _mm256_loadu_si256(bp.add(64 * 4 + 32 * h).cast());
            let (mut lo, mut hi) = (_mm256_setzero_si256(), _mm256_setzero_si256());
            for c in 0..4 {
                let q = _mm256_loadu_si256(bp.add(64 * c + 32 * h).cast());
                let (wl, wh) = super::packed32_x86::q5_lanes256(q, hb, c);
                lo = _mm256_add_epi16(lo, _mm256_maddubs_epi16(wl, xs[c]));
                hi = _mm256_add_epi16(hi, _mm256_maddubs_epi16(wh, xs[4 + c]));
            }
            _mm256_add_epi32(_mm256_madd_epi16(lo, ones), _mm256_madd_epi16(hi, ones))
        } else {
            let mut s = _mm256_setzero_si256();
            for c in 0..4 {
                let q = _mm256_loadu_si256(bp.add(64 * c + 32 * h).cast());
                s = _mm256_add_epi16(s, _mm256_maddubs_epi16(_mm256_and_si256(q, nib), xs[c]));
                let hi = _mm256_and_si256(_mm256_srli_epi32::<4>(q), nib);
                s = _mm256_add_epi16(s, _mm256_maddubs_epi16(hi, xs[4 + c]));
            }
            _mm256_madd_epi16(s, ones)
        }
    }
}

/// AVX2 decode kernel: token 0 of `act` for groups `groups` into `out` (their rows), both 8-row
/// halves of a block per pass (one set of activation broadcasts), the stream prefetched ahead.
///
/// # Safety
/// AVX2+FMA+F16C present; `act` holds one token of `p.num_blocks()` blocks, `groups` lies in `p`
/// (checked by [`run_groups`]) and `out` holds exactly the groups' rows.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn one_token<const K: u8>(
    p: &Packed32,
    groups: Range<usize>,
    act: &ActQ8,
    out: &mut [f32],
) {
    let (nb, bb) = (p.num_blocks(), p.block_bytes());
    let n = p.num_rows();
    assert!(
        act.num_tokens == 1
            && act.qs.len() >= nb * QK8
            && out.len() == (groups.end * GROUP_ROWS).min(n) - (groups.start * GROUP_ROWS).min(n),
        "one token, output rows of the groups"
    );
    let scales = quant_layout(p.ty()).1 * 64;
    let all = p.bytes();
    let xq = act.qs.as_ptr();
    let corr = correction(K);
    for (g, o) in groups.zip(out.chunks_mut(GROUP_ROWS)) {
        let grp = p.group(g);
        let grp_off = grp.as_ptr() as usize - all.as_ptr() as usize;
        let mut acc = [_mm256_setzero_ps(); 2];
        for b in 0..nb {
            super::packed32_x86::prefetch_ahead(all, grp_off + b * bb, bb);
            let bp = grp[b * bb..(b + 1) * bb].as_ptr();
            // SAFETY: block `b` of the token's activations is the 32 bytes at `32b < 32nb`.
            let xs: [__m256i; 8] = std::array::from_fn(|l| unsafe {
                _mm256_set1_epi32(xq.add(b * QK8 + 4 * l).cast::<i32>().read_unaligned())
            });
            let dx = _mm256_set1_ps(act.d[b]);
            let start = _mm256_set1_epi32(if corr != 0 {
                corr * act.block_sums[b]
            } else {
                0
            });
            for (h, a) in acc.iter_mut().enumerate() {
                // SAFETY: `bp` is a whole packed block of type `K` (inside `grp`); its d (and
                // Q4_1's m) run of 16 f16 starts at `scales` (`scales + 32`), half `h` at `16h`.
                unsafe {
                    let mut i = half_isum::<K>(bp, h, &xs);
                    if corr != 0 {
                        i = _mm256_add_epi32(i, start);
                    }
                    let d = _mm256_cvtph_ps(_mm_loadu_si128(bp.add(scales + 16 * h).cast()));
                    *a = _mm256_fmadd_ps(_mm256_cvtepi32_ps(i), _mm256_mul_ps(d, dx), *a);
                    if K == Q4_1 {
                        let m =
                            _mm256_cvtph_ps(_mm_loadu_si128(bp.add(scales + 32 + 16 * h).cast()));
                        *a = _mm256_fmadd_ps(m, _mm256_set1_ps(act.s[b]), *a);
                    }
                }
            }
        }
        let mut y = [0f32; GROUP_ROWS];
        // SAFETY: `y` holds 16 floats, 8 per half.
        unsafe {
            _mm256_storeu_ps(y.as_mut_ptr(), acc[0]);
            _mm256_storeu_ps(y.as_mut_ptr().add(8), acc[1]);
        }
        o.copy_from_slice(&y[..o.len()]);
    }
}

/// Panics unless `act` holds the tokens `tokens` of `nb` blocks in every buffer the
/// few-token kernels read.
fn assert_tokens(act: &ActQ8, nb: usize, tokens: Range<usize>) {
    let end = tokens.end;
    assert!(
        act.num_tokens >= end
            && act.qs.len() >= end * nb * QK8
            && act.block_sums.len() >= end * nb
            && act.d.len() >= end * nb
            && act.s.len() >= end * nb,
        "tokens {tokens:?} of {nb} blocks"
    );
}

/// Token `t`'s outputs `y` of group `g` into the `[tokens][n]` output (the group's rows that
/// exist: a last group may hold fewer than 16).
fn write_group(out: &super::out_ptr::OutPtr, n: usize, g: usize, t: usize, y: &[f32; GROUP_ROWS]) {
    let rows = (n - g * GROUP_ROWS).min(GROUP_ROWS);
    for (lane, v) in y.iter().take(rows).enumerate() {
        out.write(t * n + g * GROUP_ROWS + lane, *v);
    }
}

/// Most tokens [`few_tokens_avx2`] takes in one pass (AVX2 has 16 vector registers).
pub(super) const FEW_TOKENS_AVX2_MAX: usize = 4;
/// Most tokens of a call taken by [`few_tokens_avx2`] (one pass); more go to the AVX2 prefill
/// sweep (`packed32_prefill_avx2`). On AVX2 a token's arithmetic, not the weights' stream,
/// bounds the kernel: 2 tokens took 0.36–0.39× the sweep's time and 4 tokens 0.8×, but two
/// passes of 4 were slower than the sweep over 8 (the Zen 5 with `AGENTKV_ISA=avx2`).
pub(super) const FEW_TOKENS_AVX2_PASSES_MAX: usize = FEW_TOKENS_AVX2_MAX;

/// The passes a few-token kernel of at most `max` tokens a pass takes `num_tokens` in: as few
/// as fit, of as equal lengths as possible (`(first token, tokens)`).
pub(super) fn passes_of(num_tokens: usize, max: usize) -> impl Iterator<Item = (usize, usize)> {
    let passes = num_tokens.div_ceil(max);
    (0..passes).map(move |i| {
        let start = i * num_tokens / passes;
        (start, (i + 1) * num_tokens / passes - start)
    })
}

/// [`few_tokens_avx2`] for tokens `t0..t0 + len` of `act` (`len` 2 to
/// [`FEW_TOKENS_AVX2_MAX`]), type `K`.
///
/// # Safety
/// As [`few_tokens_avx2`].
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn few_tokens_avx2_any<const K: u8>(
    p: &Packed32,
    groups: Range<usize>,
    act: &ActQ8,
    (t0, len): (usize, usize),
    out: &super::out_ptr::OutPtr,
) {
    // SAFETY: forwarded caller's contract; each arm's `T` is `len`.
    unsafe {
        match len {
            2 => few_tokens_avx2::<K, 2>(p, groups, act, t0, out),
            3 => few_tokens_avx2::<K, 3>(p, groups, act, t0, out),
            4 => few_tokens_avx2::<K, 4>(p, groups, act, t0, out),
            t => panic!("few_tokens_avx2 takes 2 to {FEW_TOKENS_AVX2_MAX} tokens, got {t}"),
        }
    }
}

/// AVX2 kernel for `T` tokens (`2 ≤ T ≤` [`FEW_TOKENS_AVX2_MAX`]: a step of a few decodes, or a
/// pass over part of a few more), tokens `t0..t0 + T` of `act`: [`one_token`]'s operations for
/// each token, block by block, so a block's weights come from memory once a step and from L1 for
/// the step's other tokens (the prefill sweep would write them to a scratch first).
/// Bit-identical to every other path (tests below).
///
/// # Safety
/// AVX2+FMA+F16C present; `act` holds at least `t0 + T` tokens of `p.num_blocks()` blocks,
/// `groups` lies in `p` (checked by [`run_groups`]) and `out` is the
/// `[act.num_tokens][num_rows]` output whose rows of `groups` this task owns.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn few_tokens_avx2<const K: u8, const T: usize>(
    p: &Packed32,
    groups: Range<usize>,
    act: &ActQ8,
    t0: usize,
    out: &super::out_ptr::OutPtr,
) {
    let (nb, bb) = (p.num_blocks(), p.block_bytes());
    let n = p.num_rows();
    assert_tokens(act, nb, t0..t0 + T);
    let scales = quant_layout(p.ty()).1 * 64;
    let all = p.bytes();
    let xq = act.qs.as_ptr();
    let corr = correction(K);
    for g in groups {
        let grp = p.group(g);
        let grp_off = grp.as_ptr() as usize - all.as_ptr() as usize;
        let mut acc = [[_mm256_setzero_ps(); 2]; T];
        for b in 0..nb {
            super::packed32_x86::prefetch_ahead(all, grp_off + b * bb, bb);
            let bp = grp[b * bb..(b + 1) * bb].as_ptr();
            for (t, a2) in acc.iter_mut().enumerate() {
                let tb = (t0 + t) * nb + b;
                // SAFETY: token `t0 + t`'s block `b` is the 32 bytes at `32 tb < 32 end nb`.
                let xs: [__m256i; 8] = std::array::from_fn(|l| unsafe {
                    _mm256_set1_epi32(xq.add(tb * QK8 + 4 * l).cast::<i32>().read_unaligned())
                });
                let dx = _mm256_set1_ps(act.d[tb]);
                let start = _mm256_set1_epi32(if corr != 0 {
                    corr * act.block_sums[tb]
                } else {
                    0
                });
                for (h, a) in a2.iter_mut().enumerate() {
                    // SAFETY: as in `one_token`: `bp` is a whole packed block of type `K`
                    // inside `grp`; its d (and Q4_1's m) run of 16 f16 starts at `scales`
                    // (`scales + 32`), half `h` at `16h`.
                    unsafe {
                        let mut i = half_isum::<K>(bp, h, &xs);
                        if corr != 0 {
                            i = _mm256_add_epi32(i, start);
                        }
                        let d = _mm256_cvtph_ps(_mm_loadu_si128(bp.add(scales + 16 * h).cast()));
                        *a = _mm256_fmadd_ps(_mm256_cvtepi32_ps(i), _mm256_mul_ps(d, dx), *a);
                        if K == Q4_1 {
                            let m = _mm256_cvtph_ps(_mm_loadu_si128(
                                bp.add(scales + 32 + 16 * h).cast(),
                            ));
                            *a = _mm256_fmadd_ps(m, _mm256_set1_ps(act.s[tb]), *a);
                        }
                    }
                }
            }
        }
        for (t, a2) in acc.iter().enumerate() {
            let mut y = [0f32; GROUP_ROWS];
            // SAFETY: `y` holds 16 floats, 8 per half.
            unsafe {
                _mm256_storeu_ps(y.as_mut_ptr(), a2[0]);
                _mm256_storeu_ps(y.as_mut_ptr().add(8), a2[1]);
            }
            write_group(out, n, g, t0 + t, &y);
        }
    }
}

/// AVX-512 VNNI decode kernel: token 0 of `act` for groups `groups` into `out` (their rows),
/// all 16 rows of a block in one pass. A block's integer sum is the eight `vpdpbusd` of its
/// lanes, started from the correction (`vnni_correction(K) · Σx`: Q8_0's signed weights become
/// the unsigned operand by flipping their top bit, `w + 128`), in two
/// chains of four added at the end: all exact, so the same integer as [`token_scalar`]'s, then
/// the same fused multiply-adds. Bit-identical to the other paths (tests below).
///
/// # Safety
/// AVX-512 F+VL+VNNI and AVX2+FMA+F16C present; `act` holds one token of `p.num_blocks()`
/// blocks, `groups` lies in `p` (checked by [`run_groups`]) and `out` holds exactly the groups'
/// rows.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512vl,avx512vnni")]
pub(super) unsafe fn one_token512<const K: u8>(
    p: &Packed32,
    groups: Range<usize>,
    act: &ActQ8,
    out: &mut [f32],
) {
    let (nb, bb) = (p.num_blocks(), p.block_bytes());
    let n = p.num_rows();
    assert!(
        act.num_tokens == 1
            && act.qs.len() >= nb * QK8
            && act.block_sums.len() >= nb
            && out.len() == (groups.end * GROUP_ROWS).min(n) - (groups.start * GROUP_ROWS).min(n),
        "one token, output rows of the groups"
    );
    let scales = quant_layout(p.ty()).1 * 64;
    let all = p.bytes();
    let xq = act.qs.as_ptr();
    let corr = super::packed32_x86::vnni_correction(K);
    let nib = _mm512_set1_epi8(0x0F);
    let flip = _mm512_set1_epi8(-128);
    for (g, o) in groups.zip(out.chunks_mut(GROUP_ROWS)) {
        let grp = p.group(g);
        let grp_off = grp.as_ptr() as usize - all.as_ptr() as usize;
        let mut acc = _mm512_setzero_ps();
        for b in 0..nb {
            super::packed32_x86::prefetch_next_page(all, grp_off + b * bb, bb);
            let bp = grp[b * bb..(b + 1) * bb].as_ptr();
            // SAFETY: block `b` of the token's activations is the 32 bytes at `32b < 32nb`.
            let xs: [__m512i; 8] = std::array::from_fn(|l| unsafe {
                _mm512_set1_epi32(xq.add(b * QK8 + 4 * l).cast::<i32>().read_unaligned())
            });
            let start = _mm512_set1_epi32(if corr != 0 {
                corr * act.block_sums[b]
            } else {
                0
            });
            // SAFETY: a packed block of type `K` holds its 64-byte chunks at `64c` (Q5_0's
            // high-bit chunk at `64 · 4`), then its 16 f16 scales at `scales` (and Q4_1's 16
            // minima at `scales + 32`), all inside `grp` (caller's contract).
            unsafe {
                let (mut i0, mut i1) = (start, _mm512_setzero_si512());
                if K == Q8_0 {
                    for (c, x) in xs.iter().enumerate() {
                        let w = _mm512_xor_si512(_mm512_loadu_si512(bp.add(64 * c).cast()), flip);
                        if c % 2 == 0 {
                            i0 = _mm512_dpbusd_epi32(i0, w, *x);
                        } else {
                            i1 = _mm512_dpbusd_epi32(i1, w, *x);
                        }
                    }
                } else {
                    let h = if K == Q5_0 {
                        _mm512_loadu_si512(bp.add(64 * 4).cast())
                    } else {
                        _mm512_setzero_si512()
                    };
                    for c in 0..4 {
                        let v = _mm512_loadu_si512(bp.add(64 * c).cast());
                        let (lo, hi) = if K == Q5_0 {
                            super::packed32_x86::q5_lanes512(v, h, c)
                        } else {
                            (
                                _mm512_and_si512(v, nib),
                                _mm512_and_si512(_mm512_srli_epi32::<4>(v), nib),
                            )
                        };
                        i0 = _mm512_dpbusd_epi32(i0, lo, xs[c]);
                        i1 = _mm512_dpbusd_epi32(i1, hi, xs[4 + c]);
                    }
                }
                let isum = _mm512_add_epi32(i0, i1);
                let d = _mm512_cvtph_ps(_mm256_loadu_si256(bp.add(scales).cast()));
                let dd = _mm512_mul_ps(d, _mm512_set1_ps(act.d[b]));
                acc = _mm512_fmadd_ps(_mm512_cvtepi32_ps(isum), dd, acc);
                if K == Q4_1 {
                    let m = _mm512_cvtph_ps(_mm256_loadu_si256(bp.add(scales + 32).cast()));
                    acc = _mm512_fmadd_ps(m, _mm512_set1_ps(act.s[b]), acc);
                }
            }
        }
        let mut y = [0f32; GROUP_ROWS];
        // SAFETY: `y` holds 16 floats.
        unsafe { _mm512_storeu_ps(y.as_mut_ptr(), acc) };
        o.copy_from_slice(&y[..o.len()]);
    }
}

/// Most tokens [`few_tokens512`] takes in one pass (a step of a few decodes).
pub(super) const FEW_TOKENS_MAX: usize = 8;
/// Most tokens of a call taken by passes of [`few_tokens512`] (each streams the weights once);
/// more go to the prefill sweep (`packed32_prefill`), which decodes each group's weights into
/// a scratch once per chunk of tokens. Two passes of up to 8 tokens cost less than the sweep
/// over 9 to 16 (its tiles and chunk are sized for hundreds of tokens).
pub(super) const FEW_TOKENS_PASSES_MAX: usize = 2 * FEW_TOKENS_MAX;

/// [`few_tokens512`] for tokens `t0..t0 + len` of `act` (`len` 2 to [`FEW_TOKENS_MAX`]), type
/// `K`.
///
/// # Safety
/// As [`few_tokens512`].
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512vl,avx512vnni")]
pub(super) unsafe fn few_tokens512_any<const K: u8>(
    p: &Packed32,
    groups: Range<usize>,
    act: &ActQ8,
    (t0, len): (usize, usize),
    out: &super::out_ptr::OutPtr,
) {
    // SAFETY: forwarded caller's contract; each arm's `T` is `len`.
    unsafe {
        match len {
            2 => few_tokens512::<K, 2>(p, groups, act, t0, out),
            3 => few_tokens512::<K, 3>(p, groups, act, t0, out),
            4 => few_tokens512::<K, 4>(p, groups, act, t0, out),
            5 => few_tokens512::<K, 5>(p, groups, act, t0, out),
            6 => few_tokens512::<K, 6>(p, groups, act, t0, out),
            7 => few_tokens512::<K, 7>(p, groups, act, t0, out),
            8 => few_tokens512::<K, 8>(p, groups, act, t0, out),
            t => panic!("few_tokens512 takes 2 to {FEW_TOKENS_MAX} tokens, got {t}"),
        }
    }
}

/// AVX-512 VNNI kernel for `T` tokens (`2 ≤ T ≤` [`FEW_TOKENS_MAX`]: a step of a few decodes,
/// or a pass over part of a few more), tokens `t0..t0 + T` of `act`:
/// each block's weights are loaded and unpacked once and applied to all `T` tokens, so the
/// weights stream through memory once per step as they do for one token (the prefill sweep
/// would write them to a scratch and read them back, the single-token kernel would read them
/// `T` times). Per token the block's integer sum is the same exact integer as
/// [`token_scalar`]'s and the float operations the same two fused multiply-adds in block
/// order: bit-identical to every other path (tests below).
///
/// # Safety
/// AVX-512 F+VL+VNNI and AVX2+FMA+F16C present; `act` holds at least `t0 + T` tokens of
/// `p.num_blocks()` blocks, `groups` lies in `p` (checked by [`run_groups`]) and `out` is the
/// `[act.num_tokens][num_rows]` output whose rows of `groups` this task owns.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512vl,avx512vnni")]
pub(super) unsafe fn few_tokens512<const K: u8, const T: usize>(
    p: &Packed32,
    groups: Range<usize>,
    act: &ActQ8,
    t0: usize,
    out: &super::out_ptr::OutPtr,
) {
    let (nb, bb) = (p.num_blocks(), p.block_bytes());
    let n = p.num_rows();
    assert_tokens(act, nb, t0..t0 + T);
    let scales = quant_layout(p.ty()).1 * 64;
    let all = p.bytes();
    let xq = act.qs.as_ptr();
    let corr = super::packed32_x86::vnni_correction(K);
    let nib = _mm512_set1_epi8(0x0F);
    let flip = _mm512_set1_epi8(-128);
    for g in groups {
        let grp = p.group(g);
        let grp_off = grp.as_ptr() as usize - all.as_ptr() as usize;
        let mut acc = [_mm512_setzero_ps(); T];
        for b in 0..nb {
            super::packed32_x86::prefetch_ahead(all, grp_off + b * bb, bb);
            let bp = grp[b * bb..(b + 1) * bb].as_ptr();
            // SAFETY: a packed block of type `K` holds its 64-byte chunks at `64c` (Q5_0's
            // high-bit chunk at `64 · 4`), then its 16 f16 scales at `scales` (and Q4_1's 16
            // minima at `scales + 32`), all inside `grp` (caller's contract). Token `t`'s
            // block `b` is the 32 activation bytes at `32 (t·nb + b) < 32 T nb`.
            unsafe {
                // The block's eight weight operands: chunk `c`'s and, for 4-bit types, its high
                // nibbles (`w[4 + c]`), paired with activation bytes `4c..` and `16 + 4c..`.
                let w: [__m512i; 8] = if K == Q8_0 {
                    std::array::from_fn(|c| {
                        _mm512_xor_si512(_mm512_loadu_si512(bp.add(64 * c).cast()), flip)
                    })
                } else {
                    let h = if K == Q5_0 {
                        _mm512_loadu_si512(bp.add(64 * 4).cast())
                    } else {
                        _mm512_setzero_si512()
                    };
                    let mut w = [_mm512_setzero_si512(); 8];
                    for c in 0..4 {
                        let v = _mm512_loadu_si512(bp.add(64 * c).cast());
                        (w[c], w[4 + c]) = if K == Q5_0 {
                            super::packed32_x86::q5_lanes512(v, h, c)
                        } else {
                            (
                                _mm512_and_si512(v, nib),
                                _mm512_and_si512(_mm512_srli_epi32::<4>(v), nib),
                            )
                        };
                    }
                    w
                };
                let d = _mm512_cvtph_ps(_mm256_loadu_si256(bp.add(scales).cast()));
                let m = if K == Q4_1 {
                    _mm512_cvtph_ps(_mm256_loadu_si256(bp.add(scales + 32).cast()))
                } else {
                    _mm512_setzero_ps()
                };
                for (t, a) in acc.iter_mut().enumerate() {
                    let tb = (t0 + t) * nb + b;
                    let x = xq.add(tb * QK8).cast::<i32>();
                    let start = if corr != 0 {
                        corr * act.block_sums[tb]
                    } else {
                        0
                    };
                    let (mut i0, mut i1) = (_mm512_set1_epi32(start), _mm512_setzero_si512());
                    for c in 0..4 {
                        i0 = _mm512_dpbusd_epi32(
                            i0,
                            w[c],
                            _mm512_set1_epi32(x.add(c).read_unaligned()),
                        );
                        i1 = _mm512_dpbusd_epi32(
                            i1,
                            w[4 + c],
                            _mm512_set1_epi32(x.add(4 + c).read_unaligned()),
                        );
                    }
                    let isum = _mm512_add_epi32(i0, i1);
                    let dd = _mm512_mul_ps(d, _mm512_set1_ps(act.d[tb]));
                    *a = _mm512_fmadd_ps(_mm512_cvtepi32_ps(isum), dd, *a);
                    if K == Q4_1 {
                        *a = _mm512_fmadd_ps(m, _mm512_set1_ps(act.s[tb]), *a);
                    }
                }
            }
        }
        for (t, a) in acc.iter().enumerate() {
            let mut y = [0f32; GROUP_ROWS];
            // SAFETY: `y` holds 16 floats.
            unsafe { _mm512_storeu_ps(y.as_mut_ptr(), *a) };
            write_group(out, n, g, t0 + t, &y);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cpu::CpuFeatures;
    use crate::matmul::matmul_with_def;
    use crate::packed32::tests::random_matrix;
    use crate::packed32::PackedDef;
    use crate::QMatrix;
    use crate::ThreadPool;
    use rand::{Rng, SeedableRng};

    fn bits(v: &[f32]) -> Vec<u32> {
        v.iter().map(|x| x.to_bits()).collect()
    }

    /// The definition against a naive f64 model: the exact integer block sums scaled and added
    /// give the same value to f32 rounding, for every type (the integer corrections and the
    /// 16-bit sums are exact).
    #[test]
    fn scalar_definition_matches_exact_dot() {
        for (i, ty) in [
            GgmlType::Q4_0,
            GgmlType::Q4_1,
            GgmlType::Q5_0,
            GgmlType::Q8_0,
        ]
        .into_iter()
        .enumerate()
        {
            let (rows, row_len) = (20, 256);
            let data = random_matrix(ty, rows, row_len, 40 + i as u64);
            let p = Packed32::pack(ty, rows, row_len, &data).unwrap();
            let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(50 + i as u64);
            let x: Vec<f32> = (0..row_len).map(|_| rng.gen_range(-2.0f32..2.0)).collect();
            let mut act = ActQ8::default();
            act.quantize(CpuFeatures::PORTABLE, &x, 1, row_len);
            let nb = row_len / QK8;
            let scales = quant_layout(ty).1 * 64;
            for g in 0..2 {
                let y = token_scalar(&p, g, &act, 0);
                for (lane, got) in y.iter().enumerate() {
                    let grp = p.group(g);
                    let mut want = 0f64;
                    let mut mag = 0f64;
                    for b in 0..nb {
                        let blk = &grp[b * p.block_bytes()..(b + 1) * p.block_bytes()];
                        let dd = f64::from(f16_at(blk, scales + lane * 2)) * f64::from(act.d[b]);
                        for k in 0..QK8 {
                            let v = f64::from(value(ty, blk, lane, k))
                                * f64::from(act.qs[b * QK8 + k])
                                * dd;
                            want += v;
                            mag += v.abs();
                        }
                        if ty == GgmlType::Q4_1 {
                            let v = f64::from(f16_at(blk, scales + 32 + lane * 2))
                                * f64::from(act.s[b]);
                            want += v;
                            mag += v.abs();
                        }
                    }
                    let err = (f64::from(*got) - want).abs();
                    assert!(
                        err <= 1e-6 * mag.max(1e-3),
                        "{ty:?} g{g} lane{lane}: {got} vs {want} (mag {mag})"
                    );
                }
            }
        }
    }

    /// The passes cover every token once, in order, each of 2 to `FEW_TOKENS_MAX` tokens.
    #[test]
    fn few_token_passes_cover_the_tokens() {
        for n in 2..=FEW_TOKENS_PASSES_MAX {
            let passes: Vec<_> = passes_of(n, FEW_TOKENS_MAX).collect();
            let mut next = 0;
            for &(t0, len) in &passes {
                assert_eq!(t0, next, "{n}: {passes:?}");
                assert!((2..=FEW_TOKENS_MAX).contains(&len), "{n}: {passes:?}");
                next += len;
            }
            assert_eq!(next, n);
            assert_eq!(passes.len(), n.div_ceil(FEW_TOKENS_MAX));
        }
    }

    /// Every path (portable, AVX2 with AVX-512 masked off, AVX-512 VNNI where the CPU has it),
    /// token counts of every few-token kernel (2 to `FEW_TOKENS_MAX`, and their passes up to
    /// `FEW_TOKENS_PASSES_MAX`) and across the prefill kernels' tile and chunk edges, one to three threads and
    /// padded groups give bit-identical outputs; activations at the edge of the 16-bit sums (all
    /// ±127, weights at their extremes) included.
    #[test]
    fn block_sum_paths_and_batches_agree_bitwise() {
        let pools = [ThreadPool::new(1), ThreadPool::new(2), ThreadPool::new(3)];
        let avx2 = CpuFeatures {
            avx2: true,
            ..CpuFeatures::PORTABLE
        };
        for (i, ty) in [
            GgmlType::Q4_0,
            GgmlType::Q4_1,
            GgmlType::Q5_0,
            GgmlType::Q8_0,
        ]
        .into_iter()
        .enumerate()
        {
            let (rows, row_len) = (37, 160);
            let data = random_matrix(ty, rows, row_len, 60 + i as u64);
            let p = Packed32::pack(ty, rows, row_len, &data).unwrap();
            let w = QMatrix {
                ty,
                num_rows: rows,
                row_len,
                data: &data,
                packed: Some(&p),
            };
            let max_toks = 70;
            let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(70 + i as u64);
            let mut x: Vec<f32> = (0..max_toks * row_len)
                .map(|_| rng.gen_range(-3.0f32..3.0))
                .collect();
            // Token 1: every activation at ±max, so each quantises to ±127.
            for (k, v) in x[row_len..2 * row_len].iter_mut().enumerate() {
                *v = if k % 3 == 0 { -1.0 } else { 1.0 };
            }
            let mut want = vec![0f32; max_toks * rows];
            let portable = CpuFeatures::PORTABLE;
            let def = PackedDef::BlockSum;
            matmul_with_def(&pools[0], &w, &x, max_toks, &mut want, portable, def).unwrap();
            for pool in &pools {
                for f in [portable, avx2, super::super::cpu::cpu_features()] {
                    for (t0, toks) in [
                        (0, 1),
                        (1, 1),
                        (5, 2),
                        (0, 3),
                        (2, 4),
                        (0, 5),
                        (4, 6),
                        (0, 7),
                        (1, 8),
                        (3, 9),
                        (0, 13),
                        (2, 16),
                        (0, 17),
                        (1, 64),
                        (0, 70),
                    ] {
                        let xs = &x[t0 * row_len..(t0 + toks) * row_len];
                        let mut y = vec![f32::NAN; toks * rows];
                        matmul_with_def(pool, &w, xs, toks, &mut y, f, def).unwrap();
                        assert_eq!(
                            bits(&y),
                            bits(&want[t0 * rows..(t0 + toks) * rows]),
                            "{ty:?} {f:?} t0 {t0} toks {toks}"
                        );
                    }
                }
            }
            // A different definition from ggml's (a mutation of the definition shows here).
            let mut ggml = vec![0f32; max_toks * rows];
            let gdef = PackedDef::Ggml;
            matmul_with_def(&pools[0], &w, &x, max_toks, &mut ggml, portable, gdef).unwrap();
            assert_ne!(
                bits(&ggml),
                bits(&want),
                "{ty:?}: the two orders differ somewhere"
            );
            let close = ggml
                .iter()
                .zip(&want)
                .all(|(a, b)| (a - b).abs() <= 1e-4 * (1.0 + a.abs()));
            assert!(close, "{ty:?}: the two orders agree to rounding");
        }
    }
}
