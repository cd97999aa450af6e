//! Open-loop replay of a timed request trace (`bench replay` of a Mooncake trace): each request
//! is sent at its trace time × `time_scale` as a `/v1/completions` call with a pre-tokenised
//! prompt, whatever the answers before it, and what the server says it served from its prefix
//! cache (`usage.prompt_tokens_details.cached_tokens`) is recorded. At most `max_in_flight`
//! requests run at once; later ones wait (and are reported late) rather than pile up.
//!
//! Talks HTTP only; measures, never asserts.

use std::sync::Arc;
use std::time::{Duration, Instant};

use serde::Serialize;

use crate::client::{http_client, Target};
use crate::error::BenchError;

/// One request to replay.
#[derive(Clone, Debug, PartialEq)]
pub struct TimedPrompt {
    /// Seconds from the start of the trace (before scaling).
    pub at_s: f64,
    pub prompt: Vec<u32>,
}

/// How to replay.
#[derive(Clone, Debug)]
pub struct OpenLoopConfig {
    pub target: Target,
    /// Wall seconds per trace second (0.1: ten times faster than recorded).
    pub time_scale: f64,
    pub max_tokens: u32,
    pub max_in_flight: usize,
    pub timeout: Duration,
}

/// What one request got.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct OpenLoopResult {
    pub index: usize,
    pub prompt_tokens: u64,
    pub cached_tokens: u64,
    /// Seconds after its scheduled time the request was sent (waiting for a slot).
    pub late_s: f64,
    pub latency_s: f64,
    pub error: Option<String>,
}

/// Replays `prompts` (in trace order) against `cfg.target`; blocks until all are answered.
pub fn run_open_loop(
    cfg: OpenLoopConfig,
    prompts: Vec<TimedPrompt>,
) -> Result<Vec<OpenLoopResult>, BenchError> {
    if !(cfg.time_scale.is_finite() && cfg.time_scale >= 0.0) || cfg.max_in_flight == 0 {
        return Err(BenchError::Config(
            "time_scale must be >= 0 and max_in_flight > 0".into(),
        ));
    }
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .map_err(|e| BenchError::Config(format!("tokio runtime: {e}")))?;
    rt.block_on(replay(cfg, prompts))
}

async fn replay(
    cfg: OpenLoopConfig,
    prompts: Vec<TimedPrompt>,
) -> Result<Vec<OpenLoopResult>, BenchError> {
    let http = http_client()?;
    let slots = Arc::new(tokio::sync::Semaphore::new(cfg.max_in_flight));
    let start = Instant::now();
    let t0 = prompts.first().map_or(0.0, |p| p.at_s);
    let mut tasks = Vec::with_capacity(prompts.len());
    for (index, p) in prompts.into_iter().enumerate() {
        let due = Duration::from_secs_f64(((p.at_s - t0) * cfg.time_scale).max(0.0));
        tokio::time::sleep_until((start + due).into()).await;
        let permit = slots.clone().acquire_owned().await.expect("never closed");
        let late_s = start.elapsed().saturating_sub(due).as_secs_f64();
        let (http, target, cfg) = (http.clone(), cfg.target.clone(), cfg.clone());
        tasks.push(tokio::spawn(async move {
            let sent = Instant::now();
            let r = complete(&http, &target, &p.prompt, cfg.max_tokens, cfg.timeout).await;
            drop(permit);
            let (prompt_tokens, cached_tokens, error) = match r {
                Ok((p, c)) => (p, c, None),
                Err(e) => (p.prompt.len() as u64, 0, Some(e)),
            };
            OpenLoopResult {
                index,
                prompt_tokens,
                cached_tokens,
                late_s,
                latency_s: sent.elapsed().as_secs_f64(),
                error,
            }
        }));
    }
    let mut out = Vec::with_capacity(tasks.len());
    for t in tasks {
        out.push(
            t.await
                .map_err(|e| BenchError::Config(format!("task: {e}")))?,
        );
    }
    Ok(out)
}

/// One non-streamed completion; (prompt tokens, cached tokens) from its usage.
async fn complete(
    http: &reqwest::Client,
    target: &Target,
    prompt: &[u32],
    max_tokens: u32,
    timeout: Duration,
) -> Result<(u64, u64), String> {
    let url = format!("{}/v1/completions", target.base_url.trim_end_matches('/'));
    let body = serde_json::json!({"model": target.model, "prompt": prompt,
        "max_tokens": max_tokens, "temperature": 0});
    let mut req = http.post(url).json(&body).timeout(timeout);
    if let Some(key) = &target.api_key {
        req = req.bearer_auth(key);
    }
    let resp = req.send().await.map_err(|e| e.to_string())?;
    let status = resp.status();
    let v: serde_json::Value = resp.json().await.map_err(|e| e.to_string())?;
    if !status.is_success() {
        return Err(format!("HTTP {status}: {v}"));
    }
    let usage = &v["usage"];
    let prompt_tokens = usage["prompt_tokens"]
        .as_u64()
        .ok_or("no usage.prompt_tokens")?;
    let cached = usage["prompt_tokens_details"]["cached_tokens"]
        .as_u64()
        .unwrap_or(0);
    Ok((prompt_tokens, cached))
}
