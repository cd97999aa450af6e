//! Byte-level access to encoded rows: little-endian element reads, the split of an integer row
//! into its parameter header and codes, and 4-bit nibble access.
//!
//! Owns the row layouts documented on [`crate::KvCodecKind`]; it never rounds or quantises.

use crate::error::QuantError;
use crate::kind::{KvCodecKind, FP8_SCALE_BYTES, INT_PARAM_BYTES_PER_GROUP};
use half::f16;

/// Checks that `kind` accepts `head_dim` and that an encoded row is `row_len` bytes.
pub(crate) fn check_row(
    kind: KvCodecKind,
    head_dim: usize,
    row_len: usize,
) -> Result<(), QuantError> {
    kind.validate(head_dim)?;
    if kind.is_block() {
        return Err(QuantError::BlockCodec(
            kind.id(),
            "rows are encoded, decoded and scored a group at a time (quant::channel)",
        ));
    }
    let expected = kind.bytes_per_row(head_dim);
    if row_len != expected {
        return Err(QuantError::LengthMismatch {
            what: "encoded row bytes",
            expected,
            got: row_len,
        });
    }
    Ok(())
}

/// Like [`check_row`] for the hot-path kernels, where a wrong shape is a caller bug.
#[track_caller]
pub(crate) fn assert_row(kind: KvCodecKind, head_dim: usize, row_len: usize) {
    if let Err(e) = check_row(kind, head_dim, row_len) {
        panic!("quant kernel called with an invalid row ({kind}, head_dim {head_dim}): {e}");
    }
}

#[inline(always)]
pub(crate) fn f32_at(bytes: &[u8], i: usize) -> f32 {
    let b = &bytes[4 * i..4 * i + 4];
    f32::from_le_bytes([b[0], b[1], b[2], b[3]])
}

#[inline(always)]
pub(crate) fn u16_at(bytes: &[u8], i: usize) -> u16 {
    u16::from_le_bytes([bytes[2 * i], bytes[2 * i + 1]])
}

/// Element `i` of a packed 4-bit code array (even elements in low nibbles).
#[inline(always)]
pub(crate) fn u4_at(codes: &[u8], i: usize) -> u8 {
    (codes[i / 2] >> (4 * (i % 2))) & 0x0F
}

/// An fp8 row split into its scale and codes.
pub(crate) fn split_fp8(row: &[u8]) -> (f32, &[u8]) {
    let (scale, codes) = row.split_at(FP8_SCALE_BYTES);
    (f32_at(scale, 0), codes)
}

/// An integer row split into its `(scale, offset)` header and its codes.
pub(crate) fn split_int(row: &[u8], head_dim: usize, group: usize) -> (&[u8], &[u8]) {
    row.split_at(INT_PARAM_BYTES_PER_GROUP * (head_dim / group))
}

/// `(scale, offset)` of group `g`, widened to f32.
#[inline(always)]
pub(crate) fn group_params(params: &[u8], g: usize) -> (f32, f32) {
    (
        f16::from_bits(u16_at(params, 2 * g)).to_f32(),
        f16::from_bits(u16_at(params, 2 * g + 1)).to_f32(),
    )
}
