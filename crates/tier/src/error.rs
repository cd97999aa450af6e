//! The one error type of tier operations. Corruption is never an error (it is a miss plus a
//! counter); errors are I/O, connection, timeout, config and caller mistakes.

use std::path::PathBuf;
use std::time::Duration;

/// Why a tier operation failed. The engine skips a failing tier and recomputes.
#[derive(Debug, thiserror::Error)]
pub enum TierError {
    /// A filesystem operation of the disk store failed.
    #[error("disk tier I/O error on {path}: {source}")]
    Io {
        /// File or directory involved.
        path: PathBuf,
        /// Underlying error.
        #[source]
        source: std::io::Error,
    },
    /// Redis answered with an error or the connection failed.
    #[error("redis tier error: {0}")]
    Redis(#[from] redis::RedisError),
    /// The store did not answer within its deadline (connect or I/O timeout): a hung or frozen
    /// server. The call gave up; the store backs off before trying again.
    #[error("{store} tier did not answer within {after:?}")]
    Timeout {
        /// Which store (`redis`).
        store: &'static str,
        /// The deadline that expired.
        after: Duration,
    },
    /// The tier failed recently and is skipped until its back-off expires (no I/O attempted).
    #[error("tier unavailable for another {retry_in:?} after a failure")]
    Unavailable {
        /// Time until the next attempt.
        retry_in: Duration,
    },
    /// A block cannot be stored (e.g. larger than the store's whole budget).
    #[error("invalid block: {0}")]
    InvalidBlock(String),
    /// Bad store configuration.
    #[error("invalid tier config: {0}")]
    Config(String),
    /// A fault injected by [`crate::FaultStore`].
    #[error("injected fault in {op}")]
    Injected {
        /// Operation that failed.
        op: &'static str,
    },
}

impl TierError {
    pub(crate) fn io(path: impl Into<PathBuf>, source: std::io::Error) -> TierError {
        TierError::Io {
            path: path.into(),
            source,
        }
    }
}
