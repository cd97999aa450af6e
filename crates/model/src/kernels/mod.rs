//! CPU kernels (placeholder until written).
