//! Unit tests of the tokenizer on tiny hand-built vocabularies (no model file needed).

use super::*;

/// A byte-level BPE vocab: all 256 byte characters, a few merges, two control tokens.
pub(super) fn tiny_gpt2(pre: &str) -> Tokenizer {
    let mut tokens: Vec<String> = vec!["<|endoftext|>".into(), "<|im_end|>".into()];
    let mut types = vec![3, 3];
    for b in 0..=255u8 {
        tokens.push(unicode::byte_to_char(b).to_string());
        types.push(1);
    }
    let merges = [
        "h e", "l l", "he ll", "hell o", "Ġ w", "Ġw o", "r l", "Ġwo rl", "Ġworl d",
    ];
    for m in merges {
        let t = m.replace(' ', "");
        tokens.push(t);
        types.push(1);
    }
    Tokenizer::from_spec(TokenizerSpec {
        model: "gpt2".into(),
        pre: pre.into(),
        tokens,
        token_types: types,
        merges: merges.iter().map(|s| s.to_string()).collect(),
        bos_id: Some(0),
        eos_id: Some(0),
        add_bos: Some(false),
        ..Default::default()
    })
    .unwrap()
}

#[test]
fn gpt2_merges_by_rank() {
    let t = tiny_gpt2("gpt-2");
    let ids = t.encode("hello world", false, false).unwrap();
    let texts: Vec<&str> = ids.iter().map(|&i| t.token_text(i).unwrap()).collect();
    assert_eq!(texts, ["hello", "Ġworld"]);
    assert_eq!(t.decode(&ids, false).unwrap(), "hello world");
    // Unmerged bytes fall back to single-byte tokens and still round-trip.
    for s in ["héllo 😊 中文\n\n\tx  y", "", " ", "a\r\n"] {
        let ids = t.encode(s, false, false).unwrap();
        assert_eq!(t.decode(&ids, false).unwrap(), s);
    }
}

#[test]
fn special_tokens_parsed_only_when_asked() {
    let t = tiny_gpt2("gpt-2");
    let with = t.encode("hello<|im_end|>", false, true).unwrap();
    assert_eq!(with.last(), Some(&1));
    let without = t.encode("hello<|im_end|>", false, false).unwrap();
    assert!(!without.contains(&1));
    assert_eq!(t.decode(&without, false).unwrap(), "hello<|im_end|>");
    assert_eq!(t.decode(&with, true).unwrap(), "hello");
    assert_eq!(t.decode(&with, false).unwrap(), "hello<|im_end|>");
    assert_eq!(t.eot_ids(), &[0, 1]);
    assert!(t.is_special(1) && !t.is_special(5));
}

#[test]
fn invalid_ids_and_specs_are_errors() {
    let t = tiny_gpt2("gpt-2");
    assert!(matches!(
        t.decode(&[99_999], false),
        Err(TokenizerError::InvalidTokenId { .. })
    ));
    let bad = TokenizerSpec {
        model: "bert".into(),
        tokens: vec!["a".into()],
        ..Default::default()
    };
    assert!(matches!(
        Tokenizer::from_spec(bad),
        Err(TokenizerError::UnsupportedModel(_))
    ));
    let bad = TokenizerSpec {
        model: "gpt2".into(),
        pre: "nope".into(),
        tokens: vec!["a".into()],
        merges: vec![],
        ..Default::default()
    };
    assert!(matches!(
        Tokenizer::from_spec(bad),
        Err(TokenizerError::UnsupportedPreTokenizer(_))
    ));
}

/// A SentencePiece vocab: `<unk> <s> </s>`, 256 byte tokens, pieces with scores.
pub(super) fn tiny_spm() -> Tokenizer {
    let mut tokens: Vec<String> = vec!["<unk>".into(), "<s>".into(), "</s>".into()];
    let mut types = vec![2, 3, 3];
    let mut scores = vec![0.0, 0.0, 0.0];
    for b in 0..=255u8 {
        tokens.push(format!("<0x{b:02X}>"));
        types.push(6);
        scores.push(0.0);
    }
    let pieces = [
        ("▁", -1.0),
        ("h", -2.0),
        ("e", -2.0),
        ("l", -2.0),
        ("o", -2.0),
        ("w", -2.0),
        ("r", -2.0),
        ("d", -2.0),
        ("he", -3.0),
        ("ll", -3.5),
        ("hell", -4.0),
        ("hello", -4.5),
        ("▁hello", -5.0),
        ("▁w", -6.0),
        ("or", -6.0),
        ("▁wor", -7.0),
        ("ld", -7.0),
        ("▁world", -8.0),
        ("▁▁", -9.0),
    ];
    for (p, s) in pieces {
        tokens.push(p.into());
        types.push(1);
        scores.push(s);
    }
    Tokenizer::from_spec(TokenizerSpec {
        model: "llama".into(),
        tokens,
        token_types: types,
        scores,
        bos_id: Some(1),
        eos_id: Some(2),
        unk_id: Some(0),
        ..Default::default()
    })
    .unwrap()
}

#[test]
fn spm_merges_by_score_with_byte_fallback() {
    let t = tiny_spm();
    let ids = t.encode("hello world", true, false).unwrap();
    let texts: Vec<&str> = ids.iter().map(|&i| t.token_text(i).unwrap()).collect();
    assert_eq!(texts, ["<s>", "▁hello", "▁world"]);
    assert_eq!(t.decode(&ids, true).unwrap(), "hello world");
    assert!(t.add_bos());
    // 'é' is not a piece: byte fallback to <0xC3><0xA9>.
    let ids = t.encode("hé", false, false).unwrap();
    let texts: Vec<&str> = ids.iter().map(|&i| t.token_text(i).unwrap()).collect();
    assert_eq!(texts, ["▁", "h", "<0xC3>", "<0xA9>"]);
    for s in ["hé 😊 world", "  hello", "x"] {
        let ids = t.encode(s, false, false).unwrap();
        assert_eq!(t.decode(&ids, false).unwrap(), s, "{ids:?}");
    }
}

#[test]
fn stream_decoder_matches_decode_on_split_characters() {
    for t in [tiny_gpt2("smollm"), tiny_spm()] {
        let text = "ab 😊中文 ü hello\n";
        let ids = t.encode(text, false, false).unwrap();
        let mut d = StreamDecoder::with_skip_special(&t, false);
        let mut out = String::new();
        for &id in &ids {
            let piece = d.push(id);
            assert!(!piece.contains('\u{FFFD}'));
            out.push_str(&piece);
        }
        out.push_str(&d.finish());
        assert_eq!(out, t.decode(&ids, false).unwrap());
        assert_eq!(out, text);
    }
}

#[test]
fn stream_decoder_reports_invalid_ids() {
    let t = tiny_gpt2("gpt-2");
    let mut d = StreamDecoder::new(&t);
    assert!(matches!(
        d.try_push(1_000_000),
        Err(TokenizerError::InvalidTokenId { .. })
    ));
    assert_eq!(d.push(1_000_000), "\u{FFFD}");
    // Control tokens are hidden by default, shown on request.
    assert_eq!(d.push(1), "");
    assert_eq!(
        StreamDecoder::with_skip_special(&t, false).push(1),
        "<|im_end|>"
    );
}
