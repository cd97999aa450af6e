//! Shared state of every route: the engine handle, the model's frontend (tokenizer, chat template,
//! context length),
//! tenants, the admission bounds, the metrics and the stored Responses-API conversations. Cheap to
//! clone; owns no request state.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::{SystemTime, UNIX_EPOCH};

use engine::EngineHandle;
use frontend::Frontend;

use crate::admission::Admission;
use crate::error::ApiError;
use crate::grammar::{GrammarError, Grammars};
use crate::metrics::Metrics;
use crate::response_store::{CompletionStore, ResponseStore};
use crate::settings::{ServerSettings, SettingsError};
use crate::tenants::Tenants;

#[derive(Clone)]
pub struct AppState {
    inner: Arc<Inner>,
}

pub struct Inner {
    pub engine: EngineHandle,
    /// Tokenizer, chat template and context length of the served model (never its weights).
    pub frontend: Arc<Frontend>,
    pub settings: ServerSettings,
    pub tenants: Tenants,
    pub admission: Arc<Admission>,
    pub metrics: Metrics,
    /// Stored responses of the Responses API, per tenant.
    pub responses: ResponseStore,
    /// Stored chat completions (`store: true`), per tenant (the same bounds as responses).
    pub chat_completions: CompletionStore,
    /// Unix seconds at start (the `created` of `/v1/models`).
    pub started_unix_s: u64,
    shutting_down: AtomicBool,
    /// Set when the shutdown grace period is over: running requests end with an error.
    abort: tokio::sync::watch::Sender<bool>,
    /// The grammar compiler over the model's vocabulary, built on the first constrained request.
    grammars: OnceLock<Result<Grammars, GrammarError>>,
}

impl AppState {
    pub fn new(
        engine: EngineHandle,
        frontend: Arc<Frontend>,
        settings: ServerSettings,
    ) -> Result<AppState, SettingsError> {
        settings.validate()?;
        Ok(AppState {
            inner: Arc::new(Inner {
                engine,
                frontend,
                tenants: Tenants::new(&settings),
                admission: Admission::new(settings.limits.clone()),
                responses: ResponseStore::new(
                    settings.limits.max_stored_responses_per_tenant,
                    settings.limits.max_stored_response_bytes_per_tenant,
                ),
                chat_completions: CompletionStore::new(
                    settings.limits.max_stored_responses_per_tenant,
                    settings.limits.max_stored_response_bytes_per_tenant,
                ),
                settings,
                metrics: Metrics::default(),
                started_unix_s: unix_now(),
                shutting_down: AtomicBool::new(false),
                abort: tokio::sync::watch::Sender::new(false),
                grammars: OnceLock::new(),
            }),
        })
    }

    /// New generation requests get 503 from now on.
    pub fn begin_shutdown(&self) {
        self.inner.shutting_down.store(true, Ordering::SeqCst);
    }

    pub fn is_shutting_down(&self) -> bool {
        self.inner.shutting_down.load(Ordering::SeqCst)
    }

    /// The shutdown grace period is over: every running request ends now with a 503 error (an
    /// error event on a stream), instead of its connection being dropped without a word.
    pub fn abort_running(&self) {
        self.begin_shutdown();
        self.inner.abort.send_replace(true);
    }

    /// Resolves once [`Self::abort_running`] has been called.
    pub async fn aborted(&self) {
        let mut rx = self.inner.abort.subscribe();
        let _ = rx.wait_for(|a| *a).await;
    }

    /// The grammar compiler (built once; a model whose vocabulary it cannot take is a 500).
    pub fn grammars(&self) -> Result<&Grammars, ApiError> {
        self.inner
            .grammars
            .get_or_init(|| Grammars::new(Arc::clone(&self.inner.frontend)))
            .as_ref()
            .map_err(|e| ApiError::Internal(format!("grammar compiler: {e}")))
    }
}

impl std::ops::Deref for AppState {
    type Target = Inner;
    fn deref(&self) -> &Inner {
        &self.inner
    }
}

pub fn unix_now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}
