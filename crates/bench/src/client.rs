//! One streaming `/v1/chat/completions` call and its timings: time to first token, gaps between
//! content chunks, end-to-end latency, the text and the server's `usage`. Failures come back as a
//! typed [`CallError`] value (recorded and counted by the driver), never as a panic or a retry.

use std::time::{Duration, Instant};

use api::{ChatCompletionChunk, ChatCompletionRequest, StreamOptions, Usage, STREAM_DONE};
use futures_util::StreamExt;
use serde::{Deserialize, Serialize};

use crate::sse::SseDecoder;
use crate::BenchError;

/// An OpenAI-compatible server to drive.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Target {
    /// Short label used in tables and plots.
    pub name: String,
    /// Base URL, e.g. `http://127.0.0.1:8080` (with or without a trailing `/v1`).
    pub base_url: String,
    pub model: String,
    /// Bearer token, when the server needs one (never written to results).
    #[serde(skip)]
    pub api_key: Option<String>,
}

impl Target {
    pub fn chat_url(&self) -> String {
        let base = self.base_url.trim_end_matches('/');
        let base = base.strip_suffix("/v1").unwrap_or(base);
        format!("{base}/v1/chat/completions")
    }
}

/// What was measured on a successful call.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct CallMetrics {
    /// Seconds from sending the request to the first chunk with non-empty content;
    /// `None` when the answer was empty.
    pub ttft_s: Option<f64>,
    /// Seconds between consecutive content chunks (one fewer than content chunks).
    pub inter_token_s: Vec<f64>,
    pub e2e_s: f64,
    pub content_chunks: u64,
    /// `usage` from the final chunk, `None` when the server sent none.
    pub usage: Option<Usage>,
    pub finish_reason: Option<String>,
    /// The answer text (kept out of the results JSON; the conversation needs it).
    #[serde(skip)]
    pub text: String,
}

impl CallMetrics {
    /// Generated tokens: `usage.completion_tokens`, else the number of content chunks.
    pub fn completion_tokens(&self) -> u64 {
        self.usage
            .as_ref()
            .map_or(self.content_chunks, |u| u.completion_tokens)
    }
}

/// Why a call failed.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum CallErrorKind {
    /// Could not connect or send the request.
    Connect,
    /// Non-2xx status.
    HttpStatus,
    /// The body stream broke off.
    Stream,
    /// A `data:` payload was not a chunk, or was an `{"error": …}` object.
    BadChunk,
    /// The server closed the stream without `[DONE]`.
    Truncated,
    /// The per-request timeout elapsed.
    Timeout,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct CallError {
    pub kind: CallErrorKind,
    /// HTTP status, when there was one.
    pub status: Option<u16>,
    pub message: String,
    /// Seconds until the failure was seen.
    pub after_s: f64,
}

/// HTTP client with the settings the benchmark needs.
pub fn http_client() -> Result<reqwest::Client, BenchError> {
    // No connection reuse: servers close idle or long-lived keep-alive connections on their own
    // schedule (llama-server after a few seconds or requests), and a POST sent on a connection
    // the server just closed fails with no retry. A fresh loopback connection costs microseconds.
    reqwest::Client::builder()
        .pool_max_idle_per_host(0)
        .tcp_nodelay(true)
        .build()
        .map_err(|e| BenchError::Http(e.to_string()))
}

/// Sends `req` with `stream: true` and `include_usage`, reads the whole stream.
/// `system_breakpoint` marks the first message with `cache_control: {"type": "ephemeral",
/// "ttl": "1h"}` on the wire (Anthropic's breakpoint; the request type has no such field).
pub async fn stream_chat(
    http: &reqwest::Client,
    target: &Target,
    req: &ChatCompletionRequest,
    system_breakpoint: bool,
    timeout: Duration,
) -> Result<CallMetrics, CallError> {
    let start = Instant::now();
    let body = wire_body(req, system_breakpoint);
    match tokio::time::timeout(timeout, stream_inner(http, target, &body, start)).await {
        Ok(r) => r,
        Err(_) => Err(CallError {
            kind: CallErrorKind::Timeout,
            status: None,
            message: format!("no complete answer within {:.1} s", timeout.as_secs_f64()),
            after_s: start.elapsed().as_secs_f64(),
        }),
    }
}

/// `req` as it goes on the wire: streaming with a final usage chunk.
pub fn streaming_request(req: &ChatCompletionRequest) -> ChatCompletionRequest {
    let mut req = req.clone();
    req.stream = Some(true);
    req.stream_options = Some(StreamOptions {
        include_usage: Some(true),
    });
    req
}

/// The JSON body of `req` as sent ([`streaming_request`]), its first message marked as a
/// `cache_control` breakpoint when `system_breakpoint`.
pub fn wire_body(req: &ChatCompletionRequest, system_breakpoint: bool) -> serde_json::Value {
    let mut body = serde_json::to_value(streaming_request(req)).unwrap_or_default();
    if system_breakpoint {
        if let Some(first) = body["messages"].get_mut(0).and_then(|m| m.as_object_mut()) {
            first.insert(
                "cache_control".into(),
                serde_json::json!({"type": "ephemeral", "ttl": "1h"}),
            );
        }
    }
    body
}

async fn stream_inner(
    http: &reqwest::Client,
    target: &Target,
    body: &serde_json::Value,
    start: Instant,
) -> Result<CallMetrics, CallError> {
    let fail = |kind, status, message: String| CallError {
        kind,
        status,
        message,
        after_s: start.elapsed().as_secs_f64(),
    };
    let mut builder = http.post(target.chat_url()).json(body);
    if let Some(key) = &target.api_key {
        builder = builder.bearer_auth(key);
    }
    let resp = builder
        .send()
        .await
        .map_err(|e| fail(CallErrorKind::Connect, None, e.to_string()))?;
    let status = resp.status();
    if !status.is_success() {
        let body = resp.text().await.unwrap_or_default();
        let body: String = body.chars().take(300).collect();
        return Err(fail(CallErrorKind::HttpStatus, Some(status.as_u16()), body));
    }
    let mut m = CallMetrics {
        ttft_s: None,
        inter_token_s: Vec::new(),
        e2e_s: 0.0,
        content_chunks: 0,
        usage: None,
        finish_reason: None,
        text: String::new(),
    };
    let mut last_content: Option<f64> = None;
    let mut decoder = SseDecoder::new();
    let mut body = resp.bytes_stream();
    let mut done = false;
    while let Some(bytes) = body.next().await {
        let bytes = bytes.map_err(|e| fail(CallErrorKind::Stream, None, e.to_string()))?;
        let now = start.elapsed().as_secs_f64();
        for data in decoder.push(&bytes) {
            if done {
                continue;
            }
            if data.trim() == STREAM_DONE {
                done = true;
                continue;
            }
            apply_chunk(&data, now, &mut m, &mut last_content)
                .map_err(|msg| fail(CallErrorKind::BadChunk, None, msg))?;
        }
    }
    if !done {
        return Err(fail(
            CallErrorKind::Truncated,
            None,
            "stream ended without [DONE]".into(),
        ));
    }
    m.e2e_s = start.elapsed().as_secs_f64();
    Ok(m)
}

/// Folds one `data:` payload into the metrics; `now` is seconds since the request was sent.
fn apply_chunk(
    data: &str,
    now: f64,
    m: &mut CallMetrics,
    last_content: &mut Option<f64>,
) -> Result<(), String> {
    let chunk: ChatCompletionChunk = serde_json::from_str(data).map_err(|e| {
        let short: String = data.chars().take(200).collect();
        format!("{e}: {short}")
    })?;
    if let Some(u) = chunk.usage {
        m.usage = Some(u);
    }
    for choice in chunk.choices.iter().filter(|c| c.index == 0) {
        if let Some(text) = choice.delta.content.as_deref().filter(|t| !t.is_empty()) {
            m.text.push_str(text);
            m.content_chunks += 1;
            match *last_content {
                None => m.ttft_s = Some(now),
                Some(prev) => m.inter_token_s.push(now - prev),
            }
            *last_content = Some(now);
        }
        if choice.finish_reason.is_some() {
            m.finish_reason.clone_from(&choice.finish_reason);
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use api::{ChatMessage, Role};

    #[test]
    fn the_wire_body_streams_and_marks_the_system_message_only_when_asked() {
        let mut req = ChatCompletionRequest {
            model: "m".into(),
            messages: vec![
                ChatMessage::new(Role::System, "sys"),
                ChatMessage::new(Role::User, "hi"),
            ],
            ..Default::default()
        };
        req.cache.prompt_cache_key = Some("t/a0-t0".into());
        let plain = wire_body(&req, false);
        assert_eq!(plain["stream"], true);
        assert_eq!(plain["prompt_cache_key"], "t/a0-t0");
        assert!(plain["messages"][0].get("cache_control").is_none());
        let marked = wire_body(&req, true);
        assert_eq!(
            marked["messages"][0]["cache_control"],
            serde_json::json!({"type": "ephemeral", "ttl": "1h"})
        );
        assert!(marked["messages"][1].get("cache_control").is_none());
    }
}
