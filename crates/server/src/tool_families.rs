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
//! The text around the calls (before, between, after) is read from the template itself by
//! rendering a probe conversation ([`probe`]; templates of one family differ in a space or a
//! newline), and the grammar writes JSON as the templates' `tojson` does (`", "` and `": "`, keys
//! in the schema's order), so a call re-rendered from the history is the text the model wrote and
//! the next request's prompt extends this one's. A template of a known family that does not
//! render the probe's call as expected is served in the generic mode. Never tokenises or samples.

use api::{ChatMessage, Role, Tool};
use serde::Deserialize;
use serde_json::value::RawValue;
use serde_json::{json, Value};

use std::collections::HashMap;
use std::sync::{Mutex, OnceLock};

use crate::error::ApiError;
use crate::schema_embed::Embedder;
use crate::tool_call::{arguments_schema, ParsedCall, Reply};

/// A chat-template family with its own tool-call syntax.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Family {
    Hermes,
    Llama3,
    Mistral,
}

/// The text that starts a Mistral call (a control token in Mistral's vocabularies).
pub const MISTRAL_TRIGGER: &str = "[TOOL_CALLS]";

/// How a template writes the calls of one assistant turn, read from a probe rendering
/// ([`probe`]) so that the grammar writes exactly what the template re-renders (templates of a
/// family differ: Mistral Nemo writes `[TOOL_CALLS][`, Mistral Small 3.1 `[TOOL_CALLS] [`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Layout {
    /// Before the first call: `<tool_call>\n`, `[TOOL_CALLS][`, nothing.
    pub prefix: String,
    /// Between two calls; `None` when the template takes one call per turn.
    pub separator: Option<String>,
    /// After the last call, before the end-of-turn token.
    pub suffix: String,
    /// Each call ends with the id the model writes (`, "id": "…"`: Mistral's 9 characters).
    pub with_id: bool,
}

impl Layout {
    /// The family's usual layout (Qwen 2.5, Llama 3.1, Mistral Nemo).
    pub fn default_for(family: Family) -> Layout {
        let (prefix, separator, suffix, with_id) = match family {
            Family::Hermes => (
                "<tool_call>\n",
                Some("\n</tool_call>\n<tool_call>\n"),
                "\n</tool_call>",
                false,
            ),
            Family::Llama3 => ("", None, "", false),
            Family::Mistral => ("[TOOL_CALLS][", Some(", "), "]", true),
        };
        Layout {
            prefix: prefix.into(),
            separator: separator.map(str::to_string),
            suffix: suffix.into(),
            with_id,
        }
    }
}

/// A family, how its template lays calls out, and how the model's vocabulary spells its trigger.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FamilySyntax {
    pub family: Family,
    pub layout: Layout,
    /// The id of the trigger when it is one special token (Mistral's `[TOOL_CALLS]`): the grammar
    /// then asks for that token, and its text never appears in the output.
    pub trigger_token: Option<u32>,
}

impl FamilySyntax {
    /// The family with its usual layout and a text trigger.
    pub fn new(family: Family) -> FamilySyntax {
        FamilySyntax {
            family,
            layout: Layout::default_for(family),
            trigger_token: None,
        }
    }
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
}

/// The family of `model`'s chat template and its layout (`None`: the generic mode, also when the
/// probe finds the template does not write calls as the family does). Probed once per template.
pub fn model_syntax(model: &frontend::Frontend) -> Option<FamilySyntax> {
    static PROBED: OnceLock<Mutex<HashMap<String, Option<FamilySyntax>>>> = OnceLock::new();
    let template = model.chat_template.as_ref()?;
    let family = Family::detect(template.source())?;
    let cache = PROBED.get_or_init(|| Mutex::new(HashMap::new()));
    let mut cache = cache.lock().unwrap_or_else(|p| p.into_inner());
    if let Some(found) = cache.get(template.source()) {
        return found.clone();
    }
    let tok = &model.tokenizer;
    let ends: Vec<&str> = tok
        .eot_ids()
        .iter()
        .filter_map(|&id| tok.token_text(id))
        .collect();
    let found = probe(template, family, &ends).map(|layout| FamilySyntax {
        trigger_token: match family {
            Family::Mistral if layout.prefix.starts_with(MISTRAL_TRIGGER) => tok
                .token_to_id(MISTRAL_TRIGGER)
                .filter(|&id| tok.is_special(id)),
            _ => None,
        },
        family,
        layout,
    });
    cache.insert(template.source().to_string(), found.clone());
    found
}

/// How `template` writes calls, from rendering a probe conversation (a user turn, then an
/// assistant turn with one call, then with two) in the shape [`template_messages`] gives it:
/// the text before, between and after the calls, each call spelled `{"name": …, "<key>": {…}}`
/// (with `, "id": …` before the brace when the template adds ids) exactly as our grammar writes
/// it, the turn ending with one of `ends` (the end-of-turn tokens' text). `None` when the
/// template does not render calls that way (then the generic mode is used).
pub fn probe(
    template: &frontend::chat::ChatTemplate,
    family: Family,
    ends: &[&str],
) -> Option<Layout> {
    let tools = json!([{"type": "function", "function": {"name": "probe_fn",
        "description": "A probe.", "parameters": {"type": "object",
        "properties": {"probe_arg": {"type": "integer"}}, "required": ["probe_arg"]}}}]);
    let user = frontend::chat::ChatMessage::new("user", "Probe?");
    let call = |n: u32| {
        json!({"id": format!("probe000{n}"), "type": "function",
        "function": {"name": "probe_fn", "arguments": {"probe_arg": n}}})
    };
    let turn_with = |calls: Vec<Value>| {
        let assistant = frontend::chat::ChatMessage {
            tool_calls: Some(Value::Array(calls)),
            ..frontend::chat::ChatMessage::new("assistant", "")
        };
        template.render(&[user.clone(), assistant], Some(&tools), false)
    };
    let asked = template
        .render(std::slice::from_ref(&user), Some(&tools), true)
        .ok()?;
    let one = turn_with(vec![call(1)]).ok()?;
    let turn = one.strip_prefix(asked.as_str())?;
    let key = family.arguments_key();
    let spelled = |n: u32, with_id: bool| {
        let id = if with_id {
            format!(", \"id\": \"probe000{n}\"")
        } else {
            String::new()
        };
        format!("{{\"name\": \"probe_fn\", \"{key}\": {{\"probe_arg\": {n}}}{id}}}")
    };
    let start = turn.find("{\"name\": \"probe_fn\"")?;
    let prefix = &turn[..start];
    let with_id = [false, true]
        .into_iter()
        .find(|&w| turn[start..].starts_with(&spelled(1, w)))?;
    let rest = &turn[start + spelled(1, with_id).len()..];
    let end = ends.iter().filter_map(|e| rest.find(e)).min()?;
    let suffix = &rest[..end];
    // Two calls: what comes between them (a template that refuses two takes one per turn).
    let separator = turn_with(vec![call(1), call(2)]).ok().and_then(|two| {
        let turn = two.strip_prefix(asked.as_str())?;
        let after_first = turn
            .strip_prefix(prefix)?
            .strip_prefix(spelled(1, with_id).as_str())?;
        let second = after_first.find(&spelled(2, with_id))?;
        let tail = &after_first[second + spelled(2, with_id).len()..];
        tail.starts_with(suffix)
            .then(|| after_first[..second].to_string())
    });
    Some(Layout {
        prefix: prefix.to_string(),
        separator,
        suffix: suffix.to_string(),
        with_id,
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
) -> Result<Vec<frontend::chat::ChatMessage>, ApiError> {
    let mut out = Vec::with_capacity(messages.len());
    let mut calls: Vec<(&str, &str)> = Vec::new();
    for (i, m) in messages.iter().enumerate() {
        let content = m.content.clone().unwrap_or_default();
        let mut msg = frontend::chat::ChatMessage {
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
                let (id, name) = crate::tool_call::answered_call(m, i, &calls)?;
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

/// The JSON Schema of one call of `t` in `family`'s syntax (with the id the model writes), its
/// parameters as `embed` places them.
fn call_schema(family: Family, with_id: bool, t: &Tool, arguments: Value) -> Value {
    let mut props = serde_json::Map::new();
    props.insert("name".into(), json!({"const": t.function.name}));
    props.insert(family.arguments_key().into(), arguments);
    let mut required = vec![json!("name"), json!(family.arguments_key())];
    if with_id {
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
/// family allows it, at most `max_calls`), or — with `text` — a text answer, free (`None` inside)
/// or JSON matching the schema. Free text may not start the way a call does (nor the way the parser recognises one),
/// so the two never mix.
pub fn grammar(
    syntax: &FamilySyntax,
    offered: &[&Tool],
    parallel: bool,
    text: Option<Option<&Value>>,
    max_calls: usize,
) -> String {
    let family = syntax.family;
    let layout = &syntax.layout;
    // Each tool's parameters keep their own `$defs`/`$ref`s.
    let mut embed = Embedder::new();
    let calls: Vec<Value> = (offered.iter().enumerate())
        .map(|(i, t)| {
            let arguments = embed.embed(&format!("tool{i}"), arguments_schema(t));
            call_schema(family, layout.with_id, t, arguments)
        })
        .collect();
    let one = embed.finish(if calls.len() == 1 {
        calls.into_iter().next().unwrap_or_default()
    } else {
        json!({"anyOf": calls})
    });
    let mut g = String::new();
    g.push_str(match text {
        None => "start: calls\n",
        Some(None) => "start: TEXT | calls\n",
        Some(Some(_)) => "start: text_json | calls\n",
    });
    // A trigger that is one special token is asked for by id.
    let prefix = match (
        syntax.trigger_token,
        layout.prefix.strip_prefix(MISTRAL_TRIGGER),
    ) {
        (Some(id), Some(rest)) if !rest.is_empty() => format!("<[{id}]> {}", lit(rest)),
        (Some(id), Some(_)) => format!("<[{id}]>"),
        _ if layout.prefix.is_empty() => String::new(),
        _ => lit(&layout.prefix),
    };
    let repeat = match &layout.separator {
        Some(sep) if parallel && max_calls > 1 => {
            format!(" ({} call_json){{0,{}}}", lit(sep), max_calls - 1)
        }
        _ => String::new(),
    };
    let suffix = if layout.suffix.is_empty() {
        String::new()
    } else {
        lit(&layout.suffix)
    };
    let calls_rule = format!("calls: {prefix} call_json{repeat} {suffix}\n");
    // Text may not start like a call, nor the way the parser recognises one (a special-token
    // trigger prints nothing, so a Mistral list of calls is also a call).
    let mut not_text: Vec<&str> = call_signs(family).to_vec();
    let visible = layout.prefix.trim_start();
    if !visible.is_empty() {
        not_text.push(visible);
    }
    g.push_str(&calls_rule);
    g.push_str(&format!("call_json: %json {}\n", compact(one)));
    match text {
        Some(None) => {
            g.push_str("TEXT: /(?s:.+)/");
            for prefix in &not_text {
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
                    return Reply::Cut(calls);
                };
                let Some(call) = one_call(&after[..end]) else {
                    return Reply::Cut(calls);
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
                None => Reply::Cut(Vec::new()),
            }
        }
        Family::Mistral => {
            let (triggered, body) = match t.strip_prefix(MISTRAL_TRIGGER) {
                Some(b) => (true, b.trim_start()),
                // A special-token trigger leaves no text: a list of calls is the sign.
                None => (false, t),
            };
            let looks_like_calls = body.starts_with("[{\"name\"");
            if !triggered && !looks_like_calls {
                return Reply::Text(text.to_string());
            }
            let Ok(items) = serde_json::from_str::<Vec<CallWire>>(body.trim_end()) else {
                let whole = body.strip_prefix('[').map(crate::tool_call::complete_items);
                let calls = (whole.unwrap_or_default().into_iter())
                    .map_while(|v| one_call(v.get()))
                    .collect();
                return Reply::Cut(calls);
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

/// How a reply shows it is a call (after leading whitespace): what [`parse`] looks for.
fn call_signs(family: Family) -> &'static [&'static str] {
    match family {
        Family::Hermes => &["<tool_call>"],
        Family::Llama3 => &["{"],
        Family::Mistral => &[MISTRAL_TRIGGER, "[{\"name\""],
    }
}

/// The prefix of a reply that shows it is a call (`None`: not decided yet; `Some(false)`: text).
pub fn starts_call(family: Family, text: &str) -> Option<bool> {
    let t = text.trim_start();
    let prefixes = call_signs(family);
    if prefixes.iter().any(|p| t.starts_with(p)) {
        return Some(true);
    }
    if prefixes.iter().any(|p| p.starts_with(t)) {
        return None;
    }
    Some(false)
}
