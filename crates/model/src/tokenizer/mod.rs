//! Tokenizer (placeholder until written).
