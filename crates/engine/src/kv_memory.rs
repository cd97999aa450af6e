//! [`KvMemory`]: where the paged pool's K/V bytes live — host memory ([`PagedKvMemory`], the
//! CPU backend's) or a device's ([`DeviceKvMemory`], from a backend whose forward pass runs
//! there) — behind the few operations the engine needs of them: serialise a block for the
//! tiers, load one from them, copy one on write, and give the forward pass a view over a
//! step's block tables. Both serialise a block the same way, so tier payloads and cache keys
//! do not depend on the memory.
//!
//! Owns that choice and its dispatch only; never which block belongs to whom (the cache's) or
//! what to demote (the tiers').

use cache::BlockId;
use model::kv::{DeviceKvMemory, KvError, KvStore};

use crate::paged_kv::{BlockBytesError, PagedKvMemory};

// One per engine, never moved in a loop: the size difference costs nothing.
#[allow(clippy::large_enum_variant)]
pub enum KvMemory {
    Host(PagedKvMemory),
    Device(Box<dyn DeviceKvMemory>),
}

impl KvMemory {
    /// Bytes of K and V per token over all layers, scales and offsets included.
    pub fn bytes_per_token(&self) -> usize {
        match self {
            KvMemory::Host(m) => m.bytes_per_token(),
            KvMemory::Device(m) => m.bytes_per_token(),
        }
    }

    /// Bytes actually allocated for K and V.
    pub fn allocated_bytes(&self) -> usize {
        match self {
            KvMemory::Host(m) => m.allocated_bytes(),
            KvMemory::Device(m) => m.allocated_bytes(),
        }
    }

    /// Bytes of one serialised block.
    pub fn block_num_bytes(&self) -> usize {
        match self {
            KvMemory::Host(m) => m.block_num_bytes(),
            KvMemory::Device(m) => m.block_num_bytes(),
        }
    }

    /// Where the bytes are, for logs (`"host"`, `"device"`).
    pub fn place(&self) -> &'static str {
        match self {
            KvMemory::Host(_) => "host",
            KvMemory::Device(_) => "device",
        }
    }

    /// One block serialised (each layer's and head's K rows, then V rows).
    pub fn block_bytes(&self, block: BlockId) -> Result<Vec<u8>, KvError> {
        match self {
            KvMemory::Host(m) => Ok(m.block_bytes(block)),
            KvMemory::Device(m) => m.block_bytes(block.0 as usize),
        }
    }

    /// Overwrites one block with serialised bytes of the same geometry and codecs.
    pub fn load_block_bytes(
        &mut self,
        block: BlockId,
        bytes: &[u8],
    ) -> Result<(), BlockBytesError> {
        match self {
            KvMemory::Host(m) => m.load_block_bytes(block, bytes),
            KvMemory::Device(m) => m
                .load_block_bytes(block.0 as usize, bytes)
                .map_err(|e| BlockBytesError::Device(e.to_string())),
        }
    }

    /// Copies the first `num_rows` token rows of `src` into `dst` (copy-on-write).
    pub fn copy_block(
        &mut self,
        src: BlockId,
        dst: BlockId,
        num_rows: usize,
    ) -> Result<(), KvError> {
        match self {
            KvMemory::Host(m) => {
                m.copy_block(src, dst, num_rows);
                Ok(())
            }
            KvMemory::Device(m) => m.copy_block(src.0 as usize, dst.0 as usize, num_rows),
        }
    }

    /// The forward pass's view over one step: `tables[slot]` is the block table of
    /// `SeqSlot(slot)`.
    pub fn view<'t>(&'t mut self, tables: &'t [&'t [BlockId]]) -> Box<dyn KvStore + 't> {
        match self {
            KvMemory::Host(m) => Box::new(m.view(tables)),
            KvMemory::Device(m) => {
                let tables = tables
                    .iter()
                    .map(|t| t.iter().map(|b| b.0).collect())
                    .collect();
                m.view(tables)
            }
        }
    }
}
