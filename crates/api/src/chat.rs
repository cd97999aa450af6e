//! `/v1/chat/completions`: request, full response and streaming chunk. Shapes only; never
//! renders a chat template or talks HTTP.

use serde::{Deserialize, Serialize};

use crate::tools::FunctionKind;
use crate::usage::{StreamOptions, Usage};

/// Author of a chat message.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Role {
    System,
    /// Newer name for `system` used by some OpenAI models.
    Developer,
    User,
    Assistant,
    Tool,
}

/// One message of a conversation. `content` is plain text; the array-of-text-parts form is read
/// too (parts joined).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ChatMessage {
    pub role: Role,
    /// `None` only for assistant messages that carry tool calls.
    #[serde(default, deserialize_with = "crate::lenient::text_or_parts")]
    pub content: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// Required by OpenAI on `role: "tool"` messages.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_call_id: Option<String>,
    /// Tool calls of an assistant message.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_calls: Option<Vec<crate::tools::ToolCall>>,
}

impl ChatMessage {
    /// A text message without name or tool call id.
    pub fn new(role: Role, content: impl Into<String>) -> Self {
        ChatMessage {
            role,
            content: Some(content.into()),
            name: None,
            tool_call_id: None,
            tool_calls: None,
        }
    }
}

/// Body of `POST /v1/chat/completions`.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct ChatCompletionRequest {
    pub model: String,
    pub messages: Vec<ChatMessage>,
    /// Upper bound on generated tokens (the older `max_tokens` name, which every server accepts).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_tokens: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_completion_tokens: Option<u32>,
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
    pub stream: Option<bool>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stream_options: Option<StreamOptions>,
    /// End-user id; servers may use it as a tenant key.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub user: Option<String>,
    /// Number of choices.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub n: Option<u32>,
    /// Return the log-probability of each generated token.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub logprobs: Option<bool>,
    /// Alternatives reported per token (0..=20; needs `logprobs`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub top_logprobs: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub presence_penalty: Option<f32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub frequency_penalty: Option<f32>,
    /// Functions the model may call.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tools: Option<Vec<crate::tools::Tool>>,
    /// Whether and which tool the model must call.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_choice: Option<ToolChoice>,
    /// Whether the model may call several tools in one reply.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub parallel_tool_calls: Option<bool>,
    /// Token id (as a decimal string) → bias added to its logit before sampling (-100..=100).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub logit_bias: Option<LogitBias>,
    /// Structured output: free text, any JSON object, or JSON matching a schema.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub response_format: Option<crate::format::ResponseFormat>,
    /// Keep the completion for `GET /v1/chat/completions/{id}` (default false).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub store: Option<bool>,
    /// Up to 16 string pairs, kept with a stored completion (and filterable when listing).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub metadata: Option<std::collections::BTreeMap<String, String>>,
    /// Sampling extras, named as vLLM names them.
    #[serde(flatten)]
    pub extra: crate::extras::SamplingExtras,
    /// Session and retention fields (`prompt_cache_key`, `cache_control`, …).
    #[serde(flatten)]
    pub cache: crate::cache_control::CacheFields,
    /// Most tool calls in the reply: the Responses API's `max_tool_calls` carried into the chat
    /// request it becomes (not a chat field: never read from or written to JSON).
    #[serde(skip)]
    pub max_tool_calls: Option<u32>,
}

/// `logit_bias` on the wire: token ids as decimal strings (JSON object keys) → bias.
pub type LogitBias = std::collections::BTreeMap<String, f32>;

/// `tool_choice`: a mode, or one named function the model must call.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum ToolChoice {
    Mode(ToolChoiceMode),
    Named(NamedToolChoice),
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ToolChoiceMode {
    /// Never call a tool.
    None,
    /// The model decides.
    Auto,
    /// The model must call at least one tool.
    Required,
}

/// `{"type": "function", "function": {"name": "…"}}`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct NamedToolChoice {
    /// Always `"function"`.
    #[serde(rename = "type")]
    pub kind: FunctionKind,
    pub function: FunctionName,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct FunctionName {
    pub name: String,
}

/// Full (non-streaming) response.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ChatCompletionResponse {
    pub id: String,
    /// Always `"chat.completion"`.
    pub object: String,
    /// Unix seconds.
    pub created: u64,
    pub model: String,
    pub choices: Vec<ChatChoice>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub usage: Option<Usage>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub system_fingerprint: Option<String>,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ChatChoice {
    pub index: u32,
    pub message: ChatMessage,
    /// `"stop"`, `"length"`, …; `None` only while unfinished.
    #[serde(default)]
    pub finish_reason: Option<String>,
    /// Present when the request asked for `logprobs`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub logprobs: Option<crate::logprobs::ChatLogprobs>,
}

/// One server-sent event of a streaming response (`object: "chat.completion.chunk"`).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ChatCompletionChunk {
    pub id: String,
    pub object: String,
    pub created: u64,
    pub model: String,
    /// Empty in the final usage-only chunk.
    #[serde(default)]
    pub choices: Vec<ChatChunkChoice>,
    /// Present (and non-null) only in the final chunk when `include_usage` was asked.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub usage: Option<Usage>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub system_fingerprint: Option<String>,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ChatChunkChoice {
    pub index: u32,
    pub delta: ChatDelta,
    #[serde(default)]
    pub finish_reason: Option<String>,
    /// Present when the request asked for `logprobs`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub logprobs: Option<crate::logprobs::ChatLogprobs>,
}

/// Incremental message content: the first chunk usually carries only `role`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ChatDelta {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub role: Option<Role>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub content: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_calls: Option<Vec<crate::tools::ToolCallDelta>>,
}
