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
    pub messages: Option<Vec<model::chat::ChatMessage>>,
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
