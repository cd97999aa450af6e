//! The plain-data description of a tokenizer ([`TokenizerSpec`]) and the token types of GGUF's
//! `tokenizer.ggml.token_type`. Owns the mapping from GGUF metadata keys to that description;
//! never tokenises.

/// Type of one vocabulary entry (GGUF `tokenizer.ggml.token_type`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TokenType {
    /// Ordinary text token (GGUF 1; also 0 "undefined" and unknown values).
    Normal,
    /// The unknown token (GGUF 2).
    Unknown,
    /// Control token such as `<|im_start|>` (GGUF 3): hidden when skipping special tokens and
    /// only matched in text when `parse_special` is set.
    Control,
    /// User-defined token (GGUF 4): always matched in text, always shown.
    UserDefined,
    /// Unused slot (GGUF 5): never produced by encoding, decodes to nothing.
    Unused,
    /// SentencePiece byte-fallback token `<0xNN>` (GGUF 6).
    Byte,
}

impl TokenType {
    /// Maps a GGUF token-type value.
    pub fn from_gguf(v: i32) -> Self {
        match v {
            2 => Self::Unknown,
            3 => Self::Control,
            4 => Self::UserDefined,
            5 => Self::Unused,
            6 => Self::Byte,
            _ => Self::Normal,
        }
    }
}

/// Everything needed to build a [`super::Tokenizer`], as plain owned data (what the GGUF
/// `tokenizer.*` keys hold). Useful to build small vocabularies by hand in tests.
#[derive(Clone, Debug, Default)]
pub struct TokenizerSpec {
    /// `tokenizer.ggml.model`: `"gpt2"` (byte-level BPE) or `"llama"` (SentencePiece BPE).
    pub model: String,
    /// `tokenizer.ggml.pre` (byte-level BPE only); empty means llama.cpp's "default".
    pub pre: String,
    /// `tokenizer.ggml.tokens`, indexed by token id.
    pub tokens: Vec<String>,
    /// `tokenizer.ggml.token_type` (GGUF values); empty means all normal.
    pub token_types: Vec<i32>,
    /// `tokenizer.ggml.scores` (SentencePiece); empty means all zero.
    pub scores: Vec<f32>,
    /// `tokenizer.ggml.merges` (byte-level BPE), `"left right"`, rank = index.
    pub merges: Vec<String>,
    /// `tokenizer.ggml.bos_token_id`.
    pub bos_id: Option<u32>,
    /// `tokenizer.ggml.eos_token_id`.
    pub eos_id: Option<u32>,
    /// `tokenizer.ggml.unknown_token_id`.
    pub unk_id: Option<u32>,
    /// `tokenizer.ggml.eot_token_id` (end of turn), when the file names one.
    pub eot_id: Option<u32>,
    /// `tokenizer.ggml.eom_token_id` (end of message), when the file names one.
    pub eom_id: Option<u32>,
    /// `tokenizer.ggml.add_bos_token`; default: true for `llama`, false for `gpt2`.
    pub add_bos: Option<bool>,
    /// `tokenizer.ggml.add_eos_token`; default false.
    pub add_eos: Option<bool>,
    /// `tokenizer.ggml.add_space_prefix` (SentencePiece only); default true.
    pub add_space_prefix: Option<bool>,
}

impl TokenizerSpec {
    /// Reads the `tokenizer.*` keys of a GGUF file.
    pub fn from_gguf(meta: &gguf::Metadata) -> Result<Self, super::TokenizerError> {
        use super::TokenizerError::MissingKey;
        let model = meta
            .get_str("tokenizer.ggml.model")
            .ok_or(MissingKey("tokenizer.ggml.model"))?;
        let tokens = meta
            .get_str_array("tokenizer.ggml.tokens")
            .ok_or(MissingKey("tokenizer.ggml.tokens"))?;
        let owned = |v: Option<Vec<&str>>| {
            v.unwrap_or_default()
                .into_iter()
                .map(str::to_string)
                .collect()
        };
        let merges: Vec<String> = owned(meta.get_str_array("tokenizer.ggml.merges"));
        if model == "gpt2" && merges.is_empty() {
            return Err(MissingKey("tokenizer.ggml.merges"));
        }
        Ok(Self {
            model: model.to_string(),
            pre: meta
                .get_str("tokenizer.ggml.pre")
                .unwrap_or_default()
                .to_string(),
            tokens: owned(Some(tokens)),
            token_types: meta
                .get_i32_array("tokenizer.ggml.token_type")
                .unwrap_or_default(),
            scores: meta
                .get_f32_array("tokenizer.ggml.scores")
                .unwrap_or_default(),
            merges,
            bos_id: meta.get_u32("tokenizer.ggml.bos_token_id"),
            eos_id: meta.get_u32("tokenizer.ggml.eos_token_id"),
            unk_id: meta.get_u32("tokenizer.ggml.unknown_token_id"),
            eot_id: meta.get_u32("tokenizer.ggml.eot_token_id"),
            eom_id: meta.get_u32("tokenizer.ggml.eom_token_id"),
            add_bos: meta.get_bool("tokenizer.ggml.add_bos_token"),
            add_eos: meta.get_bool("tokenizer.ggml.add_eos_token"),
            add_space_prefix: meta.get_bool("tokenizer.ggml.add_space_prefix"),
        })
    }
}
