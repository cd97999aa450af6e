//! [`KvCodecs`]: the pair of codecs a KV store uses (K and V are chosen separately), with the
//! namespace id/version and the exact bytes per token that the cache and `/metrics` report.
//!
//! Owns only naming and accounting; it never encodes.

use crate::error::QuantError;
use crate::kind::KvCodecKind;
use std::fmt;
use std::str::FromStr;

/// The K codec and the V codec of a KV store.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct KvCodecs {
    pub k: KvCodecKind,
    pub v: KvCodecKind,
}

impl KvCodecs {
    /// f32 K and V.
    pub const F32: KvCodecs = KvCodecs {
        k: KvCodecKind::F32,
        v: KvCodecKind::F32,
    };
    /// f16 K and V (the default, as llama.cpp).
    pub const F16: KvCodecs = KvCodecs {
        k: KvCodecKind::F16,
        v: KvCodecKind::F16,
    };

    /// The same codec for K and V.
    pub fn uniform(kind: KvCodecKind) -> KvCodecs {
        KvCodecs { k: kind, v: kind }
    }

    /// Parses `int8` (both), or `k=int8,v=int4` / `k=int8-g32;v=fp8` (each side as
    /// [`KvCodecKind::parse`]).
    pub fn parse(s: &str) -> Result<KvCodecs, QuantError> {
        let s = s.trim();
        if !s.contains('=') {
            return KvCodecKind::parse(s).map(KvCodecs::uniform);
        }
        let (mut k, mut v) = (None, None);
        for part in s.split([',', ';']) {
            let unknown = || QuantError::UnknownCodec(s.to_string());
            let (side, name) = part.split_once('=').ok_or_else(unknown)?;
            let kind = KvCodecKind::parse(name)?;
            match side.trim().to_ascii_lowercase().as_str() {
                "k" if k.is_none() => k = Some(kind),
                "v" if v.is_none() => v = Some(kind),
                _ => return Err(unknown()),
            }
        }
        match (k, v) {
            (Some(k), Some(v)) => Ok(KvCodecs { k, v }),
            _ => Err(QuantError::UnknownCodec(s.to_string())),
        }
    }

    /// Namespace id: the codec id when K and V agree (`int8-g64`), else `k=<id>,v=<id>`.
    pub fn id(&self) -> String {
        if self.k == self.v {
            self.k.id()
        } else {
            format!("k={},v={}", self.k.id(), self.v.id())
        }
    }

    /// Namespace version: `k.version() << 16 | v.version()`.
    pub fn version(&self) -> u32 {
        (self.k.version() << 16) | (self.v.version() & 0xFFFF)
    }

    /// Checks both codecs against `head_dim`.
    pub fn validate(&self, head_dim: usize) -> Result<(), QuantError> {
        self.k.validate(head_dim)?;
        if self.v.is_block() {
            return Err(QuantError::BlockCodec(
                self.v.id(),
                "per-channel codecs are for K; V stays per token",
            ));
        }
        self.v.validate(head_dim)
    }

    /// Bytes of K and V of one token over all layers and KV heads, scales and offsets included.
    pub fn bytes_per_token(
        &self,
        num_layers: usize,
        num_kv_heads: usize,
        head_dim: usize,
    ) -> usize {
        num_layers
            * num_kv_heads
            * (self.k.bytes_per_row(head_dim) + self.v.bytes_per_row(head_dim))
    }
}

impl fmt::Display for KvCodecs {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.id())
    }
}

impl FromStr for KvCodecs {
    type Err = QuantError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        KvCodecs::parse(s)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parse_id_and_bytes_per_token() {
        let both = KvCodecs::parse("int8").unwrap();
        assert_eq!(both, KvCodecs::uniform(KvCodecKind::Int8 { group: 64 }));
        assert_eq!(both.id(), "int8-g64");
        let mixed = KvCodecs::parse("k=int8, v=int4-g64").unwrap();
        assert_eq!(mixed.id(), "k=int8-g64,v=int4-g64");
        assert_eq!(KvCodecs::parse(&mixed.id()), Ok(mixed));
        assert_eq!(mixed.version(), 0x0001_0002);
        // The default model: 30 layers, 3 KV heads, head_dim 64.
        assert_eq!(
            KvCodecs::uniform(KvCodecKind::F16).bytes_per_token(30, 3, 64),
            23_040
        );
        assert_eq!(mixed.bytes_per_token(30, 3, 64), 90 * (68 + 36));
        for bad in ["k=int8", "k=int8,k=int4", "x=f16,v=f16", "k=f16,v=int9"] {
            assert!(KvCodecs::parse(bad).is_err(), "{bad}");
        }
    }
}
