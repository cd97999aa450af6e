//! Chat templates (placeholder until written).
