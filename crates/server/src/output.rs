//! Engine tokens → response content: collecting a whole (non-streaming) answer per choice, and
//! formatting log-probabilities in the chat and legacy completion shapes. Never talks HTTP.

use std::collections::BTreeMap;

use api::{ChatLogprobs, CompletionLogprobs, TokenLogprob, TopLogprob};
use engine::{FinishReason, TokenEvent};
use frontend::Frontend;

use crate::error::ApiError;
use crate::run::{Running, Step};

/// One finished choice.
#[derive(Debug, Default)]
pub struct ChoiceOut {
    pub text: String,
    pub tokens: Vec<TokenEvent>,
    pub finish_reason: Option<FinishReason>,
}

#[derive(Debug)]
pub struct Collected {
    pub choices: Vec<ChoiceOut>,
    pub usage: api::Usage,
}

/// Runs a request to the end and gathers every choice.
pub async fn collect(r: &mut Running) -> Result<Collected, ApiError> {
    let mut choices: Vec<ChoiceOut> = (0..r.n).map(|_| ChoiceOut::default()).collect();
    loop {
        let step = r
            .next()
            .await?
            .ok_or_else(|| ApiError::Internal("request ended without usage".into()))?;
        match step {
            Step::Token(t) => {
                if let Some(c) = choices.get_mut(t.choice as usize) {
                    c.text.push_str(&t.text);
                    c.tokens.push(t);
                }
            }
            Step::Text { choice, text } => {
                if let Some(c) = choices.get_mut(choice as usize) {
                    c.text.push_str(&text);
                }
            }
            Step::Finished { choice, reason } => {
                if let Some(c) = choices.get_mut(choice as usize) {
                    c.finish_reason = Some(reason);
                }
            }
            Step::Done(usage) => return Ok(Collected { choices, usage }),
        }
    }
}

/// A token's text (lossy where it holds part of a character) and its raw bytes.
pub fn token_string(frontend: &Frontend, id: u32) -> (String, Vec<u8>) {
    let bytes = frontend.tokenizer.token_bytes(id).unwrap_or_default();
    (String::from_utf8_lossy(&bytes).into_owned(), bytes)
}

/// `logprobs.content` of chat choices.
pub fn chat_logprobs(frontend: &Frontend, tokens: &[TokenEvent]) -> ChatLogprobs {
    ChatLogprobs {
        content: tokens
            .iter()
            .map(|t| {
                let (token, bytes) = token_string(frontend, t.id);
                TokenLogprob {
                    token,
                    logprob: t.logprob,
                    bytes: Some(bytes),
                    top_logprobs: t
                        .top_logprobs
                        .iter()
                        .map(|&(id, logprob)| {
                            let (token, bytes) = token_string(frontend, id);
                            TopLogprob {
                                token,
                                logprob,
                                bytes: Some(bytes),
                            }
                        })
                        .collect(),
                }
            })
            .collect(),
    }
}

/// Legacy completion logprobs; `text_offset` counts characters from `start_offset`.
pub fn completion_logprobs(
    frontend: &Frontend,
    tokens: &[TokenEvent],
    start_offset: usize,
) -> CompletionLogprobs {
    let mut out = CompletionLogprobs::default();
    let mut offset = start_offset;
    for t in tokens {
        out.tokens.push(token_string(frontend, t.id).0);
        out.token_logprobs.push(t.logprob);
        out.text_offset.push(offset as u64);
        offset += t.text.chars().count();
        let top: BTreeMap<String, f32> = t
            .top_logprobs
            .iter()
            .map(|&(id, lp)| (token_string(frontend, id).0, lp))
            .collect();
        out.top_logprobs.push(top);
    }
    out
}
