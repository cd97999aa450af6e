//! [`Frontend`]: what turns requests into token ids and tokens back into text — the tokenizer,
//! the chat template and the context length — without the weights. A server holds this (the model
//! crate's `Model` makes one from a GGUF file) and never the model itself.
//!
//! Owns nothing but that hand-off; it never runs the model.

use crate::chat::{ChatMessage, ChatTemplate};
use crate::chat_prompt::ChatPromptError;
use crate::tokenizer::Tokenizer;

pub struct Frontend {
    pub tokenizer: Tokenizer,
    /// `None` when the file has no chat template (see [`Frontend::chat_template_or_fallback`]).
    pub chat_template: Option<ChatTemplate>,
    fallback_template: ChatTemplate,
    /// Most tokens (prompt plus generated) one sequence may hold.
    pub context_length: usize,
}

impl Frontend {
    pub fn new(
        tokenizer: Tokenizer,
        chat_template: Option<ChatTemplate>,
        context_length: usize,
    ) -> Frontend {
        Frontend {
            fallback_template: ChatTemplate::fallback_for(&tokenizer),
            tokenizer,
            chat_template,
            context_length,
        }
    }

    /// The chat template of the file, or the fallback (Gemma's turn format for a Gemma
    /// vocabulary, else ChatML).
    pub fn chat_template_or_fallback(&self) -> &ChatTemplate {
        self.chat_template
            .as_ref()
            .unwrap_or(&self.fallback_template)
    }

    /// Prompt token ids of a conversation rendered with
    /// [`Frontend::chat_template_or_fallback`]: the template's markup yields special tokens,
    /// client text never does ([`crate::chat_prompt`]).
    pub fn encode_chat(
        &self,
        messages: &[ChatMessage],
        tools: Option<&serde_json::Value>,
        add_generation_prompt: bool,
    ) -> Result<Vec<u32>, ChatPromptError> {
        crate::chat_prompt::encode_chat(
            self.chat_template_or_fallback(),
            &self.tokenizer,
            messages,
            tools,
            add_generation_prompt,
        )
    }
}
