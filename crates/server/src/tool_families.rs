//! Tool calls in the model's own format, for chat templates that support tools. The family is
//! recognised from the template text (as llama.cpp does): the tools, the assistant's calls and
//! the tool results are handed to the template itself (`tools`, `tool_calls` with the arguments
//! as objects, `role: "tool"` with `tool_call_id`), the reply is constrained with an llguidance
//! Lark grammar to the family's call syntax — arguments matching each tool's schema — and parsed
//! back into OpenAI calls:
//!
//! - [`Family::Hermes`] (Hermes 2 Pro, Qwen 2.5, …): `<tool_call>\n{"name": …, "arguments":
//!   {…}}\n</tool_call>`, one block per call, separated by a newline;
//! - [`Family::Llama3`] (Llama 3.1 / 3.2 / 3.3, results under the `ipython` role): one call,
//!   `{"name": …, "parameters": {…}}`;
//! - [`Family::Mistral`] (Mistral Nemo, Small): `[TOOL_CALLS][{"name": …, "arguments": {…},
//!   "id": "<9 letters or digits>"}, …]`; the model writes the id (the templates insist on 9
//!   alphanumerics) and it becomes the call's id.
//!
//! The grammar writes JSON as the templates' `tojson` does (`", "` and `": "`, keys in the
//! schema's order), so a call re-rendered from the history is the text the model wrote and the
//! next request's prompt extends this one's. Never tokenises or samples.

use api::{ChatMessage, Role, Tool};
use serde::Deserialize;
use serde_json::value::RawValue;
use serde_json::{json, Value};

use crate::error::ApiError;
use crate::tools::{arguments_schema, ParsedCall, Reply};

/// A chat-template family with its own tool-call syntax.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Family {
    Hermes,
    Llama3,
    Mistral,
}

/// The text that starts a Mistral call (a control token in Mistral's vocabularies).
pub const MISTRAL_TRIGGER: &str = "[TOOL_CALLS]";
const HERMES_OPEN: &str = "<tool_call>\n";
const HERMES_CLOSE: &str = "\n</tool_call>";

/// A family and how the model's vocabulary spells its trigger.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FamilySyntax {
    pub family: Family,
    /// The id of the trigger when it is one special token (Mistral's `[TOOL_CALLS]`): the grammar
    /// then asks for that token, and its text never appears in the output.
    pub trigger_token: Option<u32>,
}

impl Family {
    /// The family of a chat template, `None` when it renders no tool calls of a known family.
    pub fn detect(source: &str) -> Option<Family> {
        if source.contains(MISTRAL_TRIGGER) {
            Some(Family::Mistral)
        } else if source.contains("<tool_call>") {
            Some(Family::Hermes)
        } else if source.contains("<|start_header_id|>") && source.contains("ipython") {
            Some(Family::Llama3)
        } else {
            None
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Family::Hermes => "hermes",
            Family::Llama3 => "llama3",
            Family::Mistral => "mistral",
        }
    }

    /// The key of a call's arguments object.
    pub fn arguments_key(self) -> &'static str {
        match self {
            Family::Llama3 => "parameters",
            Family::Hermes | Family::Mistral => "arguments",
        }
    }

    /// Whether one reply may carry several calls (Llama 3's templates refuse more than one).
    pub fn parallel_calls(self) -> bool {
        self != Family::Llama3
    }
}

/// The family of `model`'s chat template (`None`: the generic mode).
pub fn model_syntax(model: &model::Frontend) -> Option<FamilySyntax> {
    let family = Family::detect(model.chat_template.as_ref()?.source())?;
    let trigger_token = match family {
        Family::Mistral => model
            .tokenizer
            .token_to_id(MISTRAL_TRIGGER)
            .filter(|&id| model.tokenizer.is_special(id)),
        Family::Hermes | Family::Llama3 => None,
    };
    Some(FamilySyntax {
        family,
        trigger_token,
    })
}

/// `tools` as templates read it (OpenAI's shape).
pub fn tools_value(tools: &[Tool]) -> Value {
    serde_json::to_value(tools).unwrap_or(Value::Null)
}

/// The messages as the template sees them: calls with their arguments as JSON objects (HF's
/// convention, what `tojson` in the templates expects), tool results as `role: "tool"` with the
/// `tool_call_id` and the called function's `name`. A tool message must answer an earlier call;
/// call arguments must be JSON objects.
pub fn template_messages(
    messages: &[ChatMessage],
) -> Result<Vec<model::chat::ChatMessage>, ApiError> {
    let mut out = Vec::with_capacity(messages.len());
    let mut calls: Vec<(&str, &str)> = Vec::new();
    for (i, m) in messages.iter().enumerate() {
        let content = m.content.clone().unwrap_or_default();
        let mut msg = model::chat::ChatMessage {
            role: match m.role {
                Role::System | Role::Developer => "system",
                Role::User => "user",
                Role::Assistant => "assistant",
                Role::Tool => "tool",
            }
            .to_string(),
            content,
            name: m.name.clone(),
            tool_calls: None,
            tool_call_id: None,
        };
        match (m.role, &m.tool_calls) {
            (Role::Assistant, Some(tc)) if !tc.is_empty() => {
                let mut items = Vec::with_capacity(tc.len());
                for (j, c) in tc.iter().enumerate() {
                    let args: Value = serde_json::from_str(c.function.arguments.trim())
                        .ok()
                        .filter(Value::is_object)
                        .ok_or_else(|| {
                            ApiError::invalid(
                                "tool call arguments must be a JSON object",
                                &format!("messages[{i}].tool_calls[{j}].function.arguments"),
                            )
                        })?;
                    calls.push((c.id.as_str(), c.function.name.as_str()));
                    items.push(json!({"id": c.id, "type": "function",
                        "function": {"name": c.function.name, "arguments": args}}));
                }
                msg.tool_calls = Some(Value::Array(items));
            }
            (Role::Tool, _) => {
                let id = m.tool_call_id.as_deref().ok_or_else(|| {
                    ApiError::invalid(
                        "a tool message needs the tool_call_id it answers",
                        &format!("messages[{i}].tool_call_id"),
                    )
                })?;
                let name = calls
                    .iter()
                    .rev()
                    .find(|(cid, _)| *cid == id)
                    .map(|(_, name)| *name)
                    .ok_or_else(|| {
                        ApiError::invalid(
                            format!("tool_call_id {id:?} answers no earlier tool call"),
                            &format!("messages[{i}].tool_call_id"),
                        )
                    })?;
                msg.name = Some(name.to_string());
                msg.tool_call_id = Some(id.to_string());
            }
            _ => {}
        }
        out.push(msg);
    }
    Ok(out)
}

/// A JSON string literal (also a Lark string literal).
fn lit(s: &str) -> String {
    Value::from(s).to_string()
}

/// The JSON Schema of one call of `t` in `family`'s syntax.
fn call_schema(family: Family, t: &Tool) -> Value {
    let mut props = serde_json::Map::new();
    props.insert("name".into(), json!({"const": t.function.name}));
    props.insert(family.arguments_key().into(), arguments_schema(t));
    let mut required = vec![json!("name"), json!(family.arguments_key())];
    if family == Family::Mistral {
        props.insert(
            "id".into(),
            json!({"type": "string", "pattern": "^[a-zA-Z0-9]{9}$"}),
        );
        required.push(json!("id"));
    }
    json!({"type": "object", "properties": props, "required": required,
           "additionalProperties": false})
}

/// `schema` for llguidance's `%json`, written as the templates' `tojson` writes JSON.
fn compact(mut schema: Value) -> String {
    if let Some(obj) = schema.as_object_mut() {
        obj.insert(
            "x-guidance".into(),
            json!({"whitespace_flexible": false, "item_separator": ", ",
                   "key_separator": ": ", "coerce_one_of": true}),
        );
    }
    schema.to_string()
}

/// The Lark grammar of a reply in `syntax`: calls of `offered` (several when `parallel` and the
/// family allows it), or — with `text` — a text answer, free (`None` inside) or JSON matching the
/// schema. Free text may not start the way a call does, so the two never mix.
pub fn grammar(
    syntax: FamilySyntax,
    offered: &[&Tool],
    parallel: bool,
    text: Option<Option<&Value>>,
) -> String {
    let family = syntax.family;
    let calls: Vec<Value> = offered.iter().map(|t| call_schema(family, t)).collect();
    let one = if calls.len() == 1 {
        calls.into_iter().next().unwrap_or_default()
    } else {
        json!({"anyOf": calls})
    };
    let parallel = parallel && family.parallel_calls();
    let mut g = String::new();
    g.push_str(match text {
        None => "start: calls\n",
        Some(None) => "start: TEXT | calls\n",
        Some(Some(_)) => "start: text_json | calls\n",
    });
    let repeat = |sep: &str| {
        if parallel {
            format!(" ({} call)*", lit(sep))
        } else {
            String::new()
        }
    };
    let (calls_rule, call_rule, not_text) = match family {
        Family::Hermes => (
            format!("calls: call{}\n", repeat("\n")),
            format!(
                "call: {} call_json {}\n",
                lit(HERMES_OPEN),
                lit(HERMES_CLOSE)
            ),
            Some("<tool_call>"),
        ),
        Family::Llama3 => (
            "calls: call\n".to_string(),
            "call: call_json\n".to_string(),
            Some("{"),
        ),
        Family::Mistral => {
            let trigger = match syntax.trigger_token {
                Some(id) => format!("<[{id}]>"),
                None => lit(MISTRAL_TRIGGER),
            };
            (
                format!("calls: {trigger} \"[\" call{} \"]\"\n", repeat(", ")),
                "call: call_json\n".to_string(),
                syntax.trigger_token.is_none().then_some(MISTRAL_TRIGGER),
            )
        }
    };
    g.push_str(&calls_rule);
    g.push_str(&call_rule);
    g.push_str(&format!("call_json: %json {}\n", compact(one)));
    match text {
        Some(None) => {
            g.push_str("TEXT: /(?s:.+)/");
            if let Some(prefix) = not_text {
                let escaped: String = prefix
                    .chars()
                    .map(|c| {
                        if c.is_ascii_alphanumeric() {
                            c.to_string()
                        } else {
                            format!("\\x{:02x}", c as u32)
                        }
                    })
                    .collect();
                g.push_str(&format!(" & ~/(?s:{escaped}.*)/"));
            }
            g.push('\n');
        }
        Some(Some(schema)) => {
            g.push_str(&format!("text_json: %json {}\n", compact(schema.clone())))
        }
        None => {}
    }
    g
}

#[derive(Deserialize)]
struct CallWire<'a> {
    name: String,
    #[serde(default, borrow)]
    arguments: Option<&'a RawValue>,
    #[serde(default, borrow)]
    parameters: Option<&'a RawValue>,
    #[serde(default)]
    id: Option<String>,
}

impl CallWire<'_> {
    fn into_call(self) -> Option<ParsedCall> {
        let args = self.arguments.or(self.parameters)?;
        if !args.get().starts_with('{') {
            return None;
        }
        Some(ParsedCall {
            name: self.name,
            arguments: args.get().to_string(),
            id: self.id,
        })
    }
}

fn one_call(json: &str) -> Option<ParsedCall> {
    serde_json::from_str::<CallWire>(json.trim())
        .ok()?
        .into_call()
}

/// The reply of a model in `family`'s syntax: calls, text, or a call cut short (unparsed).
pub fn parse(family: Family, text: &str) -> Reply {
    let t = text.trim_start();
    match family {
        Family::Hermes => {
            if !t.starts_with("<tool_call>") {
                return Reply::Text(text.to_string());
            }
            let mut calls = Vec::new();
            let mut rest = t;
            while let Some(after) = rest.trim_start().strip_prefix("<tool_call>") {
                let Some(end) = after.find("</tool_call>") else {
                    return Reply::Unparsed;
                };
                let Some(call) = one_call(&after[..end]) else {
                    return Reply::Unparsed;
                };
                calls.push(call);
                rest = &after[end + "</tool_call>".len()..];
            }
            if rest.trim().is_empty() {
                Reply::Calls(calls)
            } else {
                Reply::Unparsed
            }
        }
        Family::Llama3 => {
            if !t.starts_with('{') {
                return Reply::Text(text.to_string());
            }
            match one_call(t) {
                Some(c) => Reply::Calls(vec![c]),
                None => Reply::Unparsed,
            }
        }
        Family::Mistral => {
            let (triggered, body) = match t.strip_prefix(MISTRAL_TRIGGER) {
                Some(b) => (true, b.trim_start()),
                // A special-token trigger leaves no text: a list of calls is the sign.
                None => (false, t),
            };
            let looks_like_calls =
                body.starts_with('[') && body[1..].trim_start().starts_with("{\"name\"");
            if !triggered && !looks_like_calls {
                return Reply::Text(text.to_string());
            }
            let Ok(items) = serde_json::from_str::<Vec<CallWire>>(body.trim_end()) else {
                return Reply::Unparsed;
            };
            let calls: Option<Vec<ParsedCall>> =
                items.into_iter().map(CallWire::into_call).collect();
            match calls {
                Some(c) if !c.is_empty() => Reply::Calls(c),
                _ => Reply::Unparsed,
            }
        }
    }
}

/// The prefix of a reply that shows it is a call (`None`: not decided yet; `Some(false)`: text).
pub fn starts_call(family: Family, text: &str) -> Option<bool> {
    let t = text.trim_start();
    let prefixes: &[&str] = match family {
        Family::Hermes => &["<tool_call>"],
        Family::Llama3 => &["{"],
        Family::Mistral => &[MISTRAL_TRIGGER, "[{\"name\""],
    };
    if prefixes.iter().any(|p| t.starts_with(p)) {
        return Some(true);
    }
    if prefixes.iter().any(|p| p.starts_with(t)) {
        return None;
    }
    Some(false)
}
