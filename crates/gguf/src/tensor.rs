//! Tensor descriptors of a GGUF file.
//!
//! Owns [`TensorInfo`] (name, shape in GGUF order, type, offset, byte size) and the checked shape
//! arithmetic that turns dims and a type into a byte size. It never reads tensor data.

use super::error::GgufError;
use super::types::GgmlType;

/// Most dimensions a ggml tensor can have.
pub const MAX_DIMS: usize = 4;

/// One tensor's descriptor, validated against the file when it was opened.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TensorInfo {
    pub name: String,
    /// GGUF (ggml) order: `dims[0]` = `ne0` = row length, the fastest-varying dimension.
    pub dims: Vec<u64>,
    pub ty: GgmlType,
    /// Byte offset from the start of the data section (a multiple of the alignment).
    pub offset: u64,
    /// Exact size of the tensor data in bytes.
    pub num_bytes: usize,
}

impl TensorInfo {
    /// Total number of elements (product of dims; 1 for a zero-dimensional tensor).
    pub fn num_elems(&self) -> u64 {
        self.dims.iter().product()
    }

    /// Elements per row (`dims[0]`; 1 for a zero-dimensional tensor).
    pub fn row_len(&self) -> usize {
        self.dims.first().map_or(1, |&d| d as usize)
    }

    /// Number of rows (product of `dims[1..]`).
    pub fn num_rows(&self) -> usize {
        self.dims.iter().skip(1).product::<u64>() as usize
    }

    /// Bytes of one row.
    pub fn row_bytes(&self) -> usize {
        // Validated at construction: `row_len` is a whole number of blocks.
        self.row_len() / self.ty.block_elems() * self.ty.block_bytes()
    }
}

/// Checks `dims` for type `ty` and returns the tensor's size in bytes: at most [`MAX_DIMS`] dims,
/// none of them zero (an empty tensor has no use and would make row arithmetic divide by zero),
/// the row a whole number of blocks, and no overflow of elements (as `i64`, like ggml) or bytes.
pub fn checked_num_bytes(name: &str, dims: &[u64], ty: GgmlType) -> Result<usize, GgufError> {
    let bad = |reason: String| GgufError::BadDims {
        name: name.to_string(),
        reason,
    };
    if dims.len() > MAX_DIMS {
        return Err(bad(format!(
            "{} dimensions, at most {MAX_DIMS}",
            dims.len()
        )));
    }
    if dims.contains(&0) {
        return Err(bad(format!("zero-size dimension in {dims:?}")));
    }
    let mut num_elems: u64 = 1;
    for &d in dims {
        num_elems = num_elems
            .checked_mul(d)
            .filter(|&n| n <= i64::MAX as u64)
            .ok_or_else(|| bad(format!("element count of {dims:?} overflows")))?;
    }
    let row_len = dims.first().copied().unwrap_or(1);
    let row_len =
        usize::try_from(row_len).map_err(|_| bad(format!("row length {row_len} too large")))?;
    if row_len % ty.block_elems() != 0 {
        return Err(bad(format!(
            "row length {row_len} is not a multiple of the {} block size {}",
            ty.name(),
            ty.block_elems()
        )));
    }
    let num_blocks = num_elems / ty.block_elems() as u64;
    num_blocks
        .checked_mul(ty.block_bytes() as u64)
        .and_then(|b| usize::try_from(b).ok())
        .ok_or_else(|| bad(format!("byte size of {dims:?} overflows")))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_and_rows() {
        let n = checked_num_bytes("t", &[576, 1536], GgmlType::Q4_1).unwrap();
        assert_eq!(n, 1536 * 18 * 20);
        let t = TensorInfo {
            name: "t".into(),
            dims: vec![576, 1536],
            ty: GgmlType::Q4_1,
            offset: 0,
            num_bytes: n,
        };
        assert_eq!(
            (t.row_len(), t.num_rows(), t.num_elems()),
            (576, 1536, 576 * 1536)
        );
        assert_eq!(t.row_bytes(), 360);
    }

    #[test]
    fn rejects_bad_shapes() {
        assert!(checked_num_bytes("t", &[33], GgmlType::Q8_0).is_err());
        assert!(checked_num_bytes("t", &[1, 1, 1, 1, 1], GgmlType::F32).is_err());
        assert!(checked_num_bytes("t", &[u64::MAX, 2], GgmlType::F32).is_err());
        assert!(checked_num_bytes("t", &[1 << 62, 1], GgmlType::F32).is_err());
        assert_eq!(checked_num_bytes("t", &[], GgmlType::F32).unwrap(), 4);
        assert!(checked_num_bytes("t", &[4, 0], GgmlType::F32).is_err());
    }
}
