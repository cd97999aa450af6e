//! Multi-token ("prefill") kernel of [`super::packed32`] on AVX2 (CPUs without AVX-512 VNNI):
//! a group's weights decoded once per chunk of tokens, then each 8-row half swept **lane by
//! lane** for tiles of [`TILE`] tokens.
//!
//! The 2-token kernel of `packed32_x86` keeps all eight lane accumulators of every token of its
//! tile live across the blocks of a row (16 registers for two tokens, plus the eight lanes'
//! weights: more than AVX2's sixteen), and decodes a block's nibbles for every pair of tokens.
//! The canonical operation order (`block32`: one fused multiply-add per lane and block into that
//! lane's accumulator, then `hsum8`'s tree) never mixes lanes before the final sum, so a lane's
//! chain over the blocks can run on its own. Here a task
//! 1. takes the tokens in chunks of [`CHUNK`] (their activations stay in L2 while every group of
//!    the task passes over them) and writes the chunk's start values once (`c · lane_sum`, the
//!    exact correction of the unsigned weight operand: `c` = −8 / −16 for Q4_0 / Q5_0, 0
//!    otherwise; Q8_0 takes its signs with `psignb` as in `packed32_x86`),
//! 2. decodes a group's blocks once per chunk into a per-thread scratch (per half and block the
//!    eight lanes' unsigned weight bytes of eight rows as 32-byte vectors — for Q8_0 also the
//!    signed bytes — and `d` and Q4_1's `m` as eight f32),
//! 3. per half and tile of tokens, forms the tile's `d · d_x` products once (shared by the eight
//!    lanes), then for each lane runs its chain over the blocks for the tile's tokens at once:
//!    one weight load shared by the tokens, and per token one broadcast activation load,
//!    `maddubs` + `madd` (+ the start), one conversion and one fused multiply-add into one of
//!    [`TILE`] accumulators — about ten live registers, no spills.
//!
//! The integers are the same exact lane sums and the float operations the same sequence as every
//! other path, so outputs are **bit-identical** to the portable and 2-token kernels whatever the
//! tile, chunk, batch or thread split (test below and in `packed32`). It never allocates once its
//! scratch has grown.
//!
//! The same driver and scratch also run the `BlockSum` definition (`packed32_blocksum`) for steps
//! of two or more tokens: [`Tile::half_block_sum`] sweeps a tile's tokens block by block instead
//! of lane by lane (corrected per block from the activations' block sums).

use std::arch::x86_64::*;
use std::cell::RefCell;
use std::ops::Range;

use super::act_quant::{ActQ8, QK8};
use super::cpu::CpuFeatures;
use super::out_ptr::OutPtr;
use super::packed32::correction;
use super::packed32::{assert_shapes, Packed32, GROUP_ROWS, Q4_0, Q4_1, Q5_0, Q8_0};
use super::packed32_prefill::{enabled, MIN_TOKENS};
use super::packed32_x86::{hsum8_lanes, q5_lanes256};
use gguf::GgmlType;

/// Tokens per lane sweep: one accumulator each, plus the lane's weights, the `madd` ones and a
/// few temporaries in AVX2's sixteen registers.
const TILE: usize = 8;

/// Tokens per chunk (a multiple of [`TILE`]).
const CHUNK: usize = 64;

/// Rows per half of a group (one 32-bit lane of a 256-bit register each).
const HALF_ROWS: usize = GROUP_ROWS / 2;

/// One 32-byte, 32-byte aligned vector of the scratch.
#[derive(Clone, Copy)]
#[repr(C, align(32))]
struct Ymm([u8; 32]);

/// Per-thread scratch: a group's decoded blocks, its scales, a chunk's start values and a
/// tile's `d · d_x` products.
#[derive(Default)]
struct Scratch {
    /// `[half][block][lane]` weight bytes (Q8_0: `[half][block][|w| lanes, then w lanes]`).
    w: Vec<Ymm>,
    /// `[half][block][d, m]` as eight f32.
    dm: Vec<Ymm>,
    /// `[chunk token][block][lane]` start values.
    starts: Vec<i32>,
    /// `[block][token of the tile]` products `d · d_x` as eight f32.
    dd: Vec<Ymm>,
}

thread_local! {
    static SCRATCH: RefCell<Scratch> = RefCell::new(Scratch::default());
}

/// Weight vectors per decoded block and half: the eight lanes (Q8_0: their magnitudes and their
/// signed bytes).
const fn lines_per_block(k: u8) -> usize {
    if k == Q8_0 {
        16
    } else {
        8
    }
}

/// Computes groups `groups` of `p` for every token of `act` into `out` (`[num_tokens,
/// num_rows]`) and returns `true`; returns `false` (computing nothing) where this path does not
/// apply: fewer than [`MIN_TOKENS`] tokens, no AVX2 on this CPU, AVX-512 VNNI present (its own
/// prefill kernel runs there) or the prefill kernels turned off (`AGENTKV_PACKED_PREFILL=0`,
/// to measure the 2-token kernel they replace: same results either way).
pub(super) fn run_groups(
    p: &Packed32,
    features: CpuFeatures,
    act: &ActQ8,
    groups: Range<usize>,
    out: &OutPtr,
) -> bool {
    let f = features.clamp_to_detected();
    if !f.avx2 || (f.vnni && f.avx512) || act.num_tokens < MIN_TOKENS || !enabled() {
        return false;
    }
    run_task::<false>(p, act, groups, out);
    true
}

/// The [`PackedDef::BlockSum`](super::packed32::PackedDef) twin of [`run_groups`] (any token
/// count, called by `packed32_blocksum` for steps of two or more tokens on AVX2): the same
/// decoded scratch, chunks and tiles, each tile's tokens swept block by block (see
/// [`Tile::half_block_sum`]).
pub(super) fn run_groups_blocksum(p: &Packed32, act: &ActQ8, groups: Range<usize>, out: &OutPtr) {
    run_task::<true>(p, act, groups, out);
}

/// Checks AVX2 and the shapes, then runs [`run`] for `p`'s type with this thread's scratch.
fn run_task<const BS: bool>(p: &Packed32, act: &ActQ8, groups: Range<usize>, out: &OutPtr) {
    assert!(
        CpuFeatures::AVX2.clamp_to_detected().avx2,
        "callers run this kernel only where AVX2 is present"
    );
    assert_shapes(p, act, &groups);
    let run = |s: &mut Scratch| {
        // SAFETY: AVX2+FMA+F16C are present (asserted above); the shapes were checked just
        // above.
        unsafe {
            match p.ty() {
                GgmlType::Q4_0 => run::<Q4_0, BS>(p, act, groups, out, s),
                GgmlType::Q4_1 => run::<Q4_1, BS>(p, act, groups, out, s),
                GgmlType::Q5_0 => run::<Q5_0, BS>(p, act, groups, out, s),
                _ => run::<Q8_0, BS>(p, act, groups, out, s),
            }
        }
    };
    SCRATCH.with(|cell| match cell.try_borrow_mut() {
        Ok(mut s) => run(&mut s),
        Err(_) => run(&mut Scratch::default()),
    });
}

/// The whole task: chunks of tokens, groups, tiles, halves (`BS`: in the `BlockSum` definition,
/// corrected per block from `act.block_sums`, so without the chunk's per-lane start values).
///
/// # Safety
/// AVX2+FMA+F16C present; `act` holds `act.num_tokens` tokens of `p.num_blocks()` blocks in all
/// its buffers and `groups` lies in `p` (checked by [`run_groups`]).
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn run<const K: u8, const BS: bool>(
    p: &Packed32,
    act: &ActQ8,
    groups: Range<usize>,
    out: &OutPtr,
    s: &mut Scratch,
) {
    let (nb, n) = (p.num_blocks(), p.num_rows());
    let num_tokens = act.num_tokens;
    let lpb = lines_per_block(K);
    s.w.resize(2 * nb * lpb, Ymm([0; 32]));
    s.dm.resize(2 * nb * 2, Ymm([0; 32]));
    s.starts.resize(CHUNK.min(num_tokens) * nb * 8, 0);
    s.dd.resize(nb * TILE, Ymm([0; 32]));
    let c = correction(K);
    // A tile's outputs: both halves write rows `0..16` of tokens `0..tt` before they are read
    // (zeroed once here, not per tile).
    let mut o = [[0f32; GROUP_ROWS]; TILE];
    let mut t0 = 0;
    while t0 < num_tokens {
        let t1 = (t0 + CHUNK).min(num_tokens);
        // (`BlockSum` corrects with the activations' block sums instead.)
        if c != 0 && !BS {
            let sums = &act.lane_sums[t0 * nb * 8..t1 * nb * 8];
            for (st, ls) in s.starts.iter_mut().zip(sums) {
                *st = c * ls;
            }
        }
        for g in groups.clone() {
            // SAFETY: features as this function's; the scratch was sized for `nb` blocks.
            unsafe { decode_group::<K>(p, g, &mut s.w, &mut s.dm) };
            let rows = (n - g * GROUP_ROWS).min(GROUP_ROWS);
            let mut t = t0;
            while t < t1 {
                let tt = (t1 - t).min(TILE);
                for h in 0..2 {
                    let w = &s.w[h * nb * lpb..(h + 1) * nb * lpb];
                    let dm = &s.dm[h * nb * 2..(h + 1) * nb * 2];
                    let tile = Tile {
                        nb,
                        act,
                        starts: &s.starts,
                        tok0: t,
                        tc0: t - t0,
                    };
                    // SAFETY: features as this function's; `w` / `dm` hold the half's `nb`
                    // decoded blocks, `s.dd` `nb * TILE` vectors, `s.starts` the chunk's
                    // `(t1 - t0) * nb * 8` starts (when `c != 0`), and tokens `t..t + tt` lie
                    // in `t0..t1 <= num_tokens`, whose blocks `act` holds.
                    unsafe {
                        macro_rules! sweep {
                            ($($n:literal)*) => {
                                match tt {
                                    $($n if BS => tile.half_block_sum::<K, $n>(w, dm, h, &mut o),)*
                                    $($n => tile.half::<K, $n>(w, dm, &mut s.dd, h, &mut o),)*
                                    _ => unreachable!("a tile holds 1..=TILE tokens"),
                                }
                            };
                        }
                        sweep!(1 2 3 4 5 6 7 8);
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

/// Decodes every block of group `g` into `w` (`[half][block][lane]`: Q4_0 / Q4_1 nibbles,
/// Q5_0 `nibble | fifth_bit << 4`, Q8_0 `|q|` then `q`) and `dm` (`[half][block]`: `d`, then
/// Q4_1's `m`, as f32).
///
/// # Safety
/// AVX2+FMA+F16C present; `g < p.num_groups()`; `w` holds `2 * nb * lines_per_block(K)` and `dm`
/// `4 * nb` vectors.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn decode_group<const K: u8>(p: &Packed32, g: usize, w: &mut [Ymm], dm: &mut [Ymm]) {
    let (nb, bb) = (p.num_blocks(), p.block_bytes());
    let lpb = lines_per_block(K);
    let grp = p.group(g);
    assert!(
        grp.len() >= nb * bb && w.len() >= 2 * nb * lpb && dm.len() >= 4 * nb,
        "group and scratch hold every block"
    );
    let chunks = match K {
        Q8_0 => 8,
        Q5_0 => 5,
        _ => 4,
    };
    let scales = chunks * 64;
    let nib = _mm256_set1_epi8(0x0F);
    for h in 0..2 {
        for b in 0..nb {
            let bp = grp[b * bb..(b + 1) * bb].as_ptr().wrapping_add(32 * h);
            let wp = w[(h * nb + b) * lpb..(h * nb + b + 1) * lpb]
                .as_mut_ptr()
                .cast::<u8>();
            let dp = dm[(h * nb + b) * 2..(h * nb + b + 1) * 2]
                .as_mut_ptr()
                .cast::<u8>();
            // SAFETY: a packed block holds `chunks` 64-byte chunks, then 32 bytes of d (and 32
            // of m for Q4_1), all inside its `bb` bytes; half `h` of each is 32 (16) bytes at
            // offset `32h` (`16h`), which `bp` already adds for the chunks. The block's lines of
            // `w` and `dm` are 32-byte aligned and exclusively borrowed.
            unsafe {
                let mut v = [_mm256_setzero_si256(); 16];
                if K == Q8_0 {
                    for c in 0..8 {
                        let q = _mm256_loadu_si256(bp.add(64 * c).cast());
                        v[c] = _mm256_sign_epi8(q, q);
                        v[8 + c] = q;
                    }
                } else if K == Q5_0 {
                    let hb = _mm256_loadu_si256(bp.add(64 * 4).cast());
                    for c in 0..4 {
                        let q = _mm256_loadu_si256(bp.add(64 * c).cast());
                        (v[c], v[4 + c]) = q5_lanes256(q, hb, c);
                    }
                } else {
                    for c in 0..4 {
                        let q = _mm256_loadu_si256(bp.add(64 * c).cast());
                        v[c] = _mm256_and_si256(q, nib);
                        v[4 + c] = _mm256_and_si256(_mm256_srli_epi32::<4>(q), nib);
                    }
                }
                for (l, vl) in v.iter().take(lpb).enumerate() {
                    _mm256_store_si256(wp.add(32 * l).cast(), *vl);
                }
                let sp = bp.wrapping_sub(32 * h);
                let d = _mm256_cvtph_ps(_mm_loadu_si128(sp.add(scales + 16 * h).cast()));
                _mm256_store_ps(dp.cast(), d);
                if K == Q4_1 {
                    let m = _mm256_cvtph_ps(_mm_loadu_si128(sp.add(scales + 32 + 16 * h).cast()));
                    _mm256_store_ps(dp.add(32).cast(), m);
                }
            }
        }
    }
}

/// The tokens of one tile: `tok0..tok0 + T` of `act` (`nb` blocks each), whose chunk starts
/// begin at chunk index `tc0` of `starts`.
struct Tile<'a> {
    nb: usize,
    act: &'a ActQ8,
    starts: &'a [i32],
    tok0: usize,
    tc0: usize,
}

impl Tile<'_> {
    /// Rows `8h..8h + 8` of `out[t]` for the tile's `T` tokens, from the half's decoded blocks
    /// `w` / `dm`; `dd` is scratch for the tile's `d · d_x` products.
    ///
    /// # Safety
    /// AVX2+FMA+F16C present; `w` holds `nb * lines_per_block(K)` and `dm` `2 * nb` vectors,
    /// `dd` `nb * TILE`; `act` holds tokens `tok0..tok0 + T` of `nb` blocks in every buffer and
    /// (Q4_0 / Q5_0) `starts` the starts of chunk tokens `tc0..tc0 + T`.
    // The register tile indexes several arrays by token and lane at once.
    #[allow(clippy::needless_range_loop)]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn half<const K: u8, const T: usize>(
        &self,
        w: &[Ymm],
        dm: &[Ymm],
        dd: &mut [Ymm],
        h: usize,
        out: &mut [[f32; GROUP_ROWS]; TILE],
    ) {
        let (nb, act, tok0) = (self.nb, self.act, self.tok0);
        let lpb = lines_per_block(K);
        assert!(
            T <= TILE
                && w.len() >= nb * lpb
                && dm.len() >= 2 * nb
                && dd.len() >= nb * TILE
                && (tok0 + T) * nb <= act.d.len()
                && (tok0 + T) * nb <= act.s.len()
                && (tok0 + T) * nb * QK8 <= act.qs.len()
                && (K == Q4_1 || K == Q8_0 || (self.tc0 + T) * nb * 8 <= self.starts.len()),
            "tile inside its buffers"
        );
        let (wp, dmp, ddp) = (
            w.as_ptr().cast::<u8>(),
            dm.as_ptr().cast::<u8>(),
            dd.as_mut_ptr().cast::<u8>(),
        );
        let (xq, ad, as_, st) = (
            act.qs.as_ptr(),
            act.d.as_ptr(),
            act.s.as_ptr(),
            self.starts.as_ptr(),
        );
        let ones = _mm256_set1_epi16(1);
        let mut lanes = [[_mm256_setzero_ps(); 8]; T];
        let mut summs = [_mm256_setzero_ps(); T];
        // SAFETY: every offset below is inside the buffer asserted above: block `b < nb` of
        // `w` (`lpb` vectors) and `dm` (2), `dd` vector `b * TILE + t` (`t < T <= TILE`), token
        // `tok0 + t` of `act` and chunk index `tc0 + t` of `starts`, lane `l < 8` (`4l + 4 <= 32`
        // bytes of the block).
        unsafe {
            for b in 0..nb {
                let d = _mm256_load_ps(dmp.add(64 * b).cast());
                for t in 0..T {
                    let x = _mm256_set1_ps(*ad.add((tok0 + t) * nb + b));
                    _mm256_store_ps(ddp.add(32 * (b * TILE + t)).cast(), _mm256_mul_ps(d, x));
                }
                if K == Q4_1 {
                    let m = _mm256_load_ps(dmp.add(64 * b + 32).cast());
                    for (t, sm) in summs.iter_mut().enumerate() {
                        let s = _mm256_set1_ps(*as_.add((tok0 + t) * nb + b));
                        *sm = _mm256_fmadd_ps(m, s, *sm);
                    }
                }
            }
            for l in 0..8 {
                let mut acc = [_mm256_setzero_ps(); T];
                for b in 0..nb {
                    let wl = _mm256_load_si256(wp.add(32 * (b * lpb + l)).cast());
                    let ws = if K == Q8_0 {
                        _mm256_load_si256(wp.add(32 * (b * lpb + 8 + l)).cast())
                    } else {
                        wl
                    };
                    for t in 0..T {
                        let xp = xq.add(((tok0 + t) * nb + b) * QK8 + 4 * l);
                        let xs = _mm256_set1_epi32(xp.cast::<i32>().read_unaligned());
                        let prod = if K == Q8_0 {
                            _mm256_maddubs_epi16(wl, _mm256_sign_epi8(xs, ws))
                        } else {
                            _mm256_maddubs_epi16(wl, xs)
                        };
                        let mut i = _mm256_madd_epi16(prod, ones);
                        if K == Q4_0 || K == Q5_0 {
                            let s = *st.add(((self.tc0 + t) * nb + b) * 8 + l);
                            i = _mm256_add_epi32(_mm256_set1_epi32(s), i);
                        }
                        let ddt = _mm256_load_ps(ddp.add(32 * (b * TILE + t)).cast());
                        acc[t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(i), ddt, acc[t]);
                    }
                }
                for t in 0..T {
                    lanes[t][l] = acc[t];
                }
            }
            for t in 0..T {
                let r = hsum8_lanes!(_mm256_add_ps, lanes[t]);
                let y = if K == Q4_1 {
                    _mm256_add_ps(r, summs[t])
                } else {
                    r
                };
                _mm256_storeu_ps(out[t].as_mut_ptr().add(HALF_ROWS * h), y);
            }
        }
    }
}

impl Tile<'_> {
    /// [`Self::half`] in the `BlockSum` definition: per block, each token's eight lanes summed
    /// as 16-bit integers (Q5_0: two halves of four lanes; Q8_0: widened per lane), widened once,
    /// corrected by the block's start, converted once and fused-multiply-added once (Q4_1: and
    /// its `m · s_x` term) into one accumulator per token.
    ///
    /// # Safety
    /// As [`Self::half`] (without `dd` and `starts`: the correction is `c · act.block_sums`).
    #[allow(clippy::needless_range_loop)]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn half_block_sum<const K: u8, const T: usize>(
        &self,
        w: &[Ymm],
        dm: &[Ymm],
        h: usize,
        out: &mut [[f32; GROUP_ROWS]; TILE],
    ) {
        let (nb, act, tok0) = (self.nb, self.act, self.tok0);
        let lpb = lines_per_block(K);
        let corr = correction(K);
        assert!(
            T <= TILE
                && w.len() >= nb * lpb
                && dm.len() >= 2 * nb
                && (tok0 + T) * nb <= act.d.len()
                && (tok0 + T) * nb <= act.s.len()
                && (tok0 + T) * nb * QK8 <= act.qs.len()
                && (tok0 + T) * nb <= act.block_sums.len(),
            "tile inside its buffers"
        );
        let (wp, dmp) = (w.as_ptr().cast::<u8>(), dm.as_ptr().cast::<u8>());
        let (xq, ad, as_, bs) = (
            act.qs.as_ptr(),
            act.d.as_ptr(),
            act.s.as_ptr(),
            act.block_sums.as_ptr(),
        );
        let ones = _mm256_set1_epi16(1);
        let mut acc = [_mm256_setzero_ps(); T];
        // SAFETY: every offset below is inside the buffer asserted above: block `b < nb` of `w`
        // (`lpb` vectors) and `dm` (2), token `tok0 + t` of `act` (`t < T`), lane `l < 8`
        // (`4l + 4 <= 32` bytes of the block).
        unsafe {
            for b in 0..nb {
                let d = _mm256_load_ps(dmp.add(64 * b).cast());
                let m = if K == Q4_1 {
                    _mm256_load_ps(dmp.add(64 * b + 32).cast())
                } else {
                    _mm256_setzero_ps()
                };
                let wb = wp.add(32 * b * lpb);
                let wl = |l: usize| _mm256_load_si256(wb.add(32 * l).cast());
                for t in 0..T {
                    let xi = (tok0 + t) * nb + b;
                    let xp = xq.add(xi * QK8);
                    let xs =
                        |l: usize| _mm256_set1_epi32(xp.add(4 * l).cast::<i32>().read_unaligned());
                    let mut i = if K == Q8_0 {
                        let mut i = _mm256_setzero_si256();
                        for l in 0..8 {
                            let prod =
                                _mm256_maddubs_epi16(wl(l), _mm256_sign_epi8(xs(l), wl(8 + l)));
                            i = _mm256_add_epi32(i, _mm256_madd_epi16(prod, ones));
                        }
                        i
                    } else if K == Q5_0 {
                        let (mut lo, mut hi) = (_mm256_setzero_si256(), _mm256_setzero_si256());
                        for l in 0..4 {
                            lo = _mm256_add_epi16(lo, _mm256_maddubs_epi16(wl(l), xs(l)));
                            hi = _mm256_add_epi16(hi, _mm256_maddubs_epi16(wl(4 + l), xs(4 + l)));
                        }
                        _mm256_add_epi32(_mm256_madd_epi16(lo, ones), _mm256_madd_epi16(hi, ones))
                    } else {
                        let mut s = _mm256_setzero_si256();
                        for l in 0..8 {
                            s = _mm256_add_epi16(s, _mm256_maddubs_epi16(wl(l), xs(l)));
                        }
                        _mm256_madd_epi16(s, ones)
                    };
                    if corr != 0 {
                        i = _mm256_add_epi32(i, _mm256_set1_epi32(corr * *bs.add(xi)));
                    }
                    let ddt = _mm256_mul_ps(d, _mm256_set1_ps(*ad.add(xi)));
                    acc[t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(i), ddt, acc[t]);
                    if K == Q4_1 {
                        acc[t] = _mm256_fmadd_ps(m, _mm256_set1_ps(*as_.add(xi)), acc[t]);
                    }
                }
            }
            for t in 0..T {
                _mm256_storeu_ps(out[t].as_mut_ptr().add(HALF_ROWS * h), acc[t]);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::packed32::PackedDef;
    use crate::packed32_prefill::check::prefill_matches_portable;

    /// Token counts across tile and chunk edges, with AVX-512 masked off so that this kernel
    /// runs on every AVX2 machine: bit-identical to the portable path, in both definitions.
    #[test]
    fn avx2_prefill_tiles_match_portable_bitwise() {
        if !CpuFeatures::detect().avx2 {
            eprintln!("no AVX2 here: the AVX2 prefill path does not run");
            return;
        }
        let f = CpuFeatures {
            avx2: true,
            ..CpuFeatures::PORTABLE
        };
        let toks = [
            MIN_TOKENS,
            4,
            7,
            TILE,
            TILE + 1,
            CHUNK,
            CHUNK + 1,
            2 * CHUNK + 5,
        ];
        prefill_matches_portable(f, PackedDef::Ggml, 21, &toks);
        prefill_matches_portable(f, PackedDef::BlockSum, 22, &toks);
    }
}
