//! The bf16-pair layout of K/V: the words the bf16-pair tile step (`flash_tile_pairs`) reads,
//! for a group of [`PAIR_GROUP_ROWS`] positions — half a pair tile, and one 16-row block of a
//! KV store that keeps bf16 K/V in this layout, so a decode reads them in place instead of
//! transposing every tile it attends.
//!
//! A group of `head_dim` holds [`group_words`]`(head_dim)` words of K and as many of V:
//! - K `[head_dim / 2][16]`: word `(i, t)` = `k[t][2i] | k[t][2i+1] << 16` (position lanes);
//! - V `[8][head_dim]`: word `(j, e)` = `v[2j][e] | v[2j+1][e] << 16` (position pairs).
//!
//! Owns that layout: writing and reading one row of a group, and the borrowed views the tile
//! step takes ([`PairHalf`], [`PairTileRef`]). It never allocates, never decides where groups
//! live (a store or a staging buffer) and never computes attention.

use half::bf16;

/// Positions per group (half of a `flash_tile_pairs` tile).
pub const PAIR_GROUP_ROWS: usize = 16;

/// Words of K — and of V — in one group of `head_dim` (`head_dim / 2 · 16 = 8 · head_dim`).
pub const fn group_words(head_dim: usize) -> usize {
    8 * head_dim
}

/// One group in the pair layout (module doc), borrowed: a staged half tile or a store's block.
#[derive(Debug, Clone, Copy)]
pub struct PairHalf<'a> {
    pub(crate) keys: &'a [u32],
    pub(crate) values: &'a [u32],
}

impl<'a> PairHalf<'a> {
    /// The group whose K words are `keys` and V words `values`. Panics unless each holds
    /// [`group_words`]`(head_dim)` words.
    #[inline]
    pub fn new(head_dim: usize, keys: &'a [u32], values: &'a [u32]) -> PairHalf<'a> {
        let w = group_words(head_dim);
        assert!(
            keys.len() == w && values.len() == w,
            "pair group of head_dim {head_dim}: keys {} values {} (want {w} each)",
            keys.len(),
            values.len()
        );
        PairHalf { keys, values }
    }

    /// The group's V words (what the int8-scored pair step, `flash_tile_pairs_coded`, reads
    /// beside K codes).
    pub fn values(&self) -> &'a [u32] {
        self.values
    }

    /// K and V of row `t` as bf16 (`k`, `v`: `[head_dim]` each).
    pub fn row(&self, t: usize, k: &mut [bf16], v: &mut [bf16]) {
        read_row(self.keys, self.values, t, k, v);
    }

    /// Whether this group's K and V words lie right after `prev`'s (a store's consecutive
    /// blocks: a stream the hardware prefetcher follows).
    #[inline]
    pub fn follows(&self, prev: &PairHalf<'_>) -> bool {
        std::ptr::eq(self.keys.as_ptr(), prev.keys.as_ptr_range().end)
            && std::ptr::eq(self.values.as_ptr(), prev.values.as_ptr_range().end)
    }

    /// Asks the CPU to bring the group's words into cache ahead of a read (a jump the hardware
    /// prefetcher cannot follow); no effect on any result.
    pub fn prefetch(&self) {
        for words in [self.keys, self.values] {
            crate::flash_tile::prefetch_l1(words.as_ptr().cast(), std::mem::size_of_val(words));
        }
    }
}

/// A pair tile as the tile step reads it: positions `0..16` from `halves[0]`, `16..32` from
/// `halves[1]`, each a group anywhere in memory.
#[derive(Debug, Clone, Copy)]
pub struct PairTileRef<'a> {
    pub(crate) head_dim: usize,
    pub(crate) halves: [PairHalf<'a>; 2],
}

impl PairTileRef<'_> {
    /// Asks the CPU to bring each half whose words do not lie right after those read before it
    /// (`prev`'s second half, then this tile's first) into cache: blocks spread over a pool,
    /// which the hardware prefetcher cannot follow. No effect on any result.
    #[inline]
    pub fn prefetch_jumps(&self, prev: &PairTileRef<'_>) {
        let before = [prev.halves[1], self.halves[0]];
        for (half, before) in self.halves.iter().zip(before) {
            if !half.follows(&before) {
                half.prefetch();
            }
        }
    }

    /// Asks the CPU to start (to L2) each page that this tile's K or V words reach into
    /// `ahead` bytes further on (`page_prefetch`): the pages a stream of tiles laid out one
    /// after another enters next. No effect on any result.
    #[inline]
    pub fn prefetch_next_pages(&self, ahead: usize) {
        for h in &self.halves {
            for words in [h.keys, h.values] {
                crate::page_prefetch::prefetch_page_starts(
                    words.as_ptr().cast(),
                    std::mem::size_of_val(words),
                    ahead,
                );
            }
        }
    }
}

impl<'a> PairTileRef<'a> {
    /// The tile of two groups of `head_dim` (their sizes were checked by [`PairHalf::new`]).
    /// Panics when a half's size is not that of `head_dim`.
    #[inline]
    pub fn new(head_dim: usize, first: PairHalf<'a>, second: PairHalf<'a>) -> PairTileRef<'a> {
        for h in [&first, &second] {
            assert_eq!(h.keys.len(), group_words(head_dim), "pair tile halves");
        }
        PairTileRef {
            head_dim,
            halves: [first, second],
        }
    }

    /// The head size of its rows.
    pub fn head_dim(&self) -> usize {
        self.head_dim
    }
}

/// Writes row `t < 16` of the group `keys` / `values` (each [`group_words`] of the rows'
/// length) from `k` and `v` (`[head_dim]` bf16). Panics on a shape mismatch.
pub fn write_row(keys: &mut [u32], values: &mut [u32], t: usize, k: &[bf16], v: &[bf16]) {
    let hd = k.len();
    check(keys.len(), values.len(), t, hd, v.len());
    for (i, pair) in k.chunks_exact(2).enumerate() {
        keys[i * PAIR_GROUP_ROWS + t] = word(pair[0], pair[1]);
    }
    write_values_row(values, t, v);
}

/// Writes row `t < 16` of a group's V words (`[8][head_dim]`, [`group_words`]`(v.len())` of
/// them) from `v` — the V half of [`write_row`], for groups whose K is kept otherwise
/// (`coded_pair_layout`). Panics on a shape mismatch.
pub fn write_values_row(values: &mut [u32], t: usize, v: &[bf16]) {
    let hd = v.len();
    check(values.len(), values.len(), t, hd, hd);
    let (j, shift) = (t / 2, 16 * (t % 2));
    let row = &mut values[j * hd..(j + 1) * hd];
    let keep = !(0xFFFF_u32 << shift);
    for (w, x) in row.iter_mut().zip(v) {
        *w = (*w & keep) | (x.to_bits() as u32) << shift;
    }
}

/// Reads row `t < 16` of the group into `k` and `v` (`[head_dim]` bf16): the inverse of
/// [`write_row`]. Panics on a shape mismatch.
pub fn read_row(keys: &[u32], values: &[u32], t: usize, k: &mut [bf16], v: &mut [bf16]) {
    let hd = k.len();
    check(keys.len(), values.len(), t, hd, v.len());
    for (i, pair) in k.chunks_exact_mut(2).enumerate() {
        let w = keys[i * PAIR_GROUP_ROWS + t];
        pair[0] = bf16::from_bits(w as u16);
        pair[1] = bf16::from_bits((w >> 16) as u16);
    }
    read_values_row(values, t, v);
}

/// Reads row `t < 16` of a group's V words into `v`: the inverse of [`write_values_row`].
pub fn read_values_row(values: &[u32], t: usize, v: &mut [bf16]) {
    let hd = v.len();
    check(values.len(), values.len(), t, hd, hd);
    let (j, shift) = (t / 2, 16 * (t % 2));
    for (x, &w) in v.iter_mut().zip(&values[j * hd..(j + 1) * hd]) {
        *x = bf16::from_bits((w >> shift) as u16);
    }
}

/// Copies positions `0..n` of a group's V words `src` into `dst` and zeroes the rest
/// (positions `n..16`): a partial group staged with no stale half-words.
pub fn copy_values_prefix(dst: &mut [u32], src: &[u32], n: usize, head_dim: usize) {
    let hd = head_dim;
    assert!(
        n <= PAIR_GROUP_ROWS && dst.len() == group_words(hd) && src.len() == group_words(hd),
        "V words of a group: n={n} head_dim={hd}"
    );
    let pairs = n / 2;
    dst[..pairs * hd].copy_from_slice(&src[..pairs * hd]);
    if n % 2 == 1 {
        let (d, s) = (
            &mut dst[pairs * hd..(pairs + 1) * hd],
            &src[pairs * hd..(pairs + 1) * hd],
        );
        for (d, s) in d.iter_mut().zip(s) {
            *d = s & 0xFFFF;
        }
    }
    dst[n.div_ceil(2) * hd..].fill(0);
}

fn check(keys: usize, values: usize, t: usize, hd: usize, v: usize) {
    assert!(
        t < PAIR_GROUP_ROWS
            && hd.is_multiple_of(2)
            && v == hd
            && keys == group_words(hd)
            && values == group_words(hd),
        "pair group row {t}: head_dim {hd}, v {v}, keys {keys}, values {values}"
    );
}

#[inline]
fn word(lo: bf16, hi: bf16) -> u32 {
    lo.to_bits() as u32 | (hi.to_bits() as u32) << 16
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Rows written in any order read back as written, each word where the module doc puts it.
    #[test]
    fn rows_round_trip_and_land_where_the_layout_says() {
        let hd = 8;
        let val = |t: usize, e: usize, s: f32| bf16::from_f32(s * (t * hd + e) as f32);
        let (mut keys, mut values) = (vec![0u32; group_words(hd)], vec![0u32; group_words(hd)]);
        for t in [3usize, 0, 15, 1, 2, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14] {
            let k: Vec<bf16> = (0..hd).map(|e| val(t, e, 1.0)).collect();
            let v: Vec<bf16> = (0..hd).map(|e| val(t, e, -0.5)).collect();
            write_row(&mut keys, &mut values, t, &k, &v);
        }
        let (mut k, mut v) = (vec![bf16::ZERO; hd], vec![bf16::ZERO; hd]);
        for t in 0..PAIR_GROUP_ROWS {
            read_row(&keys, &values, t, &mut k, &mut v);
            for e in 0..hd {
                assert_eq!(k[e], val(t, e, 1.0), "k t={t} e={e}");
                assert_eq!(v[e], val(t, e, -0.5), "v t={t} e={e}");
            }
        }
        // Groups next to each other in one buffer follow each other, in that order only.
        let (ks, vs) = (
            vec![0u32; 3 * group_words(hd)],
            vec![0u32; 3 * group_words(hd)],
        );
        let g = |i: usize| {
            let r = i * group_words(hd)..(i + 1) * group_words(hd);
            PairHalf::new(hd, &ks[r.clone()], &vs[r])
        };
        assert!(g(1).follows(&g(0)) && g(2).follows(&g(1)));
        assert!(!g(0).follows(&g(1)) && !g(2).follows(&g(0)));
        g(2).prefetch();
        // Word (i = 1, t = 5) of K; word (j = 2, e = 3) of V.
        assert_eq!(keys[16 + 5], word(val(5, 2, 1.0), val(5, 3, 1.0)));
        assert_eq!(values[2 * hd + 3], word(val(4, 3, -0.5), val(5, 3, -0.5)));
    }
}
