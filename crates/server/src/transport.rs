//! The HTTP/1.1 connection layer under the router: accepting with a connection cap, header and
//! body read deadlines, OpenAI-style JSON bodies on the errors hyper answers by itself, and
//! graceful shutdown. Owns sockets and timers only; routes never see it.
//!
//! - **Connection cap** (`limits.max_connections`): a connection beyond it gets an immediate 503
//!   with a JSON body and `Retry-After`, and is closed. So does one beyond the per-source cap
//!   (`limits.max_connections_per_source`, half the cap by default): one client address holding
//!   idle sockets cannot take every slot.
//! - **Header deadline** (`limits.header_timeout`): a connection that has not sent a complete
//!   request head within it — a fresh one, or an idle keep-alive one — is closed (slowloris).
//! - **Body deadline** (`limits.body_timeout`, [`read_body`]): a body not complete within it
//!   (e.g. a `Content-Length` larger than what is sent) gets a 408 and the connection is closed;
//!   a `Content-Length` over `limits.max_body_bytes` gets an immediate 413.
//! - **Errors hyper answers itself** (unparsable request 400, URI too long 414, headers too
//!   large 431) carry no body; [`JsonErrorIo`] rewrites those responses, as hyper writes them, to
//!   carry the OpenAI error body.
//! - **Shutdown**: stop accepting, let connections finish their current exchange for the grace
//!   period, then call `on_grace_expired` (which ends running requests with an error the client
//!   sees) and give the connections a moment to send it.

use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use axum::body::Body;
use axum::extract::{Request, State};
use axum::http::StatusCode;
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::Router;
use http_body_util::{BodyExt, LengthLimitError, Limited};
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::service::TowerToHyperService;
use tokio::io::{AsyncRead, AsyncWrite, AsyncWriteExt, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{watch, Semaphore};

use crate::error::ApiError;
use crate::settings::Limits;
use crate::state::AppState;

/// Send buffer of each accepted connection (the kernel doubles it). Small, so that a client that
/// stops reading a stream is noticed after a few dozen events instead of megabytes of kernel
/// buffer: the stream stops being polled, its request falls behind and the engine stops
/// decoding it (`engine::STALL_TOKENS`). Token streams are small; throughput is unaffected.
pub const SEND_BUFFER_BYTES: u32 = 8 * 1024;

/// hyper's read and write buffer per connection (see the send buffer): a request head must fit
/// in it (a longer one, a URI of 16 KiB included, gets 431).
pub const MAX_BUF_BYTES: usize = 16 * 1024;

/// Binds the server's listening socket on `host:port` (the first address it resolves to), with
/// `SO_REUSEADDR` and [`SEND_BUFFER_BYTES`] (accepted connections inherit it).
pub async fn bind(host: &str, port: u16) -> io::Result<TcpListener> {
    let addr = tokio::net::lookup_host((host, port))
        .await?
        .next()
        .ok_or_else(|| io::Error::new(io::ErrorKind::NotFound, "the host resolves to nothing"))?;
    let socket = if addr.is_ipv4() {
        tokio::net::TcpSocket::new_v4()?
    } else {
        tokio::net::TcpSocket::new_v6()?
    };
    socket.set_reuseaddr(true)?;
    socket.set_send_buffer_size(SEND_BUFFER_BYTES)?;
    socket.bind(addr)?;
    socket.listen(1024)
}

/// How long connections get, after the grace period, to deliver the errors of the requests
/// that were still running.
const ABORT_FLUSH: Duration = Duration::from_secs(2);

/// Serves `app` on `listener` until `shutdown` resolves, then shuts down gracefully (module
/// docs); `on_grace_expired` runs once if connections are still open after `grace`.
pub async fn run(
    listener: TcpListener,
    app: Router,
    limits: &Limits,
    shutdown: impl Future<Output = ()> + Send + 'static,
    grace: Duration,
    on_grace_expired: impl FnOnce(),
) -> io::Result<()> {
    let slots = Arc::new(Semaphore::new(limits.max_connections));
    let per_source = limits.connections_per_source();
    let sources = Sources::default();
    let header_timeout = limits.header_timeout;
    // `stop_tx` tells connections to finish; `done_tx.closed()` resolves when all have ended.
    let (stop_tx, stop_rx) = watch::channel(false);
    let (done_tx, done_rx) = watch::channel(());
    let mut shutdown = std::pin::pin!(shutdown);
    loop {
        let (stream, peer) = tokio::select! {
            _ = &mut shutdown => break,
            r = listener.accept() => match r {
                Ok(c) => c,
                Err(e) => {
                    // Out of file descriptors and the like: back off instead of spinning.
                    tracing::warn!(error = %e, "accept failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
        };
        let _ = stream.set_nodelay(true);
        let Some(source) = sources.take(peer.ip(), per_source) else {
            tracing::warn!(%peer, limit = per_source, "per-source connection cap reached; 503");
            tokio::spawn(refuse_busy(stream));
            continue;
        };
        let Ok(slot) = Arc::clone(&slots).try_acquire_owned() else {
            tracing::warn!(%peer, limit = limits.max_connections, "connection cap reached; 503");
            tokio::spawn(refuse_busy(stream));
            continue;
        };
        let svc = TowerToHyperService::new(app.clone());
        let mut stop = stop_rx.clone();
        let done = done_rx.clone();
        tokio::spawn(async move {
            let mut builder = hyper::server::conn::http1::Builder::new();
            builder
                .timer(TokioTimer::new())
                .header_read_timeout(header_timeout)
                // hyper's own write buffer (default ~400 KB, hundreds of token events) would
                // hide a client that stopped reading for seconds.
                .max_buf_size(MAX_BUF_BYTES)
                .keep_alive(true);
            let conn = builder.serve_connection(TokioIo::new(JsonErrorIo::new(stream)), svc);
            let mut conn = std::pin::pin!(conn);
            let mut stopping = false;
            loop {
                tokio::select! {
                    r = conn.as_mut() => {
                        if let Err(e) = r {
                            tracing::debug!(%peer, error = %e, "connection ended with an error");
                        }
                        break;
                    }
                    _ = stop.wait_for(|s| *s), if !stopping => {
                        stopping = true;
                        conn.as_mut().graceful_shutdown();
                    }
                }
            }
            drop(slot);
            drop(source);
            drop(done);
        });
    }
    drop(listener);
    drop(done_rx);
    let _ = stop_tx.send(true);
    if tokio::time::timeout(grace, done_tx.closed()).await.is_err() {
        tracing::warn!(
            grace_s = grace.as_secs_f64(),
            "shutdown grace period over; ending the requests still running with an error"
        );
        on_grace_expired();
        let _ = tokio::time::timeout(ABORT_FLUSH, done_tx.closed()).await;
    }
    Ok(())
}

/// Open connections per client address.
#[derive(Default, Clone)]
struct Sources(Arc<std::sync::Mutex<std::collections::HashMap<std::net::IpAddr, usize>>>);

/// One open connection of `ip`, counted until dropped.
struct SourceSlot {
    sources: Sources,
    ip: std::net::IpAddr,
}

impl Sources {
    /// A slot for one more connection of `ip`, `None` when it already holds `limit`.
    fn take(&self, ip: std::net::IpAddr, limit: usize) -> Option<SourceSlot> {
        let mut m = self.0.lock().unwrap_or_else(|p| p.into_inner());
        let n = m.entry(ip).or_insert(0);
        if *n >= limit {
            return None;
        }
        *n += 1;
        Some(SourceSlot {
            sources: self.clone(),
            ip,
        })
    }
}

impl Drop for SourceSlot {
    fn drop(&mut self) {
        let mut m = self.sources.0.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(n) = m.get_mut(&self.ip) {
            *n -= 1;
            if *n == 0 {
                m.remove(&self.ip);
            }
        }
    }
}

/// The 503 of a connection over the cap, written before anything is read; then closed.
async fn refuse_busy(mut stream: TcpStream) {
    let body = error_json(
        "too many open connections; retry later",
        "server_error",
        "overloaded",
    );
    let resp = format!(
        "HTTP/1.1 503 Service Unavailable\r\ncontent-type: application/json\r\n\
         content-length: {}\r\nretry-after: 1\r\nconnection: close\r\n\r\n{body}",
        body.len()
    );
    let _ = tokio::time::timeout(Duration::from_secs(1), async {
        let _ = stream.write_all(resp.as_bytes()).await;
        let _ = stream.shutdown().await;
    })
    .await;
}

fn error_json(message: &str, kind: &str, code: &str) -> String {
    let body = api::ErrorBody {
        error: api::ErrorDetail {
            message: message.to_string(),
            kind: kind.to_string(),
            param: None,
            code: Some(code.to_string()),
        },
    };
    serde_json::to_string(&body).unwrap_or_default()
}

/// Router middleware: reads the whole request body within `limits.body_timeout` and
/// `limits.max_body_bytes` (408 / 413 otherwise, and the connection is closed), then hands the
/// buffered body on. Every route reads whole bodies, so nothing streams through it.
pub async fn read_body(State(state): State<AppState>, req: Request, next: Next) -> Response {
    let limits = &state.settings.limits;
    let (parts, body) = req.into_parts();
    // A body announced larger than the limit is refused at once, before anything is read (not
    // after the body deadline: a 1 TB `Content-Length` used to hold the connection 30 s).
    let announced = parts
        .headers
        .get(axum::http::header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.trim().parse::<u64>().ok());
    if announced.is_some_and(|n| n > limits.max_body_bytes as u64) {
        return close(
            ApiError::BodyTooLarge {
                limit_bytes: limits.max_body_bytes,
            }
            .into_response(),
        );
    }
    let read = Limited::new(body, limits.max_body_bytes).collect();
    let bytes = match tokio::time::timeout(limits.body_timeout, read).await {
        Ok(Ok(c)) => c.to_bytes(),
        Ok(Err(e)) if e.downcast_ref::<LengthLimitError>().is_some() => {
            return close(
                ApiError::BodyTooLarge {
                    limit_bytes: limits.max_body_bytes,
                }
                .into_response(),
            )
        }
        Ok(Err(e)) => {
            return close(
                ApiError::InvalidRequest {
                    message: format!("cannot read the request body: {e}"),
                    param: None,
                }
                .into_response(),
            )
        }
        Err(_) => {
            tracing::info!(
                method = %parts.method,
                path = %parts.uri.path(),
                timeout_s = limits.body_timeout.as_secs_f64(),
                "request body not received in time; 408"
            );
            return close(ApiError::RequestTimeout(limits.body_timeout).into_response());
        }
    };
    next.run(Request::from_parts(parts, Body::from(bytes)))
        .await
}

fn close(mut resp: Response) -> Response {
    resp.headers_mut().insert(
        axum::http::header::CONNECTION,
        axum::http::HeaderValue::from_static("close"),
    );
    resp
}

/// A socket that gives hyper's own error responses (written when a request cannot be parsed,
/// before any route runs: 400, 414, 431, all with `content-length: 0`) an OpenAI error body.
/// Every other byte passes through untouched.
pub struct JsonErrorIo<T> {
    inner: T,
    /// A rewritten response still to be written, and how much of it is.
    pending: Option<(Vec<u8>, usize)>,
}

impl<T> JsonErrorIo<T> {
    pub fn new(inner: T) -> Self {
        JsonErrorIo {
            inner,
            pending: None,
        }
    }
}

/// The replacement of `buf` when it is one of hyper's body-less automatic error responses.
fn rewrite_automatic_error(buf: &[u8]) -> Option<Vec<u8>> {
    let rest = buf.strip_prefix(b"HTTP/1.1 ")?;
    let (status, message, code) = match rest.get(..4)? {
        b"400 " => (
            StatusCode::BAD_REQUEST,
            "the request is not valid HTTP/1.1",
            "invalid_http_request",
        ),
        b"414 " => (
            StatusCode::URI_TOO_LONG,
            "the request URI is too long",
            "uri_too_long",
        ),
        b"431 " => (
            StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE,
            "the request headers are too large or too many",
            "headers_too_large",
        ),
        _ => return None,
    };
    // Exactly one complete head with an empty body: what hyper writes for these.
    let end = buf.windows(4).position(|w| w == b"\r\n\r\n")? + 4;
    if end != buf.len() {
        return None;
    }
    let head = std::str::from_utf8(&buf[..end - 2]).ok()?;
    let mut lines: Vec<&str> = head.split("\r\n").filter(|l| !l.is_empty()).collect();
    let cl = lines
        .iter()
        .position(|l| l.eq_ignore_ascii_case("content-length: 0"))?;
    lines.remove(cl);
    let body = error_json(message, "invalid_request_error", code);
    let mut out = lines.join("\r\n");
    out.push_str(&format!(
        "\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n{body}",
        body.len()
    ));
    tracing::info!(status = status.as_u16(), "request refused while parsing it");
    Some(out.into_bytes())
}

impl<T: AsyncWrite + Unpin> JsonErrorIo<T> {
    /// Writes what is left of a rewritten response; `Ready(Ok)` once nothing is.
    fn poll_pending(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        while let Some((bytes, done)) = &mut self.pending {
            if *done == bytes.len() {
                self.pending = None;
                break;
            }
            match Pin::new(&mut self.inner).poll_write(cx, &bytes[*done..]) {
                Poll::Ready(Ok(0)) => return Poll::Ready(Err(io::ErrorKind::WriteZero.into())),
                Poll::Ready(Ok(n)) => *done += n,
                Poll::Ready(Err(e)) => return Poll::Ready(Err(e)),
                Poll::Pending => return Poll::Pending,
            }
        }
        Poll::Ready(Ok(()))
    }
}

impl<T: AsyncRead + Unpin> AsyncRead for JsonErrorIo<T> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_read(cx, buf)
    }
}

impl<T: AsyncWrite + Unpin> AsyncWrite for JsonErrorIo<T> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let this = &mut *self;
        if let Poll::Ready(Err(e)) = this.poll_pending(cx) {
            return Poll::Ready(Err(e));
        }
        if this.pending.is_some() {
            return Poll::Pending;
        }
        if let Some(replacement) = rewrite_automatic_error(buf) {
            // Taken whole: the rest is written by this call or by the next write / flush.
            this.pending = Some((replacement, 0));
            if let Poll::Ready(Err(e)) = this.poll_pending(cx) {
                return Poll::Ready(Err(e));
            }
            return Poll::Ready(Ok(buf.len()));
        }
        Pin::new(&mut this.inner).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = &mut *self;
        match this.poll_pending(cx) {
            Poll::Ready(Ok(())) => Pin::new(&mut this.inner).poll_flush(cx),
            other => other,
        }
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = &mut *self;
        match this.poll_pending(cx) {
            Poll::Ready(Ok(())) => Pin::new(&mut this.inner).poll_shutdown(cx),
            other => other,
        }
    }
}

/// The router's answer to a known path with the wrong method: 405 with an OpenAI error body.
pub async fn method_not_allowed() -> ApiError {
    ApiError::MethodNotAllowed
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn automatic_errors_get_a_json_body_and_others_pass() {
        let head =
            b"HTTP/1.1 431 Request Header Fields Too Large\r\ncontent-length: 0\r\ndate: x\r\n\r\n";
        let out = String::from_utf8(rewrite_automatic_error(head).unwrap()).unwrap();
        let (h, body) = out.split_once("\r\n\r\n").unwrap();
        assert!(h.starts_with("HTTP/1.1 431 "));
        assert!(h.contains(&format!("content-length: {}", body.len())));
        let v: serde_json::Value = serde_json::from_str(body).unwrap();
        assert_eq!(v["error"]["code"], "headers_too_large");
        // A response with a body, a success, or a partial write passes through.
        assert!(rewrite_automatic_error(
            b"HTTP/1.1 400 Bad Request\r\ncontent-length: 2\r\n\r\n{}"
        )
        .is_none());
        assert!(rewrite_automatic_error(b"HTTP/1.1 200 OK\r\ncontent-length: 0\r\n\r\n").is_none());
        assert!(
            rewrite_automatic_error(b"HTTP/1.1 414 URI Too Long\r\ncontent-length: 0\r\n")
                .is_none()
        );
    }
}
