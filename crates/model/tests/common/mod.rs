//! Helpers shared by the integration tests that run the real default model.

#![allow(dead_code)]

use std::sync::OnceLock;

use model::Model;

/// The default model, loaded once per test binary. Panics with instructions when it is missing:
/// these tests must not silently pass without the model.
pub fn model() -> &'static Model {
    static MODEL: OnceLock<Model> = OnceLock::new();
    MODEL.get_or_init(|| {
        let path = model::default_model_path();
        Model::load(&path).unwrap_or_else(|e| {
            panic!("cannot load the default model at {}: {e}\nRun `cargo run -p agentkv -- fetch-model` first.", path.display())
        })
    })
}

/// One line of llama.cpp's reference (`tests/data/greedy.jsonl`).
#[derive(serde::Deserialize, Debug, Clone)]
pub struct Reference {
    pub id: String,
    pub messages: Option<Vec<frontend::chat::ChatMessage>>,
    pub prompt: Option<String>,
    pub prompt_text: String,
    pub prompt_ids: Vec<u32>,
    pub greedy_ids: Vec<u32>,
    pub greedy_text: String,
    pub top_logprobs: Vec<RefPosition>,
    pub stable_len: usize,
}

#[derive(serde::Deserialize, Debug, Clone)]
pub struct RefPosition {
    pub id: u32,
    /// `None` where llama-server reported no probabilities (a token that leaves the text ending
    /// in an incomplete UTF-8 character; held-out set only).
    pub logprob: Option<f32>,
    pub top: Vec<RefCandidate>,
}

#[derive(serde::Deserialize, Debug, Clone)]
pub struct RefCandidate {
    pub id: u32,
    pub logprob: f32,
}

pub fn references() -> Vec<Reference> {
    references_from(include_str!("../data/greedy.jsonl"))
}

/// The references of a JSONL text in `greedy.jsonl`'s format.
pub fn references_from(text: &str) -> Vec<Reference> {
    text.lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| serde_json::from_str(l).expect("valid reference line"))
        .collect()
}

/// Logits after the prompt and after each of the first `n - 1` greedy tokens of `r` (`n` rows),
/// computed in the steps llama-server took, each in llama.cpp's arithmetic for a step of that
/// size (`AttnArith::for_step`, `MatmulArith::LlamaCpp`): the prompt in one step — for a model
/// with sliding-window layers ended 4 + 512 and 4 tokens before its end, where llama-server
/// saves context checkpoints (`checkpoint_offsets` in its `server-context.cpp`) — then one
/// greedy token per step.
pub fn llama_server_logits(
    m: &Model,
    pool: &model::ThreadPool,
    r: &Reference,
    n: usize,
) -> Vec<Vec<f32>> {
    use model::{ForwardBatch, Scratch};
    let mut all = r.prompt_ids.clone();
    all.extend_from_slice(&r.greedy_ids[..n.saturating_sub(1)]);
    let mut kv = m.contiguous_kv(1, all.len(), model::KvDtype::F16).unwrap();
    let mut scratch = Scratch::default();
    let p = r.prompt_ids.len();
    let mut cuts = vec![0];
    if m.config().sliding_window.is_some() {
        cuts.extend(
            [p.saturating_sub(4 + 512), p.saturating_sub(4)]
                .into_iter()
                .filter(|&c| c > 0),
        );
    }
    cuts.push(p);
    cuts.dedup();
    let prompt_steps: Vec<_> = cuts.windows(2).map(|w| w[0]..w[1]).collect();
    let logits_at = prompt_steps.len() - 1;
    let rows: Vec<Vec<f32>> = prompt_steps
        .into_iter()
        .chain((p..all.len()).map(|i| i..i + 1))
        .map(|range| {
            let positions: Vec<u32> = range.clone().map(|i| i as u32).collect();
            let slots = vec![model::SeqSlot(0); range.len()];
            let batch = ForwardBatch {
                tokens: &all[range.clone()],
                positions: &positions,
                slots: &slots,
                logits_for: &[range.len() - 1],
                numerics: model::Numerics::Explicit {
                    attention: model::AttnArith::for_step(range.len()),
                    matmul: model::MatmulArith::LlamaCpp,
                },
                rows: &model::RowKind::by_step(&slots),
            };
            let row = m
                .forward(pool, &batch, &mut kv, &mut scratch)
                .expect("forward");
            assert_eq!(row.len(), m.config().vocab_size);
            row
        })
        .collect();
    rows[logits_at..].iter().take(n).cloned().collect()
}

/// `n` greedy tokens after `prompt` in llama.cpp's arithmetic (`llama_cpp_prefill`, f16 K/V).
pub fn greedy_like_llama_cpp(
    m: &Model,
    pool: &model::ThreadPool,
    prompt: &[u32],
    n: usize,
) -> Vec<u32> {
    let opts = model::GenerateOptions {
        max_tokens: n,
        kv_dtype: model::KvDtype::F16,
        llama_cpp_prefill: true,
        ..Default::default()
    };
    let (out, _) = model::generate(m, pool, prompt, &opts, |_| true).expect("generation");
    out.iter().map(|t| t.id).collect()
}

/// One line of a tokenizer reference (`mistral_tokenize.jsonl`, `tekken_tokenize.jsonl`, written
/// by tests/data/gen_mistral_tokenizer.py against llama-server).
#[derive(serde::Deserialize)]
pub struct TokenizeCase {
    pub text: String,
    pub add_special: bool,
    pub parse_special: bool,
    pub ids: Vec<u32>,
    pub detokenized: String,
}

/// The mismatches between `tok` and llama.cpp on every case of a tokenizer reference: the ids
/// of `encode(text, add_special, parse_special)`, and `decode(ids)` against llama-server's
/// `/detokenize` passed through `expect_decoded` (which states how the two are meant to differ).
pub fn tokenize_mismatches(
    tok: &frontend::tokenizer::Tokenizer,
    reference: &str,
    expect_decoded: impl Fn(&[u32], &str) -> String,
) -> (usize, Vec<String>) {
    let cases: Vec<TokenizeCase> = reference
        .lines()
        .map(|l| serde_json::from_str(l).expect("valid reference line"))
        .collect();
    let mut wrong = Vec::new();
    for c in &cases {
        let ids = tok
            .encode(&c.text, c.add_special, c.parse_special)
            .expect("encode");
        if ids != c.ids {
            wrong.push(format!(
                "{:?} (bos {}, special {}): {ids:?} vs llama.cpp {:?}",
                c.text, c.add_special, c.parse_special, c.ids
            ));
        }
        let back = tok.decode(&c.ids, false).expect("decode");
        let want = expect_decoded(&c.ids, &c.detokenized);
        if back != want {
            wrong.push(format!("decode {:?}: {back:?} vs {want:?}", c.ids));
        }
    }
    (cases.len(), wrong)
}
