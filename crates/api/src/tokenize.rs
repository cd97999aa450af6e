//! `POST /tokenize` and `POST /detokenize` bodies, in vLLM's shapes. Shape only; never tokenises.

use serde::{Deserialize, Serialize};

use crate::chat::ChatMessage;

/// Either `prompt` (raw text) or `messages` (rendered with the chat template first).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct TokenizeRequest {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub model: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prompt: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub messages: Option<Vec<ChatMessage>>,
    /// Add BOS/EOS as the model says (default true for `prompt`, false for `messages`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub add_special_tokens: Option<bool>,
    /// With `messages`: end where the assistant's reply begins (default true).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub add_generation_prompt: Option<bool>,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct TokenizeResponse {
    pub count: u64,
    pub max_model_len: u64,
    pub tokens: Vec<u32>,
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct DetokenizeRequest {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub model: Option<String>,
    pub tokens: Vec<u32>,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct DetokenizeResponse {
    pub prompt: String,
}
