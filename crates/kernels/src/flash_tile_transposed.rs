//! The tile step of `flash_tile` over a K tile stored transposed (`[head_dim][TILE_POSITIONS]`
//! f32, as `flash_tile_wide::transpose_keys` writes it), at the widest register width the CPU
//! proves: one entry ([`tile_update_transposed`]), one check of shapes and one row schedule —
//! runs of GQA triples (three rows sharing `valid` share every K and V load), rows alone between
//! them — for both widths. The bodies are `flash_tile_wide`'s (512-bit) and
//! `flash_tile_narrow`'s (256-bit).
//!
//! The two bodies are not one kernel generic over the lane width because they differ in more
//! than width: a row's 16 scores are one 512-bit vector but two 256-bit ones, and with 32
//! registers the wide body keeps all eight lane chains of a triple live at once while the
//! narrow one, with 16, runs them as four pairs over both halves of the tile. Each body's
//! operations are those of `flash_tile::tile_update` in its order, so both give the same bits
//! (tests below and beside each body).
//!
//! Owns the entry, the width choice and the row schedule; it never transposes, never reads a KV
//! store and never decides which rows share a tile (`model`'s `attention_tiled` does).

use super::cpu::{cpu_features, CpuFeatures};
pub use super::flash_tile::TRIPLE_ROWS;
use super::flash_tile::{TileSoftmax, TILE_POSITIONS};
use super::flash_tile_narrow::NarrowTiles;
use super::flash_tile_wide::WideTiles;

/// Proof that a transposed tile step may run here, and at which width: 512-bit where AVX-512 F
/// is detected (and not overridden), else 256-bit where AVX2, FMA and F16C are.
#[derive(Debug, Clone, Copy)]
pub enum TransposedTiles {
    Wide(WideTiles),
    Narrow(NarrowTiles),
}

impl TransposedTiles {
    /// The widest step `features` (clamped to what the CPU has) allow, if any.
    pub fn with(features: CpuFeatures) -> Option<TransposedTiles> {
        WideTiles::with(features)
            .map(TransposedTiles::Wide)
            .or_else(|| NarrowTiles::with(features).map(TransposedTiles::Narrow))
    }

    /// [`TransposedTiles::with`] the process's features.
    pub fn here() -> Option<TransposedTiles> {
        TransposedTiles::with(cpu_features())
    }

    /// Floats per register: head sizes must be a multiple of this.
    pub fn lanes(self) -> usize {
        match self {
            TransposedTiles::Wide(_) => 16,
            TransposedTiles::Narrow(_) => 8,
        }
    }
}

/// The end of the run of consecutive triples of rows starting at row `r` whose rows all see
/// `valids[r]` positions (`r` when rows `r..r + 3` do not form one).
pub(crate) fn triple_run_end(valids: &[usize], r: usize) -> usize {
    let starts_triple = |i: usize| {
        i + TRIPLE_ROWS <= valids.len()
            && valids[i..i + TRIPLE_ROWS].iter().all(|&v| v == valids[r])
    };
    let mut end = r;
    while starts_triple(end) {
        end += TRIPLE_ROWS;
    }
    end
}

/// The tile step of `flash_tile::tile_update` for each row `r` (state `sts[r]`, accumulator
/// `accs[r]`, query `qs[r]`, `valids[r]` positions of the tile, 1..=16), reading keys from `kt`
/// (`[hd][16]`, transposed by `flash_tile_wide::transpose_keys`; positions past a row's `valid`
/// may hold anything finite) and values from `vals` (`[≥ max valid, hd]` f32). Bit-identical to
/// `tile_update` with the same K rows, at either width.
///
/// Panics unless `hd` is a multiple of [`TransposedTiles::lanes`] and shapes match.
#[allow(clippy::too_many_arguments)]
#[inline]
pub fn tile_update_transposed(
    proof: TransposedTiles,
    sts: &mut [TileSoftmax],
    accs: &mut [&mut [f32]],
    qs: &[&[f32]],
    valids: &[usize],
    kt: &[f32],
    vals: &[f32],
    scale: f32,
) {
    let rows = qs.len();
    assert!(rows == sts.len() && rows == accs.len() && rows == valids.len());
    if rows == 0 {
        return;
    }
    let hd = qs[0].len();
    let max_valid = valids.iter().copied().max().unwrap_or(0);
    assert!(
        hd > 0
            && hd.is_multiple_of(proof.lanes())
            && qs.iter().all(|q| q.len() == hd)
            && accs.iter().all(|a| a.len() == hd)
            && valids.iter().all(|v| (1..=TILE_POSITIONS).contains(v))
            && kt.len() >= hd * TILE_POSITIONS
            && vals.len() >= max_valid * hd,
        "transposed tile shapes: hd={hd} lanes={} kt={} vals={} valids={valids:?}",
        proof.lanes(),
        kt.len(),
        vals.len()
    );
    #[cfg(target_arch = "x86_64")]
    {
        let mut r = 0;
        while r < rows {
            let mut end = triple_run_end(valids, r);
            let triples = end > r;
            if !triples {
                // Rows alone: up to the next row that starts a triple (of its own `valid`).
                end = r + 1;
                while end < rows && triple_run_end(valids, end) == end {
                    end += 1;
                }
            }
            let (sts, accs, qs) = (&mut sts[r..end], &mut accs[r..end], &qs[r..end]);
            // SAFETY: the token proves the body's features (AVX-512 F with AVX2, FMA and F16C;
            // or AVX2, FMA and F16C); every shape was checked by the assertion above, and a run
            // of triples has `sts.len()` a multiple of three, all rows seeing `valids[r]`.
            unsafe {
                match (proof, triples) {
                    (TransposedTiles::Wide(_), true) => super::flash_tile_wide::x86::triples(
                        sts, accs, qs, valids[r], kt, vals, scale,
                    ),
                    (TransposedTiles::Wide(_), false) => super::flash_tile_wide::x86::alone(
                        sts,
                        accs,
                        qs,
                        &valids[r..end],
                        kt,
                        vals,
                        scale,
                    ),
                    (TransposedTiles::Narrow(_), true) => super::flash_tile_narrow::x86::triples(
                        sts, accs, qs, valids[r], kt, vals, scale,
                    ),
                    (TransposedTiles::Narrow(_), false) => super::flash_tile_narrow::x86::rows(
                        sts,
                        accs,
                        qs,
                        &valids[r..end],
                        kt,
                        vals,
                        scale,
                    ),
                }
            }
            r = end;
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        let _ = (sts, accs, kt, vals, scale);
        unreachable!("no TransposedTiles token exists off x86-64");
    }
}

#[cfg(test)]
mod tests {
    use super::super::flash_tile_wide::check::check_transposed_step;
    use super::*;

    /// Every width this CPU has (runs of one to three triples sharing `valid`, so the pipelined
    /// triples run; single rows that differ; head sizes that are and are not multiples of 64)
    /// against the portable row-major definition, bit for bit.
    #[test]
    fn every_width_matches_the_portable_definition_bitwise() {
        let tiles: [[usize; 11]; 5] = [
            [16; 11],
            [16, 16, 16, 16, 16, 16, 5, 5, 5, 9, 1],
            [7, 7, 7, 16, 16, 16, 16, 16, 16, 8, 16],
            [16; 11],
            [1, 1, 1, 2, 2, 2, 2, 2, 2, 3, 15],
        ];
        let narrow_tiles: [[usize; 7]; 5] = [
            [16; 7],
            [16, 5, 5, 9, 1, 16, 8],
            [7, 7, 7, 16, 16, 16, 3],
            [16; 7],
            [1, 2, 2, 2, 3, 15, 16],
        ];
        let proofs = [
            WideTiles::here().map(TransposedTiles::Wide),
            NarrowTiles::here().map(TransposedTiles::Narrow),
        ];
        if proofs.iter().all(Option::is_none) {
            eprintln!("no AVX2 here: the transposed tile kernels are not exercised");
        }
        for proof in proofs.into_iter().flatten() {
            let hds: &[usize] = match proof {
                TransposedTiles::Wide(_) => &[64, 16, 128],
                TransposedTiles::Narrow(_) => &[64, 8, 72, 128, 256],
            };
            let step = |sts: &mut [TileSoftmax],
                        accs: &mut [&mut [f32]],
                        qs: &[&[f32]],
                        valids: &[usize],
                        kt: &[f32],
                        vals: &[f32]| {
                tile_update_transposed(proof, sts, accs, qs, valids, kt, vals, 0.125)
            };
            check_transposed_step(29, hds, &tiles, step);
            check_transposed_step(31, hds, &narrow_tiles, step);
        }
    }

    /// Shapes a width cannot take are refused, not read out of bounds.
    #[test]
    #[should_panic(expected = "transposed tile shapes")]
    fn a_head_size_not_a_multiple_of_the_lanes_is_refused() {
        let Some(proof) = TransposedTiles::here() else {
            panic!("transposed tile shapes (no AVX2 here)");
        };
        let q = [0f32; 12];
        let mut acc = [0f32; 12];
        let kt = vec![0f32; 12 * TILE_POSITIONS];
        let vals = vec![0f32; 12 * TILE_POSITIONS];
        tile_update_transposed(
            proof,
            &mut [TileSoftmax::default()],
            &mut [&mut acc[..]],
            &[&q[..]],
            &[16],
            &kt,
            &vals,
            1.0,
        );
    }

    /// The widest width is chosen, and none without AVX2.
    #[test]
    fn the_widest_width_is_chosen() {
        assert!(TransposedTiles::with(CpuFeatures::PORTABLE).is_none());
        if let Some(p) = TransposedTiles::here() {
            assert_eq!(p.lanes() == 16, WideTiles::here().is_some());
        }
    }
}
