//! The GGUF container format: reading, validating, dequantizing and (for tests) writing.
//!
//! Owns everything about `.gguf` files: the header and metadata parser (`reader.rs`), the opened
//! file with zero-copy tensor access (`file.rs`), tensor descriptors (`tensor.rs`), reference
//! (de)quantization of the supported ggml types (`dequant.rs`, `quantize.rs`) and a writer for
//! tiny test models (`writer.rs`). It never interprets what the tensors mean (that is the model
//! loader's job) and never runs inference kernels.

mod cursor;
pub mod dequant;
mod error;
mod file;
mod metadata;
pub mod quantize;
mod quantize_k;
mod reader;
mod tensor;
pub mod types;
pub mod writer;

pub use dequant::dequantize_row;
pub use error::GgufError;
pub use file::GgufFile;
pub use metadata::{MetaValue, Metadata};
pub use quantize::quantize_row;
pub use reader::{DEFAULT_ALIGNMENT, MAX_ARRAY_DEPTH};
pub use tensor::{TensorInfo, MAX_DIMS};
pub use types::GgmlType;
pub use writer::GgufWriter;
