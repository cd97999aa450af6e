//! Streaming throughput of the batch-1 (decode) matmul on packed Q4_1 / Q8_0 weights: the
//! default model's layer shapes cycled over a weight set larger than the last-level cache (as
//! decode reads them), and one matrix kept cache-resident (the kernel's compute bound). Prints
//! GB/s of weights read per second on 1 and 2 threads. Measures only.
//!
//! `cargo run --release -p model --example packed_stream [MiB]` (`TOKENS=N`: a step of N tokens,
//! as N decodes batched together read the weights once; default 1; `ONE_MATRIX_ROWS=N`:
//! N×576 matrices instead of the layer's shapes).

#[path = "common/weights.rs"]
mod weights;

use std::time::Instant;

use gguf::GgmlType;
use kernels::{matmul, Packed32, QMatrix, ThreadPool};
use rand::{Rng, SeedableRng};
use weights::{random_weights, LAYER_SHAPES};

fn main() {
    let mib: usize = std::env::args()
        .nth(1)
        .map_or(96, |s| s.parse().expect("MiB"));
    let shapes = LAYER_SHAPES;
    // `ONE_MATRIX_ROWS=N`: stream N×576 matrices instead (a few large calls a pass: what the
    // kernel streams without the per-call hand-off of the layer's shapes).
    let one: Vec<(usize, usize)> = std::env::var("ONE_MATRIX_ROWS")
        .ok()
        .map(|v| vec![(v.parse().expect("ONE_MATRIX_ROWS"), 576)])
        .unwrap_or_default();
    let shapes: &[(usize, usize)] = if one.is_empty() { &shapes } else { &one };
    let max_rows = shapes.iter().map(|&(r, _)| r).max().unwrap_or(0);
    let ty = GgmlType::Q4_1;
    let mut mats = Vec::new();
    let mut total = 0usize;
    let mut seed = 0;
    while total < mib << 20 {
        for &(r, c) in shapes {
            seed += 1;
            let data = random_weights(ty, r, c, seed);
            let p = Packed32::pack(ty, r, c, &data).expect("pack");
            total += data.len();
            mats.push((data, p, r, c));
        }
    }
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(99);
    let tokens: usize = std::env::var("TOKENS")
        .ok()
        .map_or(1, |v| v.parse().expect("TOKENS"));
    let x: Vec<f32> = (0..1536 * tokens)
        .map(|_| rng.gen_range(-1.0f32..1.0))
        .collect();
    let mut y = vec![0f32; max_rows.max(1536) * tokens];
    for threads in [1, 2] {
        let pool = ThreadPool::new(threads);
        let bw = model::measure_read_bandwidth(&pool, 256 << 20, 8);
        println!(
            "{threads} thread(s): plain read {:.1} GB/s",
            bw.best() / 1e9
        );
        let run = |m: &(Vec<u8>, Packed32, usize, usize), y: &mut [f32]| {
            let w = QMatrix {
                ty,
                num_rows: m.2,
                row_len: m.3,
                data: &m.0,
                packed: Some(&m.1),
            };
            matmul(
                &pool,
                &w,
                &x[..m.3 * tokens],
                tokens,
                &mut y[..m.2 * tokens],
            )
            .expect("matmul");
        };
        // Streaming: every matrix once per pass.
        let mut best = f64::MAX;
        for _ in 0..8 {
            let t = Instant::now();
            for m in &mats {
                run(m, &mut y);
            }
            best = best.min(t.elapsed().as_secs_f64());
        }
        println!(
            "{threads} thread(s): streaming {} matrices, {:.1} MB: {:.2} ms per pass, {:.1} GB/s, {:.2} us per call",
            mats.len(),
            total as f64 / 1e6,
            best * 1e3,
            total as f64 / best / 1e9,
            best * 1e6 / mats.len() as f64
        );
        // Cache-resident: the first layer's matrices over and over.
        let layer = &mats[..shapes.len()];
        let bytes: usize = layer.iter().map(|m| m.0.len()).sum();
        let reps = 400;
        let mut best = f64::MAX;
        for _ in 0..5 {
            let t = Instant::now();
            for _ in 0..reps {
                for m in layer {
                    run(m, &mut y);
                }
            }
            best = best.min(t.elapsed().as_secs_f64());
        }
        println!(
            "{threads} thread(s): one layer ({:.2} MB) resident: {:.1} GB/s, {:.2} us per call",
            bytes as f64 / 1e6,
            (bytes * reps) as f64 / best / 1e9,
            best * 1e6 / (reps * layer.len()) as f64
        );
    }
}
