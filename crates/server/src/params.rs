//! Request bodies → engine requests: JSON parsing with OpenAI-style 400s, value validation naming
//! the field, chat rendering and tokenisation, and the tenant's cache salt. Never submits.

use api::{
    ChatCompletionRequest, CompletionRequest, KnownFields, LogitBias, Prompt, SamplingExtras,
};
use engine::RequestSpec;
use frontend::{ConstraintSpec, SamplingParams};
use serde::de::DeserializeOwned;

use crate::error::ApiError;
use crate::settings::UnknownFields;
use crate::state::AppState;
use crate::tenants::Tenant;
use crate::tool_families;
use crate::tools::{self, ToolPlan};

/// Parses a JSON body (tokenize, detokenize, admin routes); unknown fields are ignored, bad values
/// are a 400. Generation requests go through [`parse_request`].
pub fn parse_json<T: DeserializeOwned>(body: &[u8]) -> Result<T, ApiError> {
    serde_json::from_slice(body).map_err(|e| ApiError::InvalidRequest {
        message: format!("invalid request body: {e}"),
        param: None,
    })
}

/// Fields of the OpenAI (and vLLM) APIs that this server knows of and does not implement: with
/// `UnknownFields::Reject` they get a 400 that says so rather than "unknown".
const NOT_IMPLEMENTED: &[&str] = &[
    "best_of",
    "suffix",
    "functions",
    "function_call",
    "audio",
    "web_search_options",
];

/// Whether an OpenAI field this server ignores (`KnownFields::IGNORED`) may be ignored with
/// this value: only when it asks for nothing the server would have to do differently.
fn ignorable(name: &str, v: &serde_json::Value) -> bool {
    match name {
        "modalities" => v == &serde_json::json!(["text"]),
        "background" => v == &serde_json::Value::Bool(false),
        _ => true,
    }
}

/// Parses a generation request body (`/v1/chat/completions`, `/v1/completions`): not JSON → 400;
/// under `UnknownFields::Reject` a top-level field `T` does not read → 400 naming it (a `null`
/// value counts as absent); a known field of the wrong type or shape → 400 naming it. Also returns
/// the `cache_control` breakpoints inside the prompt ([`crate::breakpoints`]), which it removes
/// before the typed parse.
pub fn parse_request<T: DeserializeOwned + KnownFields>(
    body: &[u8],
    policy: UnknownFields,
) -> Result<(T, Vec<crate::breakpoints::Marked>), ApiError> {
    let mut value: serde_json::Value = parse_json(body)?;
    if !value.is_object() {
        return Err(ApiError::InvalidRequest {
            message: "the request body must be a JSON object".into(),
            param: None,
        });
    }
    let marked = crate::breakpoints::take(&mut value)?;
    // OpenAI's fields that change nothing here: dropped before the typed parse, named in the
    // response's `x-agentkv-ignored-fields` header and the request's log line.
    if let Some(fields) = value.as_object_mut() {
        let mut ignored = Vec::new();
        for &name in T::IGNORED {
            match fields.get(name) {
                Some(v) if v.is_null() => {}
                Some(v) if ignorable(name, v) => ignored.push(name.to_string()),
                Some(v) => {
                    return Err(ApiError::UnsupportedParameter {
                        param: name.into(),
                        message: format!("{name} = {v} is not supported by this server"),
                    })
                }
                None => {}
            }
            if !T::FIELDS.contains(&name) {
                fields.remove(name);
            }
        }
        if !ignored.is_empty() {
            tracing::debug!(fields = ?ignored, "accepted and ignored");
            crate::reqlog::note(|e| e.ignored_fields = ignored);
        }
    }
    let Some(fields) = value.as_object() else {
        return Err(ApiError::InvalidRequest {
            message: "the request body must be a JSON object".into(),
            param: None,
        });
    };
    if policy == UnknownFields::Reject {
        if let Some(name) = fields
            .iter()
            .find(|(name, v)| {
                !v.is_null()
                    && !T::is_known(name)
                    && !crate::router_defaults::is_router_default(name, v)
            })
            .map(|(name, _)| name)
        {
            return Err(if NOT_IMPLEMENTED.contains(&name.as_str()) {
                ApiError::UnsupportedParameter {
                    param: name.clone(),
                    message: format!("{name:?} is not supported by this server"),
                }
            } else {
                ApiError::UnknownParameter {
                    param: name.clone(),
                }
            });
        }
    }
    let req = serde_path_to_error::deserialize::<_, T>(&value).map_err(|e| {
        let param = field_of(e.path()).or_else(|| {
            // The flattened vLLM extras are deserialised from a buffer that loses the path:
            // parse them on their own to find the field.
            serde_path_to_error::deserialize::<_, SamplingExtras>(&value)
                .err()
                .and_then(|e| field_of(e.path()))
                .or_else(|| {
                    serde_path_to_error::deserialize::<_, api::CacheFields>(&value)
                        .err()
                        .and_then(|e| field_of(e.path()))
                })
        });
        let inner = e.into_inner().to_string();
        let param = param.or_else(|| missing_field(&inner));
        let message = match &param {
            Some(p) => format!("invalid value for {p}: {inner}"),
            None => format!("invalid request body: {inner}"),
        };
        ApiError::InvalidRequest { message, param }
    })?;
    Ok((req, marked))
}

/// `messages[0].role` for a path inside the body; `None` at the top level.
fn field_of(path: &serde_path_to_error::Path) -> Option<String> {
    path.iter().next()?;
    Some(path.to_string())
}

/// The field of serde's "missing field `model`".
fn missing_field(message: &str) -> Option<String> {
    let rest = message.strip_prefix("missing field `")?;
    Some(rest.split('`').next()?.to_string())
}

/// 404 `model_not_found` unless `model` is one of the served names.
pub fn check_model(state: &AppState, model: &str) -> Result<(), ApiError> {
    let served = state.settings.served_model_names();
    if served.contains(&model) {
        return Ok(());
    }
    Err(ApiError::ModelNotFound {
        model: model.to_string(),
        served: served.join(", "),
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
    pub logit_bias: Option<LogitBias>,
    /// Structured output or the generic tool mode's grammar.
    pub constraint: Option<ConstraintSpec>,
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
            logit_bias: r.logit_bias.clone(),
            constraint: None,
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
            logit_bias: r.logit_bias.clone(),
            constraint: None,
            extra: r.extra.clone(),
        }
    }
}

/// `{"50256": -100, …}` → `(token id, bias)` sorted by id: ids inside the vocabulary, each once,
/// biases in [-100, 100].
fn logit_bias(bias: &LogitBias, vocab_size: usize) -> Result<Vec<(u32, f32)>, ApiError> {
    let mut out: Vec<(u32, f32)> = Vec::with_capacity(bias.len());
    for (key, &b) in bias {
        let id = match key.parse::<u32>() {
            Ok(id) if (id as usize) < vocab_size => id,
            _ => {
                return Err(ApiError::invalid(
                    format!(
                        "logit_bias keys must be token ids below the vocabulary size \
                         {vocab_size}, got {key:?}"
                    ),
                    "logit_bias",
                ))
            }
        };
        check(
            (-100.0..=100.0).contains(&b),
            "logit_bias",
            "between -100 and 100",
            b,
        )?;
        out.push((id, b));
    }
    out.sort_by_key(|&(id, _)| id);
    if let Some(w) = out.windows(2).find(|w| w[0].0 == w[1].0) {
        return Err(ApiError::invalid(
            format!("logit_bias names token {} twice", w[0].0),
            "logit_bias",
        ));
    }
    Ok(out)
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

/// Renders the chat template over `messages` (with the generic tool mode's plan when the request
/// may call tools; `text_schema` is the structured-output schema of a text answer) and
/// tokenises the result.
pub fn chat_prompt(
    state: &AppState,
    r: &ChatCompletionRequest,
    text_schema: Option<&serde_json::Value>,
) -> Result<(Vec<u32>, Option<ToolPlan>), ApiError> {
    if r.messages.is_empty() {
        return Err(ApiError::invalid("messages must not be empty", "messages"));
    }
    check_message_content(&r.messages)?;
    let plan = tools::plan(
        r,
        text_schema,
        tool_families::model_syntax(&state.frontend),
        (state.settings.limits.max_tool_calls_per_turn)
            .min(r.max_tool_calls.map_or(usize::MAX, |m| m as usize)),
    )?;
    let prompt = render_chat(state, &r.messages, plan.as_ref(), r.tools.as_deref(), true)?;
    Ok((prompt, plan))
}

/// Every message has `content`, except an assistant message that carries tool calls.
fn check_message_content(messages: &[api::ChatMessage]) -> Result<(), ApiError> {
    for (i, m) in messages.iter().enumerate() {
        let calls = m.tool_calls.as_ref().is_some_and(|c| !c.is_empty());
        if m.content.is_none() && !(m.role == api::Role::Assistant && calls) {
            return Err(ApiError::invalid(
                "a message needs content (only an assistant message with tool_calls may omit it)",
                &format!("messages[{i}].content"),
            ));
        }
    }
    Ok(())
}

/// The constraint of a tool plan: a schema llguidance rejects is the client's (400 on `tools`).
pub fn tool_constraint(state: &AppState, plan: &ToolPlan) -> Result<ConstraintSpec, ApiError> {
    let grammars = state.grammars()?;
    match &plan.lark {
        Some(g) => grammars.compile(&crate::structured::OutputFormat::Lark(g.clone())),
        None => grammars.json_schema(&plan.schema),
    }
    .map_err(|e| crate::structured::grammar_error(e, "tools", "the tools' parameters schema"))
}

/// Chat messages → prompt token ids. Only the chat template's own markup yields special tokens:
/// every client-supplied text is tokenised as plain text (`frontend::chat_prompt`), so a message
/// holding `<|im_end|>` cannot end its turn or forge another role. `tools` reach the template
/// when it has a known tool format (`tool_families.rs`).
pub fn render_chat(
    state: &AppState,
    messages: &[api::ChatMessage],
    plan: Option<&ToolPlan>,
    tools: Option<&[api::Tool]>,
    add_generation_prompt: bool,
) -> Result<Vec<u32>, ApiError> {
    let family = tool_families::model_syntax(&state.frontend);
    let (msgs, tools) = tools::template_input(messages, plan, tools, family)?;
    state
        .frontend
        .encode_chat(&msgs, tools.as_ref(), add_generation_prompt)
        .map_err(|e| match e {
            frontend::chat_prompt::ChatPromptError::Tokenizer(e) => {
                ApiError::Internal(format!("tokenizer: {e}"))
            }
            frontend::chat_prompt::ChatPromptError::Template(e) => {
                ApiError::invalid(format!("chat template failed: {e}"), "messages")
            }
            e @ frontend::chat_prompt::ChatPromptError::UntraceableContent { .. } => {
                ApiError::invalid(e.to_string(), "messages")
            }
        })
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
        .frontend
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
    let context_length = state.frontend.context_length;
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
    let max_n = engine::MAX_CHOICES;
    let rule = format!("between 1 and {max_n}");
    check((1..=max_n).contains(&(n as usize)), "n", &rule, n)?;
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
            // Beyond the context it can never be served: a 400 (as OpenAI answers), before the
            // admission bounds could call it an overload.
            if m as usize > room {
                return Err(ApiError::ContextExceeded(format!(
                    "This model's maximum context length is {context_length} tokens. However, \
                     you requested {} tokens ({} in the messages, {m} in the completion). Please \
                     reduce the length of the messages or completion (max_tokens may be at most \
                     {room}).",
                    prompt.len() + m as usize,
                    prompt.len()
                )));
            }
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
    let logit_bias = match &o.logit_bias {
        Some(b) => logit_bias(b, state.frontend.tokenizer.vocab_size())?,
        None => Vec::new(),
    };
    let sampling = SamplingParams {
        temperature,
        top_k: top_k.max(0) as usize,
        top_p,
        min_p,
        repetition_penalty: rep,
        presence_penalty: presence,
        frequency_penalty: frequency,
        seed: o.seed,
        logprobs: o.logprobs.is_some(),
        top_logprobs: o.logprobs.unwrap_or(0) as usize,
        logit_bias,
        constraint: o.constraint.clone(),
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
            priority: tenant.priority,
            // Fields this server does not set keep the engine's defaults.
            ..RequestSpec::greedy(prompt, max_tokens)
        },
        logprobs: o.logprobs.map(|k| k as usize),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn chat(
        v: serde_json::Value,
        policy: UnknownFields,
    ) -> Result<ChatCompletionRequest, ApiError> {
        parse_request(v.to_string().as_bytes(), policy).map(|(r, _)| r)
    }

    fn param(e: ApiError) -> (String, Option<String>) {
        let body = e.body();
        (body.error.param.unwrap_or_default(), body.error.code)
    }

    fn base() -> serde_json::Value {
        serde_json::json!({"model": "m", "messages": [{"role": "user", "content": "hi"}]})
    }

    fn with(field: &str, value: serde_json::Value) -> serde_json::Value {
        let mut b = base();
        b[field] = value;
        b
    }

    #[test]
    fn unknown_fields_are_rejected_naming_them_unless_ignored() {
        use UnknownFields::{Ignore, Reject};
        for (field, value, code) in [
            ("frobnicate", serde_json::json!(1), "unknown_parameter"),
            ("best_of", serde_json::json!(2), "unsupported_parameter"),
            (
                "guided_decoding_backend",
                serde_json::json!("xgrammar"),
                "unknown_parameter",
            ),
            ("functions", serde_json::json!([]), "unsupported_parameter"),
        ] {
            let e = chat(with(field, value.clone()), Reject).unwrap_err();
            assert_eq!(e.status(), 400);
            assert_eq!(param(e), (field.to_string(), Some(code.to_string())));
            assert!(chat(with(field, value), Ignore).is_ok(), "{field}");
        }
        for (field, value) in [
            ("prompt_cache_key", serde_json::json!("k")),
            ("session_id", serde_json::json!("s")),
            ("prompt_cache_retention", serde_json::json!("24h")),
            (
                "cache_control",
                serde_json::json!({"type": "ephemeral", "ttl": "1h"}),
            ),
        ] {
            assert!(chat(with(field, value), Reject).is_ok(), "{field}");
        }
        // OpenAI's fields that change nothing here are accepted in both modes, unless their
        // value asks for something this server does not do.
        for (field, value) in [
            ("metadata", serde_json::json!({"run": "7"})),
            ("store", serde_json::json!(true)),
            ("service_tier", serde_json::json!("auto")),
            ("reasoning_effort", serde_json::json!("low")),
            ("verbosity", serde_json::json!("low")),
            ("modalities", serde_json::json!(["text"])),
        ] {
            assert!(chat(with(field, value.clone()), Reject).is_ok(), "{field}");
            assert!(chat(with(field, value), Ignore).is_ok(), "{field}");
        }
        let e = chat(
            with("modalities", serde_json::json!(["text", "audio"])),
            Reject,
        );
        assert_eq!(
            param(e.unwrap_err()),
            ("modalities".into(), Some("unsupported_parameter".into()))
        );
        // null is "not given".
        assert!(chat(with("frobnicate", serde_json::Value::Null), Reject).is_ok());
        let c: Result<(CompletionRequest, _), _> =
            parse_request(br#"{"model": "m", "prompt": "p", "suffix": "s"}"#, Reject);
        assert_eq!(param(c.unwrap_err()).0, "suffix");
    }

    #[test]
    fn wrong_types_are_rejected_naming_the_field_in_both_modes() {
        for policy in [UnknownFields::Reject, UnknownFields::Ignore] {
            for (field, value, expect) in [
                ("tool_choice", serde_json::json!(12345), "tool_choice"),
                ("tool_choice", serde_json::json!("sometimes"), "tool_choice"),
                (
                    "logit_bias",
                    serde_json::json!({"42": "high"}),
                    "logit_bias.42",
                ),
                ("temperature", serde_json::json!("hot"), "temperature"),
                ("top_k", serde_json::json!("many"), "top_k"),
                ("cache_control", serde_json::json!("yes"), "cache_control"),
                ("prompt_cache_key", serde_json::json!(7), "prompt_cache_key"),
                (
                    "messages",
                    serde_json::json!([{"role": "robot"}]),
                    "messages[0].role",
                ),
            ] {
                let e = chat(with(field, value), policy).unwrap_err();
                assert_eq!(e.status(), 400);
                assert_eq!(param(e).0, expect, "{field}");
            }
            let e = chat(serde_json::json!({"messages": []}), policy).unwrap_err();
            assert_eq!(param(e).0, "model");
            let e = parse_request::<ChatCompletionRequest>(b"[1]", policy).unwrap_err();
            assert_eq!(e.status(), 400);
            let e = parse_request::<ChatCompletionRequest>(b"{nope", policy).unwrap_err();
            assert_eq!(e.status(), 400);
        }
    }

    #[test]
    fn logit_bias_is_parsed_checked_and_sorted() {
        let b = |v: serde_json::Value| logit_bias(&serde_json::from_value(v).unwrap(), 100);
        assert_eq!(
            b(serde_json::json!({"7": 1.5, "3": -100})).unwrap(),
            vec![(3, -100.0), (7, 1.5)]
        );
        for bad in [
            serde_json::json!({"100": 1}),
            serde_json::json!({"x": 1}),
            serde_json::json!({"-1": 1}),
            serde_json::json!({"5": 100.5}),
            serde_json::json!({"5": -101}),
            serde_json::json!({"5": 1, "05": 2}),
        ] {
            let e = b(bad.clone()).unwrap_err();
            assert_eq!(param(e).0, "logit_bias", "{bad}");
        }
    }
}
