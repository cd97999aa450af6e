//! The top-level JSON field names each request type reads, so a server can tell an unknown or
//! unsupported field from a known one before it deserialises (serde's `deny_unknown_fields` does
//! not combine with the flattened vLLM extras). Names only; what to do with an unknown field is
//! the server's policy.

use crate::cache_control::CacheFields;
use crate::chat::ChatCompletionRequest;
use crate::completion::CompletionRequest;
use crate::extras::SamplingExtras;
use crate::responses::ResponsesRequest;

/// A request body whose top-level fields are exactly [`KnownFields::FIELDS`] (the tests in
/// `tests/server_wire.rs` serialise a fully populated value and compare).
pub trait KnownFields {
    const FIELDS: &'static [&'static str];
    /// Fields OpenAI defines for this request that change nothing this server computes (billing
    /// tiers, reasoning effort of reasoning models, metadata): accepted and ignored, and the
    /// server says so (a response header and the log line). Some only with a value that asks
    /// for nothing (`modalities: ["text"]`, `background: false`), the server decides which.
    const IGNORED: &'static [&'static str] = &[];

    fn is_known(name: &str) -> bool {
        Self::FIELDS.contains(&name)
    }
}

impl KnownFields for SamplingExtras {
    const FIELDS: &'static [&'static str] = &[
        "top_k",
        "min_p",
        "repetition_penalty",
        "ignore_eos",
        "min_tokens",
        "stop_token_ids",
        "cache_salt",
        "guided_json",
        "guided_choice",
        "guided_regex",
        "guided_grammar",
        "structured_outputs",
        "grammar",
    ];
}

impl KnownFields for ChatCompletionRequest {
    const FIELDS: &'static [&'static str] = &[
        "model",
        "messages",
        "max_tokens",
        "max_completion_tokens",
        "temperature",
        "top_p",
        "seed",
        "stop",
        "stream",
        "stream_options",
        "user",
        "n",
        "logprobs",
        "top_logprobs",
        "presence_penalty",
        "frequency_penalty",
        "tools",
        "tool_choice",
        "parallel_tool_calls",
        "logit_bias",
        "response_format",
        "store",
        "metadata",
    ];
    const IGNORED: &'static [&'static str] = &[
        "service_tier",
        "reasoning_effort",
        "verbosity",
        "modalities",
        "prediction",
        "safety_identifier",
    ];

    fn is_known(name: &str) -> bool {
        Self::FIELDS.contains(&name)
            || SamplingExtras::is_known(name)
            || CacheFields::is_known(name)
    }
}

impl KnownFields for CompletionRequest {
    const FIELDS: &'static [&'static str] = &[
        "model",
        "prompt",
        "max_tokens",
        "temperature",
        "top_p",
        "seed",
        "stop",
        "echo",
        "stream",
        "stream_options",
        "user",
        "n",
        "logprobs",
        "presence_penalty",
        "frequency_penalty",
        "logit_bias",
        "response_format",
    ];

    fn is_known(name: &str) -> bool {
        Self::FIELDS.contains(&name) || SamplingExtras::is_known(name)
    }
}

impl KnownFields for ResponsesRequest {
    const FIELDS: &'static [&'static str] = &[
        "model",
        "input",
        "instructions",
        "tools",
        "tool_choice",
        "parallel_tool_calls",
        "text",
        "max_output_tokens",
        "temperature",
        "top_p",
        "stream",
        "store",
        "previous_response_id",
        "metadata",
        "include",
        "user",
        "truncation",
        "max_tool_calls",
    ];
    const IGNORED: &'static [&'static str] = &[
        "reasoning",
        "background",
        "stream_options",
        "service_tier",
        "safety_identifier",
        "top_logprobs",
    ];

    fn is_known(name: &str) -> bool {
        Self::FIELDS.contains(&name) || CacheFields::is_known(name)
    }
}

/// The cache and session fields every generation request reads (`cache_control.rs`).
impl KnownFields for CacheFields {
    const FIELDS: &'static [&'static str] = &[
        "prompt_cache_key",
        "session_id",
        "prompt_cache_retention",
        "cache_control",
        "priority",
    ];
}
