//! `/v1/responses` (OpenAI's Responses API): the request with its input items, the response
//! object with its output items, the typed streaming events, and the deletion answer. Shapes
//! only; turning items into a prompt and keeping conversations belong to the server.

use serde::de::Error as _;
use serde::{Deserialize, Deserializer, Serialize};
use serde_json::Value;

use crate::chat::ToolChoiceMode;
use crate::format::JsonSchemaFormat;

/// The Responses API's `truncation`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Truncation {
    Auto,
    Disabled,
}

/// Body of `POST /v1/responses`.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct ResponsesRequest {
    pub model: String,
    /// A user message as text, or a list of items.
    pub input: ResponseInput,
    /// A system message for this response only (not carried over by `previous_response_id`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub instructions: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tools: Option<Vec<ResponseTool>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_choice: Option<ResponseToolChoice>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub parallel_tool_calls: Option<bool>,
    /// Output format (`text.format`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub text: Option<TextConfig>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_output_tokens: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub temperature: Option<f32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub top_p: Option<f32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stream: Option<bool>,
    /// Keep the response (and its conversation) for `GET` and `previous_response_id`
    /// (default true).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub store: Option<bool>,
    /// Continue the conversation of that stored response.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub previous_response_id: Option<String>,
    /// Up to 16 string pairs, echoed in the response.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub metadata: Option<std::collections::BTreeMap<String, String>>,
    /// Extra output to include; none is supported, so only an empty list is accepted.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub include: Option<Vec<String>>,
    /// `auto`: when the conversation does not fit the context, the oldest turns are dropped
    /// (after the instructions and any leading system message, never the newest input) until
    /// it does; `disabled` (the default): a 400 `context_length_exceeded`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub truncation: Option<Truncation>,
    /// Most tool calls in the reply (at most the server's `max_tool_calls_per_turn`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_tool_calls: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub user: Option<String>,
    /// Session and retention fields (`prompt_cache_key`, `cache_control`, …).
    #[serde(flatten)]
    pub cache: crate::cache_control::CacheFields,
}

/// `input`: text (one user message) or items.
#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(untagged)]
pub enum ResponseInput {
    Text(String),
    Items(Vec<InputItem>),
}

impl<'de> Deserialize<'de> for ResponseInput {
    // By hand rather than untagged, so an error inside an item keeps its path (`input[2]`).
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> serde::de::Visitor<'de> for V {
            type Value = ResponseInput;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("a string or a list of input items")
            }
            fn visit_str<E: serde::de::Error>(self, s: &str) -> Result<ResponseInput, E> {
                Ok(ResponseInput::Text(s.to_string()))
            }
            fn visit_seq<A: serde::de::SeqAccess<'de>>(
                self,
                seq: A,
            ) -> Result<ResponseInput, A::Error> {
                Vec::<InputItem>::deserialize(serde::de::value::SeqAccessDeserializer::new(seq))
                    .map(ResponseInput::Items)
            }
        }
        d.deserialize_any(V)
    }
}

impl Default for ResponseInput {
    fn default() -> Self {
        ResponseInput::Text(String::new())
    }
}

/// One input item. A message may omit `type` (the "easy" input message).
#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum InputItem {
    Message(InputMessage),
    FunctionCall(FunctionCallItem),
    FunctionCallOutput(FunctionCallOutputItem),
}

impl<'de> Deserialize<'de> for InputItem {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let mut v = serde_json::Map::<String, Value>::deserialize(d)?;
        let kind = match v.remove("type") {
            None | Some(Value::Null) => "message".to_string(),
            Some(Value::String(s)) => s,
            Some(other) => return Err(D::Error::custom(format!("invalid item type {other}"))),
        };
        let v = Value::Object(v);
        let item = match kind.as_str() {
            "message" => serde_json::from_value(v).map(InputItem::Message),
            "function_call" => serde_json::from_value(v).map(InputItem::FunctionCall),
            "function_call_output" => serde_json::from_value(v).map(InputItem::FunctionCallOutput),
            other => {
                return Err(D::Error::custom(format!(
                    "unsupported input item type {other:?} (message, function_call or \
                     function_call_output)"
                )))
            }
        };
        item.map_err(|e| D::Error::custom(format!("{kind} item: {e}")))
    }
}

/// Role of an input message.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum InputRole {
    User,
    System,
    Developer,
    Assistant,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct InputMessage {
    pub role: InputRole,
    /// Text, or content parts (`input_text`, `output_text`; text joined).
    #[serde(deserialize_with = "content_text")]
    pub content: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub id: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub status: Option<String>,
}

#[derive(Deserialize)]
struct ContentPart {
    #[serde(rename = "type")]
    kind: String,
    #[serde(default)]
    text: Option<String>,
}

#[derive(Deserialize)]
#[serde(untagged)]
enum Content {
    Text(String),
    Parts(Vec<ContentPart>),
}

/// Text, or parts of type `input_text` / `output_text` / `text` (joined); any other part type is
/// an error naming it.
fn content_text<'de, D: Deserializer<'de>>(d: D) -> Result<String, D::Error> {
    match Content::deserialize(d)? {
        Content::Text(s) => Ok(s),
        Content::Parts(parts) => {
            let mut out = String::new();
            for p in parts {
                match (p.kind.as_str(), p.text) {
                    ("input_text" | "output_text" | "text", Some(t)) => out.push_str(&t),
                    (kind, _) => {
                        return Err(D::Error::custom(format!(
                            "unsupported content part type {kind:?} (only text)"
                        )))
                    }
                }
            }
            Ok(out)
        }
    }
}

/// A call the model made (input: sent back as history; output: what the model asks for).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct FunctionCallItem {
    /// The item id (`fc_…`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub id: Option<String>,
    /// The id a `function_call_output` answers (`call_…`).
    pub call_id: String,
    pub name: String,
    /// The arguments object as JSON text.
    pub arguments: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub status: Option<String>,
}

/// The result of a call, sent back by the client.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct FunctionCallOutputItem {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub id: Option<String>,
    pub call_id: String,
    /// The result as text (or text parts, joined).
    #[serde(deserialize_with = "content_text")]
    pub output: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub status: Option<String>,
}

/// A tool of a Responses request: a function, flat (`{"type": "function", "name", …}`).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum ResponseTool {
    Function(FunctionTool),
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct FunctionTool {
    pub name: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub description: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub parameters: Option<Value>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub strict: Option<bool>,
}

/// `tool_choice`: a mode, or `{"type": "function", "name": …}`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum ResponseToolChoice {
    Mode(ToolChoiceMode),
    Function(NamedFunction),
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct NamedFunction {
    /// Always `"function"`.
    #[serde(rename = "type")]
    pub kind: crate::tools::FunctionKind,
    pub name: String,
}

/// `text` of a request and of a response.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TextConfig {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub format: Option<TextFormat>,
}

/// `text.format`: the flat form of `response_format`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum TextFormat {
    Text,
    JsonObject,
    JsonSchema(JsonSchemaFormat),
}

/// The response object (`object: "response"`), returned whole, by `GET`, and inside the
/// `response.created` / `response.completed` events.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Response {
    pub id: String,
    /// Always `"response"`.
    pub object: String,
    /// Unix seconds.
    pub created_at: u64,
    /// `in_progress`, `completed` or `incomplete`.
    pub status: String,
    pub model: String,
    pub output: Vec<OutputItem>,
    /// Every `output_text` of the output joined (an SDK convenience, sent by the server too).
    #[serde(default)]
    pub output_text: String,
    #[serde(default)]
    pub instructions: Option<String>,
    #[serde(default)]
    pub tools: Vec<ResponseTool>,
    pub tool_choice: ResponseToolChoice,
    pub parallel_tool_calls: bool,
    #[serde(default)]
    pub temperature: Option<f32>,
    #[serde(default)]
    pub top_p: Option<f32>,
    #[serde(default)]
    pub max_output_tokens: Option<u32>,
    #[serde(default)]
    pub previous_response_id: Option<String>,
    pub store: bool,
    pub text: TextConfig,
    #[serde(default)]
    pub usage: Option<ResponseUsage>,
    /// Why the output stopped early (`{"reason": "max_output_tokens"}`), else null.
    #[serde(default)]
    pub incomplete_details: Option<IncompleteDetails>,
    #[serde(default)]
    pub error: Option<Value>,
    #[serde(default)]
    pub metadata: std::collections::BTreeMap<String, String>,
    /// `"disabled"`: the context is never truncated.
    #[serde(default)]
    pub truncation: Option<String>,
    #[serde(default)]
    pub user: Option<String>,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct IncompleteDetails {
    pub reason: String,
}

/// One output item.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum OutputItem {
    Message(OutputMessage),
    FunctionCall(FunctionCallItem),
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct OutputMessage {
    pub id: String,
    /// `in_progress`, `completed` or `incomplete`.
    pub status: String,
    /// Always `"assistant"`.
    pub role: String,
    pub content: Vec<OutputText>,
}

/// `{"type": "output_text", "text", "annotations": []}`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct OutputText {
    /// Always `"output_text"`.
    #[serde(rename = "type")]
    pub kind: String,
    pub text: String,
    #[serde(default)]
    pub annotations: Vec<Value>,
}

impl OutputText {
    pub fn new(text: impl Into<String>) -> Self {
        OutputText {
            kind: "output_text".into(),
            text: text.into(),
            annotations: Vec::new(),
        }
    }
}

/// Token accounting of a response.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ResponseUsage {
    pub input_tokens: u64,
    pub input_tokens_details: InputTokensDetails,
    pub output_tokens: u64,
    pub output_tokens_details: OutputTokensDetails,
    pub total_tokens: u64,
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct InputTokensDetails {
    /// Input tokens whose KV came from the prefix cache.
    pub cached_tokens: u64,
    /// Input tokens this request newly wrote to the retained cache (0 when it asked for no
    /// retention; OpenAI's Responses usage always carries it).
    #[serde(default, alias = "cache_creation_input_tokens")]
    pub cache_write_tokens: u64,
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct OutputTokensDetails {
    pub reasoning_tokens: u64,
}

/// `DELETE /v1/responses/{id}`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ResponseDeleted {
    pub id: String,
    /// Always `"response.deleted"`.
    pub object: String,
    pub deleted: bool,
}

/// One server-sent event of a streamed response: `event: <type>` and this as `data`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ResponseEvent {
    #[serde(flatten)]
    pub event: StreamEvent,
    /// Position of the event in its stream, from 0.
    pub sequence_number: u64,
}

/// The typed events of a streamed response, in the order they come.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type")]
pub enum StreamEvent {
    #[serde(rename = "response.created")]
    Created { response: Box<Response> },
    #[serde(rename = "response.in_progress")]
    InProgress { response: Box<Response> },
    #[serde(rename = "response.output_item.added")]
    OutputItemAdded { output_index: u32, item: OutputItem },
    #[serde(rename = "response.content_part.added")]
    ContentPartAdded {
        item_id: String,
        output_index: u32,
        content_index: u32,
        part: OutputText,
    },
    #[serde(rename = "response.output_text.delta")]
    OutputTextDelta {
        item_id: String,
        output_index: u32,
        content_index: u32,
        delta: String,
        logprobs: Vec<Value>,
    },
    #[serde(rename = "response.output_text.done")]
    OutputTextDone {
        item_id: String,
        output_index: u32,
        content_index: u32,
        text: String,
        logprobs: Vec<Value>,
    },
    #[serde(rename = "response.content_part.done")]
    ContentPartDone {
        item_id: String,
        output_index: u32,
        content_index: u32,
        part: OutputText,
    },
    #[serde(rename = "response.function_call_arguments.delta")]
    FunctionCallArgumentsDelta {
        item_id: String,
        output_index: u32,
        delta: String,
    },
    #[serde(rename = "response.function_call_arguments.done")]
    FunctionCallArgumentsDone {
        item_id: String,
        output_index: u32,
        name: String,
        arguments: String,
    },
    #[serde(rename = "response.output_item.done")]
    OutputItemDone { output_index: u32, item: OutputItem },
    #[serde(rename = "response.completed")]
    Completed { response: Box<Response> },
    #[serde(rename = "response.incomplete")]
    Incomplete { response: Box<Response> },
}

impl StreamEvent {
    /// The event's `type` (also its SSE `event:` name).
    pub fn name(&self) -> &'static str {
        match self {
            StreamEvent::Created { .. } => "response.created",
            StreamEvent::InProgress { .. } => "response.in_progress",
            StreamEvent::OutputItemAdded { .. } => "response.output_item.added",
            StreamEvent::ContentPartAdded { .. } => "response.content_part.added",
            StreamEvent::OutputTextDelta { .. } => "response.output_text.delta",
            StreamEvent::OutputTextDone { .. } => "response.output_text.done",
            StreamEvent::ContentPartDone { .. } => "response.content_part.done",
            StreamEvent::FunctionCallArgumentsDelta { .. } => {
                "response.function_call_arguments.delta"
            }
            StreamEvent::FunctionCallArgumentsDone { .. } => {
                "response.function_call_arguments.done"
            }
            StreamEvent::OutputItemDone { .. } => "response.output_item.done",
            StreamEvent::Completed { .. } => "response.completed",
            StreamEvent::Incomplete { .. } => "response.incomplete",
        }
    }
}

/// `GET /v1/responses/{id}/input_items`: a page of a stored response's input items (each in
/// OpenAI's item shape, with its `id`).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ResponseItemList {
    /// Always `"list"`.
    pub object: String,
    pub data: Vec<Value>,
    pub first_id: Option<String>,
    pub last_id: Option<String>,
    pub has_more: bool,
}
