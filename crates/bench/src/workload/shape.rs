//! The numbers and phrasing that distinguish the workloads (calls per task, observation and output
//! sizes, prompt layout, tenants). Pure data and string formatting; no randomness of its own
//! beyond what the caller's RNG draws.

use rand::Rng;

use super::WorkloadKind;
use crate::corpus::Corpus;

/// Inclusive token range, sampled uniformly.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TokenRange {
    pub min_tokens: usize,
    pub max_tokens: usize,
}

impl TokenRange {
    pub const fn new(min_tokens: usize, max_tokens: usize) -> Self {
        TokenRange {
            min_tokens,
            max_tokens,
        }
    }
    pub fn sample<R: Rng>(&self, rng: &mut R) -> usize {
        rng.gen_range(self.min_tokens..=self.max_tokens)
    }
}

/// The parameters of one workload kind.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Shape {
    pub kind: WorkloadKind,
    /// Calls per task, inclusive.
    pub steps: (u32, u32),
    pub output_tokens: TokenRange,
    pub observation_tokens: TokenRange,
    /// Approximate size of the shared system prompt (tools and few-shot examples included).
    pub system_tokens: usize,
    /// Distinct sub-agent role prompts appended to the shared one (0 = one prompt for all).
    pub num_roles: u32,
    pub role_tokens: usize,
    pub num_tenants: u32,
}

impl Shape {
    pub fn of(kind: WorkloadKind) -> Shape {
        match kind {
            WorkloadKind::React => Shape {
                kind,
                steps: (8, 12),
                output_tokens: TokenRange::new(30, 150),
                observation_tokens: TokenRange::new(100, 1500),
                system_tokens: 1500,
                num_roles: 0,
                role_tokens: 0,
                num_tenants: 1,
            },
            WorkloadKind::Webshop => Shape {
                kind,
                steps: (6, 10),
                output_tokens: TokenRange::new(10, 40),
                observation_tokens: TokenRange::new(1200, 2500),
                system_tokens: 700,
                num_roles: 0,
                role_tokens: 0,
                num_tenants: 1,
            },
            WorkloadKind::Swarm => Shape {
                kind,
                steps: (4, 8),
                output_tokens: TokenRange::new(30, 120),
                observation_tokens: TokenRange::new(100, 600),
                system_tokens: 1000,
                num_roles: 4,
                role_tokens: 300,
                num_tenants: 3,
            },
        }
    }

    /// The instructions and tool specification that open the shared system prompt.
    pub fn preamble(&self) -> &'static str {
        match self.kind {
            WorkloadKind::React => {
                "You answer questions by interleaving Thought, Action and Observation steps. \
                 Thought reasons about the current situation. Action is one of three types: \
                 (1) Search[entity], which searches the documentation for the exact entity and \
                 returns its first paragraph if it exists; (2) Lookup[keyword], which returns the \
                 next sentence containing keyword in the current passage; (3) Finish[answer], which \
                 returns the answer and finishes the task. Here are some examples.\n\n"
            }
            WorkloadKind::Webshop => {
                "You are a shopping assistant acting in a web store. Available actions: \
                 search[query] to search the catalogue, click[item or button] to open a product or \
                 press a button such as Buy Now, Next or Back to Search. Think briefly, then give \
                 exactly one action. Reply in the form 'Thought: ... Action: ...'. Product pages \
                 are long; read only what you need. Here are some examples.\n\n"
            }
            WorkloadKind::Swarm => {
                "You are one member of a team of cooperating agents working on a documentation \
                 project. Agents share this briefing; each also has a role below. Messages from \
                 other agents and tools arrive as observations. Keep replies short and state the \
                 next action explicitly. Project background follows.\n\n"
            }
        }
    }

    /// Names of the sub-agent roles (swarm only).
    pub fn role_name(&self, role: u32) -> &'static str {
        const ROLES: [&str; 4] = ["planner", "researcher", "writer", "reviewer"];
        ROLES[role as usize % ROLES.len()]
    }

    /// One few-shot example built around corpus text.
    pub fn example<R: Rng>(&self, corpus: &Corpus, rng: &mut R, n: usize) -> String {
        let q = corpus.sentence(rng);
        let obs = corpus.passage(rng, 120);
        let topic: String = q.split_whitespace().take(3).collect::<Vec<_>>().join(" ");
        match self.kind {
            WorkloadKind::React => format!(
                "Question: Which passage explains the following? {q}\nThought 1: I need to search \
                 for {topic}.\nAction 1: Search[{topic}]\nObservation 1: {obs}\nThought 2: The \
                 observation answers the question.\nAction 2: Finish[{topic}]\n\n"
            ),
            WorkloadKind::Webshop => format!(
                "Instruction: find a product described as: {q}\nThought: I should search first.\n\
                 Action: search[{topic}]\nObservation: [Back to Search] Page 1 [Item {n}] {obs}\n\
                 Action: click[Item {n}]\nAction: click[Buy Now]\n\n"
            ),
            WorkloadKind::Swarm => format!("Background note {n}: {q} {obs}\n\n"),
        }
    }

    /// The user message that starts a task.
    pub fn task_text<R: Rng>(&self, corpus: &Corpus, rng: &mut R, agent: u32, task: u32) -> String {
        let s = corpus.sentence(rng);
        match self.kind {
            WorkloadKind::React => format!("Question: Which passage explains the following? {s}"),
            WorkloadKind::Webshop => format!("Instruction: find a product described as: {s}"),
            WorkloadKind::Swarm => format!("Sub-task {task} for agent {agent}: document this. {s}"),
        }
    }

    /// A tool observation wrapping corpus `text`, for the call at `step`.
    pub fn observation_text(&self, text: String, step: u32) -> String {
        match self.kind {
            WorkloadKind::React => text,
            WorkloadKind::Webshop => format!(
                "[Back to Search] Page {} (Total results: 50) [Next >] [Item {}] {text} [Buy Now]",
                step + 1,
                step + 1
            ),
            WorkloadKind::Swarm => format!("Message from a teammate: {text}"),
        }
    }
}
