//! One submitted request: admission, submission, and reading its engine events as [`Step`]s while
//! recording metrics. Dropping a [`Running`] before it is done cancels the request in the engine
//! (a client that disconnects drops it), so its KV blocks are freed before the next step.

use std::time::{Duration, Instant};

use engine::{EngineEvent, EngineHandle, EventReceiver, FinishReason, RequestId, TokenEvent};

use crate::admission::Permit;
use crate::error::ApiError;
use crate::metrics::FinishedRequest;
use crate::params::Prepared;
use crate::state::AppState;
use crate::tenants::Tenant;

/// What a route sees of a running request.
#[derive(Debug)]
pub enum Step {
    Token(TokenEvent),
    /// Text released at the end of a choice (held back until then).
    Text {
        choice: u32,
        text: String,
    },
    Finished {
        choice: u32,
        reason: FinishReason,
    },
    /// Every choice finished.
    Done(api::Usage),
}

/// Cancels the engine request on drop unless it finished.
struct CancelGuard {
    engine: EngineHandle,
    id: RequestId,
    done: bool,
}

impl Drop for CancelGuard {
    fn drop(&mut self) {
        if !self.done {
            self.engine.cancel(self.id);
        }
    }
}

pub struct Running {
    state: AppState,
    pub id: RequestId,
    /// Alternatives per token when logprobs were asked.
    pub logprobs: Option<usize>,
    pub n: usize,
    rx: EventReceiver,
    guard: CancelGuard,
    _permit: Permit,
    tenant: String,
    /// The request's log line (`reqlog`), kept so that a stream reports at its end.
    log: Option<crate::reqlog::RequestLog>,
    pending: Option<EngineEvent>,
    finished: usize,
    prompt_tokens: usize,
    completion_tokens: usize,
    cached_tokens: usize,
    cache_miss: Option<cache::PrefixMiss>,
    /// The request asked for retention: usage reports what it newly retained.
    retains: bool,
    retained_tokens: usize,
    /// Without explicit retention: what a tool pause retains if the reply ends in tool calls
    /// (`tool_paused`): tenant, salt, prompt, then choice 0's output as it arrives; priority.
    pause: Option<(cache::TenantId, Vec<u8>, Vec<u32>, i32)>,
    last_token_at: Vec<Option<Instant>>,
    ttft: Option<Duration>,
    queue: Duration,
    total: Duration,
    /// Token events taken off the channel, for the engine's stall rule.
    reader: std::sync::Arc<engine::ReadProgress>,
}

/// Admits (429/503 when over the bounds) and submits a validated request.
pub fn submit(state: &AppState, tenant: &Tenant, p: Prepared) -> Result<Running, ApiError> {
    if state.is_shutting_down() {
        return Err(ApiError::ShuttingDown);
    }
    let n = p.spec.n;
    let retains = p.spec.retention.is_some() || !p.spec.breakpoints.is_empty();
    let tokens = p.spec.prompt.len() + p.spec.max_tokens * n;
    let permit = state
        .admission
        .try_admit(tenant.id, tokens)
        .inspect_err(|e| {
            if matches!(
                e,
                ApiError::TenantOverloaded { .. } | ApiError::ServerOverloaded { .. }
            ) {
                state.metrics.observe_rejected(&tenant.name);
            }
        })?;
    let pause = (!retains).then(|| {
        (
            p.spec.tenant,
            p.spec.cache_salt.clone(),
            p.spec.prompt.clone(),
            p.spec.priority,
        )
    });
    // The engine stops decoding a request whose reader falls behind (a client that stopped
    // reading its stream): `next` counts what this side takes off the channel.
    let mut spec = p.spec;
    let reader = std::sync::Arc::new(engine::ReadProgress::default());
    spec.reader = Some(reader.clone());
    let (id, rx) = state.engine.submit(spec).map_err(ApiError::from_engine)?;
    Ok(Running {
        state: state.clone(),
        id,
        logprobs: p.logprobs,
        n,
        rx,
        guard: CancelGuard {
            engine: state.engine.clone(),
            id,
            done: false,
        },
        _permit: permit,
        tenant: tenant.name.clone(),
        log: crate::reqlog::RequestLog::current().inspect(|l| {
            l.update(|e| e.tenant = Some(tenant.name.clone()));
        }),
        pending: None,
        finished: 0,
        prompt_tokens: 0,
        completion_tokens: 0,
        cached_tokens: 0,
        cache_miss: None,
        retains,
        retained_tokens: 0,
        pause,
        last_token_at: vec![None; n],
        ttft: None,
        queue: Duration::ZERO,
        total: Duration::ZERO,
        reader,
    })
}

impl Running {
    /// The reply of choice 0 ended in tool calls: unless the request asked for retention itself,
    /// the engine keeps its blocks for the agent's next call (a TTL from its cost model). Call
    /// it after the choice finished.
    pub fn tool_paused(&self) {
        if let Some((tenant, salt, tokens, priority)) = &self.pause {
            let _ = self
                .state
                .engine
                .tool_pause(*tenant, salt.clone(), tokens.clone(), *priority);
        }
    }

    /// Waits for the first event so that a request the engine refuses gets a proper HTTP error
    /// (used before a stream's headers are sent).
    pub async fn prime(&mut self) -> Result<(), ApiError> {
        match self.recv().await? {
            Some(EngineEvent::Error(e)) => Err(ApiError::from_engine(e)),
            Some(ev) => {
                self.pending = Some(ev);
                Ok(())
            }
            None => Err(self.closed()),
        }
    }

    /// The next engine event, or `ShuttingDown` once the shutdown grace period is over.
    async fn recv(&mut self) -> Result<Option<EngineEvent>, ApiError> {
        let state = self.state.clone();
        tokio::select! {
            biased;
            ev = self.rx.recv() => Ok(ev),
            _ = state.aborted() => Err(ApiError::ShuttingDown),
        }
    }

    fn closed(&self) -> ApiError {
        if self.state.is_shutting_down() {
            ApiError::ShuttingDown
        } else {
            ApiError::Internal("the engine dropped the request".into())
        }
    }

    /// The next step; `Ok(None)` after `Done`.
    pub async fn next(&mut self) -> Result<Option<Step>, ApiError> {
        let r = self.next_step().await;
        if let (Err(e), Some(log)) = (&r, &self.log) {
            let status = e.status().as_u16();
            log.update(|l| l.outcome = Some(format!("error:{status}")));
        }
        r
    }

    async fn next_step(&mut self) -> Result<Option<Step>, ApiError> {
        loop {
            if self.guard.done {
                return Ok(None);
            }
            if self.finished == self.n {
                return Ok(Some(self.finish()));
            }
            let ev = match self.pending.take() {
                Some(ev) => ev,
                None => match self.recv().await? {
                    Some(ev) => ev,
                    None => return Err(self.closed()),
                },
            };
            match ev {
                EngineEvent::Admitted { cached_tokens } => self.cached_tokens = cached_tokens,
                EngineEvent::Token(t) => {
                    self.reader.note_read();
                    if let (Some(p), 0) = (&mut self.pause, t.choice) {
                        p.2.push(t.id);
                    }
                    let now = Instant::now();
                    if let Some(slot) = self.last_token_at.get_mut(t.choice as usize) {
                        if let Some(prev) = slot.replace(now) {
                            self.state.metrics.observe_inter_token(now - prev);
                        }
                    }
                    return Ok(Some(Step::Token(t)));
                }
                EngineEvent::Text { choice, text } => return Ok(Some(Step::Text { choice, text })),
                EngineEvent::Finished {
                    choice,
                    reason,
                    usage,
                    timings,
                    ..
                } => {
                    self.finished += 1;
                    if let Some(log) = &self.log {
                        // The finish reasons of the choices, joined (`stop`, `length,stop`, …).
                        log.update(|e| {
                            let r = finish_reason_name(reason);
                            match &mut e.outcome {
                                Some(o) if !o.split(',').any(|x| x == r) => {
                                    o.push(',');
                                    o.push_str(r);
                                }
                                Some(_) => {}
                                None => e.outcome = Some(r.to_string()),
                            }
                        });
                    }
                    self.prompt_tokens = usage.prompt_tokens;
                    self.cached_tokens = usage.cached_tokens;
                    self.cache_miss = usage.cache_miss;
                    // Choices retain the same session in turn; the largest addition counts.
                    self.retained_tokens = self.retained_tokens.max(usage.retained_tokens);
                    self.completion_tokens += usage.completion_tokens;
                    self.ttft = Some(self.ttft.map_or(timings.ttft, |t| t.min(timings.ttft)));
                    self.queue = timings.queue;
                    self.total = self.total.max(timings.total);
                    return Ok(Some(Step::Finished { choice, reason }));
                }
                EngineEvent::Error(e) => return Err(ApiError::from_engine(e)),
            }
        }
    }

    /// Every choice finished: records the request's metrics and reports its usage.
    fn finish(&mut self) -> Step {
        self.guard.done = true;
        if let Some(log) = &self.log {
            log.update(|e| {
                e.prompt_tokens = Some(self.prompt_tokens);
                e.cached_tokens = Some(self.cached_tokens);
                e.generated_tokens = Some(self.completion_tokens);
                e.cache_miss = self
                    .cache_miss
                    .map(|m| format!("{}@{}", m.reason.as_str(), m.at_token));
                e.ttft = self.ttft;
                e.outcome.get_or_insert_with(|| "done".into());
            });
        }
        self.state.metrics.observe_finished(&FinishedRequest {
            tenant: &self.tenant,
            prompt_tokens: self.prompt_tokens,
            generation_tokens: self.completion_tokens,
            cached_tokens: self.cached_tokens,
            cache_miss: self.cache_miss.map(|m| m.reason.as_str()),
            ttft: self.ttft.unwrap_or_default(),
            queue: self.queue,
            total: self.total,
        });
        Step::Done(self.usage())
    }

    /// Usage so far; `cached_tokens` is always reported (0 when nothing was reused).
    pub fn usage(&self) -> api::Usage {
        api::Usage {
            prompt_tokens: self.prompt_tokens as u64,
            completion_tokens: self.completion_tokens as u64,
            total_tokens: (self.prompt_tokens + self.completion_tokens) as u64,
            prompt_tokens_details: Some(api::PromptTokensDetails {
                cached_tokens: Some(self.cached_tokens as u64),
                audio_tokens: None,
                cache_miss: self.cache_miss.map(|m| api::CacheMissDetails {
                    reason: m.reason.as_str().to_string(),
                    at_token: m.at_token as u64,
                }),
                // Whole blocks were retained, the last ones possibly holding generated tokens.
                cache_write_tokens: self
                    .retains
                    .then_some(self.retained_tokens.min(self.prompt_tokens) as u64),
            }),
            completion_tokens_details: None,
        }
    }
}

/// The wire name of a finish reason.
pub fn finish_reason_name(r: FinishReason) -> &'static str {
    match r {
        FinishReason::Stop => "stop",
        FinishReason::Length => "length",
        FinishReason::Cancelled => "abort",
    }
}
