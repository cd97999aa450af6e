//! agentkv's OpenAI-compatible HTTP server (axum): chat and text completions with SSE streaming,
//! honest cache accounting (`usage.prompt_tokens_details.cached_tokens` is what the engine reused),
//! tenants keyed by API key, bounded queues (429/503 with `Retry-After`), admin cache routes,
//! Prometheus `/metrics` and graceful shutdown.
//!
//! Owns HTTP only: it never schedules, samples or touches KV memory (the engine does), and never
//! reads config files (the binary turns YAML into [`ServerSettings`]).

pub mod admission;
pub mod error;
pub mod gbnf;
pub mod grammar;
pub mod metrics;
mod output;
pub mod params;
pub mod response_store;
mod routes;
pub mod run;
pub mod sessions;
pub mod settings;
mod sse;
pub mod state;
pub mod structured;
pub mod tenants;
pub mod tool_families;
mod tool_stream;
pub mod tools;

use std::future::{Future, IntoFuture};

pub use error::ApiError;
pub use routes::router;
pub use settings::{Limits, ServerSettings, SettingsError, TenantSpec, UnknownFields};
pub use state::AppState;

/// Serves until `shutdown` resolves; then stops accepting, lets running requests finish for up to
/// `settings.shutdown_timeout`, and returns (dropping what is left cancels it in the engine).
pub async fn serve(
    listener: tokio::net::TcpListener,
    state: AppState,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    let grace = state.settings.shutdown_timeout;
    let (tx, rx) = tokio::sync::oneshot::channel::<()>();
    let st = state.clone();
    let app = router(state);
    let server = axum::serve(listener, app).with_graceful_shutdown(async move {
        shutdown.await;
        st.begin_shutdown();
        let _ = tx.send(());
    });
    let mut server = std::pin::pin!(server.into_future());
    tokio::select! {
        r = &mut server => r,
        _ = async {
            let _ = rx.await;
            tokio::time::sleep(grace).await;
        } => Ok(()),
    }
}
