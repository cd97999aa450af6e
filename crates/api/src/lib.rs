//! OpenAI-compatible wire types for `/v1/chat/completions`, `/v1/completions` and
//! `/v1/responses`: requests, full responses, streaming chunks and events (`stream: true`,
//! server-sent events) and token usage.
//!
//! Serde only: this crate owns the JSON shapes, never HTTP, tokenisation or inference. Fields the
//! OpenAI API documents as optional are `Option` and skipped when absent, so a client can tell
//! "not reported" (e.g. `usage.prompt_tokens_details.cached_tokens`) from zero.
#![forbid(unsafe_code)]

pub mod admin;
pub mod cache_control;
pub mod chat;
pub mod completion;
pub mod error;
pub mod extras;
pub mod fields;
pub mod format;
mod lenient;
pub mod logprobs;
pub mod models;
pub mod responses;
pub mod tokenize;
pub mod tools;
pub mod usage;

pub use cache_control::{
    CacheControl, CacheFields, SessionBlocksByTier, SessionDeleted, SessionObject,
};
pub use chat::{
    ChatChoice, ChatChunkChoice, ChatCompletionChunk, ChatCompletionRequest,
    ChatCompletionResponse, ChatDelta, ChatMessage, FunctionName, LogitBias, NamedToolChoice, Role,
    ToolChoice, ToolChoiceMode,
};
pub use completion::{
    CompletionChoice, CompletionChunk, CompletionRequest, CompletionResponse, Prompt,
};
pub use error::{ErrorBody, ErrorDetail};
pub use extras::SamplingExtras;
pub use fields::KnownFields;
pub use format::{JsonSchemaFormat, ResponseFormat, StructuredOutputs};
pub use logprobs::{ChatLogprobs, CompletionLogprobs, TokenLogprob, TopLogprob};
pub use models::{ModelCard, ModelList};
pub use tools::{
    FunctionCall, FunctionCallDelta, FunctionDef, FunctionKind, Tool, ToolCall, ToolCallDelta,
};
pub use usage::{
    CacheMissDetails, CompletionTokensDetails, PromptTokensDetails, StreamOptions, Usage,
};

/// The `data:` payload that ends an OpenAI event stream.
pub const STREAM_DONE: &str = "[DONE]";
