//! Prefill throughput of the packed 32-element block matmul: SmolLM2-135M's layer shapes with
//! 512 tokens, one matrix at a time, best of 5 (GOP/s, one multiply-add = 2 ops). Compare the
//! prefill tiles with the 2-token tiles they replace by running it again with
//! `AGENTKV_PACKED_PREFILL=0`. Measures only.
//!
//! `cargo run --release -p model --example packed_prefill [q5_0|q4_0|q4_1|q8_0] [threads] [tokens]`

use std::time::Instant;

use gguf::GgmlType;
use kernels::{matmul, Packed32, QMatrix, ThreadPool};
use rand::{Rng, SeedableRng};

fn main() {
    let mut args = std::env::args().skip(1);
    let ty = match args.next().as_deref() {
        Some("q4_0") => GgmlType::Q4_0,
        Some("q4_1") => GgmlType::Q4_1,
        Some("q8_0") => GgmlType::Q8_0,
        _ => GgmlType::Q5_0,
    };
    let threads: usize = args.next().map_or(1, |s| s.parse().expect("threads"));
    let toks: usize = args.next().map_or(512, |s| s.parse().expect("tokens"));
    let pool = ThreadPool::new(threads);
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(1);
    let mut total_ops = 0f64;
    let mut total_s = 0f64;
    for (rows, row_len) in [(576usize, 576usize), (192, 576), (1536, 576), (576, 1536)] {
        let mut data = Vec::new();
        for _ in 0..rows {
            let x: Vec<f32> = (0..row_len).map(|_| rng.gen_range(-1.0f32..1.0)).collect();
            gguf::quantize::quantize_row(ty, &x, &mut data).expect("quantize");
        }
        let p = Packed32::pack(ty, rows, row_len, &data).expect("pack");
        let w = QMatrix {
            ty,
            num_rows: rows,
            row_len,
            data: &data,
            packed: Some(&p),
        };
        let x: Vec<f32> = (0..toks * row_len)
            .map(|_| rng.gen_range(-1.0f32..1.0))
            .collect();
        let mut y = vec![0f32; toks * rows];
        let mut best = f64::MAX;
        for _ in 0..5 {
            let t = Instant::now();
            matmul(&pool, &w, &x, toks, &mut y).expect("matmul");
            best = best.min(t.elapsed().as_secs_f64());
        }
        let ops = 2.0 * (rows * row_len * toks) as f64;
        total_ops += ops;
        total_s += best;
        println!(
            "{ty:?} {rows}x{row_len} {toks} tok {threads} thr: {:.2} ms, {:.1} GOP/s",
            best * 1e3,
            ops / best / 1e9
        );
    }
    println!("all four: {:.1} GOP/s", total_ops / total_s / 1e9);
}
