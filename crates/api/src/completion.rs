//! `/v1/completions` (legacy text completions): request, full response and streaming chunk.
//! Shapes only.

use serde::{Deserialize, Serialize};

use crate::usage::{StreamOptions, Usage};

/// `prompt`: one string, several strings, or pre-tokenised ids.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum Prompt {
    Text(String),
    Texts(Vec<String>),
    Tokens(Vec<u32>),
    TokenBatches(Vec<Vec<u32>>),
}

/// Body of `POST /v1/completions`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct CompletionRequest {
    pub model: String,
    pub prompt: Prompt,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_tokens: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub temperature: Option<f32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub top_p: Option<f32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub seed: Option<u64>,
    /// A string or a list of strings on the wire.
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        deserialize_with = "crate::lenient::string_or_list"
    )]
    pub stop: Option<Vec<String>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub echo: Option<bool>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stream: Option<bool>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stream_options: Option<StreamOptions>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub user: Option<String>,
    /// Number of choices.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub n: Option<u32>,
    /// Report this many alternatives per token (0..=5) and each token's log-probability.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub logprobs: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub presence_penalty: Option<f32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub frequency_penalty: Option<f32>,
    /// Token id (as a decimal string) → bias added to its logit before sampling (-100..=100).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub logit_bias: Option<crate::chat::LogitBias>,
    /// Structured output: free text, any JSON object, or JSON matching a schema.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub response_format: Option<crate::format::ResponseFormat>,
    /// Sampling extras, named as vLLM names them.
    #[serde(flatten)]
    pub extra: crate::extras::SamplingExtras,
}

/// Full response (`object: "text_completion"`); streaming chunks have the same shape.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct CompletionResponse {
    pub id: String,
    pub object: String,
    pub created: u64,
    pub model: String,
    #[serde(default)]
    pub choices: Vec<CompletionChoice>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub usage: Option<Usage>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub system_fingerprint: Option<String>,
}

/// A streaming `/v1/completions` event: the same shape as the full response.
pub type CompletionChunk = CompletionResponse;

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct CompletionChoice {
    pub index: u32,
    pub text: String,
    #[serde(default)]
    pub finish_reason: Option<String>,
    /// Not modelled; kept as raw JSON (usually `null`).
    #[serde(default)]
    pub logprobs: Option<serde_json::Value>,
}
