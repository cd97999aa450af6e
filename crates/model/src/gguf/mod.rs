//! GGUF container format: see reader.rs (placeholder until written).
pub mod types;
pub use types::GgmlType;
