//! Token accounting (`usage`) and the `stream_options` request field that asks for it in a stream.
//! Owns only the shapes; never computes counts.

use serde::{Deserialize, Serialize};

/// `usage` of a completion. In a stream with `stream_options.include_usage`, it arrives in a final
/// chunk whose `choices` is empty.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Usage {
    pub prompt_tokens: u64,
    pub completion_tokens: u64,
    pub total_tokens: u64,
    /// Breakdown of the prompt; `None` when the server does not report it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prompt_tokens_details: Option<PromptTokensDetails>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub completion_tokens_details: Option<CompletionTokensDetails>,
}

impl Usage {
    /// Prompt tokens served from the server's prefix cache, when the server reports them.
    pub fn cached_tokens(&self) -> Option<u64> {
        self.prompt_tokens_details.as_ref()?.cached_tokens
    }
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct PromptTokensDetails {
    /// Prompt tokens whose KV came from the cache; `None` = not reported.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cached_tokens: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub audio_tokens: Option<u64>,
    /// agentkv extension: where and why the cached prefix ended before the prompt's last full
    /// block (absent when every full block was cached or caching is off).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cache_miss: Option<CacheMissDetails>,
    /// Prompt tokens this request newly wrote to the retained cache for its session (the name
    /// the openai SDK and the Agents SDK read; Anthropic's `cache_creation_input_tokens` is read
    /// too). Reported when the request asked for retention (`cache_control`,
    /// `prompt_cache_key`, …); prompt tokens only, never generated ones.
    #[serde(
        default,
        alias = "cache_creation_input_tokens",
        skip_serializing_if = "Option::is_none"
    )]
    pub cache_write_tokens: Option<u64>,
}

/// Why a prompt's cached prefix ended where it did.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct CacheMissDetails {
    /// `diverged` (a cached continuation of the same prefix differs from this token on),
    /// `evicted` (the next block was cached and has been evicted) or `uncached` (never cached).
    pub reason: String,
    /// Index of the first prompt token not served from the cache by that entry.
    pub at_token: u64,
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct CompletionTokensDetails {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reasoning_tokens: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub audio_tokens: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub accepted_prediction_tokens: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rejected_prediction_tokens: Option<u64>,
}

/// `stream_options` of a streaming request.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct StreamOptions {
    /// Ask for a final chunk carrying `usage`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub include_usage: Option<bool>,
}
