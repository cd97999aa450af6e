//! `/v1/responses` on the real default model: text and item input, instructions, function tools
//! with `tool_choice`, a second turn through `previous_response_id` carrying the call's output
//! (its prompt a cached prefix), `text.format`, the typed stream, store / GET / DELETE per tenant,
//! bounded storage, and the 400s.

mod common;

use common::{app, call};
use serde_json::{json, Value};
use server::{Limits, ServerSettings, TenantSpec};

const PATH: &str = "/v1/responses";

fn settings() -> ServerSettings {
    ServerSettings {
        tenants: vec![
            TenantSpec {
                name: "alpha".into(),
                api_keys: vec!["ka".into()],
                salt: None,
                priority: 0,
            },
            TenantSpec {
                name: "beta".into(),
                api_keys: vec!["kb".into()],
                salt: None,
                priority: 0,
            },
        ],
        ..ServerSettings::default()
    }
}

async fn post(r: &axum::Router, key: &str, b: &Value) -> Value {
    let reply = call(r, "POST", PATH, Some(key), &b.to_string()).await;
    assert_eq!(reply.status, 200, "{}", reply.body);
    reply.json()
}

fn tools() -> Value {
    json!([{"type": "function", "name": "get_weather", "description": "Current weather in a city",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                           "required": ["city"], "additionalProperties": false}}])
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn text_input_store_get_delete_per_tenant() {
    let (_e, _s, r) = app(settings());
    let v = post(
        &r,
        "ka",
        &json!({"model": "agentkv", "input": "Say hello.", "instructions": "Be brief.",
                "max_output_tokens": 12, "temperature": 0, "metadata": {"k": "v"}}),
    )
    .await;
    println!("{v}");
    let id = v["id"].as_str().unwrap();
    assert!(id.starts_with("resp_"));
    assert_eq!(v["object"], "response");
    assert_eq!(v["output"][0]["type"], "message");
    assert_eq!(v["output"][0]["role"], "assistant");
    let text = v["output"][0]["content"][0]["text"].as_str().unwrap();
    assert_eq!(v["output"][0]["content"][0]["type"], "output_text");
    assert_eq!(v["output_text"], text);
    assert!(!text.is_empty());
    assert!(["completed", "incomplete"].contains(&v["status"].as_str().unwrap()));
    if v["status"] == "incomplete" {
        assert_eq!(v["incomplete_details"]["reason"], "max_output_tokens");
        assert_eq!(v["usage"]["output_tokens"], 12);
    }
    assert_eq!(v["instructions"], "Be brief.");
    assert_eq!(v["metadata"], json!({"k": "v"}));
    assert!(v["usage"]["input_tokens_details"]["cached_tokens"].is_u64());
    let path = format!("{PATH}/{id}");
    let got = call(&r, "GET", &path, Some("ka"), "").await;
    assert_eq!(got.status, 200);
    assert_eq!(got.json(), v);
    // Another tenant sees nothing, and cannot delete it.
    call(&r, "GET", &path, Some("kb"), "").await.error(404);
    call(&r, "DELETE", &path, Some("kb"), "").await.error(404);
    let del = call(&r, "DELETE", &path, Some("ka"), "").await;
    assert_eq!(
        del.json(),
        json!({"id": id, "object": "response.deleted", "deleted": true})
    );
    call(&r, "GET", &path, Some("ka"), "").await.error(404);
    // store: false keeps nothing.
    let v = post(
        &r,
        "ka",
        &json!({"model": "agentkv", "input": "Hi", "max_output_tokens": 2, "store": false}),
    )
    .await;
    assert_eq!(v["store"], false);
    let path = format!("{PATH}/{}", v["id"].as_str().unwrap());
    call(&r, "GET", &path, Some("ka"), "").await.error(404);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tool_call_then_previous_response_id_with_the_output_is_a_cached_prefix() {
    let (_e, _s, r) = app(settings());
    let first = post(
        &r,
        "ka",
        &json!({"model": "agentkv", "instructions": "You are a helpful assistant.",
                "input": [{"role": "user", "content": "What is the weather in Paris?"}],
                "tools": tools(), "tool_choice": "required", "parallel_tool_calls": false,
                "temperature": 0, "max_output_tokens": 64}),
    )
    .await;
    // One call per turn (the tiny model, free to add parallel calls, may repeat this one until
    // the token limit, depending on the arithmetic's rounding); the later turns keep the
    // setting, which is part of the rendered prompt.
    println!("first: {first}");
    assert_eq!(first["status"], "completed");
    let call0 = &first["output"][0];
    assert_eq!(call0["type"], "function_call");
    assert_eq!(call0["name"], "get_weather");
    assert!(call0["id"].as_str().unwrap().starts_with("fc_"));
    let call_id = call0["call_id"].as_str().unwrap();
    assert!(call_id.starts_with("call_"));
    let args: Value = serde_json::from_str(call0["arguments"].as_str().unwrap()).unwrap();
    assert!(args["city"].is_string() && args.as_object().unwrap().len() == 1);
    assert_eq!(first["output_text"], "");

    let second = post(
        &r,
        "ka",
        &json!({"model": "agentkv", "instructions": "You are a helpful assistant.",
                "previous_response_id": first["id"],
                "input": [{"type": "function_call_output", "call_id": call_id,
                           "output": "18 C and sunny"}],
                "tools": tools(), "parallel_tool_calls": false, "temperature": 0,
                "max_output_tokens": 48}),
    )
    .await;
    println!("second: {second}");
    let input1 = first["usage"]["input_tokens"].as_u64().unwrap();
    let cached2 = second["usage"]["input_tokens_details"]["cached_tokens"]
        .as_u64()
        .unwrap();
    assert!(second["usage"]["input_tokens"].as_u64().unwrap() > input1);
    assert!(
        cached2 >= input1 / 16 * 16 && cached2 > 0,
        "the first turn's prompt is a cached prefix: {cached2} of {input1}"
    );
    assert_eq!(second["previous_response_id"], first["id"]);
    // The same conversation sent in full (no previous_response_id) renders the same prompt.
    let full = post(
        &r,
        "ka",
        &json!({"model": "agentkv", "instructions": "You are a helpful assistant.",
                "input": [{"role": "user", "content": "What is the weather in Paris?"},
                          {"type": "function_call", "call_id": call_id, "name": "get_weather",
                           "arguments": call0["arguments"]},
                          {"type": "function_call_output", "call_id": call_id,
                           "output": "18 C and sunny"}],
                "tools": tools(), "parallel_tool_calls": false, "temperature": 0,
                "max_output_tokens": 48, "store": false}),
    )
    .await;
    assert_eq!(
        full["usage"]["input_tokens"],
        second["usage"]["input_tokens"]
    );
    assert_eq!(full["output"][0]["type"], second["output"][0]["type"]);
    // Another tenant cannot continue alpha's conversation.
    let e = call(
        &r,
        "POST",
        PATH,
        Some("kb"),
        &json!({"model": "agentkv", "previous_response_id": first["id"], "input": "and?"})
            .to_string(),
    )
    .await
    .error(400);
    assert_eq!(e["param"], "previous_response_id");
}

fn events(body: &str) -> Vec<(String, Value)> {
    let mut out = Vec::new();
    let mut name = String::new();
    for line in body.lines() {
        if let Some(n) = line.strip_prefix("event: ") {
            name = n.to_string();
        } else if let Some(d) = line.strip_prefix("data: ") {
            if d != "[DONE]" {
                out.push((std::mem::take(&mut name), serde_json::from_str(d).unwrap()));
            }
        }
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn streams_typed_events_for_text_and_calls() {
    let (_e, _s, r) = app(settings());
    let body = json!({"model": "agentkv", "input": "Count to three.", "max_output_tokens": 16,
                      "temperature": 0, "stream": true});
    let reply = call(&r, "POST", PATH, Some("ka"), &body.to_string()).await;
    assert_eq!(reply.status, 200, "{}", reply.body);
    // The Responses API ends with its last typed event, never chat's `[DONE]` (issue #45).
    assert!(!reply.body.contains("[DONE]"), "{}", reply.body);
    let evs = events(&reply.body);
    let names: Vec<&str> = evs.iter().map(|(n, _)| n.as_str()).collect();
    println!("{names:?}");
    for (i, (n, d)) in evs.iter().enumerate() {
        assert_eq!(d["type"], n.as_str());
        assert_eq!(d["sequence_number"], i);
    }
    assert_eq!(
        names[..4],
        [
            "response.created",
            "response.in_progress",
            "response.output_item.added",
            "response.content_part.added"
        ]
    );
    let tail = &names[names.len() - 4..];
    assert_eq!(
        tail[..3],
        [
            "response.output_text.done",
            "response.content_part.done",
            "response.output_item.done"
        ]
    );
    assert!(["response.completed", "response.incomplete"].contains(&tail[3]));
    let deltas: String = evs
        .iter()
        .filter(|(n, _)| n == "response.output_text.delta")
        .map(|(_, d)| d["delta"].as_str().unwrap())
        .collect();
    let last = &evs.last().unwrap().1["response"];
    assert_eq!(last["output_text"], deltas.as_str());
    let done = evs
        .iter()
        .find(|(n, _)| n == "response.output_text.done")
        .unwrap();
    assert_eq!(done.1["text"], deltas.as_str());
    // Stored as streamed; the whole answer is the same.
    let got = call(
        &r,
        "GET",
        &format!("{PATH}/{}", last["id"].as_str().unwrap()),
        Some("ka"),
        "",
    )
    .await
    .json();
    assert_eq!(&got, last);
    let mut whole = body.clone();
    whole["stream"] = false.into();
    let whole = post(&r, "ka", &whole).await;
    assert_eq!(whole["output_text"], deltas.as_str());

    // A function call: the item once its name is written, its arguments in pieces, then done.
    let body = json!({"model": "agentkv", "input": "What is the weather in Rome?",
                      "tools": tools(), "tool_choice": {"type": "function", "name": "get_weather"},
                      "parallel_tool_calls": false,
                      "max_output_tokens": 64, "temperature": 0, "stream": true});
    let reply = call(&r, "POST", PATH, Some("ka"), &body.to_string()).await;
    let evs = events(&reply.body);
    let names: Vec<&str> = evs.iter().map(|(n, _)| n.as_str()).collect();
    println!("{names:?} {}", evs.last().unwrap().1);
    let n = names.len();
    assert_eq!(
        names[..3],
        [
            "response.created",
            "response.in_progress",
            "response.output_item.added",
        ]
    );
    assert_eq!(
        names[n - 3..],
        [
            "response.function_call_arguments.done",
            "response.output_item.done",
            "response.completed"
        ]
    );
    assert!(n - 6 > 2, "arguments in several pieces: {names:?}");
    assert!(names[3..n - 3]
        .iter()
        .all(|e| *e == "response.function_call_arguments.delta"));
    let added = &evs[2].1["item"];
    assert_eq!(
        (&added["type"], &added["name"], &added["arguments"]),
        (&json!("function_call"), &json!("get_weather"), &json!(""))
    );
    let args = evs[n - 3].1["arguments"].as_str().unwrap();
    let streamed: String = evs[3..n - 3]
        .iter()
        .map(|(_, d)| {
            assert_eq!(d["item_id"], added["id"]);
            d["delta"].as_str().unwrap()
        })
        .collect();
    assert_eq!(streamed, args);
    assert_eq!(evs[n - 3].1["name"], "get_weather");
    assert_eq!(evs[n - 2].1["item"]["arguments"], args);
    assert_eq!(evs[n - 2].1["item"]["id"], added["id"]);
    assert_eq!(
        evs[n - 1].1["response"]["output"][0]["call_id"],
        evs[n - 2].1["item"]["call_id"]
    );
    assert_eq!(added["call_id"], evs[n - 2].1["item"]["call_id"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn text_format_json_schema_and_bad_requests() {
    let (_e, _s, r) = app(settings());
    let schema = json!({"type": "object", "properties": {"city": {"type": "string", "maxLength": 20},
                        "country": {"type": "string", "maxLength": 20}},
                        "required": ["city", "country"], "additionalProperties": false});
    let v = post(
        &r,
        "ka",
        &json!({"model": "agentkv", "input": "Where is the Eiffel tower? Answer as JSON.",
                "text": {"format": {"type": "json_schema", "name": "place", "schema": schema,
                                    "strict": true}},
                "temperature": 0, "max_output_tokens": 64}),
    )
    .await;
    println!("{}", v["output_text"]);
    let out: Value = serde_json::from_str(v["output_text"].as_str().unwrap()).unwrap();
    assert!(out["city"].is_string() && out["country"].is_string());
    assert_eq!(v["text"]["format"]["type"], "json_schema");
    assert_eq!(v["text"]["format"]["name"], "place");

    let err = |b: Value| {
        let r = &r;
        async move {
            let e = call(r, "POST", PATH, Some("ka"), &b.to_string())
                .await
                .error(400);
            println!("{e}");
            e["param"].as_str().unwrap_or("").to_string()
        }
    };
    let base = json!({"model": "agentkv", "input": "hi"});
    let with = |k: &str, v: Value| {
        let mut b = base.clone();
        b[k] = v;
        b
    };
    assert_eq!(err(with("frobnicate", json!(1))).await, "frobnicate");
    assert_eq!(
        err(with("previous_response_id", json!("resp_nope"))).await,
        "previous_response_id"
    );
    assert_eq!(
        err(with("input", json!([{"type": "reasoning", "summary": []}]))).await,
        "input[0]"
    );
    assert_eq!(err(with("input", json!([]))).await, "input");
    assert!(err(with("tools", json!([{"type": "web_search"}])))
        .await
        .starts_with("tools[0]"));
    assert_eq!(
        err(with(
            "tools",
            json!([{"type": "function", "name": "two words"}])
        ))
        .await,
        "tools[0].name"
    );
    assert_eq!(
        err(with(
            "text",
            json!({"format": {"type": "json_schema", "name": "x",
                                           "schema": {"type": "frobnicated"}}})
        ))
        .await,
        "text.format"
    );
    assert_eq!(
        err(with(
            "input",
            json!([{"type": "function_call_output", "call_id": "call_x",
                                  "output": "r"}])
        ))
        .await,
        "input"
    );
    assert_eq!(
        err(with("include", json!(["file_search_call.results"]))).await,
        "include"
    );
    assert_eq!(
        err(with("max_output_tokens", json!(0))).await,
        "max_output_tokens"
    );
    let e = call(
        &r,
        "POST",
        PATH,
        Some("ka"),
        &with("model", json!("gpt-4o")).to_string(),
    )
    .await
    .error(404);
    assert_eq!(e["code"], "model_not_found");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn storage_is_bounded_per_tenant_oldest_first() {
    let mut s = settings();
    s.limits = Limits {
        max_stored_responses_per_tenant: 2,
        ..Limits::default()
    };
    let (_e, _s, r) = app(s);
    let mut ids = Vec::new();
    for i in 0..3 {
        let v = post(
            &r,
            "ka",
            &json!({"model": "agentkv", "input": format!("Number {i}"), "max_output_tokens": 1}),
        )
        .await;
        ids.push(v["id"].as_str().unwrap().to_string());
    }
    let status = |id: String| {
        let r = &r;
        async move {
            call(r, "GET", &format!("{PATH}/{id}"), Some("ka"), "")
                .await
                .status
                .as_u16()
        }
    };
    assert_eq!(status(ids[0].clone()).await, 404);
    assert_eq!(status(ids[1].clone()).await, 200);
    assert_eq!(status(ids[2].clone()).await, 200);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn input_items_list_the_request_items_paged_per_tenant() {
    let (_e, _s, r) = app(settings());
    let input = json!([
        {"role": "user", "content": "Weather in Paris?"},
        {"type": "function_call", "call_id": "call_a", "name": "get_weather",
         "arguments": "{\"city\": \"Paris\"}"},
        {"type": "function_call_output", "call_id": "call_a", "output": "18 C", "id": "fco_mine"},
        {"role": "user", "content": [{"type": "input_text", "text": "And "},
                                     {"type": "input_text", "text": "tomorrow?"}]}
    ]);
    let v = post(
        &r,
        "ka",
        &json!({"model": "agentkv", "input": input, "tools": tools(), "max_output_tokens": 8,
                "temperature": 0}),
    )
    .await;
    let id = v["id"].as_str().unwrap();
    let list = |query: &str, key: &'static str| {
        let r = r.clone();
        let path = format!("{PATH}/{id}/input_items{query}");
        async move { call(&r, "GET", &path, Some(key), "").await }
    };
    let all = list("", "ka").await;
    assert_eq!(all.status, 200, "{}", all.body);
    let all = all.json();
    println!("{all}");
    assert_eq!(all["object"], "list");
    assert_eq!(all["has_more"], false);
    let data = all["data"].as_array().unwrap();
    assert_eq!(data.len(), 4);
    // Newest first by default.
    assert_eq!(data[3]["type"], "message");
    assert_eq!(data[3]["role"], "user");
    assert_eq!(
        data[3]["content"],
        json!([{"type": "input_text", "text": "Weather in Paris?"}])
    );
    assert_eq!(data[2]["type"], "function_call");
    assert_eq!(
        (&data[2]["call_id"], &data[2]["name"], &data[2]["arguments"]),
        (
            &json!("call_a"),
            &json!("get_weather"),
            &json!("{\"city\": \"Paris\"}")
        )
    );
    assert_eq!(data[1]["type"], "function_call_output");
    assert_eq!(
        (&data[1]["id"], &data[1]["output"]),
        (&json!("fco_mine"), &json!("18 C"))
    );
    assert_eq!(data[0]["content"][0]["text"], "And tomorrow?");
    let ids: Vec<&str> = data.iter().map(|d| d["id"].as_str().unwrap()).collect();
    let unique: std::collections::BTreeSet<&&str> = ids.iter().collect();
    assert_eq!(unique.len(), 4, "{ids:?}");
    assert_eq!(all["first_id"], ids[0]);
    assert_eq!(all["last_id"], ids[3]);

    // Pages in input order.
    let p1 = list("?order=asc&limit=3", "ka").await.json();
    let p1_ids: Vec<&str> = p1["data"]
        .as_array()
        .unwrap()
        .iter()
        .map(|d| d["id"].as_str().unwrap())
        .collect();
    assert_eq!(p1_ids, [ids[3], ids[2], ids[1]]);
    assert_eq!(p1["has_more"], true);
    let p2 = list(&format!("?order=asc&limit=3&after={}", ids[1]), "ka")
        .await
        .json();
    assert_eq!(p2["data"].as_array().unwrap().len(), 1);
    assert_eq!(p2["data"][0]["id"], ids[0]);
    assert_eq!(p2["has_more"], false);

    // A string input is one user message; errors name their parameter; other tenants see nothing.
    let v = post(
        &r,
        "ka",
        &json!({"model": "agentkv", "input": "Hi", "max_output_tokens": 2}),
    )
    .await;
    let one = call(
        &r,
        "GET",
        &format!("{PATH}/{}/input_items", v["id"].as_str().unwrap()),
        Some("ka"),
        "",
    )
    .await
    .json();
    assert_eq!(one["data"][0]["content"][0]["text"], "Hi");
    assert_eq!(one["data"].as_array().unwrap().len(), 1);
    assert_eq!(list("?limit=0", "ka").await.error(400)["param"], "limit");
    assert_eq!(
        list("?order=sideways", "ka").await.error(400)["param"],
        "order"
    );
    assert_eq!(list("?after=nope", "ka").await.error(400)["param"], "after");
    list("?limit=many", "ka").await.error(400);
    list("", "kb").await.error(404);
    call(
        &r,
        "GET",
        &format!("{PATH}/resp_nope/input_items"),
        Some("ka"),
        "",
    )
    .await
    .error(404);
}

/// Issue #45: `truncation: "auto"` drops the oldest turns until the conversation fits (the
/// default refuses it with `context_length_exceeded`), and `max_tool_calls` bounds a reply's calls.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn truncation_auto_drops_the_oldest_turns_and_max_tool_calls_bounds_calls() {
    // A pool larger than the 8,192-token context, so the context is what overflows.
    let cfg = engine::EngineConfig {
        num_blocks: 640,
        threads: 2,
        ..engine::EngineConfig::default()
    };
    let engine = engine::Engine::start(engine::EngineCore::new(common::model(), cfg).unwrap());
    let state = server::AppState::new(
        engine.handle(),
        common::model().frontend().clone(),
        settings(),
    )
    .unwrap();
    let r = server::router(state);
    let long = "the agent read the file and ran the tests again. ".repeat(250);
    let mut input: Vec<Value> = Vec::new();
    for i in 0..5 {
        input.push(json!({"role": "user", "content": format!("step {i}: {long}")}));
        input.push(json!({"role": "assistant", "content": format!("done {i}")}));
    }
    input.push(json!({"role": "user", "content": "Say hi."}));
    let body = |truncation: Option<&str>| {
        let mut b = json!({"model": "agentkv", "input": input, "max_output_tokens": 4,
                           "temperature": 0, "instructions": "Be brief."});
        if let Some(t) = truncation {
            b["truncation"] = json!(t);
        }
        b.to_string()
    };
    for t in [None, Some("disabled")] {
        let e = call(&r, "POST", PATH, Some("ka"), &body(t))
            .await
            .error(400);
        assert_eq!(e["code"], "context_length_exceeded", "{e}");
    }
    let ok = call(&r, "POST", PATH, Some("ka"), &body(Some("auto"))).await;
    assert_eq!(ok.status, 200, "{}", ok.body);
    let v = ok.json();
    let used = v["usage"]["input_tokens"].as_u64().unwrap();
    assert!(used < 8192, "{used}");
    assert_eq!(v["truncation"], "auto", "{}", ok.body);
    assert!(
        v["output_text"].as_str().is_some_and(|t| !t.is_empty()),
        "{}",
        ok.body
    );
    // max_tool_calls: 1 with parallel calls allowed: one call at most.
    let tools = json!([{"type": "function", "name": "get_weather",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                       "required": ["city"]}}]);
    let b = json!({"model": "agentkv", "input": "Weather in Paris, Rome, Oslo, Bern and Riga?",
                   "tools": tools, "tool_choice": "required", "max_tool_calls": 1,
                   "max_output_tokens": 200, "temperature": 0});
    let v = call(&r, "POST", PATH, Some("ka"), &b.to_string())
        .await
        .json();
    let calls = v["output"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|o| o["type"] == "function_call")
        .count();
    assert_eq!(calls, 1, "{v}");
}
