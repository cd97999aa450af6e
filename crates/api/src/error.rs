//! The OpenAI error body `{"error": {"message", "type", "param", "code"}}`. Shape only; never
//! decides which HTTP status an error gets (the server does that in one place).

use serde::{Deserialize, Serialize};

/// The JSON body of every non-2xx answer.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ErrorBody {
    pub error: ErrorDetail,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ErrorDetail {
    pub message: String,
    /// `invalid_request_error`, `authentication_error`, `rate_limit_error`, `server_error`, …
    #[serde(rename = "type")]
    pub kind: String,
    /// The request field at fault, when one is.
    #[serde(default)]
    pub param: Option<String>,
    /// A machine-readable code, e.g. `context_length_exceeded`.
    #[serde(default)]
    pub code: Option<String>,
}
