//! agentkv's OpenAI-compatible HTTP server (axum): chat and text completions with SSE streaming,
//! honest cache accounting (`usage.prompt_tokens_details.cached_tokens` is what the engine reused),
//! tenants keyed by API key, bounded queues (429/503 with `Retry-After`), admin cache routes,
//! Prometheus `/metrics` and graceful shutdown.
//!
//! Owns HTTP only: it never schedules, samples or touches KV memory (the engine does), and never
//! reads config files (the binary turns YAML into [`ServerSettings`]).

pub mod admission;
pub mod breakpoints;
pub mod constraint_limits;
pub mod error;
pub mod gbnf;
pub mod grammar;
pub mod ids;
pub mod metrics;
mod metrics_compat;
mod output;
pub mod params;
mod pipeline;
mod prom_text;
pub mod reqlog;
pub mod response_store;
mod router_defaults;
mod routes;
pub mod run;
mod schema_embed;
pub mod sessions;
pub mod settings;
mod sse;
pub mod state;
pub mod structured;
pub mod tenants;
mod tool_call;
pub mod tool_families;
mod tool_stream;
pub mod tools;
pub mod transport;

use std::future::Future;

pub use error::ApiError;
pub use routes::router;
pub use settings::{Limits, ServerSettings, SettingsError, TenantSpec, UnknownFields};
pub use state::AppState;

/// Serves until `shutdown` resolves; then stops accepting, lets running requests finish for up to
/// `settings.shutdown_timeout`, and then ends those still running with an error the client sees
/// (an error event on a stream, a 503 JSON body otherwise) before returning. Connections are
/// capped and have header and body deadlines ([`transport`]).
pub async fn serve(
    listener: tokio::net::TcpListener,
    state: AppState,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    let grace = state.settings.shutdown_timeout;
    let st = state.clone();
    let app = router(state.clone());
    let shutdown = async move {
        shutdown.await;
        st.begin_shutdown();
    };
    transport::run(
        listener,
        app,
        &state.settings.limits,
        shutdown,
        grace,
        || state.abort_running(),
    )
    .await
}
