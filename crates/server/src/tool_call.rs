//! The vocabulary of tool calls that the generic mode (`tools.rs`) and the template families
//! (`tool_families.rs`) share: a parsed call and what a reply turned out to be, the schema of a
//! tool's arguments, the complete items of a cut call list, and which earlier call a tool
//! message answers. Owns no plan, grammar or rendering.

use api::{ChatMessage, Tool};
use serde_json::value::RawValue;
use serde_json::{json, Value};

use crate::error::ApiError;

/// One call parsed out of the model's reply: the name and the arguments' JSON text (verbatim),
/// and the id when the model writes one (Mistral).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ParsedCall {
    pub name: String,
    pub arguments: String,
    pub id: Option<String>,
}

/// What the model's reply turned out to be.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Reply {
    Calls(Vec<ParsedCall>),
    Text(String),
    /// A list of calls cut short (by `max_tokens` or a stop string): the calls written whole,
    /// in order (possibly none); the cut one is dropped, never returned as text.
    Cut(Vec<ParsedCall>),
    /// Not the JSON the grammar asks for (cut by `max_tokens` or a stop string): returned as is.
    Unparsed,
}

/// The complete JSON values at the start of the body of a JSON array (`body` follows its `[`):
/// `{…}, {…}, {…` gives the first two. Stops at the first value that is cut or malformed.
pub(crate) fn complete_items(body: &str) -> Vec<&RawValue> {
    let mut out = Vec::new();
    let mut rest = body;
    loop {
        rest = rest.trim_start();
        let mut values = serde_json::Deserializer::from_str(rest).into_iter::<&RawValue>();
        let Some(Ok(v)) = values.next() else {
            return out;
        };
        let used = values.byte_offset();
        out.push(v);
        rest = rest[used..].trim_start();
        match rest.strip_prefix(',') {
            Some(r) => rest = r,
            None => return out,
        }
    }
}

/// The schema of a tool's arguments. Objects that declare `properties` and say nothing of
/// `additionalProperties` (or `patternProperties`) are held to the declared ones, at every depth
/// (nested models, `$defs`): a small model otherwise pads calls with keys copied from the schema
/// (`"type": "string"`). Narrowing only: what is generated still validates against the original.
pub fn arguments_schema(t: &Tool) -> Value {
    let mut params = t
        .function
        .parameters
        .clone()
        .unwrap_or_else(|| json!({"type": "object"}));
    close_objects(&mut params);
    params
}

/// Adds `additionalProperties: false` to every object schema with `properties` and no word on
/// extra keys, walking only the places that hold subschemas (never a `properties` map itself,
/// whose keys are property names).
fn close_objects(schema: &mut Value) {
    let Some(obj) = schema.as_object_mut() else {
        return;
    };
    if obj.contains_key("properties")
        && !obj.contains_key("additionalProperties")
        && !obj.contains_key("patternProperties")
    {
        obj.insert("additionalProperties".into(), false.into());
    }
    for (key, v) in obj.iter_mut() {
        match key.as_str() {
            "properties" | "patternProperties" | "$defs" | "definitions" | "dependentSchemas" => {
                if let Some(map) = v.as_object_mut() {
                    map.values_mut().for_each(close_objects);
                }
            }
            "items" | "prefixItems" | "anyOf" | "oneOf" | "allOf" => match v {
                Value::Array(a) => a.iter_mut().for_each(close_objects),
                other => close_objects(other),
            },
            "additionalProperties"
            | "not"
            | "if"
            | "then"
            | "else"
            | "contains"
            | "unevaluatedItems"
            | "unevaluatedProperties"
            | "propertyNames" => close_objects(v),
            _ => {}
        }
    }
}

/// The `(tool_call_id, tool name)` a tool message (`messages[i]`) answers, looked up among the
/// earlier assistant calls `(id, name)` (the latest with that id wins).
pub(crate) fn answered_call<'a>(
    m: &'a ChatMessage,
    i: usize,
    calls: &[(&str, &'a str)],
) -> Result<(&'a str, &'a str), ApiError> {
    let param = || format!("messages[{i}].tool_call_id");
    let id = m.tool_call_id.as_deref().ok_or_else(|| {
        ApiError::invalid("a tool message needs the tool_call_id it answers", &param())
    })?;
    let name = calls
        .iter()
        .rev()
        .find(|(cid, _)| *cid == id)
        .map(|(_, name)| *name)
        .ok_or_else(|| {
            ApiError::invalid(
                format!("tool_call_id {id:?} answers no earlier tool call"),
                &param(),
            )
        })?;
    Ok((id, name))
}
