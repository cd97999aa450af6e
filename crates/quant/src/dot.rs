//! `q · dequant(row)` computed straight from encoded bytes (the attention score kernel).
//!
//! Owns the score arithmetic per codec. Float codecs widen 8 values at a time inside the dot
//! product. fp8 computes `scale · Σ q·e4m3(code)`. Integer codecs never materialise x̂: per group
//! `q·x̂ = scale·(q·codes) + offset·Σq`, accumulated over groups in order with fused
//! multiply-adds; [`PreparedQuery`] computes the `Σq` per group once per query instead of once
//! per row. Rotated codecs (`int8h`, `int4h`) score `(Hq)·dequant(row)`: [`PreparedQuery`]
//! rotates the query once, [`dot_row`] rotates it on every call (into a stack buffer). Every
//! result depends only on its inputs (fixed order; the portable and AVX2 paths are
//! bit-identical). It never writes rows.

use crate::dispatch::pick;
use crate::error::QuantError;
use crate::hadamard;
use crate::isa::Isa;
use crate::kind::KvCodecKind;
use crate::layout::{assert_row, split_fp8, split_int};

/// `q · dequant(bytes)` for one encoded row; `q` is `[head_dim]`.
///
/// # Panics
/// If `kind` rejects `q.len()` or `bytes` is not `kind.bytes_per_row(q.len())` long: shapes are
/// fixed when the KV store is built (validate them there with [`KvCodecKind::validate`]), so a
/// mismatch here is a caller bug.
pub fn dot_row(kind: KvCodecKind, q: &[f32], bytes: &[u8]) -> f32 {
    dot_row_with(Isa::detect(), kind, q, bytes)
}

/// [`dot_row`] on an explicit instruction-set path (bit-identical results on every path).
#[track_caller]
pub fn dot_row_with(isa: Isa, kind: KvCodecKind, q: &[f32], bytes: &[u8]) -> f32 {
    assert_row(kind, q.len(), bytes.len());
    if kind.is_rotated() {
        return hadamard::with_scratch(q.len(), |rotated| {
            rotated.copy_from_slice(q);
            hadamard::fwht(rotated);
            dot_checked(isa, kind, rotated, None, bytes)
        });
    }
    dot_checked(isa, kind, q, None, bytes)
}

/// A query prepared for scoring many rows of one codec: keeps `q` (rotated, `Hq`, for the
/// rotated codecs) and, for integer codecs, the per-group sums `Σq` of the identity
/// `q·x̂ = scale·(q·codes) + offset·Σq`.
/// Reuse one per attention task with [`PreparedQuery::reset`] to avoid allocating.
#[derive(Debug, Clone)]
pub struct PreparedQuery {
    isa: Isa,
    kind: KvCodecKind,
    q: Vec<f32>,          // [head_dim] (Hq for rotated codecs)
    group_sums: Vec<f32>, // [head_dim / group] (empty for float codecs)
}

impl PreparedQuery {
    /// Prepares `q` (`[head_dim]`) for rows of `kind`, on the detected instruction set.
    pub fn new(kind: KvCodecKind, q: &[f32]) -> Result<PreparedQuery, QuantError> {
        PreparedQuery::new_with(Isa::detect(), kind, q)
    }

    /// [`PreparedQuery::new`] on an explicit instruction-set path.
    pub fn new_with(isa: Isa, kind: KvCodecKind, q: &[f32]) -> Result<PreparedQuery, QuantError> {
        let mut p = PreparedQuery {
            isa,
            kind,
            q: Vec::new(),
            group_sums: Vec::new(),
        };
        p.reset(kind, q)?;
        Ok(p)
    }

    /// Re-prepares for a new query (and possibly codec), reusing the buffers.
    pub fn reset(&mut self, kind: KvCodecKind, q: &[f32]) -> Result<(), QuantError> {
        kind.validate(q.len())?;
        self.kind = kind;
        self.q.clear();
        self.q.extend_from_slice(q);
        if kind.is_rotated() {
            hadamard::fwht(&mut self.q);
        }
        self.group_sums.clear();
        if let Some(group) = kind.group() {
            let isa = self.isa;
            self.group_sums
                .extend(self.q.chunks_exact(group).map(|qg| pick!(isa, sum(qg))));
        }
        Ok(())
    }

    pub fn kind(&self) -> KvCodecKind {
        self.kind
    }

    pub fn head_dim(&self) -> usize {
        self.q.len()
    }

    /// `q · dequant(bytes)`; bit-identical to [`dot_row`] with the same query.
    ///
    /// # Panics
    /// If `bytes` is not `kind.bytes_per_row(head_dim)` long (a caller bug, as in [`dot_row`]).
    #[track_caller]
    pub fn dot(&self, bytes: &[u8]) -> f32 {
        assert_row(self.kind, self.q.len(), bytes.len());
        dot_checked(self.isa, self.kind, &self.q, Some(&self.group_sums), bytes)
    }
}

/// The score of one row whose shape has been checked; `q` is already rotated for rotated codecs.
fn dot_checked(
    isa: Isa,
    kind: KvCodecKind,
    q: &[f32],
    group_sums: Option<&[f32]>,
    bytes: &[u8],
) -> f32 {
    match kind {
        KvCodecKind::F32 => pick!(isa, dot_f32(q, bytes)),
        KvCodecKind::F16 => pick!(isa, dot_f16(q, bytes)),
        KvCodecKind::Bf16 => pick!(isa, dot_bf16(q, bytes)),
        KvCodecKind::Fp8E4m3 => {
            let (scale, codes) = split_fp8(bytes);
            pick!(isa, dot_e4m3(q, codes)) * scale
        }
        KvCodecKind::Int4Channel { .. } => unreachable!("assert_row rejects block codecs"),
        KvCodecKind::Int8 { group }
        | KvCodecKind::Int4 { group }
        | KvCodecKind::Int8Hadamard { group }
        | KvCodecKind::Int4Hadamard { group } => {
            let four_bit = matches!(kind.storage(), KvCodecKind::Int4 { .. });
            let (params, codes) = split_int(bytes, q.len(), group);
            pick!(
                isa,
                dot_int_row(q, params, codes, group, four_bit, group_sums)
            )
        }
    }
}
