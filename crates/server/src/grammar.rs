//! Constrained decoding with `llguidance` over the model's own tokenizer: a JSON Schema, regular
//! expression, list of choices or Lark grammar is
//! compiled once per request into a token parser, and each sequence of the request (each of `n`
//! choices) gets its own copy as a [`frontend::TokenConstraint`]. The sampler asks it for the token
//! mask at every step of that sequence only; unconstrained requests never touch it, and nothing
//! here enters a cache key (the prompt, not the constraint, decides what is cached).

use std::sync::{Arc, Mutex};

use frontend::{ConstraintError, ConstraintFactory, ConstraintSpec, Frontend, TokenConstraint};
use llguidance::api::TopLevelGrammar;
use llguidance::toktrie::{self, TokEnv, TokRxInfo, TokTrie, TokenizerEnv};
use llguidance::{Matcher, ParserFactory, TokenParser};

pub use crate::constraint_limits::GrammarError;
use crate::constraint_limits::{self, OutputFormat};

/// The model's vocabulary as llguidance sees it: each token's bytes (special tokens behind
/// toktrie's marker byte, so text never matches them) and the end-of-turn token as EOS.
struct ModelTokEnv {
    frontend: Arc<Frontend>,
    trie: TokTrie,
}

impl TokenizerEnv for ModelTokEnv {
    fn tok_trie(&self) -> &TokTrie {
        &self.trie
    }

    fn tokenize_bytes(&self, s: &[u8]) -> Vec<toktrie::TokenId> {
        let text = String::from_utf8_lossy(s);
        self.frontend
            .tokenizer
            .encode(&text, false, false)
            .unwrap_or_default()
    }
}

/// Compiles grammars for one model. Built once, on the first constrained request.
pub struct Grammars {
    factory: Arc<ParserFactory>,
}

impl Grammars {
    pub fn new(frontend: Arc<Frontend>) -> Result<Grammars, GrammarError> {
        let tok = &frontend.tokenizer;
        let eos = tok
            .eot_ids()
            .first()
            .copied()
            .or_else(|| tok.eos_id())
            .ok_or_else(|| GrammarError::Invalid("the model has no end-of-turn token".into()))?;
        let words: Vec<Vec<u8>> = (0..tok.vocab_size() as u32)
            .map(|id| {
                let bytes = tok.token_bytes(id).unwrap_or_default();
                if tok.is_special(id) {
                    let mut w = vec![TokTrie::SPECIAL_TOKEN_MARKER];
                    w.extend_from_slice(tok.token_text(id).unwrap_or_default().as_bytes());
                    w
                } else {
                    bytes
                }
            })
            .collect();
        let info = TokRxInfo::new(words.len() as u32, eos);
        let trie = TokTrie::from(&info, &words);
        let env: TokEnv = Arc::new(ModelTokEnv { frontend, trie });
        let mut factory =
            ParserFactory::new_simple(&env).map_err(|e| GrammarError::Invalid(e.to_string()))?;
        factory.set_stderr_log_level(0);
        *factory.limits_mut() = constraint_limits::parser_limits();
        Ok(Grammars {
            factory: Arc::new(factory),
        })
    }

    /// A constraint to JSON matching `schema` (compact: `", "` and `": "` separators, no other
    /// whitespace), or the reason the schema is not usable.
    pub fn json_schema(&self, schema: &serde_json::Value) -> Result<ConstraintSpec, GrammarError> {
        self.compile(&OutputFormat::Json(schema.clone()))
    }

    /// A constraint for a structured-output format (JSON as in [`Grammars::json_schema`]).
    /// Checked against the compile limits first (`constraint_limits.rs`), then compiled on a
    /// thread of its own (a deep stack, panics caught), and refused when it allows no output.
    pub fn compile(&self, format: &OutputFormat) -> Result<ConstraintSpec, GrammarError> {
        constraint_limits::check(format)?;
        let grammar = match format {
            OutputFormat::Json(schema) => TopLevelGrammar::from_json_schema(compact_json(schema)),
            OutputFormat::Regex(rx) => TopLevelGrammar::from_regex(rx),
            OutputFormat::Choice(choices) => {
                let alts: Vec<String> = choices
                    .iter()
                    .map(|c| serde_json::Value::from(c.as_str()).to_string())
                    .collect();
                TopLevelGrammar::from_lark(format!("start: {}", alts.join(" | ")))
            }
            OutputFormat::Lark(g) => TopLevelGrammar::from_lark(g.clone()),
        };
        let factory = Arc::clone(&self.factory);
        let parser = constraint_limits::isolated(move || build(&factory, grammar))?;
        Ok(ConstraintSpec(Arc::new(CompiledGrammar {
            parser: Mutex::new(parser),
        })))
    }
}

/// Compiles `grammar` and checks that it allows some first token (a constraint that can write
/// nothing — an empty regex class, a `$ref` loop — is the client's error, found here instead of
/// at the first step).
fn build(factory: &ParserFactory, grammar: TopLevelGrammar) -> Result<TokenParser, GrammarError> {
    let parser = factory
        .create_parser(grammar)
        .map_err(|e| GrammarError::Invalid(e.to_string()))?;
    let mut probe = Matcher::new(Ok(parser.deep_clone()));
    match probe.compute_mask() {
        Ok(mask) if !mask.is_zero() => Ok(parser),
        Ok(_) => Err(GrammarError::Invalid(
            "the constraint allows no output (no first token can match it)".into(),
        )),
        Err(e) => Err(GrammarError::Invalid(format!(
            "the constraint cannot start: {e}"
        ))),
    }
}

/// The schema with llguidance's options for compact JSON (no free whitespace, which a small
/// model can repeat until `max_tokens`), `oneOf` read as `anyOf`.
fn compact_json(schema: &serde_json::Value) -> serde_json::Value {
    let mut schema = schema.clone();
    if let Some(obj) = schema.as_object_mut() {
        obj.insert(
            "x-guidance".into(),
            serde_json::json!({"whitespace_flexible": false, "item_separator": ", ",
                               "key_separator": ": ", "coerce_one_of": true}),
        );
    }
    schema
}

/// A compiled grammar; each sequence starts from a deep copy.
struct CompiledGrammar {
    parser: Mutex<TokenParser>,
}

impl ConstraintFactory for CompiledGrammar {
    fn start(&self) -> Box<dyn TokenConstraint> {
        let parser = match self.parser.lock() {
            Ok(p) => p.deep_clone(),
            Err(poisoned) => poisoned.into_inner().deep_clone(),
        };
        Box::new(GrammarState {
            matcher: Matcher::new(Ok(parser)),
            prepared: None,
        })
    }

    fn describe(&self) -> String {
        "llguidance grammar".into()
    }
}

struct GrammarState {
    matcher: Matcher,
    /// The mask for the next token, computed by `prepare` (alongside the forward pass).
    prepared: Option<Result<toktrie::SimpleVob, ()>>,
}

/// Sets every logit whose bit is clear in `words` (bit `id % 32` of word `id / 32`; ids at or past
/// `len` are disallowed) to `-inf`, a 32-token word at a time: most words of a grammar's mask are
/// all clear or all set.
fn apply_mask(words: &[u32], len: usize, logits: &mut [f32]) {
    for (w, chunk) in logits.chunks_mut(32).enumerate() {
        let base = w * 32;
        let mut bits = words.get(w).copied().unwrap_or(0);
        if base + 32 > len {
            bits &= if len <= base {
                0
            } else {
                (1u32 << (len - base)) - 1
            };
        }
        match bits {
            0 => chunk.fill(f32::NEG_INFINITY),
            u32::MAX => {}
            _ => {
                for (b, l) in chunk.iter_mut().enumerate() {
                    if bits & (1 << b) == 0 {
                        *l = f32::NEG_INFINITY;
                    }
                }
            }
        }
    }
}

impl TokenConstraint for GrammarState {
    fn prepare(&mut self) {
        self.prepared = Some(self.matcher.compute_mask_or_eos().map_err(|_| ()));
    }

    fn mask_logits(&mut self, logits: &mut [f32]) -> Result<(), ConstraintError> {
        let mask = match self.prepared.take() {
            Some(m) => m,
            None => self.matcher.compute_mask_or_eos().map_err(|_| ()),
        };
        match mask {
            Ok(mask) if !mask.is_zero() => {
                apply_mask(mask.as_slice(), mask.len(), logits);
                Ok(())
            }
            // The grammar dead-ends here, or the matcher failed (a token it did not allow, a
            // step over the lexer's limits): the request ends with the reason, never with a
            // token the constraint did not allow.
            Ok(_) => Err(ConstraintError(
                "the constraint allows no next token (the grammar dead-ends here)".into(),
            )),
            Err(()) => Err(ConstraintError(
                self.matcher
                    .get_error()
                    .unwrap_or_else(|| "the constraint failed".into()),
            )),
        }
    }

    fn accept(&mut self, id: u32) {
        self.prepared = None;
        // An error leaves the matcher in its error state, which `mask_logits` reports.
        let _ = self.matcher.consume_token(id);
    }
}

#[cfg(test)]
mod tests {
    use super::apply_mask;

    #[test]
    fn word_masks_match_the_bit_by_bit_rule() {
        let words = [0u32, u32::MAX, 0b1010, 0x8000_0001, u32::MAX];
        for len in [0, 31, 64, 70, 96, 140, 160] {
            for n in [1, 33, 100, 150, 170] {
                let mut logits = vec![1.0f32; n];
                apply_mask(&words, len, &mut logits);
                for (id, l) in logits.iter().enumerate() {
                    let allowed = id < len
                        && words
                            .get(id / 32)
                            .is_some_and(|w| w & (1 << (id % 32)) != 0);
                    assert_eq!(*l == 1.0, allowed, "len {len} n {n} id {id}");
                }
            }
        }
    }
}
