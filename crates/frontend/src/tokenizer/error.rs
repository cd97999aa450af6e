//! Errors of the tokenizer module. Owns only the error type; never logs or recovers.

/// Everything that can go wrong while building a tokenizer or converting text and ids.
#[derive(Debug, thiserror::Error)]
pub enum TokenizerError {
    /// A required GGUF metadata key is absent or has an unexpected type.
    #[error("GGUF metadata key `{0}` is missing or has the wrong type")]
    MissingKey(&'static str),
    /// `tokenizer.ggml.model` names a tokenizer family this crate does not implement.
    #[error("unsupported tokenizer model `{0}` (supported: gpt2, llama)")]
    UnsupportedModel(String),
    /// `tokenizer.ggml.pre` names a pre-tokenizer this crate does not implement.
    #[error("unsupported pre-tokenizer `{0}`")]
    UnsupportedPreTokenizer(String),
    /// The vocabulary arrays are inconsistent (lengths, ids out of range, duplicates...).
    #[error("invalid vocabulary: {0}")]
    InvalidVocab(String),
    /// A token id outside the vocabulary was passed to a decoding function.
    #[error("token id {id} is out of range (vocabulary size {vocab_size})")]
    InvalidTokenId { id: u32, vocab_size: usize },
    /// SentencePiece byte fallback needed `<0xNN>` but the vocabulary has neither it nor `<unk>`.
    #[error("no token covers byte 0x{0:02X} and the vocabulary has no unknown token")]
    NoByteToken(u8),
}
