//! Errors the engine reports for a request or at construction.

#[derive(Debug, Clone, thiserror::Error, PartialEq)]
pub enum EngineError {
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
    Sampling(String),
    #[error("invalid engine configuration: {0}")]
    Config(String),
    #[error("the engine has shut down")]
    ShutDown,
    #[error("internal engine error: {0}")]
    Internal(String),
}
