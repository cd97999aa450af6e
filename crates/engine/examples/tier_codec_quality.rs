//! Benchmark (not a test): what a lossy tier codec costs in perplexity. Each 512-token window of
//! a text is evaluated as a prompt whose first half was restored from a tier keeping K/V in the
//! codec (prefill the first half in f16, round-trip its K/V through the codec, compute the
//! second half — every scored token — over it); `f16` is the exact baseline of the same two-step
//! evaluation. The same as `agentkv perplexity --tier-codec CODEC`, for several codecs in one
//! process.
//!
//! `cargo run --release -p engine --example tier_codec_quality [-- <text file> <windows> <threads>]`

use model::KvDtype;
use model::{perplexity, PerplexityOptions};

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let file = args
        .get(1)
        .cloned()
        .unwrap_or_else(|| "crates/model/tests/data/corpus.txt".into());
    let windows: Option<usize> = args.get(2).and_then(|s| s.parse().ok());
    let threads: usize = args.get(3).and_then(|s| s.parse().ok()).unwrap_or(2);
    let model = model::Model::load(&model::default_model_path()).expect("model");
    let pool = model::ThreadPool::new(threads);
    let text = std::fs::read_to_string(&file).expect("text");
    let use_bos = model.tokenizer().add_bos();
    let tokens = model
        .tokenizer()
        .encode(&text, use_bos, false)
        .expect("tokens");
    let c = model.config();
    let f16_bytes = KvDtype::F16.bytes_per_token(c.num_layers, c.num_kv_heads, c.head_dim);
    println!(
        "{file}: {} tokens, windows {windows:?}, {threads} threads",
        tokens.len()
    );
    let mut base = None;
    for name in ["f16", "int8", "k=int8,v=int4", "k=int4c,v=int4", "int4"] {
        let through = KvDtype::parse(name).expect("codec");
        let opts = PerplexityOptions {
            matmul_arith: model::MatmulArith::LlamaCpp,
            ctx: 512,
            use_bos,
            kv_dtype: KvDtype::F16,
            max_chunks: windows,
            kl_reference: None,
            restored_through: Some(through),
        };
        let r = perplexity(&model, &pool, &tokens, &opts, |_, _, _| {}).expect("perplexity");
        let b = *base.get_or_insert(r.ppl);
        let bytes = through.bytes_per_token(c.num_layers, c.num_kv_heads, c.head_dim);
        println!(
            "tier codec {name:<16} {bytes:>6} B/token ({:.3}× f16)  ppl {:.4} ± {:.4}  vs exact {:+.2}%  ({} scored)",
            bytes as f64 / f16_bytes as f64,
            r.ppl,
            r.ppl_stderr,
            (r.ppl / b - 1.0) * 100.0,
            r.num_scored,
        );
    }
}
