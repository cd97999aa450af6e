//! The stored-object format shared by every store (RAM, disk file, Redis value): a fixed 128-byte
//! header carrying the full key, lengths and a BLAKE3 checksum (keyed = HMAC when a secret is
//! configured), the codec id, then the payload (optionally LZ4-compressed). Specified byte by byte
//! in `docs/design/disk-format.md`. Owns encoding and verification; never does I/O.

use crate::key::TierKey;

/// First 8 bytes of every object.
pub const MAGIC: [u8; 8] = *b"AKVBLOCK";
/// Format version written by this code (bytes 8..10).
pub const FORMAT_VERSION: u16 = 1;
/// Size of the fixed header in bytes.
pub const HEADER_BYTES: usize = 128;
/// Longest accepted codec id in bytes.
pub const MAX_CODEC_ID_BYTES: usize = 64;
/// Largest accepted (uncompressed) payload: 1 GiB, far above one block; bounds allocations.
pub const MAX_PAYLOAD_BYTES: u64 = 1 << 30;

const FLAG_LZ4: u8 = 1;
const FLAG_MAC: u8 = 2;
const FLAG_SHUFFLE16: u8 = 4;
const KNOWN_FLAGS: u8 = FLAG_LZ4 | FLAG_MAC | FLAG_SHUFFLE16;

const CHECKSUM_CONTEXT: &str = "agentkv tier object checksum v1";
const MAC_KEY_CONTEXT: &str = "agentkv tier object mac key v1";

// Header field offsets (see docs/design/disk-format.md).
const OFF_VERSION: usize = 8;
const OFF_FLAGS: usize = 10;
const OFF_CODEC_LEN: usize = 11;
const OFF_NUM_TOKENS: usize = 12;
const OFF_NAMESPACE: usize = 16;
const OFF_CHAIN: usize = 48;
const OFF_STORED_LEN: usize = 80;
const OFF_PAYLOAD_LEN: usize = 88;
const OFF_CHECKSUM: usize = 96;

/// Payload compression applied when an object is encoded. Decoding needs no configuration: the
/// object's flags say what was applied.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Deserialize, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Compression {
    /// Payload stored as is.
    #[default]
    None,
    /// LZ4 block compression of the payload.
    Lz4,
    /// Split 2-byte elements (f16/bf16) into a low-byte plane and a high-byte plane, then LZ4.
    /// Only applied to payloads of even length.
    Lz4Shuffle16,
}

/// A 32-byte MAC key derived from a server secret; objects written with it carry a keyed BLAKE3
/// MAC instead of a plain checksum and are rejected by readers without the same secret.
#[derive(Clone)]
pub struct MacKey([u8; 32]);

impl MacKey {
    /// Derive the MAC key from an operator secret of any length.
    pub fn from_secret(secret: &[u8]) -> MacKey {
        MacKey(blake3::derive_key(MAC_KEY_CONTEXT, secret))
    }
}

impl std::fmt::Debug for MacKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("MacKey(…)")
    }
}

/// Metadata + payload of one block as handed to a store.
#[derive(Clone, Copy, Debug)]
pub struct BlockRef<'a> {
    /// Full identity of the block.
    pub key: TierKey,
    /// Tokens held by the block.
    pub num_tokens: u32,
    /// KV codec that produced the payload (e.g. `"f16"`), at most 64 bytes.
    pub codec_id: &'a str,
    /// Serialised K/V bytes; opaque to the tier.
    pub payload: &'a [u8],
}

/// A verified block read back from a store.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StoredBlock {
    /// Tokens held by the block.
    pub num_tokens: u32,
    /// KV codec that produced the payload.
    pub codec_id: String,
    /// The exact payload bytes that were stored.
    pub payload: Vec<u8>,
}

/// Why stored bytes were rejected. Every variant is a miss plus the `corrupt` counter.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Rejection {
    /// Shorter than the header, or total length differs from what the header states.
    Truncated,
    /// Bytes 0..8 are not [`MAGIC`].
    BadMagic,
    /// A version this code cannot read.
    UnsupportedVersion,
    /// Unknown flag bits, or an empty / too long / non-UTF-8 codec id, or lengths out of range.
    BadHeader,
    /// MAC presence differs from this reader's configuration (foreign or unauthenticated writer).
    MacMismatch,
    /// The object belongs to another key (namespace or chain).
    ForeignKey,
    /// Checksum / MAC does not match the bytes.
    BadChecksum,
    /// The compressed payload does not decompress to the stated length.
    BadCompression,
}

/// Parsed fixed header (used by the disk store's directory scan without reading payloads).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Header {
    /// Key stored in the object.
    pub key: TierKey,
    /// Tokens held by the block.
    pub num_tokens: u32,
    /// Total object length in bytes implied by the header.
    pub object_bytes: u64,
}

fn read_u64(bytes: &[u8], off: usize) -> u64 {
    let mut b = [0u8; 8];
    b.copy_from_slice(&bytes[off..off + 8]);
    u64::from_le_bytes(b)
}

fn shuffle16(payload: &[u8]) -> Vec<u8> {
    // [n, 2] -> [2, n]: low bytes first, then high bytes.
    let n = payload.len() / 2;
    let mut out = vec![0u8; payload.len()];
    for (i, pair) in payload.chunks_exact(2).enumerate() {
        out[i] = pair[0];
        out[n + i] = pair[1];
    }
    out
}

fn unshuffle16(planes: &[u8]) -> Vec<u8> {
    let n = planes.len() / 2;
    let mut out = vec![0u8; planes.len()];
    for (i, pair) in out.chunks_exact_mut(2).enumerate() {
        pair[0] = planes[i];
        pair[1] = planes[n + i];
    }
    out
}

fn checksum(mac: Option<&MacKey>, header_prefix: &[u8], codec: &[u8], stored: &[u8]) -> [u8; 32] {
    let mut hasher = match mac {
        Some(key) => blake3::Hasher::new_keyed(&key.0),
        None => blake3::Hasher::new_derive_key(CHECKSUM_CONTEXT),
    };
    hasher.update(header_prefix);
    hasher.update(codec);
    hasher.update(stored);
    *hasher.finalize().as_bytes()
}

/// Check a block before encoding: codec id length and payload size.
pub fn validate(block: &BlockRef<'_>) -> Result<(), crate::TierError> {
    if block.codec_id.is_empty() || block.codec_id.len() > MAX_CODEC_ID_BYTES {
        return Err(crate::TierError::InvalidBlock(format!(
            "codec id must be 1..={MAX_CODEC_ID_BYTES} bytes, got {}",
            block.codec_id.len()
        )));
    }
    if block.payload.len() as u64 > MAX_PAYLOAD_BYTES {
        return Err(crate::TierError::InvalidBlock(format!(
            "payload of {} bytes exceeds {MAX_PAYLOAD_BYTES}",
            block.payload.len()
        )));
    }
    Ok(())
}

/// Encode one block into the stored-object bytes. Compression is kept only if it shrinks the
/// payload. The block must pass [`validate`] (checked again here).
pub fn encode(
    block: &BlockRef<'_>,
    compression: Compression,
    mac: Option<&MacKey>,
) -> Result<Vec<u8>, crate::TierError> {
    validate(block)?;
    let mut flags = 0u8;
    let compressed = match compression {
        Compression::None => None,
        Compression::Lz4 => Some((lz4_flex::block::compress(block.payload), FLAG_LZ4)),
        Compression::Lz4Shuffle16 if block.payload.len() & 1 == 0 => Some((
            lz4_flex::block::compress(&shuffle16(block.payload)),
            FLAG_LZ4 | FLAG_SHUFFLE16,
        )),
        Compression::Lz4Shuffle16 => Some((lz4_flex::block::compress(block.payload), FLAG_LZ4)),
    };
    let stored: &[u8] = match &compressed {
        Some((bytes, f)) if bytes.len() < block.payload.len() => {
            flags |= f;
            bytes
        }
        _ => block.payload,
    };
    if mac.is_some() {
        flags |= FLAG_MAC;
    }
    let codec = block.codec_id.as_bytes();
    let mut out = Vec::with_capacity(HEADER_BYTES + codec.len() + stored.len());
    out.extend_from_slice(&MAGIC);
    out.extend_from_slice(&FORMAT_VERSION.to_le_bytes());
    out.push(flags);
    out.push(codec.len() as u8); // validated: 1..=64
    out.extend_from_slice(&block.num_tokens.to_le_bytes());
    out.extend_from_slice(&block.key.namespace_root);
    out.extend_from_slice(&block.key.chain_key);
    out.extend_from_slice(&(stored.len() as u64).to_le_bytes());
    out.extend_from_slice(&(block.payload.len() as u64).to_le_bytes());
    debug_assert_eq!(out.len(), OFF_CHECKSUM);
    let sum = checksum(mac, &out, codec, stored);
    out.extend_from_slice(&sum);
    out.extend_from_slice(codec);
    out.extend_from_slice(stored);
    Ok(out)
}

/// Parse and sanity-check the fixed header (no checksum verification). `bytes` needs only the
/// first [`HEADER_BYTES`].
pub fn parse_header(bytes: &[u8]) -> Result<Header, Rejection> {
    if bytes.len() < HEADER_BYTES {
        return Err(Rejection::Truncated);
    }
    if bytes[..8] != MAGIC {
        return Err(Rejection::BadMagic);
    }
    if u16::from_le_bytes([bytes[OFF_VERSION], bytes[OFF_VERSION + 1]]) != FORMAT_VERSION {
        return Err(Rejection::UnsupportedVersion);
    }
    let flags = bytes[OFF_FLAGS];
    let codec_len = bytes[OFF_CODEC_LEN] as usize;
    let stored_len = read_u64(bytes, OFF_STORED_LEN);
    let payload_len = read_u64(bytes, OFF_PAYLOAD_LEN);
    let lz4 = flags & FLAG_LZ4 != 0;
    let header_ok = flags & !KNOWN_FLAGS == 0
        && (flags & FLAG_SHUFFLE16 == 0 || lz4)
        && (1..=MAX_CODEC_ID_BYTES).contains(&codec_len)
        && payload_len <= MAX_PAYLOAD_BYTES
        && (if lz4 {
            stored_len < payload_len
        } else {
            stored_len == payload_len
        });
    if !header_ok {
        return Err(Rejection::BadHeader);
    }
    let mut namespace_root = [0u8; 32];
    namespace_root.copy_from_slice(&bytes[OFF_NAMESPACE..OFF_NAMESPACE + 32]);
    let mut chain_key = [0u8; 32];
    chain_key.copy_from_slice(&bytes[OFF_CHAIN..OFF_CHAIN + 32]);
    let mut num_tokens = [0u8; 4];
    num_tokens.copy_from_slice(&bytes[OFF_NUM_TOKENS..OFF_NUM_TOKENS + 4]);
    Ok(Header {
        key: TierKey::new(namespace_root, chain_key),
        num_tokens: u32::from_le_bytes(num_tokens),
        object_bytes: (HEADER_BYTES + codec_len) as u64 + stored_len,
    })
}

/// Verify `bytes` as the object for `expected` and return its block. Any mismatch is a
/// [`Rejection`]; nothing unverified is ever returned.
pub fn decode(
    expected: &TierKey,
    bytes: &[u8],
    mac: Option<&MacKey>,
) -> Result<StoredBlock, Rejection> {
    let header = parse_header(bytes)?;
    if header.object_bytes != bytes.len() as u64 {
        return Err(Rejection::Truncated);
    }
    let flags = bytes[OFF_FLAGS];
    if (flags & FLAG_MAC != 0) != mac.is_some() {
        return Err(Rejection::MacMismatch);
    }
    // Constant-time comparison of the full key (blake3::Hash implements it).
    let same_ns = blake3::Hash::from_bytes(header.key.namespace_root)
        == blake3::Hash::from_bytes(expected.namespace_root);
    let same_chain = blake3::Hash::from_bytes(header.key.chain_key)
        == blake3::Hash::from_bytes(expected.chain_key);
    if !(same_ns && same_chain) {
        return Err(Rejection::ForeignKey);
    }
    let codec_len = bytes[OFF_CODEC_LEN] as usize;
    let codec = &bytes[HEADER_BYTES..HEADER_BYTES + codec_len];
    let stored = &bytes[HEADER_BYTES + codec_len..];
    let mut stated = [0u8; 32];
    stated.copy_from_slice(&bytes[OFF_CHECKSUM..OFF_CHECKSUM + 32]);
    let actual = checksum(mac, &bytes[..OFF_CHECKSUM], codec, stored);
    if blake3::Hash::from_bytes(stated) != blake3::Hash::from_bytes(actual) {
        return Err(Rejection::BadChecksum);
    }
    let codec_id = std::str::from_utf8(codec)
        .map_err(|_| Rejection::BadHeader)?
        .to_owned();
    let payload_len = read_u64(bytes, OFF_PAYLOAD_LEN) as usize; // <= MAX_PAYLOAD_BYTES
    let payload = if flags & FLAG_LZ4 != 0 {
        let raw = lz4_flex::block::decompress(stored, payload_len)
            .map_err(|_| Rejection::BadCompression)?;
        if raw.len() != payload_len {
            return Err(Rejection::BadCompression);
        }
        if flags & FLAG_SHUFFLE16 != 0 {
            if raw.len() & 1 != 0 {
                return Err(Rejection::BadCompression);
            }
            unshuffle16(&raw)
        } else {
            raw
        }
    } else {
        stored.to_vec()
    };
    Ok(StoredBlock {
        num_tokens: header.num_tokens,
        codec_id,
        payload,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn block(payload: &[u8]) -> BlockRef<'_> {
        BlockRef {
            key: TierKey::new([7; 32], [9; 32]),
            num_tokens: 16,
            codec_id: "f16",
            payload,
        }
    }

    #[test]
    fn round_trip_every_compression_with_and_without_mac() {
        let payload: Vec<u8> = (0..4096u32).map(|i| (i % 7) as u8).collect();
        let mac = MacKey::from_secret(b"server secret");
        for compression in [
            Compression::None,
            Compression::Lz4,
            Compression::Lz4Shuffle16,
        ] {
            for mac in [None, Some(&mac)] {
                let b = block(&payload);
                let bytes = encode(&b, compression, mac).unwrap();
                let back = decode(&b.key, &bytes, mac).unwrap();
                assert_eq!(back.payload, payload);
                assert_eq!(back.num_tokens, 16);
                assert_eq!(back.codec_id, "f16");
                if compression != Compression::None {
                    assert!(bytes.len() < payload.len(), "repetitive data must compress");
                }
            }
        }
    }

    #[test]
    fn header_layout_is_as_specified() {
        let payload = [1u8, 2, 3];
        let bytes = encode(&block(&payload), Compression::None, None).unwrap();
        assert_eq!(&bytes[0..8], b"AKVBLOCK");
        assert_eq!(&bytes[8..10], &[1, 0]);
        assert_eq!(bytes[10], 0);
        assert_eq!(bytes[11], 3);
        assert_eq!(&bytes[12..16], &16u32.to_le_bytes());
        assert_eq!(&bytes[16..48], &[7; 32]);
        assert_eq!(&bytes[48..80], &[9; 32]);
        assert_eq!(&bytes[80..88], &3u64.to_le_bytes());
        assert_eq!(&bytes[88..96], &3u64.to_le_bytes());
        assert_eq!(&bytes[128..131], b"f16");
        assert_eq!(&bytes[131..], &payload);
        assert_eq!(bytes.len(), 134);
    }

    #[test]
    fn every_single_byte_flip_is_rejected() {
        let payload: Vec<u8> = (0..300u32).map(|i| (i * 31 % 251) as u8).collect();
        let b = block(&payload);
        for compression in [Compression::None, Compression::Lz4Shuffle16] {
            let good = encode(&b, compression, None).unwrap();
            for i in 0..good.len() {
                let mut bad = good.clone();
                bad[i] ^= 0x01;
                assert!(decode(&b.key, &bad, None).is_err(), "flip at {i} accepted");
            }
        }
    }

    #[test]
    fn truncation_extension_foreign_key_and_mac_mismatch_are_rejected() {
        let payload = vec![5u8; 1000];
        let b = block(&payload);
        let good = encode(&b, Compression::None, None).unwrap();
        for len in [0, 10, HEADER_BYTES - 1, HEADER_BYTES, good.len() - 1] {
            assert_eq!(
                decode(&b.key, &good[..len], None),
                Err(Rejection::Truncated)
            );
        }
        let mut longer = good.clone();
        longer.push(0);
        assert_eq!(decode(&b.key, &longer, None), Err(Rejection::Truncated));
        let other = TierKey::new([8; 32], [9; 32]);
        assert_eq!(decode(&other, &good, None), Err(Rejection::ForeignKey));
        let mac = MacKey::from_secret(b"s");
        assert_eq!(
            decode(&b.key, &good, Some(&mac)),
            Err(Rejection::MacMismatch)
        );
        let signed = encode(&b, Compression::None, Some(&mac)).unwrap();
        assert_eq!(decode(&b.key, &signed, None), Err(Rejection::MacMismatch));
        let wrong = MacKey::from_secret(b"t");
        assert_eq!(
            decode(&b.key, &signed, Some(&wrong)),
            Err(Rejection::BadChecksum)
        );
        assert!(decode(&b.key, &signed, Some(&mac)).is_ok());
    }

    #[test]
    fn invalid_blocks_are_typed_errors() {
        let mut b = block(&[]);
        b.codec_id = "";
        assert!(encode(&b, Compression::None, None).is_err());
        let long = "x".repeat(65);
        b.codec_id = &long;
        assert!(encode(&b, Compression::None, None).is_err());
        b.codec_id = "f16";
        assert!(
            encode(&b, Compression::None, None).is_ok(),
            "empty payload is valid"
        );
    }

    #[test]
    fn shuffle_round_trips() {
        let data: Vec<u8> = (0..64u8).collect();
        assert_eq!(unshuffle16(&shuffle16(&data)), data);
    }
}
