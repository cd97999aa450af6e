use half::{bf16, f16};
use rand::{Rng, SeedableRng};

use super::*;
use crate::flash_tile_codes::QueryCodes;
use crate::pair_layout::write_row;

/// A tile's random parts: K codes, scales and offsets per half, and bf16 V in the pair layout
/// (with the bf16 values kept for the exact reference).
struct Parts {
    kt: [Vec<u32>; 2],
    /// Per half: 16 f16 scales, then 16 offsets.
    params: [[f16; 2 * HALF]; 2],
    values: [Vec<u32>; 2],
    /// `[32, hd]`: decoded K and V of the tile's positions.
    k: Vec<f32>,
    v: Vec<f32>,
}

impl Parts {
    fn random(rng: &mut impl Rng, hd: usize) -> Parts {
        let kt = [0, 1].map(|_| (0..hd / 4 * HALF).map(|_| rng.gen()).collect::<Vec<u32>>());
        let params: [[f16; 2 * HALF]; 2] = [0, 1].map(|_| {
            std::array::from_fn(|i| {
                f16::from_f32(if i < HALF {
                    rng.gen_range(0.002f32..0.02)
                } else {
                    rng.gen_range(-1.5f32..-0.5)
                })
            })
        });
        let mut values = [0, 1].map(|_| vec![0u32; group_words(hd)]);
        let mut dummy = vec![0u32; group_words(hd)];
        let mut k = vec![0f32; TILE * hd];
        let mut v = vec![0f32; TILE * hd];
        for t in 0..TILE {
            let (h, u) = (t / HALF, t % HALF);
            for c in 0..hd {
                let code = kt[h][c / 4 * HALF + u].to_le_bytes()[c % 4] as f32;
                let (s, o) = (params[h][u].to_f32(), params[h][HALF + u].to_f32());
                k[t * hd + c] = s.mul_add(code, o);
            }
            let row: Vec<bf16> = (0..hd)
                .map(|_| bf16::from_f32(rng.gen_range(-1.0f32..1.0)))
                .collect();
            for (c, x) in row.iter().enumerate() {
                v[t * hd + c] = x.to_f32();
            }
            write_row(&mut dummy, &mut values[h], u, &row, &row);
        }
        Parts {
            kt,
            params,
            values,
            k,
            v,
        }
    }

    fn tile(&self, hd: usize) -> CodedPairTile<'_> {
        let keys = [0, 1].map(|h| CodedHalf::new(hd, &self.kt[h], &self.params[h]));
        CodedPairTile::new(hd, keys, [&self.values[0][..], &self.values[1][..]])
    }
}

fn queries(rng: &mut impl Rng, rows: usize, hd: usize) -> (QueryCodes, Vec<Vec<f32>>) {
    let mut codes = QueryCodes::default();
    codes.reset(rows, hd);
    let qf: Vec<Vec<f32>> = (0..rows)
        .map(|_| (0..hd).map(|_| rng.gen_range(-2.0f32..2.0)).collect())
        .collect();
    for (r, q) in qf.iter().enumerate() {
        codes.prepare_rows(CpuFeatures::PORTABLE, r, q);
    }
    (codes, qf)
}

/// Runs `tiles` in turn for every row with its own position counts per tile, on `features`.
fn run(
    features: CpuFeatures,
    hd: usize,
    tiles: &[Parts],
    codes: &QueryCodes,
    valids: &[Vec<usize>],
) -> (Vec<TileSoftmax>, Vec<Vec<f32>>) {
    let rows = valids[0].len();
    let mut sts = vec![TileSoftmax::default(); rows];
    let mut accs = vec![vec![0f32; hd]; rows];
    let qs: Vec<QueryRef<'_>> = (0..rows).map(|r| codes.row(r)).collect();
    for (parts, v) in tiles.iter().zip(valids) {
        let mut arefs: Vec<&mut [f32]> = accs.iter_mut().map(|a| a.as_mut_slice()).collect();
        tile_update_pairs_coded(features, &mut sts, &mut arefs, &qs, v, parts.tile(hd), 0.1);
    }
    (sts, accs)
}

/// Bit patterns of a run's states and accumulators.
fn bits(run: &(Vec<TileSoftmax>, Vec<Vec<f32>>)) -> Vec<u32> {
    let mut out = Vec::new();
    for (st, acc) in run.0.iter().zip(&run.1) {
        out.extend([st.max.to_bits(), st.sum.to_bits()]);
        out.extend(acc.iter().map(|x| x.to_bits()));
    }
    out
}

#[test]
fn every_path_gives_the_definitions_bits() {
    let detected = CpuFeatures::detect();
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(7);
    for hd in [64, 128] {
        for rows in [1, 2, 3, 5, 6, 7, 13] {
            let tiles: Vec<Parts> = (0..5).map(|_| Parts::random(&mut rng, hd)).collect();
            let (codes, _) = queries(&mut rng, rows, hd);
            // Full tiles, then each row's own count in the last (a causal diagonal).
            let valids: Vec<Vec<usize>> = (0..tiles.len())
                .map(|i| {
                    (0..rows)
                        .map(|_| {
                            if i + 1 < tiles.len() {
                                TILE
                            } else {
                                rng.gen_range(1..=TILE)
                            }
                        })
                        .collect()
                })
                .collect();
            let want = bits(&run(CpuFeatures::PORTABLE, hd, &tiles, &codes, &valids));
            let got = bits(&run(detected, hd, &tiles, &codes, &valids));
            assert_eq!(got, want, "hd {hd}, {rows} rows");
        }
    }
}

#[test]
fn a_rows_result_does_not_depend_on_the_rows_beside_it() {
    let features = CpuFeatures::detect();
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(11);
    let hd = 64;
    let tiles: Vec<Parts> = (0..3).map(|_| Parts::random(&mut rng, hd)).collect();
    let (codes, _) = queries(&mut rng, 9, hd);
    let valids: Vec<Vec<usize>> = (0..3)
        .map(|i| {
            (0..9)
                .map(|r| if i < 2 { TILE } else { 1 + 3 * r })
                .collect()
        })
        .collect();
    let together = run(features, hd, &tiles, &codes, &valids);
    for r in 0..9 {
        // The row's own prepared query, alone.
        let q = codes.row(r);
        let mut sts = vec![TileSoftmax::default()];
        let mut acc = vec![0f32; hd];
        for (parts, v) in tiles.iter().zip(&valids) {
            tile_update_pairs_coded(
                features,
                &mut sts,
                &mut [&mut acc[..]],
                &[q],
                &[v[r]],
                parts.tile(hd),
                0.1,
            );
        }
        assert_eq!(sts[0].max.to_bits(), together.0[r].max.to_bits(), "row {r}");
        assert_eq!(sts[0].sum.to_bits(), together.0[r].sum.to_bits(), "row {r}");
        let a: Vec<u32> = acc.iter().map(|x| x.to_bits()).collect();
        let b: Vec<u32> = together.1[r].iter().map(|x| x.to_bits()).collect();
        assert_eq!(a, b, "row {r}");
    }
}

#[test]
fn close_to_exact_attention_over_the_decoded_k() {
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(3);
    let hd = 64;
    let tiles: Vec<Parts> = (0..12).map(|_| Parts::random(&mut rng, hd)).collect();
    let (codes, qf) = queries(&mut rng, 4, hd);
    let valids: Vec<Vec<usize>> = (0..tiles.len())
        .map(|i| vec![if i + 1 < tiles.len() { TILE } else { 17 }; 4])
        .collect();
    let (sts, accs) = run(CpuFeatures::detect(), hd, &tiles, &codes, &valids);
    let scale = 0.1f32 as f64;
    for r in 0..4 {
        let mut s = Vec::new();
        let mut vals = Vec::new();
        for (parts, v) in tiles.iter().zip(&valids) {
            for t in 0..v[r] {
                let k = &parts.k[t * hd..(t + 1) * hd];
                s.push(
                    k.iter()
                        .zip(&qf[r])
                        .map(|(&a, &b)| a as f64 * b as f64)
                        .sum::<f64>()
                        * scale,
                );
                vals.push(&parts.v[t * hd..(t + 1) * hd]);
            }
        }
        let mx = s.iter().copied().fold(f64::NEG_INFINITY, f64::max);
        let w: Vec<f64> = s.iter().map(|x| (x - mx).exp()).collect();
        let l: f64 = w.iter().sum();
        for e in 0..hd {
            let want: f64 = w
                .iter()
                .zip(&vals)
                .map(|(w, v)| w * v[e] as f64)
                .sum::<f64>()
                / l;
            let got = accs[r][e] as f64 / sts[r].sum as f64;
            assert!((got - want).abs() < 1e-2, "row {r}, e {e}: {got} vs {want}");
        }
    }
}

#[test]
fn staged_int8_rows_are_the_keys_they_encode() {
    use crate::flash_tile_codes::CodedTile;
    use quant::{EncodedRows, KvCodecKind};
    let features = CpuFeatures::detect();
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(5);
    let hd = 64;
    let kind = KvCodecKind::Int8 { group: hd };
    let keys: Vec<f32> = (0..TILE * hd)
        .map(|_| rng.gen_range(-1.0f32..1.0))
        .collect();
    let mut bytes = Vec::new();
    for row in keys.chunks_exact(hd) {
        bytes.extend(quant::encode_row_to_vec(kind, row).unwrap());
    }
    let rows = EncodedRows::new(kind, hd, &bytes).unwrap();
    let mut decoded = vec![0f32; TILE * hd];
    quant::decode_rows(&rows, &mut decoded);
    let staged: Vec<CodedTile> = (0..2)
        .map(|h| {
            let mut t = CodedTile::default();
            t.reset(hd);
            t.load_rows(features, &rows.skip_rows(h * HALF).take_rows(HALF), 0);
            t
        })
        .collect();
    let parts = Parts::random(&mut rng, hd);
    let tile = CodedPairTile::new(
        hd,
        [CodedHalf::of(hd, &staged[0]), CodedHalf::of(hd, &staged[1])],
        [&parts.values[0][..], &parts.values[1][..]],
    );
    let (codes, qf) = queries(&mut rng, 1, hd);
    let mut st = [TileSoftmax::default()];
    let mut acc = vec![0f32; hd];
    tile_update_pairs_coded(
        features,
        &mut st,
        &mut [&mut acc[..]],
        &[codes.row(0)],
        &[TILE],
        tile,
        0.1,
    );
    let s: Vec<f64> = (0..TILE)
        .map(|t| {
            let k = &decoded[t * hd..(t + 1) * hd];
            k.iter()
                .zip(&qf[0])
                .map(|(&a, &b)| a as f64 * b as f64)
                .sum::<f64>()
                * 0.1f32 as f64
        })
        .collect();
    let mx = s.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    let w: Vec<f64> = s.iter().map(|x| (x - mx).exp()).collect();
    let l: f64 = w.iter().sum();
    for (e, a) in acc.iter().enumerate() {
        let want: f64 = (0..TILE)
            .map(|t| w[t] * parts.v[t * hd + e] as f64)
            .sum::<f64>()
            / l;
        let got = *a as f64 / st[0].sum as f64;
        assert!((got - want).abs() < 1e-2, "e {e}: {got} vs {want}");
    }
}

/// Tiles run in one call (`tiles_update_pairs_coded`, pipelined) give the bits of one call per
/// tile on the definition, for any number of rows and tiles, including runs whose maximum
/// rises tile after tile (each later tile's K scaled up).
#[test]
fn tiles_in_one_call_give_the_bits_of_one_call_per_tile() {
    let detected = CpuFeatures::detect();
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(21);
    for hd in [64, 128] {
        for rows in [1, 2, 3, 4, 6, 7, 13] {
            for (count, rising) in [(1, false), (2, false), (5, false), (6, true)] {
                let mut tiles: Vec<Parts> =
                    (0..count).map(|_| Parts::random(&mut rng, hd)).collect();
                if rising {
                    for (i, parts) in tiles.iter_mut().enumerate() {
                        for half in parts.params.iter_mut() {
                            for s in &mut half[..HALF] {
                                *s = f16::from_f32(s.to_f32() * (1 + 2 * i) as f32);
                            }
                        }
                    }
                }
                let (codes, _) = queries(&mut rng, rows, hd);
                let valids = vec![vec![TILE; rows]; count];
                let want = bits(&run(CpuFeatures::PORTABLE, hd, &tiles, &codes, &valids));
                for features in [CpuFeatures::PORTABLE, detected] {
                    let mut sts = vec![TileSoftmax::default(); rows];
                    let mut accs = vec![vec![0f32; hd]; rows];
                    let qs: Vec<QueryRef<'_>> = (0..rows).map(|r| codes.row(r)).collect();
                    let views: Vec<CodedPairTile<'_>> = tiles.iter().map(|p| p.tile(hd)).collect();
                    let mut arefs: Vec<&mut [f32]> =
                        accs.iter_mut().map(|a| a.as_mut_slice()).collect();
                    tiles_update_pairs_coded(features, &mut sts, &mut arefs, &qs, &views, 0.1);
                    assert_eq!(
                        bits(&(sts, accs)),
                        want,
                        "hd {hd}, {rows} rows, {count} tiles, rising {rising}"
                    );
                }
            }
        }
    }
}
