//! Request fields beyond the OpenAI API, named as vLLM names them (flattened into the chat and
//! completion requests). Shape only; the server validates the values.

use serde::{Deserialize, Serialize};

/// vLLM's sampling extras and its structured-output fields.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct SamplingExtras {
    /// Keep only the k most likely tokens (0 or -1 disables).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub top_k: Option<i64>,
    /// Drop tokens below `min_p` × the top probability.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub min_p: Option<f32>,
    /// > 1 discourages tokens already in the prompt or output.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub repetition_penalty: Option<f32>,
    /// Keep generating past end-of-turn tokens.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ignore_eos: Option<bool>,
    /// End-of-turn is suppressed until this many tokens were generated.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub min_tokens: Option<u32>,
    /// Extra token ids that end generation.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stop_token_ids: Option<Vec<u32>>,
    /// Narrows prefix-cache sharing within the caller's tenant (never widens it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cache_salt: Option<String>,
    /// Structured output, vLLM's older names: a JSON Schema (object or JSON text)…
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub guided_json: Option<serde_json::Value>,
    /// …one of these strings…
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub guided_choice: Option<Vec<String>>,
    /// …a regular expression…
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub guided_regex: Option<String>,
    /// …or a grammar (llguidance's Lark-like syntax).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub guided_grammar: Option<String>,
    /// Structured output, vLLM's current name.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub structured_outputs: Option<crate::format::StructuredOutputs>,
    /// A grammar, as llama.cpp's server names the field.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub grammar: Option<String>,
}
