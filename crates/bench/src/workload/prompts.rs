//! System prompts shared across agents: one base prompt (preamble + few-shot examples or
//! background, grown to the shape's size) and, for swarms, a few role prompts appended to it.

use rand::Rng;

use super::shape::Shape;
use crate::corpus::{estimate_tokens, Corpus};

#[derive(Clone, Debug)]
pub struct SharedPrompts {
    base: String,
    roles: Vec<String>,
}

impl SharedPrompts {
    pub fn generate<R: Rng>(shape: &Shape, corpus: &Corpus, rng: &mut R) -> Self {
        let mut base = shape.preamble().to_string();
        let mut n = 1;
        while estimate_tokens(&base) < shape.system_tokens {
            base.push_str(&shape.example(corpus, rng, n));
            n += 1;
        }
        let roles = (0..shape.num_roles)
            .map(|r| {
                format!(
                    "Your role: {}. Guidance for this role: {}",
                    shape.role_name(r),
                    corpus.passage(rng, shape.role_tokens)
                )
            })
            .collect();
        SharedPrompts { base, roles }
    }

    /// The system prompt of `agent`: the base, plus its role when the shape has roles.
    pub fn system_prompt_for(&self, agent: u32) -> String {
        if self.roles.is_empty() {
            return self.base.clone();
        }
        let role = &self.roles[agent as usize % self.roles.len()];
        format!("{}{}", self.base, role)
    }
}
