//! Attention alone at depth, one thread: the tiled regime over a cache of `DEPTH` positions for a
//! decode step (one token, the 3 query heads of each GQA group) and a prefill step (a run of
//! tokens), per KV codec, on the default model's shape (9 query heads, 3 KV heads, head_dim 64).
//!
//! `cargo run --release -p model --example attn_depth -- [DEPTH] [PREFILL_TOKENS] [REPS] [CODEC…]`
//! prints microseconds per layer for each step (the median of `REPS`).

use std::time::Instant;

use kernels::par::DisjointRows;
use model::attention::AttnArith;
use model::attention_plan::{plan, AttnShape};
use model::attention_tiled::{run_tile_task, TileInputs, TileOutputs, TileScratch};
use model::kv_contiguous::ContiguousKv;
use model::{KvDtype, KvStore, SeqSlot};
use rand::{Rng, SeedableRng};

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let depth: usize = args.first().map_or(4096, |s| s.parse().expect("DEPTH"));
    let prefill: usize = args
        .get(1)
        .map_or(64, |s| s.parse().expect("PREFILL_TOKENS"));
    let reps: usize = args.get(2).map_or(5, |s| s.parse().expect("REPS"));
    let codecs: Vec<String> = if args.len() > 3 {
        args[3..].to_vec()
    } else {
        ["f16", "int8", "k=int4c,v=int4"].map(String::from).to_vec()
    };
    let (heads, kv_heads, hd) = (9usize, 3usize, 64usize);
    let n = depth + prefill;
    for spec in &codecs {
        let dtype = KvDtype::parse(spec).expect("codec");
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(1);
        let mut kv = ContiguousKv::new(1, 1, kv_heads, hd, n, dtype).expect("cache");
        for p in 0..n {
            let mut k: Vec<f32> = (0..kv_heads * hd)
                .map(|_| rng.gen_range(-1.0f32..1.0))
                .collect();
            k[5] += 4.0;
            let v: Vec<f32> = (0..kv_heads * hd)
                .map(|_| rng.gen_range(-1.0f32..1.0))
                .collect();
            kv.write(0, SeqSlot(0), p, &k, &v).expect("write");
        }
        kv.begin_step();
        let q: Vec<f32> = (0..prefill * heads * hd)
            .map(|_| rng.gen_range(-1.0f32..1.0))
            .collect();
        let shape = AttnShape {
            num_heads: heads,
            num_kv_heads: kv_heads,
            head_dim: hd,
            kv_is_f16: dtype == KvDtype::F16,
            kv_encoded: dtype != KvDtype::F16,
            arith: AttnArith::Row,
        };
        let mut line = format!("{spec:>16}:");
        for (what, tokens) in [("decode", 1usize), ("prefill", prefill)] {
            let positions: Vec<u32> = (depth as u32..(depth + tokens) as u32).collect();
            let slots = vec![SeqSlot(0); tokens];
            let arith = if tokens >= 64 {
                AttnArith::Prefill
            } else {
                AttnArith::Row
            };
            let inp = TileInputs {
                kv: &kv,
                layer: 0,
                q: &q[..tokens * heads * hd],
                slots: &slots,
                positions: &positions,
                num_heads: heads,
                num_kv_heads: kv_heads,
                head_dim: hd,
                scale: 0.125,
                arith,
            };
            let p = plan(&AttnShape { arith, ..shape }, &slots, &positions);
            let mut times = Vec::new();
            let mut scratch = TileScratch::default();
            let mut att = vec![0f32; tokens * heads * hd];
            let mut partials = vec![0f32; p.partial_rows * (hd + 2)];
            let inner = if tokens == 1 { 20 } else { 1 };
            for _ in 0..reps {
                let t0 = Instant::now();
                for _ in 0..inner {
                    let rows = DisjointRows::new(&mut att, hd);
                    let outputs = TileOutputs::new(&p, &mut partials, hd, &rows);
                    for &task in &p.tasks {
                        // SAFETY: tasks run one after the other: no row has two writers.
                        unsafe { run_tile_task(&inp, &p, task, &outputs, &mut scratch) };
                    }
                }
                times.push(t0.elapsed().as_secs_f64() * 1e6 / inner as f64);
            }
            times.sort_by(f64::total_cmp);
            let checksum: f64 = att.iter().map(|&x| x as f64).sum();
            line += &format!(
                "  {what} {tokens} tok {:9.1} us ({:7.2} us/token) [sum {checksum:.6}]",
                times[reps / 2],
                times[reps / 2] / tokens as f64
            );
        }
        println!("{line}");
    }
}
