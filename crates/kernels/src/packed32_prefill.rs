//! Multi-token ("prefill") kernel of [`super::packed32`] on AVX-512 VNNI: each group's weights
//! decoded once per chunk of tokens into a per-thread scratch, then swept by 3-token register
//! tiles.
//!
//! The single-token / 2-token kernels of `packed32_x86` decode a block's nibbles (and Q5_0's fifth
//! bits) for every tile of 2 tokens and build each lane's start value (`-16·Σq_x` etc., the exact
//! correction of the unsigned weight operand) from a general register per token, lane and block:
//! in a prefill most of their instructions are that overhead around the 8 `vpdpbusd` per block
//! and token. Here a task
//! 1. takes the tokens in chunks of [`CHUNK`] (their activations stay in L2 while every group
//!    of the task passes over them) and writes the chunk's start values once (`c · lane_sum`,
//!    `c` = −8 / −16 / −128 / 0 for Q4_0 / Q5_0 / Q8_0 / Q4_1),
//! 2. decodes a group's blocks once per chunk into the scratch (per block: the 8 lanes' unsigned
//!    weight bytes of all 16 rows as 64-byte vectors, and `d` (and Q4_1's `m`) as 16 f32),
//! 3. runs tiles of [`TILE`] tokens over the decoded blocks: per lane one weight load shared by
//!    the tile's tokens, and per token one broadcast start load, one `vpdpbusd` with the
//!    activation bytes as a broadcast memory operand, one conversion and one fused multiply-add.
//!
//! The integers are the same exact lane sums as before and the float operations the same
//! sequence (one fused multiply-add per lane and block into eight lane accumulators, `hsum8`'s
//! tree, Q4_1's `m` term), so outputs are **bit-identical** to the other packed paths and to the
//! unpacked kernels, whatever the tile, chunk, batch or thread split (tests below and in
//! `packed32`).
//!
//! The same sweep computes the `BlockSum` definition (`packed32_blocksum`) with tiles of
//! [`TILE_BS`] tokens: per token and block the eight `vpdpbusd` chain into one exact integer
//! sum (from the block's correction `c · Σx`), then one conversion and one fused multiply-add
//! into one accumulator (Q4_1's `m` term a second one) — bit-identical to that definition's
//! other paths. It never allocates once its scratch has grown.

use std::arch::x86_64::*;
use std::cell::RefCell;
use std::ops::Range;

use super::act_quant::{ActQ8, QK8};
use super::cpu::CpuFeatures;
use super::out_ptr::OutPtr;
use super::packed32::{assert_shapes, Packed32, PackedDef, GROUP_ROWS, Q4_0, Q4_1, Q5_0, Q8_0};
use gguf::GgmlType;

/// Fewest tokens of a call for which [`run_groups`] takes this path (below it the decode
/// kernels, whose per-call cost is lower). The `BlockSum` definition comes here from
/// `FEW_TOKENS_PASSES_MAX + 1` tokens on (`packed32_blocksum::few_tokens512` below that).
pub(super) const MIN_TOKENS: usize = 3;

/// Tokens per register tile: 8 lane accumulators of 16 rows per token (24 of the 32 vector
/// registers), plus the tile's 3 block scales and the lane's weights.
const TILE: usize = 3;

/// Tokens per register tile of the `BlockSum` sweep: one accumulator and two integer chains
/// per token.
const TILE_BS: usize = 6;

/// Tokens per chunk (a multiple of [`TILE`] and [`TILE_BS`]).
const CHUNK: usize = 96;

/// 64-byte lines per decoded block: 8 weight lanes, `d` as 16 f32, `m` as 16 f32 (Q4_1).
const DEC_LINES: usize = 10;

/// One 64-byte, 64-byte aligned line of the scratch.
#[derive(Clone, Copy)]
#[repr(C, align(64))]
struct Line([u8; 64]);

/// Per-thread scratch: a group's decoded blocks and a chunk's start values.
#[derive(Default)]
struct Scratch {
    dec: Vec<Line>,
    starts: Vec<i32>,
}

thread_local! {
    static SCRATCH: RefCell<Scratch> = RefCell::new(Scratch::default());
}

/// Whether this path is on (the default; `AGENTKV_PACKED_PREFILL=0`, read once, turns it off to
/// measure the 2-token tiles it replaces: same results either way).
pub(super) fn enabled() -> bool {
    static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *ON.get_or_init(|| std::env::var("AGENTKV_PACKED_PREFILL").map_or(true, |v| v != "0"))
}

/// Computes groups `groups` of `p` for every token of `act` into `out` (`[num_tokens,
/// num_rows]`) in the definition `def` and returns `true`; returns `false` (computing nothing)
/// where this path does not apply: fewer than [`MIN_TOKENS`] tokens or no AVX-512 VNNI on this
/// CPU.
pub(super) fn run_groups(
    p: &Packed32,
    features: CpuFeatures,
    def: PackedDef,
    act: &ActQ8,
    groups: Range<usize>,
    out: &OutPtr,
) -> bool {
    let f = features.clamp_to_detected();
    if !(f.vnni && f.avx512) || act.num_tokens < MIN_TOKENS || !enabled() {
        return false;
    }
    assert_shapes(p, act, &groups);
    let run = |s: &mut Scratch| {
        // SAFETY: AVX-512 F+VL+VNNI and AVX2+FMA+F16C were detected (`clamp_to_detected`); the
        // shapes were checked just above.
        unsafe {
            match (p.ty(), def == PackedDef::BlockSum) {
                (GgmlType::Q4_0, false) => run::<Q4_0, false>(p, act, groups, out, s),
                (GgmlType::Q4_1, false) => run::<Q4_1, false>(p, act, groups, out, s),
                (GgmlType::Q5_0, false) => run::<Q5_0, false>(p, act, groups, out, s),
                (_, false) => run::<Q8_0, false>(p, act, groups, out, s),
                (GgmlType::Q4_0, true) => run::<Q4_0, true>(p, act, groups, out, s),
                (GgmlType::Q4_1, true) => run::<Q4_1, true>(p, act, groups, out, s),
                (GgmlType::Q5_0, true) => run::<Q5_0, true>(p, act, groups, out, s),
                (_, true) => run::<Q8_0, true>(p, act, groups, out, s),
            }
        }
    };
    SCRATCH.with(|cell| match cell.try_borrow_mut() {
        Ok(mut s) => run(&mut s),
        Err(_) => run(&mut Scratch::default()),
    });
    true
}

/// The whole task: chunks of tokens, groups, tiles (`BS`: the `BlockSum` definition).
///
/// # Safety
/// AVX-512 F+VL+VNNI and AVX2+FMA+F16C present; `act` holds `act.num_tokens` tokens of
/// `p.num_blocks()` blocks in all its buffers and `groups` lies in `p` (checked by
/// [`run_groups`]).
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512vl,avx512vnni")]
unsafe fn run<const K: u8, const BS: bool>(
    p: &Packed32,
    act: &ActQ8,
    groups: Range<usize>,
    out: &OutPtr,
    s: &mut Scratch,
) {
    let (nb, n) = (p.num_blocks(), p.num_rows());
    let num_tokens = act.num_tokens;
    s.dec.resize(nb * DEC_LINES, Line([0; 64]));
    let starts_per_block = if BS { 1 } else { 8 };
    s.starts
        .resize(CHUNK.min(num_tokens) * nb * starts_per_block, 0);
    let c = super::packed32_x86::vnni_correction(K);
    let mut t0 = 0;
    while t0 < num_tokens {
        let t1 = (t0 + CHUNK).min(num_tokens);
        let sums = if BS {
            &act.block_sums[t0 * nb..t1 * nb]
        } else {
            &act.lane_sums[t0 * nb * 8..t1 * nb * 8]
        };
        for (st, ls) in s.starts.iter_mut().zip(sums) {
            *st = c * ls;
        }
        for g in groups.clone() {
            // SAFETY: features as this function's; `s.dec` holds `nb * DEC_LINES` lines.
            unsafe { decode_group::<K>(p, g, &mut s.dec) };
            let rows = (n - g * GROUP_ROWS).min(GROUP_ROWS);
            let mut t = t0;
            while t < t1 {
                let tt = (t1 - t).min(if BS { TILE_BS } else { TILE });
                let mut o = [[0f32; 16]; TILE_BS];
                // SAFETY: features as this function's; `s.dec` holds the group's `nb` decoded
                // blocks, `s.starts` the chunk's `(t1 - t0) * nb * starts_per_block` starts, and
                // tokens `t..t + tt` lie in `t0..t1 <= num_tokens`, whose blocks `act` holds.
                unsafe {
                    let (dec, st, tc) = (&s.dec[..], &s.starts[..], t - t0);
                    match (BS, tt) {
                        (false, 3) => tile::<K, 3>(dec, nb, act, st, t, tc, &mut o),
                        (false, 2) => tile::<K, 2>(dec, nb, act, st, t, tc, &mut o),
                        (false, _) => tile::<K, 1>(dec, nb, act, st, t, tc, &mut o),
                        (true, 6) => tile_bs::<K, 6>(dec, nb, act, st, t, tc, &mut o),
                        (true, 5) => tile_bs::<K, 5>(dec, nb, act, st, t, tc, &mut o),
                        (true, 4) => tile_bs::<K, 4>(dec, nb, act, st, t, tc, &mut o),
                        (true, 3) => tile_bs::<K, 3>(dec, nb, act, st, t, tc, &mut o),
                        (true, 2) => tile_bs::<K, 2>(dec, nb, act, st, t, tc, &mut o),
                        (true, _) => tile_bs::<K, 1>(dec, nb, act, st, t, tc, &mut o),
                    }
                }
                for (dt, row) in o.iter().take(tt).enumerate() {
                    for (lane, v) in row.iter().take(rows).enumerate() {
                        out.write((t + dt) * n + g * GROUP_ROWS + lane, *v);
                    }
                }
                t += tt;
            }
        }
        t0 = t1;
    }
}

/// Q5_0's fifth bit of lane `l` as `0x10` per byte, from the block's rearranged high-bit chunk
/// `h` (bit `l` of each byte; see `packed32`): shifted to bit 4 and masked. 32-bit shifts by at
/// most 4 never carry another byte's bit into bit 4.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512vl,avx512vnni")]
#[inline]
fn high_bit(h: __m512i, l: usize) -> __m512i {
    let m = _mm512_set1_epi8(0x10);
    match l {
        0 => _mm512_and_si512(_mm512_slli_epi32::<4>(h), m),
        1 => _mm512_and_si512(_mm512_slli_epi32::<3>(h), m),
        2 => _mm512_and_si512(_mm512_slli_epi32::<2>(h), m),
        3 => _mm512_and_si512(_mm512_slli_epi32::<1>(h), m),
        4 => _mm512_and_si512(h, m),
        5 => _mm512_and_si512(_mm512_srli_epi32::<1>(h), m),
        6 => _mm512_and_si512(_mm512_srli_epi32::<2>(h), m),
        _ => _mm512_and_si512(_mm512_srli_epi32::<3>(h), m),
    }
}

/// Decodes every block of group `g` into `dec` (`DEC_LINES` lines per block): lane `l`'s
/// unsigned weight bytes of the 16 rows (Q4_0 / Q4_1 nibbles, Q5_0 `nibble | fifth_bit << 4`,
/// Q8_0 `q + 128`), then `d` (and Q4_1's `m`) as f32.
///
/// # Safety
/// AVX-512 F+VL+VNNI and AVX2+FMA+F16C present; `g < p.num_groups()`;
/// `dec.len() >= p.num_blocks() * DEC_LINES`.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512vl,avx512vnni")]
unsafe fn decode_group<const K: u8>(p: &Packed32, g: usize, dec: &mut [Line]) {
    let (nb, bb) = (p.num_blocks(), p.block_bytes());
    let grp = p.group(g);
    assert!(
        grp.len() >= nb * bb && dec.len() >= nb * DEC_LINES,
        "group and scratch hold every block"
    );
    let chunks = match K {
        Q8_0 => 8,
        Q5_0 => 5,
        _ => 4,
    };
    let scales = chunks * 64;
    let nib = _mm512_set1_epi8(0x0F);
    let flip = _mm512_set1_epi8(-128);
    for b in 0..nb {
        let bp = grp[b * bb..(b + 1) * bb].as_ptr();
        let dp = dec[b * DEC_LINES..(b + 1) * DEC_LINES]
            .as_mut_ptr()
            .cast::<u8>();
        // SAFETY: a packed block holds `chunks` 64-byte chunks, then 32 bytes of d (and 32 of m
        // for Q4_1), all inside its `bb` bytes; the block's `DEC_LINES` lines of `dec` are
        // 64-byte aligned and exclusively borrowed.
        unsafe {
            let mut w = [_mm512_setzero_si512(); 8];
            if K == Q8_0 {
                for (c, wc) in w.iter_mut().enumerate() {
                    *wc = _mm512_xor_si512(_mm512_loadu_si512(bp.add(64 * c).cast()), flip);
                }
            } else if K == Q5_0 {
                let h = _mm512_loadu_si512(bp.add(64 * 4).cast());
                for c in 0..4 {
                    let v = _mm512_loadu_si512(bp.add(64 * c).cast());
                    w[c] = _mm512_or_si512(_mm512_and_si512(v, nib), high_bit(h, c));
                    let hi = _mm512_and_si512(_mm512_srli_epi32::<4>(v), nib);
                    w[4 + c] = _mm512_or_si512(hi, high_bit(h, 4 + c));
                }
            } else {
                for c in 0..4 {
                    let v = _mm512_loadu_si512(bp.add(64 * c).cast());
                    w[c] = _mm512_and_si512(v, nib);
                    w[4 + c] = _mm512_and_si512(_mm512_srli_epi32::<4>(v), nib);
                }
            }
            for (l, wl) in w.iter().enumerate() {
                _mm512_store_si512(dp.add(64 * l).cast(), *wl);
            }
            let d = _mm512_cvtph_ps(_mm256_loadu_si256(bp.add(scales).cast()));
            _mm512_store_ps(dp.add(64 * 8).cast(), d);
            if K == Q4_1 {
                let m = _mm512_cvtph_ps(_mm256_loadu_si256(bp.add(scales + 32).cast()));
                _mm512_store_ps(dp.add(64 * 9).cast(), m);
            }
        }
    }
}

/// `hsum8` of the eight lane accumulators, lane by lane of the vectors (the canonical tree:
/// `((a0 + a4) + (a2 + a6)) + ((a1 + a5) + (a3 + a7))`).
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512vl,avx512vnni")]
#[inline]
fn hsum8_lanes(a: &[__m512; 8]) -> __m512 {
    let t = [
        _mm512_add_ps(a[0], a[4]),
        _mm512_add_ps(a[1], a[5]),
        _mm512_add_ps(a[2], a[6]),
        _mm512_add_ps(a[3], a[7]),
    ];
    _mm512_add_ps(_mm512_add_ps(t[0], t[2]), _mm512_add_ps(t[1], t[3]))
}

/// `out[t]` = the 16 rows of the decoded group `dec` for token `tok0 + t`, `t < T`; `tc0` is
/// `tok0`'s index in the chunk whose starts `starts` holds.
///
/// # Safety
/// AVX-512 F+VL+VNNI and AVX2+FMA+F16C present; `dec` holds `nb` decoded blocks; `starts` holds
/// the starts of tokens `tc0..tc0 + T` of the chunk (`(tc0 + T) * nb * 8` values); `act` holds
/// tokens `tok0..tok0 + T` of `nb` blocks in every buffer.
// The register tile indexes several arrays by token, row and lane at once.
#[allow(clippy::needless_range_loop)]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512vl,avx512vnni")]
unsafe fn tile<const K: u8, const T: usize>(
    dec: &[Line],
    nb: usize,
    act: &ActQ8,
    starts: &[i32],
    tok0: usize,
    tc0: usize,
    out: &mut [[f32; 16]; TILE_BS],
) {
    debug_assert!(dec.len() >= nb * DEC_LINES && (tc0 + T) * nb * 8 <= starts.len());
    debug_assert!((tok0 + T) * nb <= act.d.len() && (tok0 + T) * nb * QK8 <= act.qs.len());
    let mut acc = [[_mm512_setzero_ps(); 8]; T];
    let mut summs = [_mm512_setzero_ps(); T];
    let (decp, xq, st) = (dec.as_ptr().cast::<u8>(), act.qs.as_ptr(), starts.as_ptr());
    let (ad, as_) = (act.d.as_ptr(), act.s.as_ptr());
    for b in 0..nb {
        // SAFETY: every offset below is inside the buffer the caller guarantees: block `b < nb`
        // of `dec` (`DEC_LINES` lines, 64-byte aligned), token `tok0 + t` / chunk index `tc0 + t`
        // (`t < T`) of `act` and `starts`, lane `l < 8` (`4l + 4 <= 32` bytes of the block).
        unsafe {
            let blk = decp.add(b * DEC_LINES * 64);
            let d = _mm512_load_ps(blk.add(64 * 8).cast());
            let mut dd = [d; T];
            for (t, ddt) in dd.iter_mut().enumerate() {
                *ddt = _mm512_mul_ps(d, _mm512_set1_ps(*ad.add((tok0 + t) * nb + b)));
            }
            for l in 0..8 {
                let w = _mm512_load_si512(blk.add(64 * l).cast());
                for t in 0..T {
                    let start = if K == Q4_1 {
                        _mm512_setzero_si512()
                    } else {
                        _mm512_set1_epi32(*st.add(((tc0 + t) * nb + b) * 8 + l))
                    };
                    let xp = xq.add(((tok0 + t) * nb + b) * QK8 + 4 * l);
                    let xs = _mm512_set1_epi32(xp.cast::<i32>().read_unaligned());
                    let i = _mm512_dpbusd_epi32(start, w, xs);
                    acc[t][l] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(i), dd[t], acc[t][l]);
                }
            }
            if K == Q4_1 {
                let m = _mm512_load_ps(blk.add(64 * 9).cast());
                for (t, sm) in summs.iter_mut().enumerate() {
                    let s = _mm512_set1_ps(*as_.add((tok0 + t) * nb + b));
                    *sm = _mm512_fmadd_ps(m, s, *sm);
                }
            }
        }
    }
    for t in 0..T {
        let r = hsum8_lanes(&acc[t]);
        let y = if K == Q4_1 {
            _mm512_add_ps(r, summs[t])
        } else {
            r
        };
        // SAFETY: `out[t]` holds 16 floats.
        unsafe { _mm512_storeu_ps(out[t].as_mut_ptr(), y) };
    }
}

/// The `BlockSum` twin of [`tile`]: `out[t]` = the 16 rows of the decoded group `dec` for token
/// `tok0 + t`, `t < T`, in that definition; `starts` holds one start (`c · Σx`) per token and
/// block of the chunk, `tc0` is `tok0`'s index in it. Per token and block the lanes' `vpdpbusd`
/// chain in two exact integer sums (even and odd lanes) added once, then
/// `acc = fma(f32(isum), d · d_x, acc)` and, for Q4_1, `acc = fma(m, s_x, acc)`:
/// `token_scalar`'s operations.
///
/// # Safety
/// As [`tile`]'s, with `(tc0 + T) * nb` values in `starts`.
#[allow(clippy::needless_range_loop)]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512vl,avx512vnni")]
unsafe fn tile_bs<const K: u8, const T: usize>(
    dec: &[Line],
    nb: usize,
    act: &ActQ8,
    starts: &[i32],
    tok0: usize,
    tc0: usize,
    out: &mut [[f32; 16]; TILE_BS],
) {
    debug_assert!(dec.len() >= nb * DEC_LINES && (tc0 + T) * nb <= starts.len());
    debug_assert!((tok0 + T) * nb <= act.d.len() && (tok0 + T) * nb * QK8 <= act.qs.len());
    let mut acc = [_mm512_setzero_ps(); T];
    let (decp, xq, st) = (dec.as_ptr().cast::<u8>(), act.qs.as_ptr(), starts.as_ptr());
    let (ad, as_) = (act.d.as_ptr(), act.s.as_ptr());
    for b in 0..nb {
        // SAFETY: every offset below is inside the buffer the caller guarantees: block `b < nb`
        // of `dec` (`DEC_LINES` lines, 64-byte aligned), token `tok0 + t` / chunk index `tc0 + t`
        // (`t < T`) of `act` and `starts`, lane `l < 8` (`4l + 4 <= 32` bytes of the block).
        unsafe {
            let blk = decp.add(b * DEC_LINES * 64);
            let mut even = [_mm512_setzero_si512(); T];
            let mut odd = [_mm512_setzero_si512(); T];
            if K != Q4_1 {
                for t in 0..T {
                    even[t] = _mm512_set1_epi32(*st.add((tc0 + t) * nb + b));
                }
            }
            for l in 0..8 {
                let w = _mm512_load_si512(blk.add(64 * l).cast());
                for t in 0..T {
                    let xp = xq.add(((tok0 + t) * nb + b) * QK8 + 4 * l);
                    let xs = _mm512_set1_epi32(xp.cast::<i32>().read_unaligned());
                    if l % 2 == 0 {
                        even[t] = _mm512_dpbusd_epi32(even[t], w, xs);
                    } else {
                        odd[t] = _mm512_dpbusd_epi32(odd[t], w, xs);
                    }
                }
            }
            let d = _mm512_load_ps(blk.add(64 * 8).cast());
            for t in 0..T {
                let dd = _mm512_mul_ps(d, _mm512_set1_ps(*ad.add((tok0 + t) * nb + b)));
                let isum = _mm512_add_epi32(even[t], odd[t]);
                acc[t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(isum), dd, acc[t]);
            }
            if K == Q4_1 {
                let m = _mm512_load_ps(blk.add(64 * 9).cast());
                for t in 0..T {
                    let s = _mm512_set1_ps(*as_.add((tok0 + t) * nb + b));
                    acc[t] = _mm512_fmadd_ps(m, s, acc[t]);
                }
            }
        }
    }
    for t in 0..T {
        // SAFETY: `out[t]` holds 16 floats.
        unsafe { _mm512_storeu_ps(out[t].as_mut_ptr(), acc[t]) };
    }
}

/// The bit-identity check both prefill kernels' tests run.
#[cfg(test)]
pub(super) mod check {
    use super::*;
    use crate::matmul::matmul_with_def;
    use crate::packed32::PackedDef;
    use crate::{QMatrix, ThreadPool};
    use gguf::quantize::quantize_row;
    use rand::{Rng, SeedableRng};

    fn bits(v: &[f32]) -> Vec<u32> {
        v.iter().map(|x| x.to_bits()).collect()
    }

    /// Every type, the token counts `toks` (across the kernel's tile and chunk edges), padded
    /// groups and 1 or 2 threads (groups split into tasks): the matmul with `features` in the
    /// definition `def` is bit-identical to the portable path's.
    pub(crate) fn prefill_matches_portable(
        features: CpuFeatures,
        def: PackedDef,
        seed: u64,
        toks: &[usize],
    ) {
        let pools = [ThreadPool::new(1), ThreadPool::new(2)];
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
            let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(seed + i as u64);
            let mut data = Vec::new();
            for _ in 0..rows {
                let x: Vec<f32> = (0..row_len).map(|_| rng.gen_range(-1.0f32..1.0)).collect();
                quantize_row(ty, &x, &mut data).unwrap();
            }
            let p = Packed32::pack(ty, rows, row_len, &data).unwrap();
            let w = QMatrix {
                ty,
                num_rows: rows,
                row_len,
                data: &data,
                packed: Some(&p),
            };
            for &toks in toks {
                let x: Vec<f32> = (0..toks * row_len)
                    .map(|_| rng.gen_range(-3.0f32..3.0))
                    .collect();
                let mut want = vec![0f32; toks * rows];
                let portable = CpuFeatures::PORTABLE;
                matmul_with_def(&pools[0], &w, &x, toks, &mut want, portable, def).unwrap();
                for pool in &pools {
                    let mut y = vec![f32::NAN; toks * rows];
                    matmul_with_def(pool, &w, &x, toks, &mut y, features, def).unwrap();
                    assert_eq!(bits(&y), bits(&want), "{ty:?} toks {toks}");
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Token counts across tile and chunk edges: bit-identical to the portable path.
    #[test]
    fn prefill_tiles_match_portable_bitwise() {
        let f = CpuFeatures::detect();
        if !(f.vnni && f.avx512) {
            eprintln!("no AVX-512 VNNI here: the prefill path does not run");
        }
        let toks = [MIN_TOKENS, 4, 5, 7, CHUNK, CHUNK + 1, 2 * CHUNK + 5];
        check::prefill_matches_portable(f, PackedDef::Ggml, 11, &toks);
    }

    /// The `BlockSum` sweep, token counts across its tile and chunk edges (every remainder of
    /// a tile; the sweep takes more than `FEW_TOKENS_PASSES_MAX` tokens, fewer go to
    /// `packed32_blocksum::few_tokens512`): bit-identical to that definition's portable path.
    #[test]
    fn block_sum_prefill_tiles_match_portable_bitwise() {
        let f = CpuFeatures::detect();
        let toks = [17, 18, 19, 20, 21, 22, CHUNK, CHUNK + 1, 2 * CHUNK + 5];
        assert!(toks[0] > crate::packed32_blocksum::FEW_TOKENS_PASSES_MAX);
        check::prefill_matches_portable(f, PackedDef::BlockSum, 17, &toks);
    }
}
