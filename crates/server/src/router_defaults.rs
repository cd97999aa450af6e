//! Fields that routers in front of the server add to every request they forward, at values that
//! ask for nothing: vllm-router 0.1.17 and sglang-router 0.3.2 re-serialise the client's body
//! with SGLang's sampling defaults (`"ignore_eos": false`, `"skip_special_tokens": true`, …).
//! Such a field carrying exactly its no-op value is treated as absent, so a routed request
//! behaves as the client's own; the same field with any other value is still refused as
//! unknown / unsupported (`params.rs`). Owns the list; never changes a request's meaning.

use serde_json::Value;

/// `(field, value that changes nothing)`.
const NO_OP_DEFAULTS: &[(&str, NoOp)] = &[
    ("no_stop_trim", NoOp::False),
    ("ignore_eos", NoOp::False),
    ("continue_final_message", NoOp::False),
    ("return_hidden_states", NoOp::False),
    ("skip_special_tokens", NoOp::True),
    ("separate_reasoning", NoOp::True),
    ("stream_reasoning", NoOp::True),
    ("include_reasoning", NoOp::True),
    ("echo", NoOp::False),
];

#[derive(Clone, Copy)]
enum NoOp {
    False,
    True,
}

/// True when `name: value` is a router's no-op default.
pub fn is_router_default(name: &str, value: &Value) -> bool {
    NO_OP_DEFAULTS.iter().any(|(n, v)| {
        *n == name
            && match v {
                NoOp::False => value == &Value::Bool(false),
                NoOp::True => value == &Value::Bool(true),
            }
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn only_the_no_op_value_is_a_default() {
        assert!(is_router_default("ignore_eos", &json!(false)));
        assert!(!is_router_default("ignore_eos", &json!(true)));
        assert!(is_router_default("skip_special_tokens", &json!(true)));
        assert!(!is_router_default("skip_special_tokens", &json!(false)));
        assert!(!is_router_default("ignore_eos", &json!("false")));
        assert!(!is_router_default("frobnicate", &json!(false)));
    }
}
