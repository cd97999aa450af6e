//! The bf16-pair tile step with its scores taken from int8 K codes: `q·Kᵀ` on AVX-512 VNNI's
//! `vpdpbusd` (64 products an instruction, twice `vdpbf16ps`'s) over K kept as the `int8`
//! codec's codes, then `flash_tile_pairs`' softmax and `p·V` over bf16 V in the pair layout.
//! A row's tile costs 96 dot-product instructions instead of the pair step's 128.
//!
//! **The definition** for a row with state `(m, l, acc[hd])`, its query quantised once as
//! `flash_tile_codes` quantises it for `Rows` codes (`q8`, `s`, `Σq8`), and `valid` positions of
//! a 32-position tile whose halves of 16 hold K as [`CodedHalf`]s:
//! 1. `s[t] = (fma(k_s[t], dot_t, k_o[t] · Σq8) · s) · scale`, `dot_t` the exact integer sum of
//!    the position's u8 codes times the query's i8 codes: the `int8` codec's `Rows` scores
//!    (`flash_tile_codes`), bit for bit;
//! 2. steps 2–4 of `flash_tile_pairs` with those scores (the maximum's margin, the bf16
//!    weights and their sum, `p·V` in pair steps).
//!
//! A row's result depends only on its query, its K codes and V, and its position count — never
//! on which rows share the tile. Owns that step (its portable definition and the AVX-512
//! VNNI/BF16 implementation, the same bits); it never reads a KV store, never stages a tile and
//! never allocates.

use half::f16;

use super::cpu::CpuFeatures;
use super::flash_tile::TileSoftmax;
use super::flash_tile_codes::{dot_codes, CodedTile, QueryRef, MAX_CODED_HEAD_DIM};
use super::flash_tile_pairs::{softmax_portable, values_portable, PAIR_TILE_POSITIONS};
use super::pair_layout::{group_words, PAIR_GROUP_ROWS};

const TILE: usize = PAIR_TILE_POSITIONS;
const HALF: usize = PAIR_GROUP_ROWS;

/// Half a tile's K as int8 codes (16 positions): `kt[j · 16 + t]` holds channels `4j..4j + 4`
/// of position `t` (byte `i` = channel `4j + i`, unsigned), with each position's scale and
/// offset (`k = k_s · code + k_o`) as the codec stores them, f16: `params[t]` the scale,
/// `params[16 + t]` the offset — `flash_tile_codes::CodedTile`'s layout ([`CodedHalf::of`]).
/// The step widens them (exactly).
#[derive(Debug, Clone, Copy)]
pub struct CodedHalf<'a> {
    pub(crate) kt: &'a [u32],
    pub(crate) params: &'a [f16; 2 * HALF],
}

impl<'a> CodedHalf<'a> {
    /// The half whose code words are `kt` (`head_dim / 4 · 16` words). Panics otherwise.
    #[inline]
    pub fn new(head_dim: usize, kt: &'a [u32], params: &'a [f16; 2 * HALF]) -> CodedHalf<'a> {
        assert_eq!(
            kt.len(),
            head_dim / 4 * HALF,
            "coded half of head_dim {head_dim}"
        );
        CodedHalf { kt, params }
    }

    /// A staged tile's codes (`CodedTile::load_rows` of 16 positions) as a half.
    pub fn of(head_dim: usize, tile: &'a CodedTile) -> CodedHalf<'a> {
        let (kt, params) = tile.rows_codes();
        CodedHalf::new(head_dim, kt, params)
    }

    /// Position `t`'s scale and offset, widened.
    #[inline]
    pub(crate) fn scale_offset(&self, t: usize) -> (f32, f32) {
        (self.params[t].to_f32(), self.params[HALF + t].to_f32())
    }
}

/// One tile as the step reads it: K codes and V words (the pair layout's, each half
/// [`group_words`]`(head_dim)` words) of its two halves; `head_dim` a multiple of 16 and at most
/// [`MAX_CODED_HEAD_DIM`] (integer sums below 2^24: exact as f32).
#[derive(Debug, Clone, Copy)]
pub struct CodedPairTile<'a> {
    head_dim: usize,
    keys: [CodedHalf<'a>; 2],
    values: [&'a [u32]; 2],
}

impl<'a> CodedPairTile<'a> {
    /// Panics unless every part holds `head_dim`'s words (`head_dim` a multiple of 16).
    #[inline]
    pub fn new(
        head_dim: usize,
        keys: [CodedHalf<'a>; 2],
        values: [&'a [u32]; 2],
    ) -> CodedPairTile<'a> {
        assert!(
            head_dim.is_multiple_of(16)
                && head_dim <= MAX_CODED_HEAD_DIM
                && keys.iter().all(|k| k.kt.len() == head_dim / 4 * HALF)
                && values.iter().all(|v| v.len() == group_words(head_dim)),
            "coded pair tile of head_dim {head_dim}"
        );
        CodedPairTile {
            head_dim,
            keys,
            values,
        }
    }
}

impl CodedPairTile<'_> {
    /// Asks the CPU to bring each half whose words do not lie right after those read before it
    /// (`prev`'s second half, then this tile's first) into cache: blocks spread over a pool,
    /// which the hardware prefetcher cannot follow. No effect on any result.
    #[inline]
    pub fn prefetch_jumps(&self, prev: &CodedPairTile<'_>) {
        let before = [
            (prev.keys[1], prev.values[1]),
            (self.keys[0], self.values[0]),
        ];
        for (h, (kb, vb)) in before.into_iter().enumerate() {
            let (k, v) = (self.keys[h], self.values[h]);
            let follows = std::ptr::eq(k.kt.as_ptr(), kb.kt.as_ptr_range().end)
                && std::ptr::eq(v.as_ptr(), vb.as_ptr_range().end);
            if !follows {
                crate::flash_tile::prefetch_l1(k.kt.as_ptr().cast(), std::mem::size_of_val(k.kt));
                crate::flash_tile::prefetch_l1(v.as_ptr().cast(), std::mem::size_of_val(v));
            }
        }
    }

    /// Asks the CPU to start (to L2) each page that this tile's K codes, K parameters or V
    /// words reach into `ahead` bytes further on (`page_prefetch`): the pages a stream of
    /// tiles laid out one after another enters next. No effect on any result.
    #[inline]
    pub fn prefetch_next_pages(&self, ahead: usize) {
        use crate::page_prefetch::prefetch_page_starts;
        for (k, v) in self.keys.iter().zip(self.values) {
            prefetch_page_starts(k.kt.as_ptr().cast(), std::mem::size_of_val(k.kt), ahead);
            prefetch_page_starts(
                k.params.as_ptr().cast(),
                std::mem::size_of_val(k.params),
                ahead,
            );
            prefetch_page_starts(v.as_ptr().cast(), std::mem::size_of_val(v), ahead);
        }
    }
}

/// The step (module doc) for every row `r`: state `sts[r]`, accumulator `accs[r]` (`[hd]`),
/// query `qs[r]` (quantised for `Rows` codes: `flash_tile_codes::QueryCodes::prepare_rows`)
/// and `valids[r]` positions (1..=32) of `tile`. The AVX-512 VNNI/BF16 path where `features`
/// allow it, else the portable one: the same bits. Panics on a shape mismatch.
#[inline]
pub fn tile_update_pairs_coded(
    features: CpuFeatures,
    sts: &mut [TileSoftmax],
    accs: &mut [&mut [f32]],
    qs: &[QueryRef<'_>],
    valids: &[usize],
    tile: CodedPairTile<'_>,
    scale: f32,
) {
    let hd = tile.head_dim;
    assert!(
        sts.len() == accs.len() && accs.len() == qs.len() && qs.len() == valids.len(),
        "coded pair tile rows disagree"
    );
    for ((acc, q), &valid) in accs.iter().zip(qs).zip(valids) {
        assert!(
            acc.len() == hd && q.q8.len() == hd / 4 && (1..=TILE).contains(&valid),
            "coded pair tile row shapes: hd={hd} acc={} q={} valid={valid}",
            acc.len(),
            q.q8.len()
        );
    }
    #[cfg(target_arch = "x86_64")]
    {
        let f = features.clamp_to_detected();
        if f.bf16 && f.vnni {
            // SAFETY: AVX-512 F/BW/VL/BF16/VNNI (with AVX2, FMA) were detected just above;
            // shapes as asserted (accumulators `hd`, queries `hd / 4` words, `1 <= valid <=
            // 32`; `CodedPairTile::new` checked the tile's parts for `hd`, a multiple of 16).
            unsafe { x86::rows(sts, accs, qs, valids, &tile, scale) };
            return;
        }
    }
    let _ = features;
    for r in 0..sts.len() {
        row_portable(&mut sts[r], accs[r], &qs[r], valids[r], &tile, scale);
    }
}

/// [`tile_update_pairs_coded`] over `tiles` in order, for rows that see every position of
/// each (`valid = 32` for every row and tile: a pass's tiles before its rows' last one): the
/// same bits as one call per tile. The AVX-512 path runs the tiles in one loop, each tile's
/// `q·Kᵀ` ahead of the previous tile's softmax and `p·V` (software pipelining: the integer
/// dot products overlap the softmax's dependency chain; every row's operations keep their
/// order). Panics on a shape mismatch.
pub fn tiles_update_pairs_coded(
    features: CpuFeatures,
    sts: &mut [TileSoftmax],
    accs: &mut [&mut [f32]],
    qs: &[QueryRef<'_>],
    tiles: &[CodedPairTile<'_>],
    scale: f32,
) {
    let Some(first) = tiles.first() else {
        return;
    };
    let hd = first.head_dim;
    assert!(
        sts.len() == accs.len()
            && accs.len() == qs.len()
            && tiles.iter().all(|t| t.head_dim == hd)
            && accs
                .iter()
                .zip(qs)
                .all(|(a, q)| a.len() == hd && q.q8.len() == hd / 4),
        "coded pair tiles: rows or head sizes disagree (hd={hd})"
    );
    #[cfg(target_arch = "x86_64")]
    {
        let f = features.clamp_to_detected();
        if f.bf16 && f.vnni {
            // SAFETY: AVX-512 F/BW/VL/BF16/VNNI (with AVX2, FMA) were detected just above;
            // shapes as asserted (accumulators `hd`, queries `hd / 4` words; every tile's parts
            // checked for `hd` by `CodedPairTile::new`); every row sees all 32 positions.
            unsafe { x86::rows_tiles(sts, accs, qs, tiles, scale) };
            return;
        }
    }
    // One row at a time (a row's result never depends on the rows beside it): no allocation.
    for r in 0..sts.len() {
        let (st, acc, q) = (&mut sts[r..r + 1], &mut accs[r..r + 1], &qs[r..r + 1]);
        for &tile in tiles {
            tile_update_pairs_coded(features, st, acc, q, &[TILE], tile, scale);
        }
    }
}

/// The scores of step 1 for one row (positions at and past `valid`: −∞).
fn scores_portable(
    q: &QueryRef<'_>,
    valid: usize,
    tile: &CodedPairTile<'_>,
    scale: f32,
) -> [f32; TILE] {
    let mut s = [f32::NEG_INFINITY; TILE];
    for (t, st) in s.iter_mut().enumerate().take(valid) {
        let half = &tile.keys[t / HALF];
        let u = t % HALF;
        let dot = dot_codes(q.q8, half.kt, u) as f32;
        let (k_s, k_o) = half.scale_offset(u);
        *st = (k_s.mul_add(dot, k_o * q.sum8) * q.s) * scale;
    }
    s
}

/// The definition for one row, in scalar operations.
fn row_portable(
    st: &mut TileSoftmax,
    acc: &mut [f32],
    q: &QueryRef<'_>,
    valid: usize,
    tile: &CodedPairTile<'_>,
    scale: f32,
) {
    let s = scores_portable(q, valid, tile, scale);
    let p = softmax_portable(st, acc, &s, valid);
    values_portable(acc, &p, valid, tile.values, tile.head_dim);
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use std::arch::x86_64::*;

    use super::super::flash_tile_codes::QueryRef;
    use super::super::flash_tile_pairs::x86::{in_blocks, softmax_values};
    use super::{CodedPairTile, TileSoftmax, HALF, TILE};

    /// Every row's step, `BLOCK` rows at a time.
    ///
    /// # Safety
    /// AVX-512 F/BW/VL/BF16/VNNI, AVX2 and FMA present; shapes as `tile_update_pairs_coded`
    /// asserts.
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512bf16,avx512vnni,avx2,fma,f16c")]
    pub(super) unsafe fn rows(
        sts: &mut [TileSoftmax],
        accs: &mut [&mut [f32]],
        qs: &[QueryRef<'_>],
        valids: &[usize],
        tile: &CodedPairTile<'_>,
        scale: f32,
    ) {
        in_blocks!(sts, accs, qs, valids => block(tile, scale));
    }

    /// `R` rows: step 1 in integers (two `vpdpbusd` chains per row and half, even and odd
    /// channel quads — integer sums, exact in any order), the scores as the definition's float
    /// operations, then the pair step's steps 2–4.
    ///
    /// # Safety
    /// As [`rows`].
    #[allow(clippy::needless_range_loop)]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512bf16,avx512vnni,avx2,fma,f16c")]
    unsafe fn block<const R: usize>(
        sts: &mut [TileSoftmax],
        accs: &mut [&mut [f32]],
        qs: &[QueryRef<'_>],
        valids: &[usize],
        tile: &CodedPairTile<'_>,
        scale: f32,
    ) {
        let hd = tile.head_dim;
        // SAFETY: forwarded caller's contract.
        let scores = unsafe { scores::<R>(qs, tile, scale) };
        // Each half's V holds `8 · hd` words (`CodedPairTile::new`).
        let values = tile.values;
        softmax_values!(R, sts, accs, scores, valids, values, hd);
    }

    /// [`rows`] over `tiles` in order for rows that see all 32 positions of each, `BLOCK` rows
    /// at a time: per block, each tile's scores are taken before the previous tile's softmax
    /// and `p·V` run (the same operations per row, in the same order, as one call per tile).
    ///
    /// # Safety
    /// As [`rows`], for every tile; every row's `valid` is 32.
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512bf16,avx512vnni,avx2,fma,f16c")]
    pub(super) unsafe fn rows_tiles(
        sts: &mut [TileSoftmax],
        accs: &mut [&mut [f32]],
        qs: &[QueryRef<'_>],
        tiles: &[CodedPairTile<'_>],
        scale: f32,
    ) {
        in_blocks!(sts, accs, qs => block_tiles(tiles, scale));
    }

    /// `R` rows over `tiles` (all positions valid), pipelined as [`rows_tiles`] says.
    ///
    /// # Safety
    /// As [`rows_tiles`]; `tiles` is not empty.
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512bf16,avx512vnni,avx2,fma,f16c")]
    unsafe fn block_tiles<const R: usize>(
        sts: &mut [TileSoftmax],
        accs: &mut [&mut [f32]],
        qs: &[QueryRef<'_>],
        tiles: &[CodedPairTile<'_>],
        scale: f32,
    ) {
        let full = [TILE; R];
        let valids: &[usize] = &full;
        // SAFETY: forwarded caller's contract (`tiles[0]` exists).
        let mut next = unsafe { scores::<R>(qs, &tiles[0], scale) };
        for (i, tile) in tiles.iter().enumerate() {
            let these = next;
            if let (Some(after), Some(later)) = (tiles.get(i + 1), tiles.get(i + 2)) {
                later.prefetch_jumps(after);
            }
            tile.prefetch_next_pages(crate::page_prefetch::TILE_PAGES_AHEAD);
            if let Some(after) = tiles.get(i + 1) {
                // SAFETY: as above, for the next tile.
                next = unsafe { scores::<R>(qs, after, scale) };
            }
            let (hd, values) = (tile.head_dim, tile.values);
            softmax_values!(R, sts, accs, these, valids, values, hd);
        }
    }

    /// Step 1 for `R` rows: two `vpdpbusd` chains per row and half (even and odd channel
    /// quads — integer sums, exact in any order), then the scores as the definition's float
    /// operations; `[row][half]`, 16 positions each.
    ///
    /// # Safety
    /// As [`rows`].
    #[allow(clippy::needless_range_loop)]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512bf16,avx512vnni,avx2,fma,f16c")]
    #[inline]
    unsafe fn scores<const R: usize>(
        qs: &[QueryRef<'_>],
        tile: &CodedPairTile<'_>,
        scale: f32,
    ) -> [[__m512; 2]; R] {
        let hd = tile.head_dim;
        let quads = hd / 4;
        let qp: [*const u32; R] = std::array::from_fn(|r| qs[r].q8.as_ptr());
        // Two chains per row and half (even and odd quads), so a decode's few rows still keep
        // enough independent `vpdpbusd` chains in flight; integer sums, so exact in any order.
        let mut c = [[[_mm512_setzero_si512(); 2]; 2]; R];
        for (h, half) in tile.keys.iter().enumerate() {
            let k = half.kt.as_ptr();
            // A loop that runs at least once (`hd >= 16`): the accumulators stay in registers.
            let mut j2 = 0;
            loop {
                for l in 0..2 {
                    let j = j2 + l;
                    // SAFETY: `j < hd / 4` (`hd / 4` is even): quad row `j` holds 16 words.
                    let kv = unsafe { _mm512_loadu_si512(k.add(j * HALF).cast()) };
                    for r in 0..R {
                        // SAFETY: `j < hd / 4 = qs[r].q8.len()`.
                        let q = _mm512_set1_epi32(unsafe { *qp[r].add(j) } as i32);
                        c[r][l][h] = _mm512_dpbusd_epi32(c[r][l][h], kv, q);
                    }
                }
                j2 += 2;
                if j2 >= quads {
                    break;
                }
            }
        }
        // Each half's 16 f16 scales, then 16 offsets, widened (exactly).
        // SAFETY: each half's parameters hold 32 halves (64 bytes): two 32-byte loads.
        let ks = tile.keys.map(|half| unsafe {
            _mm512_cvtph_ps(_mm256_loadu_si256(half.params.as_ptr().cast()))
        });
        // SAFETY: as above, the second 32 bytes.
        let ko = tile.keys.map(|half| unsafe {
            _mm512_cvtph_ps(_mm256_loadu_si256(half.params.as_ptr().add(HALF).cast()))
        });
        let vscale = _mm512_set1_ps(scale);
        std::array::from_fn(|r| {
            let (s, sum8) = (_mm512_set1_ps(qs[r].s), _mm512_set1_ps(qs[r].sum8));
            [0, 1].map(|h| {
                // Integer sums below 2^24 (`flash_tile_codes`' bound on `head_dim`): exact.
                let d = _mm512_cvtepi32_ps(_mm512_add_epi32(c[r][0][h], c[r][1][h]));
                let x = _mm512_fmadd_ps(ks[h], d, _mm512_mul_ps(ko[h], sum8));
                _mm512_mul_ps(_mm512_mul_ps(x, s), vscale)
            })
        })
    }
}

#[cfg(test)]
mod tests;
