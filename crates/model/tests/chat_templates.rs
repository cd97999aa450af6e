//! Chat-template rendering without a model: roles, tools, `bos_token`/`eos_token`, Python string
//! methods, `raise_exception`, whitespace control, and typed errors. Expected strings come from
//! Python Jinja2 set up like HF transformers (`tests/data/chat_jinja2.json`).

use frontend::chat::{ChatError, ChatMessage, ChatTemplate};

fn jinja2_data() -> serde_json::Value {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/data/chat_jinja2.json");
    serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap()
}

fn messages(v: &serde_json::Value) -> Vec<ChatMessage> {
    serde_json::from_value(v.clone()).unwrap()
}

#[test]
fn tool_template_matches_jinja2() {
    let d = jinja2_data();
    let t = ChatTemplate::new(d["templates"]["tools"].as_str().unwrap(), "<s>", "</s>").unwrap();
    let msgs = messages(&d["tool_messages"]);
    assert_eq!(msgs[3].tool_call_id.as_deref(), Some("c1"));
    let with = t.render(&msgs, Some(&d["tools"]), true).unwrap();
    assert_eq!(with, d["expected"]["tools_with"].as_str().unwrap());
    let without = t.render(&msgs, None, false).unwrap();
    assert_eq!(without, d["expected"]["tools_without"].as_str().unwrap());
}

#[test]
fn block_whitespace_bos_eos_and_string_methods_match_jinja2() {
    let d = jinja2_data();
    let t = ChatTemplate::new(d["templates"]["blocks"].as_str().unwrap(), "<s>", "</s>").unwrap();
    let out = t
        .render(&messages(&d["block_messages"]), None, true)
        .unwrap();
    assert_eq!(out, d["expected"]["blocks"].as_str().unwrap());
}

#[test]
fn raise_exception_is_a_typed_error() {
    let d = jinja2_data();
    let t = ChatTemplate::new(d["templates"]["tools"].as_str().unwrap(), "", "").unwrap();
    let bad = vec![
        ChatMessage::new("user", "hi"),
        ChatMessage::new("narrator", "x"),
    ];
    match t.render(&bad, None, true) {
        Err(ChatError::Raised(msg)) => assert_eq!(msg, "unknown role: narrator"),
        other => panic!("expected Raised, got {other:?}"),
    }
}

#[test]
fn broken_templates_are_errors_not_panics() {
    assert!(matches!(
        ChatTemplate::new("{% for m in messages %}", "", ""),
        Err(ChatError::Compile(_))
    ));
    let t = ChatTemplate::new("{{ messages[0].content + 1 }}", "", "").unwrap();
    assert!(matches!(
        t.render(&[ChatMessage::new("user", "a")], None, false),
        Err(ChatError::Render(_))
    ));
    let t = ChatTemplate::new("{{ messages[0].content.no_such_method() }}", "", "").unwrap();
    assert!(matches!(
        t.render(&[ChatMessage::new("user", "a")], None, false),
        Err(ChatError::Render(_))
    ));
}

#[test]
fn fallback_is_chatml() {
    let t = ChatTemplate::fallback();
    let msgs = [
        ChatMessage::new("system", "S"),
        ChatMessage::new("user", "U"),
        ChatMessage::new("assistant", "A"),
        ChatMessage::new("tool", "T"),
    ];
    assert_eq!(
        t.render(&msgs, None, true).unwrap(),
        "<|im_start|>system\nS<|im_end|>\n<|im_start|>user\nU<|im_end|>\n<|im_start|>assistant\nA<|im_end|>\n\
         <|im_start|>tool\nT<|im_end|>\n<|im_start|>assistant\n"
    );
    assert_eq!(
        t.render(&msgs[..1], None, false).unwrap(),
        "<|im_start|>system\nS<|im_end|>\n"
    );
}

#[test]
fn message_serde_omits_absent_optionals() {
    let m = ChatMessage::new("user", "hi");
    assert_eq!(
        serde_json::to_string(&m).unwrap(),
        r#"{"role":"user","content":"hi"}"#
    );
    let back: ChatMessage =
        serde_json::from_str(r#"{"role":"tool","content":"1","tool_call_id":"x"}"#).unwrap();
    assert_eq!(back.tool_call_id.as_deref(), Some("x"));
    // Templates can tell an absent field from an empty one.
    let t = ChatTemplate::new(
        "{{ 'name' if messages[0].name is defined else 'anon' }}",
        "",
        "",
    )
    .unwrap();
    assert_eq!(t.render(&[m], None, false).unwrap(), "anon");
}
