//! Tokenizer round trip on the default model: any text encodes and decodes back to itself, and
//! text marked as client text never yields a special token. "Itself" is the text without the
//! bytes the vocabulary has no byte token for (SmolLM2 lacks some: U+0016, the lead byte 0xF2,
//! …); BPE drops them on encoding, as llama.cpp and HF tokenizers do (found by this target), so
//! the expected text is those bytes removed, read as (lossy) UTF-8.
#![no_main]
use std::sync::OnceLock;

use libfuzzer_sys::fuzz_target;

#[path = "common.rs"]
mod common;

/// Bytes that have a single-byte token (all others are dropped by encoding).
fn byte_has_token() -> &'static [bool; 256] {
    static D: OnceLock<[bool; 256]> = OnceLock::new();
    D.get_or_init(|| {
        let tok = &common::frontend().tokenizer;
        let mut d = [false; 256];
        for id in 0..tok.vocab_size() as u32 {
            if tok.is_special(id) {
                continue;
            }
            if let Some([b]) = tok.token_bytes(id).as_deref() {
                d[*b as usize] = true;
            }
        }
        d
    })
}

fuzz_target!(|data: &[u8]| {
    let tok = &common::frontend().tokenizer;
    let text = String::from_utf8_lossy(data);
    let kept: Vec<u8> = text
        .bytes()
        .filter(|&b| byte_has_token()[b as usize])
        .collect();
    let expected = String::from_utf8_lossy(&kept).into_owned();
    let ids = tok.encode(&text, false, false).expect("encode");
    assert_eq!(tok.decode(&ids, false).expect("decode"), expected);
    let plain = tok
        .encode_with_plain_ranges(&text, false, &[0..text.len()])
        .expect("encode");
    assert!(
        plain.iter().all(|&id| !tok.is_special(id)),
        "{text:?} -> {plain:?}"
    );
    assert_eq!(tok.decode(&plain, false).expect("decode"), expected);
    // Parsing special tokens never loses text either.
    let parsed = tok.encode(&text, false, true).expect("encode");
    assert_eq!(tok.decode(&parsed, false).expect("decode"), expected);
});
