//! An opened GGUF file: its bytes (memory-mapped or owned) plus the validated header.
//!
//! Owns [`GgufFile`] and zero-copy access to tensor data. All validation happens once, in
//! [`GgufFile::open`] / [`GgufFile::from_bytes`]; accessors never fail. It never decodes tensor
//! data (see `dequant.rs`) and never writes files.

use std::path::Path;

use memmap2::Mmap;

use super::error::GgufError;
use super::metadata::Metadata;
use super::reader::{parse_header, Header};
use super::tensor::TensorInfo;

/// Where the file's bytes live.
enum Storage {
    Mapped(Mmap),
    Owned(Vec<u8>),
}

impl Storage {
    fn bytes(&self) -> &[u8] {
        match self {
            Self::Mapped(m) => m,
            Self::Owned(v) => v,
        }
    }
}

/// A validated GGUF file. Every tensor's data is known to lie, aligned, inside the file.
pub struct GgufFile {
    storage: Storage,
    header: Header,
}

impl std::fmt::Debug for GgufFile {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GgufFile")
            .field("version", &self.header.version)
            .field("file_bytes", &self.storage.bytes().len())
            .field("num_metadata_keys", &self.header.metadata.len())
            .field("num_tensors", &self.header.tensors.len())
            .finish()
    }
}

impl GgufFile {
    /// Memory-maps and validates the file at `path`.
    pub fn open(path: &Path) -> Result<GgufFile, GgufError> {
        let io = |source| GgufError::Io {
            path: path.to_path_buf(),
            source,
        };
        let file = std::fs::File::open(path).map_err(io)?;
        // SAFETY: the map is read-only and private to this process. Memory safety relies on no
        // one truncating or rewriting the file while it is mapped (model files are treated as
        // immutable inputs; the same contract llama.cpp relies on). Exercised by the
        // `gguf_writer` round-trip test (written to a temp file, then opened) and by
        // `gguf_real_model`.
        let map = unsafe { Mmap::map(&file) }.map_err(io)?;
        Self::from_storage(Storage::Mapped(map))
    }

    /// Validates a file held in memory.
    pub fn from_bytes(bytes: Vec<u8>) -> Result<GgufFile, GgufError> {
        Self::from_storage(Storage::Owned(bytes))
    }

    fn from_storage(storage: Storage) -> Result<GgufFile, GgufError> {
        let header = parse_header(storage.bytes())?;
        Ok(GgufFile { storage, header })
    }

    /// GGUF version (2 or 3).
    pub fn version(&self) -> u32 {
        self.header.version
    }

    /// The key/value metadata in file order.
    pub fn metadata(&self) -> &Metadata {
        &self.header.metadata
    }

    /// Tensor descriptors in file order.
    pub fn tensors(&self) -> &[TensorInfo] {
        &self.header.tensors
    }

    /// The descriptor of the tensor called `name`.
    pub fn tensor(&self, name: &str) -> Option<&TensorInfo> {
        self.header.tensors.iter().find(|t| t.name == name)
    }

    /// Alignment of the data section and of every tensor offset, in bytes.
    pub fn alignment(&self) -> u64 {
        self.header.alignment
    }

    /// Byte offset of the data section from the start of the file.
    pub fn data_offset(&self) -> usize {
        self.header.data_offset
    }

    /// The `info.num_bytes` bytes of a tensor's data.
    ///
    /// # Panics
    /// If `info` does not describe a tensor inside this file (it must come from
    /// [`GgufFile::tensors`] or [`GgufFile::tensor`] of this file, whose bounds were validated).
    pub fn tensor_data(&self, info: &TensorInfo) -> &[u8] {
        let start = (info.offset as usize).checked_add(self.header.data_offset);
        let range = start.and_then(|s| Some(s..s.checked_add(info.num_bytes)?));
        range.and_then(|r| self.storage.bytes().get(r)).expect(
            "TensorInfo from another GGUF file: its bounds were validated only for that file",
        )
    }

    /// The whole file, e.g. for content fingerprints.
    pub fn file_bytes(&self) -> &[u8] {
        self.storage.bytes()
    }
}
