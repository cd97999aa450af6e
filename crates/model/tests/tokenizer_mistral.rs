//! A real vocabulary of an architecture without a real model on PyPI: Mistral 7B v0.3's
//! SentencePiece tokenizer (32768 tokens, byte fallback, the `[INST]` / `[TOOL_CALLS]` control
//! tokens; from the Apache-2.0 `mistral_common` wheel), as llama.cpp's conversion writes it into a
//! GGUF (tests/data/gguf/mistral-v3-vocab.gguf, vocabulary only), against llama-server's
//! `/tokenize` and `/detokenize` on 44 texts — English, code, JSON, CJK, Korean, Cyrillic,
//! Arabic, emoji and rare bytes, whitespace runs, control tokens parsed and as text — with and
//! without BOS (tests/data/mistral_tokenize.jsonl; both written by
//! tests/data/gen_mistral_tokenizer.py).

mod common;

use std::path::PathBuf;

use common::tokenize_mismatches;
use frontend::tokenizer::Tokenizer;
use gguf::GgufFile;

fn tokenizer() -> Tokenizer {
    let path =
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/data/gguf/mistral-v3-vocab.gguf");
    let file = GgufFile::open(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    Tokenizer::from_gguf(file.metadata()).expect("the Mistral v0.3 vocabulary loads")
}

/// llama.cpp's detokenised text of `ids` without the one space SentencePiece's dummy prefix put
/// before the first text piece (after any leading special tokens).
fn without_dummy_prefix(tok: &Tokenizer, ids: &[u32], text: &str) -> String {
    let lead = ids
        .iter()
        .take_while(|&&id| tok.decode(&[id], true).expect("decode").is_empty())
        .count();
    let specials = tok.decode(&ids[..lead], false).expect("decode");
    let rest = &text[specials.len()..];
    format!("{specials}{}", rest.strip_prefix(' ').unwrap_or(rest))
}

#[test]
fn tokenisation_and_detokenisation_match_llama_cpp() {
    let tok = tokenizer();
    // llama-server's `/detokenize` concatenates the pieces as they are; `decode` drops the space
    // SentencePiece's dummy prefix put before the first text piece, so that decoding a prompt
    // gives back its text.
    let (n, wrong) = tokenize_mismatches(
        &tok,
        include_str!("data/mistral_tokenize.jsonl"),
        |ids, text| without_dummy_prefix(&tok, ids, text),
    );
    assert_eq!(n, 44 * 4);
    assert!(wrong.is_empty(), "{} mismatches: {wrong:#?}", wrong.len());
}

#[test]
fn control_tokens_are_special_only_when_parsed() {
    let tok = tokenizer();
    let inst = tok
        .token_to_id("[INST]")
        .expect("[INST] is in the vocabulary");
    assert_eq!(inst, 3);
    let parsed = tok.encode("[INST] hi [/INST]", false, true).unwrap();
    assert_eq!(parsed.first(), Some(&inst));
    let plain = tok.encode("[INST] hi [/INST]", false, false).unwrap();
    assert!(
        !plain.contains(&inst),
        "a client's text never becomes a control token"
    );
}
