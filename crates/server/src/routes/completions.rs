//! `POST /v1/completions`: legacy text completions, whole and streamed (same chunk shape).

use api::{CompletionChoice, CompletionRequest, CompletionResponse};
use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::State;
use axum::http::HeaderMap;
use axum::response::{IntoResponse, Response};
use axum::Json;

use crate::error::ApiError;
use crate::output::{collect, completion_logprobs};
use crate::params::{completion_prompt, prepare, GenOptions};
use crate::routes::read_generation_request;
use crate::run::{finish_reason_name, submit, Step};
use crate::sse::{self, json};
use crate::state::{unix_now, AppState};
use crate::structured;

pub async fn completions(
    State(state): State<AppState>,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    let (tenant, req, _) =
        read_generation_request(&state, &headers, body, |r: &CompletionRequest| &r.model)?;
    if req.echo.unwrap_or(false) {
        return Err(ApiError::invalid("echo is not supported", "echo"));
    }
    let mut opts = GenOptions::from_completion(&req);
    if let Some(f) = structured::requested(req.response_format.as_ref(), &req.extra)? {
        structured::check_eos_fields(&opts.extra, "structured output")?;
        opts.constraint = Some(structured::constraint(&state, &f)?);
    }
    let prompt = completion_prompt(&state, &req.prompt)?;
    let prepared = prepare(&state, &tenant, prompt, &opts)?;
    let mut running = submit(&state, &tenant, prepared)?;
    let id = format!("cmpl-{}", crate::ids::public_id());
    let created = unix_now();
    let model = state.settings.model_name.clone();
    let response =
        move |choices: Vec<CompletionChoice>, usage: Option<api::Usage>| CompletionResponse {
            id: id.clone(),
            object: "text_completion".into(),
            created,
            model: model.clone(),
            choices,
            usage,
            system_fingerprint: None,
        };
    if req.stream.unwrap_or(false) {
        let include_usage = req
            .stream_options
            .as_ref()
            .and_then(|o| o.include_usage)
            .unwrap_or(false);
        running.prime().await?;
        let st = state.clone();
        let mut offsets = vec![0usize; running.n];
        let on_step = move |r: &crate::run::Running, step: Step| -> Vec<String> {
            let choice = |index: u32, text: String, finish: Option<&str>, logprobs| {
                json(&response(
                    vec![CompletionChoice {
                        index,
                        text,
                        finish_reason: finish.map(str::to_string),
                        logprobs,
                    }],
                    None,
                ))
            };
            match step {
                Step::Token(t) => {
                    let i = t.choice as usize;
                    let lp = r.logprobs.map(|_| {
                        let lp =
                            completion_logprobs(&st.frontend, std::slice::from_ref(&t), offsets[i]);
                        serde_json::to_value(lp).unwrap_or_default()
                    });
                    offsets[i] += t.text.chars().count();
                    if t.text.is_empty() && lp.is_none() {
                        return Vec::new();
                    }
                    vec![choice(t.choice, t.text, None, lp)]
                }
                Step::Text { choice: c, text } if !text.is_empty() => {
                    offsets[c as usize] += text.chars().count();
                    vec![choice(c, text, None, None)]
                }
                Step::Text { .. } => Vec::new(),
                Step::Finished { choice: c, reason } => {
                    vec![choice(
                        c,
                        String::new(),
                        Some(finish_reason_name(reason)),
                        None,
                    )]
                }
                Step::Done(usage) if include_usage => {
                    vec![json(&response(Vec::new(), Some(usage)))]
                }
                Step::Done(_) => Vec::new(),
            }
        };
        return Ok(sse::stream(running, Vec::new(), on_step).into_response());
    }
    let collected = collect(&mut running).await?;
    let choices = collected
        .choices
        .into_iter()
        .enumerate()
        .map(|(i, c)| CompletionChoice {
            index: i as u32,
            logprobs: running.logprobs.map(|_| {
                serde_json::to_value(completion_logprobs(&state.frontend, &c.tokens, 0))
                    .unwrap_or_default()
            }),
            text: c.text,
            finish_reason: c.finish_reason.map(|r| finish_reason_name(r).into()),
        })
        .collect();
    Ok(Json(response(choices, Some(collected.usage))).into_response())
}
