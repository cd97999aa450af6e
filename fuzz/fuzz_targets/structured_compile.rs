//! The structured-output compile path on the default model (issue #44): any JSON Schema, regex,
//! choice list, Lark or GBNF grammar a client sends is checked against the compile limits and
//! compiled on its isolated thread, and the result is an `Ok` constraint or a client error —
//! never a panic, an abort or the compiler's own failure (`GrammarError::Failed`, a caught
//! panic, counts as a crash here). A compiled constraint is then driven for a few tokens (the
//! first allowed one each step, or one the input picks): masking never panics, and a step either
//! allows a token or reports a dead end.
//!
//! Input: the first byte picks the kind (schema, regex, choices split on 0xFF, Lark, GBNF), the
//! second how tokens are picked; the rest is the constraint's text.
#![no_main]
use std::sync::{Arc, OnceLock};

use libfuzzer_sys::fuzz_target;
use server::grammar::{GrammarError, Grammars};
use server::structured::OutputFormat;

#[path = "common.rs"]
mod common;

fn grammars() -> &'static Grammars {
    static G: OnceLock<Grammars> = OnceLock::new();
    G.get_or_init(|| {
        let path = model::default_model_path();
        let file = gguf::GgufFile::open(&path).expect("the default model");
        let tok = frontend::tokenizer::Tokenizer::from_gguf(file.metadata()).expect("tokenizer");
        let tpl = frontend::chat::ChatTemplate::from_gguf(file.metadata(), &tok).expect("template");
        Grammars::new(Arc::new(frontend::Frontend::new(tok, tpl, 8192))).expect("grammars")
    })
}

fuzz_target!(|data: &[u8]| {
    let [kind, pick, rest @ ..] = data else {
        return;
    };
    let text = String::from_utf8_lossy(rest).into_owned();
    let format = match kind % 5 {
        0 => match serde_json::from_str::<serde_json::Value>(&text) {
            Ok(v) if v.is_object() => OutputFormat::Json(v),
            _ => return,
        },
        1 => OutputFormat::Regex(text),
        2 => OutputFormat::Choice(
            rest.split(|&b| b == 0xFF)
                .map(|c| String::from_utf8_lossy(c).into_owned())
                .collect(),
        ),
        3 => OutputFormat::Lark(text),
        _ => match server::gbnf::to_lark(&text) {
            Ok(lark) => OutputFormat::Lark(lark),
            Err(_) => return,
        },
    };
    let spec = match grammars().compile(&format) {
        Ok(spec) => spec,
        Err(GrammarError::Invalid(_) | GrammarError::Limit(_)) => return,
        Err(e @ GrammarError::Failed { .. }) => panic!("{e}"),
    };
    let vocab = common::frontend().tokenizer.vocab_size();
    let mut c = spec.0.start();
    let mut logits = vec![0.0f32; vocab];
    for step in 0..6usize {
        logits.iter_mut().for_each(|l| *l = 0.0);
        if c.mask_logits(&mut logits).is_err() {
            return;
        }
        let allowed: Vec<usize> = (0..vocab).filter(|&i| logits[i] == 0.0).collect();
        assert!(!allowed.is_empty(), "a mask with no token must be an error");
        let id = allowed[(*pick as usize + step * 7919) % allowed.len()];
        c.accept(id as u32);
    }
});
