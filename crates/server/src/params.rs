//! Request bodies → engine requests: JSON parsing with OpenAI-style 400s, value validation naming
//! the field, chat rendering and tokenisation, and the tenant's cache salt. Never submits.

use api::{ChatCompletionRequest, CompletionRequest, Prompt, SamplingExtras};
use engine::RequestSpec;
use model::SamplingParams;
use serde::de::DeserializeOwned;

use crate::error::ApiError;
use crate::state::AppState;
use crate::tenants::Tenant;

/// Parses a JSON body; unknown fields are ignored, bad values are a 400.
pub fn parse_json<T: DeserializeOwned>(body: &[u8]) -> Result<T, ApiError> {
    serde_json::from_slice(body).map_err(|e| ApiError::InvalidRequest {
        message: format!("invalid request body: {e}"),
        param: None,
    })
}

/// The generation options common to chat and text completions.
#[derive(Debug, Clone, Default)]
pub struct GenOptions {
    pub max_tokens: Option<u32>,
    pub temperature: Option<f32>,
    pub top_p: Option<f32>,
    pub seed: Option<u64>,
    pub stop: Vec<String>,
    pub n: Option<u32>,
    pub presence_penalty: Option<f32>,
    pub frequency_penalty: Option<f32>,
    /// `None`: no logprobs; `Some(k)`: logprobs with `k` alternatives.
    pub logprobs: Option<u32>,
    pub extra: SamplingExtras,
}

/// A validated request, ready to submit.
#[derive(Debug, Clone)]
pub struct Prepared {
    pub spec: RequestSpec,
    /// Alternatives per token when logprobs were asked.
    pub logprobs: Option<usize>,
}

impl GenOptions {
    pub fn from_chat(r: &ChatCompletionRequest) -> Result<GenOptions, ApiError> {
        let logprobs = match (r.logprobs.unwrap_or(false), r.top_logprobs) {
            (true, k) => Some(k.unwrap_or(0)),
            (false, Some(k)) if k > 0 => {
                return Err(ApiError::invalid(
                    "top_logprobs needs logprobs: true",
                    "top_logprobs",
                ))
            }
            (false, _) => None,
        };
        Ok(GenOptions {
            max_tokens: r.max_completion_tokens.or(r.max_tokens),
            temperature: r.temperature,
            top_p: r.top_p,
            seed: r.seed,
            stop: r.stop.clone().unwrap_or_default(),
            n: r.n,
            presence_penalty: r.presence_penalty,
            frequency_penalty: r.frequency_penalty,
            logprobs,
            extra: r.extra.clone(),
        })
    }

    pub fn from_completion(r: &CompletionRequest) -> GenOptions {
        GenOptions {
            max_tokens: r.max_tokens,
            temperature: r.temperature,
            top_p: r.top_p,
            seed: r.seed,
            stop: r.stop.clone().unwrap_or_default(),
            n: r.n,
            presence_penalty: r.presence_penalty,
            frequency_penalty: r.frequency_penalty,
            logprobs: r.logprobs,
            extra: r.extra.clone(),
        }
    }
}

fn check(ok: bool, param: &str, rule: &str, value: impl std::fmt::Display) -> Result<(), ApiError> {
    if ok {
        Ok(())
    } else {
        Err(ApiError::invalid(
            format!("{param} must be {rule}, got {value}"),
            param,
        ))
    }
}

/// Renders the chat template over `messages` and tokenises the result.
pub fn chat_prompt(state: &AppState, r: &ChatCompletionRequest) -> Result<Vec<u32>, ApiError> {
    if r.messages.is_empty() {
        return Err(ApiError::invalid("messages must not be empty", "messages"));
    }
    render_chat(state, &r.messages, r.tools.as_ref(), true)
}

/// Chat messages → prompt token ids (special tokens in the rendered text are parsed).
pub fn render_chat(
    state: &AppState,
    messages: &[api::ChatMessage],
    tools: Option<&serde_json::Value>,
    add_generation_prompt: bool,
) -> Result<Vec<u32>, ApiError> {
    let msgs: Vec<model::chat::ChatMessage> = messages
        .iter()
        .map(|m| model::chat::ChatMessage {
            role: role_name(m.role).to_string(),
            content: m.content.clone().unwrap_or_default(),
            name: m.name.clone(),
            tool_calls: m.tool_calls.clone(),
            tool_call_id: m.tool_call_id.clone(),
        })
        .collect();
    let text = state
        .model
        .chat_template_or_fallback()
        .render(&msgs, tools, add_generation_prompt)
        .map_err(|e| ApiError::invalid(format!("chat template failed: {e}"), "messages"))?;
    state
        .model
        .tokenizer
        .encode(&text, false, true)
        .map_err(|e| ApiError::Internal(format!("tokenizer: {e}")))
}

fn role_name(r: api::Role) -> &'static str {
    match r {
        api::Role::System | api::Role::Developer => "system",
        api::Role::User => "user",
        api::Role::Assistant => "assistant",
        api::Role::Tool => "tool",
    }
}

/// A text completion's prompt → token ids (one prompt per request).
pub fn completion_prompt(state: &AppState, p: &Prompt) -> Result<Vec<u32>, ApiError> {
    let text = match p {
        Prompt::Text(s) => s.clone(),
        Prompt::Tokens(t) => return Ok(t.clone()),
        Prompt::Texts(v) if v.len() == 1 => v[0].clone(),
        Prompt::TokenBatches(v) if v.len() == 1 => return Ok(v[0].clone()),
        _ => {
            return Err(ApiError::invalid(
                "batched prompts are not supported: send one prompt per request",
                "prompt",
            ))
        }
    };
    state
        .model
        .tokenizer
        .encode(&text, true, false)
        .map_err(|e| ApiError::Internal(format!("tokenizer: {e}")))
}

/// Validates the options against the model and builds the engine request for `tenant`.
pub fn prepare(
    state: &AppState,
    tenant: &Tenant,
    prompt: Vec<u32>,
    o: &GenOptions,
) -> Result<Prepared, ApiError> {
    let context_length = state.model.config.context_length;
    if prompt.is_empty() {
        return Err(ApiError::invalid("the prompt is empty", "prompt"));
    }
    if prompt.len() >= context_length {
        return Err(ApiError::PromptTooLong {
            prompt_tokens: prompt.len(),
            context_length,
        });
    }
    let n = o.n.unwrap_or(1);
    check((1..=16).contains(&n), "n", "between 1 and 16", n)?;
    let temperature = o.temperature.unwrap_or(1.0);
    check(
        (0.0..=2.0).contains(&temperature),
        "temperature",
        "between 0 and 2",
        temperature,
    )?;
    let top_p = o.top_p.unwrap_or(1.0);
    check(top_p > 0.0 && top_p <= 1.0, "top_p", "in (0, 1]", top_p)?;
    let presence = o.presence_penalty.unwrap_or(0.0);
    check(
        (-2.0..=2.0).contains(&presence),
        "presence_penalty",
        "between -2 and 2",
        presence,
    )?;
    let frequency = o.frequency_penalty.unwrap_or(0.0);
    check(
        (-2.0..=2.0).contains(&frequency),
        "frequency_penalty",
        "between -2 and 2",
        frequency,
    )?;
    let top_k = o.extra.top_k.unwrap_or(0);
    check(top_k >= -1, "top_k", "-1, 0 (disabled) or positive", top_k)?;
    let min_p = o.extra.min_p.unwrap_or(0.0);
    check(
        (0.0..=1.0).contains(&min_p),
        "min_p",
        "between 0 and 1",
        min_p,
    )?;
    let rep = o.extra.repetition_penalty.unwrap_or(1.0);
    check(
        rep > 0.0 && rep.is_finite(),
        "repetition_penalty",
        "positive",
        rep,
    )?;
    if let Some(k) = o.logprobs {
        check(k <= 20, "top_logprobs", "between 0 and 20", k)?;
    }
    if let Some(s) = o.stop.iter().find(|s| s.is_empty()) {
        return Err(ApiError::invalid(
            format!("stop strings must not be empty, got {s:?}"),
            "stop",
        ));
    }
    let room = context_length - prompt.len();
    let max_tokens = match o.max_tokens {
        Some(m) => {
            check(m >= 1, "max_tokens", "at least 1", m)?;
            m as usize
        }
        None => state.settings.limits.default_max_tokens.min(room),
    };
    let min_tokens = o.extra.min_tokens.unwrap_or(0) as usize;
    check(
        min_tokens <= max_tokens,
        "min_tokens",
        "at most max_tokens",
        min_tokens,
    )?;
    let sampling = SamplingParams {
        temperature,
        top_k: top_k.max(0) as usize,
        top_p,
        min_p,
        repetition_penalty: rep,
        presence_penalty: presence,
        frequency_penalty: frequency,
        seed: o.seed,
        top_logprobs: o.logprobs.unwrap_or(0) as usize,
    };
    sampling.validate().map_err(|e| ApiError::InvalidRequest {
        message: e.to_string(),
        param: None,
    })?;
    Ok(Prepared {
        spec: RequestSpec {
            sampling,
            min_tokens,
            stop_token_ids: o.extra.stop_token_ids.clone().unwrap_or_default(),
            stop_strings: o.stop.clone(),
            ignore_eos: o.extra.ignore_eos.unwrap_or(false),
            tenant: tenant.id,
            cache_salt: tenant.request_salt(o.extra.cache_salt.as_deref()),
            n: n as usize,
            // Fields this server does not set keep the engine's defaults.
            ..RequestSpec::greedy(prompt, max_tokens)
        },
        logprobs: o.logprobs.map(|k| k as usize),
    })
}
