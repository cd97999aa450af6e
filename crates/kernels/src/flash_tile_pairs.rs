//! The bf16-pair tile step: `flash_tile`'s tiled online softmax over bf16 K/V, with every
//! product of `q·Kᵀ` and `p·V` taken two at a time in bf16, exactly as AVX-512 BF16's
//! `vdpbf16ps` takes them (32 products an instruction: twice the f32 FMA's rate).
//!
//! Owns the arithmetic of one tile step in that form, its portable definition and its AVX-512
//! BF16 implementation (with an exact AVX2 fallback), and staging a tile into the layouts that instruction reads (K
//! transposed into position lanes, V interleaved by position pairs). It never reads a KV store,
//! never allocates per call and never decides which rows share a tile (`attention_tiled` does).
//!
//! **The pair step** `dp(acc, a, b)` of two words holding two bf16 each (low half the even
//! element, high half the odd one) is one `vdpbf16ps` lane: `acc ← ftz(fma(a.odd, b.odd,
//! daz(acc)))`, then `acc ← ftz(fma(a.even, b.even, acc))` — f32 fused multiply-adds, odd
//! element first, a denormal input or result counting as a zero of its sign (the instruction
//! ignores MXCSR and flushes; `tests::pair_step_is_the_instruction` checks the CPU at hand
//! against this definition).
//!
//! **One tile step** for a row with state `(m, l, acc[hd])`, its query rounded to bf16 once
//! ([`query_pairs`]: round to nearest even, denormals to signed zero, as `vcvtneps2bf16`), and
//! `valid` positions:
//! Tiles hold [`PAIR_TILE_POSITIONS`] (32) positions.
//! 1. scores `s[t] = (c0 + c1) · scale`, where chain `c_l` starts at +0 and takes `dp` with
//!    `(k[t][2i], k[t][2i+1])` and `(q[2i], q[2i+1])` for the dimension pairs `i ≡ l (mod 2)`
//!    in order — two chains per position (`hd` a multiple of 4), so a decode's few rows still
//!    keep enough independent chains in flight;
//! 2. the reference `m` is raised only when the tile's largest score passes it by more than
//!    [`RAISE_MARGIN`]: when `M = max_t s[t] > m + RAISE_MARGIN`, `f = exp(m − M)`,
//!    `acc *= f`, `l *= f`, `m = M` (`exp` and the rescaling as `flash_tile`'s). A row's
//!    first tile always raises it (from −∞); past a row's first few tiles most keep it, so
//!    the maximum is compared lane-wise and reduced only when it is raised. Weights then reach
//!    `e^RAISE_MARGIN` at most; the ratio `acc / l` is unchanged by the choice of `m`;
//! 3. `p[t] = bf16(exp_weight(s[t] − m))` (rounded as the query; 0 at and past `valid`):
//!    [`exp_weight`] is a degree-4 polynomial, accurate far below the bf16 rounding that
//!    follows it (`flash_tile`'s degree-6 one is spent on f32 weights); then
//!    `l += hsum16(lanes)` where lane `j` is the pair step of `(p[2j], p[2j+1])` against
//!    `(1, 1)` from +0 ([`hsum16`]'s fixed tree), so `l` is the sum of the weights `p·V` uses;
//! 4. for each position pair `j < ⌈valid/2⌉` in order, every `e`:
//!    `acc[e] = dp(acc[e], (v[2j][e], v[2j+1][e]), (p[2j], p[2j+1]))`, where a position at
//!    `valid` (odd `valid`, last pair) counts as `p = +0`, `v = +0`.
//!
//! The rescaling's `exp` and the merge of segments are `flash_tile`'s (the merge is exact for
//! any reference `m`). A row's result depends only on its
//! query, its K/V and its position count — never on which rows share the tile or how the tile
//! was staged (positions past a row's `valid` never reach its arithmetic).

use half::bf16;

use super::cpu::CpuFeatures;
use super::flash_tile::{exp_poly_portable, TileSoftmax};
use super::pair_layout::{copy_values_prefix, group_words, PAIR_GROUP_ROWS};
pub use super::pair_layout::{PairHalf, PairTileRef};

/// Positions per softmax tile of this arithmetic (tiles start at multiples of this, counted
/// from position 0; twice `flash_tile`'s, so the softmax's fixed cost is spread over more
/// products).
pub const PAIR_TILE_POSITIONS: usize = 32;
const TILE: usize = PAIR_TILE_POSITIONS;
/// Position pairs per tile.
pub(crate) const PAIRS: usize = TILE / 2;
/// Positions per half of a tile: the unit [`PairTile::stage_half`] stages (a KV store's
/// 16-row block; a group of `pair_layout`).
pub const PAIR_HALF_POSITIONS: usize = TILE / 2;
const _: () = assert!(PAIR_HALF_POSITIONS == PAIR_GROUP_ROWS);

/// `x` rounded to bf16 bits as `vcvtneps2bf16` rounds it: to nearest even, a denormal to a
/// zero of its sign, a NaN to a quiet NaN.
#[inline]
pub fn round_bf16(x: f32) -> u16 {
    let b = x.to_bits();
    if x.is_nan() {
        return ((b >> 16) as u16) | 0x0040;
    }
    if b & 0x7f80_0000 == 0 {
        return ((b >> 16) & 0x8000) as u16;
    }
    let lsb = (b >> 16) & 1;
    ((b + 0x7fff + lsb) >> 16) as u16
}

/// The f32 value of bf16 bits (exact).
#[inline(always)]
fn widen(x: u16) -> f32 {
    f32::from_bits((x as u32) << 16)
}

/// A denormal as a zero of its sign; every other value as it is.
#[inline(always)]
fn flush(x: f32) -> f32 {
    if x.to_bits() & 0x7f80_0000 == 0 {
        f32::from_bits(x.to_bits() & 0x8000_0000)
    } else {
        x
    }
}

/// The pair step (module doc): one `vdpbf16ps` lane.
#[inline]
pub fn pair_step(acc: f32, a: u32, b: u32) -> f32 {
    let odd = flush(widen((a >> 16) as u16)).mul_add(flush(widen((b >> 16) as u16)), flush(acc));
    flush(flush(widen(a as u16)).mul_add(flush(widen(b as u16)), flush(odd)))
}

/// A query row rounded to bf16 pairs: `out[i] = bf16(q[2i]) | bf16(q[2i+1]) << 16`.
/// Panics unless `out` holds `q.len() / 2` words and `q.len()` is even.
pub fn query_pairs(q: &[f32], out: &mut [u32]) {
    assert!(
        q.len().is_multiple_of(2) && out.len() == q.len() / 2,
        "query pairs: q={} out={}",
        q.len(),
        out.len()
    );
    for (o, pair) in out.iter_mut().zip(q.chunks_exact(2)) {
        *o = round_bf16(pair[0]) as u32 | (round_bf16(pair[1]) as u32) << 16;
    }
}

/// One K/V tile staged for the pair step: two groups of `pair_layout` (K transposed into
/// position lanes and V interleaved by position pairs), positions `0..16` and `16..32`.
/// Positions past the staged ones hold zeros.
#[derive(Debug, Clone, Default)]
pub struct PairTile {
    head_dim: usize,
    /// `[2][head_dim / 2][16]`: half `h`'s word `(i, t)` = `k[16h + t][2i] | k[16h + t][2i+1] << 16`.
    keys: Vec<u32>,
    /// `[2][8][head_dim]` (= `[TILE / 2][head_dim]`): word `(j, e)` = `v[2j][e] | v[2j+1][e] << 16`.
    values: Vec<u32>,
}

impl PairTile {
    /// An empty tile for heads of `head_dim` (even).
    pub fn new(head_dim: usize) -> PairTile {
        assert!(
            head_dim.is_multiple_of(2),
            "pair tiles need an even head size"
        );
        PairTile {
            head_dim,
            keys: vec![0; 2 * group_words(head_dim)],
            values: vec![0; 2 * group_words(head_dim)],
        }
    }

    /// The staged tile as the tile step reads it.
    #[inline]
    pub fn view(&self) -> PairTileRef<'_> {
        PairTileRef::new(self.head_dim, self.half(0), self.half(1))
    }

    /// Half `h < 2` of the staged tile (positions `16h..16h + 16`).
    #[inline]
    pub fn half(&self, h: usize) -> PairHalf<'_> {
        let w = group_words(self.head_dim);
        PairHalf::new(
            self.head_dim,
            &self.keys[h * w..(h + 1) * w],
            &self.values[h * w..(h + 1) * w],
        )
    }

    /// Stages rows `0..n` of `group` (a group of the pair layout, e.g. a store's block being
    /// filled) as positions `16·half .. 16·half + n`: the words [`PairTile::stage_half`] writes
    /// for those rows (positions past them zeros). Panics on a shape mismatch.
    pub fn stage_half_from_group(&mut self, half: usize, group: PairHalf<'_>, n: usize) {
        let hd = self.head_dim;
        let w = group_words(hd);
        assert!(
            half < 2 && n <= PAIR_HALF_POSITIONS && group.keys.len() == w,
            "pair tile half from a group: half={half} n={n} hd={hd}"
        );
        let h = PAIR_HALF_POSITIONS;
        let keys = &mut self.keys[half * w..(half + 1) * w];
        for (dst, src) in keys.chunks_exact_mut(h).zip(group.keys.chunks_exact(h)) {
            dst[..n].copy_from_slice(&src[..n]);
            dst[n..].fill(0);
        }
        copy_values_prefix(
            &mut self.values[half * w..(half + 1) * w],
            group.values,
            n,
            hd,
        );
    }

    /// The head size the tile holds.
    pub fn head_dim(&self) -> usize {
        self.head_dim
    }

    /// Stages `n` K and V rows (`[n][head_dim]` bf16) as tile positions `0..n`; positions
    /// `n..` become zeros. Panics on a shape mismatch.
    pub fn stage(&mut self, keys: &[bf16], vals: &[bf16], n: usize) {
        let hd = self.head_dim;
        assert!(
            n <= TILE && keys.len() >= n * hd && vals.len() >= n * hd,
            "pair tile shapes: n={n} hd={hd} keys={} vals={}",
            keys.len(),
            vals.len()
        );
        let first = n.min(PAIR_HALF_POSITIONS);
        self.stage_half(0, keys, vals, first);
        let (k1, v1) = (&keys[first * hd..], &vals[first * hd..]);
        self.stage_half(1, k1, v1, n - first);
    }

    /// Stages `n` K and V rows (`[n][head_dim]` bf16, `n <= 16`) as positions
    /// `16·half .. 16·half + n` of the tile; the half's positions past them become zeros, the
    /// other half is left as it is. A tile's halves are staged alike from any rows (a KV
    /// store's 16-row blocks in place, or rows gathered from smaller pieces): the words are the
    /// same. Panics on a shape mismatch.
    pub fn stage_half(&mut self, half: usize, keys: &[bf16], vals: &[bf16], n: usize) {
        let hd = self.head_dim;
        assert!(
            half < 2 && n <= PAIR_HALF_POSITIONS && keys.len() >= n * hd && vals.len() >= n * hd,
            "pair tile half shapes: half={half} n={n} hd={hd} keys={} vals={}",
            keys.len(),
            vals.len()
        );
        if n == PAIR_HALF_POSITIONS && cfg!(target_endian = "little") {
            // A whole group: `pair_layout_groups`' conversion (512-bit transposes where the CPU
            // has them), from the rows' bytes — little-endian bf16, as the values are laid out
            // in memory on this target.
            let bytes = |x: &[bf16]| -> &[u8] {
                let x = &x[..PAIR_HALF_POSITIONS * hd];
                // SAFETY: `bf16` is two bytes of plain data with no padding and every byte
                // pattern a valid `u8`; the slice covers exactly `x`'s memory, borrowed as long.
                unsafe { std::slice::from_raw_parts(x.as_ptr().cast::<u8>(), 2 * x.len()) }
            };
            let w = group_words(hd);
            crate::pair_layout_groups::group_from_le_bytes(
                bytes(keys),
                bytes(vals),
                &mut self.keys[half * w..(half + 1) * w],
                &mut self.values[half * w..(half + 1) * w],
                hd,
            );
            return;
        }
        self.stage_half_portable(half, keys, vals, n);
    }

    /// [`PairTile::stage_half`] in scalar moves (the same words).
    fn stage_half_portable(&mut self, half: usize, keys: &[bf16], vals: &[bf16], n: usize) {
        let hd = self.head_dim;
        let bits = |x: bf16| x.to_bits() as u32;
        let h = PAIR_HALF_POSITIONS;
        let base = half * group_words(hd);
        for i in 0..hd / 2 {
            let lanes = &mut self.keys[base + i * h..base + (i + 1) * h];
            for (t, w) in lanes.iter_mut().enumerate() {
                *w = if t < n {
                    bits(keys[t * hd + 2 * i]) | bits(keys[t * hd + 2 * i + 1]) << 16
                } else {
                    0
                };
            }
        }
        for jj in 0..h / 2 {
            let j = half * h / 2 + jj;
            let row = &mut self.values[j * hd..(j + 1) * hd];
            let (t0, t1) = (2 * jj, 2 * jj + 1);
            for (e, w) in row.iter_mut().enumerate() {
                let lo = if t0 < n { bits(vals[t0 * hd + e]) } else { 0 };
                let hi = if t1 < n { bits(vals[t1 * hd + e]) } else { 0 };
                *w = lo | hi << 16;
            }
        }
    }

    /// [`PairTile::stage`] in scalar moves (the same words; the reference of the staging test).
    #[cfg(test)]
    fn stage_portable(&mut self, keys: &[bf16], vals: &[bf16], n: usize) {
        let hd = self.head_dim;
        let bits = |x: bf16| x.to_bits() as u32;
        let h = PAIR_HALF_POSITIONS;
        for i in 0..hd / 2 {
            for t in 0..TILE {
                let w = &mut self.keys[(t / h) * group_words(hd) + i * h + t % h];
                *w = if t < n {
                    bits(keys[t * hd + 2 * i]) | bits(keys[t * hd + 2 * i + 1]) << 16
                } else {
                    0
                };
            }
        }
        for j in 0..PAIRS {
            let row = &mut self.values[j * hd..(j + 1) * hd];
            let (t0, t1) = (2 * j, 2 * j + 1);
            for (e, w) in row.iter_mut().enumerate() {
                let lo = if t0 < n { bits(vals[t0 * hd + e]) } else { 0 };
                let hi = if t1 < n { bits(vals[t1 * hd + e]) } else { 0 };
                *w = lo | hi << 16;
            }
        }
    }
}

/// One tile step (module doc) for every row `r`: state `sts[r]`, accumulator `accs[r]`
/// (`[hd]`), query pairs `qs[r]` (`[hd / 2]`, [`query_pairs`]) and `valids[r]` positions of
/// `tile` (a staged [`PairTile`] or two groups of the pair layout read in place). The AVX-512
/// BF16 path where `features` allow it (and `hd` is a multiple of 16), else the portable one:
/// the same bits. Panics on a shape mismatch.
#[inline]
pub fn tile_update_pairs<'t>(
    features: CpuFeatures,
    sts: &mut [TileSoftmax],
    accs: &mut [&mut [f32]],
    qs: &[&[u32]],
    valids: &[usize],
    tile: impl Into<PairTileRef<'t>>,
    scale: f32,
) {
    let tile: PairTileRef<'t> = tile.into();
    let hd = tile.head_dim;
    assert!(
        sts.len() == accs.len() && accs.len() == qs.len() && qs.len() == valids.len(),
        "pair tile rows disagree"
    );
    for ((acc, q), &valid) in accs.iter().zip(qs).zip(valids) {
        assert!(
            hd.is_multiple_of(4)
                && acc.len() == hd
                && q.len() == hd / 2
                && (1..=TILE).contains(&valid),
            "pair tile row shapes: hd={hd} acc={} q={} valid={valid}",
            acc.len(),
            q.len()
        );
    }
    #[cfg(target_arch = "x86_64")]
    if features.clamp_to_detected().bf16 && hd.is_multiple_of(16) {
        // SAFETY: AVX-512 F/BW/VL/BF16 (with AVX2, FMA) were detected just above; every shape
        // the kernel relies on was asserted (accumulators `hd`, queries `hd / 2`, `hd` a
        // multiple of 16, `1 <= valid <= 32`; the tile's halves hold `8 · hd` words each,
        // `PairTileRef::new`).
        unsafe { x86::rows(sts, accs, qs, valids, tile, scale) };
        return;
    }
    #[cfg(target_arch = "x86_64")]
    if features.clamp_to_detected().avx2 && hd.is_multiple_of(8) && hd <= avx2::MAX_HEAD_DIM {
        // SAFETY: AVX2 and FMA were detected just above; shapes as asserted (`hd` a multiple of
        // 8 and at most the path's bound, `1 <= valid <= 32`, the tile's halves sized by
        // `PairTileRef::new`).
        unsafe { avx2::rows(sts, accs, qs, valids, tile, scale) };
        return;
    }
    let _ = features;
    for r in 0..sts.len() {
        row_portable(&mut sts[r], accs[r], qs[r], valids[r], &tile, scale);
    }
}

/// [`tile_update_pairs`] over `tiles` in order, for rows that see every position of each
/// (`valid = 32` for every row and tile: a pass's tiles before its rows' last one): the same
/// bits as one call per tile. The AVX-512 BF16 path runs the tiles in one loop, each tile's
/// `q·Kᵀ` ahead of the previous tile's softmax and `p·V` (software pipelining; every row's
/// operations keep their order). Panics on a shape mismatch.
pub fn tiles_update_pairs(
    features: CpuFeatures,
    sts: &mut [TileSoftmax],
    accs: &mut [&mut [f32]],
    qs: &[&[u32]],
    tiles: &[PairTileRef<'_>],
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
                .all(|(a, q)| a.len() == hd && q.len() == hd / 2),
        "pair tiles: rows or head sizes disagree (hd={hd})"
    );
    #[cfg(target_arch = "x86_64")]
    if features.clamp_to_detected().bf16 && hd.is_multiple_of(16) {
        // SAFETY: AVX-512 F/BW/VL/BF16 (with AVX2, FMA) were detected just above; shapes as
        // asserted (accumulators `hd`, queries `hd / 2`, `hd` a multiple of 16; every tile's
        // halves hold `8 · hd` words, `PairTileRef::new`); every row sees all 32 positions.
        unsafe { x86::rows_tiles(sts, accs, qs, tiles, scale) };
        return;
    }
    // One row at a time (a row's result never depends on the rows beside it): no allocation.
    for r in 0..sts.len() {
        let (st, acc, q) = (&mut sts[r..r + 1], &mut accs[r..r + 1], &qs[r..r + 1]);
        for &tile in tiles {
            tile_update_pairs(features, st, acc, q, &[TILE], tile, scale);
        }
    }
}

impl<'a> From<&'a PairTile> for PairTileRef<'a> {
    fn from(tile: &'a PairTile) -> PairTileRef<'a> {
        tile.view()
    }
}

/// How far above a row's running maximum `m` a tile's largest score may lie before `m` is
/// raised (module doc, step 2): weights up to `e^8` before rounding, far inside bf16's and
/// f32's range, and most tiles past a row's first few skip the rescaling.
pub const RAISE_MARGIN: f32 = 8.0;
/// Below this argument [`exp_weight`] is taken here (its result is then below f32's normal
/// range and rounds to a bf16 zero).
const EXP_WEIGHT_FLOOR: f32 = -100.0;
/// Taylor coefficients of `e^r` on `|r| ≤ ln 2 / 2` (relative error ≤ 4.3e-5, under a fortieth
/// of a bf16 rounding step).
const W_C1: f32 = 1.0;
const W_C2: f32 = 0.5;
const W_C3: f32 = 1.0 / 6.0;
const W_C4: f32 = 1.0 / 24.0;
/// The pair word of two bf16 ones (the weights' sum is a pair step against it).
pub(crate) const ONE_PAIR: u32 = 0x3F80_3F80;

/// The weight exponential of step 3 (module doc): `n = round_even(x · log2 e)` (after
/// `x = max(x, -100)`), `r = fma(n, -ln 2, x)`, `y` Horner's degree-4 polynomial in `r` in
/// fused multiply-adds, `y · 2^n` (zero where that is below f32's normal range: the rounding
/// to bf16 flushes it there anyway). Only ever rounded to bf16 afterwards.
#[inline]
pub fn exp_weight(x: f32) -> f32 {
    let x = x.max(EXP_WEIGHT_FLOOR);
    let n = (x * std::f32::consts::LOG2_E).round_ties_even();
    let r = n.mul_add(-std::f32::consts::LN_2, x);
    let mut y = W_C4.mul_add(r, W_C3);
    y = y.mul_add(r, W_C2);
    y = y.mul_add(r, W_C1);
    y = y.mul_add(r, 1.0);
    if n <= -127.0 {
        0.0
    } else {
        y * f32::from_bits(((n as i32 + 127) << 23) as u32)
    }
}

/// `((x[j] + x[j+8]) …)`: halves, then quarters, then pairs, then the last two lanes —
/// `d = c0 + c1` with `c_j = b_j + b_{j+2}`, `b_j = a_j + a_{j+4}`, `a_j = x_j + x_{j+8}`.
#[inline]
fn hsum16(x: &[f32; PAIRS]) -> f32 {
    let a: [f32; 8] = std::array::from_fn(|j| x[j] + x[j + 8]);
    let b: [f32; 4] = std::array::from_fn(|j| a[j] + a[j + 4]);
    let c: [f32; 2] = std::array::from_fn(|j| b[j] + b[j + 2]);
    c[0] + c[1]
}

/// The definition (module doc) for one row, in scalar operations.
fn row_portable(
    st: &mut TileSoftmax,
    acc: &mut [f32],
    q: &[u32],
    valid: usize,
    tile: &PairTileRef<'_>,
    scale: f32,
) {
    let hd = tile.head_dim;
    let h = PAIR_HALF_POSITIONS;
    let mut s = [f32::NEG_INFINITY; TILE];
    for (t, st_t) in s.iter_mut().enumerate().take(valid) {
        let mut c = [0f32; 2];
        let keys = tile.halves[t / h].keys;
        for (i, &qp) in q.iter().enumerate() {
            c[i % 2] = pair_step(c[i % 2], keys[i * h + t % h], qp);
        }
        *st_t = (c[0] + c[1]) * scale;
    }
    let p = softmax_portable(st, acc, &s, valid);
    values_portable(acc, &p, valid, tile.halves.map(|h| h.values), hd);
}

/// Step 4 of the definition in scalar operations: the weights `p` (bf16 bits, 0 at and past
/// `valid`) against V words `values` (each half's `8 · hd` words of the pair layout).
pub(crate) fn values_portable(
    acc: &mut [f32],
    p: &[u16; TILE],
    valid: usize,
    values: [&[u32]; 2],
    hd: usize,
) {
    for j in 0..valid.div_ceil(2) {
        let last_odd = 2 * j + 1 == valid;
        let pw = p[2 * j] as u32 | (p[2 * j + 1] as u32) << 16;
        let jj = j % (PAIRS / 2);
        let row = &values[j / (PAIRS / 2)][jj * hd..(jj + 1) * hd];
        for (a, &v) in acc.iter_mut().zip(row) {
            let v = if last_odd { v & 0xFFFF } else { v };
            *a = pair_step(*a, v, pw);
        }
    }
}

/// Steps 2–3 of the definition in scalar operations for a row whose scaled scores are
/// `s[..valid]`: raises the maximum (rescaling `acc` and the sum), adds the rounded weights'
/// sum and returns those weights' bf16 bits (0 at and past `valid`).
pub(crate) fn softmax_portable(
    st: &mut TileSoftmax,
    acc: &mut [f32],
    s: &[f32; TILE],
    valid: usize,
) -> [u16; TILE] {
    let tile_max = s[..valid].iter().copied().fold(f32::NEG_INFINITY, f32::max);
    if tile_max > st.max + RAISE_MARGIN {
        let f = exp_poly_portable(st.max - tile_max);
        acc.iter_mut().for_each(|a| *a *= f);
        st.sum *= f;
        st.max = tile_max;
    }
    let mut p = [0u16; TILE];
    for t in 0..valid {
        p[t] = round_bf16(exp_weight(s[t] - st.max));
    }
    let lanes: [f32; PAIRS] = std::array::from_fn(|j| {
        pair_step(0.0, p[2 * j] as u32 | (p[2 * j + 1] as u32) << 16, ONE_PAIR)
    });
    st.sum += hsum16(&lanes);
    p
}

/// The definition in 256-bit FMA lanes for CPUs without AVX-512 BF16: each pair step is two
/// fused multiply-adds, every input and result flushed as the instruction flushes them (four
/// operations a flush), so the bits are the definition's; several times the f32 tile step's
/// cost, where bf16 K/V are not worth choosing (the server says so at start).
#[cfg(target_arch = "x86_64")]
mod avx2 {
    use std::arch::x86_64::*;

    use super::{
        flush as flush1, softmax_portable, widen, PairTileRef, TileSoftmax, PAIRS,
        PAIR_HALF_POSITIONS, TILE,
    };

    /// The largest head size this path takes (its widened tile lives on the stack).
    pub(super) const MAX_HEAD_DIM: usize = 256;

    /// A denormal lane as a zero of its sign; the others (NaN included) as they are.
    #[target_feature(enable = "avx2,fma")]
    #[inline]
    fn flush(x: __m256) -> __m256 {
        let bits = _mm256_castps_si256(x);
        let exp = _mm256_and_si256(bits, _mm256_set1_epi32(0x7f80_0000));
        // Sign bit set exactly where the exponent field is zero.
        let zero_exp = _mm256_castsi256_ps(_mm256_sub_epi32(exp, _mm256_set1_epi32(1)));
        let signed_zero = _mm256_and_ps(x, _mm256_set1_ps(-0.0));
        _mm256_blendv_ps(x, signed_zero, zero_exp)
    }

    /// Eight words' odd (high) and even (low) bf16 halves as f32 lanes, flushed.
    #[target_feature(enable = "avx2,fma")]
    #[inline]
    fn halves(w: __m256i) -> (__m256, __m256) {
        let odd = _mm256_castsi256_ps(_mm256_and_si256(w, _mm256_set1_epi32(-65536)));
        let even = _mm256_castsi256_ps(_mm256_slli_epi32::<16>(w));
        (flush(odd), flush(even))
    }

    /// One pair step on eight lanes (module doc): `acc` already flushed.
    #[target_feature(enable = "avx2,fma")]
    #[inline]
    fn step(acc: __m256, a: (__m256, __m256), b: (__m256, __m256)) -> __m256 {
        let odd = flush(_mm256_fmadd_ps(a.0, b.0, acc));
        flush(_mm256_fmadd_ps(a.1, b.1, odd))
    }

    /// Every row through the definition; the tile's K and V halves widened and flushed once
    /// per call for all rows.
    ///
    /// # Safety
    /// AVX2 and FMA present; shapes as `tile_update_pairs` asserts, `hd <= MAX_HEAD_DIM`.
    #[allow(clippy::needless_range_loop)]
    #[target_feature(enable = "avx2,fma")]
    pub(super) unsafe fn rows(
        sts: &mut [TileSoftmax],
        accs: &mut [&mut [f32]],
        qs: &[&[u32]],
        valids: &[usize],
        tile: PairTileRef<'_>,
        scale: f32,
    ) {
        WIDENED.with(|w| {
            let (kh, vh) = &mut *w.borrow_mut();
            // SAFETY: forwarded caller's contract.
            unsafe { rows_with(kh, vh, sts, accs, qs, valids, tile, scale) }
        })
    }

    type Halves = (__m256, __m256);
    /// Quarters of 8 positions in a tile.
    const QUARTERS: usize = TILE / 8;

    thread_local! {
        /// The tile's K and V halves, widened and flushed once per call (grown once per
        /// thread, never zeroed per call).
        static WIDENED: std::cell::RefCell<(Vec<Halves>, Vec<Halves>)> =
            const { std::cell::RefCell::new((Vec::new(), Vec::new())) };
    }

    /// [`rows`] with the widened tile's buffers.
    ///
    /// # Safety
    /// As [`rows`].
    #[allow(clippy::needless_range_loop, clippy::too_many_arguments)]
    #[target_feature(enable = "avx2,fma")]
    unsafe fn rows_with(
        kh: &mut Vec<Halves>,
        vh: &mut Vec<Halves>,
        sts: &mut [TileSoftmax],
        accs: &mut [&mut [f32]],
        qs: &[&[u32]],
        valids: &[usize],
        tile: PairTileRef<'_>,
        scale: f32,
    ) {
        let hd = tile.head_dim;
        let chunks = hd / 8;
        let h16 = PAIR_HALF_POSITIONS;
        // K: `[hd / 2][4 quarters of 8 positions]` (odd, even); V: `[16 pairs][hd / 8]`.
        let zero = (_mm256_setzero_ps(), _mm256_setzero_ps());
        kh.resize(hd / 2 * QUARTERS, zero);
        vh.resize(PAIRS * chunks, zero);
        let kp = tile.halves.map(|h| h.keys.as_ptr());
        for i in 0..hd / 2 {
            for h in 0..QUARTERS {
                // SAFETY: row `i < hd / 2` of each half's transposed K holds 16 words; quarter
                // `h` is words `8 (h % 2)..` of half `h / 2`.
                let w = unsafe { _mm256_loadu_si256(kp[h / 2].add(i * h16 + 8 * (h % 2)).cast()) };
                kh[QUARTERS * i + h] = halves(w);
            }
        }
        let vp = tile.halves.map(|h| h.values.as_ptr());
        for j in 0..PAIRS {
            let jj = j % (PAIRS / 2);
            for c in 0..chunks {
                // SAFETY: pair row `jj < 8` of half `j / 8` holds `hd` words; `8c + 8 <= hd`.
                let w =
                    unsafe { _mm256_loadu_si256(vp[j / (PAIRS / 2)].add(jj * hd + 8 * c).cast()) };
                vh[j * chunks + c] = halves(w);
            }
        }
        for r in 0..sts.len() {
            let (st, acc, q, valid) = (&mut sts[r], &mut *accs[r], qs[r], valids[r]);
            // Step 1: two chains per position, eight positions a vector; the four quarters'
            // chains interleaved (eight in flight).
            let mut c = [[_mm256_setzero_ps(); 2]; QUARTERS];
            for (i, &qw) in q.iter().enumerate() {
                let qv = (
                    _mm256_set1_ps(flush1(widen((qw >> 16) as u16))),
                    _mm256_set1_ps(flush1(widen(qw as u16))),
                );
                for (h, ch) in c.iter_mut().enumerate() {
                    ch[i % 2] = step(ch[i % 2], kh[QUARTERS * i + h], qv);
                }
            }
            let mut s = [f32::NEG_INFINITY; TILE];
            for (h, ch) in c.iter().enumerate() {
                let sum = _mm256_mul_ps(_mm256_add_ps(ch[0], ch[1]), _mm256_set1_ps(scale));
                let mut lanes = [0f32; 8];
                // SAFETY: `lanes` holds 8 floats.
                unsafe { _mm256_storeu_ps(lanes.as_mut_ptr(), sum) };
                for (l, &x) in lanes.iter().enumerate() {
                    if 8 * h + l < valid {
                        s[8 * h + l] = x;
                    }
                }
            }
            // Steps 2–3: the definition's own scalar operations.
            let pf = softmax_portable(st, acc, &s, valid).map(widen);
            // Step 4: every 8-dimension chunk's chain interleaved.
            let ap = acc.as_mut_ptr();
            let mut a = [_mm256_setzero_ps(); MAX_HEAD_DIM / 8];
            for (cc, x) in a.iter_mut().enumerate().take(chunks) {
                // SAFETY: `8cc + 8 <= hd = acc.len()`.
                *x = flush(unsafe { _mm256_loadu_ps(ap.add(8 * cc)) });
            }
            for j in 0..valid.div_ceil(2) {
                let pv = (_mm256_set1_ps(pf[2 * j + 1]), _mm256_set1_ps(pf[2 * j]));
                let last_odd = 2 * j + 1 == valid;
                for (cc, x) in a.iter_mut().enumerate().take(chunks) {
                    let v = vh[j * chunks + cc];
                    let v = if last_odd {
                        (_mm256_setzero_ps(), v.1)
                    } else {
                        v
                    };
                    *x = step(*x, v, pv);
                }
            }
            for (cc, x) in a.iter().enumerate().take(chunks) {
                // SAFETY: as the load above.
                unsafe { _mm256_storeu_ps(ap.add(8 * cc), *x) };
            }
        }
    }
}

#[cfg(target_arch = "x86_64")]
pub(crate) mod x86 {
    use std::arch::x86_64::*;

    use super::{
        PairTileRef, TileSoftmax, EXP_WEIGHT_FLOOR, PAIRS, PAIR_HALF_POSITIONS as H, W_C1, W_C2,
        W_C3, W_C4,
    };

    /// Rows per block: two chains per position and row, so 12 independent `vdpbf16ps` chains
    /// in flight for the scores of a tile's half (a decode's three rows: 6), and `6 · 4`
    /// accumulators for `p·V`.
    pub(crate) const BLOCK: usize = 6;
    /// 16-dimension chunks of `p·V` accumulated in registers at once.
    pub(crate) const CHUNKS: usize = 4;

    /// [`super::exp_weight`] of 16 lanes (the same operations; `vscalefps` multiplies by
    /// `2^n` exactly, giving a denormal where the scalar path gives a zero or a denormal: the
    /// rounding to bf16 flushes both to zero).
    #[target_feature(enable = "avx512f")]
    #[inline]
    pub(crate) fn exp_weight16(x: __m512) -> __m512 {
        let x = _mm512_max_ps(x, _mm512_set1_ps(EXP_WEIGHT_FLOOR));
        let n = _mm512_roundscale_ps::<{ _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC }>(
            _mm512_mul_ps(x, _mm512_set1_ps(std::f32::consts::LOG2_E)),
        );
        let r = _mm512_fmadd_ps(n, _mm512_set1_ps(-std::f32::consts::LN_2), x);
        let mut y = _mm512_fmadd_ps(_mm512_set1_ps(W_C4), r, _mm512_set1_ps(W_C3));
        y = _mm512_fmadd_ps(y, r, _mm512_set1_ps(W_C2));
        y = _mm512_fmadd_ps(y, r, _mm512_set1_ps(W_C1));
        y = _mm512_fmadd_ps(y, r, _mm512_set1_ps(1.0));
        _mm512_scalef_ps(y, n)
    }

    /// [`super::hsum16`] in registers: halves, quarters, pairs, then the last two lanes.
    #[target_feature(enable = "avx512f")]
    #[inline]
    pub(crate) fn hsum16(v: __m512) -> f32 {
        let a = _mm256_add_ps(
            _mm512_castps512_ps256(v),
            _mm256_castpd_ps(_mm512_extractf64x4_pd::<1>(_mm512_castps_pd(v))),
        );
        let b = _mm_add_ps(_mm256_castps256_ps128(a), _mm256_extractf128_ps::<1>(a));
        let c = _mm_add_ps(b, _mm_movehl_ps(b, b));
        _mm_cvtss_f32(_mm_add_ss(c, _mm_movehdup_ps(c)))
    }

    /// Bits as the instruction's bf16 operand type.
    #[inline(always)]
    pub(crate) fn bh(x: __m512i) -> __m512bh {
        // SAFETY: both are 64-byte plain vector types; every bit pattern is a valid value.
        unsafe { std::mem::transmute::<__m512i, __m512bh>(x) }
    }

    /// The pair steps of every row (module doc), `BLOCK` rows at a time.
    ///
    /// # Safety
    /// AVX-512 F/BW/VL/BF16, AVX2 and FMA present; shapes as `tile_update_pairs` asserts
    /// (`hd` a multiple of 16).
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512bf16,avx2,fma,f16c")]
    pub(super) unsafe fn rows(
        sts: &mut [TileSoftmax],
        accs: &mut [&mut [f32]],
        qs: &[&[u32]],
        valids: &[usize],
        tile: PairTileRef<'_>,
        scale: f32,
    ) {
        in_blocks!(sts, accs, qs, valids => block(&tile, scale));
    }

    /// `R` rows (`sts.len() == R`) through steps 1–4.
    ///
    /// # Safety
    /// As [`rows`].
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512bf16,avx2,fma,f16c")]
    unsafe fn block<const R: usize>(
        sts: &mut [TileSoftmax],
        accs: &mut [&mut [f32]],
        qs: &[&[u32]],
        valids: &[usize],
        tile: &PairTileRef<'_>,
        scale: f32,
    ) {
        let hd = tile.head_dim;
        // SAFETY: forwarded caller's contract.
        let scores = unsafe { scores::<R>(qs, tile, scale) };
        // Each half's V holds `8 · hd` words (`PairHalf::new`).
        let values = tile.halves.map(|h| h.values);
        softmax_values!(R, sts, accs, scores, valids, values, hd);
    }

    /// [`rows`] over `tiles` in order for rows that see all 32 positions of each, `BLOCK` rows
    /// at a time: per block, each tile's scores are taken before the previous tile's softmax
    /// and `p·V` run (the same operations per row, in the same order, as one call per tile).
    ///
    /// # Safety
    /// As [`rows`], for every tile; every row's `valid` is 32.
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512bf16,avx2,fma,f16c")]
    pub(super) unsafe fn rows_tiles(
        sts: &mut [TileSoftmax],
        accs: &mut [&mut [f32]],
        qs: &[&[u32]],
        tiles: &[PairTileRef<'_>],
        scale: f32,
    ) {
        in_blocks!(sts, accs, qs => block_tiles(tiles, scale));
    }

    /// `R` rows over `tiles` (all positions valid), pipelined as [`rows_tiles`] says.
    ///
    /// # Safety
    /// As [`rows_tiles`]; `tiles` is not empty.
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512bf16,avx2,fma,f16c")]
    unsafe fn block_tiles<const R: usize>(
        sts: &mut [TileSoftmax],
        accs: &mut [&mut [f32]],
        qs: &[&[u32]],
        tiles: &[PairTileRef<'_>],
        scale: f32,
    ) {
        let full = [super::TILE; R];
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
            let hd = tile.head_dim;
            let values = tile.halves.map(|h| h.values);
            softmax_values!(R, sts, accs, these, valids, values, hd);
        }
    }

    /// Step 1 for `R` rows: the scaled scores `[row][half]`, 16 positions each.
    ///
    /// # Safety
    /// As [`rows`].
    #[allow(clippy::needless_range_loop)]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512bf16,avx2,fma,f16c")]
    #[inline]
    unsafe fn scores<const R: usize>(
        qs: &[&[u32]],
        tile: &PairTileRef<'_>,
        scale: f32,
    ) -> [[__m512; 2]; R] {
        let hd = tile.head_dim;
        let kp = tile.halves.map(|h| h.keys.as_ptr());
        let qp: [*const u32; R] = std::array::from_fn(|r| qs[r].as_ptr());
        // Step 1: two chains per position and row, dimension pairs in order; each chain a
        // vector per 16-position half of the tile.
        let mut c = [[[_mm512_setzero_ps(); 2]; 2]; R];
        // A loop that runs at least once (`hd >= 16`, asserted by the caller): with no path
        // around it, the accumulators live in registers only (a loop that might not run had
        // the compiler zero a stack copy of all `4R` of them first, every call).
        // One half after the other, each read front to back: K of a tile is then one run of
        // consecutive lines (a group's 2 KiB, then the next group's), which the hardware
        // prefetcher follows; alternating between the halves line by line, it did not — a
        // decode's few rows read K/V from memory at a third of the rate (`pair_tile_rate`'s
        // `STREAM_TILES`). Each chain's operations keep their order, so no bit changes.
        for (h, &k) in kp.iter().enumerate() {
            // A loop that runs at least once (`hd >= 16`, asserted by the caller): with no
            // path around it, the accumulators live in registers only (a loop that might not
            // run had the compiler zero a stack copy of all `4R` of them first, every call).
            let mut i2 = 0;
            loop {
                for l in 0..2 {
                    let i = i2 + l;
                    // SAFETY: `i < hd / 2`: row `i` of each half's transposed K holds 16 words.
                    let kv = bh(unsafe { _mm512_loadu_si512(k.add(i * H).cast()) });
                    for r in 0..R {
                        // SAFETY: `i < hd / 2 = qs[r].len()`.
                        let q = bh(_mm512_set1_epi32(unsafe { *qp[r].add(i) } as i32));
                        c[r][l][h] = _mm512_dpbf16_ps(c[r][l][h], kv, q);
                    }
                }
                i2 += 2;
                if i2 >= hd / 2 {
                    break;
                }
            }
        }
        let vscale = _mm512_set1_ps(scale);
        std::array::from_fn(|r| {
            [0, 1].map(|h| _mm512_mul_ps(_mm512_add_ps(c[r][0][h], c[r][1][h]), vscale))
        })
    }

    /// Runs `$f::<R>` over the rows `$sts`, `$accs`, `$qs` (and `$valids`, where given) in
    /// blocks of [`BLOCK`] rows, `R` each block's size, followed by `$args`: the block
    /// dispatch of both pair steps' `rows` and `rows_tiles`. Expanded only in their `unsafe`
    /// functions, whose contract the block functions share.
    macro_rules! in_blocks {
        ($sts:ident, $accs:ident, $qs:ident $(, $valids:ident)? => $f:ident($($args:expr),*)) => {{
            let mut at = 0;
            while at < $sts.len() {
                let n = ($sts.len() - at).min($crate::flash_tile_pairs::x86::BLOCK);
                let r = at..at + n;
                let (s, a, q) = (&mut $sts[r.clone()], &mut $accs[r.clone()], &$qs[r.clone()]);
                $(let $valids = &$valids[r.clone()];)?
                // SAFETY: forwarded caller's contract.
                unsafe {
                    match n {
                        6 => $f::<6>(s, a, q, $($valids,)? $($args),*),
                        5 => $f::<5>(s, a, q, $($valids,)? $($args),*),
                        4 => $f::<4>(s, a, q, $($valids,)? $($args),*),
                        3 => $f::<3>(s, a, q, $($valids,)? $($args),*),
                        2 => $f::<2>(s, a, q, $($valids,)? $($args),*),
                        _ => $f::<1>(s, a, q, $($valids,)? $($args),*),
                    }
                }
                at += n;
            }
        }};
    }
    pub(crate) use in_blocks;

    /// Steps 2–4 (module doc) for `$R` rows (`$sts.len() == $R`) whose scaled scores of the
    /// tile's two halves are `$scores[r]` (lanes at and past a row's valid count are masked
    /// here), over V words `$values` (each half's `8 · hd` words of the pair layout): the pair
    /// step's own, and the int8-scored step's (`flash_tile_pairs_coded`). A macro, expanded in
    /// each step's block, because as a shared function the compiler kept it out of line and
    /// the pair step paid for the call. Expanded only in functions that enable AVX-512
    /// F/BW/VL/BF16, with the shapes `tile_update_pairs` asserts (its `unsafe` blocks rely on
    /// both).
    macro_rules! softmax_values {
        ($R:ident, $sts:ident, $accs:ident, $scores:ident, $valids:ident, $values:ident, $hd:ident) => {{
            // Steps 2–3 per row; the weight pairs of step 4 kept as words.
            let ninf = _mm512_set1_ps(f32::NEG_INFINITY);
            let ones = $crate::flash_tile_pairs::x86::bh(_mm512_set1_epi32(
                $crate::flash_tile_pairs::ONE_PAIR as i32,
            ));
            let mut pwv = [_mm512_setzero_si512(); $R];
            let mut full = true;
            for r in 0..$R {
                let valid = $valids[r];
                full &= valid == $crate::flash_tile_pairs::PAIR_TILE_POSITIONS;
                let live: u32 = if valid >= $crate::flash_tile_pairs::PAIR_TILE_POSITIONS {
                    u32::MAX
                } else {
                    (1u32 << valid) - 1
                };
                let [s0, s1] = $scores[r];
                let x0 = _mm512_mask_blend_ps(live as __mmask16, ninf, s0);
                let x1 = _mm512_mask_blend_ps((live >> 16) as __mmask16, ninf, s1);
                let st = &mut $sts[r];
                let mx = _mm512_max_ps(x0, x1);
                let bar = _mm512_set1_ps(st.max + $crate::flash_tile_pairs::RAISE_MARGIN);
                if _mm512_cmp_ps_mask::<_CMP_GT_OQ>(mx, bar) != 0 {
                    $crate::flash_tile_wide::x86::raise_max16(
                        st,
                        $accs[r],
                        _mm512_reduce_max_ps(mx),
                    );
                }
                let m = _mm512_set1_ps(st.max);
                let e0 = $crate::flash_tile_pairs::x86::exp_weight16(_mm512_sub_ps(x0, m));
                let e1 = $crate::flash_tile_pairs::x86::exp_weight16(_mm512_sub_ps(x1, m));
                // SAFETY: both are 64-byte plain vector types; every bit pattern is a valid value.
                let rounded = unsafe {
                    std::mem::transmute::<__m512bh, __m512i>(_mm512_cvtne2ps_pbh(e1, e0))
                };
                st.sum += $crate::flash_tile_pairs::x86::hsum16(_mm512_dpbf16_ps(
                    _mm512_setzero_ps(),
                    $crate::flash_tile_pairs::x86::bh(rounded),
                    ones,
                ));
                pwv[r] = rounded;
            }
            // SAFETY: `[__m512i; R]` and `[[u32; 16]; R]` have the same size and the first's
            // alignment is a multiple of the second's; every bit pattern is a valid `u32`.
            let pw = unsafe {
                &*pwv
                    .as_ptr()
                    .cast::<[[u32; $crate::flash_tile_pairs::PAIRS]; $R]>()
            };
            // Step 4.
            let vp = $values.map(|v| v.as_ptr());
            let chunks = $hd / 16;
            let mut c0 = 0;
            while c0 < chunks {
                let m = (chunks - c0).min($crate::flash_tile_pairs::x86::CHUNKS);
                // SAFETY: forwarded caller's contract; `c0 + m <= hd / 16`.
                unsafe {
                    match (full, m) {
                        (true, 4) => $crate::flash_tile_pairs::x86::values_full::<$R, 4>(
                            $accs, pw, vp, $hd, c0,
                        ),
                        (true, 3) => $crate::flash_tile_pairs::x86::values_full::<$R, 3>(
                            $accs, pw, vp, $hd, c0,
                        ),
                        (true, 2) => $crate::flash_tile_pairs::x86::values_full::<$R, 2>(
                            $accs, pw, vp, $hd, c0,
                        ),
                        (true, _) => $crate::flash_tile_pairs::x86::values_full::<$R, 1>(
                            $accs, pw, vp, $hd, c0,
                        ),
                        (false, 4) => $crate::flash_tile_pairs::x86::values_rows::<$R, 4>(
                            $accs, pw, $valids, vp, $hd, c0,
                        ),
                        (false, 3) => $crate::flash_tile_pairs::x86::values_rows::<$R, 3>(
                            $accs, pw, $valids, vp, $hd, c0,
                        ),
                        (false, 2) => $crate::flash_tile_pairs::x86::values_rows::<$R, 2>(
                            $accs, pw, $valids, vp, $hd, c0,
                        ),
                        (false, _) => $crate::flash_tile_pairs::x86::values_rows::<$R, 1>(
                            $accs, pw, $valids, vp, $hd, c0,
                        ),
                    }
                }
                c0 += m;
            }
        }};
    }
    pub(crate) use softmax_values;

    /// Step 4 for `R` rows that all see the whole tile, 16-dimension chunks `c0..c0 + C`:
    /// `R · C` accumulators in registers, V loaded once per pair and chunk for every row.
    ///
    /// # Safety
    /// As [`rows`]; `16 (c0 + C) <= hd`, `vp` the tile's halves' `8 · hd` value words each.
    #[allow(clippy::needless_range_loop)]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512bf16,avx2,fma,f16c")]
    #[inline]
    pub(crate) unsafe fn values_full<const R: usize, const C: usize>(
        accs: &mut [&mut [f32]],
        pw: &[[u32; PAIRS]; R],
        vp: [*const u32; 2],
        hd: usize,
        c0: usize,
    ) {
        let mut a: [[__m512; C]; R] = std::array::from_fn(|r| {
            std::array::from_fn(|c| {
                // SAFETY: `16 (c0 + c) + 16 <= hd = accs[r].len()`.
                unsafe { _mm512_loadu_ps(accs[r].as_ptr().add(16 * (c0 + c))) }
            })
        });
        for j in 0..PAIRS {
            let p: [__m512bh; R] = std::array::from_fn(|r| bh(_mm512_set1_epi32(pw[r][j] as i32)));
            let row = vp[j / (PAIRS / 2)].wrapping_add(j % (PAIRS / 2) * hd);
            for c in 0..C {
                // SAFETY: pair row `j % 8` of half `j / 8` holds `hd` words;
                // `16 (c0 + c) + 16 <= hd`.
                let v = bh(unsafe { _mm512_loadu_si512(row.add(16 * (c0 + c)).cast()) });
                for r in 0..R {
                    a[r][c] = _mm512_dpbf16_ps(a[r][c], v, p[r]);
                }
            }
        }
        for r in 0..R {
            for c in 0..C {
                // SAFETY: as the load above.
                unsafe { _mm512_storeu_ps(accs[r].as_mut_ptr().add(16 * (c0 + c)), a[r][c]) };
            }
        }
    }

    /// Step 4 for `R` rows with their own `valids` (a causal diagonal, a decode's last tile),
    /// one row at a time: its pairs only, the odd position of an odd `valid`'s last pair
    /// counted as zero (module doc).
    ///
    /// # Safety
    /// As [`values_full`].
    #[allow(clippy::needless_range_loop)]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512bf16,avx2,fma,f16c")]
    #[inline]
    pub(crate) unsafe fn values_rows<const R: usize, const C: usize>(
        accs: &mut [&mut [f32]],
        pw: &[[u32; PAIRS]; R],
        valids: &[usize],
        vp: [*const u32; 2],
        hd: usize,
        c0: usize,
    ) {
        let even_only = _mm512_set1_epi32(0xFFFF);
        for r in 0..R {
            let valid = valids[r];
            let ap = accs[r].as_mut_ptr();
            let mut a: [__m512; C] = std::array::from_fn(|c| {
                // SAFETY: `16 (c0 + c) + 16 <= hd = accs[r].len()`.
                unsafe { _mm512_loadu_ps(ap.add(16 * (c0 + c))) }
            });
            for j in 0..valid.div_ceil(2) {
                let p = bh(_mm512_set1_epi32(pw[r][j] as i32));
                let row = vp[j / (PAIRS / 2)].wrapping_add(j % (PAIRS / 2) * hd);
                for (c, acc) in a.iter_mut().enumerate() {
                    // SAFETY: pair row `j % 8` of half `j / 8` holds `hd` words;
                    // `16 (c0 + c) + 16 <= hd`.
                    let mut v = unsafe { _mm512_loadu_si512(row.add(16 * (c0 + c)).cast()) };
                    if 2 * j + 1 == valid {
                        v = _mm512_and_si512(v, even_only);
                    }
                    *acc = _mm512_dpbf16_ps(*acc, bh(v), p);
                }
            }
            for (c, acc) in a.iter().enumerate() {
                // SAFETY: as the load above.
                unsafe { _mm512_storeu_ps(ap.add(16 * (c0 + c)), *acc) };
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::{Rng, SeedableRng};

    fn features() -> Vec<CpuFeatures> {
        let mut v = vec![CpuFeatures::PORTABLE];
        let d = CpuFeatures::detect();
        if d.avx2 {
            v.push(CpuFeatures::AVX2);
        }
        if d.bf16 {
            v.push(d);
        }
        v
    }

    #[test]
    fn rounding_is_the_instructions() {
        for (x, want) in [
            (1.0f32, 0x3f80u16),
            (f32::from_bits(0x0000_0100), 0x0000),
            (f32::from_bits(0x8000_0100), 0x8000),
            (f32::from_bits(0x3f80_8000), 0x3f80),
            (f32::from_bits(0x3f81_8000), 0x3f82),
            (f32::from_bits(0x3f80_c000), 0x3f81),
            (f32::from_bits(0x7fc0_0001), 0x7fc0),
            (f32::from_bits(0x0080_0000), 0x0080),
            (f32::from_bits(0x007f_ffff), 0x0000),
            (-3.0, 0xc040),
            (f32::MAX, 0x7f80),
        ] {
            assert_eq!(round_bf16(x), want, "{x:e}");
        }
    }

    /// The portable pair step against the CPU's `vdpbf16ps`, on random bits over the whole
    /// exponent range (denormals, cancellations, overflow) — where the CPU has one.
    #[test]
    fn pair_step_is_the_instruction() {
        #[cfg(target_arch = "x86_64")]
        if CpuFeatures::detect().bf16 {
            let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(11);
            for round in 0..20_000 {
                let mut acc = [0f32; 16];
                let mut a = [0u32; 16];
                let mut b = [0u32; 16];
                for l in 0..16 {
                    // Mostly nearby exponents (cancellation), some anywhere.
                    let e = if round % 4 == 0 {
                        rng.gen_range(0..256u32)
                    } else {
                        rng.gen_range(0..6u32) + if round % 8 == 1 { 0 } else { 120 }
                    };
                    let w = |rng: &mut rand_chacha::ChaCha8Rng| {
                        let m: u32 = rng.gen_range(0..128);
                        let sgn: u32 = rng.gen_range(0..2);
                        let de: u32 = rng.gen_range(0..3);
                        sgn << 15 | (e.saturating_sub(de) & 0xff) << 7 | m
                    };
                    a[l] = w(&mut rng) | w(&mut rng) << 16;
                    b[l] = w(&mut rng) | w(&mut rng) << 16;
                    let ea = (2 * e).saturating_sub(127).min(255);
                    acc[l] = f32::from_bits(
                        rng.gen_range(0..2u32) << 31
                            | ea.saturating_sub(rng.gen_range(0..2)) << 23
                            | rng.gen_range(0..1u32 << 23),
                    );
                }
                // SAFETY: AVX-512 BF16 was detected just above; the arrays hold 16 lanes.
                let got: [f32; 16] = unsafe { hw_dp(acc, a, b) };
                for l in 0..16 {
                    let want = pair_step(acc[l], a[l], b[l]);
                    assert!(
                        got[l].to_bits() == want.to_bits() || (got[l].is_nan() && want.is_nan()),
                        "acc={:08x} a={:08x} b={:08x}: cpu {:08x}, definition {:08x}",
                        acc[l].to_bits(),
                        a[l],
                        b[l],
                        got[l].to_bits(),
                        want.to_bits()
                    );
                }
            }
        }
    }

    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx512f,avx512bf16")]
    unsafe fn hw_dp(acc: [f32; 16], a: [u32; 16], b: [u32; 16]) -> [f32; 16] {
        use std::arch::x86_64::*;
        // SAFETY: 64-byte arrays and vectors; every bit pattern is valid for both.
        unsafe {
            let r = _mm512_dpbf16_ps(
                std::mem::transmute::<[f32; 16], __m512>(acc),
                std::mem::transmute::<[u32; 16], __m512bh>(a),
                std::mem::transmute::<[u32; 16], __m512bh>(b),
            );
            std::mem::transmute::<__m512, [f32; 16]>(r)
        }
    }

    fn random_bf16(rng: &mut impl Rng, n: usize, spread: f32) -> Vec<bf16> {
        (0..n)
            .map(|_| bf16::from_f32(rng.gen_range(-spread..spread)))
            .collect()
    }

    /// Every path gives every row the bits of that row computed alone by the portable
    /// definition, whatever rows share the tile (decode vs prefill) and their `valid`s.
    #[allow(clippy::needless_range_loop)]
    #[test]
    fn paths_and_groupings_agree_bit_for_bit() {
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(5);
        for hd in [64usize, 32, 128, 16] {
            let rows = 11;
            let q: Vec<Vec<u32>> = (0..rows)
                .map(|_| {
                    let f: Vec<f32> = (0..hd).map(|_| rng.gen_range(-2.0f32..2.0)).collect();
                    let mut p = vec![0u32; hd / 2];
                    query_pairs(&f, &mut p);
                    p
                })
                .collect();
            let tiles = 5;
            let staged: Vec<PairTile> = (0..tiles)
                .map(|k| {
                    let spread = 1.0 + k as f32;
                    let keys = random_bf16(&mut rng, TILE * hd, spread);
                    let vals = random_bf16(&mut rng, TILE * hd, 1.0);
                    let mut t = PairTile::new(hd);
                    t.stage(&keys, &vals, TILE);
                    t
                })
                .collect();
            // Per tile, each row's valid: full, except the last tile (a causal diagonal).
            let valid = |k: usize, r: usize| {
                if k + 1 < tiles {
                    TILE
                } else {
                    1 + (r * 7) % TILE
                }
            };
            // Reference: each row alone, portable.
            let mut want: Vec<(TileSoftmax, Vec<f32>)> = (0..rows)
                .map(|_| (TileSoftmax::default(), vec![0f32; hd]))
                .collect();
            for (k, tile) in staged.iter().enumerate() {
                for (r, (st, acc)) in want.iter_mut().enumerate() {
                    tile_update_pairs(
                        CpuFeatures::PORTABLE,
                        std::slice::from_mut(st),
                        &mut [&mut acc[..]],
                        &[&q[r]],
                        &[valid(k, r)],
                        tile,
                        0.125,
                    );
                }
            }
            for f in features() {
                for group in [1usize, 3, 8, rows] {
                    let mut sts = vec![TileSoftmax::default(); rows];
                    let mut accs = vec![vec![0f32; hd]; rows];
                    for (k, tile) in staged.iter().enumerate() {
                        for at in (0..rows).step_by(group) {
                            let end = (at + group).min(rows);
                            let mut a: Vec<&mut [f32]> =
                                accs[at..end].iter_mut().map(|x| &mut x[..]).collect();
                            let qs: Vec<&[u32]> = q[at..end].iter().map(|x| &x[..]).collect();
                            let vs: Vec<usize> = (at..end).map(|r| valid(k, r)).collect();
                            tile_update_pairs(f, &mut sts[at..end], &mut a, &qs, &vs, tile, 0.125);
                        }
                    }
                    for r in 0..rows {
                        assert_eq!(
                            sts[r],
                            want[r].0,
                            "{} hd={hd} group={group} row {r}",
                            f.name()
                        );
                        for e in 0..hd {
                            assert_eq!(
                                accs[r][e].to_bits(),
                                want[r].1[e].to_bits(),
                                "{} hd={hd} group={group} row {r} e={e}",
                                f.name()
                            );
                        }
                    }
                }
            }
        }
    }

    /// Tiles run in one call (`tiles_update_pairs`, pipelined) give the bits of one call per
    /// tile on the definition, for any number of rows and tiles (later tiles' K spread wider,
    /// so the maximum rises within a run).
    #[test]
    fn tiles_in_one_call_give_the_bits_of_one_call_per_tile() {
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(23);
        for hd in [64usize, 32, 128, 16] {
            for rows in [1usize, 2, 3, 4, 6, 7, 13] {
                for count in [1usize, 2, 5] {
                    let q: Vec<Vec<u32>> = (0..rows)
                        .map(|_| {
                            let f: Vec<f32> =
                                (0..hd).map(|_| rng.gen_range(-2.0f32..2.0)).collect();
                            let mut p = vec![0u32; hd / 2];
                            query_pairs(&f, &mut p);
                            p
                        })
                        .collect();
                    let staged: Vec<PairTile> = (0..count)
                        .map(|k| {
                            let keys = random_bf16(&mut rng, TILE * hd, 1.0 + 3.0 * k as f32);
                            let vals = random_bf16(&mut rng, TILE * hd, 1.0);
                            let mut t = PairTile::new(hd);
                            t.stage(&keys, &vals, TILE);
                            t
                        })
                        .collect();
                    let qs: Vec<&[u32]> = q.iter().map(|x| &x[..]).collect();
                    let full = vec![TILE; rows];
                    let run = |f: CpuFeatures, one_call: bool| {
                        let mut sts = vec![TileSoftmax::default(); rows];
                        let mut accs = vec![vec![0f32; hd]; rows];
                        let mut a: Vec<&mut [f32]> = accs.iter_mut().map(|x| &mut x[..]).collect();
                        if one_call {
                            let views: Vec<PairTileRef<'_>> =
                                staged.iter().map(PairTile::view).collect();
                            tiles_update_pairs(f, &mut sts, &mut a, &qs, &views, 0.125);
                        } else {
                            for tile in &staged {
                                tile_update_pairs(f, &mut sts, &mut a, &qs, &full, tile, 0.125);
                            }
                        }
                        let mut bits: Vec<u32> = Vec::new();
                        for (st, acc) in sts.iter().zip(&accs) {
                            bits.extend([st.max.to_bits(), st.sum.to_bits()]);
                            bits.extend(acc.iter().map(|x| x.to_bits()));
                        }
                        bits
                    };
                    let want = run(CpuFeatures::PORTABLE, false);
                    for f in features() {
                        assert_eq!(
                            run(f, true),
                            want,
                            "{} hd={hd} rows={rows} tiles={count}",
                            f.name()
                        );
                    }
                }
            }
        }
    }

    /// The reference maximum moves only past the margin: a row's first tile sets it, a tile
    /// whose best score lies within `RAISE_MARGIN` of it keeps it (its weights above 1), one
    /// past the margin raises it — on every path alike, bit for bit — and the normalised
    /// output stays the softmax's.
    #[test]
    fn the_reference_maximum_moves_only_past_the_margin() {
        let hd = 16;
        // q = (1, 0, …): a position's score is its key's first element (scale 1).
        let mut qf = vec![0f32; hd];
        qf[0] = 1.0;
        let mut q = vec![0u32; hd / 2];
        query_pairs(&qf, &mut q);
        let best = [1.0f32, 1.0 + RAISE_MARGIN - 3.0, 1.0 + RAISE_MARGIN + 21.0];
        let mut scores = Vec::new();
        let staged: Vec<PairTile> = best
            .iter()
            .map(|&b| {
                let mut keys = vec![bf16::ZERO; TILE * hd];
                let mut vals = vec![bf16::ZERO; TILE * hd];
                for t in 0..TILE {
                    let sc = if t == 5 {
                        b
                    } else {
                        (t % 7) as f32 * 0.25 - 1.0
                    };
                    keys[t * hd] = bf16::from_f32(sc);
                    scores.push(bf16::from_f32(sc).to_f32());
                    for e in 0..hd {
                        vals[t * hd + e] = bf16::from_f32(((t * 3 + e) % 11) as f32 * 0.1 - 0.5);
                    }
                }
                let mut tile = PairTile::new(hd);
                tile.stage(&keys, &vals, TILE);
                tile
            })
            .collect();
        let mut runs = Vec::new();
        for f in features() {
            let mut st = TileSoftmax::default();
            let mut acc = vec![0f32; hd];
            let mut maxima = Vec::new();
            for tile in &staged {
                tile_update_pairs(
                    f,
                    std::slice::from_mut(&mut st),
                    &mut [&mut acc[..]],
                    &[&q],
                    &[TILE],
                    tile,
                    1.0,
                );
                maxima.push(st.max);
            }
            assert_eq!(maxima, [best[0], best[0], best[2]], "{}", f.name());
            runs.push((st, acc.iter().map(|x| x.to_bits()).collect::<Vec<_>>()));
            // The softmax-weighted values, exactly, to bf16 weight rounding.
            let m = scores.iter().copied().fold(f32::NEG_INFINITY, f32::max);
            let w: Vec<f64> = scores.iter().map(|&s| f64::from(s - m).exp()).collect();
            let total: f64 = w.iter().sum();
            for (e, &a) in acc.iter().enumerate() {
                let want: f64 = (0..scores.len())
                    .map(|i| {
                        let t = i % TILE;
                        w[i] * f64::from(
                            bf16::from_f32(((t * 3 + e) % 11) as f32 * 0.1 - 0.5).to_f32(),
                        )
                    })
                    .sum::<f64>()
                    / total;
                let got = f64::from(a / st.sum);
                assert!(
                    (got - want).abs() < 1e-2,
                    "{} e={e}: {got} vs {want}",
                    f.name()
                );
            }
        }
        assert!(
            runs.windows(2).all(|w| w[0] == w[1]),
            "every path gives the same bits"
        );
    }

    /// Every staging path writes the scalar staging's words, for every row count.
    #[test]
    fn staging_paths_agree() {
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(4);
        for hd in [64usize, 32, 128, 96] {
            let keys = random_bf16(&mut rng, TILE * hd, 3.0);
            let vals = random_bf16(&mut rng, TILE * hd, 1.0);
            for n in 0..=TILE {
                let mut a = PairTile::new(hd);
                a.keys.fill(7);
                a.values.fill(7);
                let mut b = a.clone();
                a.stage(&keys[..n * hd], &vals[..n * hd], n);
                b.stage_portable(&keys[..n * hd], &vals[..n * hd], n);
                assert_eq!(a.keys, b.keys, "hd={hd} n={n}: keys");
                assert_eq!(a.values, b.values, "hd={hd} n={n}: values");
                // The halves staged one at a time, second first, from rows of their own.
                let mut c = PairTile::new(hd);
                c.keys.fill(9);
                c.values.fill(9);
                let first = n.min(PAIR_HALF_POSITIONS);
                let (k1, v1) = (
                    keys[first * hd..n * hd].to_vec(),
                    vals[first * hd..n * hd].to_vec(),
                );
                c.stage_half(1, &k1, &v1, n - first);
                c.stage_half(0, &keys[..first * hd], &vals[..first * hd], first);
                assert_eq!(c.keys, b.keys, "hd={hd} n={n}: keys by halves");
                assert_eq!(c.values, b.values, "hd={hd} n={n}: values by halves");
                if n > 0 {
                    assert_eq!(
                        a.keys[PAIR_HALF_POSITIONS],
                        keys[2].to_bits() as u32 | (keys[3].to_bits() as u32) << 16
                    );
                    assert_eq!(
                        a.values[1],
                        vals[1].to_bits() as u32
                            | if n > 1 {
                                (vals[hd + 1].to_bits() as u32) << 16
                            } else {
                                0
                            }
                    );
                }
            }
        }
    }

    /// Groups written row by row in the pair layout (`pair_layout::write_row`, as a KV store
    /// keeps bf16 K/V) are the words staging writes: staged from a group's first `n` rows they
    /// equal the half staged from those rows, and read in place, whole, they give every path
    /// the staged tile's bits.
    #[test]
    fn store_groups_are_staged_tiles() {
        use crate::pair_layout::{group_words, write_row};
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(6);
        for hd in [64usize, 32, 16] {
            let keys = random_bf16(&mut rng, TILE * hd, 3.0);
            let vals = random_bf16(&mut rng, TILE * hd, 1.0);
            let w = group_words(hd);
            // Two groups, rows written out of order over stale words.
            let (mut gk, mut gv) = (vec![0xDEAD_BEEFu32; 2 * w], vec![0x7FC0_7FC0u32; 2 * w]);
            for t in (0..TILE).rev() {
                let g = t / PAIR_HALF_POSITIONS;
                write_row(
                    &mut gk[g * w..(g + 1) * w],
                    &mut gv[g * w..(g + 1) * w],
                    t % PAIR_HALF_POSITIONS,
                    &keys[t * hd..(t + 1) * hd],
                    &vals[t * hd..(t + 1) * hd],
                );
            }
            let group =
                |g: usize| PairHalf::new(hd, &gk[g * w..(g + 1) * w], &gv[g * w..(g + 1) * w]);
            let mut staged = PairTile::new(hd);
            staged.stage(&keys, &vals, TILE);
            assert_eq!(
                (&gk, &gv),
                (&staged.keys, &staged.values),
                "hd={hd}: whole groups"
            );
            for n in 0..=PAIR_HALF_POSITIONS {
                for half in 0..2 {
                    let rows =
                        half * PAIR_HALF_POSITIONS * hd..(half * PAIR_HALF_POSITIONS + n) * hd;
                    let mut a = PairTile::new(hd);
                    a.keys.fill(5);
                    a.values.fill(5);
                    let mut b = a.clone();
                    a.stage_half(half, &keys[rows.clone()], &vals[rows], n);
                    b.stage_half_from_group(half, group(half), n);
                    assert_eq!(
                        (a.keys, a.values),
                        (b.keys, b.values),
                        "hd={hd} half={half} n={n}"
                    );
                }
            }
            let f: Vec<f32> = (0..hd).map(|_| rng.gen_range(-2.0f32..2.0)).collect();
            let mut q = vec![0u32; hd / 2];
            query_pairs(&f, &mut q);
            for f in features() {
                let run = |tile: PairTileRef<'_>| {
                    let mut st = [TileSoftmax { max: 0.5, sum: 2.0 }, TileSoftmax::default()];
                    let (mut a0, mut a1) = (vec![0.5f32; hd], vec![0f32; hd]);
                    tile_update_pairs(
                        f,
                        &mut st,
                        &mut [&mut a0[..], &mut a1[..]],
                        &[&q[..], &q[..]],
                        &[TILE, 21],
                        tile,
                        0.2,
                    );
                    (
                        st,
                        [a0, a1].map(|a| a.iter().map(|x| x.to_bits()).collect::<Vec<_>>()),
                    )
                };
                let in_place = PairTileRef::new(hd, group(0), group(1));
                assert_eq!(run(in_place), run(staged.view()), "{} hd={hd}", f.name());
            }
        }
    }

    /// Tiny K, V and queries, whose products and sums fall below f32's normal range (and
    /// denormal bf16 inputs): every path flushes them as the instruction does.
    #[test]
    fn denormals_flush_alike_on_every_path() {
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(21);
        let hd = 64;
        let tiny = |rng: &mut rand_chacha::ChaCha8Rng| {
            let e: i32 = rng.gen_range(-140..-60);
            let m: f32 = rng.gen_range(-2.0..2.0);
            bf16::from_f32(m * 2f32.powi(e))
        };
        let keys: Vec<bf16> = (0..TILE * hd).map(|_| tiny(&mut rng)).collect();
        let vals: Vec<bf16> = (0..TILE * hd).map(|_| tiny(&mut rng)).collect();
        let mut tile = PairTile::new(hd);
        tile.stage(&keys, &vals, TILE);
        // Queries in words as given (a denormal bf16 among them).
        let q: Vec<u32> = (0..hd / 2)
            .map(|i| {
                let w = tiny(&mut rng).to_bits() as u32 | (tiny(&mut rng).to_bits() as u32) << 16;
                if i == 3 {
                    w & 0xFFFF_0000 | 0x0001
                } else {
                    w
                }
            })
            .collect();
        let mut results = Vec::new();
        for f in features() {
            for valid in [16, 9] {
                let mut st = [TileSoftmax { max: 0.0, sum: 1.0 }];
                let mut acc: Vec<f32> = (0..hd).map(|e| 1e-39 * (e as f32 - 30.0)).collect();
                tile_update_pairs(
                    f,
                    &mut st,
                    &mut [&mut acc[..]],
                    &[&q[..]],
                    &[valid],
                    &tile,
                    1e30,
                );
                let bits: Vec<u32> = acc.iter().map(|x| x.to_bits()).collect();
                results.push((f.name(), valid, st[0], bits));
            }
        }
        for r in &results[2..] {
            let base = &results[if r.1 == 16 { 0 } else { 1 }];
            assert_eq!(
                (r.2, &r.3),
                (base.2, &base.3),
                "{} valid={} vs portable",
                r.0,
                r.1
            );
        }
    }

    /// A partly staged tile (a decode's last tile) gives the bits of the same tile staged
    /// whole with other data past the row's positions.
    #[test]
    fn positions_past_valid_never_count() {
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(9);
        let hd = 64;
        let keys = random_bf16(&mut rng, TILE * hd, 3.0);
        let vals = random_bf16(&mut rng, TILE * hd, 1.0);
        let f: Vec<f32> = (0..hd).map(|_| rng.gen_range(-2.0f32..2.0)).collect();
        let mut q = vec![0u32; hd / 2];
        query_pairs(&f, &mut q);
        for f in features() {
            for n in 1..=TILE {
                let mut part = PairTile::new(hd);
                part.stage(&keys, &vals, n);
                let mut whole = PairTile::new(hd);
                whole.stage(&keys, &vals, TILE);
                let run = |tile: &PairTile| {
                    let mut st = [TileSoftmax { max: 0.5, sum: 2.0 }];
                    let mut acc = vec![-0.0f32; hd];
                    acc[3] = 0.25;
                    tile_update_pairs(f, &mut st, &mut [&mut acc[..]], &[&q[..]], &[n], tile, 0.2);
                    (st[0], acc.iter().map(|x| x.to_bits()).collect::<Vec<_>>())
                };
                assert_eq!(run(&part), run(&whole), "{} n={n}", f.name());
            }
        }
    }

    /// The pair arithmetic stays within bf16's rounding of exact attention (f64).
    #[test]
    fn close_to_exact_attention() {
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(2);
        let hd = 64;
        let n = 16 * 40 + 5;
        let keys = random_bf16(&mut rng, n * hd, 1.0);
        let vals = random_bf16(&mut rng, n * hd, 1.0);
        let qf: Vec<f32> = (0..hd).map(|_| rng.gen_range(-1.0f32..1.0)).collect();
        let mut q = vec![0u32; hd / 2];
        query_pairs(&qf, &mut q);
        let scale = 1.0 / (hd as f32).sqrt();
        let mut st = [TileSoftmax::default()];
        let mut acc = vec![0f32; hd];
        let mut tile = PairTile::new(hd);
        for start in (0..n).step_by(TILE) {
            let m = (n - start).min(TILE);
            tile.stage(&keys[start * hd..], &vals[start * hd..], m);
            tile_update_pairs(
                CpuFeatures::detect(),
                &mut st,
                &mut [&mut acc[..]],
                &[&q[..]],
                &[m],
                &tile,
                scale,
            );
        }
        let s: Vec<f64> = (0..n)
            .map(|t| {
                (0..hd)
                    .map(|e| qf[e] as f64 * keys[t * hd + e].to_f64())
                    .sum::<f64>()
                    * scale as f64
            })
            .collect();
        let mx = s.iter().copied().fold(f64::NEG_INFINITY, f64::max);
        let w: Vec<f64> = s.iter().map(|x| (x - mx).exp()).collect();
        let l: f64 = w.iter().sum();
        for e in 0..hd {
            let want: f64 = (0..n)
                .map(|t| w[t] * vals[t * hd + e].to_f64())
                .sum::<f64>()
                / l;
            let got = acc[e] as f64 / st[0].sum as f64;
            assert!((got - want).abs() < 4e-3, "e={e}: {got} vs {want}");
        }
    }
}
