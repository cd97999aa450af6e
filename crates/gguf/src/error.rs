//! The one error type of the GGUF module.
//!
//! Owns [`GgufError`]: every way reading, validating, dequantizing, quantizing or writing a GGUF
//! file can fail, each with a message that names what was wrong and where. It never decides
//! policy (whether an error is fatal is the caller's business).

use std::path::PathBuf;

use super::types::GgmlType;

/// Everything that can go wrong with a GGUF file or its tensor data.
#[derive(thiserror::Error, Debug)]
pub enum GgufError {
    /// The file could not be opened, mapped or written.
    #[error("I/O error on {path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// The first four bytes are not `GGUF`.
    #[error("not a GGUF file: magic bytes {found:02x?}, expected \"GGUF\" (47 47 55 46)")]
    BadMagic { found: [u8; 4] },
    /// Only GGUF v2 and v3 are read (v1 used 32-bit counts and is obsolete).
    #[error("unsupported GGUF version {0} (only versions 2 and 3 are supported)")]
    UnsupportedVersion(u32),
    /// The file ends before a field that the header says is there.
    #[error("GGUF file truncated: {what} at byte offset {offset} runs past the end of the file")]
    Truncated { what: &'static str, offset: u64 },
    /// A tensor uses a ggml type agentkv cannot run.
    #[error("tensor `{name}` has unsupported ggml type id {type_id}")]
    UnsupportedTensorType { name: String, type_id: u32 },
    /// A metadata value has a type id outside the GGUF value types.
    #[error("metadata value at byte offset {offset} has unknown value type id {type_id}")]
    UnknownValueType { type_id: u32, offset: u64 },
    /// A count or length in the header cannot fit in the bytes that remain.
    #[error("absurd {what} {count}: more than the remaining bytes of the file can hold")]
    AbsurdCount { what: &'static str, count: u64 },
    /// Arrays nested deeper than any real file needs.
    #[error("metadata arrays nested more than {max_depth} levels deep at byte offset {offset}")]
    NestingTooDeep { max_depth: usize, offset: u64 },
    /// A string is not valid UTF-8.
    #[error("string at byte offset {offset} is not valid UTF-8")]
    InvalidUtf8 { offset: u64 },
    /// A tensor's data lies (partly) outside the file.
    #[error("tensor `{name}` data lies outside the file")]
    TensorOutOfBounds { name: String },
    /// A tensor's shape is invalid for its type or overflows.
    #[error("tensor `{name}` has invalid dimensions: {reason}")]
    BadDims { name: String, reason: String },
    /// A tensor's offset is not a multiple of the file's alignment.
    #[error("tensor `{name}` offset {offset} is not a multiple of the alignment {alignment}")]
    Misaligned {
        name: String,
        offset: u64,
        alignment: u64,
    },
    /// `general.alignment` is zero, not a power of two, or not an integer.
    #[error("invalid general.alignment: {0}")]
    BadAlignment(String),
    /// The same metadata key appears twice.
    #[error("duplicate metadata key `{0}`")]
    DuplicateKey(String),
    /// The same tensor name appears twice.
    #[error("duplicate tensor name `{0}`")]
    DuplicateTensor(String),
    /// Source and destination sizes of a (de)quantization do not agree.
    #[error("{ty:?} conversion size mismatch: {num_elems} elements need {expected_bytes} bytes, got {actual_bytes}")]
    SizeMismatch {
        ty: GgmlType,
        num_elems: usize,
        expected_bytes: usize,
        actual_bytes: usize,
    },
    /// A row length is not a whole number of blocks of its type.
    #[error("{num_elems} elements is not a whole number of {ty:?} blocks of {block_elems}")]
    PartialBlock {
        ty: GgmlType,
        num_elems: usize,
        block_elems: usize,
    },
    /// The writer was asked for something a GGUF file cannot hold.
    #[error("cannot write GGUF: {0}")]
    Unwritable(String),
}
