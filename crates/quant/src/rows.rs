//! [`EncodedRows`]: a validated view of consecutive encoded rows of one codec (one KV head's
//! positions inside a block), what a KV store hands to attention.
//!
//! Owns the shape check (done once per chunk, not per row); never decodes.

use crate::error::QuantError;
use crate::kind::KvCodecKind;

/// `[num_rows, row_bytes]` encoded rows of `kind` with `head_dim` values each. For a block
/// codec (`int4c`) the rows are codes only (`head_dim / 2` bytes each) and [`Self::params`] is
/// their group's per-channel header; it is empty for row codecs.
#[derive(Debug, Clone, Copy)]
pub struct EncodedRows<'a> {
    kind: KvCodecKind,
    head_dim: usize,
    row_bytes: usize,
    bytes: &'a [u8],
    params: &'a [u8],
}

impl<'a> EncodedRows<'a> {
    /// Checks that `kind` accepts `head_dim` and that `bytes` holds whole rows.
    #[inline]
    pub fn new(kind: KvCodecKind, head_dim: usize, bytes: &'a [u8]) -> Result<Self, QuantError> {
        kind.validate(head_dim)?;
        if kind.is_block() {
            return Err(QuantError::BlockCodec(
                kind.id(),
                "its rows need their group's header (EncodedRows::new_group)",
            ));
        }
        let row_bytes = kind.bytes_per_row(head_dim);
        if !bytes.len().is_multiple_of(row_bytes) {
            return Err(QuantError::LengthMismatch {
                what: "encoded rows bytes (a multiple of bytes_per_row)",
                expected: bytes.len() / row_bytes * row_bytes,
                got: bytes.len(),
            });
        }
        Ok(EncodedRows {
            kind,
            head_dim,
            row_bytes,
            bytes,
            params: &[],
        })
    }

    /// Rows of one group of a block codec: `params` is the group's per-channel header
    /// (`quant::channel::split_group`), `codes` whole rows of `head_dim / 2` bytes.
    #[inline]
    pub fn new_group(
        kind: KvCodecKind,
        head_dim: usize,
        params: &'a [u8],
        codes: &'a [u8],
    ) -> Result<Self, QuantError> {
        kind.validate(head_dim)?;
        let row_bytes = head_dim / 2;
        let header = crate::kind::INT_PARAM_BYTES_PER_GROUP * head_dim;
        if !kind.is_block() || params.len() != header || !codes.len().is_multiple_of(row_bytes) {
            return Err(QuantError::LengthMismatch {
                what: "block-codec group (header of 4·head_dim bytes, whole code rows)",
                expected: header,
                got: params.len(),
            });
        }
        Ok(EncodedRows {
            kind,
            head_dim,
            row_bytes,
            bytes: codes,
            params,
        })
    }

    /// The group's per-channel header (block codecs), or an empty slice.
    #[inline]
    pub fn params(&self) -> &'a [u8] {
        self.params
    }

    #[inline]
    pub fn kind(&self) -> KvCodecKind {
        self.kind
    }

    #[inline]
    pub fn head_dim(&self) -> usize {
        self.head_dim
    }

    #[inline]
    pub fn row_bytes(&self) -> usize {
        self.row_bytes
    }

    #[inline]
    pub fn num_rows(&self) -> usize {
        self.bytes.len() / self.row_bytes
    }

    /// The rows after the first `n` (none when `n >= num_rows`).
    #[inline]
    pub fn skip_rows(&self, n: usize) -> Self {
        let at = (n * self.row_bytes).min(self.bytes.len());
        EncodedRows {
            bytes: &self.bytes[at..],
            ..*self
        }
    }

    /// The first `n` rows only (all of them when `n >= num_rows`).
    #[inline]
    pub fn take_rows(&self, n: usize) -> Self {
        let at = (n * self.row_bytes).min(self.bytes.len());
        EncodedRows {
            bytes: &self.bytes[..at],
            ..*self
        }
    }

    /// All rows' bytes, `num_rows · row_bytes` long (row `i` at `i · row_bytes`).
    #[inline]
    pub fn bytes(&self) -> &'a [u8] {
        self.bytes
    }

    /// The encoded bytes of every row, in position order.
    #[inline]
    pub fn rows(&self) -> std::slice::ChunksExact<'a, u8> {
        self.bytes.chunks_exact(self.row_bytes)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rows_split_whole_rows_only() {
        let kind = KvCodecKind::Int4 { group: 32 };
        let bytes = vec![0u8; 3 * 40];
        let rows = EncodedRows::new(kind, 64, &bytes).unwrap();
        assert_eq!((rows.num_rows(), rows.row_bytes()), (3, 40));
        assert!(rows.rows().all(|r| r.len() == 40));
        assert!(EncodedRows::new(kind, 64, &bytes[..119]).is_err());
        assert!(EncodedRows::new(kind, 48, &bytes).is_err());
    }
}
