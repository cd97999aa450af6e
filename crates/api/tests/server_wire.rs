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
