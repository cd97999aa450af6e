//! Fidelity on held-out prompts through the model API: 52 prompts no kernel was tuned on (short
//! and long, single- and multi-turn chat, tool-call-shaped turns, non-English text, code), with
//! llama.cpp's greedy tokens and logprobs in tests/data/heldout_greedy.jsonl (written by
//! tests/data/gen_heldout_reference.py against llama-server). Each prompt is generated the way
//! llama-server runs it: the prompt prefilled in one step (llama.cpp's tiled attention kernel
//! from 64 tokens on, `AttnArith::for_step`, `GenerateOptions::llama_cpp_prefill`), then greedy decoding one token per step.
//!
//! Checked: the stable greedy prefix (tokens before llama.cpp's first top-2 gap below 0.1 nats)
//! is reproduced on at least `MIN_SHARE` of the prompts, and the mean |Δ logprob| of the chosen tokens
//! over the positions where both runs still agree stays within the bound below.

mod common;

use common::{model, references_from, Reference};
use model::{generate, GenerateOptions};
use model::{KvDtype, ThreadPool};

fn references() -> Vec<Reference> {
    references_from(include_str!("data/heldout_greedy.jsonl"))
}

#[test]
fn heldout_prompts_match_llama_cpp() {
    let m = model();
    let pool = ThreadPool::new(2);
    let refs = references();
    assert!(
        refs.len() >= 50,
        "the held-out set has {} prompts",
        refs.len()
    );
    let (mut abs_err, mut compared, mut stable_equal) = (0.0f64, 0usize, 0usize);
    let mut diverged = Vec::new();
    let mut off = Vec::new();
    for r in &refs {
        let ids = m
            .tokenizer()
            .encode(&r.prompt_text, false, true)
            .expect("encode");
        assert_eq!(ids, r.prompt_ids, "{}: prompt ids", r.id);
        let opts = GenerateOptions {
            max_tokens: r.greedy_ids.len(),
            kv_dtype: KvDtype::F16,
            llama_cpp_prefill: true,
            ..Default::default()
        };
        let (out, _) = generate(m, &pool, &r.prompt_ids, &opts, |_| true).expect("generation");
        let got: Vec<u32> = out.iter().map(|t| t.id).collect();
        let n = r.stable_len.min(got.len());
        if got[..n] == r.greedy_ids[..n] && got.len() >= r.stable_len {
            stable_equal += 1;
        } else {
            diverged.push(format!(
                "{}: {got:?} vs {:?}",
                r.id,
                &r.greedy_ids[..r.stable_len]
            ));
        }
        // Logprobs of the chosen tokens while both runs are on the same tokens.
        let mut err = 0.0f64;
        let mut k = 0;
        for (j, (t, want)) in out.iter().zip(&r.top_logprobs).enumerate() {
            // Positions llama-server did not report (see the generator) are compared by id only.
            if let Some(lp) = want.logprob {
                err += f64::from((t.logprob - lp).abs());
                k += 1;
            }
            if t.id != r.greedy_ids[j] {
                break;
            }
        }
        abs_err += err;
        compared += k;
        if err / k.max(1) as f64 > PROMPT_BOUND {
            off.push(format!("{}: {:.5}", r.id, err / k.max(1) as f64));
        }
        eprintln!(
            "{:<12} prompt {:>3} tokens, stable {:>2}; mean |Δ logprob| {:.5}",
            r.id,
            r.prompt_ids.len(),
            r.stable_len,
            err / k.max(1) as f64
        );
    }
    let mean = abs_err / compared.max(1) as f64;
    let share = stable_equal as f64 / refs.len() as f64;
    eprintln!(
        "held-out: stable prefixes equal on {stable_equal}/{} prompts; mean |Δ logprob| {mean:.5} over {compared} positions",
        refs.len()
    );
    assert!(share >= MIN_SHARE, "stable prefixes differ: {diverged:#?}");
    assert!(
        mean <= MEAN_BOUND,
        "mean |Δ logprob| {mean:.5} > {MEAN_BOUND}"
    );
    assert!(off.is_empty(), "prompts above {PROMPT_BOUND}: {off:#?}");
}

/// The goals: stable greedy prefixes equal on at least 98% of the prompts and a mean
/// |Δ logprob| of at most 0.005 (reached 2026-12-02 against llama.cpp's AVX2 build; see
/// docs/history/benchmarks-log.md "Held-out fidelity").
const MIN_SHARE: f64 = 0.98;
const MEAN_BOUND: f64 = 0.005;
/// Every prompt's own mean |Δ logprob|: measured ≤ 0.00016 on each of the 52 (2026-12-04, mean
/// 0.00010). The 386-token `l-doc-x3` was at 0.030 while decodes beyond 256 positions took one
/// f32 accumulator instead of llama.cpp's split-KV chunks (`model::attention_split`).
const PROMPT_BOUND: f64 = 0.001;
