//! Token log-probabilities in responses: the chat shape (`logprobs.content[]`) and the legacy
//! completions shape (`tokens`, `token_logprobs`, `top_logprobs`, `text_offset`). Shape only.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

/// `choices[i].logprobs` of a chat completion (or chunk).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct ChatLogprobs {
    pub content: Vec<TokenLogprob>,
}

/// One generated token with its log-probability and the most likely alternatives.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct TokenLogprob {
    pub token: String,
    pub logprob: f32,
    /// UTF-8 bytes of the token (a token may hold part of a character).
    #[serde(default)]
    pub bytes: Option<Vec<u8>>,
    #[serde(default)]
    pub top_logprobs: Vec<TopLogprob>,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct TopLogprob {
    pub token: String,
    pub logprob: f32,
    #[serde(default)]
    pub bytes: Option<Vec<u8>>,
}

/// `choices[i].logprobs` of a legacy text completion.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct CompletionLogprobs {
    pub tokens: Vec<String>,
    pub token_logprobs: Vec<f32>,
    /// Per token: alternative token text → log-probability.
    pub top_logprobs: Vec<BTreeMap<String, f32>>,
    /// Character offset of each token in the returned text.
    pub text_offset: Vec<u64>,
}
