//! One log line per request (`tracing`, target `agentkv::request`): method, path, status, tenant,
//! prompt / cached / generated tokens, the cache-miss reason, TTFT, duration, how it ended, and
//! the id of an internal error. Written when the response body is finished or dropped, so a
//! stream's line comes at its end with its real duration (and `outcome=client_gone` when the
//! client left first).
//!
//! The route and the request's `Running` (`run.rs`) fill the line's fields through the
//! task-local [`RequestLog`] that [`log_requests`] installs around the handler; `Running` keeps a
//! handle, so a stream (polled outside the handler's task) still reports its tokens.

use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use axum::body::{Body, Bytes, HttpBody};
use axum::extract::Request;
use axum::http::{Method, StatusCode};
use axum::middleware::Next;
use axum::response::Response;
use http_body::{Frame, SizeHint};

/// What a request reports about itself; every field optional.
#[derive(Debug, Default, Clone)]
pub struct Entry {
    pub tenant: Option<String>,
    pub prompt_tokens: Option<usize>,
    pub cached_tokens: Option<usize>,
    pub generated_tokens: Option<usize>,
    /// `reason@token` of the cache miss, when the cached prefix stopped early.
    pub cache_miss: Option<String>,
    pub ttft: Option<Duration>,
    /// How generation ended: finish reasons (`stop`, `length`, …), `cancelled`, `error`.
    pub outcome: Option<String>,
    /// Id of an internal error (also in the client's 500 body).
    pub error_id: Option<String>,
    /// OpenAI fields the request set that this server accepts and ignores (also sent back in
    /// the `x-agentkv-ignored-fields` response header).
    pub ignored_fields: Vec<String>,
}

/// The response header naming the request fields that were accepted and ignored.
pub const IGNORED_FIELDS_HEADER: &str = "x-agentkv-ignored-fields";

/// A handle on the current request's log line.
#[derive(Debug, Clone, Default)]
pub struct RequestLog(Arc<Mutex<Entry>>);

tokio::task_local! {
    static CURRENT: RequestLog;
}

impl RequestLog {
    /// The line of the request being handled on this task, if any.
    pub fn current() -> Option<RequestLog> {
        CURRENT.try_with(Clone::clone).ok()
    }

    /// Changes the line's fields.
    pub fn update(&self, f: impl FnOnce(&mut Entry)) {
        let mut e = self.0.lock().unwrap_or_else(|p| p.into_inner());
        f(&mut e);
    }

    fn snapshot(&self) -> Entry {
        self.0.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }
}

/// Sets a field of the current request's line (no-op outside a request).
pub fn note(f: impl FnOnce(&mut Entry)) {
    if let Some(log) = RequestLog::current() {
        log.update(f);
    }
}

/// A short id for an internal error, unique within the process and unlikely to repeat across
/// restarts: 16 hex digits from the clock and a counter.
pub fn new_error_id() -> String {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let n = COUNTER.fetch_add(1, Ordering::Relaxed);
    let t = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64);
    // SplitMix64 of (time, counter): ids look random and never collide within a process.
    let mut z = t ^ n.wrapping_mul(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    format!("{:016x}", z ^ (z >> 31))
}

/// Router middleware: installs the request's [`RequestLog`] and writes its line when the
/// response body is done.
pub async fn log_requests(req: Request, next: Next) -> Response {
    let start = Instant::now();
    let method = req.method().clone();
    let path = req.uri().path().to_string();
    let log = RequestLog::default();
    let mut resp = CURRENT.scope(log.clone(), next.run(req)).await;
    let ignored = log.snapshot().ignored_fields;
    if !ignored.is_empty() {
        if let Ok(v) = axum::http::HeaderValue::from_str(&ignored.join(", ")) {
            resp.headers_mut().insert(IGNORED_FIELDS_HEADER, v);
        }
    }
    let status = resp.status();
    let (parts, body) = resp.into_parts();
    let body = LoggedBody {
        inner: body,
        line: Some(Line {
            log,
            start,
            method,
            path,
            status,
        }),
        ended: false,
    };
    Response::from_parts(parts, Body::new(body))
}

struct Line {
    log: RequestLog,
    start: Instant,
    method: Method,
    path: String,
    status: StatusCode,
}

impl Line {
    fn write(self, ended: bool) {
        let e = self.log.snapshot();
        let duration_ms = self.start.elapsed().as_secs_f64() * 1e3;
        let outcome = match (&e.outcome, ended) {
            (_, false) => "client_gone".to_string(),
            (Some(o), true) => o.clone(),
            (None, true) => "done".to_string(),
        };
        let quiet =
            matches!(self.path.as_str(), "/health" | "/metrics") && self.status.is_success();
        macro_rules! line {
            ($level:ident) => {
                tracing::$level!(
                    target: "agentkv::request",
                    method = %self.method,
                    path = %self.path,
                    status = self.status.as_u16(),
                    tenant = e.tenant.as_deref().unwrap_or("-"),
                    prompt_tokens = e.prompt_tokens,
                    cached_tokens = e.cached_tokens,
                    generated_tokens = e.generated_tokens,
                    cache_miss = e.cache_miss.as_deref(),
                    ttft_ms = e.ttft.map(|t| t.as_secs_f64() * 1e3),
                    duration_ms,
                    outcome = %outcome,
                    error_id = e.error_id.as_deref(),
                    ignored_fields = (!e.ignored_fields.is_empty()).then(|| e.ignored_fields.join(",")),
                    "request"
                )
            };
        }
        if quiet {
            line!(debug);
        } else if self.status.is_server_error() {
            line!(warn);
        } else {
            line!(info);
        }
    }
}

/// The response body, unchanged, with the line written once it ends or is dropped.
struct LoggedBody {
    inner: Body,
    line: Option<Line>,
    ended: bool,
}

impl HttpBody for LoggedBody {
    type Data = Bytes;
    type Error = axum::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, axum::Error>>> {
        let r = Pin::new(&mut self.inner).poll_frame(cx);
        if let Poll::Ready(None) = r {
            self.ended = true;
            if let Some(line) = self.line.take() {
                line.write(true);
            }
        }
        r
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

impl Drop for LoggedBody {
    fn drop(&mut self) {
        if let Some(line) = self.line.take() {
            // A body hyper knew to be empty or complete is never polled to its end.
            let ended = self.ended || self.inner.is_end_stream();
            line.write(ended);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn error_ids_are_distinct_hex() {
        let a = new_error_id();
        let b = new_error_id();
        assert_eq!(a.len(), 16);
        assert!(a.chars().all(|c| c.is_ascii_hexdigit()));
        assert_ne!(a, b);
    }
}
