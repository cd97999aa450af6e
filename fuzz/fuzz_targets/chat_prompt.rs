//! Chat messages → prompt tokens on the default model: any message text (split on 0xFF into up
//! to five messages of rotating roles) renders, and the prompt holds exactly the template's
//! turn markers — client text never adds `<|im_start|>` / `<|im_end|>` (issue #13, F7).
#![no_main]
use libfuzzer_sys::fuzz_target;
use frontend::chat::ChatMessage;

#[path = "common.rs"]
mod common;

const ROLES: [&str; 5] = ["system", "user", "assistant", "tool", "user"];

fuzz_target!(|data: &[u8]| {
    let f = common::frontend();
    let msgs: Vec<ChatMessage> = data
        .split(|&b| b == 0xFF)
        .take(5)
        .enumerate()
        .map(|(i, part)| ChatMessage::new(ROLES[i], String::from_utf8_lossy(part)))
        .collect();
    let ids = match f.encode_chat(&msgs, None, true) {
        Ok(ids) => ids,
        Err(frontend::chat_prompt::ChatPromptError::Template(_)) => return,
        Err(e) => panic!("{e}"),
    };
    let tok = &f.tokenizer;
    let count = |t: &str| {
        let id = tok.token_to_id(t).expect("ChatML token");
        ids.iter().filter(|&&x| x == id).count()
    };
    // One turn per message (the template adds no system turn: the first message is one) plus
    // the generation prompt.
    assert_eq!(count("<|im_start|>"), msgs.len() + 1, "{msgs:?}");
    assert_eq!(count("<|im_end|>"), msgs.len(), "{msgs:?}");
    assert_eq!(count("<|endoftext|>"), 0, "{msgs:?}");
});
