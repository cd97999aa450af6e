//! Agent workloads: deterministic scripts (per seed) of tasks, each a sequence of model calls whose
//! prompt grows by the model's own answer plus a tool observation. Owns the shapes (`react`,
//! `webshop`, `swarm`) and the conversation rules; never sends anything.

mod prompts;
mod shape;

use api::{ChatMessage, Role};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use serde::{Deserialize, Serialize};

use crate::corpus::Corpus;
use crate::BenchError;
pub use shape::{Shape, TokenRange};

/// Which agent pattern to generate.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum WorkloadKind {
    /// HotpotQA-like ReAct: long shared system prompt with tools and few-shot examples, 8–12 calls.
    React,
    /// WebShop-like: long page observations, short thoughts and actions.
    Webshop,
    /// Many agents sharing one base prompt plus a few sub-agent role prompts, several tenants.
    Swarm,
}

/// What to generate.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct WorkloadConfig {
    pub kind: WorkloadKind,
    pub num_agents: u32,
    pub tasks_per_agent: u32,
    /// Calls per task; `None` = the shape's own range.
    pub steps_per_task: Option<u32>,
    /// Simulated tool latency between two calls of a task, inclusive range in ms; `None` = 0.
    pub tool_latency_ms: Option<(u64, u64)>,
    pub seed: u64,
    /// Overrides of the shape: tool observation tokens (inclusive range), output tokens
    /// (inclusive range, the calls' `max_tokens`) and shared system prompt tokens.
    #[serde(default)]
    pub observation_tokens: Option<(usize, usize)>,
    #[serde(default)]
    pub output_tokens: Option<(usize, usize)>,
    #[serde(default)]
    pub system_tokens: Option<usize>,
}

/// One model call of a task: what is appended after the model answers, and the answer's budget.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct StepScript {
    /// `max_tokens` of this call.
    pub max_output_tokens: u32,
    /// Simulated tool time before this call (0 for the first call of a task).
    pub tool_latency_ms: u64,
    /// Tool observation appended (as a user message) after this call's answer; `None` on the last.
    pub observation: Option<String>,
}

/// One task of one agent: a conversation of `steps.len()` calls.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct TaskScript {
    pub agent: u32,
    pub task: u32,
    pub tenant: String,
    pub system_prompt: String,
    pub user_prompt: String,
    pub steps: Vec<StepScript>,
}

impl TaskScript {
    /// Session id shared with `cache-sim` traces: `a{agent}-t{task}`.
    pub fn session(&self) -> String {
        format!("a{}-t{}", self.agent, self.task)
    }

    /// The messages of the first call.
    pub fn initial_messages(&self) -> Vec<ChatMessage> {
        vec![
            ChatMessage::new(Role::System, self.system_prompt.clone()),
            ChatMessage::new(Role::User, self.user_prompt.clone()),
        ]
    }

    /// Extends `messages` after call `step` answered `answer`: the answer, then the observation.
    pub fn append_turn(&self, messages: &mut Vec<ChatMessage>, step: usize, answer: &str) {
        messages.push(ChatMessage::new(Role::Assistant, answer));
        if let Some(obs) = self.steps.get(step).and_then(|s| s.observation.as_ref()) {
            messages.push(ChatMessage::new(Role::User, format!("Observation: {obs}")));
        }
    }
}

/// All tasks of a run, grouped by agent (`agents[a]` = tasks of agent `a`, in order).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Workload {
    pub config_kind: WorkloadKind,
    pub agents: Vec<Vec<TaskScript>>,
}

impl Workload {
    pub fn num_calls(&self) -> usize {
        self.agents.iter().flatten().map(|t| t.steps.len()).sum()
    }
    pub fn num_tasks(&self) -> usize {
        self.agents.iter().map(Vec::len).sum()
    }
}

/// Generates the workload; the same config (seed included) always gives the same scripts.
pub fn generate(cfg: &WorkloadConfig, corpus: &Corpus) -> Result<Workload, BenchError> {
    if cfg.num_agents == 0 || cfg.tasks_per_agent == 0 {
        return Err(BenchError::Config("agents and tasks must be ≥ 1".into()));
    }
    if cfg.steps_per_task == Some(0) {
        return Err(BenchError::Config("steps must be ≥ 1".into()));
    }
    if let Some((lo, hi)) = cfg.tool_latency_ms {
        if lo > hi {
            return Err(BenchError::Config(format!(
                "tool latency range {lo}..{hi} is empty"
            )));
        }
    }
    let mut shape = Shape::of(cfg.kind);
    for (name, range, field) in [
        (
            "observation",
            cfg.observation_tokens,
            &mut shape.observation_tokens,
        ),
        ("output", cfg.output_tokens, &mut shape.output_tokens),
    ] {
        if let Some((lo, hi)) = range {
            if lo > hi || hi == 0 {
                return Err(BenchError::Config(format!(
                    "{name} token range {lo}..{hi} is empty"
                )));
            }
            *field = shape::TokenRange::new(lo, hi);
        }
    }
    if let Some(n) = cfg.system_tokens {
        shape.system_tokens = n;
    }
    // Prompts shared across agents come from their own stream so they do not depend on counts.
    let mut shared_rng = ChaCha8Rng::seed_from_u64(cfg.seed ^ 0x5348_4152_4544);
    let prompts = prompts::SharedPrompts::generate(&shape, corpus, &mut shared_rng);
    let mut agents = Vec::with_capacity(cfg.num_agents as usize);
    for agent in 0..cfg.num_agents {
        let mut tasks = Vec::with_capacity(cfg.tasks_per_agent as usize);
        for task in 0..cfg.tasks_per_agent {
            // One stream per (agent, task): adding agents never changes existing tasks.
            let stream = (u64::from(agent) << 32) | u64::from(task);
            let mut rng = ChaCha8Rng::seed_from_u64(cfg.seed);
            rng.set_stream(stream);
            tasks.push(make_task(
                cfg, &shape, &prompts, corpus, agent, task, &mut rng,
            ));
        }
        agents.push(tasks);
    }
    Ok(Workload {
        config_kind: cfg.kind,
        agents,
    })
}

fn make_task(
    cfg: &WorkloadConfig,
    shape: &Shape,
    prompts: &prompts::SharedPrompts,
    corpus: &Corpus,
    agent: u32,
    task: u32,
    rng: &mut ChaCha8Rng,
) -> TaskScript {
    let num_steps = cfg
        .steps_per_task
        .unwrap_or_else(|| rng.gen_range(shape.steps.0..=shape.steps.1));
    let steps = (0..num_steps)
        .map(|s| {
            let last = s + 1 == num_steps;
            StepScript {
                max_output_tokens: shape.output_tokens.sample(rng) as u32,
                tool_latency_ms: match cfg.tool_latency_ms {
                    Some((lo, hi)) if s > 0 => rng.gen_range(lo..=hi),
                    _ => 0,
                },
                observation: (!last).then(|| {
                    let n = shape.observation_tokens.sample(rng);
                    shape.observation_text(corpus.passage(rng, n), s)
                }),
            }
        })
        .collect();
    TaskScript {
        agent,
        task,
        tenant: format!("tenant-{}", agent % shape.num_tenants),
        system_prompt: prompts.system_prompt_for(agent),
        user_prompt: shape.task_text(corpus, rng, agent, task),
        steps,
    }
}
