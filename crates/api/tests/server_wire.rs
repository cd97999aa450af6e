//! Wire shapes the server needs: lenient `stop` and `content`, vLLM extras, error body, logprobs.

use api::*;

#[test]
fn stop_is_a_string_or_a_list_and_content_may_be_parts() {
    let r: ChatCompletionRequest = serde_json::from_str(
        r#"{"model":"m","stop":"x","top_k":5,"ignore_eos":true,"cache_salt":"s","n":2,
            "messages":[{"role":"user","content":[{"type":"text","text":"a"},{"type":"text","text":"b"}]}]}"#,
    )
    .unwrap();
    assert_eq!(r.stop, Some(vec!["x".to_string()]));
    assert_eq!(r.messages[0].content.as_deref(), Some("ab"));
    assert_eq!(r.extra.top_k, Some(5));
    assert_eq!(r.extra.ignore_eos, Some(true));
    assert_eq!(r.extra.cache_salt.as_deref(), Some("s"));
    assert_eq!(r.n, Some(2));
    let c: CompletionRequest =
        serde_json::from_str(r#"{"model":"m","prompt":"p","stop":["a","b"],"logprobs":2}"#)
            .unwrap();
    assert_eq!(c.stop.unwrap().len(), 2);
    assert_eq!(c.logprobs, Some(2));
    let bad = serde_json::from_str::<ChatCompletionRequest>(
        r#"{"model":"m","messages":[{"role":"user","content":[{"type":"image_url"}]}]}"#,
    );
    assert!(bad.unwrap_err().to_string().contains("image_url"));
}

#[test]
fn error_body_has_the_openai_shape() {
    let e = ErrorBody {
        error: ErrorDetail {
            message: "m".into(),
            kind: "invalid_request_error".into(),
            param: Some("n".into()),
            code: None,
        },
    };
    assert_eq!(
        serde_json::to_value(&e).unwrap(),
        serde_json::json!({"error":{"message":"m","type":"invalid_request_error","param":"n","code":null}})
    );
}

fn keys(v: serde_json::Value) -> std::collections::BTreeSet<String> {
    v.as_object().unwrap().keys().cloned().collect()
}

fn extras() -> SamplingExtras {
    SamplingExtras {
        top_k: Some(1),
        min_p: Some(0.1),
        repetition_penalty: Some(1.1),
        ignore_eos: Some(true),
        min_tokens: Some(1),
        stop_token_ids: Some(vec![1]),
        cache_salt: Some("s".into()),
        guided_json: Some(serde_json::json!({"type": "object"})),
        guided_choice: Some(vec!["a".into()]),
        guided_regex: Some("a+".into()),
        guided_grammar: Some("start: \"a\"".into()),
        structured_outputs: Some(StructuredOutputs::default()),
        grammar: Some("start: \"a\"".into()),
    }
}

fn cache_fields() -> api::CacheFields {
    api::CacheFields {
        prompt_cache_key: Some("k".into()),
        session_id: Some("s".into()),
        prompt_cache_retention: Some("24h".into()),
        cache_control: Some(api::CacheControl {
            kind: "ephemeral".into(),
            ttl: Some("1h".into()),
        }),
        priority: Some(-2),
    }
}

/// Every field is set (no `..Default::default()`), so a new field fails to compile here until it
/// is added, and then fails the comparison until `KnownFields::FIELDS` names it.
#[test]
fn known_fields_are_exactly_the_serialised_fields() {
    let chat = ChatCompletionRequest {
        model: "m".into(),
        messages: vec![ChatMessage::new(Role::User, "u")],
        max_tokens: Some(1),
        max_completion_tokens: Some(1),
        temperature: Some(0.0),
        top_p: Some(1.0),
        seed: Some(1),
        stop: Some(vec!["x".into()]),
        stream: Some(false),
        stream_options: Some(StreamOptions::default()),
        user: Some("u".into()),
        n: Some(1),
        logprobs: Some(false),
        top_logprobs: Some(0),
        presence_penalty: Some(0.0),
        frequency_penalty: Some(0.0),
        tools: Some(Vec::new()),
        tool_choice: Some(ToolChoice::Mode(ToolChoiceMode::Auto)),
        parallel_tool_calls: Some(true),
        logit_bias: Some(LogitBias::new()),
        response_format: Some(ResponseFormat::JsonObject),
        extra: extras(),
        cache: cache_fields(),
        max_tool_calls: None,
        store: Some(true),
        metadata: Some(Default::default()),
    };
    let expected: std::collections::BTreeSet<String> = ChatCompletionRequest::FIELDS
        .iter()
        .chain(SamplingExtras::FIELDS)
        .chain(api::CacheFields::FIELDS)
        .map(|s| s.to_string())
        .collect();
    assert_eq!(keys(serde_json::to_value(&chat).unwrap()), expected);
    let completion = CompletionRequest {
        model: "m".into(),
        prompt: Prompt::Text("p".into()),
        max_tokens: Some(1),
        temperature: Some(0.0),
        top_p: Some(1.0),
        seed: Some(1),
        stop: Some(vec!["x".into()]),
        echo: Some(false),
        stream: Some(false),
        stream_options: Some(StreamOptions::default()),
        user: Some("u".into()),
        n: Some(1),
        logprobs: Some(0),
        presence_penalty: Some(0.0),
        frequency_penalty: Some(0.0),
        logit_bias: Some(LogitBias::new()),
        response_format: Some(ResponseFormat::JsonObject),
        extra: extras(),
    };
    let expected: std::collections::BTreeSet<String> = CompletionRequest::FIELDS
        .iter()
        .chain(SamplingExtras::FIELDS)
        .map(|s| s.to_string())
        .collect();
    assert_eq!(keys(serde_json::to_value(&completion).unwrap()), expected);
    assert!(
        ChatCompletionRequest::is_known("top_k") && !ChatCompletionRequest::is_known("best_of")
    );
    assert!(!CompletionRequest::is_known("suffix"));
}

#[test]
fn tool_choice_is_a_mode_or_a_named_function() {
    let parse = |v: serde_json::Value| serde_json::from_value::<ToolChoice>(v);
    assert_eq!(
        parse(serde_json::json!("required")).unwrap(),
        ToolChoice::Mode(ToolChoiceMode::Required)
    );
    let named = parse(serde_json::json!({"type": "function", "function": {"name": "f"}})).unwrap();
    assert_eq!(
        named,
        ToolChoice::Named(NamedToolChoice {
            kind: FunctionKind::Function,
            function: FunctionName { name: "f".into() },
        })
    );
    assert!(parse(serde_json::json!(12345)).is_err());
    assert!(parse(serde_json::json!("sometimes")).is_err());
    let r: ChatCompletionRequest =
        serde_json::from_str(r#"{"model":"m","messages":[],"logit_bias":{"42":-100,"7":5.5}}"#)
            .unwrap();
    assert_eq!(r.logit_bias.unwrap()["42"], -100.0);
}

#[test]
fn tool_calls_and_their_deltas_have_the_openai_shape() {
    let m: ChatMessage = serde_json::from_value(serde_json::json!({"role": "assistant",
        "content": null, "tool_calls": [{"id": "call_1", "type": "function",
        "function": {"name": "f", "arguments": "{\"a\": 1}"}}]}))
    .unwrap();
    let calls = m.tool_calls.as_ref().unwrap();
    assert_eq!(
        (calls[0].id.as_str(), calls[0].function.arguments.as_str()),
        ("call_1", "{\"a\": 1}")
    );
    let d = ChatDelta {
        tool_calls: Some(vec![ToolCallDelta {
            index: 0,
            id: Some("call_1".into()),
            kind: Some(FunctionKind::Function),
            function: Some(FunctionCallDelta {
                name: Some("f".into()),
                arguments: Some("{}".into()),
            }),
        }]),
        ..Default::default()
    };
    assert_eq!(
        serde_json::to_value(&d).unwrap(),
        serde_json::json!({"tool_calls": [{"index": 0, "id": "call_1", "type": "function",
            "function": {"name": "f", "arguments": "{}"}}]})
    );
    let bad = serde_json::from_value::<Tool>(serde_json::json!({"type": "retrieval",
        "function": {"name": "f"}}));
    assert!(bad.is_err());
}

#[test]
fn response_format_has_the_openai_shapes() {
    let parse = |v: serde_json::Value| serde_json::from_value::<ResponseFormat>(v);
    assert_eq!(
        parse(serde_json::json!({"type": "json_object"})).unwrap(),
        ResponseFormat::JsonObject
    );
    let f = parse(
        serde_json::json!({"type": "json_schema", "json_schema": {"name": "p",
        "schema": {"type": "object"}, "strict": true}}),
    )
    .unwrap();
    assert_eq!(
        f,
        ResponseFormat::JsonSchema {
            json_schema: JsonSchemaFormat {
                name: "p".into(),
                description: None,
                schema: Some(serde_json::json!({"type": "object"})),
                strict: Some(true),
            }
        }
    );
    assert!(parse(serde_json::json!({"type": "xml"})).is_err());
    let s: StructuredOutputs =
        serde_json::from_value(serde_json::json!({"choice": ["a", "b"]})).unwrap();
    assert_eq!(s.choice.unwrap().len(), 2);
    assert!(serde_json::from_value::<StructuredOutputs>(serde_json::json!({"nope": 1})).is_err());
}

#[test]
fn responses_request_known_fields_and_items() {
    use api::responses::*;
    let req = ResponsesRequest {
        model: "m".into(),
        input: ResponseInput::Text("hi".into()),
        instructions: Some("i".into()),
        tools: Some(Vec::new()),
        tool_choice: Some(ResponseToolChoice::Mode(ToolChoiceMode::Auto)),
        parallel_tool_calls: Some(true),
        text: Some(TextConfig::default()),
        max_output_tokens: Some(1),
        temperature: Some(0.0),
        top_p: Some(1.0),
        stream: Some(false),
        store: Some(true),
        previous_response_id: Some("resp_1".into()),
        metadata: Some(Default::default()),
        include: Some(Vec::new()),
        user: Some("u".into()),
        cache: cache_fields(),
        truncation: Some(Truncation::Auto),
        max_tool_calls: Some(4),
    };
    let expected: std::collections::BTreeSet<String> = ResponsesRequest::FIELDS
        .iter()
        .chain(api::CacheFields::FIELDS)
        .map(|s| s.to_string())
        .collect();
    assert_eq!(keys(serde_json::to_value(&req).unwrap()), expected);
    let input: ResponseInput = serde_json::from_value(serde_json::json!([
        {"role": "user", "content": "a"},
        {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "b"}]},
        {"type": "function_call", "call_id": "call_1", "name": "f", "arguments": "{}"},
        {"type": "function_call_output", "call_id": "call_1", "output": "r"}
    ]))
    .unwrap();
    let ResponseInput::Items(items) = input else {
        panic!("items")
    };
    assert_eq!(items.len(), 4);
    assert!(matches!(&items[1], InputItem::Message(m) if m.content == "b"));
    assert!(matches!(&items[3], InputItem::FunctionCallOutput(o) if o.output == "r"));
    let e = serde_json::from_value::<ResponseInput>(serde_json::json!([{"type": "reasoning"}]));
    assert!(e.unwrap_err().to_string().contains("reasoning"));
    let f: TextFormat = serde_json::from_value(serde_json::json!({"type": "json_schema",
        "name": "p", "schema": {"type": "object"}}))
    .unwrap();
    assert!(matches!(f, TextFormat::JsonSchema(s) if s.name == "p"));
    let ev = ResponseEvent {
        event: StreamEvent::FunctionCallArgumentsDelta {
            item_id: "fc_1".into(),
            output_index: 0,
            delta: "{}".into(),
        },
        sequence_number: 3,
    };
    assert_eq!(
        serde_json::to_value(&ev).unwrap(),
        serde_json::json!({"type": "response.function_call_arguments.delta", "item_id": "fc_1",
            "output_index": 0, "delta": "{}", "sequence_number": 3})
    );
    assert_eq!(ev.event.name(), "response.function_call_arguments.delta");
}
