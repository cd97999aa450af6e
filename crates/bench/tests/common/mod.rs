//! A small OpenAI-compatible chat server for the driver tests: streams SSE chunks with a final
//! usage chunk, and injects faults and latency per step (step = assistant messages in the prompt).

#![allow(dead_code)]

use std::sync::{Arc, Mutex};
use std::time::Duration;

use api::{
    ChatChunkChoice, ChatCompletionChunk, ChatCompletionRequest, ChatDelta, PromptTokensDetails,
    Role, Usage,
};
use axum::body::Body;
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use axum::serve::ListenerExt;
use axum::{Json, Router};
use futures_util::StreamExt;

/// What the server does with a call at a given step.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Fault {
    None,
    /// HTTP 503 with a JSON error body.
    Status503,
    /// Streams two content chunks then closes without `[DONE]`.
    Truncate,
    /// Sends a `data:` line that is not JSON.
    Garbage,
}

pub struct ServerConfig {
    pub fault_at_step: fn(usize) -> Fault,
    pub report_cached: bool,
    /// Delay before the first chunk, per step.
    pub ttft_ms: fn(usize) -> u64,
    /// Delay between content chunks.
    pub gap_ms: u64,
    /// Content chunks per answer (capped by max_tokens).
    pub answer_chunks: u32,
}

impl Default for ServerConfig {
    fn default() -> Self {
        ServerConfig {
            fault_at_step: |_| Fault::None,
            report_cached: true,
            ttft_ms: |_| 0,
            gap_ms: 0,
            answer_chunks: 4,
        }
    }
}

pub struct Server {
    pub url: String,
    pub received: Arc<Mutex<Vec<ChatCompletionRequest>>>,
}

struct St {
    cfg: ServerConfig,
    received: Arc<Mutex<Vec<ChatCompletionRequest>>>,
}

/// Starts the server on an ephemeral loopback port.
pub async fn start(cfg: ServerConfig) -> Server {
    let received = Arc::new(Mutex::new(Vec::new()));
    let st = Arc::new(St {
        cfg,
        received: Arc::clone(&received),
    });
    let app = Router::new()
        .route("/v1/chat/completions", post(chat))
        .with_state(st);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    // Without TCP_NODELAY, Nagle + delayed ACK hold small SSE chunks back ~40 ms and merge them.
    let listener = listener.tap_io(|tcp| {
        let _ = tcp.set_nodelay(true);
    });
    tokio::spawn(async move {
        axum::serve(listener, app).await.unwrap();
    });
    Server {
        url: format!("http://{addr}"),
        received,
    }
}

fn chunk(content: Option<String>, usage: Option<Usage>, finish: Option<&str>) -> String {
    let c = ChatCompletionChunk {
        id: "chatcmpl-test".into(),
        object: "chat.completion.chunk".into(),
        created: 0,
        model: "test".into(),
        choices: if usage.is_some() {
            Vec::new()
        } else {
            vec![ChatChunkChoice {
                index: 0,
                delta: ChatDelta {
                    role: Some(Role::Assistant),
                    content,
                    ..Default::default()
                },
                finish_reason: finish.map(str::to_string),
                logprobs: None,
            }]
        },
        usage,
        system_fingerprint: None,
    };
    format!("data: {}\n\n", serde_json::to_string(&c).unwrap())
}

async fn chat(State(st): State<Arc<St>>, Json(req): Json<ChatCompletionRequest>) -> Response {
    st.received.lock().unwrap().push(req.clone());
    let step = req
        .messages
        .iter()
        .filter(|m| m.role == Role::Assistant)
        .count();
    let fault = (st.cfg.fault_at_step)(step);
    if fault == Fault::Status503 {
        return (
            StatusCode::SERVICE_UNAVAILABLE,
            r#"{"error":{"message":"overloaded"}}"#,
        )
            .into_response();
    }
    assert_eq!(req.stream, Some(true), "the bench always streams");
    let n = st.cfg.answer_chunks.min(req.max_tokens.unwrap_or(u32::MAX)) as usize;
    let mut events: Vec<(u64, String)> = Vec::new();
    // First chunk: role only (no content), sent at once.
    events.push((0, chunk(None, None, None)));
    for i in 0..n {
        let delay = if i == 0 {
            (st.cfg.ttft_ms)(step)
        } else {
            st.cfg.gap_ms
        };
        events.push((delay, chunk(Some(format!("s{step}w{i} ")), None, None)));
        if fault == Fault::Truncate && i == 1 {
            break;
        }
    }
    match fault {
        Fault::Truncate => {}
        Fault::Garbage => events.push((0, "data: not json\n\n".into())),
        _ => {
            let msgs = req.messages.len() as u64;
            events.push((0, chunk(None, None, Some("length"))));
            let usage = Usage {
                prompt_tokens: 100 * msgs,
                completion_tokens: n as u64,
                total_tokens: 100 * msgs + n as u64,
                prompt_tokens_details: st.cfg.report_cached.then_some(PromptTokensDetails {
                    cached_tokens: Some(50 * msgs),
                    audio_tokens: None,
                    // Like agentkv: the first call of a task (2 messages) is new, later ones
                    // diverge where the previous answer was appended.
                    cache_miss: Some(api::CacheMissDetails {
                        reason: if msgs == 2 { "uncached" } else { "diverged" }.into(),
                        at_token: 50 * msgs,
                    }),
                    cache_write_tokens: None,
                }),
                completion_tokens_details: None,
            };
            events.push((0, chunk(None, Some(usage), None)));
            events.push((0, "data: [DONE]\n\n".into()));
        }
    }
    let body = futures_util::stream::iter(events).then(|(delay, text)| async move {
        if delay > 0 {
            tokio::time::sleep(Duration::from_millis(delay)).await;
        }
        Ok::<_, std::io::Error>(text)
    });
    Response::builder()
        .header("content-type", "text/event-stream")
        .body(Body::from_stream(body))
        .unwrap()
}
