//! Structured output on the real default model: `response_format` (`json_schema`, `json_object`),
//! vLLM's `guided_*` and `structured_outputs`, Lark `grammar`, on chat and text completions,
//! with n > 1, logprobs, streaming and stop strings; the 400s; and a constrained request leaving
//! other requests' outputs and the cache unchanged.

mod common;

use common::{app, call};
use serde_json::{json, Value};
use server::ServerSettings;

const CHAT: &str = "/v1/chat/completions";

fn person_schema() -> Value {
    json!({"type": "object",
           "properties": {"name": {"type": "string", "maxLength": 20},
                          "age": {"type": "integer", "minimum": 0, "maximum": 120},
                          "city": {"type": "string", "enum": ["Paris", "Rome", "Oslo"]}},
           "required": ["name", "age", "city"], "additionalProperties": false})
}

fn chat_body(extra: Value) -> Value {
    let mut b = json!({
        "model": "agentkv",
        "messages": [{"role": "user", "content": "Describe a person as JSON with name, age and city."}],
        "max_tokens": 64,
        "temperature": 0
    });
    for (k, v) in extra.as_object().unwrap() {
        b[k] = v.clone();
    }
    b
}

async fn post(r: &axum::Router, path: &str, b: &Value) -> Value {
    let reply = call(r, "POST", path, None, &b.to_string()).await;
    assert_eq!(reply.status, 200, "{}", reply.body);
    reply.json()
}

fn check_person(text: &str) {
    let v: Value = serde_json::from_str(text).unwrap_or_else(|e| panic!("not JSON ({e}): {text}"));
    let o = v.as_object().unwrap();
    assert_eq!(o.len(), 3, "{text}");
    assert!(o["name"].as_str().unwrap().chars().count() <= 20, "{text}");
    assert!((0..=120).contains(&o["age"].as_i64().unwrap()), "{text}");
    assert!(
        ["Paris", "Rome", "Oslo"].contains(&o["city"].as_str().unwrap()),
        "{text}"
    );
}

fn response_format() -> Value {
    json!({"type": "json_schema",
           "json_schema": {"name": "person", "schema": person_schema(), "strict": true}})
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn json_schema_with_n2_logprobs_and_streaming() {
    let (_e, _s, r) = app(ServerSettings::default());
    let v = post(
        &r,
        CHAT,
        &chat_body(
            json!({"response_format": response_format(), "n": 2, "temperature": 0.8,
                          "seed": 11, "logprobs": true, "top_logprobs": 2, "max_tokens": 96}),
        ),
    )
    .await;
    let mut tokens = 0;
    for c in v["choices"].as_array().unwrap() {
        println!("json_schema: {}", c["message"]["content"]);
        assert_eq!(c["finish_reason"], "stop", "{c}");
        check_person(c["message"]["content"].as_str().unwrap());
        tokens += c["logprobs"]["content"].as_array().unwrap().len();
    }
    assert_eq!(v["usage"]["completion_tokens"], tokens);

    // json_object: any JSON object.
    let v = post(
        &r,
        CHAT,
        &chat_body(json!({"response_format": {"type": "json_object"}, "max_tokens": 128})),
    )
    .await;
    let text = v["choices"][0]["message"]["content"].as_str().unwrap();
    println!("json_object: {text}");
    assert_eq!(v["choices"][0]["finish_reason"], "stop", "{v}");
    assert!(serde_json::from_str::<Value>(text).unwrap().is_object());

    // Streamed: the deltas add up to the whole (greedy) answer.
    let whole = post(
        &r,
        CHAT,
        &chat_body(json!({"response_format": response_format()})),
    )
    .await;
    let mut b = chat_body(json!({"response_format": response_format(), "stream": true}));
    b["stream_options"] = json!({"include_usage": true});
    let reply = call(&r, "POST", CHAT, None, &b.to_string()).await;
    assert_eq!(reply.status, 200, "{}", reply.body);
    let mut text = String::new();
    let mut finish = Value::Null;
    for e in reply.body.lines().filter_map(|l| l.strip_prefix("data: ")) {
        if e == "[DONE]" {
            break;
        }
        let c: Value = serde_json::from_str(e).unwrap();
        if let Some(ch) = c["choices"].get(0) {
            text.push_str(ch["delta"]["content"].as_str().unwrap_or(""));
            if !ch["finish_reason"].is_null() {
                finish = ch["finish_reason"].clone();
            }
        }
    }
    assert_eq!(
        text,
        whole["choices"][0]["message"]["content"].as_str().unwrap()
    );
    assert_eq!(finish, "stop");
    check_person(&text);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn choice_regex_grammar_and_completions() {
    let (_e, _s, r) = app(ServerSettings::default());
    let content = |v: &Value| {
        v["choices"][0]["message"]["content"]
            .as_str()
            .unwrap()
            .to_string()
    };
    let choices = ["yes", "no", "maybe later"];
    for field in [
        json!({"guided_choice": choices}),
        json!({"structured_outputs": {"choice": choices}}),
    ] {
        let v = post(&r, CHAT, &chat_body(field)).await;
        assert!(choices.contains(&content(&v).as_str()), "{v}");
    }
    let phone = |s: &str| {
        s.len() == 8
            && s.char_indices()
                .all(|(i, c)| if i == 3 { c == '-' } else { c.is_ascii_digit() })
    };
    for field in [
        json!({"guided_regex": "[0-9]{3}-[0-9]{4}"}),
        json!({"structured_outputs": {"regex": "[0-9]{3}-[0-9]{4}"}}),
    ] {
        let v = post(&r, CHAT, &chat_body(field)).await;
        assert!(phone(&content(&v)), "{v}");
    }
    let lark = "start: \"The answer is \" ANSWER \".\"\nANSWER: /[0-9]{1,3}/";
    let gbnf =
        "root ::= \"The answer is \" Digits \".\"  # llama.cpp's format\nDigits ::= [0-9]{1,3}";
    for field in [
        json!({"grammar": lark}),
        json!({"grammar": gbnf}),
        json!({"guided_grammar": gbnf}),
        json!({"guided_grammar": lark}),
        json!({"structured_outputs": {"grammar": lark}}),
    ] {
        let v = post(&r, CHAT, &chat_body(field)).await;
        let text = content(&v);
        let digits = text
            .strip_prefix("The answer is ")
            .and_then(|t| t.strip_suffix('.'))
            .unwrap_or_else(|| panic!("{text}"));
        assert!(
            !digits.is_empty() && digits.chars().all(|c| c.is_ascii_digit()),
            "{text}"
        );
    }
    // guided_json as JSON text, on a text completion, with a stop string cutting it short.
    let v = post(
        &r,
        "/v1/completions",
        &json!({"model": "agentkv", "prompt": "A person as JSON:", "max_tokens": 64,
                "temperature": 0, "guided_json": person_schema().to_string()}),
    )
    .await;
    let text = v["choices"][0]["text"].as_str().unwrap();
    println!("completion: {text}");
    check_person(text);
    let v = post(
        &r,
        "/v1/completions",
        &json!({"model": "agentkv", "prompt": "A person as JSON:", "max_tokens": 64,
                "temperature": 0, "response_format": {"type": "json_object"},
                "guided_json": null, "stop": [","]}),
    )
    .await;
    let text = v["choices"][0]["text"].as_str().unwrap();
    assert!(text.starts_with('{') && !text.contains(','), "{text}");
    assert_eq!(v["choices"][0]["finish_reason"], "stop");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_formats_get_400_naming_the_field() {
    let (_e, _s, r) = app(ServerSettings::default());
    let err = |b: Value| {
        let r = &r;
        async move {
            let e = call(r, "POST", CHAT, None, &b.to_string()).await.error(400);
            println!("{e}");
            e["param"].clone()
        }
    };
    let bad_schema = json!({"type": "json_schema", "json_schema": {"name": "x",
        "schema": {"type": "object", "properties": {"a": {"type": "frobnicated"}}}}});
    assert_eq!(
        err(chat_body(json!({"response_format": bad_schema}))).await,
        "response_format"
    );
    for rf in [
        json!({"type": "xml"}),
        json!({"type": "json_schema"}),
        json!("json"),
    ] {
        let p = err(chat_body(json!({"response_format": rf}))).await;
        assert!(p.as_str().unwrap().starts_with("response_format"), "{p}");
    }
    assert_eq!(
        err(chat_body(json!({"guided_regex": "(unclosed"}))).await,
        "guided_regex"
    );
    assert_eq!(
        err(chat_body(json!({"grammar": "start: nowhere"}))).await,
        "grammar"
    );
    assert_eq!(
        err(chat_body(json!({"grammar": "root ::= \"a\" | [b-"}))).await,
        "grammar"
    );
    assert_eq!(
        err(chat_body(
            json!({"guided_grammar": "root ::= undefined-rule"})
        ))
        .await,
        "guided_grammar"
    );
    assert_eq!(
        err(chat_body(
            json!({"structured_outputs": {"json": {}, "whitespace": 1}})
        ))
        .await,
        "structured_outputs.whitespace"
    );
    assert_eq!(
        err(chat_body(
            json!({"guided_choice": ["a"], "guided_regex": "a"})
        ))
        .await,
        "guided_regex"
    );
    assert_eq!(
        err(chat_body(json!({"guided_choice": ["a"], "min_tokens": 3}))).await,
        "min_tokens"
    );
    let e = call(
        &r,
        "POST",
        "/v1/completions",
        None,
        &json!({"model": "agentkv", "prompt": "x", "guided_json": "{nope"}).to_string(),
    )
    .await
    .error(400);
    assert_eq!(e["param"], "guided_json");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_constrained_request_changes_neither_other_outputs_nor_the_cache() {
    let (_e, _s, r) = app(ServerSettings::default());
    let plain = chat_body(json!({"logprobs": true, "max_tokens": 24}));
    let alone = post(&r, CHAT, &plain).await;
    let constrained = chat_body(json!({"response_format": response_format(), "n": 2,
                                       "temperature": 0.9, "seed": 5}));
    let (together, c) = tokio::join!(post(&r, CHAT, &plain), post(&r, CHAT, &constrained));
    check_person(c["choices"][0]["message"]["content"].as_str().unwrap());
    assert_eq!(
        alone["choices"][0]["message"],
        together["choices"][0]["message"]
    );
    assert_eq!(
        alone["choices"][0]["logprobs"],
        together["choices"][0]["logprobs"]
    );
    // Same prompt, same cache: the constrained request reused the plain one's blocks and the
    // plain one reuses as much after it.
    let cached = |v: &Value| {
        v["usage"]["prompt_tokens_details"]["cached_tokens"]
            .as_u64()
            .unwrap()
    };
    let prompt_blocks = alone["usage"]["prompt_tokens"].as_u64().unwrap() / 16 * 16;
    assert!(prompt_blocks > 0);
    assert_eq!(cached(&c), prompt_blocks, "{}", c["usage"]);
    let again = post(&r, CHAT, &plain).await;
    assert_eq!(cached(&again), prompt_blocks);
    assert_eq!(
        again["choices"][0]["message"],
        alone["choices"][0]["message"]
    );
}
