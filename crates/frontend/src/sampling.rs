//! What a request asks of sampling: [`SamplingParams`] (validated) and the structured-output
//! interface ([`TokenConstraint`], made per sequence by a [`ConstraintFactory`] inside a
//! [`ConstraintSpec`]) that the server implements and the model's sampler consults.
//!
//! Owns these hand-off types and their validation only; it never samples and never sees logits
//! outside [`TokenConstraint::mask_logits`].

use std::sync::Arc;

/// Structured output: which tokens may come next for one sequence. Built per sequence by a
/// [`ConstraintSpec`]; consulted by [`Sampler::sample`] at each step of that sequence only, so an
/// unconstrained request never pays for it and never sees it.
pub trait TokenConstraint: Send {
    /// Computes the set of tokens allowed next and keeps it for [`TokenConstraint::mask_logits`].
    /// It depends only on the tokens accepted so far, so the engine calls it on another thread
    /// while the forward pass computes the logits; the default does nothing (the mask is then
    /// computed in `mask_logits`).
    fn prepare(&mut self) {}
    /// Sets the logits of every token that may not come next to `-inf` (`logits` is indexed by
    /// token id; ids beyond the constraint's vocabulary are disallowed), using the prepared set
    /// when there is one. An error when the constraint cannot continue (no token is allowed, or
    /// it failed): the sequence must end with that error, never with an arbitrary token.
    fn mask_logits(&mut self, logits: &mut [f32]) -> Result<(), ConstraintError>;
    /// Advances past the token that was chosen.
    fn accept(&mut self, id: u32);
}

/// Why a constraint cannot continue a sequence (shown to the client: the constraint is theirs).
#[derive(Debug, Clone, thiserror::Error, PartialEq, Eq)]
#[error("{0}")]
pub struct ConstraintError(pub String);

/// Starts a fresh [`TokenConstraint`] for each sequence of a request (each of `n` choices gets
/// its own state).
pub trait ConstraintFactory: Send + Sync {
    fn start(&self) -> Box<dyn TokenConstraint>;
    /// A short description for debugging output.
    fn describe(&self) -> String;
}

/// A request's constraint, shared by its sequences. Equal only to itself (pointer identity).
#[derive(Clone)]
pub struct ConstraintSpec(pub Arc<dyn ConstraintFactory>);

impl std::fmt::Debug for ConstraintSpec {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "ConstraintSpec({})", self.0.describe())
    }
}

impl PartialEq for ConstraintSpec {
    fn eq(&self, other: &Self) -> bool {
        Arc::ptr_eq(&self.0, &other.0)
    }
}

#[derive(Debug, Clone, PartialEq)]
pub struct SamplingParams {
    /// 0 means greedy.
    pub temperature: f32,
    /// 0 disables.
    pub top_k: usize,
    /// 1 disables.
    pub top_p: f32,
    /// 0 disables.
    pub min_p: f32,
    /// 1 disables; >1 discourages tokens seen in the prompt or output.
    pub repetition_penalty: f32,
    /// Subtracted once from every token present in the output.
    pub presence_penalty: f32,
    /// Subtracted per occurrence in the output.
    pub frequency_penalty: f32,
    pub seed: Option<u64>,
    /// Whether each token's logprob is wanted (OpenAI's `logprobs`). Without it, and with no
    /// `top_logprobs`, the sampler skips the log-softmax over the whole vocabulary (a quarter
    /// of a millisecond a token on a 49K vocabulary, for every sequence of a step) and reports
    /// the logprob as NaN, which nothing reads.
    pub logprobs: bool,
    /// How many top alternatives to report with each token (0 = none).
    pub top_logprobs: usize,
    /// `(token id, bias)` added to those logits after the penalties, before choosing
    /// (OpenAI's `logit_bias`, each in [-100, 100]; ids beyond the vocabulary are ignored).
    pub logit_bias: Vec<(u32, f32)>,
    /// Restricts which tokens may come next (applied after `logit_bias`); `None` = free text.
    pub constraint: Option<ConstraintSpec>,
}

impl Default for SamplingParams {
    fn default() -> Self {
        SamplingParams {
            temperature: 0.0,
            top_k: 0,
            top_p: 1.0,
            min_p: 0.0,
            repetition_penalty: 1.0,
            presence_penalty: 0.0,
            frequency_penalty: 0.0,
            seed: None,
            logprobs: false,
            top_logprobs: 0,
            logit_bias: Vec::new(),
            constraint: None,
        }
    }
}

#[derive(Debug, Clone, thiserror::Error, PartialEq)]
pub enum SamplingError {
    #[error("{param} must be {rule}, got {value}")]
    Invalid {
        param: &'static str,
        rule: &'static str,
        value: f64,
    },
}

impl SamplingParams {
    pub fn validate(&self) -> Result<(), SamplingError> {
        let bad = |param, rule, value: f64| Err(SamplingError::Invalid { param, rule, value });
        if !(self.temperature >= 0.0 && self.temperature.is_finite()) {
            return bad(
                "temperature",
                "a finite number >= 0",
                self.temperature as f64,
            );
        }
        if !(self.top_p > 0.0 && self.top_p <= 1.0) {
            return bad("top_p", "in (0, 1]", self.top_p as f64);
        }
        if !(0.0..=1.0).contains(&self.min_p) {
            return bad("min_p", "in [0, 1]", self.min_p as f64);
        }
        if !(self.repetition_penalty > 0.0 && self.repetition_penalty.is_finite()) {
            return bad(
                "repetition_penalty",
                "a finite number > 0",
                self.repetition_penalty as f64,
            );
        }
        if !(-2.0..=2.0).contains(&self.presence_penalty) {
            return bad(
                "presence_penalty",
                "in [-2, 2]",
                self.presence_penalty as f64,
            );
        }
        if !(-2.0..=2.0).contains(&self.frequency_penalty) {
            return bad(
                "frequency_penalty",
                "in [-2, 2]",
                self.frequency_penalty as f64,
            );
        }
        if self.top_logprobs > 20 {
            return bad("top_logprobs", "at most 20", self.top_logprobs as f64);
        }
        if let Some(&(_, b)) = self
            .logit_bias
            .iter()
            .find(|(_, b)| !(-100.0..=100.0).contains(b))
        {
            return bad("logit_bias", "in [-100, 100]", b as f64);
        }
        Ok(())
    }

    pub fn is_greedy(&self) -> bool {
        self.temperature == 0.0 || self.top_k == 1
    }
}
