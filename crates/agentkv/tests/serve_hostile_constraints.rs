//! Issue #44's constraint findings, as real HTTP requests against the real `agentkv serve`
//! process: rule and `$ref` chains that used to overflow a runtime thread's stack and abort the
//! process (N1), constraints that allow nothing or dead-end, which used to answer 200 with
//! garbage (N3), and huge choice lists that held a core for seconds and answered with a panic
//! message (N4). Each answer must be a 200 whose text the constraint allows or a 4xx with an
//! OpenAI error body and a `code` — never a 5xx, a dropped connection, a panic text or a build
//! path — and the server must still answer `/health` afterwards.

mod common;

use common::{http, start, Server};
use serde_json::{json, Value};

const CONFIG: &str = "server: {model_name: hostile}\nmodel: {threads: 2}\n";

/// What a 200's text must satisfy.
enum Expect {
    /// Any text the predicate accepts (the text so far when cut by `max_tokens`).
    Text(fn(&str) -> bool),
    /// Must be refused (4xx).
    Refused,
}

fn check(server: &Server, case: &str, path: &str, body: Value, expect: Expect) {
    let (status, reply) = http(&server.addr, "POST", path, "", &body.to_string());
    for leak in [
        "panicked",
        ".rs:",
        "RUST_BACKTRACE",
        "/src/",
        "stack backtrace",
    ] {
        assert!(!reply.contains(leak), "{case}: internals leaked: {reply}");
    }
    let v: Value = serde_json::from_str(&reply).unwrap_or_else(|e| panic!("{case}: {e}: {reply}"));
    match status {
        200 => {
            let text = v["choices"][0]["message"]["content"]
                .as_str()
                .or_else(|| v["choices"][0]["text"].as_str())
                .or_else(|| v["output"][0]["content"][0]["text"].as_str())
                .unwrap_or_else(|| panic!("{case}: no text: {reply}"));
            match expect {
                Expect::Text(ok) => assert!(ok(text), "{case}: garbage {text:?}"),
                Expect::Refused => panic!("{case}: served: {reply}"),
            }
        }
        400..=499 => {
            let e = &v["error"];
            assert!(e["message"].is_string(), "{case}: {reply}");
            assert!(e["code"].is_string(), "{case}: no code: {reply}");
        }
        _ => panic!("{case}: status {status}: {reply}"),
    }
    let (status, _) = http(&server.addr, "GET", "/health", "", "");
    assert_eq!(status, 200, "{case}: the server no longer answers");
}

fn chat(constraint: Value) -> Value {
    let mut body = json!({
        "model": "hostile",
        "messages": [{"role": "user", "content": "Answer."}],
        "max_tokens": 12,
        "temperature": 0,
    });
    body.as_object_mut()
        .unwrap()
        .extend(constraint.as_object().unwrap().clone());
    body
}

fn lark_chain(n: usize) -> String {
    let mut g = String::from("start: r0\n");
    for i in 0..n {
        g.push_str(&format!("r{i}: \"t\" r{}\n", i + 1));
    }
    g.push_str(&format!("r{n}: \"end\"\n"));
    g
}

fn gbnf_chain(n: usize) -> String {
    let mut g = String::from("root ::= r0\n");
    for i in 0..n {
        g.push_str(&format!("r{i} ::= \"t\" r{}\n", i + 1));
    }
    g.push_str(&format!("r{n} ::= \"end\"\n"));
    g
}

fn ref_chain(n: usize) -> Value {
    let mut defs = serde_json::Map::new();
    for i in 0..n {
        defs.insert(
            format!("d{i}"),
            json!({"$ref": format!("#/$defs/d{}", i + 1)}),
        );
    }
    defs.insert(format!("d{n}"), json!({"type": "string", "maxLength": 5}));
    json!({"$ref": "#/$defs/d0", "$defs": defs})
}

fn all_t(s: &str) -> bool {
    s.chars().all(|c| c == 't' || "end".contains(c))
}

fn json_or_cut(s: &str) -> bool {
    !s.is_empty()
}

#[test]
fn hostile_constraints_never_take_the_server_down_or_answer_garbage() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = dir.path().join("agentkv.yaml");
    std::fs::write(&cfg, CONFIG).unwrap();
    let server = start(&cfg);
    let chat_path = "/v1/chat/completions";

    // N1: chains of references, through every route and grammar syntax.
    for n in [500, 1_000, 5_000] {
        check(
            &server,
            &format!("lark chain {n}"),
            chat_path,
            chat(json!({"guided_grammar": lark_chain(n)})),
            Expect::Text(all_t),
        );
    }
    check(
        &server,
        "gbnf chain 1000",
        chat_path,
        chat(json!({"grammar": gbnf_chain(1_000)})),
        Expect::Text(all_t),
    );
    check(
        &server,
        "lark chain 1000 (completions)",
        "/v1/completions",
        json!({"model": "hostile", "prompt": "Say:", "max_tokens": 12, "temperature": 0,
               "guided_grammar": lark_chain(1_000)}),
        Expect::Text(all_t),
    );
    let one_string = |s: &str| s.starts_with('"');
    check(
        &server,
        "$ref chain 1000 (response_format)",
        chat_path,
        chat(json!({"response_format": {"type": "json_schema",
                     "json_schema": {"name": "chain", "schema": ref_chain(1_000)}}})),
        Expect::Text(one_string),
    );
    check(
        &server,
        "$ref chain 1000 (responses text.format)",
        "/v1/responses",
        json!({"model": "hostile", "input": "Answer.", "max_output_tokens": 12, "temperature": 0,
               "text": {"format": {"type": "json_schema", "name": "chain", "schema": ref_chain(1_000)}}}),
        Expect::Text(one_string),
    );
    // Nested groups deep enough to overflow a recursive reader.
    let deep = format!("root ::= {}\"a\"{}", "(".repeat(20_000), ")".repeat(20_000));
    check(
        &server,
        "gbnf 20000 nested groups",
        chat_path,
        chat(json!({"grammar": deep})),
        Expect::Refused,
    );

    // N3: constraints that allow nothing, or loop without producing anything.
    check(
        &server,
        "regex matching nothing",
        chat_path,
        chat(json!({"guided_regex": "[^\\x00-\\x{10FFFF}]"})),
        Expect::Refused,
    );
    check(
        &server,
        "$ref loop",
        chat_path,
        chat(json!({"guided_json": {"$ref": "#/$defs/a",
                     "$defs": {"a": {"$ref": "#/$defs/b"}, "b": {"$ref": "#/$defs/a"}}}})),
        Expect::Text(json_or_cut),
    );
    let choices: Vec<String> = (0..2_000).map(|i| format!("c{i}x")).collect();
    let lark_choice = format!(
        "start: {}",
        choices
            .iter()
            .map(|c| format!("\"{c}\""))
            .collect::<Vec<_>>()
            .join(" | ")
    );
    check(
        &server,
        "2000-way lark choice",
        chat_path,
        chat(json!({"guided_grammar": lark_choice})),
        Expect::Text(|s| s.starts_with('c') && s.ends_with('x') && s.len() <= 6),
    );
    check(
        &server,
        "a{1000}{1000}",
        chat_path,
        chat(json!({"guided_regex": "a{1000}{1000}"})),
        Expect::Refused,
    );
    let any_of: Vec<Value> = (0..3_000)
        .map(|i| json!({"const": format!("v{i}")}))
        .collect();
    check(
        &server,
        "anyOf of 3000",
        chat_path,
        chat(json!({"guided_json": {"anyOf": any_of}})),
        Expect::Text(|s| s.starts_with("\"v")),
    );
    let props: serde_json::Map<String, Value> = (0..5_000)
        .map(|i| (format!("p{i}"), json!({"type": "integer"})))
        .collect();
    check(
        &server,
        "5000 properties",
        chat_path,
        chat(json!({"guided_json": {"type": "object", "properties": props}})),
        Expect::Text(|s| s.starts_with('{')),
    );

    // N4: a huge choice list is refused at once, naming the limit.
    let many: Vec<String> = (0..100_000).map(|i| format!("option-{i}")).collect();
    let (status, reply) = http(
        &server.addr,
        "POST",
        chat_path,
        "",
        &chat(json!({"guided_choice": many})).to_string(),
    );
    assert_eq!(status, 400, "{reply}");
    let v: Value = serde_json::from_str(&reply).unwrap();
    assert_eq!(v["error"]["code"], "constraint_too_large", "{reply}");
    assert_eq!(v["error"]["param"], "guided_choice", "{reply}");

    // And the server still serves an ordinary constrained request.
    check(
        &server,
        "ordinary choice",
        chat_path,
        chat(json!({"guided_choice": ["yes", "no"]})),
        Expect::Text(|s| s == "yes" || s == "no"),
    );
}

/// A constraint that dead-ends after the stream has started (issue #44, must-have 2): the
/// stream carries an error event with `constraint_dead_end`, then `[DONE]`, never text the
/// constraint did not allow.
#[test]
fn a_stream_whose_constraint_dead_ends_ends_with_an_error_event() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = dir.path().join("agentkv.yaml");
    std::fs::write(&cfg, CONFIG).unwrap();
    let server = start(&cfg);
    // 2,000 alternatives: the first token is allowed, the second trips llguidance's limit of
    // items per Earley row (2,000).
    let grammar = format!(
        "start: {}",
        (0..2_000)
            .map(|i| format!("\"c{i}x\""))
            .collect::<Vec<_>>()
            .join(" | ")
    );
    let mut body = chat(json!({"guided_grammar": grammar}));
    body["stream"] = json!(true);
    let (status, reply) = http(
        &server.addr,
        "POST",
        "/v1/chat/completions",
        "",
        &body.to_string(),
    );
    assert_eq!(status, 200, "{reply}");
    let data: Vec<&str> = reply
        .lines()
        .filter_map(|l| l.strip_prefix("data: "))
        .collect();
    assert_eq!(data.last(), Some(&"[DONE]"), "{reply}");
    let err: Value = serde_json::from_str(data[data.len() - 2]).unwrap();
    assert_eq!(err["error"]["code"], "constraint_dead_end", "{reply}");
    let text: String = data[..data.len() - 2]
        .iter()
        .filter_map(|d| serde_json::from_str::<Value>(d).ok())
        .filter_map(|v| {
            v["choices"][0]["delta"]["content"]
                .as_str()
                .map(str::to_string)
        })
        .collect();
    assert!(
        text.is_empty() || (text.starts_with('c') && text.len() <= 6),
        "{text:?}"
    );
}
