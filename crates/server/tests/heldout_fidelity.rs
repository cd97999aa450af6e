//! Fidelity on held-out prompts through the server: a third of the 52 prompts of
//! `crates/model/tests/data/heldout_greedy.jsonl` (llama.cpp's greedy tokens and logprobs; see
//! `gen_heldout_reference.py` there) sent to `/v1/completions` as token ids, greedy, with
//! logprobs. Checked: the generated text equals llama.cpp's stable greedy prefix on at least 90%
//! of them (the goal is 98%), and the mean |Δ logprob| of the chosen tokens stays within the bound below
//! (printed per prompt with `--nocapture`).
//! The prefix is compared up to its first end-of-generation token, which the server stops at and
//! leaves out of the text (before that cut, 6 of the 16 prompts "differed" by their `<|im_end|>`).

mod common;

use common::{call, model};
use engine::{Engine, EngineConfig, EngineCore};
use server::{AppState, ServerSettings};

#[derive(serde::Deserialize)]
struct Reference {
    id: String,
    prompt_ids: Vec<u32>,
    greedy_ids: Vec<u32>,
    top_logprobs: Vec<Position>,
    stable_len: usize,
}

#[derive(serde::Deserialize)]
struct Position {
    /// `None` where llama-server reported no probabilities (see the generator).
    logprob: Option<f32>,
}

/// Bound on the mean |Δ logprob| through the server with the engine computing prompt rows in
/// llama.cpp's tiled prefill arithmetic (`EngineConfig::llama_cpp_prefill`): a fifth of the
/// issue's goal of 0.005 (measured 0.00010 over 270 positions, 16/16 prefixes equal, every
/// prompt ≤ 0.00016; 0.00126 before decodes beyond 256 positions took llama.cpp's split-KV
/// chunks, `model::attention_split`).
const MEAN_BOUND_LLAMA_CPP_PREFILL: f64 = 0.001;
/// The same bound for the default arithmetic (today tiled attention and the block-sum float
/// order of packed matmuls, `model::PackedDef::BlockSum`, on every CPU): measured 0.0146 with
/// per-row attention and ggml's matmul order, 0.0359 with block-sum (AMD Zen 3), 0.0385 with
/// today's default (Intel Xeon, 2026-12-04) (16/16 prefixes equal every time;
/// llama.cpp's own AVX2 and AVX-512 builds differ by 0.04 on these prompts).
const MEAN_BOUND_DEFAULT: f64 = 0.05;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn heldout_prompts_match_llama_cpp_through_the_server() {
    check(true, MEAN_BOUND_LLAMA_CPP_PREFILL).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn heldout_prompts_stay_close_to_llama_cpp_in_the_default_arithmetic() {
    check(false, MEAN_BOUND_DEFAULT).await;
}

/// Sends the held-out prompts through a server whose engine has `llama_cpp_prefill` as given
/// and checks the stable prefixes and the mean |Δ logprob| against `mean_bound`.
async fn check(llama_cpp_prefill: bool, mean_bound: f64) {
    let refs: Vec<Reference> = include_str!("../../model/tests/data/heldout_greedy.jsonl")
        .lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| serde_json::from_str(l).expect("reference line"))
        .collect();
    // On: the engine computes prompt rows of 64+ token prompts in llama.cpp's tiled prefill
    // arithmetic, as llama-server does (`EngineConfig::llama_cpp_prefill`, off by default).
    let cfg = EngineConfig {
        num_blocks: 256,
        threads: 2,
        llama_cpp_prefill,
        ..EngineConfig::default()
    };
    let engine = Engine::start(EngineCore::new(model(), cfg).expect("engine"));
    let state = AppState::new(
        engine.handle(),
        model().frontend().clone(),
        ServerSettings::default(),
    )
    .expect("settings");
    let r = server::router(state);
    let m = model();
    let (mut abs_err, mut compared, mut equal, mut total) = (0.0f64, 0usize, 0usize, 0usize);
    let mut diverged = Vec::new();
    for rf in refs.iter().step_by(3).filter(|rf| rf.stable_len > 0) {
        total += 1;
        let body = serde_json::json!({"model": "agentkv", "prompt": rf.prompt_ids,
            "max_tokens": rf.stable_len, "temperature": 0, "logprobs": 1});
        let v = call(&r, "POST", "/v1/completions", None, &body.to_string()).await;
        assert_eq!(v.status, 200, "{}: {}", rf.id, v.body);
        let v = v.json();
        let choice = &v["choices"][0];
        // The server stops at an end-of-generation token and leaves it out of the text (and of
        // the logprobs): compare the stable prefix up to it.
        let tok = m.tokenizer();
        let stable = &rf.greedy_ids[..rf.stable_len];
        let cut = stable
            .iter()
            .position(|id| tok.eot_ids().contains(id) || tok.eos_id() == Some(*id))
            .unwrap_or(stable.len());
        let want = tok.decode(&stable[..cut], false).expect("decode");
        if choice["text"].as_str() == Some(want.as_str()) {
            equal += 1;
            let lps = choice["logprobs"]["token_logprobs"]
                .as_array()
                .expect("token_logprobs");
            let (mut err, mut k) = (0.0f64, 0usize);
            for (got, want) in lps.iter().zip(&rf.top_logprobs[..cut]) {
                if let Some(lp) = want.logprob {
                    err += (got.as_f64().expect("logprob") - f64::from(lp)).abs();
                    k += 1;
                }
            }
            eprintln!(
                "{:<12} prompt {:>3} tokens, {k:>2} positions; mean |Δ logprob| {:.5}",
                rf.id,
                rf.prompt_ids.len(),
                err / k.max(1) as f64
            );
            abs_err += err;
            compared += k;
        } else {
            diverged.push(format!("{}: {:?} vs {want:?}", rf.id, choice["text"]));
        }
    }
    let mean = abs_err / compared.max(1) as f64;
    eprintln!(
        "server held-out (llama_cpp_prefill {llama_cpp_prefill}): stable prefixes equal on {equal}/{total}; mean |Δ logprob| {mean:.5} over {compared} positions"
    );
    assert!(total >= 15);
    assert!(
        equal as f64 >= 0.9 * total as f64,
        "stable prefixes differ: {diverged:#?}"
    );
    assert!(
        mean <= mean_bound,
        "mean |Δ logprob| {mean:.5} > {mean_bound}"
    );
}
