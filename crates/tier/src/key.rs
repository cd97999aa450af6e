//! Object identity in the tiers: the namespace root plus the chain key of one block, as raw
//! 32-byte arrays (the `cache` crate's `NamespaceKey::root()` and `BlockKey` bytes). Owns the
//! object-name derivation; never hashes tokens or knows what a namespace contains.

use std::fmt;

const NAME_CONTEXT: &str = "agentkv tier object name v1";

/// Full identity of one stored KV block. Both halves are stored inside every object and checked
/// on every read, so two namespaces (models, codecs, tenants) can never read each other's bytes
/// even if an object name collided.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct TierKey {
    /// Root of the namespace (model, codec, kv settings, tenant + salt, adapter).
    pub namespace_root: [u8; 32],
    /// Hash-chain key of the block within that namespace.
    pub chain_key: [u8; 32],
}

impl TierKey {
    /// Key from the two raw 32-byte hashes.
    pub fn new(namespace_root: [u8; 32], chain_key: [u8; 32]) -> TierKey {
        TierKey {
            namespace_root,
            chain_key,
        }
    }

    /// 32-byte BLAKE3 digest of both halves (domain-separated): the object's name on disk and
    /// in Redis. Names are only an address; the full key inside the object is what is trusted.
    pub fn name_digest(&self) -> [u8; 32] {
        let mut hasher = blake3::Hasher::new_derive_key(NAME_CONTEXT);
        hasher.update(&self.namespace_root);
        hasher.update(&self.chain_key);
        *hasher.finalize().as_bytes()
    }

    /// Lower-case hex of [`TierKey::name_digest`] (64 characters).
    pub fn name_hex(&self) -> String {
        hex(&self.name_digest())
    }
}

impl fmt::Debug for TierKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "TierKey(ns {}…, chain {}…)",
            hex(&self.namespace_root[..6]),
            hex(&self.chain_key[..6])
        )
    }
}

/// Lower-case hex of `bytes`.
pub(crate) fn hex(bytes: &[u8]) -> String {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    let mut out = String::with_capacity(bytes.len() * 2);
    for b in bytes {
        out.push(DIGITS[(b >> 4) as usize] as char);
        out.push(DIGITS[(b & 15) as usize] as char);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn name_depends_on_both_halves() {
        let a = TierKey::new([1; 32], [2; 32]);
        let b = TierKey::new([3; 32], [2; 32]);
        let c = TierKey::new([1; 32], [4; 32]);
        assert_ne!(a.name_digest(), b.name_digest());
        assert_ne!(a.name_digest(), c.name_digest());
        assert_eq!(a.name_hex().len(), 64);
        assert_eq!(a.name_hex(), TierKey::new([1; 32], [2; 32]).name_hex());
    }

    #[test]
    fn hex_is_lowercase_two_digits_per_byte() {
        assert_eq!(hex(&[0x00, 0xab, 0x0f]), "00ab0f");
    }
}
