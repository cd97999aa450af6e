//! The trace line format: one model call per line. Owns only the type (serde), never reads files.

use serde::{Deserialize, Serialize};

/// One model call of an agent trace.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct TraceCall {
    /// Seconds since the start of the trace.
    pub t: f64,
    /// Agent session (task) the call belongs to; empty (or absent) when the trace does not say.
    #[serde(default)]
    pub session: String,
    /// Tenant whose namespace the call runs in.
    pub tenant: String,
    /// Prompt token ids.
    pub tokens: Vec<u32>,
}
