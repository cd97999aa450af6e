//! Attention alone at depth, one thread: one layer's attention (`model::attention_layer`, the
//! forward pass's own plan and kernels in the engine's numerics) over a cache of `DEPTH`
//! positions, for a decode step (one token) and a prefill step (a run of tokens), per KV codec,
//! on the default model's shape (`models/`, or `$AGENTKV_MODEL`).
//!
//! `cargo run --release -p model --example attn_depth -- [DEPTH] [PREFILL_TOKENS] [REPS] [CODEC…]`
//! prints microseconds per layer for each step (the median of `REPS`). `ATTN_LAYERS=N` fills N
//! layers and runs them in turn, as a forward pass does (K/V then come from memory, not cache);
//! `ATTN_THREADS=T` runs on T threads.

use std::time::Instant;

use model::{
    attention_layer, default_model_path, ContiguousKv, ForwardBatch, KvDtype, KvStore, Model,
    Numerics, RowKind, Scratch, SeqSlot, ThreadPool,
};
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
    let model =
        Model::load(&default_model_path()).expect("the default model (agentkv fetch-model)");
    let cfg = model.config();
    let (kv_heads, hd, qd) = (cfg.num_kv_heads, cfg.head_dim, cfg.q_dim());
    let env = |name: &str| {
        std::env::var(name)
            .ok()
            .and_then(|v| v.parse::<usize>().ok())
    };
    let layers = env("ATTN_LAYERS").unwrap_or(1).clamp(1, cfg.num_layers);
    let pool = ThreadPool::new(env("ATTN_THREADS").unwrap_or(1).max(1));
    let n = depth + prefill;
    println!(
        "{} query heads, {kv_heads} KV heads, head_dim {hd}, depth {depth}, {layers} layer(s), {} thread(s)",
        cfg.num_heads,
        pool.num_threads()
    );
    for spec in &codecs {
        let dtype = KvDtype::parse(spec).expect("codec");
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(1);
        let mut kv = ContiguousKv::new(1, layers, kv_heads, hd, n, dtype).expect("cache");
        for (l, p) in (0..layers).flat_map(|l| (0..n).map(move |p| (l, p))) {
            let mut k: Vec<f32> = (0..kv_heads * hd)
                .map(|_| rng.gen_range(-1.0f32..1.0))
                .collect();
            k[5] += 4.0;
            let v: Vec<f32> = (0..kv_heads * hd)
                .map(|_| rng.gen_range(-1.0f32..1.0))
                .collect();
            kv.write(l, SeqSlot(0), p, &k, &v).expect("write");
        }
        kv.begin_step();
        let q: Vec<f32> = (0..prefill * qd)
            .map(|_| rng.gen_range(-1.0f32..1.0))
            .collect();
        let mut line = format!("{spec:>16}:");
        let mut scratch = Scratch::default();
        for (what, tokens) in [("decode", 1usize), ("prefill", prefill)] {
            let positions: Vec<u32> = (depth as u32..(depth + tokens) as u32).collect();
            let slots = vec![SeqSlot(0); tokens];
            let kinds = vec![
                if tokens == 1 {
                    RowKind::Generated
                } else {
                    RowKind::Prompt
                };
                tokens
            ];
            let ids = vec![0u32; tokens];
            let batch = ForwardBatch {
                tokens: &ids,
                positions: &positions,
                slots: &slots,
                logits_for: &[],
                numerics: Numerics::Engine,
                rows: &kinds,
            };
            let mut att = vec![0f32; tokens * qd];
            let inner = if tokens == 1 { 20 } else { 1 };
            let mut times = Vec::new();
            for _ in 0..reps {
                let t0 = Instant::now();
                for _ in 0..inner {
                    for layer in 0..layers {
                        attention_layer(
                            cfg,
                            &pool,
                            &batch,
                            &kv,
                            layer,
                            &q[..tokens * qd],
                            &mut att,
                            &mut scratch,
                        )
                        .expect("attention");
                    }
                }
                times.push(t0.elapsed().as_secs_f64() * 1e6 / (inner * layers) as f64);
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
