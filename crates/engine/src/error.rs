//! The engine's errors, one enum per boundary: building an engine ([`EngineBuildError`]), a
//! request refused at submission ([`RequestError`], the caller's fault, naming the field), and
//! what a request or the engine reports afterwards ([`EngineError`]).
//!
//! Owns the limits a request is checked against ([`MAX_CHOICES`]); the server uses the same
//! constants rather than its own copies.

use model::sampler::SamplingError;

/// Most choices (`n`) one request may ask for.
pub const MAX_CHOICES: usize = 16;

/// Why an engine could not be built from its configuration.
#[derive(Debug, thiserror::Error)]
pub enum EngineBuildError {
    #[error("invalid engine configuration: {0}")]
    Config(&'static str),
    #[error("invalid cache configuration: {0}")]
    Cache(#[from] cache::ConfigError),
    #[error("K/V memory: {0}")]
    Kv(#[from] model::kv::KvError),
    #[error("tiers: {0}")]
    Tiers(#[from] tier::TierError),
    /// A tier's `codec:` is not a KV codec this model's blocks can be stored in.
    #[error("tier {tier} codec: {reason}")]
    TierCodec { tier: usize, reason: String },
}

/// Why a request was refused at submission: the request's fault, never the engine's.
#[derive(Debug, Clone, thiserror::Error, PartialEq)]
pub enum RequestError {
    #[error("the prompt is empty")]
    EmptyPrompt,
    #[error("prompt of {prompt_tokens} tokens plus max_tokens {max_tokens} exceeds the context length {context_length}")]
    ContextTooLong {
        prompt_tokens: usize,
        max_tokens: usize,
        context_length: usize,
    },
    #[error("request needs {needed_blocks} KV blocks but the pool has only {total_blocks}")]
    NeverFits {
        needed_blocks: usize,
        total_blocks: usize,
    },
    #[error("token id {0} is outside the vocabulary")]
    BadToken(u32),
    #[error("invalid sampling parameters: {0}")]
    Sampling(#[from] SamplingError),
    #[error("n must be between 1 and {MAX_CHOICES}, got {0}")]
    Choices(usize),
}

impl RequestError {
    /// The request field at fault (OpenAI's `param`).
    pub fn param(&self) -> &'static str {
        match self {
            RequestError::EmptyPrompt | RequestError::BadToken(_) => "prompt",
            RequestError::ContextTooLong { .. } | RequestError::NeverFits { .. } => "max_tokens",
            RequestError::Sampling(SamplingError::Invalid { param, .. }) => param,
            RequestError::Choices(_) => "n",
        }
    }

    /// The request can never be served at this server's size (no retry helps).
    pub fn exceeds_capacity(&self) -> bool {
        matches!(
            self,
            RequestError::ContextTooLong { .. } | RequestError::NeverFits { .. }
        )
    }
}

/// What the engine reports for a request (as its only event when submission fails) or for a
/// call to the engine.
#[derive(Debug, Clone, thiserror::Error, PartialEq)]
pub enum EngineError {
    #[error(transparent)]
    Request(#[from] RequestError),
    /// The request's output constraint (grammar, schema, tool-call format) cannot continue:
    /// it allows no next token, or failed. The request ends with this rather than with text
    /// the constraint did not allow.
    #[error(
        "the output constraint cannot continue after {generated_tokens} generated tokens: {reason}"
    )]
    ConstraintDeadEnd {
        generated_tokens: usize,
        reason: model::ConstraintError,
    },
    #[error("the engine has shut down")]
    ShutDown,
    /// A bug: the engine's own bookkeeping disagreed with itself (the text is for logs).
    #[error("internal engine error: {0}")]
    Internal(String),
}

/// An engine bug found while handling a request (its text is for logs).
pub(crate) fn internal(e: impl std::fmt::Display) -> EngineError {
    EngineError::Internal(e.to_string())
}
