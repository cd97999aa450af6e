//! Text to token ids and back, without the weights: the tokenizer (`tokenizer`), chat templates
//! (`chat`, `chat_prompt`), the [`Frontend`] hand-off a server holds, and what a request asks of
//! sampling (`sampling`: [`SamplingParams`] and the structured-output interface).
//!
//! This crate reads a GGUF file's metadata (vocabulary, merges, template) and nothing else of
//! it; it never loads tensors, never runs the model and never samples.

pub mod chat;
pub mod chat_prompt;
mod handoff;
pub mod sampling;
pub mod tokenizer;

pub use handoff::Frontend;
pub use sampling::{
    ConstraintError, ConstraintFactory, ConstraintSpec, SamplingError, SamplingParams,
    TokenConstraint,
};
