//! Criterion benchmark of one attention tile step (16 K/V positions) for the 24 query rows a
//! prefill shares per tile (8 tokens × the 3 heads of the default model's GQA group, head size
//! 64), on each kernel this CPU runs: the row-major AVX2 triples (`tile_update_rows`, K widened
//! to f32), the AVX2 transposed kernel (`flash_tile_narrow`) and, with AVX-512, the 512-bit one
//! (`flash_tile_wide`). Throughput is query rows × tiles ("elements"). Measures only.
//!
//! `cargo bench -p model --bench attention_tiles`

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use kernels::flash_tile::{tile_update_rows, TileSoftmax, TILE_POSITIONS};
use kernels::flash_tile_narrow::NarrowTiles;
use kernels::flash_tile_transposed::{tile_update_transposed, TransposedTiles};
use kernels::flash_tile_wide::{transpose_keys, WideTiles};
use rand::{Rng, SeedableRng};
use std::time::Duration;

const ROWS: usize = 24;

fn bench_tiles(c: &mut Criterion) {
    let hd = 64;
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(5);
    let mut gen = |n: usize| -> Vec<f32> { (0..n).map(|_| rng.gen_range(-1.0f32..1.0)).collect() };
    let keys = gen(TILE_POSITIONS * hd);
    let vals = gen(TILE_POSITIONS * hd);
    let qs: Vec<Vec<f32>> = (0..ROWS).map(|_| gen(hd)).collect();
    let mut kt = vec![0f32; hd * TILE_POSITIONS];
    transpose_keys(&keys, TILE_POSITIONS, hd, &mut kt, 0);
    let mut accs = vec![vec![0f32; hd]; ROWS];
    let mut sts = vec![TileSoftmax::default(); ROWS];
    let valids = [TILE_POSITIONS; ROWS];
    let q_refs: Vec<&[f32]> = qs.iter().map(|q| &q[..]).collect();

    let mut group = c.benchmark_group("attention_tile_hd64_rows24");
    group
        .warm_up_time(Duration::from_millis(300))
        .measurement_time(Duration::from_secs(2))
        .sample_size(20)
        .throughput(Throughput::Elements(ROWS as u64));
    group.bench_function("rows3_rowmajor", |b| {
        b.iter(|| {
            for r in (0..ROWS).step_by(3) {
                let (s3, _) = sts[r..].split_first_chunk_mut::<3>().expect("3 rows");
                let (a, rest) = accs[r..].split_at_mut(1);
                let (b2, c2) = rest.split_at_mut(1);
                let mut acc3 = [&mut a[0][..], &mut b2[0][..], &mut c2[0][..]];
                let q3 = [q_refs[r], q_refs[r + 1], q_refs[r + 2]];
                tile_update_rows(s3, &mut acc3, &q3, &keys, &vals, TILE_POSITIONS, 0.125);
            }
        })
    });
    if let Some(proof) = NarrowTiles::here().map(TransposedTiles::Narrow) {
        group.bench_function("narrow_avx2_transposed", |b| {
            b.iter(|| {
                let mut acc_refs: Vec<&mut [f32]> = accs.iter_mut().map(|a| &mut a[..]).collect();
                tile_update_transposed(
                    proof,
                    &mut sts,
                    &mut acc_refs,
                    &q_refs,
                    &valids,
                    &kt,
                    &vals,
                    0.125,
                );
            })
        });
    }
    if let Some(proof) = WideTiles::here().map(TransposedTiles::Wide) {
        group.bench_function("wide_avx512_transposed", |b| {
            b.iter(|| {
                let mut acc_refs: Vec<&mut [f32]> = accs.iter_mut().map(|a| &mut a[..]).collect();
                tile_update_transposed(
                    proof,
                    &mut sts,
                    &mut acc_refs,
                    &q_refs,
                    &valids,
                    &kt,
                    &vals,
                    0.125,
                );
            })
        });
    }
    group.finish();
}

criterion_group!(benches, bench_tiles);
criterion_main!(benches);
