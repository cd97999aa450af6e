//! Every way a request can fail, and the one place where failures become HTTP: status code,
//! OpenAI error body and `Retry-After`. Handlers return [`ApiError`]; nothing else picks a status.

use api::{ErrorBody, ErrorDetail};
use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use engine::EngineError;

#[derive(Debug, Clone, thiserror::Error, PartialEq)]
pub enum ApiError {
    /// A field has an invalid value or the body is not valid JSON for the route.
    #[error("{message}")]
    InvalidRequest {
        message: String,
        param: Option<String>,
    },
    #[error(
        "This model's maximum context length is {context_length} tokens. However, your messages \
         resulted in {prompt_tokens} tokens. Please reduce the length of the messages."
    )]
    PromptTooLong {
        prompt_tokens: usize,
        context_length: usize,
    },
    #[error("{0}")]
    ContextExceeded(String),
    /// A top-level request field this server does not know (with `UnknownFields::Reject`).
    #[error("unknown parameter: {param:?}")]
    UnknownParameter { param: String },
    /// A field this server knows of but does not honour (or not with this value).
    #[error("{message}")]
    UnsupportedParameter { param: String, message: String },
    /// The request's `model` is none of the served names.
    #[error("the model {model:?} does not exist (served: {served})")]
    ModelNotFound { model: String, served: String },
    #[error("request body exceeds the limit of {limit_bytes} bytes")]
    BodyTooLarge { limit_bytes: usize },
    #[error("invalid or missing API key")]
    Unauthorized,
    #[error("{0}")]
    Forbidden(String),
    #[error("{0}")]
    NotFound(String),
    #[error("too many requests in flight for this tenant ({reason}); retry later")]
    TenantOverloaded {
        reason: String,
        retry_after_secs: u64,
    },
    #[error("the server is at capacity ({reason}); retry later")]
    ServerOverloaded {
        reason: String,
        retry_after_secs: u64,
    },
    #[error("the server is shutting down")]
    ShuttingDown,
    /// Prompt + max_tokens × n alone exceeds a token bound of the queue: it can never be admitted.
    #[error(
        "the request needs {tokens} tokens (prompt + max_tokens x n) but at most {limit} may be \
         in flight; lower max_tokens or n"
    )]
    NeverAdmissible { tokens: usize, limit: usize },
    /// The path exists but not with this method.
    #[error("method not allowed on this path")]
    MethodNotAllowed,
    /// The request body did not arrive within the server's body timeout.
    #[error("the request body was not received within {0:?}")]
    RequestTimeout(std::time::Duration),
    /// The output constraint (grammar, schema, tool calls) could not continue partway: no
    /// token was allowed, or it failed. Never answered with text the constraint did not allow.
    #[error("{0}")]
    ConstraintDeadEnd(String),
    /// A constraint over one of the compile limits (`constraint_limits.rs`), named in the text.
    #[error("{message}")]
    ConstraintTooLarge { message: String, param: String },
    #[error("internal error: {0}")]
    Internal(String),
}

impl ApiError {
    pub fn invalid(message: impl Into<String>, param: &str) -> Self {
        ApiError::InvalidRequest {
            message: message.into(),
            param: Some(param.to_string()),
        }
    }

    pub fn status(&self) -> StatusCode {
        match self {
            ApiError::InvalidRequest { .. }
            | ApiError::PromptTooLong { .. }
            | ApiError::ContextExceeded(_)
            | ApiError::NeverAdmissible { .. }
            | ApiError::ConstraintDeadEnd(_)
            | ApiError::ConstraintTooLarge { .. }
            | ApiError::UnknownParameter { .. }
            | ApiError::UnsupportedParameter { .. } => StatusCode::BAD_REQUEST,
            ApiError::ModelNotFound { .. } => StatusCode::NOT_FOUND,
            ApiError::BodyTooLarge { .. } => StatusCode::PAYLOAD_TOO_LARGE,
            ApiError::Unauthorized => StatusCode::UNAUTHORIZED,
            ApiError::Forbidden(_) => StatusCode::FORBIDDEN,
            ApiError::NotFound(_) => StatusCode::NOT_FOUND,
            ApiError::MethodNotAllowed => StatusCode::METHOD_NOT_ALLOWED,
            ApiError::RequestTimeout(_) => StatusCode::REQUEST_TIMEOUT,
            ApiError::TenantOverloaded { .. } => StatusCode::TOO_MANY_REQUESTS,
            ApiError::ServerOverloaded { .. } | ApiError::ShuttingDown => {
                StatusCode::SERVICE_UNAVAILABLE
            }
            ApiError::Internal(_) => StatusCode::INTERNAL_SERVER_ERROR,
        }
    }

    /// The OpenAI error body (also sent as an SSE event when a stream fails midway). An internal
    /// error is logged here with a fresh id, which the body carries instead of the details.
    pub fn body(&self) -> ErrorBody {
        let (kind, code, param) = match self {
            ApiError::InvalidRequest { param: Some(p), .. } => (
                "invalid_request_error",
                Some("invalid_value"),
                Some(p.clone()),
            ),
            ApiError::InvalidRequest { param: None, .. } => {
                ("invalid_request_error", Some("invalid_request_body"), None)
            }
            ApiError::ConstraintDeadEnd(_) => {
                ("invalid_request_error", Some("constraint_dead_end"), None)
            }
            ApiError::ConstraintTooLarge { param, .. } => (
                "invalid_request_error",
                Some("constraint_too_large"),
                Some(param.clone()),
            ),
            ApiError::PromptTooLong { .. } | ApiError::ContextExceeded(_) => (
                "invalid_request_error",
                Some("context_length_exceeded"),
                Some("messages".to_string()),
            ),
            ApiError::NeverAdmissible { .. } => (
                "invalid_request_error",
                Some("request_too_large"),
                Some("max_tokens".to_string()),
            ),
            ApiError::UnknownParameter { param } => (
                "invalid_request_error",
                Some("unknown_parameter"),
                Some(param.clone()),
            ),
            ApiError::UnsupportedParameter { param, .. } => (
                "invalid_request_error",
                Some("unsupported_parameter"),
                Some(param.clone()),
            ),
            ApiError::ModelNotFound { .. } => (
                "invalid_request_error",
                Some("model_not_found"),
                Some("model".to_string()),
            ),
            ApiError::BodyTooLarge { .. } => {
                ("invalid_request_error", Some("body_too_large"), None)
            }
            ApiError::Unauthorized => ("authentication_error", Some("invalid_api_key"), None),
            ApiError::Forbidden(_) => ("permission_error", Some("permission_denied"), None),
            ApiError::NotFound(_) => ("not_found_error", Some("not_found"), None),
            ApiError::MethodNotAllowed => {
                ("invalid_request_error", Some("method_not_allowed"), None)
            }
            ApiError::RequestTimeout(_) => ("invalid_request_error", Some("request_timeout"), None),
            ApiError::TenantOverloaded { .. } => {
                ("rate_limit_error", Some("rate_limit_exceeded"), None)
            }
            ApiError::ServerOverloaded { .. } | ApiError::ShuttingDown => {
                ("server_error", Some("overloaded"), None)
            }
            ApiError::Internal(_) => ("server_error", Some("internal_error"), None),
        };
        // Internal details (engine or tokenizer messages) go to the server's log under an id;
        // the client gets the id, never the text.
        let message = match self {
            ApiError::Internal(detail) => {
                let id = crate::reqlog::new_error_id();
                tracing::error!(error_id = %id, detail = %detail, "internal error");
                crate::reqlog::note(|e| e.error_id = Some(id.clone()));
                format!("internal server error (error id {id})")
            }
            ApiError::ConstraintDeadEnd(detail) => {
                tracing::warn!(detail = %detail, "output constraint dead end");
                self.to_string()
            }
            _ => self.to_string(),
        };
        ErrorBody {
            error: ErrorDetail {
                message,
                kind: kind.to_string(),
                param,
                code: code.map(str::to_string),
            },
        }
    }

    /// Converts an engine failure (never an overload: the server's admission bounds the queue).
    pub fn from_engine(e: EngineError) -> Self {
        match e {
            EngineError::Request(r) if r.exceeds_capacity() => {
                ApiError::ContextExceeded(r.to_string())
            }
            EngineError::Request(r) => ApiError::invalid(r.to_string(), r.param()),
            e @ EngineError::ConstraintDeadEnd { .. } => ApiError::ConstraintDeadEnd(e.to_string()),
            EngineError::ShutDown => ApiError::ShuttingDown,
            EngineError::Internal(_) => ApiError::Internal(e.to_string()),
        }
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let status = self.status();
        let mut resp = (status, axum::Json(self.body())).into_response();
        let retry_after = match &self {
            ApiError::TenantOverloaded {
                retry_after_secs, ..
            }
            | ApiError::ServerOverloaded {
                retry_after_secs, ..
            } => Some(*retry_after_secs),
            ApiError::ShuttingDown => Some(1),
            _ => None,
        };
        if let Some(secs) = retry_after {
            resp.headers_mut()
                .insert(header::RETRY_AFTER, HeaderValue::from(secs));
        }
        resp
    }
}
