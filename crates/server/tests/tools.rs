//! Tool calls in the generic mode on the real default model (its template has no tool support):
//! every `tool_choice`, parallel calls, streaming deltas, `n > 1`, tool results round-tripping
//! through the template with the history as a cached prefix, and the 400s.

mod common;

use common::{app, call};
use serde_json::{json, Value};
use server::ServerSettings;

const PATH: &str = "/v1/chat/completions";

fn tools() -> Value {
    json!([
        {"type": "function", "function": {"name": "get_weather",
            "description": "Current weather in a city",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                           "required": ["city"], "additionalProperties": false}}},
        {"type": "function", "function": {"name": "get_time",
            "description": "Current time in a time zone",
            "parameters": {"type": "object",
                           "properties": {"timezone": {"type": "string", "enum": ["UTC", "CET", "PST"]}},
                           "required": ["timezone"], "additionalProperties": false}}}
    ])
}

fn body(tool_choice: Value, parallel: Option<bool>) -> Value {
    let mut b = json!({
        "model": "agentkv",
        "messages": [{"role": "system", "content": "You are a helpful assistant."},
                     {"role": "user", "content": "What is the weather in Paris?"}],
        "tools": tools(),
        "tool_choice": tool_choice,
        "max_tokens": 96,
        "temperature": 0
    });
    if let Some(p) = parallel {
        b["parallel_tool_calls"] = p.into();
    }
    b
}

/// Asserts a valid call of one of the two tools and returns (name, arguments object).
fn check_call(c: &Value) -> (String, Value) {
    assert!(c["id"].as_str().unwrap().starts_with("call_"), "{c}");
    assert_eq!(c["type"], "function");
    let name = c["function"]["name"].as_str().unwrap().to_string();
    let args: Value = serde_json::from_str(c["function"]["arguments"].as_str().unwrap())
        .unwrap_or_else(|e| panic!("arguments are JSON ({e}): {c}"));
    let obj = args.as_object().unwrap();
    match name.as_str() {
        "get_weather" => {
            assert!(obj["city"].is_string() && obj.len() == 1, "{args}")
        }
        "get_time" => {
            assert!(
                ["UTC", "CET", "PST"].contains(&obj["timezone"].as_str().unwrap()),
                "{args}"
            );
            assert_eq!(obj.len(), 1, "{args}");
        }
        other => panic!("unknown tool {other}"),
    }
    (name, args)
}

async fn post(r: &axum::Router, b: &Value) -> Value {
    let reply = call(r, "POST", PATH, None, &b.to_string()).await;
    assert_eq!(reply.status, 200, "{}", reply.body);
    reply.json()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn required_named_auto_and_none() {
    let (_e, _s, r) = app(ServerSettings::default());
    let v = post(&r, &body(json!("required"), Some(false))).await;
    let choice = &v["choices"][0];
    println!("required: {}", choice["message"]);
    assert_eq!(choice["finish_reason"], "tool_calls");
    assert!(choice["message"]["content"].is_null());
    let calls = choice["message"]["tool_calls"].as_array().unwrap();
    assert_eq!(calls.len(), 1);
    check_call(&calls[0]);

    let named = json!({"type": "function", "function": {"name": "get_time"}});
    let v = post(&r, &body(named, Some(false))).await;
    println!("named: {}", v["choices"][0]["message"]);
    assert_eq!(v["choices"][0]["finish_reason"], "tool_calls");
    let (name, _) = check_call(&v["choices"][0]["message"]["tool_calls"][0]);
    assert_eq!(name, "get_time");

    // auto: a valid call or a text answer, never raw JSON.
    let v = post(&r, &body(json!("auto"), Some(false))).await;
    let m = &v["choices"][0]["message"];
    println!("auto: {m}");
    match m["tool_calls"].as_array() {
        Some(calls) => {
            assert_eq!(v["choices"][0]["finish_reason"], "tool_calls");
            check_call(&calls[0]);
        }
        None => {
            let text = m["content"].as_str().unwrap();
            assert!(!text.trim_start().starts_with('{'), "{text}");
        }
    }
    // none: plain text, the tools are not even described.
    let with_none = post(&r, &body(json!("none"), None)).await;
    let mut plain = body(json!("none"), None);
    plain.as_object_mut().unwrap().remove("tools");
    plain.as_object_mut().unwrap().remove("tool_choice");
    let plain = post(&r, &plain).await;
    assert!(with_none["choices"][0]["message"]["tool_calls"].is_null());
    assert_eq!(
        with_none["choices"][0]["message"],
        plain["choices"][0]["message"]
    );
    assert_eq!(
        with_none["usage"]["prompt_tokens"],
        plain["usage"]["prompt_tokens"]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn parallel_calls_n2_and_streaming_deltas() {
    let (_e, _s, r) = app(ServerSettings::default());
    let mut b = body(json!("required"), None);
    b["max_tokens"] = 160.into();
    b["n"] = 2.into();
    b["temperature"] = 0.7.into();
    b["seed"] = 3.into();
    let v = post(&r, &b).await;
    for c in v["choices"].as_array().unwrap() {
        println!("parallel: {} {}", c["finish_reason"], c["message"]);
        if c["finish_reason"] == "tool_calls" {
            let calls = c["message"]["tool_calls"].as_array().unwrap();
            assert!(!calls.is_empty());
            let ids: std::collections::BTreeSet<&str> =
                calls.iter().map(|c| c["id"].as_str().unwrap()).collect();
            assert_eq!(ids.len(), calls.len(), "ids are unique");
            calls.iter().for_each(|c| {
                check_call(c);
            });
        } else {
            // Only max_tokens may cut a constrained reply short.
            assert_eq!(c["finish_reason"], "length", "{c}");
        }
    }
    assert_ne!(
        v["choices"][0]["message"]["tool_calls"][0]["id"],
        v["choices"][1]["message"]["tool_calls"][0]["id"]
    );

    let mut b = body(json!("required"), Some(false));
    b["stream"] = true.into();
    let reply = call(&r, "POST", PATH, None, &b.to_string()).await;
    assert_eq!(reply.status, 200, "{}", reply.body);
    let events: Vec<&str> = reply
        .body
        .lines()
        .filter_map(|l| l.strip_prefix("data: "))
        .collect();
    assert_eq!(*events.last().unwrap(), "[DONE]");
    let chunks: Vec<Value> = events[..events.len() - 1]
        .iter()
        .map(|e| serde_json::from_str(e).unwrap())
        .collect();
    assert_eq!(chunks[0]["choices"][0]["delta"]["role"], "assistant");
    let deltas: Vec<&Value> = chunks
        .iter()
        .filter_map(|c| c["choices"][0]["delta"].get("tool_calls"))
        .collect();
    // As OpenAI streams: the first delta carries index, id, type and name, the rest pieces of
    // the arguments.
    assert!(deltas.len() > 2, "{:?}", reply.body);
    let first = &deltas[0][0];
    assert_eq!(first["index"], 0);
    assert!(first["id"].is_string() && first["type"] == "function");
    let mut arguments = String::new();
    for d in &deltas {
        assert_eq!(d[0]["index"], 0);
        arguments.push_str(d[0]["function"]["arguments"].as_str().unwrap());
    }
    for d in &deltas[1..] {
        assert!(d[0].get("id").is_none() && d[0]["function"].get("name").is_none());
    }
    let d = json!({"id": first["id"], "type": "function",
                   "function": {"name": first["function"]["name"], "arguments": arguments}});
    check_call(&d);
    assert_eq!(
        chunks.last().unwrap()["choices"][0]["finish_reason"],
        "tool_calls"
    );
    // Same call as the non-streaming request.
    b["stream"] = false.into();
    let whole = post(&r, &b).await;
    assert_eq!(
        whole["choices"][0]["message"]["tool_calls"][0]["function"],
        d["function"]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tool_results_round_trip_and_the_history_is_a_cached_prefix() {
    let (_e, _s, r) = app(ServerSettings::default());
    let first_body = body(json!("required"), Some(false));
    let first = post(&r, &first_body).await;
    let assistant = first["choices"][0]["message"].clone();
    let call_id = assistant["tool_calls"][0]["id"]
        .as_str()
        .unwrap()
        .to_string();
    let mut second_body = body(json!("required"), Some(false));
    let msgs = second_body["messages"].as_array_mut().unwrap();
    msgs.push(assistant.clone());
    msgs.push(json!({"role": "tool", "tool_call_id": call_id, "content": "18 C and sunny"}));
    let second = post(&r, &second_body).await;
    println!("second: {}", second["choices"][0]["message"]);
    check_call(&second["choices"][0]["message"]["tool_calls"][0]);
    let prompt1 = first["usage"]["prompt_tokens"].as_u64().unwrap();
    let cached2 = second["usage"]["prompt_tokens_details"]["cached_tokens"]
        .as_u64()
        .unwrap();
    println!("prompt1 {prompt1} cached2 {cached2} {}", second["usage"]);
    assert!(
        cached2 >= prompt1 / 16 * 16,
        "call 1's prompt is a cached prefix of call 2's"
    );
    assert!(second["usage"]["prompt_tokens"].as_u64().unwrap() > prompt1);

    // A third turn after a text answer keeps extending the same prefix.
    let mut third_body = second_body.clone();
    let msgs = third_body["messages"].as_array_mut().unwrap();
    let assistant2 = second["choices"][0]["message"].clone();
    let id2 = assistant2["tool_calls"][0]["id"]
        .as_str()
        .unwrap()
        .to_string();
    msgs.push(assistant2);
    msgs.push(json!({"role": "tool", "tool_call_id": id2, "content": "12:00"}));
    // Switching tool_choice keeps the prompt (the grammar, not the prompt, enforces it).
    third_body["tool_choice"] = json!("auto");
    let third = post(&r, &third_body).await;
    println!(
        "third: {} {}",
        third["choices"][0]["message"], third["usage"]
    );
    let prompt2 = second["usage"]["prompt_tokens"].as_u64().unwrap();
    let cached3 = third["usage"]["prompt_tokens_details"]["cached_tokens"]
        .as_u64()
        .unwrap();
    assert!(
        cached3 >= prompt2 / 16 * 16,
        "cached {cached3} of call 2's {prompt2}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_tool_requests_get_400_naming_the_field() {
    let (_e, _s, r) = app(ServerSettings::default());
    let err = |b: Value| {
        let r = &r;
        async move { call(r, "POST", PATH, None, &b.to_string()).await.error(400)["param"].clone() }
    };
    let named = json!({"type": "function", "function": {"name": "nope"}});
    assert_eq!(err(body(named, None)).await, "tool_choice");
    let mut b = body(json!("required"), None);
    b.as_object_mut().unwrap().remove("tools");
    assert_eq!(err(b).await, "tool_choice");
    let mut b = body(json!("auto"), None);
    b["tools"][0]["function"]["name"] = "two words".into();
    assert_eq!(err(b).await, "tools[0].function.name");
    let mut b = body(json!("auto"), None);
    b["tools"][0]["function"]["parameters"] =
        json!({"type": "object", "properties": {"x": {"type": "frobnicated"}}});
    assert_eq!(err(b).await, "tools");
    let mut b = body(json!("auto"), None);
    b["tools"][0]["type"] = "retrieval".into();
    assert_eq!(err(b).await, "tools[0].type");
    // min_tokens would hold the end of the turn back past the end of the call.
    let mut b = body(json!("auto"), None);
    b["min_tokens"] = 4.into();
    assert_eq!(err(b).await, "min_tokens");
    let mut b = body(json!("auto"), None);
    b["messages"]
        .as_array_mut()
        .unwrap()
        .push(json!({"role": "tool", "tool_call_id": "call_x", "content": "r"}));
    assert_eq!(err(b).await, "messages[2].tool_call_id");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn logprobs_come_with_tool_calls_plain_and_streamed() {
    let (_e, _s, r) = app(ServerSettings::default());
    let mut b = body(json!("required"), Some(false));
    b["logprobs"] = true.into();
    b["top_logprobs"] = 2.into();
    let v = post(&r, &b).await;
    let choice = &v["choices"][0];
    assert_eq!(choice["finish_reason"], "tool_calls", "{choice}");
    check_call(&choice["message"]["tool_calls"][0]);
    // One entry per generated token (the call's JSON as the model wrote it, then the end of
    // the turn), each with its two alternatives.
    let content = choice["logprobs"]["content"].as_array().unwrap();
    assert_eq!(
        content.len() as u64,
        v["usage"]["completion_tokens"].as_u64().unwrap(),
        "{choice}"
    );
    let text: String = content
        .iter()
        .map(|t| t["token"].as_str().unwrap())
        .collect();
    assert!(
        text.starts_with("{\"tool_call\": {\"name\": \"get_"),
        "{text}"
    );
    for t in content {
        let lp = t["logprob"].as_f64().unwrap();
        assert!(lp <= 0.0, "{t}");
        assert_eq!(t["top_logprobs"].as_array().unwrap().len(), 2, "{t}");
    }
    // Streamed: the same logprobs, token by token.
    b["stream"] = true.into();
    let reply = call(&r, "POST", PATH, None, &b.to_string()).await;
    assert_eq!(reply.status, 200, "{}", reply.body);
    let streamed: Vec<Value> = reply
        .body
        .lines()
        .filter_map(|l| l.strip_prefix("data: "))
        .filter(|e| *e != "[DONE]")
        .map(|e| serde_json::from_str::<Value>(e).unwrap())
        .filter_map(|c| c["choices"][0]["logprobs"]["content"].as_array().cloned())
        .flatten()
        .collect();
    assert_eq!(&streamed, content);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_constrained_request_leaves_others_unchanged() {
    let (_e, _s, r) = app(ServerSettings::default());
    let plain = json!({"model": "agentkv", "max_tokens": 24, "temperature": 0, "logprobs": true,
        "messages": [{"role": "user", "content": "Write one sentence about the sea."}]});
    let alone = post(&r, &plain).await;
    let constrained = body(json!("required"), None);
    let (together, tool) = tokio::join!(post(&r, &plain), post(&r, &constrained));
    assert_eq!(tool["choices"][0]["finish_reason"], "tool_calls");
    // Bitwise: same text and the same logprobs, batched with a constrained request or not.
    assert_eq!(
        alone["choices"][0]["message"],
        together["choices"][0]["message"]
    );
    assert_eq!(
        alone["choices"][0]["logprobs"],
        together["choices"][0]["logprobs"]
    );
}
