//! The K/V tensor memory of the paged cache and its [`KvStore`] view for one step.
//!
//! Owns the bytes: rows of f32, f16 or `quant`-encoded bytes ordered
//! `[num_layers, num_kv_heads, num_blocks, block_size]`, so one (layer, head) of one block is a
//! contiguous run of `block_size` rows (one attention chunk) and the runs of blocks with
//! consecutive ids lie next to each other: a sequence's blocks, handed out in id order by a fresh
//! pool, stream through memory like a contiguous cache when attention walks them (the hardware
//! prefetcher follows them). A block is therefore `num_layers · num_kv_heads` runs spread over the
//! pool; copy-on-write and the tier (de)serialisation gather and scatter them. Which block
//! belongs to whom is the `cache` crate's business; this module only reads and writes the blocks
//! a table names.

use cache::BlockId;
use model::kv::{KvChunk, KvDtype, KvError, KvStore, SeqSlot};
use model::KvRows;
use model::ThreadPool;

/// Geometry of the K/V memory.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KvGeometry {
    pub num_blocks: usize,
    pub block_size: usize,
    pub num_layers: usize,
    pub num_kv_heads: usize,
    pub head_dim: usize,
}

impl KvGeometry {
    /// Elements of K (or V) in one block.
    pub fn block_elems(&self) -> usize {
        self.num_layers * self.num_kv_heads * self.block_size * self.head_dim
    }
}

/// All K/V memory of the pool: rows ordered `[layer, kv_head, block, row in block]`.
pub struct PagedKvMemory {
    geo: KvGeometry,
    rows: KvRows,
}

impl PagedKvMemory {
    /// Allocates the pool; fails when the codecs do not fit the head size.
    pub fn new(geo: KvGeometry, dtype: KvDtype) -> Result<Self, KvError> {
        if let Some(tokens) = dtype.k.block_tokens() {
            if tokens != geo.block_size {
                return Err(KvError::Codec(format!(
                    "{} seals one block of one KV head at a time: it needs a KV block size of \
                     {tokens}, got {} (use int4c-t{})",
                    dtype.k, geo.block_size, geo.block_size
                )));
            }
        }
        let num_rows = geo.num_blocks * geo.num_layers * geo.num_kv_heads * geo.block_size;
        Ok(PagedKvMemory {
            geo,
            rows: KvRows::new(dtype, geo.head_dim, num_rows)?,
        })
    }

    /// Maps the pool's pages now (`KvRows::prefault`); the bytes mapped.
    pub fn prefault(&mut self) -> usize {
        self.rows.prefault()
    }

    pub fn geometry(&self) -> KvGeometry {
        self.geo
    }

    pub fn dtype(&self) -> KvDtype {
        self.rows.codecs()
    }

    /// Bytes of K and V per token over all layers, scales and offsets included.
    pub fn bytes_per_token(&self) -> usize {
        let g = &self.geo;
        self.dtype()
            .bytes_per_token(g.num_layers, g.num_kv_heads, g.head_dim)
    }

    /// Bytes of the whole pool.
    pub fn total_bytes(&self) -> usize {
        self.bytes_per_token() * self.geo.block_size * self.geo.num_blocks
    }

    /// Bytes actually allocated for K and V (equals `total_bytes`; kept to prove the accounting).
    pub fn allocated_bytes(&self) -> usize {
        self.rows.allocated_bytes()
    }

    /// Rows in one block (every layer and head).
    fn rows_per_block(&self) -> usize {
        self.geo.num_layers * self.geo.num_kv_heads * self.geo.block_size
    }

    /// Index of the row of (block, layer, kv_head, row within the block).
    fn row(&self, block: BlockId, layer: usize, kv_head: usize, row: usize) -> usize {
        let g = &self.geo;
        ((layer * g.num_kv_heads + kv_head) * g.num_blocks + block.index()) * g.block_size + row
    }

    /// First rows of a block's runs, in the order `(layer, kv_head)` — the order of its rows in
    /// serialised block bytes.
    fn block_runs(&self, block: BlockId) -> impl Iterator<Item = usize> + '_ {
        let g = self.geo;
        (0..g.num_layers)
            .flat_map(move |layer| (0..g.num_kv_heads).map(move |h| (layer, h)))
            .map(move |(layer, h)| self.row(block, layer, h, 0))
    }

    /// Copies the first `num_rows` token rows of `src` into `dst` (copy-on-write of a partial block).
    pub fn copy_block(&mut self, src: BlockId, dst: BlockId, num_rows: usize) {
        for layer in 0..self.geo.num_layers {
            for h in 0..self.geo.num_kv_heads {
                let (s, d) = (self.row(src, layer, h, 0), self.row(dst, layer, h, 0));
                self.rows.copy_rows(s, d, num_rows);
            }
        }
    }

    /// A [`KvStore`] over this memory for one step: `tables[slot]` is the block table of the
    /// sequence the forward pass calls `SeqSlot(slot)`.
    pub fn view<'a>(&'a mut self, tables: &'a [&'a [BlockId]]) -> StepKv<'a> {
        StepKv { mem: self, tables }
    }
}

/// The paged memory seen through the block tables of one step's sequences.
pub struct StepKv<'a> {
    mem: &'a mut PagedKvMemory,
    tables: &'a [&'a [BlockId]],
}

impl StepKv<'_> {
    fn block_of(&self, slot: SeqSlot, pos: usize) -> Result<BlockId, KvError> {
        let table = self
            .tables
            .get(slot.0 as usize)
            .ok_or(KvError::UnknownSlot(slot.0))?;
        let bs = self.mem.geo.block_size;
        table.get(pos / bs).copied().ok_or(KvError::OutOfCapacity {
            slot: slot.0,
            pos,
            capacity: table.len() * bs,
        })
    }

    /// The pool row of the group starting at `pos` of `kv_head` in `layer`, where blocks hold
    /// whole groups (a block size that is a multiple of 16); `None` else or out of range.
    #[inline]
    fn group_row(&self, layer: usize, slot: SeqSlot, kv_head: usize, pos: usize) -> Option<usize> {
        let bs = self.mem.geo.block_size;
        if !bs.is_multiple_of(model::PAIR_GROUP_ROWS)
            || layer >= self.mem.geo.num_layers
            || kv_head >= self.mem.geo.num_kv_heads
        {
            return None;
        }
        let block = *self.tables.get(slot.0 as usize)?.get(pos / bs)?;
        Some(self.mem.row(block, layer, kv_head, pos % bs))
    }
}

impl KvStore for StepKv<'_> {
    fn write(
        &mut self,
        layer: usize,
        slot: SeqSlot,
        pos: usize,
        k: &[f32],
        v: &[f32],
    ) -> Result<(), KvError> {
        let block = self.block_of(slot, pos)?;
        let g = self.mem.geo;
        let hd = g.head_dim;
        for h in 0..g.num_kv_heads {
            let row = self.mem.row(block, layer, h, pos % g.block_size);
            self.mem
                .rows
                .write(row, &k[h * hd..(h + 1) * hd], &v[h * hd..(h + 1) * hd])?;
        }
        Ok(())
    }

    fn write_step(
        &mut self,
        pool: &ThreadPool,
        layer: usize,
        slots: &[SeqSlot],
        positions: &[u32],
        k: &[f32],
        v: &[f32],
    ) -> Result<(), KvError> {
        let g = self.mem.geo;
        let mut items = Vec::with_capacity(slots.len() * g.num_kv_heads);
        for (t, (&slot, &pos)) in slots.iter().zip(positions).enumerate() {
            let pos = pos as usize;
            let block = self.block_of(slot, pos)?;
            items.extend((0..g.num_kv_heads).map(|h| {
                (
                    self.mem.row(block, layer, h, pos % g.block_size),
                    t * g.num_kv_heads + h,
                )
            }));
        }
        self.mem.rows.write_many(pool, &items, k, v)
    }

    fn codecs(&self) -> KvDtype {
        self.mem.rows.codecs()
    }

    fn begin_step(&mut self) {
        self.mem.rows.release_sealed();
    }

    fn shares_positions(&self, a: SeqSlot, b: SeqSlot, positions: std::ops::Range<usize>) -> bool {
        let bs = self.mem.geo.block_size;
        let (Some(ta), Some(tb)) = (self.tables.get(a.0 as usize), self.tables.get(b.0 as usize))
        else {
            return false;
        };
        if positions.is_empty() {
            return false;
        }
        let blocks = positions.start / bs..(positions.end - 1) / bs + 1;
        match (ta.get(blocks.clone()), tb.get(blocks)) {
            (Some(x), Some(y)) => x == y,
            _ => false,
        }
    }

    fn for_each_chunk(
        &self,
        layer: usize,
        slot: SeqSlot,
        kv_head: usize,
        num_positions: usize,
        f: &mut dyn FnMut(usize, KvChunk<'_>),
    ) {
        self.for_each_chunk_from(layer, slot, kv_head, 0, num_positions, f)
    }

    /// Blocks from the one holding `from`; while a block is read, the next block's rows are
    /// prefetched when that block is not the next in memory (the hardware prefetcher cannot
    /// follow a jump).
    fn for_each_chunk_from(
        &self,
        layer: usize,
        slot: SeqSlot,
        kv_head: usize,
        from: usize,
        num_positions: usize,
        f: &mut dyn FnMut(usize, KvChunk<'_>),
    ) {
        let bs = self.mem.geo.block_size;
        let table = self.tables[slot.0 as usize];
        let first_block = from / bs;
        let mut pos = first_block * bs;
        for (i, &block) in table.iter().enumerate().skip(first_block) {
            if pos >= num_positions {
                break;
            }
            let n = (num_positions - pos).min(bs);
            if let Some(&next) = table.get(i + 1) {
                // Runs of consecutive block ids are adjacent in memory and the hardware
                // prefetcher follows them (software prefetches then only cost: measured);
                // a jump to another block is prefetched.
                if pos + bs < num_positions && next.index() != block.index() + 1 {
                    let next_n = (num_positions - pos - bs).min(bs);
                    self.mem
                        .rows
                        .prefetch(self.mem.row(next, layer, kv_head, 0), next_n);
                }
            }
            // The block holding the query (the last one read) is its own: with a block K codec
            // its full-precision rows are read (`KvRows::with_chunk`).
            self.mem.rows.with_chunk(
                self.mem.row(block, layer, kv_head, 0),
                n,
                pos + n == num_positions,
                |c| f(pos, c),
            );
            pos += n;
        }
    }

    /// Blocks of whole groups (a block size that is a multiple of 16) in the pair layout.
    #[inline(always)]
    fn pair_group(
        &self,
        layer: usize,
        slot: SeqSlot,
        kv_head: usize,
        pos: usize,
    ) -> Option<model::PairHalf<'_>> {
        let row = self.group_row(layer, slot, kv_head, pos)?;
        self.mem.rows.pair_group(row)
    }

    /// Blocks of whole groups in the coded pair layout (`int8` K, bf16 V).
    #[inline(always)]
    fn coded_pair_group(
        &self,
        layer: usize,
        slot: SeqSlot,
        kv_head: usize,
        pos: usize,
    ) -> Option<model::CodedPairHalf<'_>> {
        let row = self.group_row(layer, slot, kv_head, pos)?;
        self.mem.rows.coded_pair_group(row)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn geo() -> KvGeometry {
        KvGeometry {
            num_blocks: 4,
            block_size: 2,
            num_layers: 2,
            num_kv_heads: 2,
            head_dim: 3,
        }
    }

    /// Two sequences share positions exactly where their tables name the same blocks (blocks
    /// of 2 positions here): a range is shared only when every block it touches is.
    #[test]
    fn positions_are_shared_where_the_tables_name_the_same_blocks() {
        let mut mem = PagedKvMemory::new(geo(), KvDtype::F16).unwrap();
        let a: &[BlockId] = &[BlockId(0), BlockId(1), BlockId(2)];
        let b: &[BlockId] = &[BlockId(0), BlockId(1), BlockId(3)];
        let tables = [a, b];
        let kv = mem.view(&tables);
        let shares = |r: std::ops::Range<usize>| kv.shares_positions(SeqSlot(0), SeqSlot(1), r);
        assert!(shares(0..4));
        assert!(shares(1..3));
        assert!(!shares(0..5), "block 2 differs");
        assert!(!shares(3..5));
        assert!(!shares(4..6));
        assert!(!shares(0..7), "past both tables");
        assert!(!shares(2..2), "an empty range");
        assert!(
            !kv.shares_positions(SeqSlot(0), SeqSlot(2), 0..2),
            "an unknown slot"
        );
        assert!(kv.shares_positions(SeqSlot(1), SeqSlot(1), 0..6));
    }

    #[test]
    fn writes_land_in_the_named_blocks_and_read_back_in_order() {
        for dtype in [KvDtype::F32, KvDtype::F16] {
            let mut mem = PagedKvMemory::new(geo(), dtype).unwrap();
            let table: &[BlockId] = &[BlockId(3), BlockId(1)];
            let tables = [table];
            let mut kv = mem.view(&tables);
            for pos in 0..3 {
                let k: Vec<f32> = (0..6).map(|i| (pos * 10 + i) as f32).collect();
                let v: Vec<f32> = k.iter().map(|x| -x).collect();
                kv.write(1, SeqSlot(0), pos, &k, &v).unwrap();
            }
            let mut seen = Vec::new();
            kv.for_each_chunk(1, SeqSlot(0), 1, 3, &mut |start, chunk| {
                let ks: Vec<f32> = match chunk {
                    KvChunk::F32 { k, .. } => k.to_vec(),
                    KvChunk::F16 { k, .. } => k.iter().map(|x| x.to_f32()).collect(),
                    KvChunk::Encoded { .. } => unreachable!("f32/f16 memory"),
                };
                seen.push((start, ks));
            });
            assert_eq!(seen.len(), 2);
            assert_eq!(seen[0], (0, vec![3.0, 4.0, 5.0, 13.0, 14.0, 15.0]));
            assert_eq!(seen[1], (2, vec![23.0, 24.0, 25.0]));
            // From position 2 on: the first block is skipped (the second block's rows were
            // prefetched while the first was read above; prefetching changes nothing).
            let mut from2 = Vec::new();
            kv.for_each_chunk_from(1, SeqSlot(0), 1, 2, 3, &mut |start, chunk| {
                from2.push((start, chunk.num_positions(3)));
            });
            assert_eq!(from2, vec![(2, 1)]);
            let mut from1 = Vec::new();
            kv.for_each_chunk_from(1, SeqSlot(0), 1, 1, 3, &mut |start, _| from1.push(start));
            assert_eq!(from1, vec![0, 2], "a chunk holding `from` starts before it");
            assert!(
                kv.write(0, SeqSlot(0), 4, &[0.0; 6], &[0.0; 6]).is_err(),
                "beyond the table"
            );
        }
    }

    #[test]
    fn quantized_rows_round_trip_within_the_codec_bound_and_account_bytes_exactly() {
        let geo = KvGeometry {
            num_blocks: 3,
            block_size: 4,
            num_layers: 2,
            num_kv_heads: 2,
            head_dim: 64,
        };
        for spec in ["int8", "int4", "fp8", "bf16", "k=int8,v=int4"] {
            let codecs = KvDtype::parse(spec).unwrap();
            let mut mem = PagedKvMemory::new(geo, codecs).unwrap();
            assert_eq!(
                mem.allocated_bytes(),
                mem.total_bytes(),
                "{spec}: bytes per token × tokens"
            );
            let table: &[BlockId] = &[BlockId(2), BlockId(0)];
            let tables = [table];
            let mut kv = mem.view(&tables);
            let row = |pos: usize| -> Vec<f32> {
                (0..128)
                    .map(|i| ((pos * 131 + i * 17) % 23) as f32 / 7.0 - 1.5)
                    .collect()
            };
            for pos in 0..6 {
                kv.write(1, SeqSlot(0), pos, &row(pos), &row(pos + 100))
                    .unwrap();
            }
            let mut n = 0;
            kv.for_each_chunk(1, SeqSlot(0), 1, 6, &mut |start, chunk| {
                let KvChunk::Encoded { k, .. } = chunk else {
                    panic!("{spec}: encoded chunks")
                };
                for (j, bytes) in k.rows().enumerate() {
                    let mut out = vec![0.0; 64];
                    quant::decode_row(k.kind(), bytes, &mut out).unwrap();
                    let want = &row(start + j)[64..];
                    let err = out
                        .iter()
                        .zip(want)
                        .map(|(a, b)| (a - b).abs())
                        .fold(0.0f32, f32::max);
                    assert!(err < 0.25, "{spec}: row {} err {err}", start + j);
                    n += 1;
                }
            });
            assert_eq!(n, 6);
        }
    }

    /// bf16 K/V in blocks of 16 (whole groups of the pair layout) are read in place: each
    /// block's group holds the rows the chunk reader sees, wherever the table puts it; blocks
    /// of 8 hold half groups and are only read as chunks.
    #[test]
    fn bf16_blocks_of_whole_groups_are_read_in_place() {
        let codecs = KvDtype::parse("bf16").unwrap();
        for block_size in [16, 8] {
            let geo = KvGeometry {
                num_blocks: 4,
                block_size,
                num_layers: 2,
                num_kv_heads: 2,
                head_dim: 32,
            };
            let mut mem = PagedKvMemory::new(geo, codecs).unwrap();
            let table: &[BlockId] = &[BlockId(3), BlockId(0), BlockId(2)];
            let tables = [table];
            let mut kv = mem.view(&tables);
            let n = 2 * block_size + 5;
            let row = |pos: usize, s: f32| -> Vec<f32> {
                (0..64)
                    .map(|i| s * ((pos * 31 + i * 7) % 19) as f32 - 3.0)
                    .collect()
            };
            for pos in 0..n {
                kv.write(1, SeqSlot(0), pos, &row(pos, 0.25), &row(pos, -0.5))
                    .unwrap();
            }
            let mut rows = Vec::new();
            kv.for_each_chunk(1, SeqSlot(0), 1, n, &mut |_, chunk| {
                let KvChunk::Encoded { k, v } = chunk else {
                    panic!("encoded bf16 chunks")
                };
                for (kr, vr) in k.rows().zip(v.rows()) {
                    rows.push((kr.to_vec(), vr.to_vec()));
                }
            });
            assert_eq!(rows.len(), n);
            let bytes = |x: &[half::bf16]| x.iter().flat_map(|b| b.to_le_bytes()).collect();
            for group in 0..n.div_ceil(16) {
                let got = kv.pair_group(1, SeqSlot(0), 1, 16 * group);
                if block_size == 8 {
                    assert!(got.is_none(), "blocks of 8: half groups");
                    continue;
                }
                let g = got.expect("a whole group in place");
                let (mut k, mut v) = (vec![half::bf16::ZERO; 32], vec![half::bf16::ZERO; 32]);
                for t in 0..16.min(n - 16 * group) {
                    g.row(t, &mut k, &mut v);
                    let want = &rows[16 * group + t];
                    assert_eq!((bytes(&k), bytes(&v)), (want.0.clone(), want.1.clone()));
                }
            }
            assert!(
                kv.pair_group(1, SeqSlot(0), 1, 16 * 3).is_none(),
                "past the table"
            );
        }
    }

    /// `int8` K with bf16 V in blocks of 16 are read in place as groups of the coded pair
    /// layout holding the codec rows the chunk reader sees, wherever the table puts them.
    #[test]
    fn int8_bf16_blocks_of_whole_groups_are_read_in_place() {
        let codecs = KvDtype::parse("k=int8,v=bf16").unwrap();
        let geo = KvGeometry {
            num_blocks: 4,
            block_size: 16,
            num_layers: 2,
            num_kv_heads: 2,
            head_dim: 64,
        };
        let mut mem = PagedKvMemory::new(geo, codecs).unwrap();
        let table: &[BlockId] = &[BlockId(3), BlockId(0), BlockId(2)];
        let tables = [table];
        let mut kv = mem.view(&tables);
        let n = 2 * 16 + 5;
        let row = |pos: usize, s: f32| -> Vec<f32> {
            (0..128)
                .map(|i| s * ((pos * 31 + i * 7) % 19) as f32 - 3.0)
                .collect()
        };
        for pos in 0..n {
            kv.write(1, SeqSlot(0), pos, &row(pos, 0.25), &row(pos, -0.5))
                .unwrap();
        }
        let mut rows = Vec::new();
        kv.for_each_chunk(1, SeqSlot(0), 1, n, &mut |_, chunk| {
            let KvChunk::Encoded { k, v } = chunk else {
                panic!("encoded chunks")
            };
            for (kr, vr) in k.rows().zip(v.rows()) {
                rows.push((kr.to_vec(), vr.to_vec()));
            }
        });
        assert_eq!(rows.len(), n);
        assert!(kv.pair_group(1, SeqSlot(0), 1, 0).is_none(), "not bf16 K");
        let (mut k, mut v) = (vec![0u8; 68], vec![half::bf16::ZERO; 64]);
        for group in 0..n.div_ceil(16) {
            let g = kv
                .coded_pair_group(1, SeqSlot(0), 1, 16 * group)
                .expect("a whole group in place");
            for t in 0..16.min(n - 16 * group) {
                g.row(t, &mut k, &mut v);
                let want = &rows[16 * group + t];
                let v_bytes: Vec<u8> = v.iter().flat_map(|b| b.to_le_bytes()).collect();
                assert_eq!(
                    (&k, &v_bytes),
                    (&want.0, &want.1),
                    "position {}",
                    16 * group + t
                );
            }
        }
        assert!(
            kv.coded_pair_group(1, SeqSlot(0), 1, 16 * 3).is_none(),
            "past the table"
        );
    }

    #[test]
    fn copy_block_copies_rows_of_every_layer_and_head() {
        let mut mem = PagedKvMemory::new(geo(), KvDtype::F32).unwrap();
        let t0: &[BlockId] = &[BlockId(0)];
        {
            let tables = [t0];
            let mut kv = mem.view(&tables);
            kv.write(0, SeqSlot(0), 0, &[1.0; 6], &[2.0; 6]).unwrap();
            kv.write(1, SeqSlot(0), 0, &[3.0; 6], &[4.0; 6]).unwrap();
        }
        mem.copy_block(BlockId(0), BlockId(2), 1);
        let t2: &[BlockId] = &[BlockId(2)];
        let tables = [t2];
        let kv = mem.view(&tables);
        let mut got = Vec::new();
        kv.for_each_chunk(1, SeqSlot(0), 1, 1, &mut |_, c| {
            if let KvChunk::F32 { k, v } = c {
                got.push((k.to_vec(), v.to_vec()));
            }
        });
        assert_eq!(got, vec![(vec![3.0; 3], vec![4.0; 3])]);
    }
}

/// Why serialised block bytes cannot be loaded into a block.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum BlockBytesError {
    /// The byte count differs from one block's K and V in this memory's codecs.
    #[error("block bytes have length {got}, expected {expected}")]
    WrongLength { got: usize, expected: usize },
    /// The block id is outside the pool.
    #[error("block {block} is outside the pool of {num_blocks} blocks")]
    NoSuchBlock { block: usize, num_blocks: usize },
    /// The device memory refused the copy.
    #[error("device K/V: {0}")]
    Device(String),
}

// Block serialisation for the storage tiers: one block's K rows then V rows, as stored (f32/f16
// little-endian, or the encoded bytes). The cache namespace commits to the codecs, so bytes never
// cross codecs.
impl PagedKvMemory {
    /// Serialised bytes of one block (exactly what [`PagedKvMemory::block_bytes`] returns).
    pub fn block_num_bytes(&self) -> usize {
        self.rows_per_block() * self.rows.row_pair_bytes()
    }

    /// One block's K then V (every layer, head and row, in that order), gathered from its runs.
    pub fn block_bytes(&self, block: BlockId) -> Vec<u8> {
        let bs = self.geo.block_size;
        let k_run = bs * self.rows.codecs().k.bytes_per_row(self.geo.head_dim);
        let mut k = Vec::with_capacity(self.block_num_bytes());
        let mut v = Vec::new();
        for first in self.block_runs(block) {
            let run = self.rows.rows_bytes(first, bs);
            k.extend_from_slice(&run[..k_run]);
            v.extend_from_slice(&run[k_run..]);
        }
        k.extend_from_slice(&v);
        k
    }

    /// Overwrites one block with bytes from [`PagedKvMemory::block_bytes`] of the same geometry
    /// and codecs. Checks length and block id; nothing is written on error.
    pub fn load_block_bytes(
        &mut self,
        block: BlockId,
        bytes: &[u8],
    ) -> Result<(), BlockBytesError> {
        if block.index() >= self.geo.num_blocks {
            return Err(BlockBytesError::NoSuchBlock {
                block: block.index(),
                num_blocks: self.geo.num_blocks,
            });
        }
        let expected = self.block_num_bytes();
        if bytes.len() != expected {
            return Err(BlockBytesError::WrongLength {
                got: bytes.len(),
                expected,
            });
        }
        let bs = self.geo.block_size;
        let k_run = bs * self.rows.codecs().k.bytes_per_row(self.geo.head_dim);
        let v_run = bs * self.rows.codecs().v.bytes_per_row(self.geo.head_dim);
        let (k, v) = bytes.split_at(k_run * self.geo.num_layers * self.geo.num_kv_heads);
        let firsts: Vec<usize> = self.block_runs(block).collect();
        let mut run = Vec::with_capacity(k_run + v_run);
        for (i, first) in firsts.into_iter().enumerate() {
            run.clear();
            run.extend_from_slice(&k[i * k_run..(i + 1) * k_run]);
            run.extend_from_slice(&v[i * v_run..(i + 1) * v_run]);
            self.rows.load_rows_bytes(first, bs, &run);
        }
        Ok(())
    }
}

#[cfg(test)]
mod block_bytes_tests {
    use super::*;

    #[test]
    fn block_bytes_round_trip_into_another_block_and_reject_bad_input() {
        let geo = KvGeometry {
            num_blocks: 3,
            block_size: 2,
            num_layers: 2,
            num_kv_heads: 2,
            head_dim: 3,
        };
        for dtype in [KvDtype::F32, KvDtype::F16] {
            let mut mem = PagedKvMemory::new(geo, dtype).unwrap();
            let t0: &[BlockId] = &[BlockId(0)];
            {
                let tables = [t0];
                let mut kv = mem.view(&tables);
                for layer in 0..2 {
                    for pos in 0..2 {
                        let k: Vec<f32> = (0..6)
                            .map(|i| (layer * 100 + pos * 10 + i) as f32)
                            .collect();
                        let v: Vec<f32> = k.iter().map(|x| -x - 0.5).collect();
                        kv.write(layer, SeqSlot(0), pos, &k, &v).unwrap();
                    }
                }
            }
            let bytes = mem.block_bytes(BlockId(0));
            assert_eq!(bytes.len(), mem.block_num_bytes());
            assert_ne!(bytes, mem.block_bytes(BlockId(2)), "block 2 is still zero");
            mem.load_block_bytes(BlockId(2), &bytes).unwrap();
            assert_eq!(mem.block_bytes(BlockId(2)), bytes);
            assert_eq!(
                mem.load_block_bytes(BlockId(1), &bytes[1..]),
                Err(BlockBytesError::WrongLength {
                    got: bytes.len() - 1,
                    expected: bytes.len()
                })
            );
            assert!(mem.load_block_bytes(BlockId(3), &bytes).is_err());
            assert!(
                mem.block_bytes(BlockId(1)).iter().all(|&b| b == 0),
                "nothing written on error"
            );
        }
    }

    /// The serialised format is fixed (tiers keep bytes across restarts): K rows then V rows,
    /// each in `(layer, kv_head, row)` order, whatever the pool's memory layout; and the block
    /// between two others holds its own rows only.
    #[test]
    fn block_bytes_are_k_then_v_in_layer_head_row_order() {
        let geo = KvGeometry {
            num_blocks: 3,
            block_size: 2,
            num_layers: 2,
            num_kv_heads: 2,
            head_dim: 2,
        };
        let mut mem = PagedKvMemory::new(geo, KvDtype::F32).unwrap();
        let table: Vec<BlockId> = (0..3).map(BlockId).collect();
        {
            let tables = [table.as_slice()];
            let mut kv = mem.view(&tables);
            for layer in 0..2 {
                for pos in 0..6 {
                    // K element e of head h: 1000·layer + 100·pos + 10·h + e; V its negation.
                    let k: Vec<f32> = (0..4)
                        .map(|i| (1000 * layer + 100 * pos + 10 * (i / 2) + i % 2) as f32)
                        .collect();
                    let v: Vec<f32> = k.iter().map(|x| -x).collect();
                    kv.write(layer, SeqSlot(0), pos, &k, &v).unwrap();
                }
            }
        }
        let floats: Vec<f32> = mem
            .block_bytes(BlockId(1))
            .chunks_exact(4)
            .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
            .collect();
        let mut want_k = Vec::new();
        for layer in 0..2 {
            for h in 0..2 {
                for pos in 2..4 {
                    for e in 0..2 {
                        want_k.push((1000 * layer + 100 * pos + 10 * h + e) as f32);
                    }
                }
            }
        }
        let want: Vec<f32> = want_k
            .iter()
            .copied()
            .chain(want_k.iter().map(|x| -x))
            .collect();
        assert_eq!(floats, want);
    }
}
