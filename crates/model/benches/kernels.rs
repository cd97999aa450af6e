//! Criterion benchmarks of the matmul kernels on the default model's shapes.
//!
//! `cargo bench -p model --bench kernels`. Shapes (`rows x row_len`, i.e. out × in):
//! Q4_1 1536×576 (576→1536, ffn up/gate), Q4_1 576×1536 (1536→576, ffn down) and Q8_0 49152×576
//! (576→49152, output head), at 1 and 64 tokens, on 1 and 2 threads. Decode (1 token) reports
//! weight bytes streamed per second; prefill (64 tokens) reports multiply-adds ×2 as "elements"
//! (so `Gelem/s` = GFLOP/s). Weights are random blocks with sane f16 scales. Measures only.

#[path = "../examples/common/weights.rs"]
mod weights;

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use gguf::GgmlType;
use kernels::{matmul, QMatrix, ThreadPool};
use rand::{Rng, SeedableRng};
use std::time::Duration;

fn bench_matmul(c: &mut Criterion) {
    let shapes = [
        ("q4_1_576to1536", GgmlType::Q4_1, 1536usize, 576usize),
        ("q4_1_1536to576", GgmlType::Q4_1, 576, 1536),
        ("q8_0_576to49152", GgmlType::Q8_0, 49152, 576),
    ];
    let pools = [ThreadPool::new(1), ThreadPool::new(2)];
    for (name, ty, num_rows, row_len) in shapes {
        let data = weights::random_weights(ty, num_rows, row_len, 1);
        let w = QMatrix {
            ty,
            num_rows,
            row_len,
            data: &data,
            packed: None,
        };
        let mut group = c.benchmark_group(format!("matmul_{name}"));
        group
            .warm_up_time(Duration::from_millis(500))
            .measurement_time(Duration::from_secs(2))
            .sample_size(20);
        for num_tokens in [1usize, 64] {
            let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(2);
            let x: Vec<f32> = (0..num_tokens * row_len)
                .map(|_| rng.gen_range(-1.0f32..1.0))
                .collect();
            let mut y = vec![0f32; num_tokens * num_rows];
            if num_tokens == 1 {
                group.throughput(Throughput::Bytes(data.len() as u64));
            } else {
                group.throughput(Throughput::Elements(
                    (2 * num_rows * row_len * num_tokens) as u64,
                ));
            }
            for pool in &pools {
                let id = BenchmarkId::new(
                    format!("tokens{num_tokens}"),
                    format!("threads{}", pool.num_threads()),
                );
                group.bench_function(id, |b| {
                    b.iter(|| matmul(pool, &w, &x, num_tokens, &mut y).expect("valid shapes"))
                });
            }
        }
        group.finish();
    }
}

criterion_group!(benches, bench_matmul);
criterion_main!(benches);
