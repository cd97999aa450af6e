//! What sampling one token costs on a vocabulary the size of the default model's (49,152), one
//! thread: greedy (with and without logprobs), temperature 1 (the OpenAI default),
//! temperature with top-p and with top-k, and temperature with top logprobs. A decode step samples every running sequence's token
//! after the forward pass, so this cost adds to every sequence's step. Measures only.
//!
//! `cargo run --release -p model --example sampler_cost [VOCAB] [DRAWS]` prints microseconds
//! per sampled token (the median of 5 runs of `DRAWS` draws, default 200).

use std::time::Instant;

use model::sampler::{Sampler, SamplingParams};

fn main() {
    let args: Vec<usize> = std::env::args()
        .skip(1)
        .map(|a| a.parse().expect("a count"))
        .collect();
    let vocab = args.first().copied().unwrap_or(49_152);
    let draws = args.get(1).copied().unwrap_or(200);
    // Logits shaped like a language model's: most tokens far below a few dozen candidates.
    let mut seed = 0x2545_F491_4F6C_DD1Du64;
    let mut rnd = move || {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        (seed >> 40) as f32 / (1u64 << 24) as f32
    };
    let logits: Vec<f32> = (0..vocab)
        .map(|_| {
            let u = rnd();
            -12.0 + 8.0 * u + if rnd() < 0.002 { 14.0 * rnd() } else { 0.0 }
        })
        .collect();
    let cases: Vec<(&str, SamplingParams)> = vec![
        (
            "greedy",
            SamplingParams {
                temperature: 0.0,
                ..Default::default()
            },
        ),
        (
            "greedy, logprobs",
            SamplingParams {
                temperature: 0.0,
                logprobs: true,
                ..Default::default()
            },
        ),
        (
            "temperature 1",
            SamplingParams {
                temperature: 1.0,
                ..Default::default()
            },
        ),
        (
            "temperature 0.7, top_p 0.9",
            SamplingParams {
                temperature: 0.7,
                top_p: 0.9,
                ..Default::default()
            },
        ),
        (
            "temperature 0.7, top_k 40",
            SamplingParams {
                temperature: 0.7,
                top_k: 40,
                ..Default::default()
            },
        ),
        (
            "temperature 1, top_logprobs 5",
            SamplingParams {
                temperature: 1.0,
                top_logprobs: 5,
                ..Default::default()
            },
        ),
    ];
    println!("vocabulary {vocab}, {draws} draws a run, median of 5 runs");
    for (name, params) in cases {
        let mut runs: Vec<f64> = (0..5)
            .map(|r| {
                let mut s = Sampler::new(SamplingParams {
                    seed: Some(r),
                    ..params.clone()
                });
                let t = Instant::now();
                let mut check = 0u64;
                for _ in 0..draws {
                    check += s.sample(&logits, &[]).expect("a token").id as u64;
                }
                std::hint::black_box(check);
                t.elapsed().as_secs_f64() * 1e6 / draws as f64
            })
            .collect();
        runs.sort_by(f64::total_cmp);
        println!("{name:>32}: {:8.1} us a token", runs[2]);
    }
}
