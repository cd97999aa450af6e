//! The bf16-pair tile step's rate alone, one thread: `ROWS` query rows (a prefill tile's GQA
//! group) swept over `TILES` staged 32-position tiles of random K/V, as `attention_tiled` runs
//! a segment, reported in GFLOP/s (`4 · head_dim` per row and position: `q·Kᵀ` and `p·V`, a
//! multiply-add counted as two) beside this thread's `vdpbf16ps` peak (`kernels::peak`).
//!
//! `cargo run --release -p kernels --example pair_tile_rate -- [ROWS] [TILES] [REPS]`
//!
//! `CODED=1` also runs the int8-scored pair step (`kernels::flash_tile_pairs_coded`: `q·Kᵀ` on
//! `vpdpbusd` from u8 K codes, the same bf16 V) over random codes beside the pair step, three
//! alternating rounds, reporting ns per row and tile for each and their ratio.
//!
//! `STREAM_TILES=N` also sweeps `N` tiles laid out as a KV store keeps them, far larger than
//! the caches (`N = 16000`: 128 MB), once per repetition: read in place in the pair layout
//! (`kernels::pair_layout`, each tile two groups of consecutive K and V words), and staged
//! from row-major bf16 rows first (`PairTile::stage_half`, as attention read bf16 K/V before
//! the layout), reporting ns and GB/s of K/V per tile for each — what a decode's few rows pay
//! when K/V come from memory.

use std::time::Instant;

use half::bf16;
use kernels::flash_tile::TileSoftmax;
use kernels::flash_tile_pairs::{query_pairs, tile_update_pairs, PairTile, PAIR_TILE_POSITIONS};
use kernels::CpuFeatures;

fn main() {
    let args: Vec<usize> = std::env::args()
        .skip(1)
        .map(|a| a.parse().expect("a count"))
        .collect();
    let rows = args.first().copied().unwrap_or(48);
    let tiles = args.get(1).copied().unwrap_or(16);
    let reps = args.get(2).copied().unwrap_or(200);
    let hd = 64;
    let mut seed = 0x9E37_79B9_7F4A_7C15u64;
    let mut rnd = move || {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        (seed >> 40) as f32 / (1u64 << 24) as f32 - 0.5
    };
    let staged: Vec<PairTile> = (0..tiles)
        .map(|_| {
            let k: Vec<bf16> = (0..PAIR_TILE_POSITIONS * hd)
                .map(|_| bf16::from_f32(rnd() * 4.0))
                .collect();
            let v: Vec<bf16> = (0..PAIR_TILE_POSITIONS * hd)
                .map(|_| bf16::from_f32(rnd()))
                .collect();
            let mut t = PairTile::new(hd);
            t.stage(&k, &v, PAIR_TILE_POSITIONS);
            t
        })
        .collect();
    let qs: Vec<Vec<u32>> = (0..rows)
        .map(|_| {
            let q: Vec<f32> = (0..hd).map(|_| rnd() * 4.0).collect();
            let mut p = vec![0u32; hd / 2];
            query_pairs(&q, &mut p);
            p
        })
        .collect();
    let features = kernels::cpu_features();
    let valids = vec![PAIR_TILE_POSITIONS; rows];
    let qrefs: Vec<&[u32]> = qs.iter().map(|q| q.as_slice()).collect();
    let mut accs = vec![vec![0f32; hd]; rows];
    let mut best = f64::INFINITY;
    let mut check = 0f32;
    for _ in 0..reps {
        let mut sts = vec![TileSoftmax::default(); rows];
        accs.iter_mut().for_each(|a| a.fill(0.0));
        let t0 = Instant::now();
        for tile in &staged {
            let mut arefs: Vec<&mut [f32]> = accs.iter_mut().map(|a| a.as_mut_slice()).collect();
            tile_update_pairs(features, &mut sts, &mut arefs, &qrefs, &valids, tile, 0.125);
        }
        best = best.min(t0.elapsed().as_secs_f64());
        check += sts.iter().map(|s| s.sum).sum::<f32>();
    }
    let flop = (4 * hd * PAIR_TILE_POSITIONS * tiles * rows) as f64;
    let pool = kernels::ThreadPool::new(1);
    let peak =
        kernels::peak::measure_peak(&pool, kernels::peak::PeakOp::Bf16Dot, 10).map(|p| p.best());
    println!(
        "{rows} rows x {tiles} tiles, hd {hd}: {:.1} GFLOP/s = {:.0}% of the bf16 pair-dot peak {:.1} ({:.1} ns per row and tile) [check {check:.3}]",
        flop / best / 1e9,
        100.0 * flop / best / peak.unwrap_or(f64::NAN),
        peak.unwrap_or(f64::NAN) / 1e9,
        best * 1e9 / (tiles * rows) as f64
    );
    if std::env::var("CODED").is_ok() {
        coded(&staged, &qrefs, &valids, reps, &mut rnd);
    }
    let _ = CpuFeatures::PORTABLE;
    if let Some(n) = std::env::var("STREAM_TILES")
        .ok()
        .and_then(|v| v.parse::<usize>().ok())
    {
        stream(n, &qrefs, &valids, reps.min(8));
    }
}

/// `n` tiles from memory, in place and staged (module doc), best of `reps` sweeps each.
fn stream(n: usize, qs: &[&[u32]], valids: &[usize], reps: usize) {
    use kernels::pair_layout::{group_words, write_row, PairHalf, PairTileRef};
    let hd = 64;
    let rows_of = |salt: usize| -> Vec<bf16> {
        (0..n * PAIR_TILE_POSITIONS * hd)
            .map(|i| bf16::from_f32(((i * salt) % 1000) as f32 / 500.0 - 1.0))
            .collect()
    };
    let (k, v) = (rows_of(7919), rows_of(104_729));
    let w = group_words(hd);
    let (mut gk, mut gv) = (vec![0u32; 2 * n * w], vec![0u32; 2 * n * w]);
    for r in 0..n * PAIR_TILE_POSITIONS {
        let (g, t) = (r / 16, r % 16);
        let row = r * hd..(r + 1) * hd;
        write_row(
            &mut gk[g * w..(g + 1) * w],
            &mut gv[g * w..(g + 1) * w],
            t,
            &k[row.clone()],
            &v[row],
        );
    }
    let features = kernels::cpu_features();
    let rows = qs.len();
    let mut staged = PairTile::new(hd);
    for in_place in [true, false] {
        let mut best = f64::INFINITY;
        let mut check = 0f32;
        for _ in 0..reps {
            let mut sts = vec![TileSoftmax::default(); rows];
            let mut accs = vec![vec![0f32; hd]; rows];
            let t0 = Instant::now();
            for t in 0..n {
                let mut arefs: Vec<&mut [f32]> =
                    accs.iter_mut().map(|a| a.as_mut_slice()).collect();
                if in_place {
                    let g = |g: usize| {
                        PairHalf::new(hd, &gk[g * w..(g + 1) * w], &gv[g * w..(g + 1) * w])
                    };
                    let tile = PairTileRef::new(hd, g(2 * t), g(2 * t + 1));
                    tile_update_pairs(features, &mut sts, &mut arefs, qs, valids, tile, 0.125);
                } else {
                    let o = t * PAIR_TILE_POSITIONS * hd;
                    for h in 0..2 {
                        let rows = o + h * 16 * hd..o + (h + 1) * 16 * hd;
                        staged.stage_half(h, &k[rows.clone()], &v[rows], 16);
                    }
                    tile_update_pairs(features, &mut sts, &mut arefs, qs, valids, &staged, 0.125);
                }
            }
            best = best.min(t0.elapsed().as_secs_f64());
            check += sts.iter().map(|s| s.sum).sum::<f32>();
        }
        let bytes = (n * PAIR_TILE_POSITIONS * hd * 4) as f64;
        println!(
            "{rows} rows over {n} tiles from memory ({:.0} MB), {}: {:.1} ns per tile, {:.1} GB/s of K/V [check {check:.3}]",
            bytes / 1e6,
            if in_place { "read in place" } else { "staged from rows" },
            best * 1e9 / n as f64,
            bytes / best / 1e9
        );
    }
}

/// The int8-scored step over random K codes (and the staged tiles' V) against the pair step
/// over the staged tiles, alternating, best of `reps` sweeps each (module doc).
fn coded(
    staged: &[PairTile],
    qs: &[&[u32]],
    valids: &[usize],
    reps: usize,
    rnd: &mut impl FnMut() -> f32,
) {
    use kernels::flash_tile_codes::QueryCodes;
    use kernels::flash_tile_pairs_coded::{tile_update_pairs_coded, CodedHalf, CodedPairTile};
    let hd = 64;
    let rows = qs.len();
    let features = kernels::cpu_features();
    let codes: Vec<[Vec<u32>; 2]> = staged
        .iter()
        .map(|_| {
            [0, 1].map(|_| {
                (0..hd / 4 * 16)
                    .map(|_| (rnd().to_bits() >> 3) ^ 0x5a5a_5a5a)
                    .collect()
            })
        })
        .collect();
    // 16 f16 scales, then 16 offsets.
    let kparams: [half::f16; 32] = std::array::from_fn(|i| {
        half::f16::from_f32(if i < 16 {
            0.01 + rnd().abs() * 0.01
        } else {
            -1.0 + rnd() * 0.1
        })
    });
    let mut qcodes = QueryCodes::default();
    qcodes.reset(rows, hd);
    for r in 0..rows {
        let q: Vec<f32> = (0..hd).map(|_| rnd() * 4.0).collect();
        qcodes.prepare_rows(features, r, &q);
    }
    let qrows: Vec<_> = (0..rows).map(|r| qcodes.row(r)).collect();
    let tiles = staged.len();
    for round in 0..3 {
        let (mut coded_best, mut pair_best) = (f64::INFINITY, f64::INFINITY);
        let mut check = 0f32;
        for _ in 0..reps {
            let mut sts = vec![TileSoftmax::default(); rows];
            let mut accs = vec![vec![0f32; hd]; rows];
            let t0 = Instant::now();
            for (tile, kt) in staged.iter().zip(&codes) {
                let keys = [0, 1].map(|h| CodedHalf::new(hd, &kt[h], &kparams));
                let values = [tile.half(0).values(), tile.half(1).values()];
                let mut arefs: Vec<&mut [f32]> =
                    accs.iter_mut().map(|a| a.as_mut_slice()).collect();
                tile_update_pairs_coded(
                    features,
                    &mut sts,
                    &mut arefs,
                    &qrows,
                    valids,
                    CodedPairTile::new(hd, keys, values),
                    0.125,
                );
            }
            coded_best = coded_best.min(t0.elapsed().as_secs_f64());
            check += sts.iter().map(|s| s.sum).sum::<f32>();
            let mut sts = vec![TileSoftmax::default(); rows];
            let t0 = Instant::now();
            for tile in staged {
                let mut arefs: Vec<&mut [f32]> =
                    accs.iter_mut().map(|a| a.as_mut_slice()).collect();
                tile_update_pairs(features, &mut sts, &mut arefs, qs, valids, tile, 0.125);
            }
            pair_best = pair_best.min(t0.elapsed().as_secs_f64());
            check += sts.iter().map(|s| s.sum).sum::<f32>();
        }
        let per = |t: f64| t * 1e9 / (tiles * rows) as f64;
        println!(
            "round {round}: int8-scored step {:.1} ns, pair step {:.1} ns per row and tile ({:.2}x) [check {check:.3}]",
            per(coded_best),
            per(pair_best),
            pair_best / coded_best
        );
    }
}
