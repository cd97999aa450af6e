//! The typed errors of the `quant` crate. Owns only the error enum; it never formats rows.

/// Everything that can be wrong with a codec description or a row's shape.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum QuantError {
    /// `KvCodecKind::parse` got a name it does not know.
    #[error(
        "unknown KV codec {0:?} (expected f32, f16, bf16, fp8, int8, int4, or the \
         Hadamard-rotated int8h, int4h, optionally with a group suffix such as int8-g32, or the \
         per-channel K codec int4c / int4c-t16)"
    )]
    UnknownCodec(String),
    /// A row must hold at least one value.
    #[error("head_dim must be positive")]
    ZeroHeadDim,
    /// Integer codecs need a group that is a positive multiple of 8 dividing `head_dim`.
    #[error(
        "group size {group} must be a positive multiple of 8 that divides head_dim {head_dim}"
    )]
    BadGroup { group: usize, head_dim: usize },
    /// The Hadamard-rotated codecs (`int8h`, `int4h`) rotate a row with the fast Walsh–Hadamard
    /// transform, which needs a power-of-two length.
    #[error(
        "Hadamard-rotated KV codecs (int8h, int4h) need a power-of-two head_dim, got {head_dim}"
    )]
    RotationNeedsPowerOfTwo { head_dim: usize },
    /// `int4c` needs a token group whose per-channel parameters split into whole bytes per row.
    #[error(
        "per-channel int4 K (int4c) needs an even head_dim and a token group dividing 4·head_dim; \
         got {tokens} tokens at head_dim {head_dim}"
    )]
    BadChannelTokens { tokens: usize, head_dim: usize },
    /// A block codec (`int4c`) passed to a per-row function, or chosen for V.
    #[error("{0} is a block codec (K only, encoded a whole block at a time): {1}")]
    BlockCodec(String, &'static str),
    /// A slice passed to a row function has the wrong length.
    #[error("{what}: expected {expected} elements, got {got}")]
    LengthMismatch {
        what: &'static str,
        expected: usize,
        got: usize,
    },
}
