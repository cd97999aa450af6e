//! Block identity: the namespace root key and the hash chain of block keys. Owns the exact byte
//! layout that is hashed; never stores blocks or touches the index.
//!
//! Layout (all integers little-endian, every variable-length field length-prefixed with a `u64`):
//! - namespace root = BLAKE3 `derive_key("agentkv kv-cache namespace v1")` over
//!   `len‖model_fingerprint ‖ len‖codec_id ‖ codec_version:u32 ‖ len‖kv_settings ‖ tenant:u32 ‖
//!   len‖tenant_salt ‖ adapter_tag:u8 (0 = none, 1 = some) [‖ len‖adapter_id]`;
//! - block key = BLAKE3 `derive_key("agentkv kv-cache block v1")` over
//!   `parent_key[32] ‖ num_tokens:u64 ‖ token_0:u32 ‖ … ‖ token_{n-1}:u32`, where the parent of the
//!   first block is the namespace root.
//!
//! The two derive-key contexts separate the domains: no block key can equal a namespace root.

use std::fmt;
use std::sync::OnceLock;

use crate::ids::TenantId;

const NAMESPACE_CONTEXT: &str = "agentkv kv-cache namespace v1";
const BLOCK_CONTEXT: &str = "agentkv kv-cache block v1";

/// 256-bit BLAKE3 identity of one full block (or of a namespace root). Equality is constant-time.
#[derive(Clone, Copy)]
pub struct BlockKey(pub [u8; 32]);

impl std::hash::Hash for BlockKey {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        // Consistent with `eq`: equal keys have equal bytes.
        self.0.hash(state);
    }
}

impl PartialEq for BlockKey {
    fn eq(&self, other: &Self) -> bool {
        // blake3::Hash compares in constant time.
        blake3::Hash::from_bytes(self.0) == blake3::Hash::from_bytes(other.0)
    }
}
impl Eq for BlockKey {}

impl fmt::Debug for BlockKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "BlockKey(")?;
        for b in &self.0[..8] {
            write!(f, "{b:02x}")?;
        }
        write!(f, "…)")
    }
}

impl BlockKey {
    /// Key of the block holding `tokens`, chained on `parent` (the previous block's key, or the
    /// namespace root for the first block).
    pub fn chain(parent: &BlockKey, tokens: &[u32]) -> BlockKey {
        // The derive-key context is hashed once; each call clones the prepared hasher.
        static PREPARED: OnceLock<blake3::Hasher> = OnceLock::new();
        let mut hasher = PREPARED
            .get_or_init(|| blake3::Hasher::new_derive_key(BLOCK_CONTEXT))
            .clone();
        hasher.update(&parent.0);
        hasher.update(&(tokens.len() as u64).to_le_bytes());
        // Feed tokens in 64-token batches to avoid one tiny update per token.
        let mut buf = [0u8; 256];
        for batch in tokens.chunks(64) {
            for (dst, token) in buf.chunks_exact_mut(4).zip(batch) {
                dst.copy_from_slice(&token.to_le_bytes());
            }
            hasher.update(&buf[..batch.len() * 4]);
        }
        BlockKey(*hasher.finalize().as_bytes())
    }
}

/// Everything that changes the K/V of a token sequence, plus the tenant boundary. Two requests
/// share cached blocks only if every field is equal.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Namespace {
    /// Fingerprint of the model weights (e.g. a hash of the GGUF tensor data).
    pub model_fingerprint: [u8; 32],
    /// KV codec name (`"f16"`, `"int8"`, …).
    pub codec_id: String,
    /// Version of the codec's byte layout / rounding.
    pub codec_version: u32,
    /// Other settings that change K/V: RoPE scaling, context settings, attention mode (free form).
    pub kv_settings: Vec<u8>,
    /// Tenant owning the blocks (counters and quotas are kept per tenant).
    pub tenant: TenantId,
    /// Server-side secret salt of the tenant; a client never chooses it.
    pub tenant_salt: Vec<u8>,
    /// LoRA / adapter identity, if any.
    pub adapter_id: Option<String>,
}

/// The hashed root of a namespace plus its tenant: what every cache operation takes.
/// Only [`Namespace::key`] builds one.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct NamespaceKey {
    root: BlockKey,
    tenant: TenantId,
}

impl NamespaceKey {
    /// The root key every chain of this namespace starts from.
    pub fn root(&self) -> BlockKey {
        self.root
    }
    /// The tenant of this namespace.
    pub fn tenant(&self) -> TenantId {
        self.tenant
    }
}

fn put_bytes(hasher: &mut blake3::Hasher, bytes: &[u8]) {
    hasher.update(&(bytes.len() as u64).to_le_bytes());
    hasher.update(bytes);
}

impl Namespace {
    /// Hash every field (length-prefixed, domain-separated) into the namespace root.
    pub fn key(&self) -> NamespaceKey {
        let mut hasher = blake3::Hasher::new_derive_key(NAMESPACE_CONTEXT);
        put_bytes(&mut hasher, &self.model_fingerprint);
        put_bytes(&mut hasher, self.codec_id.as_bytes());
        hasher.update(&self.codec_version.to_le_bytes());
        put_bytes(&mut hasher, &self.kv_settings);
        hasher.update(&self.tenant.0.to_le_bytes());
        put_bytes(&mut hasher, &self.tenant_salt);
        match &self.adapter_id {
            None => {
                hasher.update(&[0u8]);
            }
            Some(adapter) => {
                hasher.update(&[1u8]);
                put_bytes(&mut hasher, adapter.as_bytes());
            }
        }
        NamespaceKey {
            root: BlockKey(*hasher.finalize().as_bytes()),
            tenant: self.tenant,
        }
    }

    /// A namespace for tests, simulations and examples: fixed model/codec, the given tenant with
    /// a salt derived from its id.
    pub fn for_tenant(tenant: TenantId) -> Namespace {
        Namespace {
            model_fingerprint: [0u8; 32],
            codec_id: "f16".to_string(),
            codec_version: 1,
            kv_settings: Vec::new(),
            tenant,
            tenant_salt: tenant.0.to_le_bytes().to_vec(),
            adapter_id: None,
        }
    }
}

/// Keys of the first `num_blocks` full blocks of `tokens` in `ns`, computed along the chain.
pub fn chain_keys(
    ns: &NamespaceKey,
    tokens: &[u32],
    block_size: usize,
    num_blocks: usize,
) -> Vec<BlockKey> {
    let mut keys = Vec::with_capacity(num_blocks);
    let mut parent = ns.root;
    for chunk in tokens.chunks_exact(block_size).take(num_blocks) {
        let key = BlockKey::chain(&parent, chunk);
        keys.push(key);
        parent = key;
    }
    keys
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_namespace_field_changes_the_root() {
        let base = Namespace::for_tenant(TenantId(1));
        let root = base.key().root();
        let mut variants = Vec::new();
        let mut v = base.clone();
        v.model_fingerprint[31] ^= 1;
        variants.push(v);
        let mut v = base.clone();
        v.codec_id = "int8".into();
        variants.push(v);
        let mut v = base.clone();
        v.codec_version = 2;
        variants.push(v);
        let mut v = base.clone();
        v.kv_settings = vec![1];
        variants.push(v);
        let mut v = base.clone();
        v.tenant = TenantId(2);
        variants.push(v);
        let mut v = base.clone();
        v.tenant_salt.push(0);
        variants.push(v);
        let mut v = base.clone();
        v.adapter_id = Some(String::new());
        variants.push(v);
        for v in variants {
            assert_ne!(v.key().root(), root, "{v:?}");
        }
        assert_eq!(
            base.clone().key(),
            base.key(),
            "positive control: same fields, same root"
        );
    }

    #[test]
    fn length_prefix_prevents_field_shifting() {
        let mut a = Namespace::for_tenant(TenantId(1));
        a.codec_id = "ab".into();
        a.kv_settings = b"c".to_vec();
        let mut b = a.clone();
        b.codec_id = "a".into();
        b.kv_settings = b"bc".to_vec();
        assert_ne!(a.key().root(), b.key().root());
    }

    #[test]
    fn block_key_matches_the_documented_layout() {
        let root = Namespace::for_tenant(TenantId(0)).key().root();
        let tokens: Vec<u32> = (0..100).map(|i| i * 7919).collect();
        let mut h = blake3::Hasher::new_derive_key(BLOCK_CONTEXT);
        h.update(&root.0);
        h.update(&100u64.to_le_bytes());
        for t in &tokens {
            h.update(&t.to_le_bytes());
        }
        assert_eq!(BlockKey::chain(&root, &tokens).0, *h.finalize().as_bytes());
    }

    #[test]
    fn block_key_depends_on_parent_tokens_and_length() {
        let root = Namespace::for_tenant(TenantId(0)).key().root();
        let k = BlockKey::chain(&root, &[1, 2, 3]);
        assert_eq!(k, BlockKey::chain(&root, &[1, 2, 3]));
        assert_ne!(k, BlockKey::chain(&root, &[1, 2, 4]));
        assert_ne!(k, BlockKey::chain(&root, &[1, 2]));
        assert_ne!(k, BlockKey::chain(&k, &[1, 2, 3]));
        assert_ne!(k, root);
    }
}
