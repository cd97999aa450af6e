//! Tool calls: the plan of a request with tools, and the generic mode (as llama.cpp does for
//! templates without tool support; templates of a known tool family go through
//! `tool_families.rs` instead): the tools are described in the system prompt, the reply is constrained (see `grammar.rs`) to JSON
//! that is either a call — `{"tool_call": {"name": …, "arguments": {…}}}`, or `{"tool_calls":
//! [...]}` when parallel calls are allowed — or, under `tool_choice: auto`, a text reply
//! `{"response": "…"}`; the server parses that JSON back into OpenAI `tool_calls`.
//!
//! The history is rendered in the same JSON the model wrote (arguments verbatim, the grammar's
//! separators), so the prompt of call N+1 extends the prompt of call N token for token and the
//! prefix cache serves it. Never tokenises or samples.

use api::{ChatCompletionRequest, ChatMessage, Role, Tool, ToolChoice, ToolChoiceMode};
use serde::Deserialize;
use serde_json::value::RawValue;
use serde_json::{json, Value};

use crate::error::ApiError;
use crate::schema_embed::Embedder;
use crate::tool_call::{answered_call, complete_items};
pub use crate::tool_call::{arguments_schema, ParsedCall, Reply};
use crate::tool_families::{self, Family, FamilySyntax};

/// How a request with tools is answered.
#[derive(Debug, Clone, PartialEq)]
pub struct ToolPlan {
    /// Appended to the system prompt (or sent as one when the conversation has none).
    pub system_text: String,
    /// The JSON Schema the reply is constrained to.
    pub schema: Value,
    /// Calls are written as a `tool_calls` list (else one `tool_call`).
    pub parallel: bool,
    /// A text answer is JSON matching the request's structured-output schema (`{"response":
    /// {…}}`), not a string.
    pub structured_text: bool,
    /// The template's own tool format: then `system_text` is empty, `schema` unused, and the
    /// reply is constrained by `lark`.
    pub family: Option<FamilySyntax>,
    /// The family's grammar (`tool_families::grammar`).
    pub lark: Option<String>,
}

/// How a reply with tool calls is written.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReplySyntax {
    /// The generic mode's JSON.
    Generic,
    /// The template family's own syntax.
    Family(Family),
}

impl ToolPlan {
    pub fn syntax(&self) -> ReplySyntax {
        match &self.family {
            Some(f) => ReplySyntax::Family(f.family),
            None => ReplySyntax::Generic,
        }
    }
}

/// The plan for `r`'s `tools` and `tool_choice`, `None` when no tool may be called (no tools,
/// or `tool_choice: "none"`); a 400 naming the field for anything inconsistent. With
/// `text_schema` (structured output) a text answer under `auto` is JSON matching it. With
/// `family` the calls are written in the template's own syntax, else in the generic mode's JSON.
/// A turn holds at most `max_calls` calls (at least 1).
pub fn plan(
    r: &ChatCompletionRequest,
    text_schema: Option<&Value>,
    family: Option<FamilySyntax>,
    max_calls: usize,
) -> Result<Option<ToolPlan>, ApiError> {
    let max_calls = max_calls.max(1);
    let tools = r.tools.as_deref().unwrap_or_default();
    check_tools(tools)?;
    let (mode, named) = match &r.tool_choice {
        None => (ToolChoiceMode::Auto, None),
        Some(ToolChoice::Mode(m)) => (*m, None),
        Some(ToolChoice::Named(n)) => (ToolChoiceMode::Required, Some(n.function.name.as_str())),
    };
    if tools.is_empty() {
        if mode == ToolChoiceMode::Required {
            return Err(ApiError::invalid(
                "tool_choice \"required\" or a named tool needs tools",
                "tool_choice",
            ));
        }
        return Ok(None);
    }
    if mode == ToolChoiceMode::None {
        return Ok(None);
    }
    let offered: Vec<&Tool> = match named {
        Some(name) => {
            let t = tools
                .iter()
                .find(|t| t.function.name == name)
                .ok_or_else(|| {
                    ApiError::invalid(
                        format!("tool_choice names {name:?}, which is not among the tools"),
                        "tool_choice",
                    )
                })?;
            vec![t]
        }
        None => tools.iter().collect(),
    };
    // `parallel` is what the prompt says (the same whatever `tool_choice` names, so switching
    // keeps the prefix cached); a named tool is called exactly once, as vLLM's named function
    // calling does, whatever `parallel_tool_calls` says.
    let parallel = r.parallel_tool_calls.unwrap_or(true);
    let parallel_calls = parallel && named.is_none();
    if let Some(syntax) = family {
        let text = match (mode, named) {
            (ToolChoiceMode::Auto, None) => Some(text_schema),
            _ => None,
        };
        return Ok(Some(ToolPlan {
            system_text: String::new(),
            schema: Value::Null,
            parallel: parallel_calls && syntax.layout.separator.is_some(),
            structured_text: text_schema.is_some(),
            lark: Some(tool_families::grammar(
                &syntax,
                &offered,
                parallel_calls,
                text,
                max_calls,
            )),
            family: Some(syntax),
        }));
    }
    // Each tool's parameters (and the text schema) keep their own `$defs`/`$ref`s.
    let mut embed = Embedder::new();
    let one_call = {
        let calls: Vec<Value> = (offered.iter().enumerate())
            .map(|(i, t)| call_schema(t, embed.embed(&format!("tool{i}"), arguments_schema(t))))
            .collect();
        if calls.len() == 1 {
            calls.into_iter().next().unwrap_or_default()
        } else {
            json!({"anyOf": calls})
        }
    };
    let calls_schema = if parallel_calls {
        json!({"type": "object", "properties": {"tool_calls": {"type": "array",
               "items": one_call, "minItems": 1, "maxItems": max_calls}},
               "required": ["tool_calls"], "additionalProperties": false})
    } else {
        json!({"type": "object", "properties": {"tool_call": one_call},
               "required": ["tool_call"], "additionalProperties": false})
    };
    let text = embed.embed(
        "response",
        text_schema
            .cloned()
            .unwrap_or_else(|| json!({"type": "string"})),
    );
    let schema = match (mode, named) {
        (ToolChoiceMode::Auto, None) => json!({"anyOf": [calls_schema,
            {"type": "object", "properties": {"response": text},
             "required": ["response"], "additionalProperties": false}]}),
        _ => calls_schema,
    };
    let schema = embed.finish(schema);
    Ok(Some(ToolPlan {
        system_text: system_text(tools, parallel),
        schema,
        parallel: parallel_calls,
        structured_text: text_schema.is_some(),
        family: None,
        lark: None,
    }))
}

fn check_tools(tools: &[Tool]) -> Result<(), ApiError> {
    for (i, t) in tools.iter().enumerate() {
        let name = &t.function.name;
        let ok = !name.is_empty()
            && name.len() <= 64
            && name
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-');
        if !ok {
            return Err(ApiError::invalid(
                format!("tool names are 1 to 64 of a-z, A-Z, 0-9, _ and -, got {name:?}"),
                &format!("tools[{i}].function.name"),
            ));
        }
        if tools[..i].iter().any(|o| &o.function.name == name) {
            return Err(ApiError::invalid(
                format!("tool name {name:?} is used twice"),
                &format!("tools[{i}].function.name"),
            ));
        }
        if let Some(p) = &t.function.parameters {
            if !p.is_object() {
                return Err(ApiError::invalid(
                    "parameters must be a JSON Schema object",
                    &format!("tools[{i}].function.parameters"),
                ));
            }
        }
    }
    Ok(())
}

/// `{"name": <const>, "arguments": <the tool's parameters schema, as embedded>}`.
fn call_schema(t: &Tool, arguments: Value) -> Value {
    json!({"type": "object",
           "properties": {"name": {"const": t.function.name}, "arguments": arguments},
           "required": ["name", "arguments"], "additionalProperties": false})
}

/// The same text whatever `tool_choice` says (the grammar enforces the choice), so an agent that
/// switches between `auto`, `required` and a named tool keeps its prompt prefix cached.
fn system_text(tools: &[Tool], parallel: bool) -> String {
    let mut s = String::from("You can call these tools:\n");
    for t in tools {
        let mut d = serde_json::Map::new();
        d.insert("name".into(), t.function.name.clone().into());
        if let Some(desc) = &t.function.description {
            d.insert("description".into(), desc.clone().into());
        }
        d.insert(
            "parameters".into(),
            t.function
                .parameters
                .clone()
                .unwrap_or_else(|| json!({"type": "object"})),
        );
        s.push_str(&compact(&Value::Object(d)));
        s.push('\n');
    }
    s.push_str("\nTo call a tool, reply with JSON only: ");
    if parallel {
        s.push_str(
            "{\"tool_calls\": [{\"name\": \"<tool name>\", \"arguments\": {<arguments>}}]} \
             (one or more calls).",
        );
    } else {
        s.push_str("{\"tool_call\": {\"name\": \"<tool name>\", \"arguments\": {<arguments>}}}.");
    }
    s.push_str(
        "\nTo answer the user instead, reply with JSON only: {\"response\": \"<your answer>\"}.",
    );
    s
}

/// JSON with the grammar's separators (`", "`, `": "`), keys in their order.
fn compact(v: &Value) -> String {
    match v {
        Value::Object(m) => {
            let items: Vec<String> = m
                .iter()
                .map(|(k, v)| format!("{}: {}", Value::from(k.as_str()), compact(v)))
                .collect();
            format!("{{{}}}", items.join(", "))
        }
        Value::Array(a) => {
            let items: Vec<String> = a.iter().map(compact).collect();
            format!("[{}]", items.join(", "))
        }
        other => other.to_string(),
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ReplyWire<'a> {
    #[serde(default, borrow)]
    tool_call: Option<CallWire<'a>>,
    #[serde(default, borrow)]
    tool_calls: Option<Vec<CallWire<'a>>>,
    #[serde(default, borrow)]
    response: Option<&'a RawValue>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct CallWire<'a> {
    name: String,
    #[serde(borrow)]
    arguments: &'a RawValue,
}

/// Parses a reply written in `syntax`.
pub fn parse_reply_in(syntax: ReplySyntax, text: &str) -> Reply {
    match syntax {
        ReplySyntax::Generic => parse_reply(text),
        ReplySyntax::Family(f) => tool_families::parse(f, text),
    }
}

/// Parses a reply written under a generic [`ToolPlan`]'s grammar.
pub fn parse_reply(text: &str) -> Reply {
    let call = |c: CallWire| ParsedCall {
        name: c.name,
        arguments: c.arguments.get().to_string(),
        id: None,
    };
    let Ok(w) = serde_json::from_str::<ReplyWire>(text) else {
        if let Some(body) = text.strip_prefix("{\"tool_calls\": [") {
            let calls = complete_items(body)
                .into_iter()
                .map_while(|v| serde_json::from_str::<CallWire>(v.get()).ok().map(call))
                .collect();
            return Reply::Cut(calls);
        }
        if text.starts_with("{\"tool_call\": ") {
            return Reply::Cut(Vec::new());
        }
        return Reply::Unparsed;
    };
    match (w.tool_call, w.tool_calls, w.response) {
        (Some(c), None, None) => Reply::Calls(vec![call(c)]),
        (None, Some(cs), None) if !cs.is_empty() => {
            Reply::Calls(cs.into_iter().map(call).collect())
        }
        // A string answer is returned as its text, a structured one as its JSON verbatim.
        (None, None, Some(raw)) => match serde_json::from_str::<String>(raw.get()) {
            Ok(text) => Reply::Text(text),
            Err(_) => Reply::Text(raw.get().to_string()),
        },
        _ => Reply::Unparsed,
    }
}

/// The text of a string answer cut short (by `max_tokens` or a stop string): what the model wrote
/// inside `{"response": "…` so far, unescaped (an escape cut in the middle is dropped). `None`
/// for anything else (a cut call stays raw JSON).
pub fn partial_text(reply: &str) -> Option<String> {
    let rest = reply.strip_prefix("{\"response\": \"")?;
    // The string ends at the first quote not escaped.
    let mut end = rest.len();
    let mut escaped = false;
    for (i, c) in rest.char_indices() {
        match (escaped, c) {
            (true, _) => escaped = false,
            (false, '\\') => escaped = true,
            (false, '"') => {
                end = i;
                break;
            }
            _ => {}
        }
    }
    let mut body = &rest[..end];
    loop {
        if let Ok(s) = serde_json::from_str::<String>(&format!("\"{body}\"")) {
            return Some(s);
        }
        // A cut escape (`\`, `\u00`): drop from its backslash on.
        let cut = body.rfind('\\')?;
        body = &body[..cut];
    }
}

/// The messages as the chat template sees them: assistant tool calls and tool results become the
/// JSON the model writes and reads in the generic mode (and, under a plan, plain assistant
/// replies become `{"response": …}`), the plan's text joins the system prompt. A tool result is
/// a user turn (`{"tool_response": …}`, as llama.cpp does for templates without a tool role): a
/// model never trained on a `tool` role answers after it instead of calling the tool again. A
/// tool message must answer an earlier call (`tool_call_id`); call arguments must be JSON.
pub fn render_messages(
    messages: &[ChatMessage],
    plan: Option<&ToolPlan>,
) -> Result<Vec<frontend::chat::ChatMessage>, ApiError> {
    let parallel = plan.is_some_and(|p| p.parallel);
    let structured_text = plan.is_some_and(|p| p.structured_text);
    let mut out: Vec<frontend::chat::ChatMessage> = Vec::with_capacity(messages.len() + 1);
    let mut calls: Vec<(&str, &str)> = Vec::new(); // (id, name) of every earlier call
    for (i, m) in messages.iter().enumerate() {
        let text = m.content.clone().unwrap_or_default();
        let content = match (m.role, &m.tool_calls) {
            (Role::Assistant, Some(tc)) if !tc.is_empty() => {
                let mut items = Vec::with_capacity(tc.len());
                for (j, c) in tc.iter().enumerate() {
                    let args = c.function.arguments.trim();
                    if serde_json::from_str::<&RawValue>(args).is_err() {
                        return Err(ApiError::invalid(
                            "tool call arguments must be JSON text",
                            &format!("messages[{i}].tool_calls[{j}].function.arguments"),
                        ));
                    }
                    calls.push((c.id.as_str(), c.function.name.as_str()));
                    items.push(format!(
                        "{{\"name\": {}, \"arguments\": {args}}}",
                        Value::from(c.function.name.as_str())
                    ));
                }
                if parallel || items.len() > 1 {
                    format!("{{\"tool_calls\": [{}]}}", items.join(", "))
                } else {
                    format!("{{\"tool_call\": {}}}", items[0])
                }
            }
            (Role::Tool, _) => {
                let (_, name) = answered_call(m, i, &calls)?;
                compact(&json!({"tool_response": {"name": name, "content": text}}))
            }
            // A structured answer goes back as the JSON the model wrote.
            (Role::Assistant, _)
                if structured_text
                    && serde_json::from_str::<&RawValue>(&text).is_ok_and(|v| v.get() == text) =>
            {
                format!("{{\"response\": {text}}}")
            }
            (Role::Assistant, _) if plan.is_some() => compact(&json!({"response": text})),
            _ => text,
        };
        out.push(frontend::chat::ChatMessage {
            role: role_name(m.role).to_string(),
            content,
            name: m.name.clone(),
            tool_calls: None,
            tool_call_id: None,
        });
    }
    if let Some(p) = plan {
        match out.first_mut() {
            Some(first) if first.role == "system" => {
                first.content.push_str("\n\n");
                first.content.push_str(&p.system_text);
            }
            _ => out.insert(
                0,
                frontend::chat::ChatMessage::new("system", &p.system_text),
            ),
        }
    }
    Ok(out)
}

/// What the chat template renders: the messages, and `tools` for a template of a known tool
/// family. With `family` everything is in the template's own format (the request's tools are
/// passed whatever `tool_choice` says, so the prompt does not depend on it); otherwise in the
/// generic mode's ([`render_messages`]).
pub fn template_input(
    messages: &[ChatMessage],
    plan: Option<&ToolPlan>,
    tools: Option<&[Tool]>,
    family: Option<FamilySyntax>,
) -> Result<(Vec<frontend::chat::ChatMessage>, Option<Value>), ApiError> {
    match family {
        Some(_) => Ok((
            tool_families::template_messages(messages)?,
            tools
                .filter(|t| !t.is_empty())
                .map(tool_families::tools_value),
        )),
        None => Ok((render_messages(messages, plan)?, None)),
    }
}

fn role_name(r: Role) -> &'static str {
    match r {
        Role::System | Role::Developer => "system",
        Role::User => "user",
        Role::Assistant => "assistant",
        // The generic mode's templates have no tool role (see `render_messages`).
        Role::Tool => "user",
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use api::{FunctionCall, FunctionDef, FunctionKind, FunctionName, NamedToolChoice, ToolCall};

    fn weather() -> Tool {
        Tool {
            kind: FunctionKind::Function,
            function: FunctionDef {
                name: "get_weather".into(),
                description: Some("Weather in a city".into()),
                parameters: Some(json!({"type": "object",
                    "properties": {"city": {"type": "string"}}, "required": ["city"]})),
                strict: None,
            },
        }
    }

    fn request(choice: Option<ToolChoice>, parallel: Option<bool>) -> ChatCompletionRequest {
        ChatCompletionRequest {
            model: "m".into(),
            messages: vec![ChatMessage::new(Role::User, "Weather in Paris?")],
            tools: Some(vec![weather()]),
            tool_choice: choice,
            parallel_tool_calls: parallel,
            ..Default::default()
        }
    }

    fn plan_of(r: &ChatCompletionRequest) -> Result<Option<ToolPlan>, ApiError> {
        plan(r, None, None, 8)
    }

    #[test]
    fn plans_follow_tool_choice() {
        let auto = plan_of(&request(None, Some(false))).unwrap().unwrap();
        assert!(auto.schema["anyOf"][1]["properties"]["response"].is_object());
        assert!(auto.system_text.contains("\"response\""));
        let req = plan_of(&request(
            Some(ToolChoice::Mode(ToolChoiceMode::Required)),
            Some(false),
        ))
        .unwrap()
        .unwrap();
        assert_eq!(req.schema["required"], json!(["tool_call"]));
        assert_eq!(
            req.system_text, auto.system_text,
            "the prompt does not depend on the choice"
        );
        let par = plan_of(&request(
            Some(ToolChoice::Mode(ToolChoiceMode::Required)),
            None,
        ))
        .unwrap()
        .unwrap();
        assert!(par.parallel && par.schema["properties"]["tool_calls"]["minItems"] == 1);
        // Declared properties only, unless the schema says otherwise.
        let args = &req.schema["properties"]["tool_call"]["properties"]["arguments"];
        assert_eq!(args["additionalProperties"], false);
        let mut open = request(None, None);
        open.tools.as_mut().unwrap()[0].function.parameters =
            Some(json!({"type": "object", "additionalProperties": true,
                        "properties": {"city": {"type": "string"}}}));
        let p = plan_of(&open).unwrap().unwrap();
        let args =
            &p.schema["anyOf"][0]["properties"]["tool_calls"]["items"]["properties"]["arguments"];
        assert_eq!(args["additionalProperties"], true);
        assert_eq!(
            plan_of(&request(Some(ToolChoice::Mode(ToolChoiceMode::None)), None)).unwrap(),
            None
        );
        let named = |name: &str| {
            Some(ToolChoice::Named(NamedToolChoice {
                kind: FunctionKind::Function,
                function: FunctionName { name: name.into() },
            }))
        };
        let p = plan_of(&request(named("get_weather"), Some(false)))
            .unwrap()
            .unwrap();
        assert_eq!(
            p.schema["properties"]["tool_call"]["properties"]["name"]["const"],
            "get_weather"
        );
        // A named tool is called once even where parallel calls are allowed; the prompt text
        // stays that of the other choices.
        let one = plan_of(&request(named("get_weather"), None))
            .unwrap()
            .unwrap();
        assert!(!one.parallel);
        assert_eq!(
            one.schema["properties"]["tool_call"]["properties"]["name"]["const"],
            "get_weather"
        );
        let auto = plan_of(&request(None, None)).unwrap().unwrap();
        assert!(auto.parallel);
        assert_eq!(one.system_text, auto.system_text);
        let e = plan_of(&request(named("nope"), None)).unwrap_err();
        assert_eq!(e.body().error.param.as_deref(), Some("tool_choice"));
        let mut r = request(Some(ToolChoice::Mode(ToolChoiceMode::Required)), None);
        r.tools = None;
        assert!(plan_of(&r).is_err());
        let mut r = request(None, None);
        r.tools.as_mut().unwrap()[0].function.name = "bad name".into();
        assert_eq!(
            plan_of(&r).unwrap_err().body().error.param.as_deref(),
            Some("tools[0].function.name")
        );
    }

    #[test]
    fn nested_objects_are_closed_but_property_maps_are_not_schemas() {
        let t: Tool = serde_json::from_value(json!({"type": "function", "function": {
            "name": "f", "parameters": {"type": "object",
                "properties": {"properties": {"type": "object", "properties": {"a": {"type": "string"}}},
                               "tags": {"type": "array", "items": {"$ref": "#/$defs/Tag"}},
                               "open": {"type": "object", "properties": {}, "additionalProperties": true}},
                "$defs": {"Tag": {"type": "object", "properties": {"name": {"type": "string"}}}}}}}))
        .unwrap();
        let s = arguments_schema(&t);
        assert_eq!(s["additionalProperties"], false);
        // A property named "properties" is a property, not a map to close.
        assert!(s["properties"].get("additionalProperties").is_none());
        assert_eq!(s["properties"]["properties"]["additionalProperties"], false);
        assert_eq!(s["$defs"]["Tag"]["additionalProperties"], false);
        assert_eq!(s["properties"]["open"]["additionalProperties"], true);
    }

    #[test]
    fn replies_parse_into_calls_or_text() {
        assert_eq!(
            parse_reply(r#"{"tool_call": {"name": "f", "arguments": {"a": [1, 2]}}}"#),
            Reply::Calls(vec![ParsedCall {
                name: "f".into(),
                arguments: r#"{"a": [1, 2]}"#.into(),
                id: None,
            }])
        );
        assert!(matches!(
            parse_reply(r#"{"tool_calls": [{"name": "f", "arguments": {}}, {"name": "g", "arguments": {}}]}"#),
            Reply::Calls(c) if c.len() == 2
        ));
        assert_eq!(
            parse_reply(r#"{"response": "hi"}"#),
            Reply::Text("hi".into())
        );
        assert_eq!(
            parse_reply(r#"{"tool_call": {"name": "f", "argu"#),
            Reply::Cut(Vec::new())
        );
        // A list cut by max_tokens keeps its complete calls, drops the cut one.
        let cut = r#"{"tool_calls": [{"name": "add", "arguments": {"a": 2, "b": 3}}, {"name": "g", "arguments": {"s": "x, }]"}}, {"name": "add", "argum"#;
        let Reply::Cut(calls) = parse_reply(cut) else {
            panic!("{cut}")
        };
        assert_eq!(calls.len(), 2);
        assert_eq!(calls[1].arguments, r#"{"s": "x, }]"}"#);
        assert_eq!(parse_reply(r#"{"tool_calls": ["#), Reply::Cut(Vec::new()));
        assert_eq!(parse_reply("plain text"), Reply::Unparsed);
        for (cut, text) in [
            (r#"{"response": "It is sun"#, Some("It is sun")),
            (r#"{"response": "a \"b\" c\"#, Some(r#"a "b" c"#)),
            (r#"{"response": "x\u00e9y\u00"#, Some("xéy")),
            (r#"{"response": "done""#, Some("done")),
            (r#"{"response": "#, None),
            (r#"{"tool_call": {"name": "f"#, None),
        ] {
            assert_eq!(partial_text(cut).as_deref(), text, "{cut}");
        }
    }

    #[test]
    fn a_structured_text_answer_is_json_and_renders_back_verbatim() {
        let schema = json!({"type": "object", "properties": {"a": {"type": "integer"}}});
        let p = plan(&request(None, Some(false)), Some(&schema), None, 8)
            .unwrap()
            .unwrap();
        assert!(p.structured_text);
        assert_eq!(p.schema["anyOf"][1]["properties"]["response"], schema);
        let reply = r#"{"response": {"a": 1}}"#;
        assert_eq!(parse_reply(reply), Reply::Text(r#"{"a": 1}"#.into()));
        let msgs = vec![
            ChatMessage::new(Role::User, "u"),
            ChatMessage::new(Role::Assistant, r#"{"a": 1}"#),
        ];
        let out = render_messages(&msgs, Some(&p)).unwrap();
        assert_eq!(out[2].content, reply);
        // Not JSON: rendered as a string answer.
        let msgs = vec![ChatMessage::new(Role::Assistant, "plain")];
        let out = render_messages(&msgs, Some(&p)).unwrap();
        assert_eq!(out[1].content, r#"{"response": "plain"}"#);
    }

    #[test]
    fn history_renders_as_the_model_wrote_it() {
        let p = plan_of(&request(None, Some(false))).unwrap().unwrap();
        let args = r#"{"city": "Paris"}"#;
        let msgs = vec![
            ChatMessage::new(Role::System, "Be brief."),
            ChatMessage::new(Role::User, "Weather in Paris?"),
            ChatMessage {
                tool_calls: Some(vec![ToolCall {
                    id: "call_1".into(),
                    kind: FunctionKind::Function,
                    function: FunctionCall {
                        name: "get_weather".into(),
                        arguments: args.into(),
                    },
                }]),
                content: None,
                ..ChatMessage::new(Role::Assistant, "")
            },
            ChatMessage {
                tool_call_id: Some("call_1".into()),
                ..ChatMessage::new(Role::Tool, "18 C, \"sunny\"")
            },
            ChatMessage::new(Role::Assistant, "It is sunny."),
        ];
        let out = render_messages(&msgs, Some(&p)).unwrap();
        assert!(out[0]
            .content
            .starts_with("Be brief.\n\nYou can call these tools:"));
        let call = r#"{"tool_call": {"name": "get_weather", "arguments": {"city": "Paris"}}}"#;
        assert_eq!(out[2].content, call);
        assert_eq!(parse_reply(&out[2].content), parse_reply(call));
        assert_eq!(
            out[3].content,
            r#"{"tool_response": {"name": "get_weather", "content": "18 C, \"sunny\""}}"#
        );
        assert_eq!(
            (out[3].role.as_str(), out[4].content.as_str()),
            ("user", r#"{"response": "It is sunny."}"#)
        );
        let mut bad = msgs.clone();
        bad[3].tool_call_id = Some("call_9".into());
        let e = render_messages(&bad, Some(&p)).unwrap_err();
        assert_eq!(
            e.body().error.param.as_deref(),
            Some("messages[3].tool_call_id")
        );
        let mut bad = msgs;
        bad[2].tool_calls.as_mut().unwrap()[0].function.arguments = "{nope".into();
        let e = render_messages(&bad, Some(&p)).unwrap_err();
        assert_eq!(
            e.body().error.param.as_deref(),
            Some("messages[2].tool_calls[0].function.arguments")
        );
    }
}
