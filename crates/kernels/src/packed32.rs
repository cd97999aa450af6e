//! Row-interleaved ("packed") 32-element block weights and their matmul: Q4_0, Q4_1, Q5_0 and
//! Q8_0 matrices repacked once at load so that one 512-bit integer dot product computes a block's
//! partial sums for 16 weight rows at once.
//!
//! Layout of a [`Packed32`]: rows are taken in groups of [`GROUP_ROWS`] (the last group padded
//! with zero rows); group `g`, block `b` occupies `block_bytes` bytes at
//! `(g * num_blocks + b) * block_bytes`:
//! ```text
//! chunk c (64 bytes, c = 0..4 for Q4_* / Q5_0, 0..8 for Q8_0): bytes 4c..4c+4 of each row's
//!         quants (row r of the group at bytes 4r..4r+4 of the chunk)
//! h      (64 bytes, Q5_0 only): each row's 32 high bits, rearranged so that bit l of byte j
//!         of the row's 4 bytes is the high bit of element 4l + j
//! d      (16 x f16): each row's block scale
//! m      (16 x f16, Q4_1 only): each row's block minimum
//! ```
//! For Q4_* / Q5_0 chunk `c` holds elements `4c..4c+4` in its low nibbles and `16+4c..16+4c+4`
//! in its high nibbles (GGUF's nibble order); for Q8_0 the signed bytes of elements `4c..4c+4`.
//! A Q5_0 value is `nibble | high_bit << 4` minus 16, so lane `l`'s fifth bits are one shift and
//! mask of `h` away (Q4_K_M files store most matrices whose rows are not a multiple of 256 as
//! Q5_0, so their prefill runs here).
//!
//! Owns the packing, the driver and the choice between two definitions ([`PackedDef`]). In
//! `Ggml` the per-output operation sequence is exactly that of
//! [`super::block32`] (ggml's: eight lane sums of four products, one fused multiply-add per lane
//! and block, then `hsum8` plus the zero-point term), so a packed matrix gives **bit-identical**
//! results to the same matrix unpacked, on every path (portable scalar here, AVX2 and AVX-512
//! VNNI in `packed32_x86`), token tile, batch size and thread split. Lane `l` of a row's block is
//! elements `4l..4l+4`; with the layout above that is chunk `l` (Q8_0), or the low nibbles of
//! chunk `l` / the high nibbles of chunk `l - 4` (Q4_*). `BlockSum` (one exact integer sum and
//! one fused multiply-add per block; `packed32_blocksum`) is likewise bit-identical across its
//! paths, tiles, batches and thread splits, but not to `Ggml`. It never reads files and never
//! allocates per call.

use super::act_quant::{ActQ8, QK8};
use super::pool::ThreadPool;
use super::vec_f32::hsum8;
use super::KernelError;
use gguf::GgmlType;

/// Rows per interleaved group (one 32-bit lane of a 512-bit register each).
pub const GROUP_ROWS: usize = 16;

/// Const-generic tags of the four packed types in the SIMD kernels (`K` parameters).
pub(super) const Q4_0: u8 = 0;
pub(super) const Q4_1: u8 = 1;
pub(super) const Q8_0: u8 = 2;
pub(super) const Q5_0: u8 = 3;

/// Tokens per register tile of the batched kernels.
pub(super) const TILE_TOKENS: usize = 2;

/// The factor of a block's activation sum that corrects the unsigned weight operand exactly:
/// Q4_0 nibbles carry `+8`, Q5_0 values `+16`; Q4_1 has none and Q8_0 takes its signs with
/// `psignb`.
pub(super) const fn correction(k: u8) -> i32 {
    match k {
        Q4_0 => -8,
        Q5_0 => -16,
        _ => 0,
    }
}

/// The float order of a packed matrix's outputs. Both sum each block's products exactly in
/// integers; they differ in how the block sums become a float.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PackedDef {
    /// ggml's (llama.cpp's `vec_dot` for these types on AVX2, [`super::block32`]'s): eight lane
    /// sums of four products per block, one fused multiply-add per lane and block into that
    /// lane's accumulator, then `hsum8` (plus the zero-point term). What the unpacked kernels
    /// and llama.cpp compute, bit for bit.
    Ggml,
    /// One exact integer sum of the block's 32 products, then one fused multiply-add per block
    /// into one accumulator per row (Q4_1's zero-point term is a second fused multiply-add into
    /// the same accumulator): an eighth of `Ggml`'s conversions and fused multiply-adds, and the
    /// lane sums add as 16-bit integers before one widening (see `packed32_blocksum.rs`).
    BlockSum,
}

impl PackedDef {
    /// The definition the batch-invariant arithmetic uses: `BlockSum` on every CPU (an eighth
    /// of `Ggml`'s conversions and fused multiply-adds; on Intel Xeon with AVX-512 VNNI its
    /// 512-bit kernels prefill 1.45–1.6× and decode 1.05–1.2× faster than `Ggml`'s,
    /// docs/history/benchmarks-log.md), and, its paths being bit-identical, the same bits on every ISA.
    /// `Ggml` stays for reproducing llama.cpp (`MatmulArith::InvariantGgml`).
    /// No setting changes it (a measurement of one against the other builds both: the
    /// kernels' tests, `bench-model --llama-cpp-prefill`).
    pub fn invariant() -> PackedDef {
        PackedDef::BlockSum
    }

    /// A short name for cache namespaces and reports.
    pub fn name(self) -> &'static str {
        match self {
            PackedDef::Ggml => "ggml",
            PackedDef::BlockSum => "block-sum",
        }
    }
}

/// A Q4_0 / Q4_1 / Q5_0 / Q8_0 matrix in the row-interleaved layout of the module doc.
#[derive(Debug, Clone)]
pub struct Packed32 {
    ty: GgmlType,
    num_rows: usize,
    row_len: usize,
    num_blocks: usize,
    block_bytes: usize,
    /// 64-byte aligned storage: `num_groups * num_blocks * block_bytes` bytes.
    data: Vec<Line>,
}

/// One 64-byte cache line (the unit of the aligned storage).
#[derive(Debug, Clone, Copy)]
#[repr(C, align(64))]
struct Line([u8; 64]);

/// Whether `ty` can be packed.
pub fn packable(ty: GgmlType) -> bool {
    matches!(
        ty,
        GgmlType::Q4_0 | GgmlType::Q4_1 | GgmlType::Q5_0 | GgmlType::Q8_0
    )
}

/// Bytes of quants per row and block, and number of 64-byte chunks per group and block.
pub(super) fn quant_layout(ty: GgmlType) -> (usize, usize) {
    match ty {
        GgmlType::Q8_0 => (32, 8),
        GgmlType::Q5_0 => (16, 5),
        _ => (16, 4),
    }
}

impl Packed32 {
    /// Repacks `num_rows` rows of `row_len` elements of type `ty` (GGUF encoding, rows
    /// contiguous in `data`). Errors if the type cannot be packed or the shape does not match.
    pub fn pack(
        ty: GgmlType,
        num_rows: usize,
        row_len: usize,
        data: &[u8],
    ) -> Result<Packed32, KernelError> {
        if !packable(ty) {
            return Err(KernelError::NotPackable { ty });
        }
        let row_bytes = ty
            .row_bytes(row_len)
            .ok_or(KernelError::RowLenNotBlockMultiple {
                ty,
                row_len,
                block_elems: ty.block_elems(),
            })?;
        let expected = row_bytes
            .checked_mul(num_rows)
            .ok_or(KernelError::Overflow)?;
        if data.len() != expected {
            return Err(KernelError::WeightBytes {
                ty,
                num_rows,
                expected,
                actual: data.len(),
            });
        }
        let num_blocks = row_len / QK8;
        let (qbytes, chunks) = quant_layout(ty);
        let scale_bytes = if ty == GgmlType::Q4_1 { 64 } else { 32 };
        let block_bytes = chunks * 64 + scale_bytes;
        let num_groups = num_rows.div_ceil(GROUP_ROWS);
        let total = num_groups
            .checked_mul(num_blocks)
            .and_then(|n| n.checked_mul(block_bytes))
            .ok_or(KernelError::Overflow)?;
        let mut data_out = vec![Line([0; 64]); total.div_ceil(64)];
        let out = lines_as_bytes_mut(&mut data_out);
        let src_block = ty.block_bytes();
        // Offset of the quants inside a GGUF block: after d (and m for Q4_1, qh for Q5_0).
        let q_off = match ty {
            GgmlType::Q4_1 => 4,
            GgmlType::Q5_0 => 6,
            _ => 2,
        };
        for r in 0..num_rows {
            let (g, lane) = (r / GROUP_ROWS, r % GROUP_ROWS);
            for b in 0..num_blocks {
                let src = &data[r * row_bytes + b * src_block..][..src_block];
                let dst = &mut out[(g * num_blocks + b) * block_bytes..][..block_bytes];
                for c in 0..qbytes / 4 {
                    dst[c * 64 + lane * 4..][..4].copy_from_slice(&src[q_off + 4 * c..][..4]);
                }
                if ty == GgmlType::Q5_0 {
                    let qh = u32::from_le_bytes([src[2], src[3], src[4], src[5]]);
                    dst[4 * 64 + lane * 4..][..4].copy_from_slice(&rearrange_high_bits(qh));
                }
                let scales = chunks * 64;
                dst[scales + lane * 2..][..2].copy_from_slice(&src[0..2]);
                if ty == GgmlType::Q4_1 {
                    dst[scales + 32 + lane * 2..][..2].copy_from_slice(&src[2..4]);
                }
            }
        }
        Ok(Packed32 {
            ty,
            num_rows,
            row_len,
            num_blocks,
            block_bytes,
            data: data_out,
        })
    }

    pub fn ty(&self) -> GgmlType {
        self.ty
    }

    pub fn num_rows(&self) -> usize {
        self.num_rows
    }

    pub fn row_len(&self) -> usize {
        self.row_len
    }

    /// Bytes held (including the padding rows of the last group).
    pub fn num_bytes(&self) -> usize {
        self.data.len() * 64
    }

    pub(super) fn num_groups(&self) -> usize {
        self.num_rows.div_ceil(GROUP_ROWS)
    }

    pub(super) fn num_blocks(&self) -> usize {
        self.num_blocks
    }

    pub(super) fn block_bytes(&self) -> usize {
        self.block_bytes
    }

    /// The packed bytes (64-byte aligned).
    pub(super) fn bytes(&self) -> &[u8] {
        lines_as_bytes(&self.data)
    }

    /// The bytes of group `g` (all its blocks).
    pub(super) fn group(&self, g: usize) -> &[u8] {
        let len = self.num_blocks * self.block_bytes;
        &self.bytes()[g * len..(g + 1) * len]
    }
}

fn lines_as_bytes(lines: &[Line]) -> &[u8] {
    // SAFETY: `Line` is `repr(C)` around `[u8; 64]` (size 64, no padding), so a slice of `n`
    // lines is `64 * n` initialised bytes with the same lifetime; u8 has alignment 1.
    unsafe { std::slice::from_raw_parts(lines.as_ptr().cast::<u8>(), lines.len() * 64) }
}

fn lines_as_bytes_mut(lines: &mut [Line]) -> &mut [u8] {
    // SAFETY: as in `lines_as_bytes`; the exclusive borrow of `lines` is carried over.
    unsafe { std::slice::from_raw_parts_mut(lines.as_mut_ptr().cast::<u8>(), lines.len() * 64) }
}

/// A Q5_0 block's `qh` (bit `k` = high bit of element `k`) as 4 bytes where bit `l` of byte `j`
/// is the high bit of element `4l + j` (lane `l`, position `j` of the packed layout).
fn rearrange_high_bits(qh: u32) -> [u8; 4] {
    let mut out = [0u8; 4];
    for (j, o) in out.iter_mut().enumerate() {
        for l in 0..8 {
            *o |= (((qh >> (4 * l + j)) & 1) as u8) << l;
        }
    }
    out
}

#[inline(always)]
pub(super) fn f16_at(b: &[u8], off: usize) -> f32 {
    half::f16::from_bits(u16::from_le_bytes([b[off], b[off + 1]])).to_f32()
}

/// Signed value of element `k` of row `lane` in one packed block (portable decoding).
#[inline(always)]
pub(super) fn value(ty: GgmlType, blk: &[u8], lane: usize, k: usize) -> i32 {
    match ty {
        GgmlType::Q8_0 => i32::from(blk[(k / 4) * 64 + lane * 4 + k % 4] as i8),
        _ => {
            let j = k % 16;
            let byte = blk[(j / 4) * 64 + lane * 4 + j % 4];
            let nib = if k < 16 { byte & 0x0F } else { byte >> 4 };
            match ty {
                GgmlType::Q4_0 => i32::from(nib) - 8,
                GgmlType::Q5_0 => {
                    let hi = (blk[4 * 64 + lane * 4 + k % 4] >> (k / 4)) & 1;
                    i32::from(nib | hi << 4) - 16
                }
                _ => i32::from(nib),
            }
        }
    }
}

/// Portable twin of the SIMD group kernels: `out[t][lane]` for tokens `tok0..tok0 + out.len()`
/// of group `g`, in the canonical order of [`super::block32`].
pub(super) fn group_scalar(
    p: &Packed32,
    g: usize,
    act: &ActQ8,
    tok0: usize,
    out: &mut [[f32; 16]],
) {
    let (nb, bb) = (p.num_blocks, p.block_bytes);
    let grp = p.group(g);
    let (_, chunks) = quant_layout(p.ty);
    let scales = chunks * 64;
    for (dt, o) in out.iter_mut().enumerate() {
        let tok = tok0 + dt;
        let xq = &act.qs[tok * nb * QK8..(tok + 1) * nb * QK8];
        for (lane, y) in o.iter_mut().enumerate() {
            let mut acc = [0f32; 8];
            let mut summs = 0f32;
            for b in 0..nb {
                let blk = &grp[b * bb..(b + 1) * bb];
                let x = &xq[b * QK8..(b + 1) * QK8];
                let dd = f16_at(blk, scales + lane * 2) * act.d[tok * nb + b];
                for (l, a) in acc.iter_mut().enumerate() {
                    let isum: i32 = (4 * l..4 * l + 4)
                        .map(|k| value(p.ty, blk, lane, k) * i32::from(x[k]))
                        .sum();
                    *a = (isum as f32).mul_add(dd, *a);
                }
                if p.ty == GgmlType::Q4_1 {
                    summs = f16_at(blk, scales + 32 + lane * 2).mul_add(act.s[tok * nb + b], summs);
                }
            }
            let r = hsum8(&acc);
            *y = if p.ty == GgmlType::Q4_1 { r + summs } else { r };
        }
    }
}

/// Panics unless `act` holds whole tokens of `p`'s blocks in every buffer and `groups` lies in
/// `p`: the entry check of the multi-token kernels (`packed32_prefill`, `packed32_prefill_avx2`,
/// `packed32_blocksum`).
pub(super) fn assert_shapes(p: &Packed32, act: &ActQ8, groups: &std::ops::Range<usize>) {
    let nb = p.num_blocks();
    assert!(
        act.num_blocks == nb
            && groups.end <= p.num_groups()
            && act.qs.len() >= act.num_tokens * nb * QK8
            && act.d.len() >= act.num_tokens * nb
            && act.s.len() >= act.num_tokens * nb
            && act.lane_sums.len() >= act.num_tokens * nb * 8
            && act.block_sums.len() >= act.num_tokens * nb,
        "activations and groups match the matrix"
    );
}

/// Whether a step of `num_tokens` tokens is a decode (at most one register tile of tokens), whose
/// groups the threads claim from both ends (`both_ends`) instead of a static [`split`].
pub(super) fn claims_from_both_ends(num_tokens: usize) -> bool {
    num_tokens <= TILE_TOKENS
}

/// Splits a packed matrix's groups for a step of more than one register tile of tokens into
/// tasks: `(num_tasks, groups_per_task)`, about four per thread. (A decode does not split
/// statically: a task lasts microseconds there, every further task costs a claim and a
/// completion on shared counters and starts a memory stream cold — measured on Zen 5, one task
/// per thread decoded 9–11% faster than two — and two equal halves leave one thread waiting for
/// the other's stream, so its threads claim groups from both ends, `both_ends`.)
pub(super) fn split(p: &Packed32, pool: &ThreadPool, num_tokens: usize) -> (usize, usize) {
    debug_assert!(
        !claims_from_both_ends(num_tokens),
        "a decode claims from both ends"
    );
    let num_groups = p.num_groups();
    if pool.num_threads() == 1 {
        return (1, num_groups);
    }
    let per = num_groups.div_ceil(pool.num_threads() * 4).max(1);
    (num_groups.div_ceil(per), per)
}

#[cfg(test)]
pub(super) mod tests {
    use super::*;
    use crate::block32::{dot_row_scalar, Block32, Q4_0, Q4_1, Q5_0, Q8_0};
    use crate::cpu::CpuFeatures;
    use gguf::quantize::quantize_row;
    use rand::{Rng, SeedableRng};

    /// `rows` rows of uniform values in [-1, 1) quantised to `ty` (GGUF layout).
    pub(crate) fn random_matrix(ty: GgmlType, rows: usize, row_len: usize, seed: u64) -> Vec<u8> {
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(seed);
        let mut data = Vec::new();
        for _ in 0..rows {
            let x: Vec<f32> = (0..row_len).map(|_| rng.gen_range(-1.0f32..1.0)).collect();
            quantize_row(ty, &x, &mut data).unwrap();
        }
        data
    }

    /// The packed layout decodes to the same values and scales as the GGUF rows.
    fn check_values<B: Block32>(ty: GgmlType) {
        let (rows, row_len) = (21, 96);
        let data = random_matrix(ty, rows, row_len, 7);
        let p = Packed32::pack(ty, rows, row_len, &data).unwrap();
        let rb = ty.row_bytes(row_len).unwrap();
        let (_, chunks) = quant_layout(ty);
        for r in 0..rows {
            for b in 0..row_len / 32 {
                let src = &data[r * rb + b * B::BYTES..][..B::BYTES];
                let grp = p.group(r / 16);
                let blk = &grp[b * p.block_bytes..(b + 1) * p.block_bytes];
                let want = B::values(src);
                for (k, w) in want.iter().enumerate() {
                    assert_eq!(value(ty, blk, r % 16, k), i32::from(*w), "r{r} b{b} k{k}");
                }
                let (d, m) = B::scales(src);
                assert_eq!(f16_at(blk, chunks * 64 + (r % 16) * 2), d);
                if ty == GgmlType::Q4_1 {
                    assert_eq!(f16_at(blk, chunks * 64 + 32 + (r % 16) * 2), m);
                }
            }
        }
        // Padding rows are zero.
        let last = p.group(1);
        assert!(
            value(ty, &last[..p.block_bytes], 15, 3)
                == match ty {
                    GgmlType::Q4_0 => -8,
                    GgmlType::Q5_0 => -16,
                    _ => 0,
                }
        );
    }

    #[test]
    fn packing_keeps_values_and_scales() {
        check_values::<Q4_0>(GgmlType::Q4_0);
        check_values::<Q4_1>(GgmlType::Q4_1);
        check_values::<Q5_0>(GgmlType::Q5_0);
        check_values::<Q8_0>(GgmlType::Q8_0);
    }

    #[test]
    fn packing_rejects_bad_shapes_and_types() {
        assert!(matches!(
            Packed32::pack(GgmlType::F32, 1, 32, &[0; 128]),
            Err(KernelError::NotPackable { .. })
        ));
        assert!(matches!(
            Packed32::pack(GgmlType::Q4_0, 2, 32, &[0; 18]),
            Err(KernelError::WeightBytes { .. })
        ));
        assert!(matches!(
            Packed32::pack(GgmlType::Q4_0, 1, 33, &[0; 18]),
            Err(KernelError::RowLenNotBlockMultiple { .. })
        ));
    }

    /// The packed scalar result is bit-identical to the unpacked kernels' for every type.
    #[test]
    fn packed_scalar_matches_unpacked_dot_bitwise() {
        for (ty, seed) in [
            (GgmlType::Q4_0, 1),
            (GgmlType::Q4_1, 2),
            (GgmlType::Q5_0, 7),
            (GgmlType::Q8_0, 3),
        ] {
            let (rows, row_len, toks) = (19, 128, 3);
            let data = random_matrix(ty, rows, row_len, seed);
            let p = Packed32::pack(ty, rows, row_len, &data).unwrap();
            let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(seed + 10);
            let x: Vec<f32> = (0..toks * row_len)
                .map(|_| rng.gen_range(-2.0f32..2.0))
                .collect();
            let mut act = ActQ8::default();
            act.quantize(CpuFeatures::PORTABLE, &x, toks, row_len);
            let rb = ty.row_bytes(row_len).unwrap();
            for g in 0..2 {
                let mut out = [[0f32; 16]; 3];
                group_scalar(&p, g, &act, 0, &mut out);
                for (t, o) in out.iter().enumerate() {
                    for (lane, got) in o.iter().enumerate() {
                        let r = g * 16 + lane;
                        if r >= rows {
                            continue;
                        }
                        let w_row = &data[r * rb..(r + 1) * rb];
                        let want = match ty {
                            GgmlType::Q4_0 => dot_row_scalar::<Q4_0>(w_row, &act, t),
                            GgmlType::Q4_1 => dot_row_scalar::<Q4_1>(w_row, &act, t),
                            GgmlType::Q5_0 => dot_row_scalar::<Q5_0>(w_row, &act, t),
                            _ => dot_row_scalar::<Q8_0>(w_row, &act, t),
                        };
                        assert_eq!(
                            got.to_bits(),
                            want.to_bits(),
                            "{ty:?} r{r} t{t}: {} vs {want}",
                            got
                        );
                    }
                }
            }
        }
    }

    fn bits(v: &[f32]) -> Vec<u32> {
        v.iter().map(|x| x.to_bits()).collect()
    }

    /// In ggml's definition, every path (portable, AVX2, AVX-512 VNNI where present), every batch
    /// size, token position and thread count gives bit-identical outputs, equal to the unpacked
    /// matrix's; fused calls (in this machine's invariant definition) equal separate ones.
    #[test]
    fn packed_paths_batches_and_threads_agree_bitwise() {
        use crate::matmul::matmul_with_def;
        use crate::{matmul_many_with_features, matmul_with_features, QMatrix, ThreadPool};
        let pools = [ThreadPool::new(1), ThreadPool::new(2), ThreadPool::new(3)];
        let detected = CpuFeatures::detect();
        let portable = CpuFeatures::PORTABLE;
        let paths = [portable, CpuFeatures::AVX2, detected];
        for (ty, seed) in [
            (GgmlType::Q4_0, 4),
            (GgmlType::Q4_1, 5),
            (GgmlType::Q5_0, 8),
            (GgmlType::Q8_0, 6),
        ] {
            let (rows, row_len) = (37, 96);
            let data = random_matrix(ty, rows, row_len, seed);
            let p = Packed32::pack(ty, rows, row_len, &data).unwrap();
            let w = QMatrix {
                ty,
                num_rows: rows,
                row_len,
                data: &data,
                packed: Some(&p),
            };
            let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(seed + 20);
            let max_toks = 9;
            let x: Vec<f32> = (0..max_toks * row_len)
                .map(|_| rng.gen_range(-3.0f32..3.0))
                .collect();
            // Reference: the whole batch on the portable path, one thread, equal to the unpacked
            // matrix's result.
            let mut want = vec![0f32; max_toks * rows];
            let ggml = PackedDef::Ggml;
            matmul_with_def(&pools[0], &w, &x, max_toks, &mut want, portable, ggml).unwrap();
            // The fused calls below run in this machine's invariant definition.
            let mut want_inv = vec![0f32; max_toks * rows];
            matmul_with_features(&pools[0], &w, &x, max_toks, &mut want_inv, portable).unwrap();
            let mut unpacked = vec![0f32; max_toks * rows];
            let wu = QMatrix { packed: None, ..w };
            matmul_with_def(&pools[1], &wu, &x, max_toks, &mut unpacked, detected, ggml).unwrap();
            assert_eq!(bits(&want), bits(&unpacked), "{ty:?} packed vs unpacked");
            for pool in &pools {
                for f in paths {
                    for toks in [1, 3, 4, 5, 9] {
                        for t0 in [0, max_toks - toks] {
                            let xs = &x[t0 * row_len..(t0 + toks) * row_len];
                            let mut y = vec![0f32; toks * rows];
                            matmul_with_def(pool, &w, xs, toks, &mut y, f, ggml).unwrap();
                            assert_eq!(
                                bits(&y),
                                bits(&want[t0 * rows..(t0 + toks) * rows]),
                                "{ty:?} {f:?} toks {toks} t0 {t0}"
                            );
                        }
                    }
                    // Fused with a second packed matrix of another height.
                    let data2 = random_matrix(ty, 16, row_len, seed + 1);
                    let p2 = Packed32::pack(ty, 16, row_len, &data2).unwrap();
                    let w2 = QMatrix {
                        ty,
                        num_rows: 16,
                        row_len,
                        data: &data2,
                        packed: Some(&p2),
                    };
                    let mut y1 = vec![0f32; max_toks * rows];
                    let mut y2 = vec![0f32; max_toks * 16];
                    let mut y2_alone = vec![0f32; max_toks * 16];
                    matmul_many_with_features(
                        pool,
                        &[w, w2],
                        &x,
                        max_toks,
                        &mut [&mut y1, &mut y2],
                        f,
                    )
                    .unwrap();
                    matmul_with_features(pool, &w2, &x, max_toks, &mut y2_alone, f).unwrap();
                    assert_eq!(bits(&y1), bits(&want_inv));
                    assert_eq!(bits(&y2), bits(&y2_alone));
                }
            }
            // A packed matrix that does not match its QMatrix is an error, not a wrong answer.
            let wrong = QMatrix {
                num_rows: 16,
                data: &data[..16 * ty.row_bytes(row_len).unwrap()],
                ..w
            };
            let mut y = vec![0f32; 16];
            assert!(matches!(
                matmul_with_features(&pools[0], &wrong, &x[..row_len], 1, &mut y, detected),
                Err(KernelError::PackedMismatch { .. })
            ));
        }
    }
}
