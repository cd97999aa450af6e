//! The K/V tensor memory of the paged cache and its [`KvStore`] view for one step.
//!
//! Owns the bytes: `num_blocks` blocks, each `[num_layers, num_kv_heads, block_size, head_dim]`
//! so one block is contiguous (a unit for copy-on-write and, later, for tiers) and one head's
//! rows inside a block are contiguous (one attention chunk). Which block belongs to whom is the
//! `cache` crate's business; this module only reads and writes the blocks a table names.

use cache::BlockId;
use half::f16;
use model::kv::{KvChunk, KvDtype, KvError, KvStore, SeqSlot};

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

enum Buf {
    F32 { k: Vec<f32>, v: Vec<f32> },
    F16 { k: Vec<f16>, v: Vec<f16> },
}

/// All K/V memory of the pool.
pub struct PagedKvMemory {
    geo: KvGeometry,
    dtype: KvDtype,
    buf: Buf,
}

impl PagedKvMemory {
    pub fn new(geo: KvGeometry, dtype: KvDtype) -> Self {
        let n = geo.num_blocks * geo.block_elems();
        let buf = match dtype {
            KvDtype::F32 => Buf::F32 {
                k: vec![0.0; n],
                v: vec![0.0; n],
            },
            KvDtype::F16 => Buf::F16 {
                k: vec![f16::ZERO; n],
                v: vec![f16::ZERO; n],
            },
        };
        PagedKvMemory { geo, dtype, buf }
    }

    pub fn geometry(&self) -> KvGeometry {
        self.geo
    }

    pub fn dtype(&self) -> KvDtype {
        self.dtype
    }

    /// Bytes of K and V per token over all layers.
    pub fn bytes_per_token(&self) -> usize {
        let elem = match self.dtype {
            KvDtype::F32 => 4,
            KvDtype::F16 => 2,
        };
        2 * self.geo.num_layers * self.geo.num_kv_heads * self.geo.head_dim * elem
    }

    /// Bytes of the whole pool.
    pub fn total_bytes(&self) -> usize {
        self.bytes_per_token() * self.geo.block_size * self.geo.num_blocks
    }

    fn offset(&self, block: BlockId, layer: usize, kv_head: usize, row: usize) -> usize {
        let g = &self.geo;
        block.index() * g.block_elems()
            + ((layer * g.num_kv_heads + kv_head) * g.block_size + row) * g.head_dim
    }

    /// Copies the first `num_rows` token rows of `src` into `dst` (copy-on-write of a partial block).
    pub fn copy_block(&mut self, src: BlockId, dst: BlockId, num_rows: usize) {
        let g = self.geo;
        for layer in 0..g.num_layers {
            for h in 0..g.num_kv_heads {
                let (s, d) = (self.offset(src, layer, h, 0), self.offset(dst, layer, h, 0));
                let n = num_rows * g.head_dim;
                match &mut self.buf {
                    Buf::F32 { k, v } => {
                        k.copy_within(s..s + n, d);
                        v.copy_within(s..s + n, d);
                    }
                    Buf::F16 { k, v } => {
                        k.copy_within(s..s + n, d);
                        v.copy_within(s..s + n, d);
                    }
                }
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
        let row = pos % g.block_size;
        for h in 0..g.num_kv_heads {
            let off = self.mem.offset(block, layer, h, row);
            let (ks, vs) = (
                &k[h * g.head_dim..(h + 1) * g.head_dim],
                &v[h * g.head_dim..(h + 1) * g.head_dim],
            );
            match &mut self.mem.buf {
                Buf::F32 { k: kb, v: vb } => {
                    kb[off..off + g.head_dim].copy_from_slice(ks);
                    vb[off..off + g.head_dim].copy_from_slice(vs);
                }
                Buf::F16 { k: kb, v: vb } => {
                    for i in 0..g.head_dim {
                        kb[off + i] = f16::from_f32(ks[i]);
                        vb[off + i] = f16::from_f32(vs[i]);
                    }
                }
            }
        }
        Ok(())
    }

    fn for_each_chunk(
        &self,
        layer: usize,
        slot: SeqSlot,
        kv_head: usize,
        num_positions: usize,
        f: &mut dyn FnMut(usize, KvChunk<'_>),
    ) {
        let g = self.mem.geo;
        let table = self.tables[slot.0 as usize];
        let mut pos = 0;
        for &block in table {
            if pos >= num_positions {
                break;
            }
            let rows = (num_positions - pos).min(g.block_size);
            let off = self.mem.offset(block, layer, kv_head, 0);
            let n = rows * g.head_dim;
            match &self.mem.buf {
                Buf::F32 { k, v } => f(
                    pos,
                    KvChunk::F32 {
                        k: &k[off..off + n],
                        v: &v[off..off + n],
                    },
                ),
                Buf::F16 { k, v } => f(
                    pos,
                    KvChunk::F16 {
                        k: &k[off..off + n],
                        v: &v[off..off + n],
                    },
                ),
            }
            pos += rows;
        }
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

    #[test]
    fn writes_land_in_the_named_blocks_and_read_back_in_order() {
        for dtype in [KvDtype::F32, KvDtype::F16] {
            let mut mem = PagedKvMemory::new(geo(), dtype);
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
                };
                seen.push((start, ks));
            });
            assert_eq!(seen.len(), 2);
            assert_eq!(seen[0], (0, vec![3.0, 4.0, 5.0, 13.0, 14.0, 15.0]));
            assert_eq!(seen[1], (2, vec![23.0, 24.0, 25.0]));
            assert!(
                kv.write(0, SeqSlot(0), 4, &[0.0; 6], &[0.0; 6]).is_err(),
                "beyond the table"
            );
        }
    }

    #[test]
    fn copy_block_copies_rows_of_every_layer_and_head() {
        let mut mem = PagedKvMemory::new(geo(), KvDtype::F32);
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
