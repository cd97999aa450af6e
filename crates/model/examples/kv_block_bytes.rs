//! What a storage tier pays to serialise and restore one paged block of K/V, per codec: the
//! block's rows of every layer and KV head (`KvRows::rows_bytes`, then `load_rows_bytes`) on
//! the default model's shape (30 layers × 3 KV heads × 16 rows of 64 values) — bf16 rows kept
//! in the pair layout are converted to row-major bf16 rows and back, other codecs copied.
//!
//! `cargo run --release -p model --example kv_block_bytes -- [BLOCKS] [CODEC…]` prints the
//! microseconds per block (best of 5 sweeps over `BLOCKS` blocks, default 256).

use std::time::Instant;

use model::{KvDtype, KvRows};

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let blocks: usize = args.first().map_or(256, |s| s.parse().expect("BLOCKS"));
    let codecs: Vec<String> = if args.len() > 1 {
        args[1..].to_vec()
    } else {
        ["f16", "bf16", "int8"].map(String::from).to_vec()
    };
    let (layers, heads, hd, bs) = (30, 3, 64, 16);
    let runs = layers * heads;
    for spec in &codecs {
        let dtype = KvDtype::parse(spec).expect("codec");
        let mut rows = KvRows::new(dtype, hd, blocks * runs * bs).expect("rows");
        for r in 0..rows.num_rows() {
            let k: Vec<f32> = (0..hd)
                .map(|e| ((r * 31 + e) % 97) as f32 / 48.0 - 1.0)
                .collect();
            let v: Vec<f32> = k.iter().map(|x| -0.5 * x).collect();
            rows.write(r, &k, &v).expect("write");
        }
        let (mut save, mut load) = (f64::INFINITY, f64::INFINITY);
        let mut bytes = 0;
        for _ in 0..5 {
            let t0 = Instant::now();
            let saved: Vec<Vec<u8>> = (0..blocks * runs)
                .map(|run| rows.rows_bytes(run * bs, bs))
                .collect();
            save = save.min(t0.elapsed().as_secs_f64());
            let t0 = Instant::now();
            for (run, b) in saved.iter().enumerate() {
                rows.load_rows_bytes(run * bs, bs, b);
            }
            load = load.min(t0.elapsed().as_secs_f64());
            bytes = saved.iter().map(Vec::len).sum::<usize>() / blocks;
        }
        println!(
            "{spec:>6}: {bytes} bytes a block; save {:.1} us, load {:.1} us a block{}",
            save * 1e6 / blocks as f64,
            load * 1e6 / blocks as f64,
            if rows.is_pair_layout() {
                " (pair layout)"
            } else {
                ""
            }
        );
    }
}
