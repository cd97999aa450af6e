//! Quantized KV on the real default model: perplexity close to f16 KV, deterministic output.

mod common;

use common::model;
use model::{generate, GenerateOptions};
use model::{perplexity, PerplexityOptions};
use model::{KvDtype, ThreadPool};

fn ppl(kv_dtype: KvDtype, chunks: usize) -> f64 {
    let m = model();
    let pool = ThreadPool::new(2);
    let tokens = m
        .tokenizer()
        .encode(
            include_str!("data/corpus.txt"),
            m.tokenizer().add_bos(),
            false,
        )
        .unwrap();
    let opts = PerplexityOptions {
        matmul_arith: model::MatmulArith::LlamaCpp,
        ctx: 512,
        use_bos: m.tokenizer().add_bos(),
        kv_dtype,
        max_chunks: Some(chunks),
        kl_reference: None,
        restored_through: None,
    };
    perplexity(m, &pool, &tokens, &opts, |_, _, _| {})
        .unwrap()
        .ppl
}

#[test]
fn int8_kv_perplexity_is_within_one_percent_of_f16() {
    // A deliberately loose correctness bound; the measured figures are in docs/history/benchmarks-log.md.
    let base = ppl(KvDtype::F16, 4);
    let int8 = ppl(KvDtype::parse("int8").unwrap(), 4);
    let rel = (int8 - base).abs() / base;
    eprintln!("f16 {base:.4} int8 {int8:.4} ({:+.3}%)", rel * 100.0);
    assert!(rel < 0.01, "int8 KV perplexity {int8:.4} vs f16 {base:.4}");
}

/// Hadamard-rotated int4 K (`int4h`) on the first 4 windows. Measured (deterministic, int4
/// codec version 2 with its clipping search; 2026-12-04 with the i8 query of coded K): f16
/// 16.1565, int4 17.2686 (+6.9%), `k=int4h,v=int4` 16.9131 (+4.7%), `int4h` 16.8997 (+4.6%).
/// The bounds leave a wide margin for platform-level rounding differences, never for chance.
#[test]
fn rotated_int4_k_beats_plain_int4_and_stays_near_f16() {
    let base = ppl(KvDtype::F16, 4);
    let int4 = ppl(KvDtype::parse("int4").unwrap(), 4);
    let rot_k = ppl(KvDtype::parse("k=int4h,v=int4").unwrap(), 4);
    let rot_kv = ppl(KvDtype::parse("int4h").unwrap(), 4);
    let pct = |x: f64| (x / base - 1.0) * 100.0;
    eprintln!(
        "f16 {base:.4} int4 {int4:.4} ({:+.2}%) k=int4h,v=int4 {rot_k:.4} ({:+.2}%) int4h {rot_kv:.4} ({:+.2}%)",
        pct(int4),
        pct(rot_k),
        pct(rot_kv)
    );
    // Rotating K removes a third of int4's loss (measured 4.7% vs 6.9%).
    assert!(
        pct(rot_k) < 6.5,
        "k=int4h,v=int4 {rot_k:.4} vs f16 {base:.4}"
    );
    assert!(
        pct(rot_k) < 0.7 * pct(int4),
        "rotation must clearly beat plain int4: {rot_k:.4} vs {int4:.4}"
    );
    assert!(rot_kv < int4, "int4h {rot_kv:.4} vs int4 {int4:.4}");
}

/// Per-channel 4-bit K (`int4c`, KIVI-style scales per block and channel) with int4 V, the best
/// 4-bit setting, on the first 4 windows. Measured (deterministic; 2026-12-04, AVX-512 Xeon):
/// f16 16.1565, `k=int4c,v=int4` 16.2109 (+0.34%),
/// `k=int4h,v=int4` 16.9131 (+4.7%). Over the whole text it is +0.71% (issue #18's goal: ≤ +1%);
/// the bound below holds that goal on these windows with room for platform rounding only.
#[test]
fn per_channel_int4_k_stays_within_one_percent_of_f16() {
    let base = ppl(KvDtype::F16, 4);
    let int4c = ppl(KvDtype::parse("k=int4c,v=int4").unwrap(), 4);
    let rot_k = ppl(KvDtype::parse("k=int4h,v=int4").unwrap(), 4);
    let pct = |x: f64| (x / base - 1.0) * 100.0;
    eprintln!(
        "f16 {base:.4} k=int4c,v=int4 {int4c:.4} ({:+.2}%) k=int4h,v=int4 {rot_k:.4} ({:+.2}%)",
        pct(int4c),
        pct(rot_k)
    );
    assert!(
        pct(int4c) < 1.0,
        "k=int4c,v=int4 {int4c:.4} vs f16 {base:.4}"
    );
    assert!(
        int4c < rot_k,
        "per-channel K must beat rotated per-token K: {int4c:.4} vs {rot_k:.4}"
    );
}

#[test]
fn every_codec_generates_deterministically() {
    let m = model();
    let pool = ThreadPool::new(2);
    let prompt = &common::references()[0].prompt_ids;
    for spec in [
        "int8",
        "int4",
        "fp8",
        "bf16",
        "k=int8,v=bf16",
        "k=int8,v=int4",
        "int4h",
        "k=int4h,v=int4",
        "k=int4c,v=int4",
    ] {
        let kv_dtype = KvDtype::parse(spec).unwrap();
        let opts = GenerateOptions {
            max_tokens: 8,
            kv_dtype,
            ..Default::default()
        };
        let run = || {
            let (out, _) = generate(m, &pool, prompt, &opts, |_| true).unwrap();
            out.iter()
                .map(|t| (t.id, t.logprob.to_bits()))
                .collect::<Vec<_>>()
        };
        let first = run();
        assert_eq!(first, run(), "{spec}: same output twice");
        // Coarse sanity: the first token of "What is the capital of France?" stays "The".
        // Not for plain per-token int4 (+9% perplexity): its first token sits near a tie that
        // float-rounding changes of the attention arithmetic flip (the tiled regime over
        // encoded K/V matches the exact one within 1e-5 per row, `attention_tiled::tests`).
        if spec != "int4" {
            assert_eq!(first[0].0, 504, "{spec}");
        }
    }
}
