//! The closed-loop load driver: one tokio task per agent runs its tasks in order; each call waits
//! for the previous answer (plus simulated tool latency). With several targets every call of a
//! task is sent to each target in turn, the order rotating per step, so both see the same load and
//! machine state. Records every call (errors and skipped calls included) and the trace.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use api::{ChatCompletionRequest, ChatMessage};
use indicatif::{ProgressBar, ProgressStyle};
use serde::{Deserialize, Serialize};

use crate::client::{stream_chat, CallError, CallMetrics, Target};
use crate::trace::TraceEntry;
use crate::workload::TaskScript;

/// A task as the driver sees it: a script whose prompts grow with the model's answers, or a
/// fixed list of requests (a replayed trace).
#[derive(Clone, Debug)]
pub enum TaskPlan {
    Scripted(TaskScript),
    Fixed(FixedTask),
}

#[derive(Clone, Debug)]
pub struct FixedTask {
    pub agent: u32,
    pub task: u32,
    pub tenant: String,
    pub session: String,
    /// `(delay_before_ms, request)` per call, in order.
    pub calls: Vec<(u64, ChatCompletionRequest)>,
}

impl TaskPlan {
    fn ids(&self) -> (u32, u32, &str, String) {
        match self {
            TaskPlan::Scripted(s) => (s.agent, s.task, &s.tenant, s.session()),
            TaskPlan::Fixed(f) => (f.agent, f.task, &f.tenant, f.session.clone()),
        }
    }
    fn num_steps(&self) -> usize {
        match self {
            TaskPlan::Scripted(s) => s.steps.len(),
            TaskPlan::Fixed(f) => f.calls.len(),
        }
    }
    fn delay_ms(&self, step: usize) -> u64 {
        match self {
            TaskPlan::Scripted(s) => s.steps[step].tool_latency_ms,
            TaskPlan::Fixed(f) => f.calls[step].0,
        }
    }
}

/// How to drive.
#[derive(Clone, Debug)]
pub struct DriverConfig {
    pub targets: Vec<Target>,
    /// Sampling temperature sent with scripted calls (0 = greedy, comparable across targets).
    pub temperature: f32,
    pub seed: Option<u64>,
    pub request_timeout: Duration,
    /// Calls not started this long after the run began are recorded as `NotRun` (calls in
    /// flight finish); `None` = no limit.
    pub max_duration: Option<Duration>,
    pub progress: bool,
    /// Scripted calls name their task's session (`prompt_cache_key` = `tenant/session`), so a
    /// server with session retention keeps it through the tool pauses.
    pub session_keys: bool,
    /// Scripted calls mark their system message with `cache_control` (`ephemeral`, `1h`): a
    /// breakpoint that retains the shared system prompt.
    pub system_breakpoint: bool,
}

/// Outcome of one call.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "status", rename_all = "snake_case")]
// One per call (thousands per run at most): the size of the Ok variant does not matter.
#[allow(clippy::large_enum_variant)]
pub enum CallOutcome {
    Ok(CallMetrics),
    Error(CallError),
    /// Not sent: an earlier call of the same task on this target failed.
    Skipped,
    /// Not sent: the run's time limit (`max_duration`) had passed.
    NotRun,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct CallRecord {
    pub target: usize,
    pub agent: u32,
    pub task: u32,
    pub step: u32,
    /// Seconds from the start of the run to sending.
    pub t_start_s: f64,
    /// Characters in the prompt's messages (token counts are in `usage`).
    pub prompt_chars: usize,
    pub outcome: CallOutcome,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct TaskRecord {
    pub target: usize,
    pub agent: u32,
    pub task: u32,
    /// True when every call succeeded.
    pub ok: bool,
    /// True when the time limit stopped the task before its last call (it is neither ok nor
    /// failed).
    pub cut_by_time_limit: bool,
    /// Sum of this target's call latencies and the simulated tool time (seconds); with several
    /// targets the wall time would include the other targets' calls, so it is not used.
    pub latency_s: f64,
}

#[derive(Clone, Debug, Default)]
pub struct RunOutput {
    pub wall_s: f64,
    pub calls: Vec<CallRecord>,
    pub tasks: Vec<TaskRecord>,
    pub trace: Vec<TraceEntry>,
}

struct Shared {
    http: reqwest::Client,
    cfg: DriverConfig,
    start: Instant,
    bar: ProgressBar,
    trace: Mutex<Vec<TraceEntry>>,
}

/// Runs every agent concurrently (`agents[a]` = its tasks in order) and collects the records.
pub async fn run(
    http: reqwest::Client,
    cfg: DriverConfig,
    agents: Vec<Vec<TaskPlan>>,
) -> RunOutput {
    let total_calls: usize = agents.iter().flatten().map(TaskPlan::num_steps).sum();
    let bar = if cfg.progress {
        let b = ProgressBar::new((total_calls * cfg.targets.len()) as u64);
        if let Ok(style) = ProgressStyle::with_template(
            "{elapsed_precise} [{bar:40}] {pos}/{len} calls, {per_sec}, eta {eta}",
        ) {
            b.set_style(style);
        }
        b
    } else {
        ProgressBar::hidden()
    };
    let shared = Arc::new(Shared {
        http,
        cfg,
        start: Instant::now(),
        bar,
        trace: Mutex::new(Vec::new()),
    });
    let handles: Vec<_> = agents
        .into_iter()
        .map(|tasks| {
            let shared = Arc::clone(&shared);
            tokio::spawn(async move {
                let mut calls = Vec::new();
                let mut records = Vec::new();
                for plan in &tasks {
                    run_task(&shared, plan, &mut calls, &mut records).await;
                }
                (calls, records)
            })
        })
        .collect();
    let mut out = RunOutput::default();
    for h in handles {
        match h.await {
            Ok((calls, tasks)) => {
                out.calls.extend(calls);
                out.tasks.extend(tasks);
            }
            // A panicking agent task is a bug in this crate; surface it.
            Err(e) => panic!("agent task failed: {e}"),
        }
    }
    out.wall_s = shared.start.elapsed().as_secs_f64();
    shared.bar.finish_and_clear();
    let mut trace = std::mem::take(&mut *shared.trace.lock().unwrap_or_else(|p| p.into_inner()));
    trace.sort_by(|a, b| a.t.total_cmp(&b.t));
    out.trace = trace;
    out.calls
        .sort_by(|a, b| a.t_start_s.total_cmp(&b.t_start_s));
    out
}

impl Shared {
    fn past_time_limit(&self) -> bool {
        self.cfg
            .max_duration
            .is_some_and(|d| self.start.elapsed() >= d)
    }
}

/// Per-target state of one task.
struct Conversation {
    messages: Vec<ChatMessage>,
    alive: bool,
    cut: bool,
    latency_s: f64,
}

async fn run_task(
    sh: &Shared,
    plan: &TaskPlan,
    calls: &mut Vec<CallRecord>,
    tasks: &mut Vec<TaskRecord>,
) {
    let n_targets = sh.cfg.targets.len();
    let (agent, task, tenant, session) = plan.ids();
    let initial = match plan {
        TaskPlan::Scripted(s) => s.initial_messages(),
        TaskPlan::Fixed(_) => Vec::new(),
    };
    let mut convs: Vec<Conversation> = (0..n_targets)
        .map(|_| Conversation {
            messages: initial.clone(),
            alive: true,
            cut: false,
            latency_s: 0.0,
        })
        .collect();
    for step in 0..plan.num_steps() {
        let delay_ms = plan.delay_ms(step);
        if delay_ms > 0 && !sh.past_time_limit() {
            tokio::time::sleep(Duration::from_millis(delay_ms)).await;
        }
        for k in 0..n_targets {
            let ti = (k + step + task as usize) % n_targets;
            let target = &sh.cfg.targets[ti];
            let conv = &mut convs[ti];
            let t_start_s = sh.start.elapsed().as_secs_f64();
            let mut record = CallRecord {
                target: ti,
                agent,
                task,
                step: step as u32,
                t_start_s,
                prompt_chars: 0,
                outcome: CallOutcome::Skipped,
            };
            if conv.alive && sh.past_time_limit() {
                conv.cut = true;
                record.outcome = CallOutcome::NotRun;
            } else if conv.alive && !conv.cut {
                conv.latency_s += delay_ms as f64 / 1000.0;
                let req = build_request(&sh.cfg, plan, step, target, &conv.messages, tenant);
                record.prompt_chars = req
                    .messages
                    .iter()
                    .map(|m| m.content.as_deref().map_or(0, str::len))
                    .sum();
                sh.trace
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .push(TraceEntry {
                        t: t_start_s,
                        session: session.clone(),
                        tenant: tenant.to_string(),
                        agent,
                        task,
                        step: step as u32,
                        target: ti,
                        delay_before_ms: delay_ms,
                        request: req.clone(),
                    });
                let breakpoint = sh.cfg.system_breakpoint && matches!(plan, TaskPlan::Scripted(_));
                let timeout = sh.cfg.request_timeout;
                match stream_chat(&sh.http, target, &req, breakpoint, timeout).await {
                    Ok(m) => {
                        conv.latency_s += m.e2e_s;
                        if let TaskPlan::Scripted(s) = plan {
                            s.append_turn(&mut conv.messages, step, &m.text);
                        }
                        record.outcome = CallOutcome::Ok(m);
                    }
                    Err(e) => {
                        conv.latency_s += e.after_s;
                        conv.alive = false;
                        record.outcome = CallOutcome::Error(e);
                    }
                }
            }
            calls.push(record);
            sh.bar.inc(1);
        }
    }
    for (ti, conv) in convs.into_iter().enumerate() {
        tasks.push(TaskRecord {
            target: ti,
            agent,
            task,
            ok: conv.alive && !conv.cut,
            cut_by_time_limit: conv.alive && conv.cut,
            latency_s: conv.latency_s,
        });
    }
}

fn build_request(
    cfg: &DriverConfig,
    plan: &TaskPlan,
    step: usize,
    target: &Target,
    messages: &[ChatMessage],
    tenant: &str,
) -> ChatCompletionRequest {
    match plan {
        TaskPlan::Scripted(s) => {
            let mut req = ChatCompletionRequest {
                model: target.model.clone(),
                messages: messages.to_vec(),
                max_tokens: Some(s.steps[step].max_output_tokens),
                temperature: Some(cfg.temperature),
                seed: cfg.seed,
                user: Some(tenant.to_string()),
                ..Default::default()
            };
            if cfg.session_keys {
                req.cache.prompt_cache_key = Some(format!("{tenant}/{}", s.session()));
            }
            req
        }
        TaskPlan::Fixed(f) => {
            let mut req = f.calls[step].1.clone();
            if !target.model.is_empty() {
                req.model.clone_from(&target.model);
            }
            req
        }
    }
}

/// [`run`] on a fresh multi-threaded tokio runtime, for synchronous callers (the CLI).
pub fn run_blocking(
    cfg: DriverConfig,
    agents: Vec<Vec<TaskPlan>>,
) -> Result<RunOutput, crate::BenchError> {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .map_err(|e| crate::BenchError::Http(format!("starting the async runtime: {e}")))?;
    let http = crate::client::http_client()?;
    Ok(rt.block_on(run(http, cfg, agents)))
}
