//! Prefill throughput of the K-quant integer matmul: Gemma 3 270M's K-quant layer shapes with
//! 512 tokens, one matrix at a time, best of 5 (GOP/s, one multiply-add = 2 ops). Measures only.
//!
//! `cargo run --release -p model --example kquant_prefill [q4_k|q6_k] [threads] [tokens]`

use std::time::Instant;

use gguf::GgmlType;
use kernels::{matmul, QMatrix, ThreadPool};
use rand::{Rng, SeedableRng};

fn main() {
    let mut args = std::env::args().skip(1);
    let ty = match args.next().as_deref() {
        Some("q6_k") => GgmlType::Q6K,
        Some("q5_k") => GgmlType::Q5K,
        _ => GgmlType::Q4K,
    };
    let threads: usize = args.next().map_or(1, |s| s.parse().expect("threads"));
    let toks: usize = args.next().map_or(512, |s| s.parse().expect("tokens"));
    let pool = ThreadPool::new(threads);
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(1);
    let mut total_ops = 0f64;
    let mut total_s = 0f64;
    // Gemma 3 270M's K-quant matrices: ffn_down and attn_output (hidden 640, ffn 2048, q 1024;
    // its other matrices have rows of 640, not a multiple of 256, and are Q5_0 / Q8_0).
    for (rows, row_len) in [(640usize, 2048usize), (640, 1024)] {
        let mut data = Vec::new();
        for _ in 0..rows {
            let x: Vec<f32> = (0..row_len).map(|_| rng.gen_range(-1.0f32..1.0)).collect();
            gguf::quantize::quantize_row(ty, &x, &mut data).expect("quantize");
        }
        let w = QMatrix {
            ty,
            num_rows: rows,
            row_len,
            data: &data,
            packed: None,
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
    println!("all: {:.1} GOP/s", total_ops / total_s / 1e9);
}
