//! The stored-object format of the disk and Redis tiers. Any bytes: `decode` rejects or returns
//! a block, never panics. And any payload round-trips: `decode(encode(b)) == b` with and
//! without compression and MAC, and a flipped byte is never returned as a valid block.
#![no_main]
use libfuzzer_sys::fuzz_target;
use tier::object::{decode, encode};
use tier::{BlockRef, Compression, MacKey, TierKey};

fuzz_target!(|data: &[u8]| {
    let key = TierKey::new([7; 32], [9; 32]);
    let _ = decode(&key, data, None);
    let mac = MacKey::from_secret(b"fuzz secret");
    let _ = decode(&key, data, Some(&mac));
    let Some((&sel, payload)) = data.split_first() else {
        return;
    };
    let block = BlockRef {
        key,
        num_tokens: u32::from(sel) + 1,
        codec_id: "f16",
        payload,
    };
    let compression = match sel % 3 {
        0 => Compression::None,
        1 => Compression::Lz4,
        _ => Compression::Lz4Shuffle16,
    };
    let m = (sel & 4 != 0).then_some(&mac);
    let Ok(bytes) = encode(&block, compression, m) else {
        return;
    };
    let back = decode(&key, &bytes, m).expect("an encoded block decodes");
    assert_eq!(back.payload, payload);
    assert_eq!(back.num_tokens, block.num_tokens);
    assert_eq!(back.codec_id, "f16");
    // Another key never reads it.
    assert!(decode(&TierKey::new([7; 32], [8; 32]), &bytes, m).is_err());
    // One flipped bit anywhere is rejected.
    let mut bad = bytes.clone();
    let i = usize::from(sel) * 7919 % bad.len();
    bad[i] ^= 1 << (sel % 8);
    assert!(decode(&key, &bad, m).is_err(), "flipped bit {i} accepted");
});
