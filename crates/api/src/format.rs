//! Structured output on the wire: OpenAI's `response_format` (chat and completions), the flat
//! `text.format` of the Responses API, and vLLM's `structured_outputs` object. Shapes only;
//! compiling a schema or grammar into a token constraint belongs to the server.

use serde::{Deserialize, Serialize};
use serde_json::Value;

/// `response_format`: free text, any JSON object, or JSON matching a schema.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum ResponseFormat {
    Text,
    JsonObject,
    JsonSchema { json_schema: JsonSchemaFormat },
}

/// `response_format.json_schema` (and, flattened, the Responses API's `text.format`).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct JsonSchemaFormat {
    /// The schema's name (`[a-zA-Z0-9_-]`, at most 64), as OpenAI requires.
    pub name: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub description: Option<String>,
    /// The JSON Schema (absent: any JSON object).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub schema: Option<Value>,
    /// Ask for the schema to be followed exactly (unsupported keywords are then an error).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub strict: Option<bool>,
}

/// vLLM's `structured_outputs`: exactly one of its members.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StructuredOutputs {
    /// A JSON Schema (an object, or the schema as JSON text).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub json: Option<Value>,
    /// The output is exactly one of these strings.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub choice: Option<Vec<String>>,
    /// The output matches this regular expression.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub regex: Option<String>,
    /// The output matches this grammar (llguidance's Lark-like syntax).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub grammar: Option<String>,
    /// `true`: any JSON object.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub json_object: Option<bool>,
}
