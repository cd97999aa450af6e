//! Round trips of the wire types against JSON written the way OpenAI documents it.

use api::*;

#[test]
fn usage_cached_tokens_optional() {
    let with: Usage = serde_json::from_str(
        r#"{"prompt_tokens":100,"completion_tokens":5,"total_tokens":105,
            "prompt_tokens_details":{"cached_tokens":64}}"#,
    )
    .unwrap();
    assert_eq!(with.cached_tokens(), Some(64));
    let without: Usage =
        serde_json::from_str(r#"{"prompt_tokens":100,"completion_tokens":5,"total_tokens":105}"#)
            .unwrap();
    assert_eq!(without.cached_tokens(), None);
    let empty: Usage = serde_json::from_str(
        r#"{"prompt_tokens":1,"completion_tokens":1,"total_tokens":2,"prompt_tokens_details":{}}"#,
    )
    .unwrap();
    assert_eq!(empty.cached_tokens(), None);
    let zero: Usage = serde_json::from_str(
        r#"{"prompt_tokens":1,"completion_tokens":1,"total_tokens":2,"prompt_tokens_details":{"cached_tokens":0}}"#,
    )
    .unwrap();
    assert_eq!(zero.cached_tokens(), Some(0));
}

#[test]
fn chat_request_serialises_without_absent_fields() {
    let req = ChatCompletionRequest {
        model: "m".into(),
        messages: vec![
            ChatMessage::new(Role::System, "s"),
            ChatMessage::new(Role::User, "u"),
        ],
        max_tokens: Some(10),
        stream: Some(true),
        stream_options: Some(StreamOptions {
            include_usage: Some(true),
        }),
        ..Default::default()
    };
    let v: serde_json::Value = serde_json::to_value(&req).unwrap();
    assert_eq!(
        v,
        serde_json::json!({"model":"m","messages":[{"role":"system","content":"s"},
            {"role":"user","content":"u"}],"max_tokens":10,"stream":true,
            "stream_options":{"include_usage":true}})
    );
    let back: ChatCompletionRequest = serde_json::from_value(v).unwrap();
    assert_eq!(back, req);
}

#[test]
fn stream_chunks_parse() {
    let first: ChatCompletionChunk = serde_json::from_str(
        r#"{"id":"c1","object":"chat.completion.chunk","created":1,"model":"m",
            "choices":[{"index":0,"delta":{"role":"assistant","content":"Hi"},"finish_reason":null}]}"#,
    )
    .unwrap();
    assert_eq!(first.choices[0].delta.content.as_deref(), Some("Hi"));
    assert_eq!(first.choices[0].delta.role, Some(Role::Assistant));
    let last: ChatCompletionChunk = serde_json::from_str(
        r#"{"id":"c1","object":"chat.completion.chunk","created":1,"model":"m","choices":[],
            "usage":{"prompt_tokens":3,"completion_tokens":2,"total_tokens":5}}"#,
    )
    .unwrap();
    assert!(last.choices.is_empty());
    assert_eq!(last.usage.unwrap().total_tokens, 5);
    let null_usage: ChatCompletionChunk = serde_json::from_str(
        r#"{"id":"c1","object":"chat.completion.chunk","created":1,"model":"m","choices":[],"usage":null}"#,
    )
    .unwrap();
    assert!(null_usage.usage.is_none());
}

#[test]
fn completion_prompt_forms() {
    for (json, want) in [
        (r#""abc""#, Prompt::Text("abc".into())),
        (r#"["a","b"]"#, Prompt::Texts(vec!["a".into(), "b".into()])),
        (r#"[1,2,3]"#, Prompt::Tokens(vec![1, 2, 3])),
        (r#"[[1],[2]]"#, Prompt::TokenBatches(vec![vec![1], vec![2]])),
    ] {
        let p: Prompt = serde_json::from_str(json).unwrap();
        assert_eq!(p, want);
    }
    let resp: CompletionResponse = serde_json::from_str(
        r#"{"id":"x","object":"text_completion","created":2,"model":"m",
            "choices":[{"index":0,"text":"ok","finish_reason":"length","logprobs":null}]}"#,
    )
    .unwrap();
    assert_eq!(resp.choices[0].text, "ok");
}
