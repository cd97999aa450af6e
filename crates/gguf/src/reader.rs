//! Parsing and validation of a GGUF header (v2/v3, little-endian).
//!
//! Owns the layout walk: magic, version, counts, every metadata value (nested arrays included),
//! tensor descriptors, alignment, and the checks that every tensor lies aligned and inside the
//! file. It never holds the file (see `file.rs`) and never decodes tensor data. Every size read
//! from the file is checked against the bytes that remain before anything is allocated for it.

use std::collections::HashSet;

use super::cursor::Cursor;
use super::error::GgufError;
use super::metadata::{value_type as vt, MetaValue, Metadata};
use super::tensor::{checked_num_bytes, TensorInfo, MAX_DIMS};
use super::types::GgmlType;

/// `GGUF` as the first four bytes.
pub const GGUF_MAGIC: [u8; 4] = *b"GGUF";
/// Alignment of the data section when `general.alignment` is absent.
pub const DEFAULT_ALIGNMENT: u64 = 32;
/// Deepest array nesting accepted (real files use 1; this bounds recursion on hostile input).
pub const MAX_ARRAY_DEPTH: usize = 8;

/// Smallest encodings, used to bound counts before allocating.
const MIN_KV_BYTES: usize = 8 + 4 + 1; // empty key, type id, a one-byte value
const MIN_TENSOR_INFO_BYTES: usize = 8 + 4 + 4 + 8; // empty name, n_dims = 0, type, offset

/// The validated header of a GGUF file.
#[derive(Debug)]
pub struct Header {
    pub version: u32,
    pub metadata: Metadata,
    pub tensors: Vec<TensorInfo>,
    pub alignment: u64,
    /// Byte offset of the data section from the start of the file.
    pub data_offset: usize,
}

/// Parses and validates the header of the GGUF file `bytes`.
pub fn parse_header(bytes: &[u8]) -> Result<Header, GgufError> {
    let mut c = Cursor::new(bytes);
    let magic = c.take(4, "magic")?;
    if magic != GGUF_MAGIC {
        let mut found = [0u8; 4];
        found.copy_from_slice(magic);
        return Err(GgufError::BadMagic { found });
    }
    let version = c.u32("version")?;
    if version != 2 && version != 3 {
        return Err(GgufError::UnsupportedVersion(version));
    }
    let tensor_count = c.u64("tensor count")?;
    let kv_count = c.u64("metadata key/value count")?;
    let kv_count = c.check_count(kv_count, MIN_KV_BYTES, "metadata key/value count")?;

    let mut metadata = Metadata::new();
    for _ in 0..kv_count {
        let key = c.string("metadata key")?;
        let type_id = c.u32("metadata value type")?;
        let value = read_value(&mut c, type_id, 0)?;
        if !metadata.insert(key.clone(), value) {
            return Err(GgufError::DuplicateKey(key));
        }
    }
    let alignment = alignment_of(&metadata)?;

    let tensor_count = c.check_count(tensor_count, MIN_TENSOR_INFO_BYTES, "tensor count")?;
    let mut tensors = Vec::with_capacity(tensor_count);
    let mut names = HashSet::with_capacity(tensor_count);
    for _ in 0..tensor_count {
        let info = read_tensor_info(&mut c, alignment)?;
        if !names.insert(info.name.clone()) {
            return Err(GgufError::DuplicateTensor(info.name));
        }
        tensors.push(info);
    }

    // The data section starts at the next multiple of the alignment (no padding needed when the
    // file has no tensors and ends right after the header).
    let header_end = c.pos() as u64;
    let data_offset = header_end.div_ceil(alignment) * alignment;
    let file_len = bytes.len() as u64;
    if !tensors.is_empty() && data_offset > file_len {
        return Err(GgufError::Truncated {
            what: "padding before the tensor data section",
            offset: header_end,
        });
    }
    for t in &tensors {
        let end = data_offset
            .checked_add(t.offset)
            .and_then(|s| s.checked_add(t.num_bytes as u64));
        if end.is_none_or(|e| e > file_len) {
            return Err(GgufError::TensorOutOfBounds {
                name: t.name.clone(),
            });
        }
    }
    Ok(Header {
        version,
        metadata,
        tensors,
        alignment,
        data_offset: data_offset.min(file_len) as usize,
    })
}

/// `general.alignment`: any integer that is a non-zero power of two fitting in `u32`.
fn alignment_of(metadata: &Metadata) -> Result<u64, GgufError> {
    let Some(value) = metadata.get("general.alignment") else {
        return Ok(DEFAULT_ALIGNMENT);
    };
    match value.as_i128() {
        Some(a) if a > 0 && a <= u32::MAX as i128 && (a as u64).is_power_of_two() => Ok(a as u64),
        _ => Err(GgufError::BadAlignment(format!(
            "{value:?} (must be a power-of-two integer)"
        ))),
    }
}

/// Smallest encoding of one array element of `type_id`, `None` for unknown types.
fn min_value_bytes(type_id: u32) -> Option<usize> {
    Some(match type_id {
        vt::U8 | vt::I8 | vt::BOOL => 1,
        vt::U16 | vt::I16 => 2,
        vt::U32 | vt::I32 | vt::F32 => 4,
        vt::U64 | vt::I64 | vt::F64 | vt::STRING => 8,
        vt::ARRAY => 4 + 8,
        _ => return None,
    })
}

fn read_value(c: &mut Cursor<'_>, type_id: u32, depth: usize) -> Result<MetaValue, GgufError> {
    const W: &str = "metadata value";
    Ok(match type_id {
        vt::U8 => MetaValue::U8(c.u8(W)?),
        vt::I8 => MetaValue::I8(c.u8(W)? as i8),
        vt::U16 => MetaValue::U16(c.u16(W)?),
        vt::I16 => MetaValue::I16(c.u16(W)? as i16),
        vt::U32 => MetaValue::U32(c.u32(W)?),
        vt::I32 => MetaValue::I32(c.u32(W)? as i32),
        vt::U64 => MetaValue::U64(c.u64(W)?),
        vt::I64 => MetaValue::I64(c.u64(W)? as i64),
        vt::F32 => MetaValue::F32(c.f32(W)?),
        vt::F64 => MetaValue::F64(c.f64(W)?),
        // ggml writes 0 or 1; any non-zero byte reads as true.
        vt::BOOL => MetaValue::Bool(c.u8(W)? != 0),
        vt::STRING => MetaValue::String(c.string("metadata string")?),
        vt::ARRAY => {
            if depth >= MAX_ARRAY_DEPTH {
                return Err(GgufError::NestingTooDeep {
                    max_depth: MAX_ARRAY_DEPTH,
                    offset: c.pos() as u64,
                });
            }
            let elem_offset = c.pos() as u64;
            let elem_type = c.u32("array element type")?;
            let min_bytes = min_value_bytes(elem_type).ok_or(GgufError::UnknownValueType {
                type_id: elem_type,
                offset: elem_offset,
            })?;
            let len = c.u64("array length")?;
            let len = c.check_count(len, min_bytes, "array length")?;
            let mut items = Vec::with_capacity(len);
            for _ in 0..len {
                items.push(read_value(c, elem_type, depth + 1)?);
            }
            MetaValue::Array(items)
        }
        _ => {
            return Err(GgufError::UnknownValueType {
                type_id,
                offset: c.pos().saturating_sub(4) as u64,
            })
        }
    })
}

fn read_tensor_info(c: &mut Cursor<'_>, alignment: u64) -> Result<TensorInfo, GgufError> {
    let name = c.string("tensor name")?;
    let n_dims = c.u32("tensor dimension count")?;
    if n_dims as usize > MAX_DIMS {
        return Err(GgufError::BadDims {
            name,
            reason: format!("{n_dims} dimensions, at most {MAX_DIMS}"),
        });
    }
    let mut dims = Vec::with_capacity(n_dims as usize);
    for _ in 0..n_dims {
        dims.push(c.u64("tensor dimension")?);
    }
    let type_id = c.u32("tensor type")?;
    let ty = GgmlType::from_id(type_id).ok_or_else(|| GgufError::UnsupportedTensorType {
        name: name.clone(),
        type_id,
    })?;
    let offset = c.u64("tensor offset")?;
    if offset % alignment != 0 {
        return Err(GgufError::Misaligned {
            name,
            offset,
            alignment,
        });
    }
    let num_bytes = checked_num_bytes(&name, &dims, ty)?;
    Ok(TensorInfo {
        name,
        dims,
        ty,
        offset,
        num_bytes,
    })
}
