//! The int8-K / bf16-V layout of a group of [`PAIR_GROUP_ROWS`] positions — half a tile of
//! `flash_tile_pairs_coded`, and one 16-row block of a KV store that keeps `k=int8,v=bf16`
//! rows this way, so that step reads them in place instead of staging every tile.
//!
//! A group of `head_dim` holds:
//! - [`coded_key_words`]`(head_dim)` K words `[head_dim / 4][16]`: word `(j, t)` holds the
//!   `int8` codec's unsigned codes of channels `4j..4j + 4` of position `t` (byte `i` = channel
//!   `4j + i`) — `flash_tile_codes::CodedTile`'s columns;
//! - [`CODED_PARAMS`] f16: the 16 positions' K scales, then their offsets, as the codec stores
//!   them (so a group holds exactly its 16 codec rows' bytes, rearranged);
//! - `pair_layout::group_words`(head_dim) V words, `pair_layout`'s V half.
//!
//! Owns that layout: writing and reading one position from and to the codecs' row bytes, the
//! borrowed view of a group ([`CodedPairHalf`]) and a two-half staging buffer
//! ([`CodedPairStage`]) for tiles a store does not hold whole. It never allocates outside the
//! staging buffer, never decides where groups live and never computes attention.

use half::{bf16, f16};

use crate::flash_tile_codes::MAX_CODED_HEAD_DIM;
use crate::flash_tile_pairs_coded::{CodedHalf, CodedPairTile};
use crate::pair_layout::{
    copy_values_prefix, group_words, read_values_row, write_values_row, PAIR_GROUP_ROWS,
};

const HALF: usize = PAIR_GROUP_ROWS;

/// Bytes before an `int8` row's codes: its f16 scale, then its f16 offset (little-endian).
pub const INT8_PARAM_BYTES: usize = 4;
/// f16 parameters per group: 16 scales, then 16 offsets.
pub const CODED_PARAMS: usize = 2 * HALF;

/// K code words in one group of `head_dim` (`head_dim / 4 · 16 = 4 · head_dim`).
pub const fn coded_key_words(head_dim: usize) -> usize {
    head_dim / 4 * HALF
}

/// The widest head the layout holds ([`fits`]).
pub const MAX_HEAD_DIM: usize = MAX_CODED_HEAD_DIM;

/// Whether heads of `head_dim` fit the layout (and the coded pair step): a multiple of 16, at
/// most `MAX_CODED_HEAD_DIM`.
pub const fn fits(head_dim: usize) -> bool {
    head_dim > 0 && head_dim.is_multiple_of(16) && head_dim <= MAX_CODED_HEAD_DIM
}

/// Writes position `t < 16` of a group: K from one `int8` codec row (one group per row:
/// `INT8_PARAM_BYTES + head_dim` bytes), V from `v` (`[head_dim]` bf16). Panics on a shape
/// mismatch.
pub fn write_row(
    keys: &mut [u32],
    params: &mut [f16],
    values: &mut [u32],
    t: usize,
    k_row: &[u8],
    v: &[bf16],
) {
    let hd = v.len();
    check(keys.len(), params.len(), values.len(), t, hd, k_row.len());
    params[t] = f16::from_bits(u16::from_le_bytes([k_row[0], k_row[1]]));
    params[HALF + t] = f16::from_bits(u16::from_le_bytes([k_row[2], k_row[3]]));
    for (j, quad) in k_row[INT8_PARAM_BYTES..].chunks_exact(4).enumerate() {
        keys[j * HALF + t] = u32::from_le_bytes([quad[0], quad[1], quad[2], quad[3]]);
    }
    write_values_row(values, t, v);
}

/// Reads position `t < 16` of a group into an `int8` codec row and `v`: the inverse of
/// [`write_row`]. Panics on a shape mismatch.
pub fn read_row(
    keys: &[u32],
    params: &[f16],
    values: &[u32],
    t: usize,
    k_row: &mut [u8],
    v: &mut [bf16],
) {
    let hd = v.len();
    check(keys.len(), params.len(), values.len(), t, hd, k_row.len());
    k_row[..2].copy_from_slice(&params[t].to_bits().to_le_bytes());
    k_row[2..4].copy_from_slice(&params[HALF + t].to_bits().to_le_bytes());
    for (j, quad) in k_row[INT8_PARAM_BYTES..].chunks_exact_mut(4).enumerate() {
        quad.copy_from_slice(&keys[j * HALF + t].to_le_bytes());
    }
    read_values_row(values, t, v);
}

/// All 16 positions of a group as the codecs' rows at once (what 16 [`read_row`]s give, in
/// contiguous passes): `k_rows` gets 16 `int8` rows (`INT8_PARAM_BYTES + head_dim` bytes each),
/// `v_rows` 16 rows of `head_dim` little-endian bf16 values. Panics on a shape mismatch.
pub fn group_to_rows(
    keys: &[u32],
    params: &[f16],
    values: &[u32],
    k_rows: &mut [u8],
    v_rows: &mut [u8],
    head_dim: usize,
) {
    let hd = head_dim;
    let kr = INT8_PARAM_BYTES + hd;
    check_group(
        [keys.len(), params.len(), values.len()],
        [k_rows.len(), v_rows.len()],
        hd,
    );
    for (t, row) in k_rows.chunks_exact_mut(kr).enumerate() {
        row[..2].copy_from_slice(&params[t].to_bits().to_le_bytes());
        row[2..4].copy_from_slice(&params[HALF + t].to_bits().to_le_bytes());
        for (quad, column) in row[INT8_PARAM_BYTES..]
            .chunks_exact_mut(4)
            .zip(keys.chunks_exact(HALF))
        {
            quad.copy_from_slice(&column[t].to_le_bytes());
        }
    }
    for (pair, rows) in values.chunks_exact(hd).zip(v_rows.chunks_exact_mut(4 * hd)) {
        let (even, odd) = rows.split_at_mut(2 * hd);
        for ((&w, e), o) in pair
            .iter()
            .zip(even.chunks_exact_mut(2))
            .zip(odd.chunks_exact_mut(2))
        {
            e.copy_from_slice(&(w as u16).to_le_bytes());
            o.copy_from_slice(&((w >> 16) as u16).to_le_bytes());
        }
    }
}

/// The inverse of [`group_to_rows`]: the group from 16 `int8` rows and 16 bf16 rows (what 16
/// [`write_row`]s write). Panics on a shape mismatch.
pub fn group_from_rows(
    k_rows: &[u8],
    v_rows: &[u8],
    keys: &mut [u32],
    params: &mut [f16],
    values: &mut [u32],
    head_dim: usize,
) {
    let hd = head_dim;
    let kr = INT8_PARAM_BYTES + hd;
    check_group(
        [keys.len(), params.len(), values.len()],
        [k_rows.len(), v_rows.len()],
        hd,
    );
    for (t, row) in k_rows.chunks_exact(kr).enumerate() {
        params[t] = f16::from_bits(u16::from_le_bytes([row[0], row[1]]));
        params[HALF + t] = f16::from_bits(u16::from_le_bytes([row[2], row[3]]));
        for (quad, column) in row[INT8_PARAM_BYTES..]
            .chunks_exact(4)
            .zip(keys.chunks_exact_mut(HALF))
        {
            column[t] = u32::from_le_bytes([quad[0], quad[1], quad[2], quad[3]]);
        }
    }
    for (pair, rows) in values.chunks_exact_mut(hd).zip(v_rows.chunks_exact(4 * hd)) {
        let (even, odd) = rows.split_at(2 * hd);
        for ((w, e), o) in pair
            .iter_mut()
            .zip(even.chunks_exact(2))
            .zip(odd.chunks_exact(2))
        {
            *w = u16::from_le_bytes([e[0], e[1]]) as u32
                | (u16::from_le_bytes([o[0], o[1]]) as u32) << 16;
        }
    }
}

/// Panics unless a group's parts (`[keys, params, values]`) and 16 rows' bytes (`[k, v]`)
/// hold `hd`'s sizes.
fn check_group([keys, params, values]: [usize; 3], [k, v]: [usize; 2], hd: usize) {
    assert!(
        fits(hd)
            && keys == coded_key_words(hd)
            && params == CODED_PARAMS
            && values == group_words(hd)
            && k == HALF * (INT8_PARAM_BYTES + hd)
            && v == HALF * 2 * hd,
        "coded pair group of head_dim {hd}: keys {keys}, params {params}, values {values}, \
         rows {k} / {v} bytes"
    );
}

fn check(keys: usize, params: usize, values: usize, t: usize, hd: usize, k_row: usize) {
    assert!(
        t < HALF
            && fits(hd)
            && keys == coded_key_words(hd)
            && params == CODED_PARAMS
            && values == group_words(hd)
            && k_row == INT8_PARAM_BYTES + hd,
        "coded pair group row {t}: head_dim {hd}, keys {keys}, params {params}, \
         values {values}, k row {k_row} bytes"
    );
}

/// One group in the layout (module doc), borrowed: a store's block or a staged half.
#[derive(Debug, Clone, Copy)]
pub struct CodedPairHalf<'a> {
    keys: CodedHalf<'a>,
    values: &'a [u32],
}

impl<'a> CodedPairHalf<'a> {
    /// The group of `head_dim` held by `keys`, `params` and `values`. Panics unless each holds
    /// its part's words.
    #[inline]
    pub fn new(
        head_dim: usize,
        keys: &'a [u32],
        params: &'a [f16],
        values: &'a [u32],
    ) -> CodedPairHalf<'a> {
        assert!(
            fits(head_dim) && params.len() == CODED_PARAMS && values.len() == group_words(head_dim),
            "coded pair group of head_dim {head_dim}: params {} values {}",
            params.len(),
            values.len()
        );
        let params = params.try_into().expect("16 scales and 16 offsets");
        CodedPairHalf {
            keys: CodedHalf::new(head_dim, keys, params),
            values,
        }
    }

    /// All 16 positions as the codecs' rows ([`group_to_rows`]).
    pub fn rows(&self, k_rows: &mut [u8], v_rows: &mut [u8]) {
        let hd = self.values.len() / 8;
        group_to_rows(
            self.keys.kt,
            self.keys.params,
            self.values,
            k_rows,
            v_rows,
            hd,
        );
    }

    /// Position `t`'s K as an `int8` codec row and V as bf16 ([`read_row`]).
    pub fn row(&self, t: usize, k_row: &mut [u8], v: &mut [bf16]) {
        read_row(self.keys.kt, self.keys.params, self.values, t, k_row, v);
    }

    /// Whether this group's K codes and V words lie right after `prev`'s (a store's
    /// consecutive blocks: a stream the hardware prefetcher follows).
    #[inline]
    pub fn follows(&self, prev: &CodedPairHalf<'_>) -> bool {
        std::ptr::eq(self.keys.kt.as_ptr(), prev.keys.kt.as_ptr_range().end)
            && std::ptr::eq(self.values.as_ptr(), prev.values.as_ptr_range().end)
    }

    /// Asks the CPU to bring the group's words into cache ahead of a read; no effect on any
    /// result.
    pub fn prefetch(&self) {
        let (kt, values) = (self.keys.kt, self.values);
        crate::flash_tile::prefetch_l1(kt.as_ptr().cast(), std::mem::size_of_val(kt));
        crate::flash_tile::prefetch_l1(values.as_ptr().cast(), std::mem::size_of_val(values));
    }
}

/// The tile of two groups, as `flash_tile_pairs_coded::tile_update_pairs_coded` reads it.
#[inline]
pub fn coded_pair_tile<'a>(head_dim: usize, halves: [CodedPairHalf<'a>; 2]) -> CodedPairTile<'a> {
    CodedPairTile::new(head_dim, halves.map(|h| h.keys), halves.map(|h| h.values))
}

/// Two groups staged (a tile's halves a store does not hold whole): positions not written
/// hold zeros.
#[derive(Debug, Clone, Default)]
pub struct CodedPairStage {
    head_dim: usize,
    keys: Vec<u32>,
    params: Vec<f16>,
    values: Vec<u32>,
}

impl CodedPairStage {
    /// Zeroed halves for heads of `head_dim` ([`fits`]; panics otherwise).
    pub fn new(head_dim: usize) -> CodedPairStage {
        assert!(fits(head_dim), "coded pair stage of head_dim {head_dim}");
        CodedPairStage {
            head_dim,
            keys: vec![0; 2 * coded_key_words(head_dim)],
            params: vec![f16::ZERO; 2 * CODED_PARAMS],
            values: vec![0; 2 * group_words(head_dim)],
        }
    }

    pub fn head_dim(&self) -> usize {
        self.head_dim
    }

    /// Half `h`'s parts (K words, parameters, V words), mutable.
    fn parts_mut(&mut self, h: usize) -> (&mut [u32], &mut [f16], &mut [u32]) {
        let (kw, vw) = (coded_key_words(self.head_dim), group_words(self.head_dim));
        (
            &mut self.keys[h * kw..(h + 1) * kw],
            &mut self.params[h * CODED_PARAMS..(h + 1) * CODED_PARAMS],
            &mut self.values[h * vw..(h + 1) * vw],
        )
    }

    /// Zeroes half `h < 2`.
    pub fn clear_half(&mut self, h: usize) {
        let (k, p, v) = self.parts_mut(h);
        k.fill(0);
        p.fill(f16::ZERO);
        v.fill(0);
    }

    /// Writes position `t` of half `h` ([`write_row`]).
    pub fn write_row(&mut self, h: usize, t: usize, k_row: &[u8], v: &[bf16]) {
        let (k, p, vw) = self.parts_mut(h);
        write_row(k, p, vw, t, k_row, v);
    }

    /// Half `h` from positions `0..n` of `group`, zeroes after them (a group a pass reads in
    /// part: its positions past `n` may hold stale words).
    pub fn stage_from_group(&mut self, h: usize, group: CodedPairHalf<'_>, n: usize) {
        assert!(n <= HALF, "staging {n} positions of a group");
        let hd = self.head_dim;
        let (k, p, v) = self.parts_mut(h);
        for (dst, src) in k
            .chunks_exact_mut(HALF)
            .zip(group.keys.kt.chunks_exact(HALF))
        {
            dst[..n].copy_from_slice(&src[..n]);
            dst[n..].fill(0);
        }
        for (dst, src) in p
            .chunks_exact_mut(HALF)
            .zip(group.keys.params.chunks_exact(HALF))
        {
            dst[..n].copy_from_slice(&src[..n]);
            dst[n..].fill(f16::ZERO);
        }
        copy_values_prefix(v, group.values, n, hd);
    }

    /// Half `h` as a group view.
    #[inline]
    pub fn half(&self, h: usize) -> CodedPairHalf<'_> {
        let (hd, kw, vw) = (
            self.head_dim,
            coded_key_words(self.head_dim),
            group_words(self.head_dim),
        );
        CodedPairHalf::new(
            hd,
            &self.keys[h * kw..(h + 1) * kw],
            &self.params[h * CODED_PARAMS..(h + 1) * CODED_PARAMS],
            &self.values[h * vw..(h + 1) * vw],
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cpu::cpu_features;
    use crate::flash_tile_codes::CodedTile;
    use quant::{EncodedRows, KvCodecKind};

    /// `n` int8 rows of `hd` (codec bytes) and bf16 rows, from a seeded generator.
    fn rows(hd: usize, n: usize, seed: u64) -> (Vec<u8>, Vec<bf16>) {
        let kind = KvCodecKind::Int8 { group: hd };
        let rb = kind.bytes_per_row(hd);
        let mut state = seed;
        let mut next = || {
            state = state
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            ((state >> 33) as f32 / (1u64 << 31) as f32 - 0.5) * 6.0
        };
        let mut k = vec![0u8; n * rb];
        let mut v = Vec::with_capacity(n * hd);
        for r in 0..n {
            let x: Vec<f32> = (0..hd).map(|_| next()).collect();
            quant::encode_row(kind, &x, &mut k[r * rb..(r + 1) * rb]).unwrap();
            v.extend((0..hd).map(|_| bf16::from_f32(next())));
        }
        (k, v)
    }

    #[test]
    fn rows_read_back_as_the_codec_bytes_written() {
        for hd in [16, 64, 128] {
            let (k, v) = rows(hd, HALF, 7);
            let rb = INT8_PARAM_BYTES + hd;
            let mut stage = CodedPairStage::new(hd);
            // Written out of order, into the second half: no position leaks into another.
            for t in (0..HALF).rev() {
                stage.write_row(1, t, &k[t * rb..(t + 1) * rb], &v[t * hd..(t + 1) * hd]);
            }
            let (mut kr, mut vr) = (vec![0u8; rb], vec![bf16::ZERO; hd]);
            for t in 0..HALF {
                stage.half(1).row(t, &mut kr, &mut vr);
                assert_eq!(kr, k[t * rb..(t + 1) * rb], "hd {hd} position {t} K");
                assert_eq!(vr, v[t * hd..(t + 1) * hd], "hd {hd} position {t} V");
            }
            assert!(stage.keys[..coded_key_words(hd)].iter().all(|&w| w == 0));
        }
    }

    /// The group's K is what `CodedTile::load_rows` stages from the same rows — the words and
    /// parameters the coded pair step's definition reads.
    #[test]
    fn keys_are_the_coded_tiles_columns() {
        let hd = 64;
        let (k, v) = rows(hd, HALF, 11);
        let rb = INT8_PARAM_BYTES + hd;
        let mut stage = CodedPairStage::new(hd);
        for t in 0..HALF {
            stage.write_row(0, t, &k[t * rb..(t + 1) * rb], &v[t * hd..(t + 1) * hd]);
        }
        let mut tile = CodedTile::default();
        tile.reset(hd);
        let enc = EncodedRows::new(KvCodecKind::Int8 { group: hd }, hd, &k).unwrap();
        tile.load_rows(cpu_features(), &enc, 0);
        let (kt, params) = tile.rows_codes();
        let half = stage.half(0);
        assert_eq!(half.keys.kt, &kt[..coded_key_words(hd)]);
        let bits = |p: &[f16]| p.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
        assert_eq!(bits(half.keys.params), bits(params));
    }

    /// Whole groups convert to and from the codecs' rows as 16 row reads and writes do.
    #[test]
    fn whole_groups_convert_as_their_rows() {
        for hd in [16, 64, 256] {
            let (k, v) = rows(hd, HALF, 5 + hd as u64);
            let rb = INT8_PARAM_BYTES + hd;
            let mut by_rows = CodedPairStage::new(hd);
            for t in 0..HALF {
                by_rows.write_row(0, t, &k[t * rb..(t + 1) * rb], &v[t * hd..(t + 1) * hd]);
            }
            let v_bytes: Vec<u8> = v.iter().flat_map(|x| x.to_le_bytes()).collect();
            let mut at_once = CodedPairStage::new(hd);
            {
                let (keys, params, values) = at_once.parts_mut(0);
                group_from_rows(&k, &v_bytes, keys, params, values, hd);
            }
            assert_eq!(at_once.keys, by_rows.keys, "hd {hd}: K words");
            assert_eq!(at_once.params, by_rows.params, "hd {hd}: parameters");
            assert_eq!(at_once.values, by_rows.values, "hd {hd}: V words");
            let (mut k_out, mut v_out) = (vec![0u8; HALF * rb], vec![0u8; HALF * 2 * hd]);
            let g = by_rows.half(0);
            group_to_rows(
                g.keys.kt,
                g.keys.params,
                g.values,
                &mut k_out,
                &mut v_out,
                hd,
            );
            assert_eq!(k_out, k, "hd {hd}: K rows");
            assert_eq!(v_out, v_bytes, "hd {hd}: V rows");
        }
    }

    #[test]
    fn a_partial_group_stages_its_positions_and_zeroes() {
        let hd = 32;
        let (k, v) = rows(hd, HALF, 3);
        let rb = INT8_PARAM_BYTES + hd;
        let mut full = CodedPairStage::new(hd);
        for t in 0..HALF {
            full.write_row(0, t, &k[t * rb..(t + 1) * rb], &v[t * hd..(t + 1) * hd]);
        }
        for n in [0, 1, 5, 16] {
            let mut staged = CodedPairStage::new(hd);
            staged.stage_from_group(1, full.half(0), n);
            let mut want = CodedPairStage::new(hd);
            for t in 0..n {
                want.write_row(1, t, &k[t * rb..(t + 1) * rb], &v[t * hd..(t + 1) * hd]);
            }
            assert_eq!(staged.keys, want.keys, "n {n}");
            assert_eq!(staged.params, want.params, "n {n}");
            assert_eq!(staged.values, want.values, "n {n}");
        }
    }
}
