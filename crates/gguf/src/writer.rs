//! A GGUF v3 (or v2) writer for small test models.
//!
//! Owns [`GgufWriter`], a builder that collects metadata and tensors (quantizing `f32` data with
//! the reference quantizers) and serialises them in the layout the reader expects: header,
//! metadata, tensor descriptors, padding, aligned tensor data. Used by tests across the
//! workspace to make tiny random-weight models; it never reads files and is not tuned for speed.

use std::path::Path;

use super::error::GgufError;
use super::metadata::{value_type as vt, MetaValue, Metadata};
use super::quantize::quantize_row;
use super::reader::{DEFAULT_ALIGNMENT, GGUF_MAGIC};
use super::tensor::checked_num_bytes;
use super::types::GgmlType;

struct PendingTensor {
    name: String,
    dims: Vec<u64>,
    ty: GgmlType,
    data: Vec<u8>,
}

/// Builds a GGUF file in memory. Errors from builder calls are kept and returned by
/// [`GgufWriter::to_bytes`] / [`GgufWriter::write_to`], so calls can be chained.
#[derive(Default)]
pub struct GgufWriter {
    version: u32,
    metadata: Metadata,
    tensors: Vec<PendingTensor>,
    error: Option<GgufError>,
}

impl GgufWriter {
    /// An empty GGUF v3 file.
    pub fn new() -> Self {
        Self {
            version: 3,
            ..Self::default()
        }
    }

    /// Writes this GGUF version instead (2 or 3; both share the little-endian layout).
    pub fn version(mut self, version: u32) -> Self {
        self.version = version;
        self
    }

    /// Adds a metadata key (builder form of [`GgufWriter::add_metadata`]).
    pub fn metadata(mut self, key: impl Into<String>, value: MetaValue) -> Self {
        self.add_metadata(key, value);
        self
    }

    /// Adds an `f32` tensor stored as `ty` (builder form of [`GgufWriter::add_tensor_f32`]).
    pub fn tensor_f32(
        mut self,
        name: impl Into<String>,
        dims: &[u64],
        data: &[f32],
        ty: GgmlType,
    ) -> Self {
        if let Err(e) = self.add_tensor_f32(name, dims, data, ty) {
            self.error.get_or_insert(e);
        }
        self
    }

    /// Adds a tensor from already-encoded bytes (builder form of [`GgufWriter::add_tensor_raw`]).
    pub fn tensor_raw(
        mut self,
        name: impl Into<String>,
        dims: &[u64],
        ty: GgmlType,
        bytes: Vec<u8>,
    ) -> Self {
        if let Err(e) = self.add_tensor_raw(name, dims, ty, bytes) {
            self.error.get_or_insert(e);
        }
        self
    }

    /// Adds a metadata key; a duplicate key is reported when writing.
    pub fn add_metadata(&mut self, key: impl Into<String>, value: MetaValue) {
        let key = key.into();
        if !self.metadata.insert(key.clone(), value) {
            self.error.get_or_insert(GgufError::DuplicateKey(key));
        }
    }

    /// Adds a tensor with dims in GGUF order (`dims[0]` = row length) from row-major `f32`
    /// data, quantized row by row to `ty` with the reference quantizers.
    pub fn add_tensor_f32(
        &mut self,
        name: impl Into<String>,
        dims: &[u64],
        data: &[f32],
        ty: GgmlType,
    ) -> Result<(), GgufError> {
        let name = name.into();
        let num_bytes = checked_num_bytes(&name, dims, ty)?;
        let num_elems: u64 = dims.iter().product();
        if num_elems != data.len() as u64 {
            return Err(GgufError::BadDims {
                name,
                reason: format!("dims {dims:?} need {num_elems} values, got {}", data.len()),
            });
        }
        let mut bytes = Vec::with_capacity(num_bytes);
        let row_len = dims.first().map_or(1, |&d| d as usize).max(1);
        for row in data.chunks(row_len) {
            quantize_row(ty, row, &mut bytes)?;
        }
        self.add_tensor_raw(name, dims, ty, bytes)
    }

    /// Adds a tensor whose data is already encoded as `ty`.
    pub fn add_tensor_raw(
        &mut self,
        name: impl Into<String>,
        dims: &[u64],
        ty: GgmlType,
        bytes: Vec<u8>,
    ) -> Result<(), GgufError> {
        let name = name.into();
        let num_bytes = checked_num_bytes(&name, dims, ty)?;
        if bytes.len() != num_bytes {
            return Err(GgufError::BadDims {
                name,
                reason: format!(
                    "{} {dims:?} needs {num_bytes} bytes, got {}",
                    ty.name(),
                    bytes.len()
                ),
            });
        }
        if self.tensors.iter().any(|t| t.name == name) {
            return Err(GgufError::DuplicateTensor(name));
        }
        self.tensors.push(PendingTensor {
            name,
            dims: dims.to_vec(),
            ty,
            data: bytes,
        });
        Ok(())
    }

    /// Serialises the file.
    pub fn to_bytes(&self) -> Result<Vec<u8>, GgufError> {
        if let Some(e) = &self.error {
            return Err(GgufError::Unwritable(e.to_string()));
        }
        if self.version != 2 && self.version != 3 {
            return Err(GgufError::UnsupportedVersion(self.version));
        }
        let alignment = match self.metadata.get("general.alignment") {
            None => DEFAULT_ALIGNMENT,
            Some(MetaValue::U32(a)) if a.is_power_of_two() => *a as u64,
            Some(v) => {
                return Err(GgufError::BadAlignment(format!(
                    "{v:?} (write it as a power-of-two U32)"
                )))
            }
        };
        let mut out = Vec::new();
        out.extend_from_slice(&GGUF_MAGIC);
        out.extend_from_slice(&self.version.to_le_bytes());
        out.extend_from_slice(&(self.tensors.len() as u64).to_le_bytes());
        out.extend_from_slice(&(self.metadata.len() as u64).to_le_bytes());
        for (key, value) in self.metadata.iter() {
            write_string(&mut out, key);
            out.extend_from_slice(&value.type_id().to_le_bytes());
            write_value(&mut out, key, value)?;
        }
        let mut offset = 0u64;
        let mut offsets = Vec::with_capacity(self.tensors.len());
        for t in &self.tensors {
            write_string(&mut out, &t.name);
            out.extend_from_slice(&(t.dims.len() as u32).to_le_bytes());
            for d in &t.dims {
                out.extend_from_slice(&d.to_le_bytes());
            }
            out.extend_from_slice(&t.ty.id().to_le_bytes());
            out.extend_from_slice(&offset.to_le_bytes());
            offsets.push(offset);
            offset = (offset + t.data.len() as u64).div_ceil(alignment) * alignment;
        }
        pad_to(&mut out, alignment);
        let data_start = out.len();
        for (t, off) in self.tensors.iter().zip(offsets) {
            out.resize(data_start + off as usize, 0);
            out.extend_from_slice(&t.data);
        }
        pad_to(&mut out, alignment);
        Ok(out)
    }

    /// Serialises the file and writes it to `path`.
    pub fn write_to(&self, path: impl AsRef<Path>) -> Result<(), GgufError> {
        let path = path.as_ref();
        let bytes = self.to_bytes()?;
        std::fs::write(path, bytes).map_err(|source| GgufError::Io {
            path: path.to_path_buf(),
            source,
        })
    }
}

fn pad_to(out: &mut Vec<u8>, alignment: u64) {
    let len = (out.len() as u64).div_ceil(alignment) * alignment;
    out.resize(len as usize, 0);
}

fn write_string(out: &mut Vec<u8>, s: &str) {
    out.extend_from_slice(&(s.len() as u64).to_le_bytes());
    out.extend_from_slice(s.as_bytes());
}

/// Writes the payload of `value` (its type id is written by the caller).
fn write_value(out: &mut Vec<u8>, key: &str, value: &MetaValue) -> Result<(), GgufError> {
    match value {
        MetaValue::U8(v) => out.push(*v),
        MetaValue::I8(v) => out.push(*v as u8),
        MetaValue::U16(v) => out.extend_from_slice(&v.to_le_bytes()),
        MetaValue::I16(v) => out.extend_from_slice(&v.to_le_bytes()),
        MetaValue::U32(v) => out.extend_from_slice(&v.to_le_bytes()),
        MetaValue::I32(v) => out.extend_from_slice(&v.to_le_bytes()),
        MetaValue::U64(v) => out.extend_from_slice(&v.to_le_bytes()),
        MetaValue::I64(v) => out.extend_from_slice(&v.to_le_bytes()),
        MetaValue::F32(v) => out.extend_from_slice(&v.to_le_bytes()),
        MetaValue::F64(v) => out.extend_from_slice(&v.to_le_bytes()),
        MetaValue::Bool(v) => out.push(u8::from(*v)),
        MetaValue::String(s) => write_string(out, s),
        MetaValue::Array(items) => {
            // An empty array has no element to take the type from; U8 is as good as any.
            let elem_type = items.first().map_or(vt::U8, MetaValue::type_id);
            if items.iter().any(|v| v.type_id() != elem_type) {
                return Err(GgufError::Unwritable(format!(
                    "metadata array `{key}` mixes element types"
                )));
            }
            out.extend_from_slice(&elem_type.to_le_bytes());
            out.extend_from_slice(&(items.len() as u64).to_le_bytes());
            for v in items {
                write_value(out, key, v)?;
            }
        }
    }
    Ok(())
}
