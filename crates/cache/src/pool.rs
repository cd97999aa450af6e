//! The block arena: per-block metadata indexed by [`BlockId`] and the free list. Owns the free
//! list order; never decides what to evict or what is published (the cache module does).
//!
//! Free-list order: a stack. A fresh pool hands out `b0, b1, b2, …`; a block returned to the free
//! list (freed or evicted) is handed out next (last in, first out).

use crate::evict::OrderKey;
use crate::ids::{BlockId, Tick};
use crate::key::{BlockKey, NamespaceKey};
use crate::retention::Holder;

/// Identity of a published (indexed) block.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Published {
    pub key: BlockKey,
    /// The block holding the parent key; `None` for the first block of a chain.
    pub parent: Option<BlockId>,
    pub ns: NamespaceKey,
    /// Position in the chain (0 = first block after the namespace root).
    pub depth: u32,
}

/// Metadata of one block.
#[derive(Clone, Debug, Default)]
pub(crate) struct Block {
    /// References from block tables and outstanding prefix matches.
    pub ref_count: u32,
    pub published: Option<Published>,
    /// Published blocks whose parent is this block.
    pub num_children: u32,
    pub last_use: Tick,
    /// Hits: 1 on publish, +1 per lookup hit or duplicate publish.
    pub hits: u32,
    /// In the protected segment (segmented LRU only).
    pub protected: bool,
    /// Reuse-aware LRU: the bonus (ms) decided when the block was last ranked.
    pub reuse_bonus_ms: u64,
    /// Pins and sessions retaining this block.
    pub holders: Vec<Holder>,
    /// The key under which this block sits in the eviction candidate sets, if it does.
    pub candidate: Option<OrderKey>,
    pub is_free: bool,
}

/// Arena of blocks plus the free stack.
#[derive(Debug)]
pub(crate) struct Pool {
    pub blocks: Vec<Block>,
    pub free: Vec<BlockId>,
}

impl Pool {
    pub fn new(num_blocks: u32) -> Pool {
        let blocks = (0..num_blocks)
            .map(|_| Block {
                is_free: true,
                ..Block::default()
            })
            .collect();
        let free = (0..num_blocks).rev().map(BlockId).collect();
        Pool { blocks, free }
    }

    pub fn get(&self, id: BlockId) -> &Block {
        &self.blocks[id.index()]
    }

    pub fn get_mut(&mut self, id: BlockId) -> &mut Block {
        &mut self.blocks[id.index()]
    }

    pub fn num_free(&self) -> u32 {
        self.free.len() as u32
    }

    /// Pop a free block and give it one reference.
    pub fn take_free(&mut self) -> Option<BlockId> {
        let id = self.free.pop()?;
        let block = self.get_mut(id);
        debug_assert!(block.is_free && block.ref_count == 0 && block.published.is_none());
        block.is_free = false;
        block.ref_count = 1;
        Some(id)
    }

    /// Reset a block (unreferenced, unpublished, no holders) and push it on the free stack.
    pub fn put_free(&mut self, id: BlockId) {
        let block = self.get_mut(id);
        debug_assert!(
            block.ref_count == 0 && block.published.is_none() && block.holders.is_empty()
        );
        *block = Block {
            is_free: true,
            ..Block::default()
        };
        self.free.push(id);
    }
}
