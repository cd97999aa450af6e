//! How one storage tier holds the active pool's blocks: as they are (the pool's codec, bytes
//! copied), or transcoded to another KV codec — a tier's `codec:` setting, e.g. an f16 pool whose
//! disk tier keeps blocks in `k=int4c,v=int4` at a third of the bytes.
//!
//! Transcoding to another codec is lossy: a block loaded back is close to, not equal to, the one
//! computed. So a lossy tier changes the cache namespace ([`namespace_settings`]): every block of
//! an engine with one is keyed as "may have passed through codec X", never shared with (or served
//! as) the exact blocks of an engine without it, and every tier object names the codec its bytes
//! are in (checked on load). Owns the per-tier codec choice, the encode on demotion and the
//! decode on load (both on the tier threads, never the engine thread); the byte conversion itself
//! is `quant::transcode_rows`. Never does I/O.

use std::borrow::Cow;

use model::kv::KvDtype;
use quant::QuantError;

/// What a tier stores for one block of the pool.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct TierCodec {
    /// Codec id written into every object (and required of every object loaded).
    pub id: String,
    /// Stored bytes of one block.
    pub block_bytes: usize,
    transcode: Option<Transcode>,
}

/// Pool codec → stored codec for blocks of `rows` rows of `head_dim` values.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Transcode {
    pool: KvDtype,
    stored: KvDtype,
    head_dim: usize,
    rows: usize,
}

impl TierCodec {
    /// Blocks stored as the pool holds them (`block_bytes` each, codec `id`): lossless.
    pub fn as_is(id: String, block_bytes: usize) -> TierCodec {
        TierCodec {
            id,
            block_bytes,
            transcode: None,
        }
    }

    /// Blocks of `rows` rows (every layer and KV head of one block) of `head_dim` values,
    /// stored in `stored` instead of the pool's `pool` codec. The same codec is [`as_is`].
    /// Fails when `stored` does not fit the geometry (an `int4c` group must divide the rows of
    /// one head in a block: `block_size`).
    ///
    /// [`as_is`]: TierCodec::as_is
    pub fn new(
        pool: KvDtype,
        stored: KvDtype,
        head_dim: usize,
        block_size: usize,
        rows: usize,
    ) -> Result<TierCodec, QuantError> {
        let pool_bytes = quant::serialized_len(pool, head_dim, rows)?;
        if pool == stored {
            return Ok(TierCodec::as_is(pool.id(), pool_bytes));
        }
        if let Some(tokens) = stored.k.block_tokens() {
            if !block_size.is_multiple_of(tokens) {
                return Err(QuantError::BadChannelTokens { tokens, head_dim });
            }
        }
        Ok(TierCodec {
            id: stored.id(),
            block_bytes: quant::serialized_len(stored, head_dim, rows)?,
            transcode: Some(Transcode {
                pool,
                stored,
                head_dim,
                rows,
            }),
        })
    }

    /// Whether a block loaded back can differ from the one stored (another codec than the
    /// pool's).
    pub fn is_lossy(&self) -> bool {
        self.transcode.is_some()
    }

    /// The bytes to store for one block of the pool (`payload`, pool codec).
    pub fn encode<'a>(&self, payload: &'a [u8]) -> Result<Cow<'a, [u8]>, QuantError> {
        match &self.transcode {
            None => Ok(Cow::Borrowed(payload)),
            Some(t) => {
                quant::transcode_rows(t.pool, t.stored, t.head_dim, t.rows, payload).map(Cow::Owned)
            }
        }
    }

    /// The pool's bytes of one block from what this tier stored (checked length).
    pub fn decode(&self, stored: Vec<u8>) -> Result<Vec<u8>, QuantError> {
        match &self.transcode {
            None => Ok(stored),
            Some(t) => quant::transcode_rows(t.stored, t.pool, t.head_dim, t.rows, &stored),
        }
    }
}

/// The namespace's `kv_settings` for an engine whose tiers use `codecs`: empty when every tier is
/// lossless (keys unchanged: restored blocks equal recomputed ones), else
/// `tier-lossy:` and each lossy codec's id and version (sorted, deduplicated), so blocks that may
/// have been through a lossy tier never share keys with exact ones.
pub(crate) fn namespace_settings(codecs: &[(KvDtype, bool)]) -> Vec<u8> {
    let mut lossy: Vec<String> = codecs
        .iter()
        .filter(|(_, lossy)| *lossy)
        .map(|(c, _)| format!("{}@{}", c.id(), c.version()))
        .collect();
    lossy.sort();
    lossy.dedup();
    if lossy.is_empty() {
        Vec::new()
    } else {
        format!("tier-lossy:{}", lossy.join("|")).into_bytes()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn codecs(s: &str) -> KvDtype {
        KvDtype::parse(s).unwrap()
    }

    #[test]
    fn an_f16_block_stored_as_int4c_is_a_third_of_the_bytes_and_decodes_close() {
        // The default model's block: 30 layers × 3 KV heads × 16 rows of 64 values.
        let rows = 30 * 3 * 16;
        let tc = TierCodec::new(KvDtype::F16, codecs("k=int4c,v=int4"), 64, 16, rows).unwrap();
        assert!(tc.is_lossy());
        assert_eq!(tc.id, "k=int4c-t16,v=int4-g32");
        assert_eq!(tc.block_bytes, rows * (48 + 40));
        // An f16 block with per-channel structure (channel c has its own range).
        let values: Vec<f32> = (0..2 * rows * 64)
            .map(|i| ((i % 64) as f32 - 32.0) * 0.1 + ((i * 7919) % 13) as f32 * 0.01)
            .collect();
        let f16_bytes: Vec<u8> = values
            .iter()
            .flat_map(|x| half::f16::from_f32(*x).to_le_bytes())
            .collect();
        let stored = tc.encode(&f16_bytes).unwrap();
        assert_eq!(stored.len(), tc.block_bytes);
        assert!(stored.len() * 100 / f16_bytes.len() <= 35, "≤ 0.35× f16");
        let back = tc.decode(stored.into_owned()).unwrap();
        assert_eq!(back.len(), f16_bytes.len());
        let worst = back
            .chunks_exact(2)
            .map(|b| half::f16::from_le_bytes([b[0], b[1]]).to_f32())
            .zip(&values)
            .map(|(a, b)| (a - b).abs())
            .fold(0f32, f32::max);
        assert!(worst < 0.2, "{worst}");
        assert!(tc.decode(vec![0; 3]).is_err(), "wrong length");
    }

    #[test]
    fn the_pool_codec_is_stored_as_is_and_leaves_the_namespace_alone() {
        let tc = TierCodec::new(KvDtype::F16, KvDtype::F16, 64, 16, 90 * 16).unwrap();
        assert!(!tc.is_lossy());
        assert_eq!(tc, TierCodec::as_is("f16".into(), 90 * 16 * 256));
        let bytes = vec![5u8; tc.block_bytes];
        assert!(matches!(tc.encode(&bytes), Ok(Cow::Borrowed(_))));
        assert_eq!(namespace_settings(&[(KvDtype::F16, false)]), b"");
        let int8 = codecs("int8");
        let a = namespace_settings(&[(KvDtype::F16, false), (int8, true)]);
        assert_eq!(a, b"tier-lossy:int8-g64@65537");
        assert_eq!(a, namespace_settings(&[(int8, true), (int8, true)]));
        assert_ne!(a, namespace_settings(&[(codecs("k=int4c,v=int4"), true)]));
    }

    #[test]
    fn int4c_groups_must_divide_the_block() {
        assert!(TierCodec::new(KvDtype::F16, codecs("k=int4c,v=int4"), 64, 8, 90 * 8).is_err());
        assert!(TierCodec::new(KvDtype::F16, codecs("k=int4c-t8,v=int4"), 64, 16, 90 * 16).is_ok());
    }
}
