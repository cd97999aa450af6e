//! Typed errors of the bench library. Per-call HTTP failures are not errors of this kind: they are
//! recorded as `client::CallError` and counted in the results.

use std::path::PathBuf;

#[derive(Debug, thiserror::Error)]
pub enum BenchError {
    #[error("invalid configuration: {0}")]
    Config(String),
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{path}:{line}: bad trace line: {source}")]
    TraceLine {
        path: PathBuf,
        line: usize,
        #[source]
        source: serde_json::Error,
    },
    #[error("serialising results: {0}")]
    Json(#[from] serde_json::Error),
    #[error("building the HTTP client: {0}")]
    Http(String),
    #[error("rendering a plot: {0}")]
    Plot(String),
    #[error("HF config: {0}")]
    HfConfig(String),
    #[error("unknown preset {0:?} (known: {1})")]
    UnknownPreset(String, String),
}

impl BenchError {
    pub(crate) fn io(path: impl Into<PathBuf>, source: std::io::Error) -> Self {
        BenchError::Io {
            path: path.into(),
            source,
        }
    }
}
