//! Tool calls in a template family's own format, with synthetic templates written in the style of
//! each family's real ones (the default model's template has no tool support): rendering of tools,
//! calls and results to the exact expected text; parsing of model text back into calls; the
//! rendered history of call N is a prefix of call N+1's; the constrained grammar accepts a valid
//! call and rejects invalid ones; and, on the real default model with a Hermes template swapped
//! in, calls through the HTTP route (plain and streamed) with a cached history.

mod common;

use std::sync::Arc;

use api::{ChatCompletionRequest, ChatMessage, Role, ToolChoice, ToolChoiceMode};
use frontend::chat::ChatTemplate;
use model::{ConstraintSpec, Model};
use serde_json::{json, Value};
use server::grammar::Grammars;
use server::tool_families::{self, Family, FamilySyntax};
use server::tools::{self, ParsedCall, Reply};

/// Qwen 2.5 / Hermes style: tools in the system turn, `<tool_call>` blocks, results as
/// `<tool_response>` in a user turn.
const HERMES: &str = r#"{%- if tools %}
{{- '<|im_start|>system\n' }}
{%- if messages[0].role == 'system' %}{{- messages[0].content + '\n\n' }}{%- endif %}
{{- '# Tools\n\nYou may call one or more functions to assist with the user query.\n\n<tools>' }}
{%- for tool in tools %}{{- '\n' + tool | tojson }}{%- endfor %}
{{- '\n</tools>\n\nFor each function call, return a json object with function name and arguments within <tool_call></tool_call> XML tags:\n<tool_call>\n{"name": <function-name>, "arguments": <args-json-object>}\n</tool_call><|im_end|>\n' }}
{%- elif messages[0].role == 'system' %}
{{- '<|im_start|>system\n' + messages[0].content + '<|im_end|>\n' }}
{%- endif %}
{%- for message in messages %}
{%- if message.role == 'user' or (message.role == 'system' and not loop.first) or (message.role == 'assistant' and not message.tool_calls) %}
{{- '<|im_start|>' + message.role + '\n' + message.content + '<|im_end|>\n' }}
{%- elif message.role == 'assistant' %}
{{- '<|im_start|>assistant' }}
{%- if message.content %}{{- '\n' + message.content }}{%- endif %}
{%- for tool_call in message.tool_calls %}
{%- set f = tool_call.function %}
{{- '\n<tool_call>\n{"name": "' + f.name + '", "arguments": ' + f.arguments | tojson + '}\n</tool_call>' }}
{%- endfor %}
{{- '<|im_end|>\n' }}
{%- elif message.role == 'tool' %}
{%- if loop.first or messages[loop.index0 - 1].role != 'tool' %}{{- '<|im_start|>user' }}{%- endif %}
{{- '\n<tool_response>\n' + message.content + '\n</tool_response>' }}
{%- if loop.last or messages[loop.index0 + 1].role != 'tool' %}{{- '<|im_end|>\n' }}{%- endif %}
{%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}{{- '<|im_start|>assistant\n' }}{%- endif %}"#;

/// Llama 3.1 style: tools in the first user turn, one JSON call with `parameters`, results under
/// the `ipython` role.
const LLAMA3: &str = r#"{{- bos_token }}
{%- if messages[0].role == 'system' %}{%- set system_message = messages[0].content %}{%- set messages = messages[1:] %}{%- else %}{%- set system_message = '' %}{%- endif %}
{{- '<|start_header_id|>system<|end_header_id|>\n\n' }}
{%- if tools %}{{- 'Environment: ipython\n' }}{%- endif %}
{{- 'Cutting Knowledge Date: December 2023\n\n' + system_message + '<|eot_id|>' }}
{%- if tools %}
{%- set first = messages[0].content %}{%- set messages = messages[1:] %}
{{- '<|start_header_id|>user<|end_header_id|>\n\nGiven the following functions, respond with a JSON for a function call.\n\nRespond in the format {"name": function name, "parameters": dictionary of argument name and its value}.\n\n' }}
{%- for t in tools %}{{- t | tojson(indent=4) + '\n\n' }}{%- endfor %}
{{- first + '<|eot_id|>' }}
{%- endif %}
{%- for message in messages %}
{%- if message.role == 'assistant' and message.tool_calls %}
{%- if message.tool_calls | length != 1 %}{{- raise_exception('This model only supports single tool-calls at once!') }}{%- endif %}
{%- set f = message.tool_calls[0].function %}
{{- '<|start_header_id|>assistant<|end_header_id|>\n\n{"name": "' + f.name + '", "parameters": ' + f.arguments | tojson + '}<|eot_id|>' }}
{%- elif message.role == 'tool' or message.role == 'ipython' %}
{{- '<|start_header_id|>ipython<|end_header_id|>\n\n' + message.content + '<|eot_id|>' }}
{%- else %}
{{- '<|start_header_id|>' + message.role + '<|end_header_id|>\n\n' + message.content | trim + '<|eot_id|>' }}
{%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}{{- '<|start_header_id|>assistant<|end_header_id|>\n\n' }}{%- endif %}"#;

/// Mistral style: tools before the last user turn, `[TOOL_CALLS][…]` with 9-character ids,
/// `[TOOL_RESULTS]` naming the call.
const MISTRAL: &str = r#"{%- if messages[0].role == 'system' %}{%- set system_message = messages[0].content %}{%- set loop_messages = messages[1:] %}{%- else %}{%- set loop_messages = messages %}{%- endif %}
{%- set user_messages = loop_messages | selectattr('role', 'equalto', 'user') | list %}
{{- bos_token }}
{%- if system_message is defined %}{{- '[SYSTEM_PROMPT]' + system_message + '[/SYSTEM_PROMPT]' }}{%- endif %}
{%- for message in loop_messages %}
{%- if message.role == 'user' %}
{%- if tools and message == user_messages[-1] %}
{{- '[AVAILABLE_TOOLS][' }}{%- for t in tools %}{{- t | tojson }}{%- if not loop.last %}{{- ', ' }}{%- endif %}{%- endfor %}{{- '][/AVAILABLE_TOOLS]' }}
{%- endif %}
{{- '[INST]' + message.content + '[/INST]' }}
{%- elif message.role == 'assistant' and message.tool_calls %}
{{- '[TOOL_CALLS][' }}
{%- for tc in message.tool_calls %}
{%- if tc.id | length != 9 %}{{- raise_exception('Tool call IDs should be alphanumeric strings with length 9!') }}{%- endif %}
{{- (tc.function | tojson)[:-1] + ', "id": "' + tc.id + '"}' }}{%- if not loop.last %}{{- ', ' }}{%- endif %}
{%- endfor %}
{{- ']' + eos_token }}
{%- elif message.role == 'assistant' %}
{{- message.content + eos_token }}
{%- elif message.role == 'tool' %}
{{- '[TOOL_RESULTS]{"content": ' + message.content | tojson + ', "call_id": "' + message.tool_call_id + '"}[/TOOL_RESULTS]' }}
{%- endif %}
{%- endfor %}"#;

fn tools_json() -> Value {
    json!([
        {"type": "function", "function": {"name": "get_weather",
            "description": "Current weather in a city",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                           "required": ["city"]}}},
        {"type": "function", "function": {"name": "get_time",
            "parameters": {"type": "object",
                           "properties": {"timezone": {"type": "string", "enum": ["UTC", "CET"]}},
                           "required": ["timezone"]}}}
    ])
}

fn tools() -> Vec<api::Tool> {
    serde_json::from_value(tools_json()).unwrap()
}

/// The family's syntax as the probe reads it from the synthetic template.
fn syntax(family: Family) -> FamilySyntax {
    let (_, _, eos) = template_parts(family);
    FamilySyntax {
        layout: tool_families::probe(&template(family), family, &[eos]).unwrap(),
        ..FamilySyntax::new(family)
    }
}

fn template_parts(family: Family) -> (&'static str, &'static str, &'static str) {
    match family {
        Family::Hermes => (HERMES, "", "<|im_end|>"),
        Family::Llama3 => (LLAMA3, "<|begin_of_text|>", "<|eot_id|>"),
        Family::Mistral => (MISTRAL, "<s>", "</s>"),
    }
}

fn template(family: Family) -> ChatTemplate {
    let (src, bos, eos) = template_parts(family);
    assert_eq!(Family::detect(src), Some(family));
    ChatTemplate::new(src, bos, eos).unwrap()
}

/// The text the template adds after a reply the model ended (its end-of-turn token).
fn end_of_turn(family: Family) -> &'static str {
    match family {
        Family::Hermes => "<|im_end|>",
        Family::Llama3 => "<|eot_id|>",
        Family::Mistral => "</s>",
    }
}

fn render(family: Family, messages: &[ChatMessage], generation: bool) -> String {
    let msgs = tool_families::template_messages(messages).unwrap();
    let tools = tool_families::tools_value(&tools());
    template(family)
        .render(&msgs, Some(&tools), generation)
        .unwrap()
}

fn assistant_call(id: &str, name: &str, args: &str) -> ChatMessage {
    ChatMessage {
        content: None,
        tool_calls: Some(vec![api::ToolCall {
            id: id.into(),
            kind: api::FunctionKind::Function,
            function: api::FunctionCall {
                name: name.into(),
                arguments: args.into(),
            },
        }]),
        ..ChatMessage::new(Role::Assistant, "")
    }
}

fn tool_result(id: &str, content: &str) -> ChatMessage {
    ChatMessage {
        tool_call_id: Some(id.into()),
        ..ChatMessage::new(Role::Tool, content)
    }
}

/// What the model writes for one call of get_weather(Paris) in each family.
fn written_call(family: Family, id: &str) -> String {
    match family {
        Family::Hermes => {
            "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>"
                .into()
        }
        Family::Llama3 => r#"{"name": "get_weather", "parameters": {"city": "Paris"}}"#.into(),
        Family::Mistral => format!(
            r#"[TOOL_CALLS][{{"name": "get_weather", "arguments": {{"city": "Paris"}}, "id": "{id}"}}]"#
        ),
    }
}

#[test]
fn families_are_detected_from_the_template_text() {
    assert_eq!(Family::detect("{{ '<|im_start|>' }}"), None);
    assert_eq!(
        Family::detect(ChatTemplate::fallback().source()),
        None,
        "the fallback ChatML has no tool format"
    );
    assert_eq!(
        Family::detect(model().chat_template_or_fallback().source()),
        None,
        "the default model's template has no tool format: the generic mode"
    );
}

#[test]
fn each_family_renders_tools_calls_and_results_exactly() {
    let conversation = |id: &str| {
        vec![
            ChatMessage::new(Role::System, "Be brief."),
            ChatMessage::new(Role::User, "Weather in Paris?"),
            assistant_call(id, "get_weather", r#"{"city": "Paris"}"#),
            tool_result(id, "18 C"),
        ]
    };
    let hermes = render(Family::Hermes, &conversation("call_1"), true);
    assert_eq!(
        hermes,
        "<|im_start|>system\nBe brief.\n\n# Tools\n\nYou may call one or more functions to assist with the user query.\n\n<tools>\n\
         {\"type\": \"function\", \"function\": {\"name\": \"get_weather\", \"description\": \"Current weather in a city\", \"parameters\": {\"type\": \"object\", \"properties\": {\"city\": {\"type\": \"string\"}}, \"required\": [\"city\"]}}}\n\
         {\"type\": \"function\", \"function\": {\"name\": \"get_time\", \"parameters\": {\"type\": \"object\", \"properties\": {\"timezone\": {\"type\": \"string\", \"enum\": [\"UTC\", \"CET\"]}}, \"required\": [\"timezone\"]}}}\n\
         </tools>\n\nFor each function call, return a json object with function name and arguments within <tool_call></tool_call> XML tags:\n<tool_call>\n{\"name\": <function-name>, \"arguments\": <args-json-object>}\n</tool_call><|im_end|>\n\
         <|im_start|>user\nWeather in Paris?<|im_end|>\n\
         <|im_start|>assistant\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call><|im_end|>\n\
         <|im_start|>user\n<tool_response>\n18 C\n</tool_response><|im_end|>\n\
         <|im_start|>assistant\n"
    );
    let llama = render(Family::Llama3, &conversation("call_1"), true);
    assert_eq!(
        llama,
        "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\nEnvironment: ipython\nCutting Knowledge Date: December 2023\n\nBe brief.<|eot_id|>\
         <|start_header_id|>user<|end_header_id|>\n\nGiven the following functions, respond with a JSON for a function call.\n\n\
         Respond in the format {\"name\": function name, \"parameters\": dictionary of argument name and its value}.\n\n\
         {\n    \"type\": \"function\",\n    \"function\": {\n        \"name\": \"get_weather\",\n        \"description\": \"Current weather in a city\",\n        \"parameters\": {\n            \"type\": \"object\",\n            \"properties\": {\n                \"city\": {\n                    \"type\": \"string\"\n                }\n            },\n            \"required\": [\n                \"city\"\n            ]\n        }\n    }\n}\n\n\
         {\n    \"type\": \"function\",\n    \"function\": {\n        \"name\": \"get_time\",\n        \"parameters\": {\n            \"type\": \"object\",\n            \"properties\": {\n                \"timezone\": {\n                    \"type\": \"string\",\n                    \"enum\": [\n                        \"UTC\",\n                        \"CET\"\n                    ]\n                }\n            },\n            \"required\": [\n                \"timezone\"\n            ]\n        }\n    }\n}\n\n\
         Weather in Paris?<|eot_id|>\
         <|start_header_id|>assistant<|end_header_id|>\n\n{\"name\": \"get_weather\", \"parameters\": {\"city\": \"Paris\"}}<|eot_id|>\
         <|start_header_id|>ipython<|end_header_id|>\n\n18 C<|eot_id|>\
         <|start_header_id|>assistant<|end_header_id|>\n\n"
    );
    let mistral = render(Family::Mistral, &conversation("a1b2c3d4e"), true);
    assert_eq!(
        mistral,
        "<s>[SYSTEM_PROMPT]Be brief.[/SYSTEM_PROMPT]\
         [AVAILABLE_TOOLS][{\"type\": \"function\", \"function\": {\"name\": \"get_weather\", \"description\": \"Current weather in a city\", \"parameters\": {\"type\": \"object\", \"properties\": {\"city\": {\"type\": \"string\"}}, \"required\": [\"city\"]}}}, \
         {\"type\": \"function\", \"function\": {\"name\": \"get_time\", \"parameters\": {\"type\": \"object\", \"properties\": {\"timezone\": {\"type\": \"string\", \"enum\": [\"UTC\", \"CET\"]}}, \"required\": [\"timezone\"]}}}][/AVAILABLE_TOOLS]\
         [INST]Weather in Paris?[/INST]\
         [TOOL_CALLS][{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}, \"id\": \"a1b2c3d4e\"}]</s>\
         [TOOL_RESULTS]{\"content\": \"18 C\", \"call_id\": \"a1b2c3d4e\"}[/TOOL_RESULTS]"
    );
    // A result must answer an earlier call; arguments must be a JSON object.
    let mut bad = conversation("call_1");
    bad[3].tool_call_id = Some("call_9".into());
    let e = tool_families::template_messages(&bad).unwrap_err();
    assert_eq!(
        e.body().error.param.as_deref(),
        Some("messages[3].tool_call_id")
    );
    let mut bad = conversation("call_1");
    bad[2].tool_calls.as_mut().unwrap()[0].function.arguments = "[1]".into();
    let e = tool_families::template_messages(&bad).unwrap_err();
    assert_eq!(
        e.body().error.param.as_deref(),
        Some("messages[2].tool_calls[0].function.arguments")
    );
}

#[test]
fn model_text_parses_into_calls_per_family() {
    let call = |name: &str, args: &str, id: Option<&str>| ParsedCall {
        name: name.into(),
        arguments: args.into(),
        id: id.map(str::to_string),
    };
    assert_eq!(
        tool_families::parse(Family::Hermes, &written_call(Family::Hermes, "")),
        Reply::Calls(vec![call("get_weather", r#"{"city": "Paris"}"#, None)])
    );
    assert_eq!(
        tool_families::parse(
            Family::Hermes,
            "<tool_call>\n{\"name\": \"a\", \"arguments\": {}}\n</tool_call>\n<tool_call>\n{\"name\": \"b\", \"arguments\": {\"x\": [1]}}\n</tool_call>"
        ),
        Reply::Calls(vec![call("a", "{}", None), call("b", r#"{"x": [1]}"#, None)])
    );
    assert_eq!(
        tool_families::parse(Family::Hermes, "It is sunny."),
        Reply::Text("It is sunny.".into())
    );
    assert_eq!(
        tool_families::parse(Family::Hermes, "<tool_call>\n{\"name\": \"a\", \"argu"),
        Reply::Cut(Vec::new())
    );
    // Cut after a complete call: that call is kept.
    assert_eq!(
        tool_families::parse(
            Family::Hermes,
            "<tool_call>\n{\"name\": \"a\", \"arguments\": {}}\n</tool_call>\n<tool_call>\n{\"name\": \"b\", \"argu"
        ),
        Reply::Cut(vec![call("a", "{}", None)])
    );
    assert_eq!(
        tool_families::parse(
            Family::Mistral,
            "[TOOL_CALLS] [{\"name\": \"a\", \"arguments\": {\"x\": 1}}, {\"name\": \"b\", \"arg"
        ),
        Reply::Cut(vec![call("a", r#"{"x": 1}"#, None)])
    );
    assert_eq!(
        tool_families::parse(Family::Llama3, &written_call(Family::Llama3, "")),
        Reply::Calls(vec![call("get_weather", r#"{"city": "Paris"}"#, None)])
    );
    assert_eq!(
        tool_families::parse(Family::Llama3, "{\"name\": \"get_weather\", \"param"),
        Reply::Cut(Vec::new())
    );
    let mistral = written_call(Family::Mistral, "a1b2c3d4e");
    let expect = Reply::Calls(vec![call(
        "get_weather",
        r#"{"city": "Paris"}"#,
        Some("a1b2c3d4e"),
    )]);
    assert_eq!(tool_families::parse(Family::Mistral, &mistral), expect);
    // With `[TOOL_CALLS]` a special token, its text is not in the output.
    let hidden = mistral.strip_prefix("[TOOL_CALLS]").unwrap();
    assert_eq!(tool_families::parse(Family::Mistral, hidden), expect);
    assert_eq!(
        tool_families::parse(Family::Mistral, "[1, 2] are numbers"),
        Reply::Text("[1, 2] are numbers".into())
    );
}

#[test]
fn the_history_of_call_n_is_a_prefix_of_call_n_plus_1_in_every_family() {
    for family in [Family::Hermes, Family::Llama3, Family::Mistral] {
        let id = |n: usize| format!("abcdefgh{n}");
        let mut messages = vec![
            ChatMessage::new(Role::System, "Be brief."),
            ChatMessage::new(Role::User, "Weather in Paris, three times?"),
        ];
        let mut prompt = render(family, &messages, true);
        for n in 0..3 {
            // The model writes a call; the client sends it back with the result.
            let written = written_call(family, &id(n));
            let Reply::Calls(calls) = tool_families::parse(family, &written) else {
                panic!("{family:?}: {written}")
            };
            let call_id = calls[0].id.clone().unwrap_or_else(|| id(n));
            messages.push(assistant_call(
                &call_id,
                &calls[0].name,
                &calls[0].arguments,
            ));
            messages.push(tool_result(&call_id, &format!("{} C", 18 + n)));
            let next = render(family, &messages, true);
            let expected = format!("{prompt}{written}{}", end_of_turn(family));
            assert!(
                next.starts_with(&expected),
                "{family:?} call {n}:\n{next}\n--- does not extend ---\n{expected}"
            );
            prompt = next;
        }
    }
}

fn model() -> Arc<Model> {
    common::model()
}

fn grammars() -> &'static Grammars {
    static G: std::sync::OnceLock<Grammars> = std::sync::OnceLock::new();
    G.get_or_init(|| Grammars::new(model().frontend().clone()).unwrap())
}

/// Whether the constraint lets the model write `text` (tokenised by the model) and then end.
fn accepts(spec: &ConstraintSpec, text: &str) -> bool {
    let m = model();
    let vocab = m.tokenizer().vocab_size();
    let mut c = spec.0.start();
    for id in m.tokenizer().encode(text, false, false).unwrap() {
        let mut logits = vec![0.0f32; vocab];
        if c.mask_logits(&mut logits).is_err() {
            return false;
        }
        if logits[id as usize] == f32::NEG_INFINITY {
            return false;
        }
        c.accept(id);
    }
    let mut logits = vec![0.0f32; vocab];
    if c.mask_logits(&mut logits).is_err() {
        return false;
    }
    logits[m.tokenizer().eot_ids()[0] as usize] != f32::NEG_INFINITY
}

fn request(choice: ToolChoice, parallel: bool) -> ChatCompletionRequest {
    ChatCompletionRequest {
        model: "m".into(),
        messages: vec![ChatMessage::new(Role::User, "Weather in Paris?")],
        tools: Some(tools()),
        tool_choice: Some(choice),
        parallel_tool_calls: Some(parallel),
        ..Default::default()
    }
}

fn constraint(family: Family, choice: ToolChoice, parallel: bool) -> ConstraintSpec {
    let plan = tools::plan(&request(choice, parallel), None, Some(syntax(family)), 8)
        .unwrap()
        .unwrap();
    assert_eq!(plan.system_text, "", "the template describes the tools");
    let lark = plan.lark.unwrap();
    grammars()
        .compile(&server::structured::OutputFormat::Lark(lark.clone()))
        .unwrap_or_else(|e| panic!("{family:?}: {e}\n{lark}"))
}

#[test]
fn the_constrained_grammar_accepts_valid_calls_and_rejects_invalid_ones() {
    let required = ToolChoice::Mode(ToolChoiceMode::Required);
    let auto = ToolChoice::Mode(ToolChoiceMode::Auto);
    for family in [Family::Hermes, Family::Llama3, Family::Mistral] {
        let valid = written_call(family, "a1b2c3d4e");
        let req = constraint(family, required.clone(), true);
        assert!(accepts(&req, &valid), "{family:?}: {valid}");
        let bad_type = valid.replace("\"Paris\"", "12");
        let bad_key = valid.replace("\"city\"", "\"town\"");
        let bad_name = valid.replace("get_weather", "get_wether");
        let loose = valid.replace("\"name\": ", "\"name\":");
        for bad in [&bad_type, &bad_key, &bad_name, &loose] {
            assert!(!accepts(&req, bad), "{family:?} accepted {bad}");
        }
        assert!(
            !accepts(&req, "It is sunny."),
            "{family:?}: text under required"
        );
        let with_auto = constraint(family, auto.clone(), true);
        assert!(accepts(&with_auto, &valid), "{family:?}");
        assert!(accepts(&with_auto, "It is sunny."), "{family:?}");
        assert!(!accepts(&with_auto, &bad_type), "{family:?}");
        let enum_ok = match family {
            Family::Hermes => "<tool_call>\n{\"name\": \"get_time\", \"arguments\": {\"timezone\": \"CET\"}}\n</tool_call>".to_string(),
            Family::Llama3 => r#"{"name": "get_time", "parameters": {"timezone": "CET"}}"#.to_string(),
            Family::Mistral => r#"[TOOL_CALLS][{"name": "get_time", "arguments": {"timezone": "CET"}, "id": "zzzzzzzzz"}]"#.to_string(),
        };
        assert!(accepts(&req, &enum_ok), "{family:?}");
        assert!(!accepts(&req, &enum_ok.replace("CET", "PST")), "{family:?}");
    }
    // Under auto, text may not start the way a call does (it would be neither).
    let hermes_auto = constraint(Family::Hermes, auto.clone(), true);
    assert!(accepts(&hermes_auto, "<tools> are fun"));
    assert!(!accepts(&hermes_auto, "<tool_call> is a tag"));
    let llama_auto = constraint(Family::Llama3, auto.clone(), true);
    assert!(!accepts(&llama_auto, "{\"answer\": 1}"));
    // Several calls where the family allows them and parallel calls are on.
    let two = format!(
        "{}\n{}",
        written_call(Family::Hermes, ""),
        written_call(Family::Hermes, "")
    );
    assert!(accepts(
        &constraint(Family::Hermes, required.clone(), true),
        &two
    ));
    assert!(!accepts(
        &constraint(Family::Hermes, required.clone(), false),
        &two
    ));
    let two = r#"[TOOL_CALLS][{"name": "get_weather", "arguments": {"city": "Paris"}, "id": "a1b2c3d4e"}, {"name": "get_time", "arguments": {"timezone": "UTC"}, "id": "b1b2c3d4e"}]"#;
    assert!(accepts(
        &constraint(Family::Mistral, required.clone(), true),
        two
    ));
    // Mistral ids are 9 letters or digits.
    let short = written_call(Family::Mistral, "abc");
    assert!(!accepts(
        &constraint(Family::Mistral, required.clone(), true),
        &short
    ));
    // A named tool allows only that tool.
    let named = ToolChoice::Named(api::NamedToolChoice {
        kind: api::FunctionKind::Function,
        function: api::FunctionName {
            name: "get_time".into(),
        },
    });
    let only_time = constraint(Family::Llama3, named, true);
    assert!(!accepts(&only_time, &written_call(Family::Llama3, "")));
    assert!(accepts(
        &only_time,
        r#"{"name": "get_time", "parameters": {"timezone": "UTC"}}"#
    ));
}

/// A server over the default model with the Hermes template swapped in.
fn hermes_app() -> (engine::Engine, axum::Router) {
    let mut m = Model::load(&model::default_model_path()).expect("default model");
    m.frontend_mut().expect("a fresh model").chat_template = Some(template(Family::Hermes));
    let m = Arc::new(m);
    let cfg = engine::EngineConfig {
        num_blocks: 256,
        threads: 2,
        ..engine::EngineConfig::default()
    };
    let engine = engine::Engine::start(engine::EngineCore::new(m.clone(), cfg).expect("engine"));
    let state = server::AppState::new(
        engine.handle(),
        m.frontend().clone(),
        server::ServerSettings::default(),
    )
    .unwrap();
    (engine, server::router(state))
}

fn hermes_body(choice: Value, messages: Value) -> Value {
    json!({"model": "agentkv", "messages": messages, "tools": tools_json(),
           "tool_choice": choice, "max_tokens": 64, "temperature": 0})
}

fn check_weather_call(c: &Value) -> String {
    assert!(c["id"].as_str().unwrap().starts_with("call_"), "{c}");
    assert_eq!(c["function"]["name"], "get_weather", "{c}");
    let args: Value = serde_json::from_str(c["function"]["arguments"].as_str().unwrap()).unwrap();
    assert!(
        args["city"].is_string() && args.as_object().unwrap().len() == 1,
        "{args}"
    );
    c["function"]["arguments"].as_str().unwrap().to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hermes_calls_on_the_real_model_round_trip_from_the_cache_and_stream_as_deltas() {
    let (_e, r) = hermes_app();
    let named = json!({"type": "function", "function": {"name": "get_weather"}});
    let messages = json!([{"role": "system", "content": "You are a helpful assistant."},
                          {"role": "user", "content": "What is the weather in Paris?"}]);
    let first = common::call(
        &r,
        "POST",
        "/v1/chat/completions",
        None,
        &hermes_body(named.clone(), messages.clone()).to_string(),
    )
    .await;
    assert_eq!(first.status, 200, "{}", first.body);
    let first = first.json();
    let choice = &first["choices"][0];
    println!("hermes call: {}", choice["message"]);
    assert_eq!(choice["finish_reason"], "tool_calls");
    let call = &choice["message"]["tool_calls"][0];
    let args = check_weather_call(call);

    // The call and its result go back through the template; the first prompt (and the call
    // the model wrote) come from the cache.
    let mut history = messages.as_array().unwrap().clone();
    history.push(choice["message"].clone());
    history.push(json!({"role": "tool", "tool_call_id": call["id"], "content": "18 C and sunny"}));
    let second = common::call(
        &r,
        "POST",
        "/v1/chat/completions",
        None,
        &hermes_body(json!("auto"), Value::Array(history)).to_string(),
    )
    .await;
    assert_eq!(second.status, 200, "{}", second.body);
    let second = second.json();
    println!(
        "hermes after the result: {}",
        second["choices"][0]["message"]
    );
    let first_prompt = first["usage"]["prompt_tokens"].as_u64().unwrap();
    let cached = second["usage"]["prompt_tokens_details"]["cached_tokens"]
        .as_u64()
        .unwrap();
    assert!(
        cached >= first_prompt / 16 * 16 && cached > 0,
        "cached {cached} of a first prompt of {first_prompt}: {second}"
    );
    assert!(second["usage"]["prompt_tokens_details"]
        .get("cache_miss")
        .is_none_or(|m| m.is_null() || m["at_token"].as_u64().unwrap() >= first_prompt));

    // Streamed: the name first, then the arguments in pieces, the same call as above.
    let mut b = hermes_body(named, messages);
    b["stream"] = true.into();
    let reply = common::call(&r, "POST", "/v1/chat/completions", None, &b.to_string()).await;
    assert_eq!(reply.status, 200, "{}", reply.body);
    let chunks: Vec<Value> = reply
        .body
        .lines()
        .filter_map(|l| l.strip_prefix("data: "))
        .filter(|e| *e != "[DONE]")
        .map(|e| serde_json::from_str(e).unwrap())
        .collect();
    let deltas: Vec<&Value> = chunks
        .iter()
        .filter_map(|c| c["choices"][0]["delta"]["tool_calls"].get(0))
        .collect();
    assert!(deltas.len() > 2, "{}", reply.body);
    let mut streamed: Vec<(String, String)> = Vec::new();
    for d in deltas {
        let i = d["index"].as_u64().unwrap() as usize;
        if i == streamed.len() {
            assert!(d["id"].is_string(), "{d}");
            streamed.push((
                d["function"]["name"].as_str().unwrap().into(),
                String::new(),
            ));
        } else {
            assert!(d.get("id").is_none(), "{d}");
        }
        streamed[i]
            .1
            .push_str(d["function"]["arguments"].as_str().unwrap());
    }
    let whole: Vec<(String, String)> = choice["message"]["tool_calls"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| {
            (
                c["function"]["name"].as_str().unwrap().into(),
                c["function"]["arguments"].as_str().unwrap().into(),
            )
        })
        .collect();
    assert_eq!(streamed, whole);
    assert_eq!(whole[0].1, args);
    assert_eq!(
        chunks.last().unwrap()["choices"][0]["finish_reason"],
        "tool_calls"
    );
    assert!(chunks.iter().all(|c| c["choices"][0]["delta"]["content"]
        .as_str()
        .unwrap_or("")
        .is_empty()));
}

#[test]
fn a_special_token_trigger_is_asked_for_by_id() {
    // Mistral's `[TOOL_CALLS]` is one control token in its vocabularies; the default model has
    // none, so its `<|im_start|>` stands in for it.
    let m = model();
    let trigger = m.tokenizer().token_to_id("<|im_start|>").unwrap();
    assert!(m.tokenizer().is_special(trigger));
    let syntax = FamilySyntax {
        trigger_token: Some(trigger),
        ..FamilySyntax::new(Family::Mistral)
    };
    let auto = ToolChoice::Mode(ToolChoiceMode::Auto);
    let plan = tools::plan(&request(auto, true), None, Some(syntax), 8)
        .unwrap()
        .unwrap();
    let lark = plan.lark.unwrap();
    assert!(lark.contains(&format!("<[{trigger}]> \"[\"")), "{lark}");
    let spec = grammars()
        .compile(&server::structured::OutputFormat::Lark(lark))
        .unwrap();
    let body = r#"[{"name": "get_weather", "arguments": {"city": "Paris"}, "id": "a1b2c3d4e"}]"#;
    let ids: Vec<u32> = std::iter::once(trigger)
        .chain(m.tokenizer().encode(body, false, false).unwrap())
        .collect();
    let vocab = m.tokenizer().vocab_size();
    let allowed = |ids: &[u32]| {
        let mut c = spec.0.start();
        for &id in ids {
            let mut logits = vec![0.0f32; vocab];
            if c.mask_logits(&mut logits).is_err() {
                return false;
            }
            if logits[id as usize] == f32::NEG_INFINITY {
                return false;
            }
            c.accept(id);
        }
        true
    };
    assert!(allowed(&ids), "the trigger token, then the calls");
    assert!(
        !allowed(&m.tokenizer().encode(body, false, false).unwrap()),
        "the calls without the trigger are text that starts like a call"
    );
    assert!(!allowed(
        &m.tokenizer()
            .encode(&format!("[TOOL_CALLS]{body}"), false, false)
            .unwrap()
    ));
    assert!(accepts(&spec, "[1, 2] are numbers"));
    // The output text has no trigger (control tokens print nothing): still parsed as calls.
    assert!(matches!(
        tool_families::parse(Family::Mistral, body),
        Reply::Calls(c) if c[0].id.as_deref() == Some("a1b2c3d4e")
    ));
}

#[test]
fn the_probe_reads_each_template_s_layout() {
    for family in [Family::Hermes, Family::Llama3, Family::Mistral] {
        assert_eq!(
            syntax(family).layout,
            tool_families::Layout::default_for(family),
            "{family:?}"
        );
    }
    // A variant of the family (as Mistral Small 3.1's template): a space after the trigger and
    // after `[TOOL_RESULTS]`, the last 9 characters of longer ids.
    let variant = MISTRAL
        .replace("'[TOOL_CALLS]['", "'[TOOL_CALLS] ['")
        .replace("'[TOOL_RESULTS]{", "'[TOOL_RESULTS] {")
        .replace("tc.id | length != 9", "tc.id | length < 9")
        .replace("+ tc.id +", "+ tc.id[-9:] +");
    let t = ChatTemplate::new(&variant, "<s>", "</s>").unwrap();
    let layout = tool_families::probe(&t, Family::Mistral, &["</s>"]).unwrap();
    assert_eq!(layout.prefix, "[TOOL_CALLS] [");
    assert_eq!(layout.separator.as_deref(), Some(", "));
    assert_eq!((layout.suffix.as_str(), layout.with_id), ("]", true));
    let spaced = FamilySyntax {
        layout,
        ..FamilySyntax::new(Family::Mistral)
    };
    // The grammar writes what this template re-renders, so the history stays a prefix.
    let written = r#"[TOOL_CALLS] [{"name": "get_weather", "arguments": {"city": "Paris"}, "id": "a1b2c3d4e"}]"#;
    let required = ToolChoice::Mode(ToolChoiceMode::Required);
    let plan = tools::plan(&request(required, true), None, Some(spaced), 8)
        .unwrap()
        .unwrap();
    let spec = grammars()
        .compile(&server::structured::OutputFormat::Lark(plan.lark.unwrap()))
        .unwrap();
    assert!(accepts(&spec, written));
    assert!(!accepts(&spec, &written.replace("] [", "][")));
    let Reply::Calls(calls) = tool_families::parse(Family::Mistral, written) else {
        panic!("{written}")
    };
    let tools = tool_families::tools_value(&tools());
    let mut messages = vec![ChatMessage::new(Role::User, "Weather in Paris?")];
    let msgs = tool_families::template_messages(&messages).unwrap();
    let before = t.render(&msgs, Some(&tools), true).unwrap();
    let id = calls[0].id.clone().unwrap();
    messages.push(assistant_call(&id, &calls[0].name, &calls[0].arguments));
    messages.push(tool_result(&id, "18 C"));
    let msgs = tool_families::template_messages(&messages).unwrap();
    let after = t.render(&msgs, Some(&tools), true).unwrap();
    assert!(
        after.starts_with(&format!("{before}{written}</s>")),
        "{after}"
    );
    // A template that writes calls some other way (indented arguments): the generic mode.
    let odd = HERMES.replace("f.arguments | tojson", "f.arguments | tojson(indent=2)");
    let t = ChatTemplate::new(&odd, "", "<|im_end|>").unwrap();
    assert_eq!(
        tool_families::probe(&t, Family::Hermes, &["<|im_end|>"]),
        None
    );
    // Llama 3 takes one call per turn (its template refuses two).
    assert_eq!(syntax(Family::Llama3).layout.separator, None);
}

/// Issue #45: the generic mode's grammar holds a turn to `max_calls` calls, keeps a tool's own
/// `$defs`/`$ref`s and bounds a string argument by its `maxLength`.
#[test]
fn generic_calls_are_bounded_nested_schemas_resolve_and_max_length_holds() {
    let tool: api::Tool =
        serde_json::from_value(serde_json::json!({"type": "function", "function": {
        "name": "f", "parameters": {"type": "object",
            "properties": {"s": {"type": "string", "maxLength": 5},
                           "items": {"type": "array", "items": {"$ref": "#/$defs/Item"}}},
            "required": ["s"],
            "$defs": {"Item": {"type": "object", "properties": {"n": {"type": "integer"}},
                               "required": ["n"]}}}}}))
        .unwrap();
    let req = ChatCompletionRequest {
        model: "m".into(),
        messages: vec![ChatMessage::new(Role::User, "Go.")],
        tools: Some(vec![tool]),
        tool_choice: Some(ToolChoice::Mode(api::ToolChoiceMode::Required)),
        ..Default::default()
    };
    let plan = tools::plan(&req, None, None, 2).unwrap().unwrap();
    let spec = grammars()
        .json_schema(&plan.schema)
        .unwrap_or_else(|e| panic!("{e}\n{}", plan.schema));
    let call = |s: &str, items: &str| {
        format!(r#"{{"name": "f", "arguments": {{"s": "{s}", "items": [{items}]}}}}"#)
    };
    let list = |calls: &[String]| format!(r#"{{"tool_calls": [{}]}}"#, calls.join(", "));
    assert!(accepts(&spec, &list(&[call("abcde", r#"{"n": 1}"#)])));
    assert!(!accepts(&spec, &list(&[call("abcdef", "")])), "maxLength");
    assert!(
        !accepts(&spec, &list(&[call("a", r#"{"m": 1}"#)])),
        "the $ref'd Item"
    );
    let two = call("a", "");
    assert!(accepts(&spec, &list(&[two.clone(), two.clone()])));
    assert!(
        !accepts(&spec, &list(&[two.clone(), two.clone(), two])),
        "max_calls"
    );
}
