//! The prefix index: published block key → block. Owns only the map; never decides visibility
//! (the cache inserts a key only once the block is full and marked written). A std `HashMap` is
//! fine here because the key itself is a 256-bit BLAKE3 value, not a 64-bit hash.

use std::collections::HashMap;

use crate::ids::BlockId;
use crate::key::BlockKey;

#[derive(Debug, Default)]
pub(crate) struct PrefixIndex {
    pub map: HashMap<BlockKey, BlockId>,
}

impl PrefixIndex {
    pub fn get(&self, key: &BlockKey) -> Option<BlockId> {
        self.map.get(key).copied()
    }

    pub fn insert(&mut self, key: BlockKey, id: BlockId) {
        let previous = self.map.insert(key, id);
        debug_assert!(previous.is_none(), "key published twice");
    }

    pub fn remove(&mut self, key: &BlockKey) {
        self.map.remove(key);
    }

    pub fn len(&self) -> usize {
        self.map.len()
    }
}
