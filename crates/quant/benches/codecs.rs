//! Criterion benchmarks of every codec at head_dim 64: encode, decode, dot (score) and axpy
//! (weighted value), each over a block of 256 rows so throughput reads as rows/s
//! (`elements` = rows). `cargo bench -p quant --bench codecs`. Measures only.

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use quant::{axpy_row, decode_row, encode_row, KvCodecKind, PreparedQuery};
use rand::{Rng, SeedableRng};
use std::hint::black_box;
use std::time::Duration;

const HEAD_DIM: usize = 64;
const NUM_ROWS: usize = 256;

fn codecs() -> Vec<KvCodecKind> {
    vec![
        KvCodecKind::F32,
        KvCodecKind::F16,
        KvCodecKind::Bf16,
        KvCodecKind::Fp8E4m3,
        KvCodecKind::Int8 { group: 64 },
        KvCodecKind::Int8 { group: 32 },
        KvCodecKind::Int4 { group: 64 },
        KvCodecKind::Int4 { group: 32 },
        KvCodecKind::Int8Hadamard { group: 64 },
        KvCodecKind::Int4Hadamard { group: 64 },
        KvCodecKind::Int4Hadamard { group: 32 },
    ]
}

fn bench_codecs(c: &mut Criterion) {
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(3);
    let rows: Vec<f32> = (0..NUM_ROWS * HEAD_DIM)
        .map(|_| rng.gen_range(-4.0f32..4.0))
        .collect(); // [NUM_ROWS, HEAD_DIM]
    let q: Vec<f32> = (0..HEAD_DIM).map(|_| rng.gen_range(-1.0f32..1.0)).collect();
    let mut group = c.benchmark_group("codecs_hd64");
    group.throughput(Throughput::Elements(NUM_ROWS as u64));
    group.measurement_time(Duration::from_secs(2));
    group.warm_up_time(Duration::from_millis(500));
    for kind in codecs() {
        let row_bytes = kind.bytes_per_row(HEAD_DIM);
        let mut encoded = vec![0u8; NUM_ROWS * row_bytes]; // [NUM_ROWS, row_bytes]
        for (x, out) in rows
            .chunks_exact(HEAD_DIM)
            .zip(encoded.chunks_exact_mut(row_bytes))
        {
            encode_row(kind, x, out).expect("valid shape");
        }
        let id = kind.id();
        group.bench_with_input(BenchmarkId::new("encode", &id), &kind, |b, &kind| {
            let mut out = vec![0u8; NUM_ROWS * row_bytes];
            b.iter(|| {
                for (x, o) in rows
                    .chunks_exact(HEAD_DIM)
                    .zip(out.chunks_exact_mut(row_bytes))
                {
                    encode_row(kind, black_box(x), o).expect("valid shape");
                }
                black_box(&out);
            })
        });
        group.bench_with_input(BenchmarkId::new("decode", &id), &kind, |b, &kind| {
            let mut out = vec![0f32; HEAD_DIM];
            b.iter(|| {
                for row in encoded.chunks_exact(row_bytes) {
                    decode_row(kind, black_box(row), &mut out).expect("valid shape");
                    black_box(&out);
                }
            })
        });
        group.bench_with_input(BenchmarkId::new("dot", &id), &kind, |b, &kind| {
            let prepared = PreparedQuery::new(kind, &q).expect("valid shape");
            b.iter(|| {
                let mut total = 0f32;
                for row in encoded.chunks_exact(row_bytes) {
                    total += prepared.dot(black_box(row));
                }
                black_box(total)
            })
        });
        group.bench_with_input(BenchmarkId::new("axpy", &id), &kind, |b, &kind| {
            let mut acc = vec![0f32; HEAD_DIM];
            b.iter(|| {
                for row in encoded.chunks_exact(row_bytes) {
                    axpy_row(kind, 0.001, black_box(row), &mut acc);
                }
                black_box(&acc);
            })
        });
    }
    group.finish();
}

criterion_group!(benches, bench_codecs);
criterion_main!(benches);
